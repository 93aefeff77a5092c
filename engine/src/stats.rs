//! Engine counters beyond the proto stats: why the engine fell back, if it did.

use std::sync::{Mutex, PoisonError};

static FALLBACK_REASON: Mutex<Option<String>> = Mutex::new(None);

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

/// Why this process could not use io_uring, if a node ever found out.
pub fn fallback_reason() -> Option<String> {
    FALLBACK_REASON
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}
