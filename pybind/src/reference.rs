//! `Ref`: an endpoint of a peer, resolved once — the address parsed, the actor path checked,
//! the allowed paths fixed — and then asked and told as often as needed, from any thread.
//!
//! A call costs what the engine's call costs plus one conversion each way: the GIL is released
//! once for the whole exchange, which runs on the calling thread where the engine allows it
//! (PTR1's blocking client, a shared-memory copy), and the wait for the reply polls briefly
//! before it sleeps. Nothing is formatted or looked up again on the way unless it fails.

use std::sync::Mutex;
use std::time::Duration;

use pyo3::prelude::*;
use tensorwire_engine::{Destination, Error, Node, Pending, Route, TensorMessage, Via};

use crate::arrived::{Arrived, Deliver};
use crate::buffers::drain_releases;
use crate::calls::{ContextLater, interrupt, seconds};
use crate::convert::route_name;
use crate::errors::{InvalidArgument, to_py};
use crate::into::{Targets, reply_for_caller};
use crate::message::PyTensorMessage;
use crate::pending::PyPending;
use crate::pump::{Outcome, Pump};
use crate::sync::into_inner;
use crate::tells;

/// A reference to an endpoint on some node (native half of `tensorwire.Ref`).
#[pyclass(frozen, module = "tensorwire._native", name = "Ref")]
pub(crate) struct PyRef {
    node: Node,
    to: Destination,
    transport: &'static str,
    pickle: bool,
}

impl PyRef {
    pub(crate) fn new(node: Node, to: Destination, transport: &'static str, pickle: bool) -> Self {
        Self {
            node,
            to,
            transport,
            pickle,
        }
    }

    /// The message to send to this reference (see `PyTensorMessage::outgoing`).
    fn outgoing(
        &self,
        py: Python<'_>,
        message: &Bound<'_, PyTensorMessage>,
    ) -> PyResult<TensorMessage> {
        message.get().check_inherited()?;
        Ok(message
            .get()
            .outgoing(py, || self.node.delivers_in_process(&self.to)))
    }

    /// What every ask does before it starts: buffers Python let go of are released, `into`
    /// is checked, the message made ready for this reference and the timeout checked.
    fn prepare_ask(
        &self,
        py: Python<'_>,
        message: &Bound<'_, PyTensorMessage>,
        timeout: f64,
        into: Option<&Bound<'_, PyAny>>,
        check: Option<Py<PyAny>>,
    ) -> PyResult<(TensorMessage, Duration, Option<Targets>)> {
        drain_releases(py);
        let targets = into.map(|into| Targets::take(into, check)).transpose()?;
        Ok((self.outgoing(py, message)?, seconds(timeout)?, targets))
    }

    /// What a failed call was doing (formatted only when it failed).
    fn context(&self, what: &str) -> String {
        format!(
            "{what} {} at {} (transport={})",
            self.to.path(),
            self.to.peer(),
            self.transport
        )
    }
}

#[pymethods]
impl PyRef {
    /// Asks and waits for the reply (GIL released; Ctrl+C interrupts). With `into`, the
    /// reply's buffers are copied into those buffers (after `check(metadata)` passed).
    #[pyo3(signature = (message, timeout = 30.0, *, into = None, check = None))]
    fn ask(
        &self,
        py: Python<'_>,
        message: &Bound<'_, PyTensorMessage>,
        timeout: f64,
        into: Option<&Bound<'_, PyAny>>,
        check: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let (message, timeout, targets) = self.prepare_ask(py, message, timeout, into, check)?;
        let interrupted = Mutex::new(None);
        let result = py.detach(|| {
            let stop = || interrupt(&interrupted);
            self.node
                .ask_blocking_to(&self.to, message, timeout, Some(&stop))
        });
        match result {
            Ok((reply, route)) => reply_for_caller(py, reply, targets, Some(route), self.pickle),
            Err(e) => {
                Err(into_inner(interrupted).unwrap_or_else(|| to_py(&e, &self.context("ask"))))
            }
        }
    }

    /// Tells and waits until the receiver has it in its mailbox.
    #[pyo3(signature = (message, timeout = 30.0))]
    fn tell(
        &self,
        py: Python<'_>,
        message: &Bound<'_, PyTensorMessage>,
        timeout: f64,
    ) -> PyResult<()> {
        drain_releases(py);
        let (message, timeout) = (self.outgoing(py, message)?, seconds(timeout)?);
        let interrupted = Mutex::new(None);
        let result = py.detach(|| {
            let stop = || interrupt(&interrupted);
            self.node
                .tell_blocking_to(&self.to, message, timeout, Some(&stop))
        });
        match result {
            Ok(_) => Ok(()),
            Err(e) => {
                Err(into_inner(interrupted).unwrap_or_else(|| to_py(&e, &self.context("tell"))))
            }
        }
    }

    /// Tells without waiting for the acknowledgement (fire and forget): a failure is counted
    /// (`tensor_transport_stats()["tells_failed"]`) and logged on the `tensorwire` logger.
    #[pyo3(signature = (message, timeout = 30.0))]
    fn tell_nowait(
        &self,
        py: Python<'_>,
        message: &Bound<'_, PyTensorMessage>,
        timeout: f64,
    ) -> PyResult<()> {
        drain_releases(py);
        let (message, timeout) = (self.outgoing(py, message)?, seconds(timeout)?);
        let pending = self.node.tell_to(&self.to, message, timeout);
        let context = (self.to.path().to_owned(), self.to.peer());
        pending.detach(move |result| {
            if let Err(e) = result {
                tells::failed(format!("tell {} at {}: {e}", context.0, context.1));
            }
        });
        Ok(())
    }

