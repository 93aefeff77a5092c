//! Receiving into buffers the caller owns (`ref.ask(msg, into=[...])`, `endpoint.recv(into=
//! [...])` and their asyncio forms): the received bytes are copied into them once — with the
//! GIL released for big ones — after every check passed, and the received memory goes back at
//! once. Nothing is allocated for the payload: the message returned carries the caller's own
//! buffers, writable on every path.
//!
//! A mismatch (count, size, or what `check` refuses) raises `InvalidArgument` and writes
//! nothing; the exception's `received` attribute holds what arrived (the reply, or the
//! request), so nothing is lost.

use bytes::Bytes;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use tensorwire_engine::shm::split_copy;
use tensorwire_engine::{Reply, Route, TensorMessage};

use crate::convert::{reply_to_py, route_name};
use crate::errors::InvalidArgument;
use crate::message::PyTensorMessage;

/// Copies at least this many bytes with the GIL released.
const COPY_DETACHED: usize = 256 << 10;

/// What did not fit: the error, and the message as it arrived (nothing of it was written).
pub(crate) struct Refused {
    pub(crate) error: PyErr,
    pub(crate) message: TensorMessage,
}

/// The caller's buffers to receive into, exported writable (pinned until the copy is done).
pub(crate) struct Targets {
    objects: Py<PyList>,
    views: Vec<PyUntypedBuffer>,
    /// Called with the received metadata before anything is written (raises to refuse).
    check: Option<Py<PyAny>>,
}

impl Targets {
    /// Exports every buffer of `into` (writable, C-contiguous) before anything is sent or
    /// received.
    pub(crate) fn take(into: &Bound<'_, PyAny>, check: Option<Py<PyAny>>) -> PyResult<Self> {
        let py = into.py();
        let objects = PyList::empty(py);
        let mut views = Vec::new();
        for (index, obj) in into.try_iter()?.enumerate() {
            let obj = obj?;
            let view = PyUntypedBuffer::get(&obj).map_err(|e| {
                InvalidArgument::new_err(format!(
                    "into[{index}] ({}) does not support the buffer protocol: {e}",
                    type_name(&obj)
                ))
            })?;
            if view.readonly() {
                return Err(InvalidArgument::new_err(format!(
                    "into[{index}] ({}) is read-only: receive into writable memory",
                    type_name(&obj)
                )));
            }
            if !view.is_c_contiguous() {
                return Err(InvalidArgument::new_err(format!(
                    "into[{index}] ({}) is not C-contiguous: receive into contiguous memory",
                    type_name(&obj)
                )));
            }
            views.push(view);
            objects.append(obj)?;
        }
        if let Some((first, second)) = shared_bytes(&views) {
            return Err(InvalidArgument::new_err(format!(
                "into[{first}] and into[{second}] share memory: receive into separate buffers"
            )));
        }
        Ok(Self {
            objects: objects.unbind(),
            views,
            check,
        })
    }

    /// Copies `message`'s buffers into the targets and returns the message of the targets
    /// (with the received version and metadata, and `route`). On a mismatch nothing is
    /// written and `message` comes back with the error.
    pub(crate) fn fill(
        self,
        py: Python<'_>,
        message: TensorMessage,
        route: Option<&'static str>,
    ) -> Result<PyTensorMessage, Box<Refused>> {
        if let Err(error) = self.fits(py, &message) {
            return Err(Box::new(Refused { error, message }));
        }
        self.write(py, message, route)
    }

    /// [`Targets::fill`] for a `message` that [`Targets::fits`] accepted.
    pub(crate) fn write(
        self,
        py: Python<'_>,
        mut message: TensorMessage,
        route: Option<&'static str>,
    ) -> Result<PyTensorMessage, Box<Refused>> {
        let total: usize = message.buffers.iter().map(Bytes::len).sum();
        let copy = || {
            let pairs: Vec<(*const u8, *mut u8, usize)> = message
                .buffers
                .iter()
                .zip(&self.views)
                .filter(|(source, _)| !source.is_empty())
                .map(|(source, target)| {
                    (source.as_ptr(), target.buf_ptr().cast::<u8>(), source.len())
                })
                .collect();
            if total < split_copy::SPLIT_FROM || !apart(&pairs) {
                for &(from, into, len) in &pairs {
                    // SAFETY: `into` is a live writable, C-contiguous export of exactly `len`
                    // bytes (checked in `fits`), pinned until it is released after this copy;
                    // `from` is live memory of that length. `copy` tolerates overlap (a target
                    // that aliases what arrived in this process).
                    unsafe { std::ptr::copy(from, into, len) };
                }
                return;
            }
            let slices = pairs
                .iter()
                .map(|&(from, into, len)| {
                    // SAFETY: as above; and no target shares a byte with another target
                    // (`shared_bytes`, in `take`) or with any source (`apart`), so each `&mut`
                    // is the only way to its bytes this copy uses, and no `&` sees them (the
                    // GIL is released for large copies, as for any buffer handed to native
                    // code that writes it).
                    unsafe {
                        (
                            std::slice::from_raw_parts_mut(into, len),
                            std::slice::from_raw_parts(from, len),
                        )
                    }
                })
                .collect();
            // Large copies go around the caches, over the CPUs (as into a shared-memory slot).
            split_copy::copy_all(slices);
        };
        if total >= COPY_DETACHED {
            py.detach(copy);
        } else {
            copy();
        }
        // The received memory goes back now; only the caller's buffers remain.
        message.buffers.clear();
        drop(self.views);
        let objects = self.objects.bind(py);
        PyTensorMessage::of_objects(message.version, message.metadata.clone(), objects, route)
            .map_err(|error| Box::new(Refused { error, message }))
    }

