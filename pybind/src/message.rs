//! `TensorMessage` in Python: a version, opaque metadata bytes and buffers held as exports.

use bytes::Bytes;
use pyo3::PyTraverseError;
use pyo3::exceptions::PyTypeError;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use tensorwire_engine::TensorMessage;

use crate::buffers::{Buffer, drain_releases, export};

/// A message: `version`, opaque `metadata` and an ordered list of contiguous buffers.
///
/// Buffers are any C-contiguous buffer-protocol objects, held without copying until the send
/// that carries them completes.
#[pyclass(frozen, weakref, module = "tensorwire._native", name = "TensorMessage")]
pub(crate) struct PyTensorMessage {
    pub(crate) inner: TensorMessage,
    /// The Python objects behind `buffers` (what the caller passed, or received `Buffer`s).
    objects: Py<PyList>,
    /// The path a received reply came over (`None` for messages built here, and requests).
    route: Option<&'static str>,
}

#[pymethods]
impl PyTensorMessage {
    #[new]
    #[pyo3(signature = (metadata, buffers, version = 1))]
    fn new(
        py: Python<'_>,
        metadata: &Bound<'_, PyAny>,
        buffers: &Bound<'_, PyAny>,
        version: u32,
    ) -> PyResult<Self> {
        drain_releases(py);
        let metadata = metadata_bytes(metadata)?;
        let objects = PyList::empty(py);
        let mut bytes = Vec::new();
        for (index, obj) in buffers.try_iter()?.enumerate() {
            let obj = obj?;
            bytes.push(export(&obj, index)?);
            objects.append(obj)?;
        }
        Ok(Self {
            inner: TensorMessage::new(version, metadata, bytes),
            objects: objects.unbind(),
            route: None,
        })
    }

    /// The message's version.
    #[getter]
    fn version(&self) -> u32 {
        self.inner.version
    }

    /// The metadata (a copy: it is small).
    #[getter]
    fn metadata<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.metadata)
    }

    /// The buffers, as passed (sent messages) or as `Buffer` views (received messages).
    #[getter]
    fn buffers<'py>(&self, py: Python<'py>) -> Bound<'py, PyTuple> {
        PyTuple::new(py, self.objects.bind(py).iter()).unwrap_or_else(|_| PyTuple::empty(py))
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

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.objects)
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
        py: Python<'_>,
        inner: TensorMessage,
        writable: bool,
        route: Option<&'static str>,
    ) -> PyResult<Self> {
        let objects = PyList::empty(py);
        for bytes in &inner.buffers {
            objects.append(Py::new(py, Buffer::new(bytes.clone(), writable))?)?;
        }
        Ok(Self {
            inner,
            objects: objects.unbind(),
            route,
        })
    }
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
