//! Mailbox endpoints and the requests taken from them, each answerable once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::PyTraverseError;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use tensorwire_engine::{Endpoint, Incoming, Replier, RequestKind};

use crate::arrived::{Arrived, Deliver};
use crate::buffers::drain_releases;
use crate::convert::reply_from_py;
use crate::errors::{InvalidArgument, to_py};
use crate::into::{Targets, keeping};
use crate::message::PyTensorMessage;
use crate::pump::{Outcome, Pump};
use crate::settled::{WAIT_FROM, reply_then_wait};
use crate::sync::lock;

/// How often a blocking receive wakes to let Ctrl+C through.
const SIGNAL_SLICE: Duration = Duration::from_millis(100);

/// A mailbox: requests sent to its path queue here until received.
#[pyclass(frozen, module = "tensorwire._native", name = "Endpoint")]
pub(crate) struct PyEndpoint {
    endpoint: Arc<Endpoint>,
}

impl PyEndpoint {
    pub(crate) fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint: Arc::new(endpoint),
        }
    }
}

#[pymethods]
impl PyEndpoint {
    /// Its actor path.
    #[getter]
    fn path(&self) -> String {
        self.endpoint.path().to_owned()
    }

    /// Requests waiting.
    fn __len__(&self) -> usize {
        self.endpoint.queued()
    }

    /// The next request; waits up to `timeout` seconds (forever when `None`) with the GIL
    /// released; `None` when the time passed. With `into`, its buffers are copied into those
    /// (after `check(metadata)` passed).
    #[pyo3(signature = (timeout = None, *, pickle = false, into = None, check = None))]
    fn recv(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
        pickle: bool,
        into: Option<&Bound<'_, PyAny>>,
        check: Option<Py<PyAny>>,
    ) -> PyResult<Option<PyRequest>> {
        drain_releases(py);
        let mut targets = into.map(|into| Targets::take(into, check)).transpose()?;
        // A timeout too large to represent (or infinite) waits forever.
        let deadline = match timeout {
            Some(t) if t.is_nan() || t < 0.0 => {
                return Err(InvalidArgument::new_err(format!(
                    "timeout must be >= 0 seconds or None, not {t}"
                )));
            }
            Some(t) => Duration::try_from_secs_f64(t)
                .ok()
                .and_then(|d| std::time::Instant::now().checked_add(d)),
            None => None,
        };
        loop {
            let slice = deadline.map_or(SIGNAL_SLICE, |d| {
                d.saturating_duration_since(std::time::Instant::now())
                    .min(SIGNAL_SLICE)
            });
            let endpoint = Arc::clone(&self.endpoint);
            let got = py
                .detach(move || endpoint.recv_blocking(Some(slice)))
                .map_err(|e| to_py(&e, &format!("receiving on {}", self.endpoint.path())))?;
            if let Some(incoming) = got {
                return PyRequest::from_incoming(py, incoming, pickle, targets.take()).map(Some);
            }
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return Ok(None);
            }
            py.check_signals()?;
        }
    }

    /// Starts a receive of up to `max` requests (at least one: all that are waiting once the
    /// first arrives) whose completion `pump` delivers as a list; returns its token.
    #[pyo3(signature = (pump, max = 64, *, pickle = false))]
    fn recv_batch_start(&self, pump: &Bound<'_, Pump>, max: usize, pickle: bool) -> PyResult<u64> {
        pump.get().here()?;
        let endpoint = Arc::clone(&self.endpoint);
        let max = max.max(1);
        Ok(pump.get().start(Box::pin(async move {
            let first = endpoint.recv().await;
            let path = endpoint.path().to_owned();
            let mut batch = Vec::new();
            let error = match first {
                Ok(incoming) => {
                    batch.push(incoming);
                    while batch.len() < max {
                        match endpoint.recv_blocking(Some(Duration::ZERO)) {
                            Ok(Some(incoming)) => batch.push(incoming),
                            _ => break,
                        }
                    }
                    None
                }
                Err(e) => Some(e),
            };
            Box::new(move |py: Python<'_>| {
                if let Some(e) = error {
                    return Err(to_py(&e, &format!("receiving on {path}")));
                }
                let requests = batch
                    .into_iter()
                    .map(|incoming| {
                        Py::new(py, PyRequest::from_incoming(py, incoming, pickle, None)?)
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                Ok(pyo3::types::PyList::new(py, requests)?.into_any().unbind())
            }) as Outcome
        })))
    }

    /// Starts a receive whose completion `pump` delivers; returns its token. `into` and
    /// `check` as for [`PyEndpoint::recv`].
    #[pyo3(signature = (pump, *, pickle = false, into = None, check = None))]
    fn recv_start(
        &self,
        pump: &Bound<'_, Pump>,
        pickle: bool,
        into: Option<&Bound<'_, PyAny>>,
        check: Option<Py<PyAny>>,
    ) -> PyResult<u64> {
        pump.get().here()?;
        let targets = into.map(|into| Targets::take(into, check)).transpose()?;
        let endpoint = Arc::clone(&self.endpoint);
        Ok(pump.get().start(Box::pin(async move {
            let result = endpoint.recv().await;
            let path = endpoint.path().to_owned();
            Box::new(move |py: Python<'_>| match result {
                // Delivered (and written into the caller's buffers) only once the awaiting
                // coroutine resumed; put back into the mailbox if it was cancelled:
                // `arrived.rs`.
                Ok(incoming) => {
                    let deliver: Deliver = Box::new(move |py, fill| {
                        if !fill {
                            endpoint.put_back(incoming);
                            return Ok(py.None());
                        }
                        let request = PyRequest::from_incoming(py, incoming, pickle, targets)?;
                        Ok(Py::new(py, request)?.into_any())
                    });
                    Ok(Py::new(py, Arrived::new(deliver))?.into_any())
                }
                Err(e) => Err(to_py(&e, &format!("receiving on {path}"))),
            }) as Outcome
        })))
    }
}

