//! Engine counters beyond the proto stats: zero-copy sends and why the engine fell back.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};

static FALLBACK_REASON: Mutex<Option<String>> = Mutex::new(None);
static ZERO_COPY_REQUESTS: AtomicU64 = AtomicU64::new(0);
static ZERO_COPY_DONE: AtomicU64 = AtomicU64::new(0);
static ZERO_COPY_COPIED: AtomicU64 = AtomicU64::new(0);

/// Engine counters of this process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// `SENDMSG_ZC` operations submitted.
    pub zero_copy_requests: u64,
    /// Their notifications that report the pages were sent without a copy.
    pub zero_copy_done: u64,
    /// Their notifications that report the kernel copied anyway (always so on loopback).
    pub zero_copy_copied: u64,
    /// Why io_uring could not be used, if a node ever found out.
    pub fallback_reason: Option<String>,
}

/// Reads the engine counters.
pub fn snapshot() -> EngineStats {
    EngineStats {
        zero_copy_requests: ZERO_COPY_REQUESTS.load(Relaxed),
        zero_copy_done: ZERO_COPY_DONE.load(Relaxed),
        zero_copy_copied: ZERO_COPY_COPIED.load(Relaxed),
        fallback_reason: fallback_reason(),
    }
}

/// Records (and logs once) why io_uring could not be used.
pub(crate) fn record_fallback(reason: &str) {
    let mut slot = FALLBACK_REASON
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if slot.is_none() {
        eprintln!("tensorwire: io_uring unavailable: {reason}");
        *slot = Some(reason.to_owned());
    }
}

pub(crate) fn record_zero_copy_request() {
    ZERO_COPY_REQUESTS.fetch_add(1, Relaxed);
}

pub(crate) fn record_zero_copy_notification(copied: bool) {
    if copied {
        &ZERO_COPY_COPIED
    } else {
        &ZERO_COPY_DONE
    }
    .fetch_add(1, Relaxed);
}

/// Why this process could not use io_uring, if a node ever found out.
pub fn fallback_reason() -> Option<String> {
    FALLBACK_REASON
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}
