//! Replies between Python values and the engine's `Reply`.
//!
//! A handler (or `Request.reply`) answers with a `TensorMessage` (tensor reply), `bytes`
//! (single reply of type `bytes`), `None` (single reply of type `ack`), a `(msg_type, bytes)`
//! pair, or — when the endpoint was served with `pickle=True` — any picklable object (single
//! reply of type `pickle`).

use std::sync::Arc;

use bytes::Bytes;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyMemoryView, PyTuple};
use tensorwire_engine::{Reply, Route};

use crate::message::PyTensorMessage;
use crate::settled::Settled;

/// The single-reply type of `None`.
pub(crate) const ACK: &str = "ack";
/// The single-reply type of `bytes`.
pub(crate) const BYTES: &str = "bytes";
/// The single-reply type of a pickled object.
pub(crate) const PICKLE: &str = "pickle";

/// A Python answer as an engine reply; `in_process`: the asker is in this process (it gets a
/// copy of the buffers the handler may still change, see `PyTensorMessage::outgoing`). With
/// what to wait for, once the reply is handed over, before the handler may change its
/// buffers (`settled.rs`: buffers of `wait_from` bytes or more are waited for, smaller ones
/// copied).
pub(crate) fn reply_from_py(
    value: &Bound<'_, PyAny>,
    pickle: bool,
    in_process: bool,
    wait_from: usize,
) -> PyResult<(Reply, Option<Arc<Settled>>)> {
    if let Ok(message) = value.cast::<PyTensorMessage>() {
        message.get().check_inherited()?;
        let (message, settled) = message
            .get()
            .outgoing_reply(value.py(), in_process, wait_from);
        return Ok((Reply::Tensor(message), settled));
    }
    single_from_py(value, pickle).map(|reply| (reply, None))
}

/// A reply other than a `TensorMessage`: copied (single replies are small).
fn single_from_py(value: &Bound<'_, PyAny>, pickle: bool) -> PyResult<Reply> {
    if value.is_none() {
        return Ok(single(ACK, Bytes::new()));
    }
    if let Ok(bytes) = value.cast::<PyBytes>() {
        return Ok(single(BYTES, Bytes::copy_from_slice(bytes.as_bytes())));
    }
    if value.cast::<PyByteArray>().is_ok() || value.cast::<PyMemoryView>().is_ok() {
        // Bytes-like: a bytes reply (copied: single replies are small), never pickled.
        let data = crate::buffers::export(value, 0)?;
        return Ok(single(BYTES, Bytes::copy_from_slice(&data)));
    }
    if let Ok(pair) = value.cast::<PyTuple>()
        && pair.len() == 2
        && let (Ok(kind), Ok(data)) = (
            pair.get_item(0)?.extract::<String>(),
            pair.get_item(1)?.cast_into::<PyBytes>(),
        )
    {
        return Ok(single(&kind, Bytes::copy_from_slice(data.as_bytes())));
    }
    if pickle {
        let data = value
            .py()
            .import("pickle")?
            .call_method1("dumps", (value,))?
            .cast_into::<PyBytes>()?;
        return Ok(single(PICKLE, Bytes::copy_from_slice(data.as_bytes())));
    }
    Err(PyTypeError::new_err(format!(
        "cannot reply with a {}: reply with a TensorMessage, bytes, None (an ack) or a \
         (msg_type, bytes) pair, or serve with pickle=True to send any picklable object",
        value.get_type().name()?
    )))
}

fn single(msg_type: &str, data: Bytes) -> Reply {
    Reply::Single {
        msg_type: msg_type.to_owned(),
        data,
    }
}

/// An engine reply that came over `route` as a Python value: a `TensorMessage`, `None` for an
/// ack, `bytes`, the unpickled object (when `pickle`), else a `(msg_type, bytes)` pair.
pub(crate) fn reply_to_py(
    py: Python<'_>,
    reply: Reply,
    route: Option<Route>,
    pickle: bool,
) -> PyResult<Py<PyAny>> {
    match reply {
        Reply::Tensor(message) => {
            let (writable, route) = (writable(route), route.map(route_name));
            Ok(Py::new(py, PyTensorMessage::received(message, writable, route))?.into_any())
        }
        Reply::Single { msg_type, data } => match msg_type.as_str() {
            ACK if data.is_empty() => Ok(py.None()),
            BYTES => Ok(PyBytes::new(py, &data).into_any().unbind()),
            PICKLE if pickle => Ok(py
                .import("pickle")?
                .call_method1("loads", (PyBytes::new(py, &data),))?
                .unbind()),
            _ => Ok((msg_type, PyBytes::new(py, &data))
                .into_pyobject(py)?
                .into_any()
                .unbind()),
        },
    }
}

/// Whether a request came from a node of this process (it crossed no socket and no shared
/// memory): its buffers are the sender's, and so is a reply's on the way back.
pub(crate) fn in_process(request: &tensorwire_engine::Request) -> bool {
    request.peer.is_none() && request.local_peer.is_none()
}

/// Whether a reply that came over `route` lies in this process's own receive memory (a
/// writable view), rather than aliasing a sender here or a peer's shared memory.
pub(crate) fn writable(route: Option<Route>) -> bool {
    matches!(route, Some(Route::RawTcp | Route::Http2))
}

/// A path's name in the Python API.
pub(crate) fn route_name(route: Route) -> &'static str {
    match route {
        Route::LocalMailbox => "local",
        Route::SharedMemory => "shm",
        Route::RawTcp => "raw",
        Route::Http2 => "http2",
    }
}
