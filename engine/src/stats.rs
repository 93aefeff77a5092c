//! Engine counters beyond the proto stats: zero-copy sends, why the io_uring driver could not
//! be used, and which driver each node of this process runs.

use crate::fork::PerProcess;
use crate::sync::lock;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Why io_uring cannot be used (a child made by `fork()` finds out again).
static FALLBACK_REASON: PerProcess<Mutex<Option<String>>> = PerProcess::new();

fn fallback_slot() -> &'static Mutex<Option<String>> {
    FALLBACK_REASON.get_or_init(|| Mutex::new(None))
}
/// The running nodes of this process (a child made by `fork()` starts with none).
static NODES: PerProcess<Mutex<Vec<(SocketAddr, &'static str)>>> = PerProcess::new();

fn nodes() -> &'static Mutex<Vec<(SocketAddr, &'static str)>> {
    NODES.get_or_init(|| Mutex::new(Vec::new()))
}
static ZERO_COPY_REQUESTS: AtomicU64 = AtomicU64::new(0);
static ZERO_COPY_DONE: AtomicU64 = AtomicU64::new(0);
static ZERO_COPY_COPIED: AtomicU64 = AtomicU64::new(0);

/// Engine counters of this process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineStats {
    /// `SENDMSG_ZC` submissions.
    pub zero_copy_requests: u64,
    /// Their notifications that report the pages were sent without a copy.
    pub zero_copy_done: u64,
    /// Their notifications that report the kernel copied anyway (always so on loopback).
    pub zero_copy_copied: u64,
    /// Why io_uring could not be used, if a node ever found out.
    pub fallback_reason: Option<String>,
    /// Each running node's listening address and driver (`"io_uring"`, `"tokio"`, …).
    pub drivers: Vec<(SocketAddr, &'static str)>,
}

/// Reads the engine counters.
pub fn snapshot() -> EngineStats {
    EngineStats {
        zero_copy_requests: ZERO_COPY_REQUESTS.load(Relaxed),
        zero_copy_done: ZERO_COPY_DONE.load(Relaxed),
        zero_copy_copied: ZERO_COPY_COPIED.load(Relaxed),
        fallback_reason: fallback_reason(),
        drivers: lock(nodes()).clone(),
    }
}

/// Why this process could not use io_uring, if a node ever found out.
pub fn fallback_reason() -> Option<String> {
    lock(fallback_slot()).clone()
}

/// Records (and logs once) why io_uring could not be used.
pub(crate) fn record_fallback(reason: &str, fallback: Option<&str>) {
    let mut slot = lock(fallback_slot());
    if slot.is_none() {
        match fallback {
            Some(driver) => tracing::warn!(
                reason,
                driver,
                "io_uring is unavailable; using the fallback driver"
            ),
            None => tracing::error!(
                reason,
                "io_uring is unavailable and no fallback driver is plugged in"
            ),
        }
        *slot = Some(reason.to_owned());
    }
}

pub(crate) fn register_node(addr: SocketAddr, driver: &'static str) {
    lock(nodes()).push((addr, driver));
}

pub(crate) fn unregister_node(addr: SocketAddr) {
    lock(nodes()).retain(|(a, _)| *a != addr);
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
