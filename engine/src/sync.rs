//! Locking that survives a panic elsewhere: the engine's shared state stays consistent across
//! every critical section (each leaves it whole before it can panic), so a poisoned lock is
//! taken as it is instead of spreading one thread's panic to every other.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, poisoned or not.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
