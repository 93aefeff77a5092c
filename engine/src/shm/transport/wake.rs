//! Waking the driver thread: an eventfd in its epoll, written only while the driver says it
//! sleeps (or may be about to), so threads that hand it work while it spins make no system
//! call.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::time::Instant;

pub(super) struct Wake {
    fd: OwnedFd,
    /// The driver may be asleep in `epoll_wait` (set before its last look, cleared on waking).
    asleep: AtomicBool,
    /// When the sleeping driver wakes by itself, in nanoseconds after `base`.
    wakes_at: AtomicU64,
    base: Instant,
}

impl Wake {
    pub(super) fn new() -> std::io::Result<Self> {
        Ok(Self {
            fd: crate::sys::eventfd_nonblocking()?,
            asleep: AtomicBool::new(false),
            wakes_at: AtomicU64::new(u64::MAX),
            base: Instant::now(),
        })
    }

    /// A deadline at `at` was added: wakes the driver if it sleeps past it (the usual
    /// deadline is far, so this rarely costs a system call).
    pub(super) fn deadline(&self, at: Instant) {
        fence(Ordering::SeqCst);
        if self.asleep.load(Ordering::Relaxed)
            && self.nanos(at) < self.wakes_at.load(Ordering::Relaxed)
        {
            self.signal();
        }
    }

    /// The driver will sleep until `at` at most.
    pub(super) fn plan(&self, at: Option<Instant>) {
        let nanos = at.map_or(u64::MAX, |at| self.nanos(at));
        self.wakes_at.store(nanos, Ordering::Relaxed);
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Wakes the driver unconditionally (shutdown, new connections).
    pub(super) fn signal(&self) {
        crate::sys::eventfd_signal(self.fd.as_raw_fd());
    }

    /// Wakes the driver if it may be asleep. Call after publishing the work it must find.
    pub(super) fn nudge(&self) {
        fence(Ordering::SeqCst);
        if self.asleep.load(Ordering::Relaxed) {
            self.signal();
        }
    }

    /// The driver is about to sleep: from now on work must wake it. It looks for work once
    /// more after this.
    pub(super) fn sleeping(&self) {
        self.asleep.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Whether the driver said it may be asleep (a caller that stops reading a connection
    /// hands it back to the driver then).
    pub(super) fn is_asleep(&self) -> bool {
        fence(Ordering::SeqCst);
        self.asleep.load(Ordering::Relaxed)
    }

    /// The driver woke up.
    pub(super) fn awake(&self) {
        self.asleep.store(false, Ordering::Relaxed);
        crate::sys::eventfd_drain(self.fd.as_raw_fd());
    }

    pub(super) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

thread_local! {
    static DRIVER_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the calling thread as a driver thread (a copy it would make goes to the copy thread
/// instead, so the driver never copies a payload or waits for credit).
pub(super) fn mark_driver_thread() {
    DRIVER_THREAD.with(|d| d.set(true));
}

/// Whether the calling thread is a driver thread.
pub(super) fn on_driver_thread() -> bool {
    DRIVER_THREAD.with(std::cell::Cell::get)
}
