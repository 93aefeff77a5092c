//! A node's settings from Python keyword arguments: TLS files, HTTP/2 tuning, shared-memory
//! access.

use pyo3::prelude::*;
use pyo3::types::PyString;
use tensorwire_compat::{Http2Config, TlsConfig};
use tensorwire_engine::ShmAccess;

use crate::errors::{InvalidArgument, to_py};

/// TLS settings from keyword arguments.
pub(crate) struct TlsArgs {
    pub(crate) cert: Option<String>,
    pub(crate) key: Option<String>,
    pub(crate) ca: Option<String>,
    pub(crate) require_client_cert: bool,
    pub(crate) server_name: Option<String>,
}

/// `shared_memory=`: `True`/`"auto"` (on, unless the node requires TLS or client
/// certificates), `"same-user"` (on even then: an explicit opt-in), `False`/`"off"`.
pub(crate) fn shm_access(value: &Bound<'_, PyAny>) -> PyResult<ShmAccess> {
    if let Ok(text) = value.cast::<PyString>() {
        return match text.to_str()? {
            "auto" => Ok(ShmAccess::Auto),
            "same-user" | "same_user" => Ok(ShmAccess::SameUser),
            "off" => Ok(ShmAccess::Off),
            other => Err(InvalidArgument::new_err(format!(
                "shared_memory={other:?}: expected True, False, \"auto\", \"same-user\" or \"off\""
            ))),
        };
    }
    match value.extract::<bool>() {
        Ok(true) => Ok(ShmAccess::Auto),
        Ok(false) => Ok(ShmAccess::Off),
        Err(_) => Err(InvalidArgument::new_err(
            "shared_memory must be True, False, \"auto\", \"same-user\" or \"off\"",
        )),
    }
}

/// HTTP/2 settings: the environment (`TENSORWIRE_TLS_*`, `TENSORWIRE_HTTP2_*`), with TLS
/// keyword arguments taking precedence.
pub(crate) fn http2_config(tls: &TlsArgs, require_tls: Option<bool>) -> PyResult<Http2Config> {
    let mut config =
        Http2Config::from_env().map_err(|e| to_py(&e, "reading HTTP/2 and TLS settings"))?;
    let files = tls.cert.is_some() || tls.key.is_some() || tls.ca.is_some();
    if !files && (tls.require_client_cert || tls.server_name.is_some()) {
        return Err(InvalidArgument::new_err(
            "require_client_cert= and server_name= configure TLS: pass cert=/key= (and ca=) too",
        ));
    }
    if files {
        let read = |path: &str, what: &str| {
            std::fs::read(path).map_err(|e| {
                InvalidArgument::new_err(format!("reading the TLS {what} {path:?}: {e}"))
            })
        };
        let mut builder = TlsConfig::builder().require_client_cert(tls.require_client_cert);
        match (&tls.cert, &tls.key) {
            (Some(cert), Some(key)) => {
                builder = builder.identity_pem(read(cert, "certificate")?, read(key, "key")?);
            }
            (None, None) => {}
            _ => {
                return Err(InvalidArgument::new_err(
                    "TLS needs both cert= and key= (PEM files), or neither",
                ));
            }
        }
        if let Some(ca) = &tls.ca {
            builder = builder.trust_pem(read(ca, "CA")?);
        }
        if let Some(name) = &tls.server_name {
            builder = builder.server_name(name.clone());
        }
        let built = builder.build().map_err(|e| to_py(&e, "setting up TLS"))?;
        config = Http2Config::tls(built, require_tls.unwrap_or(true));
        config
            .tune_from_env()
            .map_err(|e| to_py(&e, "reading HTTP/2 settings"))?;
    } else if let Some(require) = require_tls {
        config.require_tls = require;
    }
    Ok(config)
}