/// A request taken from a mailbox. Answer an ask once with `reply` or `fail`; dropping it
/// unanswered sends the asker an error. A tell was acknowledged on arrival.
#[pyclass(frozen, module = "tensorwire._native", name = "Request")]
pub(crate) struct PyRequest {
    /// The actor path it was sent to.
    #[pyo3(get)]
    path: String,
    /// `"ask"` or `"tell"`.
    #[pyo3(get)]
    kind: &'static str,
    /// The sender's address, when it crossed a socket.
    #[pyo3(get)]
    peer: Option<String>,
    /// The peer's TLS client identity, if any.
    #[pyo3(get)]
    identity: Option<String>,
    /// `(uid, pid)` of the peer process on this host, as the kernel reports it, when the
    /// request came over shared memory.
    #[pyo3(get)]
    credentials: Option<(u32, u32)>,
    /// The message.
    #[pyo3(get)]
    message: Py<PyTensorMessage>,
    replier: Mutex<Option<Replier>>,
    pickle: bool,
    /// The asker is in this process (a reply's changeable buffers are copied for it).
    in_process: bool,
}

impl PyRequest {
    /// A request taken from a mailbox; with `targets`, its buffers are received into them (on
    /// a mismatch the error carries the request as `received`, nothing is lost).
    fn from_incoming(
        py: Python<'_>,
        incoming: Incoming,
        pickle: bool,
        targets: Option<Targets>,
    ) -> PyResult<Self> {
        let (request, replier) = incoming.into_parts();
        let writable = request.peer.is_some() && request.local_peer.is_none();
        let in_process = crate::convert::in_process(&request);
        let credentials = request.local_peer.map(|p| (p.uid, p.pid));
        let (message, refused) = match targets {
            None => (
                PyTensorMessage::received(request.message, writable, None),
                None,
            ),
            Some(targets) => match targets.fill(py, request.message, None) {
                Ok(filled) => (filled, None),
                Err(refused) => (
                    PyTensorMessage::received(refused.message, writable, None),
                    Some(refused.error),
                ),
            },
        };
        let taken = Self {
            path: request.path,
            kind: match request.kind {
                RequestKind::Tell => "tell",
                _ => "ask",
            },
            peer: request.peer.map(|p| p.to_string()),
            identity: request.identity,
            credentials,
            message: Py::new(py, message)?,
            replier: Mutex::new(Some(replier)),
            pickle,
            in_process,
        };
        match refused {
            None => Ok(taken),
            Some(error) => Err(keeping(py, error, Py::new(py, taken)?.into_any())),
        }
    }

