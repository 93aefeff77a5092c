//! Processes made by `fork()`. A child inherits a copy of every node, mailbox and lock of its
//! parent, but of its threads only the one that forked: the core threads, the deadline thread
//! and the handler threads do not exist in the child, and a lock one of them held at the fork
//! stays locked there forever.
//!
//! So every fork is counted: a `pthread_atfork` handler bumps a generation counter in each
//! child (an atomic store, safe in a child of a threaded process). A node remembers the
//! generation it was made in ([`Birth`]) and refuses every call from a later one at once with
//! [`Error::Forked`], for the cost of one atomic load; it never touches what it inherited (its
//! threads are not joined, its memory is leaked). State of the whole process that threads serve
//! (the deadline thread, the nodes of this process by address) lives in a [`PerProcess`] cell,
//! which a child starts afresh on first use, so the child can make nodes of its own.

use std::sync::Once;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use tensorwire_proto::transport::Error;

/// Forks since this program started, as seen by this process (0 in the first process).
static GENERATION: AtomicU64 = AtomicU64::new(0);
static WATCHING: Once = Once::new();

extern "C" fn in_child() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// Starts counting forks (once per program; later calls cost one atomic load).
pub fn watch() {
    WATCHING.call_once(|| {
        // SAFETY: `in_child` is an `extern "C"` function without arguments that only updates an
        // atomic, which is async-signal-safe as a child handler must be; the other handlers
        // are none.
        let res = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        if res != 0 {
            tracing::error!(
                error = %std::io::Error::from_raw_os_error(res),
                "pthread_atfork failed: a child made by fork() cannot tell inherited nodes apart"
            );
        }
    });
}

/// The forks counted so far in this process's line: it differs from the parent's in a child.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// Which process made something (a node, an endpoint): its pid and fork generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Birth {
    pid: u32,
    generation: u64,
}

impl Birth {
    /// This process, now.
    pub fn here() -> Self {
        watch();
        Self {
            pid: std::process::id(),
            generation: generation(),
        }
    }

    /// Whether this process is a child made by `fork()` after it was made (it was inherited).
    pub fn is_inherited(&self) -> bool {
        self.generation != generation()
    }

    /// `Ok` in the process that made it.
    ///
    /// # Errors
    ///
    /// [`Error::Forked`] in a child made by `fork()` since.
    pub fn check(&self) -> Result<(), Error> {
        if self.is_inherited() {
            return Err(Error::Forked {
                owner: self.pid,
                current: std::process::id(),
            });
        }
        Ok(())
    }
}

/// A value of this process, made on first use; a child made by `fork()` makes its own on
/// first use, and its parent's copy is leaked (never dropped: its locks may be held by threads
/// that do not exist in the child). For process-wide state that threads serve.
pub struct PerProcess<T: 'static> {
    slot: AtomicPtr<Slot<T>>,
}

struct Slot<T> {
    generation: u64,
    value: T,
}

impl<T: Send + Sync + 'static> PerProcess<T> {
    /// An empty cell.
    pub const fn new() -> Self {
        Self {
            slot: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// This process's value, made by `init` if this process has none yet. Two threads that
    /// race here may both call `init`; one value is kept, the other dropped.
    pub fn get_or_init(&'static self, init: impl Fn() -> T) -> &'static T {
        watch();
        let generation = generation();
        let mut seen = self.slot.load(Ordering::Acquire);
        let mut fresh: Option<Box<Slot<T>>> = None;
        loop {
            // SAFETY: a non-null pointer in `slot` came from `Box::into_raw` below and is never
            // freed (a slot of an older generation is leaked), so it is valid for 'static.
            if let Some(slot) = unsafe { seen.as_ref() }
                && slot.generation == generation
            {
                return &slot.value;
            }
            let candidate = fresh.take().unwrap_or_else(|| {
                Box::new(Slot {
                    generation,
                    value: init(),
                })
            });
            let raw = Box::into_raw(candidate);
            match self
                .slot
                .compare_exchange(seen, raw, Ordering::AcqRel, Ordering::Acquire)
            {
                // SAFETY: `raw` was just made from a box and is now in `slot`, never freed.
                Ok(_) => return unsafe { &(*raw).value },
                Err(current) => {
                    // SAFETY: `raw` did not get into `slot`: it is still ours alone.
                    fresh = Some(unsafe { Box::from_raw(raw) });
                    seen = current;
                }
            }
        }
    }
}

impl<T: Send + Sync + 'static> Default for PerProcess<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_made_once_per_process() {
        static CELL: PerProcess<std::sync::atomic::AtomicUsize> = PerProcess::new();
        let made = std::sync::atomic::AtomicUsize::new(0);
        let init = || {
            made.fetch_add(1, Ordering::Relaxed);
            std::sync::atomic::AtomicUsize::new(7)
        };
        let first: *const _ = CELL.get_or_init(init);
        let again: *const _ = CELL.get_or_init(init);
        assert_eq!(first, again);
        assert_eq!(made.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn something_made_here_is_not_inherited() {
        let birth = Birth::here();
        assert!(!birth.is_inherited());
        assert!(birth.check().is_ok());
    }
}
