//! `TensorMessage` in Python: a version, opaque metadata bytes and buffers held as exports.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use pyo3::PyTraverseError;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyTypeError;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use tensorwire_engine::TensorMessage;

use crate::buffers::{Buffer, drain_releases, export, export_to_send, not_inherited};
use crate::settled::Settled;

/// A message: `version`, opaque `metadata` and an ordered list of contiguous buffers.
///
/// Buffers are any C-contiguous buffer-protocol objects, held without copying until the send
/// that carries them completes. A receiver in this process gets a copy of the buffers whose
/// bytes may still change (writable ones), unless `lend=True` lends them as they are.
#[pyclass(frozen, weakref, module = "tensorwire._native", name = "TensorMessage")]
pub(crate) struct PyTensorMessage {
    pub(crate) inner: TensorMessage,
    /// The Python objects behind `buffers`: what the caller passed, or for a received message
    /// its `Buffer` views, made at the first look (a reply that is only counted or sent on
    /// never makes them).
    objects: OnceLock<Py<PyList>>,
    /// The path a received reply came over (`None` for messages built here, and requests).
    route: Option<&'static str>,
    /// Indices of the buffers whose bytes their owner may change after the send (writable
    /// exports, and writable received buffers), ascending.
    mutable: Box<[usize]>,
    /// The sender lends even those to an in-process receiver, and keeps them unchanged.
    lend: bool,
    /// A received message sent on in this process before its buffers were looked at: its
    /// views were made read-only then, so nothing here can write what that receiver holds.
    sealed: AtomicBool,
}

/// Copies at least this many bytes with the GIL released.
const COPY_DETACHED: usize = 1 << 20;

#[pymethods]
impl PyTensorMessage {
    #[new]
    #[pyo3(signature = (metadata, buffers, version = 1, *, lend = false))]
    fn new(
        py: Python<'_>,
        metadata: &Bound<'_, PyAny>,
        buffers: &Bound<'_, PyAny>,
        version: u32,
        lend: bool,
    ) -> PyResult<Self> {
        drain_releases(py);
        let metadata = metadata_bytes(metadata)?;
        refuse_single_buffer(buffers)?;
        let objects = PyList::empty(py);
        let mut bytes = Vec::new();
        let mut mutable = Vec::new();
        for (index, obj) in buffers.try_iter()?.enumerate() {
            let obj = obj?;
            let (exported, may_change) = export_to_send(&obj, index)?;
            bytes.push(exported);
            if may_change {
                mutable.push(index);
            }
            objects.append(obj)?;
        }
        Ok(Self {
            inner: TensorMessage::new(version, metadata, bytes),
            objects: OnceLock::from(objects.unbind()),
            route: None,
            mutable: mutable.into_boxed_slice(),
            lend,
            sealed: AtomicBool::new(false),
        })
    }

    /// Whether an in-process receiver gets the buffers as they are (`lend=True`).
    #[getter]
    fn lend(&self) -> bool {
        self.lend
    }

    /// The message's version.
    #[getter]
    fn version(&self) -> u32 {
        self.inner.version
    }

    /// The metadata (a copy: it is small).
    #[getter]
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        not_inherited(&self.inner.metadata)?;
        Ok(PyBytes::new(py, &self.inner.metadata))
    }

    /// The buffers, as passed (sent messages) or as `Buffer` views (received messages).
    #[getter]
    fn buffers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.objects(py)?.bind(py).iter())
    }

    /// The path a received reply came over (`local`, `shm`, `raw`, `http2`); `None` for a
    /// message built here and for requests.
    #[getter]
    fn route(&self) -> Option<&'static str> {
        self.route
    }

    /// The sum of the buffers' lengths.
    #[getter]
    fn total_bytes(&self) -> u64 {
        self.inner.total_bytes()
    }

    fn __len__(&self) -> usize {
        self.inner.buffers.len()
    }

    /// The same message in memory of this process alone, with writable buffers: no other
    /// process — not even a same-user sender whose shared memory a received buffer views —
    /// can change its bytes.
    fn copy(&self) -> PyResult<Self> {
        self.check_inherited()?;
        Ok(Self::received(self.inner.private_copy(), true, self.route))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self.objects.get() {
            Some(objects) => visit.call(objects),
            None => Ok(()),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "<tensorwire.TensorMessage version={} metadata={} bytes, {} buffers, {} bytes>",
            self.inner.version,
            self.inner.metadata.len(),
            self.inner.buffers.len(),
            self.inner.total_bytes()
        )
    }
}

