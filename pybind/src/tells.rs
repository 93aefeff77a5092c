//! Tells nobody waits for (`Ref.tell_nowait`): their failures are counted and logged on the
//! `tensorwire` logger the next time Python calls into tensorwire (the engine thread that
//! sees a failure never takes the GIL).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::sync::lock;
use tensorwire_engine::fork::PerProcess;

use pyo3::prelude::*;

/// Failure texts waiting to be logged at most; beyond, only the count grows.
const MAX_WAITING: usize = 64;

static FAILED: AtomicU64 = AtomicU64::new(0);
/// Texts to log (a child made by `fork()` starts with none and a lock of its own).
static WAITING: PerProcess<Mutex<VecDeque<String>>> = PerProcess::new();

fn texts() -> &'static Mutex<VecDeque<String>> {
    WAITING.get_or_init(|| Mutex::new(VecDeque::new()))
}
/// Whether `WAITING` may hold anything (checked without the lock).
static ANY: AtomicBool = AtomicBool::new(false);

/// A fire-and-forget tell failed (any thread).
pub(crate) fn failed(text: String) {
    FAILED.fetch_add(1, Ordering::Relaxed);
    let mut waiting = lock(texts());
    if waiting.len() < MAX_WAITING {
        waiting.push_back(text);
    }
    ANY.store(true, Ordering::Release);
}

/// Fire-and-forget tells that failed so far.
pub(crate) fn failures() -> u64 {
    FAILED.load(Ordering::Relaxed)
}

/// Logs the failures that wait (with the interpreter attached).
pub(crate) fn log_failures(py: Python<'_>) {
    if !ANY.swap(false, Ordering::AcqRel) {
        return;
    }
    let texts: Vec<String> = {
        let mut waiting = lock(texts());
        if waiting.is_empty() {
            return;
        }
        waiting.drain(..).collect()
    };
    let logger = py
        .import("logging")
        .and_then(|logging| logging.call_method1("getLogger", ("tensorwire",)));
    if let Ok(logger) = logger {
        for text in texts {
            let _ =
                logger.call_method1("warning", ("a tell sent with tell_nowait failed: %s", text));
        }
    }
}
