//! Leases of a peer's memory whose last view here dropped (on any thread, Python's included),
//! waiting to be released on their connection: pushing one is a lock and, if the list was
//! empty, a nudge of the driver — never a touch of the connection's session.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::wake::Wake;
use crate::sync::lock;

/// One connection's releases to send.
pub(super) struct Releases {
    pending: Mutex<Vec<u64>>,
    any: AtomicBool,
    wake: Arc<Wake>,
}

impl Releases {
    pub(super) fn new(wake: Arc<Wake>) -> Self {
        Self {
            pending: Mutex::new(Vec::new()),
            any: AtomicBool::new(false),
            wake,
        }
    }

    /// The last view of `lease` dropped.
    pub(super) fn push(&self, lease: u64) {
        let was_empty = {
            let mut pending = lock(&self.pending);
            pending.push(lease);
            pending.len() == 1
        };
        if was_empty {
            self.any.store(true, Ordering::Release);
            self.wake.nudge();
        }
    }

    /// Whether any wait (cheap).
    pub(super) fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Everything waiting.
    pub(super) fn take(&self) -> Vec<u64> {
        if !self.any.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        std::mem::take(&mut *lock(&self.pending))
    }
}
