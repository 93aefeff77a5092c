//! The one seam where engine errors become Python exceptions (`tensorwire._errors`), each
//! message prefixed with what failed and where.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::sync::lock;

use pyo3::PyErr;
use tensorwire_engine::fork::PerProcess;
use tensorwire_engine::{Error, LimitSide, OverLimit, RemoteKind};

pyo3::import_exception!(tensorwire._errors, DeadlineExceeded);
pyo3::import_exception!(tensorwire._errors, ConnectionFailed);
pyo3::import_exception!(tensorwire._errors, ProtocolError);
pyo3::import_exception!(tensorwire._errors, TLSError);
pyo3::import_exception!(tensorwire._errors, InvalidArgument);
pyo3::import_exception!(tensorwire._errors, EndpointExists);
pyo3::import_exception!(tensorwire._errors, UnknownEndpoint);
pyo3::import_exception!(tensorwire._errors, LimitExceeded);
pyo3::import_exception!(tensorwire._errors, OutOfMemory);
pyo3::import_exception!(tensorwire._errors, Overloaded);
pyo3::import_exception!(tensorwire._errors, RemoteError);
pyo3::import_exception!(tensorwire._errors, TransportUnavailable);
pyo3::import_exception!(tensorwire._errors, ShutDown);
pyo3::import_exception!(tensorwire._errors, Cancelled);
pyo3::import_exception!(tensorwire._errors, SharedMemoryError);
pyo3::import_exception!(tensorwire._errors, LeaseInvalid);
pyo3::import_exception!(tensorwire._errors, IoError);

mod base {
    pyo3::import_exception!(tensorwire._errors, Error);
}

/// Errors raised through this seam, by exception name (for `tensor_transport_stats`); a
/// child made by `fork()` counts its own (its parent's lock may be held for good there).
static RAISED: PerProcess<Mutex<BTreeMap<&'static str, u64>>> = PerProcess::new();

fn counts() -> &'static Mutex<BTreeMap<&'static str, u64>> {
    RAISED.get_or_init(|| Mutex::new(BTreeMap::new()))
}

/// How many errors of each kind were raised so far.
pub(crate) fn raised() -> BTreeMap<&'static str, u64> {
    lock(counts()).clone()
}

/// `err` as a Python exception; `context` says what was being done (e.g. "ask echo at
/// 127.0.0.1:9000 over raw TCP").
pub(crate) fn to_py(err: &Error, context: &str) -> PyErr {
    let (name, exception) = match err.over_limit() {
        Some(over) => ("LimitExceeded", over_limit(err, context, &over)),
        None => classify(err, format!("{context}: {err}")),
    };
    *lock(counts()).entry(name).or_default() += 1;
    exception
}

/// A message over a size limit, on any path and either side: `LimitExceeded` naming whose
/// limit it was and the variable that sets it.
fn over_limit(err: &Error, context: &str, over: &OverLimit) -> PyErr {
    let side = match over.side {
        LimitSide::Local => "this node",
        LimitSide::Peer => "the peer",
    };
    let variable = over.exceeded.field.variable();
    let hint = variable.map_or_else(String::new, |v| format!("; {v} sets it on {side}"));
    LimitExceeded::new_err((
        format!("{context}: over {side}'s limit: {err}{hint}"),
        over.side.as_str(),
        variable,
    ))
}

/// The exception `err` becomes, and its name.
fn classify(err: &Error, message: String) -> (&'static str, PyErr) {
    match err {
        Error::Timeout { .. } => ("DeadlineExceeded", DeadlineExceeded::new_err(message)),
        Error::Protocol { .. } | Error::UnexpectedReply { .. } => {
            ("ProtocolError", ProtocolError::new_err(message))
        }
        Error::Tls { .. } => ("TLSError", TLSError::new_err(message)),
        Error::ConnectionClosed { .. } | Error::Connect { .. } => {
            ("ConnectionFailed", ConnectionFailed::new_err(message))
        }
        Error::InvalidPath { .. } | Error::Misuse(_) | Error::Config(_) => {
            ("InvalidArgument", InvalidArgument::new_err(message))
        }
        Error::EndpointExists { .. } => ("EndpointExists", EndpointExists::new_err(message)),
        Error::UnknownEndpoint { .. } => (
            "UnknownEndpoint",
            UnknownEndpoint::new_err((message, String::new())),
        ),
        Error::Remote { text, .. } => match err.remote_kind() {
            Some(RemoteKind::UnknownEndpoint) => (
                "UnknownEndpoint",
                UnknownEndpoint::new_err((message, text.clone())),
            ),
            Some(RemoteKind::Overloaded) => ("Overloaded", Overloaded::new_err(message)),
            _ => ("RemoteError", RemoteError::new_err((message, text.clone()))),
        },
        Error::Encode(_) => ("InvalidArgument", InvalidArgument::new_err(message)),
        Error::Memory(_) => ("OutOfMemory", OutOfMemory::new_err(message)),
        Error::Overloaded { .. } => ("Overloaded", Overloaded::new_err(message)),
        Error::DriverUnavailable { .. }
        | Error::RouteUnavailable { .. }
        | Error::DriverFailed { .. }
        | Error::Abandoned => (
            "TransportUnavailable",
            TransportUnavailable::new_err(message),
        ),
        Error::SharedMemoryFull { .. } => ("OutOfMemory", OutOfMemory::new_err(message)),
        Error::Shutdown | Error::MailboxClosed | Error::Forked { .. } => {
            ("ShutDown", ShutDown::new_err(message))
        }
        Error::Cancelled => ("Cancelled", Cancelled::new_err(message)),
        Error::Io { .. } => ("IoError", IoError::new_err(message)),
        _ => ("Error", base::Error::new_err(message)),
    }
}
