//! Small synchronisation helpers shared by the transports: a mutex lock that survives a
//! panicked holder, and the wait for a driver's shutdown signal.

use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

/// Locks `mutex`, also after a holder panicked (the data stays consistent: no holder leaves
/// it half-updated across a panic point).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Resolves once `shutdown` says the transport is stopping (or its sender is gone).
pub(crate) async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    loop {
        if *shutdown.borrow_and_update() {
            return;
        }
        if shutdown.changed().await.is_err() {
            return;
        }
    }
}
