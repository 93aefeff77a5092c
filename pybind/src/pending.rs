//! `Pending`: an ask started without waiting (`Ref.ask_nowait`) and waited for later on the
//! calling thread (`Node::wait_for`): over shared memory the waiting thread reads the
//! connection itself within the spin window, so a reply that comes meanwhile costs no wake-up;
//! over PTR1 the ask goes through the driver and the thread sleeps until a driver thread
//! brings the reply (polling for it took the CPU that thread needed). One thread keeps several asks in flight this way without an event loop.
//!
//! What it does not do: run callbacks or wake anything when the reply comes (asyncio's
//! `ask_async` does that), or let two threads wait for the same ask at once.

use std::sync::Mutex;

use pyo3::prelude::*;
use tensorwire_engine::{Destination, Error, Node, Pending, Reply};

use crate::buffers::drain_releases;
use crate::calls::{ContextLater, interrupt, seconds};
use crate::errors::{DeadlineExceeded, InvalidArgument, to_py};
use crate::into::{Targets, reply_for_caller};
use crate::sync::{into_inner, lock};

/// An ask in flight, started by `Ref.ask_nowait` (native half of `tensorwire.Pending`).
#[pyclass(frozen, module = "tensorwire._native", name = "Pending")]
pub(crate) struct PyPending {
    node: Node,
    to: Destination,
    pickle: bool,
    context: ContextLater,
    state: Mutex<State>,
}

enum State {
    /// In flight; `None` while a thread waits for it (the wait holds it, GIL released).
    Waiting(Option<InFlight>),
    /// Finished: what every `result()` returns or raises.
    Done(Result<Py<PyAny>, PyErr>),
}

struct InFlight {
    pending: Pending<Reply>,
    targets: Option<Targets>,
}

impl PyPending {
    pub(crate) fn new(
        node: Node,
        to: Destination,
        pickle: bool,
        context: ContextLater,
        pending: Pending<Reply>,
        targets: Option<Targets>,
    ) -> Self {
        Self {
            node,
            to,
            pickle,
            context,
            state: Mutex::new(State::Waiting(Some(InFlight { pending, targets }))),
        }
    }

    /// Takes the ask out to wait for it, or the finished result.
    fn take(&self, py: Python<'_>) -> Result<InFlight, PyResult<Py<PyAny>>> {
        self.inherited().map_err(Err)?;
        match &mut *lock(&self.state) {
            State::Done(result) => Err(copy(py, result)),
            State::Waiting(waiting) => waiting.take().ok_or_else(|| {
                Err(InvalidArgument::new_err(format!(
                    "{}: another thread is waiting for this ask's result",
                    self.context.text()
                )))
            }),
        }
    }

    /// `Err(ShutDown)` in a child made by `fork()`: the ask is the parent's.
    fn inherited(&self) -> PyResult<()> {
        self.node
            .check_process()
            .map_err(|e| to_py(&e, &self.context.text()))
    }

    fn put_back(&self, in_flight: InFlight) {
        *lock(&self.state) = State::Waiting(Some(in_flight));
    }
}

#[pymethods]
impl PyPending {
    /// Waits for the reply on this thread (GIL released; Ctrl+C interrupts the wait, not the
    /// ask) and returns it, or raises the ask's error; every later call gives the same.
    /// `timeout`: seconds to wait at most (`None`: until the ask's own timeout), after which
    /// `DeadlineExceeded` is raised and the ask goes on.
    #[pyo3(signature = (timeout = None))]
    fn result(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        drain_releases(py);
        let limit = timeout.map(seconds).transpose()?;
        let mut in_flight = match self.take(py) {
            Ok(in_flight) => in_flight,
            Err(done) => return done,
        };
        let interrupted = Mutex::new(None);
        let outcome = py.detach(|| {
            let stop = || interrupt(&interrupted);
            self.node
                .wait_for(&self.to, &mut in_flight.pending, limit, Some(&stop))
        });
        let value = match outcome {
            None => {
                self.put_back(in_flight);
                return Err(DeadlineExceeded::new_err(format!(
                    "{}: no reply within {}s of waiting; the ask goes on",
                    self.context.text(),
                    timeout.unwrap_or_default()
                )));
            }
            Some(Ok((reply, route))) => {
                reply_for_caller(py, reply, in_flight.targets, Some(route), self.pickle)
            }
            Some(Err(e)) => match (e, into_inner(interrupted)) {
                // Ctrl+C ended the wait, not the ask.
                (Error::Cancelled, Some(raised)) => {
                    self.put_back(in_flight);
                    return Err(raised);
                }
                (e, _) => Err(to_py(&e, &self.context.text())),
            },
        };
        *lock(&self.state) = State::Done(copy(py, &value));
        value
    }

    /// Whether the reply (or the ask's error) is there: `result()` would not wait.
    fn done(&self) -> PyResult<bool> {
        self.inherited()?;
        Ok(match &*lock(&self.state) {
            State::Done(_) => true,
            State::Waiting(Some(in_flight)) => in_flight.pending.is_ready(),
            State::Waiting(None) => false,
        })
    }

    /// Cancels the ask if it has not finished and no thread waits for it: `True` if it was
    /// cancelled (`result()` then raises `Cancelled`). A request already sent may still be
    /// acted on by the peer.
    fn cancel(&self) -> PyResult<bool> {
        self.inherited()?;
        let mut state = lock(&self.state);
        let cancellable =
            matches!(&*state, State::Waiting(Some(in_flight)) if !in_flight.pending.is_ready());
        if !cancellable {
            return Ok(false);
        }
        let cancelled = Error::Cancelled;
        let dropped = std::mem::replace(
            &mut *state,
            State::Done(Err(to_py(&cancelled, &self.context.text()))),
        );
        drop(state);
        drop(dropped); // the engine cancels the ask; its Python objects go, outside the lock
        Ok(true)
    }
}

impl Drop for PyPending {
    fn drop(&mut self) {
        if self.node.check_process().is_err() {
            // Inherited by a child made by fork(): dropping the ask would cancel it on the
            // parent's connections.
            let state = std::mem::replace(&mut *lock(&self.state), State::Waiting(None));
            std::mem::forget(state);
        }
    }
}

fn copy(py: Python<'_>, result: &PyResult<Py<PyAny>>) -> PyResult<Py<PyAny>> {
    match result {
        Ok(value) => Ok(value.clone_ref(py)),
        Err(err) => Err(err.clone_ref(py)),
    }
}
