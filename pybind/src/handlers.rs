//! Python handlers served on threads of their own (`node.serve` with a function).
//!
//! Each thread keeps its Python thread state for its whole life (attached once, detached while
//! it waits), so a request costs one GIL hand-over, not a thread state made and destroyed. A
//! thread that just answered polls its mailbox for the next request before it sleeps — for
//! `busy_poll`, stretched towards ten times that while requests keep coming at short gaps — so a
//! conversation does not pay a sleeping thread's wake-up per request; a node made with `spin=`
//! polls for that long instead. The engine's threads
//! never wait for the GIL: requests reach these threads through the endpoint's mailbox.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use tensorwire_engine::{Endpoint, Error, Incoming};

use crate::buffers::drain_releases;
use crate::convert::reply_from_py;
use crate::message::PyTensorMessage;
use crate::settled::{WAIT_FROM, reply_then_wait};
use crate::sync::lock;

/// How long a handler thread polls for the next request at least (and, times ten, at most).
const BUSY_POLL: Duration = Duration::from_micros(20);
/// How long a sleeping handler thread waits before it looks again (shutdown is noticed by the
/// mailbox closing; this only bounds a missed wake-up).
const SLEEP: Duration = Duration::from_millis(100);

/// A Python handler the threads call; emptied when the garbage collector breaks a cycle
/// through it (requests then get an error saying the handler is gone).
pub(crate) struct HandlerSlot {
    pub(crate) handler: Mutex<Option<Py<PyAny>>>,
}

impl HandlerSlot {
    pub(crate) fn new(handler: Py<PyAny>) -> Arc<Self> {
        Arc::new(Self {
            handler: Mutex::new(Some(handler)),
        })
    }

    fn handler(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        lock(&self.handler).as_ref().map(|h| h.clone_ref(py))
    }
}

/// Starts `threads` threads that answer the requests of `endpoint` with `slot`'s handler.
pub(crate) fn spawn(
    endpoint: &Arc<Endpoint>,
    slot: &Arc<HandlerSlot>,
    threads: usize,
    pickle: bool,
    spin: Option<Duration>,
) -> std::io::Result<Vec<JoinHandle<()>>> {
    (0..threads)
        .map(|i| {
            let (endpoint, slot) = (Arc::clone(endpoint), Arc::clone(slot));
            let name = format!(
                "tensorwire-py-{}-{i}",
                endpoint.path().rsplit('/').next().unwrap_or("")
            );
            std::thread::Builder::new()
                .name(name)
                .spawn(move || Python::attach(|py| serve(py, &endpoint, &slot, pickle, spin)))
        })
        .collect()
}

/// One handler thread's life: wait (detached), answer (attached), until the mailbox closes.
/// `fixed`: the node's `spin=` window after each answer instead of the adaptive one.
fn serve(
    py: Python<'_>,
    endpoint: &Endpoint,
    slot: &HandlerSlot,
    pickle: bool,
    fixed: Option<Duration>,
) {
    let mut last = Instant::now();
    let mut gap = Duration::from_secs(1);
    loop {
        let spin = match fixed {
            Some(window) => window,
            None if gap <= BUSY_POLL * 10 => (gap * 3 / 2).clamp(BUSY_POLL, BUSY_POLL * 10),
            None => BUSY_POLL,
        };
        let spin = spin.saturating_sub(last.elapsed());
        let next = py.detach(|| next_request(endpoint, spin));
        let Ok(incoming) = next else {
            return; // the mailbox closed: the node shut down
        };
        let now = Instant::now();
        // A moving average over the last few gaps (weight 1/4 for the newest).
        gap = (gap * 3 + now.saturating_duration_since(last)) / 4;
        answer(py, slot, incoming, pickle);
        last = Instant::now();
    }
}

/// The next request: polled for during `spin`, then waited for.
fn next_request(endpoint: &Endpoint, spin: Duration) -> Result<Incoming, Error> {
    let mut spin = spin;
    loop {
        if let Some(incoming) = endpoint.recv_spinning(spin, Some(SLEEP))? {
            return Ok(incoming);
        }
        spin = Duration::ZERO;
    }
}

/// Calls the handler on one request and answers it (the answer leaves with the GIL released).
fn answer(py: Python<'_>, slot: &HandlerSlot, incoming: Incoming, pickle: bool) {
    drain_releases(py);
    let (request, replier) = incoming.into_parts();
    let path = request.path.clone();
    let writable = request.peer.is_some() && request.local_peer.is_none();
    let in_process = crate::convert::in_process(&request);
    let result = (|| {
        let handler = slot
            .handler(py)
            .ok_or_else(|| format!("the handler of {path} was collected"))?;
        let message = PyTensorMessage::received(request.message, writable, None);
        let value = handler.call1(py, (message,)).map_err(|e| failure(py, &e))?;
        reply_from_py(value.bind(py), pickle, in_process, WAIT_FROM).map_err(|e| failure(py, &e))
    })();
    let (result, settled) = match result {
        Ok((reply, settled)) => (Ok(reply), settled),
        Err(text) => (Err(text), None),
    };
    // The handler may change the reply's buffers for its next request: wait until the
    // transport is done with them.
    py.detach(|| reply_then_wait(replier, result, settled));
}

/// The text an engine peer gets for a handler's exception.
fn failure(py: Python<'_>, err: &PyErr) -> String {
    let kind = err
        .get_type(py)
        .name()
        .map_or_else(|_| "Exception".to_owned(), |n| n.to_string());
    format!("{kind}: {}", err.value(py))
}