    fn take(&self) -> PyResult<Replier> {
        lock(&self.replier)
            .take()
            .ok_or_else(|| self.already_answered())
    }

    fn already_answered(&self) -> PyErr {
        InvalidArgument::new_err(format!("the request to {} was already answered", self.path))
    }
}

impl PyRequest {
    /// Answers with `value`: writable buffers below `wait_from` bytes are copied, larger ones
    /// waited for (`settled.rs`).
    fn answer(
        &self,
        py: Python<'_>,
        value: Option<&Bound<'_, PyAny>>,
        wait_from: usize,
    ) -> PyResult<()> {
        let (reply, settled) = match value {
            Some(v) => reply_from_py(v, self.pickle, self.in_process, wait_from)?,
            None => reply_from_py(py.None().bind(py), false, false, wait_from)?,
        };
        let replier = self.take()?;
        // A shared-memory reply is copied on this thread: not under the GIL. The handler may
        // change its buffers once this returns: wait until the transport is done with them.
        py.detach(|| reply_then_wait(replier, Ok(reply), settled));
        Ok(())
    }
}

#[pymethods]
impl PyRequest {
    /// Answers with a `TensorMessage`, `bytes`, `None` (an ack), a `(msg_type, bytes)` pair,
    /// or (received with `pickle=True`) any picklable object.
    #[pyo3(signature = (value = None))]
    fn reply(&self, py: Python<'_>, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        self.answer(py, value, WAIT_FROM)
    }

    /// As `reply`, but returns without waiting for the transport: the reply's writable
    /// buffers are copied first, however large (what coroutine handlers use: their event loop
    /// must not wait for a peer).
    #[pyo3(signature = (value = None))]
    fn reply_nowait(&self, py: Python<'_>, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        self.answer(py, value, usize::MAX)
    }

    /// This request with its buffers copied into `into` (after `check(metadata)` passed): the
    /// request returned answers it, this one no longer can. On a mismatch nothing is written
    /// and this request stays as it was.
    #[pyo3(signature = (into, check = None))]
    fn copy_into(
        slf: &Bound<'_, Self>,
        into: &Bound<'_, PyAny>,
        check: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let (py, this) = (slf.py(), slf.get());
        let targets = Targets::take(into, check)?;
        if lock(&this.replier).is_none() {
            return Err(this.already_answered()); // nothing written
        }
        let received = this.message.get().inner.clone();
        if let Err(error) = targets.fits(py, &received) {
            // Nothing written; this request stays as it was, and is what arrived.
            return Err(keeping(py, error, slf.clone().into_any().unbind()));
        }
        // Taken just before the bytes are written (`check` ran meanwhile, and may have
        // answered it): an answered request writes nothing.
        let replier = this.take()?;
        let message = match targets.write(py, received, None) {
            Ok(message) => message,
            Err(refused) => {
                *lock(&this.replier) = Some(replier);
                return Err(refused.error);
            }
        };
        Ok(Self {
            path: this.path.clone(),
            kind: this.kind,
            peer: this.peer.clone(),
            identity: this.identity.clone(),
            credentials: this.credentials,
            message: Py::new(py, message)?,
            replier: Mutex::new(Some(replier)),
            pickle: this.pickle,
            in_process: this.in_process,
        })
    }

    /// Answers with an error; the asker gets a `RemoteError` carrying `text`.
    fn fail(&self, py: Python<'_>, text: &str) -> PyResult<()> {
        let replier = self.take()?;
        let text = text.to_owned();
        py.detach(|| replier.reply(Err(text)));
        Ok(())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.message)
    }

    fn __repr__(&self) -> String {
        format!(
            "<tensorwire.Request {} {} from {:?}>",
            self.kind, self.path, self.peer
        )
    }
}
