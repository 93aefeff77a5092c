//! Locking that survives a panic elsewhere: the extension's shared state stays consistent
//! across every critical section, so a poisoned lock is taken as it is instead of turning one
//! thread's panic into a failure of every later call. Every lock in the extension goes through
//! here.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, poisoned or not.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The value of a mutex no one else holds any more, poisoned or not.
pub(crate) fn into_inner<T>(mutex: Mutex<T>) -> T {
    mutex.into_inner().unwrap_or_else(PoisonError::into_inner)
}