    /// Whether `message` fits: as many buffers as targets, each of the same size, and
    /// whatever `check` says of the metadata.
    pub(crate) fn fits(&self, py: Python<'_>, message: &TensorMessage) -> PyResult<()> {
        if message.buffers.len() != self.views.len() {
            return Err(InvalidArgument::new_err(format!(
                "received {} buffers into {} given (into=): pass one buffer per buffer sent",
                message.buffers.len(),
                self.views.len()
            )));
        }
        if let Some(check) = &self.check {
            check.call1(py, (PyBytes::new(py, &message.metadata),))?;
        }
        let objects = self.objects.bind(py);
        for (index, (source, target)) in message.buffers.iter().zip(&self.views).enumerate() {
            if source.len() != target.len_bytes() {
                let name = objects
                    .get_item(index)
                    .map_or_else(|_| "?".to_owned(), |obj| type_name(&obj));
                return Err(InvalidArgument::new_err(format!(
                    "into[{index}] ({name}) has {} bytes but buffer {index} that arrived has {}: \
                     pass buffers of the sizes sent",
                    target.len_bytes(),
                    source.len()
                )));
            }
        }
        Ok(())
    }
}

/// An ask's reply as its caller asked for it: received into `targets` if it gave any.
pub(crate) fn reply_for_caller(
    py: Python<'_>,
    reply: Reply,
    targets: Option<Targets>,
    route: Option<Route>,
    pickle: bool,
) -> PyResult<Py<PyAny>> {
    match targets {
        None => reply_to_py(py, reply, route, pickle),
        Some(targets) => reply_into(py, targets, reply, route, pickle),
    }
}

/// Whether no target (`into`) shares a byte with any source (a target may alias what arrived
/// in this process; targets never share bytes with each other, `shared_bytes`): then the
/// copies may be made as slices, in any order and on several threads. Checked pair by pair,
/// for up to [`APART_CHECKED`] buffers; more are copied one after the other.
fn apart(pairs: &[(*const u8, *mut u8, usize)]) -> bool {
    if pairs.len() > APART_CHECKED {
        return false;
    }
    let overlaps = |a: usize, b: usize, la: usize, lb: usize| {
        a < b.saturating_add(lb) && b < a.saturating_add(la)
    };
    pairs.iter().all(|&(_, into, len)| {
        pairs
            .iter()
            .all(|&(from, _, from_len)| !overlaps(into as usize, from as usize, len, from_len))
    })
}

/// The indices of two targets that share a byte, if any (sorted by address, each checked
/// against the furthest end seen so far).
fn shared_bytes(views: &[PyUntypedBuffer]) -> Option<(usize, usize)> {
    let mut spans: Vec<(usize, usize, usize)> = views
        .iter()
        .enumerate()
        .filter(|(_, view)| view.len_bytes() > 0)
        .map(|(index, view)| {
            let start = view.buf_ptr() as usize;
            (start, start.saturating_add(view.len_bytes()), index)
        })
        .collect();
    spans.sort_unstable();
    let mut furthest: Option<(usize, usize)> = None; // (end, index)
    for (start, end, index) in spans {
        if let Some((reach, owner)) = furthest {
            if start < reach {
                return Some((owner.min(index), owner.max(index)));
            }
        }
        if furthest.is_none_or(|(reach, _)| end > reach) {
            furthest = Some((end, index));
        }
    }
    None
}

/// Buffers of one message checked for overlap at most.
const APART_CHECKED: usize = 256;

/// An ask's reply received into `targets`.
fn reply_into(
    py: Python<'_>,
    targets: Targets,
    reply: Reply,
    route: Option<Route>,
    pickle: bool,
) -> PyResult<Py<PyAny>> {
    match reply {
        Reply::Tensor(message) => match targets.fill(py, message, route.map(route_name)) {
            Ok(message) => Ok(Py::new(py, message)?.into_any()),
            Err(refused) => {
                let Refused { error, message } = *refused;
                let received = reply_to_py(py, Reply::Tensor(message), route, pickle)?;
                Err(keeping(py, error, received))
            }
        },
        single => {
            let what = match &single {
                Reply::Single { msg_type, .. } => format!("a single reply of type {msg_type:?}"),
                Reply::Tensor(_) => "a message".to_owned(),
            };
            let received = reply_to_py(py, single, route, pickle)?;
            Err(keeping(py, not_a_message(&what), received))
        }
    }
}

/// `error` with what arrived attached as its `received` attribute.
pub(crate) fn keeping(py: Python<'_>, error: PyErr, received: Py<PyAny>) -> PyErr {
    let _ = error.value(py).setattr("received", received);
    error
}

/// The error for `into=` with a reply that is not a message of buffers.
fn not_a_message(what: &str) -> PyErr {
    InvalidArgument::new_err(format!(
        "into= was given but the reply is {what}, not a TensorMessage: nothing to receive into"
    ))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string())
}
