//! Buffers across the Python seam: Python exports held without copying on the way out
//! ([`Export`]), engine memory exposed to Python on the way in ([`Buffer`]).
//!
//! An export's release needs the interpreter; an engine thread never waits for it. The last
//! `Bytes` clone of a Python buffer may drop on any thread: the export then goes to a queue
//! that Python-attached code drains (every call into this module, and the completion pump).

use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyMemoryView};
use pyo3::{Bound, ffi};

use crate::errors::InvalidArgument;
use tensorwire_engine::fork::PerProcess;

/// Exports whose last Rust reference dropped, waiting for an attached thread to release them
/// (a child made by `fork()` starts with an empty list and a lock of its own).
static RELEASES: PerProcess<Mutex<Vec<PyUntypedBuffer>>> = PerProcess::new();

fn releases() -> &'static Mutex<Vec<PyUntypedBuffer>> {
    RELEASES.get_or_init(|| Mutex::new(Vec::new()))
}
/// Whether `RELEASES` may hold anything (checked without the lock on every call).
static WAITING: AtomicBool = AtomicBool::new(false);

/// Releases the exports the engine is done with, and logs failed fire-and-forget tells.
/// Call with the interpreter attached; nearly free when there is nothing to do.
pub(crate) fn drain_releases(py: Python<'_>) {
    if WAITING.swap(false, Ordering::AcqRel) {
        let drained = std::mem::take(&mut *crate::sync::lock(releases()));
        // Dropping a `PyUntypedBuffer` here (attached) calls `PyBuffer_Release` directly.
        drop(drained);
    }
    crate::tells::log_failures(py);
}