    /// Starts an ask whose completion `pump` delivers; returns its token. `into` and `check`
    /// as for [`PyRef::ask`].
    #[pyo3(signature = (pump, message, timeout = 30.0, *, into = None, check = None))]
    fn ask_start(
        &self,
        py: Python<'_>,
        pump: &Bound<'_, Pump>,
        message: &Bound<'_, PyTensorMessage>,
        timeout: f64,
        into: Option<&Bound<'_, PyAny>>,
        check: Option<Py<PyAny>>,
    ) -> PyResult<u64> {
        pump.get().here()?;
        let (message, timeout, targets) = self.prepare_ask(py, message, timeout, into, check)?;
        // Starting never waits (a copy, a connection or a hello happens on the transport's
        // threads): no need to let go of the GIL for it.
        let pending = self.node.ask_to(&self.to, message, timeout);
        let (pickle, context) = (
            self.pickle,
            ContextLater::of(&self.to, "ask", self.transport),
        );
        Ok(pump.get().start(Box::pin(async move {
            let (result, route) = finish(pending).await;
            Box::new(move |py: Python<'_>| match (result, targets) {
                (Ok(reply), None) => reply_for_caller(py, reply, None, route, pickle),
                // Written into the caller's buffers only once the awaiting coroutine resumed
                // (not cancelled): `arrived.rs`.
                (Ok(reply), Some(targets)) => {
                    let deliver: Deliver = Box::new(move |py, fill| {
                        if !fill {
                            return Ok(py.None()); // dropped: the reply and the targets go
                        }
                        reply_for_caller(py, reply, Some(targets), route, pickle)
                    });
                    Ok(Py::new(py, Arrived::new(deliver))?.into_any())
                }
                (Err(e), _) => Err(to_py(&e, &context.text())),
            }) as Outcome
        })))
    }

    /// Starts an ask without waiting for it: its `result()` waits on the calling thread the
    /// way [`PyRef::ask`] does. `into` and `check` as for [`PyRef::ask`].
    #[pyo3(signature = (message, timeout = 30.0, *, into = None, check = None))]
    fn ask_nowait(
        &self,
        py: Python<'_>,
        message: &Bound<'_, PyTensorMessage>,
        timeout: f64,
        into: Option<&Bound<'_, PyAny>>,
        check: Option<Py<PyAny>>,
    ) -> PyResult<PyPending> {
        let (message, timeout, targets) = self.prepare_ask(py, message, timeout, into, check)?;
        let pending = self.node.ask_to(&self.to, message, timeout);
        Ok(PyPending::new(
            self.node.clone(),
            self.to.clone(),
            self.pickle,
            ContextLater::of(&self.to, "ask", self.transport),
            pending,
            targets,
        ))
    }

    /// Starts a tell whose completion `pump` delivers; returns its token.
    #[pyo3(signature = (pump, message, timeout = 30.0))]
    fn tell_start(
        &self,
        py: Python<'_>,
        pump: &Bound<'_, Pump>,
        message: &Bound<'_, PyTensorMessage>,
        timeout: f64,
    ) -> PyResult<u64> {
        pump.get().here()?;
        drain_releases(py);
        let (message, timeout) = (self.outgoing(py, message)?, seconds(timeout)?);
        let pending = self.node.tell_to(&self.to, message, timeout);
        let context = ContextLater::of(&self.to, "tell", self.transport);
        Ok(pump.get().start(Box::pin(async move {
            let (result, _) = finish(pending).await;
            Box::new(move |py: Python<'_>| match result {
                Ok(()) => Ok(py.None()),
                Err(e) => Err(to_py(&e, &context.text())),
            }) as Outcome
        })))
    }

    /// The path the next send takes and why: `(path, reason)`, path one of `local`, `shm`,
    /// `raw`, `http2`.
    fn route(&self, py: Python<'_>) -> PyResult<(String, String)> {
        let choice = py
            .detach(|| self.node.route_for(self.to.peer(), self.to.via()))
            .map_err(|e| to_py(&e, &self.context("routing")))?;
        Ok((route_name(choice.route).to_owned(), choice.reason))
    }
}

/// Waits for `pending` and says which path carried it.
async fn finish<T>(mut pending: Pending<T>) -> (Result<T, Error>, Option<Route>) {
    let result = (&mut pending).await;
    (result, pending.route())
}

/// `transport=` to the paths a send may take (`auto`: the node's preference).
pub(crate) fn via(transport: &str) -> PyResult<(Via, &'static str)> {
    Ok(match transport {
        "auto" => (Via::Preferred, "auto"),
        "local" => (Via::Only(Route::LocalMailbox), "local"),
        "shm" => (Via::Only(Route::SharedMemory), "shm"),
        "raw" => (Via::Only(Route::RawTcp), "raw"),
        "http2" => (Via::Only(Route::Http2), "http2"),
        other => {
            return Err(InvalidArgument::new_err(format!(
                "unknown transport {other:?}: expected auto, local, shm, raw or http2"
            )));
        }
    })
}