impl Drop for PyTensorMessage {
    /// Python dropped the message (the GIL is held here): exports the engine no longer uses
    /// are released now, not at the next call into tensorwire.
    fn drop(&mut self) {
        drop(std::mem::take(&mut self.inner.buffers));
        Python::attach(drain_releases);
    }
}

impl PyTensorMessage {
    /// Wraps a received message; its buffers become `Buffer` views. `route` is the path a
    /// reply came over.
    pub(crate) fn received(
        inner: TensorMessage,
        writable: bool,
        route: Option<&'static str>,
    ) -> Self {
        // Memory nobody else holds (a copy made for this receiver) is writable too. Writable
        // buffers count as mutable: sent on to a receiver in this process they are copied for
        // it, since their holder here may still write them.
        let mutable = (0..inner.buffers.len())
            .filter(|&i| writable || inner.buffers[i].is_unique())
            .collect();
        Self {
            inner,
            objects: OnceLock::new(),
            route,
            mutable,
            lend: false,
            sealed: AtomicBool::new(false),
        }
    }

    /// The Python objects behind the buffers, made now for a received message.
    fn objects(&self, py: Python<'_>) -> PyResult<&Py<PyList>> {
        if let Some(objects) = self.objects.get() {
            return Ok(objects);
        }
        let views = self.views(py, true)?;
        // Another thread may have made them meanwhile (the list this one made is dropped).
        Ok(self.objects.get_or_init(|| views))
    }

    /// `Buffer` views of the received buffers, writable where the memory is ours alone
    /// (`may_write`) or all read-only.
    fn views(&self, py: Python<'_>, may_write: bool) -> PyResult<Py<PyList>> {
        let views = PyList::empty(py);
        for (index, bytes) in self.inner.buffers.iter().enumerate() {
            let writable = may_write && self.mutable.binary_search(&index).is_ok();
            views.append(Py::new(py, Buffer::new(bytes.clone(), writable))?)?;
        }
        Ok(views.unbind())
    }

    /// Whether nothing here can write the buffers any more: a received message nobody looked
    /// at yet gets read-only views now, so sent on in this process it needs no copy (and its
    /// holder reads, never writes, what the next receiver holds).
    fn seal(&self, py: Python<'_>) -> bool {
        if self.sealed.load(Ordering::Acquire) {
            return true;
        }
        if self.objects.get().is_some() {
            return false;
        }
        let Ok(views) = self.views(py, false) else {
            return false;
        };
        let sealed = self.objects.set(views).is_ok();
        if sealed {
            self.sealed.store(true, Ordering::Release);
        }
        sealed
    }

    /// A message of `objects` (the caller's own buffers, filled by a receive `into=`), with
    /// the received `version` and `metadata`.
    pub(crate) fn of_objects(
        version: u32,
        metadata: Bytes,
        objects: &Bound<'_, PyList>,
        route: Option<&'static str>,
    ) -> PyResult<Self> {
        let mut bytes = Vec::with_capacity(objects.len());
        let mut mutable = Vec::new();
        for (index, obj) in objects.iter().enumerate() {
            let (exported, may_change) = export_to_send(&obj, index)?;
            bytes.push(exported);
            if may_change {
                mutable.push(index);
            }
        }
        Ok(Self {
            inner: TensorMessage::new(version, metadata, bytes),
            objects: OnceLock::from(objects.clone().unbind()),
            route,
            mutable: mutable.into_boxed_slice(),
            lend: false,
            sealed: AtomicBool::new(false),
        })
    }

    /// The message to send: as it is, except that a receiver in this process
    /// (`in_process()`) gets a copy of the buffers whose owner may change them after the send
    /// — one rule on every path: what is received never changes under the receiver.
    pub(crate) fn outgoing(
        &self,
        py: Python<'_>,
        in_process: impl FnOnce() -> bool,
    ) -> TensorMessage {
        if self.lend || self.mutable.is_empty() || !in_process() || self.seal(py) {
            return self.inner.clone();
        }
        let mut message = self.inner.clone();
        copy_buffers(py, &mut message, &self.mutable, COPY_DETACHED);
        message
    }
}