/// A Python buffer export owned by a `Bytes`: the memory stays valid (and unreleased) as long
/// as any clone of that `Bytes` lives.
struct Export {
    buffer: Option<PyUntypedBuffer>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the export pins the exporter's memory until released; the pointer is only read
// through `as_ref`, and `PyUntypedBuffer` itself is `Send + Sync`.
unsafe impl Send for Export {}

impl AsRef<[u8]> for Export {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr..ptr+len` is the C-contiguous memory of a live export (checked in
        // `export`); the exporter keeps it valid until `PyBuffer_Release`, which happens only
        // after this owner drops. Python may still write to it: the documented contract is
        // "do not mutate a buffer until the send completes", as torch `isend`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            releases()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(buffer);
            WAITING.store(true, Ordering::Release);
        }
    }
}

/// Takes `obj`'s buffer without copying. `index` names it in the error.
pub(crate) fn export(obj: &Bound<'_, PyAny>, index: usize) -> PyResult<Bytes> {
    export_to_send(obj, index).map(|(bytes, _)| bytes)
}

/// [`export`], and whether its bytes may still change after the send: a writable export of
/// Python memory, a read-only view of memory its owner may write, or a writable received
/// buffer (`false`: immutable — `bytes` and views of it, a read-only received buffer, a
/// frozen loan; see [`backed_by_immutable`]).
pub(crate) fn export_to_send(obj: &Bound<'_, PyAny>, index: usize) -> PyResult<(Bytes, bool)> {
    if let Ok(buffer) = obj.cast::<Buffer>() {
        // One of ours (a received buffer sent on): share the memory, no export needed.
        let buffer = buffer.get();
        buffer.check_inherited()?;
        return Ok((buffer.bytes.clone(), buffer.writable));
    }
    let buffer = match PyUntypedBuffer::get(obj) {
        Ok(buffer) => buffer,
        // A DLPack producer without the buffer protocol (a CPU torch tensor, a JAX array):
        // numpy's view of its memory (no copy), which keeps the producer's tensor alive.
        Err(_) if obj.hasattr("__dlpack__")? => PyUntypedBuffer::get(&from_dlpack(obj, index)?)
            .map_err(|e| unsupported(obj, index, &e))?,
        Err(e) => return Err(unsupported(obj, index, &e)),
    };
    if !buffer.is_c_contiguous() {
        return Err(InvalidArgument::new_err(format!(
            "buffer {index} ({}) is not C-contiguous (shape {:?}, strides {:?}); pass a \
             contiguous copy (numpy.ascontiguousarray) or use tensors.pack(..., contiguous=True)",
            type_name(obj),
            buffer.shape(),
            buffer.strides()
        )));
    }
    let (ptr, len) = (
        buffer.buf_ptr().cast::<u8>().cast_const(),
        buffer.len_bytes(),
    );
    // A read-only export is only a view's promise: its owner may still write the memory
    // (`memoryview(bytearray).toreadonly()`, `a.setflags(write=False)`, set back at will).
    let mutable = !buffer.readonly() || !backed_by_immutable(obj);
    let bytes = Bytes::from_owner(Export {
        buffer: Some(buffer),
        ptr,
        len,
    });
    Ok((bytes, mutable))
}

/// Whether `obj`'s memory can never change: it is `bytes`, a read-only `Buffer` of ours (a
/// frozen loan, or received memory nobody may write), or a view of one of those — through
/// numpy's `base` or a memoryview's `obj`, at most 32 deep. Anything else read-only (a view of
/// a `bytearray`, an array of its own whose flag its owner may set back, a file mapping
/// another process may write) is not.
fn backed_by_immutable(obj: &Bound<'_, PyAny>) -> bool {
    let mut current = obj.clone();
    for _ in 0..32 {
        if current.is_instance_of::<PyBytes>() {
            return true;
        }
        if let Ok(buffer) = current.cast::<Buffer>() {
            return !buffer.get().writable;
        }
        let next = if current.is_instance_of::<PyMemoryView>() {
            current.getattr("obj")
        } else {
            current.getattr("base")
        };
        match next {
            Ok(next) if !next.is_none() => current = next,
            _ => return false,
        }
    }
    false
}

fn unsupported(obj: &Bound<'_, PyAny>, index: usize, e: &PyErr) -> PyErr {
    InvalidArgument::new_err(format!(
        "buffer {index} ({}) does not support the buffer protocol or DLPack: {e}",
        type_name(obj)
    ))
}

/// `numpy.from_dlpack(obj)`: a zero-copy view of a DLPack producer's CPU memory.
fn from_dlpack<'py>(obj: &Bound<'py, PyAny>, index: usize) -> PyResult<Bound<'py, PyAny>> {
    let numpy = obj.py().import("numpy")?;
    numpy.call_method1("from_dlpack", (obj,)).map_err(|e| {
        InvalidArgument::new_err(format!(
            "buffer {index} ({}) cannot be shared through DLPack as CPU memory: {e}",
            type_name(obj)
        ))
    })
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string())
}

/// Engine memory received from a peer, as a Python buffer: `memoryview`, `numpy.frombuffer`
/// and `torch.frombuffer` views keep it alive, and the memory goes back (to the receive pool,
/// or the shared-memory lease to its owner) when the last view dies.
///
/// Writable when the memory is this process's own receive memory (PTR1, HTTP/2); read-only
/// when it aliases a sender in this process or is a sealed shared-memory mapping.
#[pyclass(frozen, weakref, module = "tensorwire._native", name = "Buffer")]
pub(crate) struct Buffer {
    pub(crate) bytes: Bytes,
    writable: bool,
}

impl Buffer {
    pub(crate) fn new(bytes: Bytes, writable: bool) -> Self {
        Self { bytes, writable }
    }

    /// `Ok` unless this is a child made by `fork()` and the bytes are shared memory its
    /// parent had mapped (not inherited: touching them would fault).
    fn check_inherited(&self) -> PyResult<()> {
        not_inherited(&self.bytes)
    }
}

/// `Ok` unless `bytes` lie in shared memory a parent process had mapped before the `fork()`
/// that made this one (not inherited: touching them would fault). Free in a process not
/// forked from one with shared memory mapped.
pub(crate) fn not_inherited(bytes: &Bytes) -> PyResult<()> {
    if bytes.is_empty() || !tensorwire_engine::shm::not_inherited::inherited(bytes.as_ptr()) {
        return Ok(());
    }
    Err(PyBufferError::new_err(NOT_INHERITED))
}

/// Why a shared-memory buffer or loan made before a `fork()` cannot be read in the child.
pub(crate) const NOT_INHERITED: &str = "this buffer is shared memory of the parent process, \
     which a child made by fork() does not inherit: receive it again in the child, or copy it \
     (bytes(buf), numpy.array(buf)) before forking";

#[pymethods]
impl Buffer {
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
        if flags & ffi::PyBUF_WRITABLE != 0 && !me.writable {
            return Err(PyBufferError::new_err(
                "this received buffer is read-only: it aliases the sender's memory (same \
                 process) or a sealed shared-memory region; copy it to write",
            ));
        }
        let len = ffi::Py_ssize_t::try_from(me.bytes.len())
            .map_err(|_| PyBufferError::new_err("buffer too large"))?;
        // SAFETY: `view` is CPython's to fill; the pointer and length describe `me.bytes`, which
        // lives as long as `slf`, and `PyBuffer_FillInfo` stores a strong reference to `slf`
        // in `view.obj`, so every view keeps the memory alive. Writes are allowed only for
        // receive memory nobody else reads (see the type's docs).
        let res = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                me.bytes.as_ptr().cast_mut().cast::<c_void>(),
                len,
                c_int::from(!me.writable),
                flags,
            )
        };
        if res == -1 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    /// # Safety
    ///
    /// Called by CPython when a view is released; nothing to free.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}

    fn __len__(&self) -> usize {
        self.bytes.len()
    }

    /// A copy of the bytes.
    fn __bytes__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.check_inherited()?;
        Ok(PyBytes::new(py, &self.bytes))
    }

    /// Whether views may write to it.
    #[getter]
    fn writable(&self) -> bool {
        self.writable
    }

    /// The DLPack protocol: a capsule of a one-dimensional `uint8` CPU tensor, which it keeps
    /// alive (`numpy.from_dlpack(buffer)`, `torch.from_dlpack`, `jax.numpy.from_dlpack`). A
    /// read-only buffer is shared only with a consumer that keeps it read-only (DLPack 1.x,
    /// not torch); others get a copy (see `dlpack.rs`).
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if stream.is_some_and(|s| !s.is_none()) {
            return Err(PyBufferError::new_err(
                "tensorwire buffers are CPU memory: __dlpack__ takes no stream",
            ));
        }
        let me = slf.get();
        me.check_inherited()?;
        let request = crate::dlpack::Request {
            max_version,
            copy,
            device: dl_device,
            ignores_read_only: !me.writable
                && copy != Some(true)
                && crate::dlpack::caller_ignores_read_only(slf.py()),
        };
        crate::dlpack::capsule(slf.py(), &me.bytes, me.writable, &request)
    }

    /// `(device_type, device_id)`: `(1, 0)`, the CPU.
    fn __dlpack_device__(&self) -> (i32, i32) {
        crate::dlpack::device()
    }

    fn __repr__(&self) -> String {
        format!(
            "<tensorwire.Buffer {} bytes, {}>",
            self.bytes.len(),
            if self.writable {
                "writable"
            } else {
                "read-only"
            }
        )
    }
}
