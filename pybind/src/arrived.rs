//! What an asyncio receive into the caller's buffers (`ask_async(into=…)`,
//! `recv_async(into=…)`) hands its event loop: the message as it arrived, not yet written into
//! those buffers.
//!
//! The completion is drained on the loop before the awaiting coroutine resumes, and that
//! coroutine may have been cancelled meanwhile: its caller may already be using the buffers for
//! something else. So the bytes are written only by `fill()`, which the coroutine calls once its
//! await returned; a cancelled receive never writes: a request it leaves behind is kept with
//! its own buffers (`unfilled()`), a reply is let go at once (`discard()`).

use pyo3::prelude::*;

use crate::errors::InvalidArgument;
use crate::sync::lock;

/// Turns what arrived into its Python value: written into the caller's buffers (`true`), or
/// with its own buffers, the caller's let go unwritten (`false`).
pub(crate) type Deliver = Box<dyn FnOnce(Python<'_>, bool) -> PyResult<Py<PyAny>> + Send>;

/// A message received for buffers given as `into=`, not yet written into them.
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
            InvalidArgument::new_err("what arrived was already delivered (fill or unfilled)")
        })
    }
}

#[pymethods]
impl Arrived {
    /// Writes what arrived into the `into=` buffers and returns the reply or request made of
    /// them (a mismatch raises `InvalidArgument`, writes nothing, and keeps what arrived as the
    /// error's `received`). Once.
    fn fill(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        (self.take()?)(py, true)
    }

    /// What arrived with its own buffers; the `into=` buffers are let go unwritten. Once.
    fn unfilled(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        (self.take()?)(py, false)
    }

    /// Lets go of what arrived and of the `into=` buffers, unwritten, now (a cancelled ask:
    /// nobody will read it, and the exception that cancelled it may keep this object alive).
    fn discard(&self) {
        drop(lock(&self.deliver).take());
    }
}
