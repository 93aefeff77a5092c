//! Locking that survives a panic elsewhere: the engine's shared state stays consistent across
//! every critical section (each leaves it whole before it can panic), so a poisoned lock is
//! taken as it is instead of spreading one thread's panic to every other. Every lock and
//! condition-variable wait in the engine goes through here.

use std::sync::{
    Condvar, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use std::time::Duration;

/// Locks `mutex`, poisoned or not.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `ready` until notified (or a spurious wake-up), for at most `timeout` if given.
pub(crate) fn wait<'a, T>(
    ready: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Option<Duration>,
) -> MutexGuard<'a, T> {
    match timeout {
        Some(timeout) => {
            ready
                .wait_timeout(guard, timeout)
                .unwrap_or_else(PoisonError::into_inner)
                .0
        }
        None => ready.wait(guard).unwrap_or_else(PoisonError::into_inner),
    }
}

/// Takes `lock` for reading, poisoned or not.
pub(crate) fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

/// Takes `lock` for writing, poisoned or not.
pub(crate) fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}
