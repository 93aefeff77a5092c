//! Counting what is in flight (requests a node serves, requests it sends), for a graceful
//! close to wait for: each one holds an [`InFlight`] token until it is done.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How many tokens are alive.
#[derive(Clone, Debug, Default)]
pub(crate) struct InFlightCount(Arc<AtomicUsize>);

impl InFlightCount {
    /// A token, counted until dropped.
    pub(crate) fn enter(&self) -> InFlight {
        self.0.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(&self.0))
    }

    /// Tokens alive now.
    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// One thing in flight; done when dropped.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
