//! What an asyncio receive (`recv_async`, `ask_async(into=…)`) hands its event loop: the
//! message as it arrived, not yet made into what the awaiting coroutine returns.
//!
//! The completion is drained on the loop before the awaiting coroutine resumes, and that
//! coroutine may have been cancelled meanwhile: its caller may already be using its `into=`
//! buffers for something else, or have stopped receiving. So the message is delivered only by
//! `fill()`, which the coroutine calls once its await returned; a cancelled receive never
//! writes into the caller's buffers, and `withdraw()` lets what arrived go: a request back to
//! its endpoint's mailbox where it was (any receiver, waiting now or later, takes it), a reply
//! dropped at once.

use pyo3::prelude::*;

use crate::errors::InvalidArgument;
use crate::sync::lock;

/// Delivers what arrived as its Python value (`true`: written into the caller's buffers, if
/// it gave any), or lets it go (`false`: returns `None`).
pub(crate) type Deliver = Box<dyn FnOnce(Python<'_>, bool) -> PyResult<Py<PyAny>> + Send>;

/// A message received for an asyncio receive, not yet delivered.
#[pyclass(frozen, module = "tensorwire._native", name = "Arrived")]
pub(crate) struct Arrived {
    deliver: std::sync::Mutex<Option<Deliver>>,
}

impl Arrived {
    pub(crate) fn new(deliver: Deliver) -> Self {
        Self {
            deliver: std::sync::Mutex::new(Some(deliver)),
        }
    }

    fn take(&self) -> PyResult<Deliver> {
        lock(&self.deliver).take().ok_or_else(|| {
            InvalidArgument::new_err("what arrived was already delivered or withdrawn")
        })
    }
}

#[pymethods]
impl Arrived {
    /// The reply or request, written into the `into=` buffers if any were given (a mismatch
    /// raises `InvalidArgument`, writes nothing, and keeps what arrived as the error's
    /// `received`). Once.
    fn fill(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        (self.take()?)(py, true)
    }

    /// Lets what arrived go, nothing written: a request goes back into its endpoint's
    /// mailbox where it was, a reply is dropped. Once; nothing after `fill`.
    fn withdraw(&self, py: Python<'_>) -> PyResult<()> {
        let deliver = lock(&self.deliver).take(); // not held while it runs
        if let Some(deliver) = deliver {
            deliver(py, false)?;
        }
        Ok(())
    }
}
