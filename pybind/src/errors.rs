//! The one seam where engine errors become Python exceptions (`tensorwire._errors`), each
//! message prefixed with what failed and where.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

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

mod base {
    pyo3::import_exception!(tensorwire._errors, Error);
}

/// Errors raised through this seam, by exception name (for `tensor_transport_stats`).
static RAISED: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());

/// How many errors of each kind were raised so far.
pub(crate) fn raised() -> BTreeMap<&'static str, u64> {
    RAISED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// `err` as a Python exception; `context` says what was being done (e.g. "ask echo at
/// 127.0.0.1:9000 over raw TCP").
pub(crate) fn to_py(err: &Error, context: &str) -> PyErr {
    *RAISED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(kind(err))
        .or_default() += 1;
    convert(err, context)
}

/// The exception name `err` becomes.
fn kind(err: &Error) -> &'static str {
    match err {
        Error::Timeout { .. } => "DeadlineExceeded",
        Error::Protocol { .. } | Error::UnexpectedReply { .. } => "ProtocolError",
        Error::Tls { .. } => "TLSError",
        Error::ConnectionClosed { .. } | Error::Connect { .. } => "ConnectionFailed",
        Error::Remote { .. } => "RemoteError",
        Error::UnknownEndpoint { .. } => "UnknownEndpoint",
        Error::Memory(_) => "OutOfMemory",
        Error::Overloaded { .. } => "Overloaded",
        Error::DriverUnavailable { .. } => "TransportUnavailable",
        Error::Shutdown | Error::MailboxClosed => "ShutDown",
        Error::Cancelled => "Cancelled",
        _ => "other",
    }
}

fn convert(err: &Error, context: &str) -> PyErr {
    let message = format!("{context}: {err}");
    match err {
        Error::Timeout { .. } => DeadlineExceeded::new_err(message),
        Error::Protocol { .. } | Error::UnexpectedReply { .. } => ProtocolError::new_err(message),
        Error::Tls { .. } => TLSError::new_err(message),
        Error::ConnectionClosed { .. } | Error::Connect { .. } => {
            ConnectionFailed::new_err(message)
        }
        Error::InvalidPath { .. } | Error::Misuse(_) | Error::Config(_) => {
            InvalidArgument::new_err(message)
        }
        Error::EndpointExists { .. } => EndpointExists::new_err(message),
        Error::UnknownEndpoint { .. } => UnknownEndpoint::new_err((message, String::new())),
        Error::Remote { text, .. } if text.starts_with("no endpoint") => {
            UnknownEndpoint::new_err((message, text.clone()))
        }
        Error::Remote { text, .. } => RemoteError::new_err((message, text.clone())),
        Error::Encode(tensorwire_proto::WireError::LimitExceeded(_)) => {
            LimitExceeded::new_err(message)
        }
        Error::Encode(_) => InvalidArgument::new_err(message),
        Error::Memory(_) => OutOfMemory::new_err(message),
        Error::Overloaded { .. } => Overloaded::new_err(message),
        Error::DriverUnavailable { .. } => TransportUnavailable::new_err(message),
        Error::Shutdown | Error::MailboxClosed => ShutDown::new_err(message),
        Error::Cancelled => Cancelled::new_err(message),
        _ if err.limit().is_some() => LimitExceeded::new_err(message),
        _ => base::Error::new_err(message),
    }
}
