//! What every call from Python needs on the way: its timeout checked, Ctrl+C heard while it
//! waits with the GIL released, and its error context kept to format only if it fails.

use std::sync::Mutex;
use std::time::Duration;

use pyo3::prelude::*;
use tensorwire_engine::Destination;

use crate::errors::InvalidArgument;
use crate::sync::lock;

pub(crate) fn seconds(timeout: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(timeout).map_err(|_| {
        InvalidArgument::new_err(format!(
            "timeout must be a finite number of seconds >= 0, not {timeout}"
        ))
    })
}

/// Asked every 100 ms of a blocking call with the GIL released: whether a signal handler
/// raised (Ctrl+C), keeping its exception to re-raise.
pub(crate) fn interrupt(raised: &Mutex<Option<PyErr>>) -> bool {
    Python::attach(|py| match py.check_signals() {
        Ok(()) => false,
        Err(e) => {
            *lock(raised) = Some(e);
            true
        }
    })
}

/// The parts of an error's context, kept to format only if the call fails.
pub(crate) struct ContextLater {
    what: &'static str,
    path: String,
    peer: std::net::SocketAddr,
    transport: &'static str,
}

impl ContextLater {
    pub(crate) fn of(to: &Destination, what: &'static str, transport: &'static str) -> Self {
        Self {
            what,
            path: to.path().to_owned(),
            peer: to.peer(),
            transport,
        }
    }

    pub(crate) fn text(&self) -> String {
        format!(
            "{} {} at {} (transport={})",
            self.what, self.path, self.peer, self.transport
        )
    }
}
