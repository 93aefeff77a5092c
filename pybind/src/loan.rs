//! `Node.loan(n)`: a writable shared-memory slot to fill in place, then `freeze()` into a
//! read-only `Buffer` that travels to a same-host peer without a copy (sealed against writes
//! first, so the receiver can never see it change).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::{Bound, ffi};
use tensorwire_engine::shm::Loan;

use crate::buffers::{Buffer, drain_releases};
use crate::errors::ShutDown;

/// References to a loan object during `loan.freeze()` when nothing else holds it: the
/// caller's name and the call's own reference to `self`.
const FREEZE_REFERENCES: isize = 2;

/// A shared-memory slot on loan: a writable buffer until [`PyLoan::freeze`].
#[pyclass(frozen, module = "tensorwire._native", name = "Loan")]
pub(crate) struct PyLoan {
    loan: Mutex<Option<Loan>>,
    /// Where the slot is mapped (stable while the loan lives) and its length.
    ptr: usize,
    len: usize,
    /// Views exported now: `freeze` refuses while any is alive (like `mmap.close`).
    exports: AtomicUsize,
}

impl PyLoan {
    pub(crate) fn new(mut loan: Loan) -> Self {
        let slice = loan.as_mut_slice();
        let (ptr, len) = (slice.as_mut_ptr() as usize, slice.len());
        Self {
            loan: Mutex::new(Some(loan)),
            ptr,
            len,
            exports: AtomicUsize::new(0),
        }
    }
}

#[pymethods]
impl PyLoan {
    /// # Safety
    ///
    /// Called by CPython with a `view` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let me = slf.get();
        let guard = me.loan.lock().unwrap_or_else(PoisonError::into_inner);
        if guard.is_none() {
            return Err(PyBufferError::new_err(
                "this loan was frozen: use the Buffer freeze() returned",
            ));
        }
        let len = ffi::Py_ssize_t::try_from(me.len)
            .map_err(|_| PyBufferError::new_err("loan too large"))?;
        // SAFETY: `ptr..ptr+len` is the loan's writable mapping, valid while the loan is held
        // (it is: checked above, and `freeze` refuses while a view is exported); the view
        // keeps a strong reference to `slf`.
        let res = unsafe {
            ffi::PyBuffer_FillInfo(view, slf.as_ptr(), me.ptr as *mut c_void, len, 0, flags)
        };
        if res == -1 {
            return Err(PyErr::fetch(slf.py()));
        }
        me.exports.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// # Safety
    ///
    /// Called by CPython when a view is released.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.exports.fetch_sub(1, Ordering::AcqRel);
    }

    fn __len__(&self) -> usize {
        self.len
    }

    /// Seals the slot against writes and returns it as a read-only `Buffer` to put in a
    /// `TensorMessage`: sent to a same-host peer, it travels without a copy. Refused while
    /// views of the loan are alive (release them first: `del`, `memoryview.release()`).
    fn freeze(slf: &Bound<'_, Self>) -> PyResult<Buffer> {
        drain_releases(slf.py());
        // Freezing unmaps the writable mapping. Some consumers keep a pointer but not a
        // buffer export (`torch.frombuffer`, `numpy.ndarray(buffer=...)`): they hold a
        // reference to the loan instead, so any reference beyond the caller's is refused.
        // SAFETY: `slf` is a live object; reading its reference count has no other effect.
        let references = unsafe { ffi::Py_REFCNT(slf.as_ptr()) };
        if references > FREEZE_REFERENCES {
            return Err(PyBufferError::new_err(format!(
                "{} other object(s) still refer to this loan (a tensor or array built on it?); \
                 delete them before freeze(): the loan's writable memory goes away",
                references - FREEZE_REFERENCES
            )));
        }
        let me = slf.get();
        let mut guard = me.loan.lock().unwrap_or_else(PoisonError::into_inner);
        if me.exports.load(Ordering::Acquire) != 0 {
            return Err(PyBufferError::new_err(format!(
                "{} view(s) of this loan are still alive; release them before freeze()",
                me.exports.load(Ordering::Acquire)
            )));
        }
        let loan = guard
            .take()
            .ok_or_else(|| ShutDown::new_err("this loan was already frozen"))?;
        let bytes = loan
            .freeze()
            .map_err(|e| PyBufferError::new_err(format!("freezing the loan: {e}")))?;
        Ok(Buffer::new(bytes, false))
    }
}