impl PyTensorMessage {
    /// `Ok` unless this is a child made by `fork()` and the message's metadata or a buffer is
    /// shared memory of its parent's (not inherited: reading it would fault), checked before
    /// the message is copied or sent.
    pub(crate) fn check_inherited(&self) -> PyResult<()> {
        not_inherited(&self.inner.metadata)?;
        self.inner.buffers.iter().try_for_each(not_inherited)
    }

    /// The message to send as a reply: as [`PyTensorMessage::outgoing`] to a receiver in this
    /// process; to another process, the buffers the handler may change once `reply()`
    /// returned are copied when smaller than `wait_from` bytes (with the GIL released from
    /// 64 KiB) and tracked otherwise (`settled.rs`): the caller waits for the tracked ones
    /// before it returns.
    pub(crate) fn outgoing_reply(
        &self,
        py: Python<'_>,
        in_process: bool,
        wait_from: usize,
    ) -> (TensorMessage, Option<Arc<Settled>>) {
        if in_process {
            return (self.outgoing(py, || true), None);
        }
        if self.lend || self.mutable.is_empty() || self.seal(py) {
            return (self.inner.clone(), None);
        }
        let mut message = self.inner.clone();
        let mut settled: Option<Arc<Settled>> = None;
        let mut copied = Vec::new();
        for &i in &self.mutable {
            let Some(buffer) = message.buffers.get_mut(i) else {
                continue;
            };
            if buffer.len() < wait_from {
                copied.push(i);
            } else {
                let tracked = settled
                    .get_or_insert_with(Arc::default)
                    .track(buffer.clone());
                *buffer = tracked;
            }
        }
        copy_buffers(py, &mut message, &copied, COPY_DETACHED_REPLY);
        (message, settled)
    }
}

/// A reply copies at least this many bytes with the GIL released.
const COPY_DETACHED_REPLY: usize = 64 << 10;

/// Replaces the buffers of `message` at `indices` by copies of their own, with the GIL
/// released once they add up to `detach_from` bytes.
fn copy_buffers(
    py: Python<'_>,
    message: &mut TensorMessage,
    indices: &[usize],
    detach_from: usize,
) {
    let bytes: usize = indices
        .iter()
        .filter_map(|&i| message.buffers.get(i))
        .map(Bytes::len)
        .sum();
    let copy = |message: &mut TensorMessage| {
        for &i in indices {
            if let Some(buffer) = message.buffers.get_mut(i) {
                *buffer = Bytes::copy_from_slice(buffer);
            }
        }
    };
    if bytes >= detach_from {
        py.detach(|| copy(message));
    } else {
        copy(message);
    }
}

/// `buffers` must be a collection of buffers. One buffer passed as the whole collection would
/// be iterated: a 2-D array into one buffer per row, `bytes` into integers. Refused, saying so.
fn refuse_single_buffer(buffers: &Bound<'_, PyAny>) -> PyResult<()> {
    let is_buffer = PyUntypedBuffer::get(buffers).is_ok() || buffers.hasattr("__dlpack__")?;
    if is_buffer {
        return Err(PyTypeError::new_err(format!(
            "buffers must be a list of buffers, not one {}: it would be split into its rows or \
             bytes; pass [array] for one buffer (or list(array) for one buffer per row)",
            buffers
                .get_type()
                .name()
                .map_or_else(|_| "buffer".to_owned(), |n| n.to_string())
        )));
    }
    Ok(())
}

/// Metadata from `bytes`, `str` (UTF-8) or any buffer (copied: metadata is small).
fn metadata_bytes(obj: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    if let Ok(text) = obj.cast::<PyString>() {
        return Ok(Bytes::copy_from_slice(text.to_str()?.as_bytes()));
    }
    if let Ok(bytes) = obj.cast::<PyBytes>() {
        return Ok(Bytes::copy_from_slice(bytes.as_bytes()));
    }
    if obj.is_none() {
        return Ok(Bytes::new());
    }
    let copy = export(obj, 0).map_err(|e| {
        PyTypeError::new_err(format!("metadata must be bytes, str or a buffer: {e}"))
    })?;
    Ok(Bytes::copy_from_slice(&copy))
}
