//! The one seam where engine errors become Python exceptions (`tensorwire._errors`), each
//! message prefixed with what failed and where.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::sync::lock;

use pyo3::PyErr;
use tensorwire_engine::Error;

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

/// Errors raised through this seam, by exception name (for `tensor_transport_stats`).
static RAISED: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());

/// How many errors of each kind were raised so far.
pub(crate) fn raised() -> BTreeMap<&'static str, u64> {
    lock(&RAISED).clone()
}

/// `err` as a Python exception; `context` says what was being done (e.g. "ask echo at
/// 127.0.0.1:9000 over raw TCP").
pub(crate) fn to_py(err: &Error, context: &str) -> PyErr {
    let (name, exception) = classify(err, format!("{context}: {err}"));
    *lock(&RAISED).entry(name).or_default() += 1;
    exception
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
        // PTR1 and shared memory send the text as it is; HTTP/2 prefixes the status.
        Error::Remote { text, .. } if text.contains("no endpoint at path") => (
            "UnknownEndpoint",
            UnknownEndpoint::new_err((message, text.clone())),
        ),
        Error::Remote { text, .. } => {
            ("RemoteError", RemoteError::new_err((message, text.clone())))
        }
        Error::Encode(tensorwire_proto::WireError::LimitExceeded(_)) => {
            ("LimitExceeded", LimitExceeded::new_err(message))
        }
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
        Error::Shutdown | Error::MailboxClosed => ("ShutDown", ShutDown::new_err(message)),
        Error::Cancelled => ("Cancelled", Cancelled::new_err(message)),
        Error::Io { .. } => ("IoError", IoError::new_err(message)),
        _ if err.limit().is_some() => ("LimitExceeded", LimitExceeded::new_err(message)),
        _ => ("Error", base::Error::new_err(message)),
    }
}
