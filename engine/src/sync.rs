//! Locking that survives a panic elsewhere: the engine's shared state stays consistent across
//! every critical section (each leaves it whole before it can panic), so a poisoned lock is
//! taken as it is instead of spreading one thread's panic to every other. Every lock and
//! condition-variable wait in the engine goes through here.

use std::sync::{
    Condvar, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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

/// Joins `threads` until `until`: how many were still running then, left to end by
/// themselves (the caller says which in its log).
pub(crate) fn join_until(
    threads: impl IntoIterator<Item = JoinHandle<()>>,
    until: Instant,
) -> usize {
    /// How long it sleeps between looks, at most.
    const POLL_AT_MOST: Duration = Duration::from_millis(5);
    let mut left: Vec<_> = threads.into_iter().collect();
    let mut pause = Duration::from_micros(50);
    loop {
        let (done, running): (Vec<_>, Vec<_>) = left.into_iter().partition(JoinHandle::is_finished);
        done.into_iter().for_each(|t| drop(t.join()));
        left = running;
        let now = Instant::now();
        if left.is_empty() || now >= until {
            return left.len();
        }
        std::thread::sleep(pause.min(until - now));
        pause = (pause * 2).min(POLL_AT_MOST);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_still_running_at_the_deadline_is_left_and_the_finished_ones_joined() {
        let (release, stuck_on) = std::sync::mpsc::channel::<()>();
        let stuck = std::thread::spawn(move || {
            let _ = stuck_on.recv();
        });
        let quick = std::thread::spawn(|| {});
        let start = Instant::now();
        let left = join_until([stuck, quick], start + Duration::from_secs(1));
        assert_eq!(left, 1, "the stuck thread is left, the quick one joined");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the join gave up at its deadline"
        );
        drop(release);
    }
}
