//! `Node.loan(n)`: a writable shared-memory slot to fill in place, then `freeze()` into a
//! read-only `Buffer` that travels to a same-host peer without a copy.
//!
//! Exports are tracked exactly (the buffer protocol's get and release): `freeze()` refuses
//! while any is alive (`memoryview`, `numpy.frombuffer`). Some consumers keep the address but
//! release their export at once (`numpy.ndarray(buffer=)`, `torch.frombuffer`): Python's
//! exports are made from the loan's own window (a second mapping of the slot), and freezing
//! turns that window into a private copy-on-write mapping, so such leftovers still read the
//! bytes but their writes never reach the frozen buffer or its receivers.

use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::{Bound, ffi};
use tensorwire_engine::shm::{Loan, Window};

use crate::buffers::{Buffer, drain_releases};
use crate::errors::{OutOfMemory, ShutDown};
use crate::sync::lock;

/// A shared-memory slot on loan: a writable buffer until [`PyLoan::freeze`].
#[pyclass(frozen, weakref, module = "tensorwire._native", name = "Loan")]
pub(crate) struct PyLoan {
    state: Mutex<State>,
    /// Where the window maps the loan (stable while this object lives) and its length.
    ptr: usize,
    len: usize,
    /// Views exported now.
    exports: AtomicUsize,
}

enum State {
    Open {
        loan: Loan,
        window: Window,
    },
    /// Frozen: the window stays (privatized) for whatever still points into it.
    Frozen {
        _window: Window,
    },
}

impl PyLoan {
    pub(crate) fn new(loan: Loan) -> PyResult<Self> {
        let window = loan
            .window()
            .map_err(|e| OutOfMemory::new_err(format!("mapping the loan: {e}")))?;
        let (ptr, len) = (window.as_ptr() as usize, window.len());
        Ok(Self {
            state: Mutex::new(State::Open { loan, window }),
            ptr,
            len,
            exports: AtomicUsize::new(0),
        })
    }
}

impl PyLoan {
    /// `Ok` unless this is a child made by `fork()` and the loan is its parent's (its window
    /// is not mapped here, and its slot is the parent's to fill).
    fn check_inherited(&self) -> PyResult<()> {
        if tensorwire_engine::shm::not_inherited::inherited(self.ptr as *const u8) {
            return Err(PyBufferError::new_err(crate::buffers::NOT_INHERITED));
        }
        Ok(())
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
        me.check_inherited()?;
        let state = lock(&me.state);
        if matches!(*state, State::Frozen { .. }) {
            return Err(PyBufferError::new_err(
                "this loan was frozen: use the Buffer freeze() returned",
            ));
        }
        let len = ffi::Py_ssize_t::try_from(me.len)
            .map_err(|_| PyBufferError::new_err("loan too large"))?;
        // SAFETY: `ptr..ptr+len` is the loan's window, a writable mapping that lives as long
        // as this object (it is dropped with it, never before, even once frozen); the view
        // keeps a strong reference to `slf`. The loan is open (checked above, under the lock
        // that `freeze` takes), and `freeze` refuses while the export this counts is alive.
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

    /// Where this process maps the loan (so an array made with `numpy.ndarray(buffer=loan)`
    /// can be told to cover it exactly).
    #[getter]
    fn address(&self) -> usize {
        self.ptr
    }

    /// Whether it was frozen.
    #[getter]
    fn frozen(&self) -> bool {
        matches!(*lock(&self.state), State::Frozen { .. })
    }

    /// Ends the loan's writable life and returns it as a read-only `Buffer` to put in a
    /// `TensorMessage`: sent to a same-host peer, it travels without a copy, and its bytes
    /// never change again. Refused while a view of the loan is exported (release it first:
    /// `del`, `memoryview.release()`); an object that kept only the address
    /// (`numpy.ndarray(buffer=)`, `torch.frombuffer`) writes to a private copy from now on.
    fn freeze(slf: &Bound<'_, Self>) -> PyResult<Buffer> {
        drain_releases(slf.py());
        let me = slf.get();
        me.check_inherited()?;
        let mut state = lock(&me.state);
        let exports = me.exports.load(Ordering::Acquire);
        if exports != 0 {
            return Err(PyBufferError::new_err(format!(
                "{exports} view(s) of this loan are still exported (memoryview, \
                 numpy.frombuffer, …); release them before freeze()"
            )));
        }
        let taken = std::mem::replace(
            &mut *state,
            State::Frozen {
                _window: Window::default(),
            },
        );
        match taken {
            State::Open { loan, mut window } => {
                if let Err(e) = window.privatize() {
                    *state = State::Open { loan, window };
                    return Err(PyBufferError::new_err(format!("freezing the loan: {e}")));
                }
                *state = State::Frozen { _window: window };
                Ok(Buffer::new(loan.freeze(), false))
            }
            frozen => {
                *state = frozen;
                Err(ShutDown::new_err("this loan was already frozen"))
            }
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "<tensorwire.Loan {} bytes, {}>",
            self.len,
            if self.frozen() { "frozen" } else { "writable" }
        )
    }
}
