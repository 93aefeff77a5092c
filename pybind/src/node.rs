//! `Node`: the composition root. One engine node with the io_uring driver, the tokio
//! fallback (used where io_uring is unavailable), HTTP/2 + TLS and shared memory plugged in;
//! asks and tells in blocking and asyncio form; the router's choice explained.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tensorwire_compat::{Http2, Http2Config, TlsConfig, TokioFallback};
use tensorwire_engine::{Error, Node, Pending, Preference, Reply, Route, TensorMessage};

use crate::buffers::drain_releases;
use crate::convert::{reply_from_py, reply_to_py};
use crate::endpoint::PyEndpoint;
use crate::errors::{InvalidArgument, OutOfMemory, TransportUnavailable, to_py};
use crate::loan::PyLoan;
use crate::message::PyTensorMessage;
use crate::pump::{Outcome, Pump};
use crate::shm::PyShm;

/// How often a blocking wait wakes to let Ctrl+C through.
const SIGNAL_SLICE: Duration = Duration::from_millis(100);

/// A tensorwire node: serves endpoints on one port and sends to other nodes.
#[pyclass(frozen, module = "tensorwire._native", name = "Node")]
pub(crate) struct PyNode {
    node: Node,
}

impl Drop for PyNode {
    /// A node collected without `close()`: shut it down with the GIL released, so handler
    /// threads that wait for the GIL can finish and be joined.
    fn drop(&mut self) {
        let node = self.node.clone();
        let detached = Python::try_attach(|py| py.detach(|| node.shutdown()));
        if detached.is_none() {
            // Not attached (interpreter finalizing): shutting down cannot wait on the GIL.
            self.node.shutdown();
        }
    }
}

/// TLS settings from keyword arguments.
struct TlsArgs {
    cert: Option<String>,
    key: Option<String>,
    ca: Option<String>,
    require_client_cert: bool,
    server_name: Option<String>,
}

#[pymethods]
impl PyNode {
    #[new]
    #[pyo3(signature = (
        bind = "127.0.0.1:0", *, transport = None, shared_memory = true, cores = None,
        mailbox_capacity = None, cert = None, key = None, ca = None,
        require_client_cert = false, require_tls = None, server_name = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        bind: &str,
        transport: Option<&str>,
        shared_memory: bool,
        cores: Option<usize>,
        mailbox_capacity: Option<usize>,
        cert: Option<String>,
        key: Option<String>,
        ca: Option<String>,
        require_client_cert: bool,
        require_tls: Option<bool>,
        server_name: Option<String>,
    ) -> PyResult<Self> {
        drain_releases(py);
        let bind = resolve(bind)?;
        let tls = TlsArgs {
            cert,
            key,
            ca,
            require_client_cert,
            server_name,
        };
        let http2 = http2_config(&tls, require_tls)?;
        let requires_tls = http2.require_tls;
        let mut builder = Node::builder(bind)
            .shared_memory(shared_memory)
            .require_tls(requires_tls)
            .fallback(Arc::new(TokioFallback::default()))
            .transport(Arc::new(Http2::new(http2)));
        if let Some(name) = transport {
            if name == "local" {
                return Err(InvalidArgument::new_err(
                    "transport=\"local\" is a per-send choice (node.ref(..., transport=\"local\")); \
                     a node's preference is auto, raw, http2 or shm",
                ));
            }
            builder = builder.preference(preference(name)?.unwrap_or(Preference::Auto));
        }
        if let Some(cores) = cores {
            builder = builder.cores(cores);
        }
        if let Some(capacity) = mailbox_capacity {
            builder = builder.mailbox_capacity(capacity);
        }
        let node = py
            .detach(move || builder.build())
            .map_err(|e| to_py(&e, &format!("starting a node on {bind}")))?;
        Ok(Self { node })
    }

    /// The address it listens on, as `"ip:port"`.
    #[getter]
    fn address(&self) -> String {
        self.node.local_addr().to_string()
    }

    /// A mailbox endpoint at `name` holding up to `capacity` requests (the node's default
    /// when `None`).
    #[pyo3(signature = (name, capacity = None))]
    fn endpoint(
        &self,
        py: Python<'_>,
        name: &str,
        capacity: Option<usize>,
    ) -> PyResult<PyEndpoint> {
        drain_releases(py);
        let endpoint = match capacity {
            Some(capacity) => self.node.endpoint_with_capacity(name, capacity),
            None => self.node.endpoint(name),
        }
        .map_err(|e| to_py(&e, &format!("creating endpoint {name:?}")))?;
        Ok(PyEndpoint::new(endpoint))
    }

    /// Serves `name` with `handler(message) -> reply` on `threads` threads of its own.
    #[pyo3(signature = (name, handler, *, threads = 1, pickle = false))]
    fn serve(
        &self,
        py: Python<'_>,
        name: &str,
        handler: Py<PyAny>,
        threads: usize,
        pickle: bool,
    ) -> PyResult<()> {
        drain_releases(py);
        if threads == 0 {
            return Err(InvalidArgument::new_err("serve needs threads >= 1"));
        }
        let handler = Arc::new(handler);
        self.node
            .serve(name, threads, move |request| {
                Python::attach(|py| {
                    drain_releases(py);
                    let writable = request.peer.is_some();
                    let message = PyTensorMessage::received(py, request.message, writable)
                        .map_err(|e| handler_failure(py, &e))?;
                    let result = handler
                        .call1(py, (message,))
                        .map_err(|e| handler_failure(py, &e))?;
                    reply_from_py(result.bind(py), pickle).map_err(|e| handler_failure(py, &e))
                })
            })
            .map_err(|e| to_py(&e, &format!("serving {name:?}")))
    }

    /// Asks `path` at `address` and waits for the reply (the GIL released; Ctrl+C interrupts).
    #[pyo3(signature = (address, path, message, *, timeout = 30.0, transport = "auto", pickle = false))]
    #[allow(clippy::too_many_arguments)] // the Python keyword arguments
    fn ask(
        &self,
        py: Python<'_>,
        address: &str,
        path: &str,
        message: &Bound<'_, PyTensorMessage>,
        timeout: f64,
        transport: &str,
        pickle: bool,
    ) -> PyResult<Py<PyAny>> {
        let (send, pending) = self.send(py, address, path, message, timeout, transport, Ask)?;
        let reply = wait(py, pending).map_err(|e| e.into_py(&send.context))?;
        reply_to_py(py, reply, send.writable, pickle)
    }

    /// Tells `path` at `address`; returns once the receiver has it in its mailbox.
    #[pyo3(signature = (address, path, message, *, timeout = 30.0, transport = "auto"))]
    fn tell(
        &self,
        py: Python<'_>,
        address: &str,
        path: &str,
        message: &Bound<'_, PyTensorMessage>,
        timeout: f64,
        transport: &str,
    ) -> PyResult<()> {
        let (send, pending) = self.send(py, address, path, message, timeout, transport, Tell)?;
        wait(py, pending).map_err(|e| e.into_py(&send.context))
    }

    /// Starts an ask whose completion `pump` delivers; returns its token.
    #[pyo3(signature = (pump, address, path, message, *, timeout = 30.0, transport = "auto", pickle = false))]
    #[allow(clippy::too_many_arguments)]
    fn ask_start(
        &self,
        py: Python<'_>,
        pump: &Bound<'_, Pump>,
        address: &str,
        path: &str,
        message: &Bound<'_, PyTensorMessage>,
        timeout: f64,
        transport: &str,
        pickle: bool,
    ) -> PyResult<u64> {
        let (send, pending) = self.send(py, address, path, message, timeout, transport, Ask)?;
        let (context, writable) = (send.context, send.writable);
        Ok(pump.get().start(Box::pin(async move {
            let result = pending.await;
            Box::new(move |py: Python<'_>| match result {
                Ok(reply) => reply_to_py(py, reply, writable, pickle),
                Err(e) => Err(to_py(&e, &context)),
            }) as Outcome
        })))
    }

    /// Starts a tell whose completion `pump` delivers; returns its token.
    #[pyo3(signature = (pump, address, path, message, *, timeout = 30.0, transport = "auto"))]
    #[allow(clippy::too_many_arguments)]
    fn tell_start(
        &self,
        py: Python<'_>,
        pump: &Bound<'_, Pump>,
        address: &str,
        path: &str,
        message: &Bound<'_, PyTensorMessage>,
        timeout: f64,
        transport: &str,
    ) -> PyResult<u64> {
        let (send, pending) = self.send(py, address, path, message, timeout, transport, Tell)?;
        let context = send.context;
        Ok(pump.get().start(Box::pin(async move {
            let result = pending.await;
            Box::new(move |py: Python<'_>| match result {
                Ok(()) => Ok(py.None()),
                Err(e) => Err(to_py(&e, &context)),
            }) as Outcome
        })))
    }

    /// The path a send to `address` takes with `transport`, and why: `(path, reason)` with
    /// path one of `local`, `shm`, `raw`, `http2`.
    #[pyo3(signature = (address, transport = "auto"))]
    fn route(&self, py: Python<'_>, address: &str, transport: &str) -> PyResult<(String, String)> {
        let peer = resolve(address)?;
        let force = preference(transport)?;
        let choice = py
            .detach(|| self.node.route_to(peer, force))
            .map_err(|e| to_py(&e, &format!("routing to {peer}")))?;
        Ok((route_name(choice.route).to_owned(), choice.reason))
    }

    /// A writable shared-memory slot of `nbytes` to fill in place; `freeze()` it into a
    /// buffer that reaches a same-host peer without a copy.
    fn loan(&self, py: Python<'_>, nbytes: usize) -> PyResult<PyLoan> {
        drain_releases(py);
        let loan = self.node.shm().loan(nbytes).map_err(|e| {
            OutOfMemory::new_err(format!("a shared-memory loan of {nbytes} bytes: {e}"))
        })?;
        PyLoan::new(loan)
    }

    /// The node's shared-memory regions and leases.
    #[getter]
    fn shm(&self) -> PyShm {
        PyShm::new(self.node.shm().clone())
    }

    /// This node's counters and gauges.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.node.stats();
        let dict = PyDict::new(py);
        dict.set_item("address", self.node.local_addr().to_string())?;
        dict.set_item("driver", stats.driver)?;
        dict.set_item("fallback_reason", stats.fallback_reason)?;
        dict.set_item("transport", stats.transport)?;
        dict.set_item("pool", format!("{:?}", stats.pool))?;
        dict.set_item("gauges", format!("{:?}", stats.gauges))?;
        dict.set_item("shm_connections", stats.shm_connections)?;
        dict.set_item("shm_leases", stats.shm_leases)?;
        dict.set_item("transport_connections", stats.transport_connections)?;
        Ok(dict)
    }

    /// Stops the node: fails what is in flight, closes endpoints and connections, joins its
    /// threads. Idempotent.
    fn close(&self, py: Python<'_>) {
        let node = self.node.clone();
        py.detach(move || node.shutdown());
        drain_releases(py);
    }
}

/// How one send goes, decided before it starts.
struct Plan {
    peer: SocketAddr,
    force: Option<Preference>,
    writable: bool,
    context: String,
}

/// Which call [`PyNode::send`] starts.
trait Call {
    type Output: Send;
    const NAME: &'static str;
    fn start(
        node: &Node,
        plan: &Plan,
        path: &str,
        message: TensorMessage,
        timeout: Duration,
    ) -> Pending<Self::Output>;
}

struct Ask;
struct Tell;

impl Call for Ask {
    type Output = Reply;
    const NAME: &'static str = "ask";
    fn start(
        node: &Node,
        plan: &Plan,
        path: &str,
        message: TensorMessage,
        timeout: Duration,
    ) -> Pending<Reply> {
        node.ask_via(plan.peer, path, message, timeout, plan.force)
    }
}

impl Call for Tell {
    type Output = ();
    const NAME: &'static str = "tell";
    fn start(
        node: &Node,
        plan: &Plan,
        path: &str,
        message: TensorMessage,
        timeout: Duration,
    ) -> Pending<()> {
        node.tell_via(plan.peer, path, message, timeout, plan.force)
    }
}

impl PyNode {
    /// Plans and starts one ask or tell: the route decided (and a forced path checked), the
    /// send made with the GIL released (it can copy the payload into shared memory or wait for
    /// socket room).
    #[allow(clippy::too_many_arguments)]
    fn send<C: Call>(
        &self,
        py: Python<'_>,
        address: &str,
        path: &str,
        message: &Bound<'_, PyTensorMessage>,
        timeout: f64,
        transport: &str,
        _call: C,
    ) -> PyResult<(Plan, Pending<C::Output>)> {
        drain_releases(py);
        let plan = self.plan(py, address, path, transport, C::NAME)?;
        let (message, timeout) = (message.get().inner.clone(), seconds(timeout)?);
        let pending = py.detach(|| C::start(&self.node, &plan, path, message, timeout));
        Ok((plan, pending))
    }

    /// Resolves the address and the forced path; refuses a forced path the router cannot
    /// take (no silent fallback). The reply is writable when it lands in receive memory.
    fn plan(
        &self,
        py: Python<'_>,
        address: &str,
        path: &str,
        transport: &str,
        what: &str,
    ) -> PyResult<Plan> {
        let peer = resolve(address)?;
        let wanted = preference(transport)?;
        let choice = py
            .detach(|| self.node.route_to(peer, wanted))
            .map_err(|e| to_py(&e, &format!("{what} {path} at {peer}")))?;
        let name = route_name(choice.route);
        let forced_mismatch = match transport {
            "local" => choice.route != Route::LocalMailbox,
            "shm" => choice.route != Route::SharedMemory,
            "raw" => choice.route != Route::RawTcp,
            "http2" => choice.route != Route::Http2,
            _ => false,
        };
        if forced_mismatch {
            return Err(TransportUnavailable::new_err(format!(
                "{what} {path} at {peer}: transport={transport:?} was asked for, but the router \
                 picks {name}: {}",
                choice.reason
            )));
        }
        // Pin the send to the path just chosen, so the reply's memory is what we expect.
        let force = match choice.route {
            Route::LocalMailbox => None,
            Route::SharedMemory => Some(Preference::SharedMemory),
            Route::RawTcp => Some(Preference::Raw),
            Route::Http2 => Some(Preference::Http2),
        };
        Ok(Plan {
            peer,
            force,
            writable: matches!(choice.route, Route::RawTcp | Route::Http2),
            context: format!("{what} {path} at {peer} over {name}"),
        })
    }
}

/// A wait that ended: the engine's error, or Ctrl+C.
enum WaitError {
    Engine(Error),
    Interrupted(PyErr),
}

impl WaitError {
    fn into_py(self, context: &str) -> PyErr {
        match self {
            Self::Engine(e) => to_py(&e, context),
            Self::Interrupted(e) => e,
        }
    }
}

/// Waits for `pending` with the GIL released, in slices so signals are handled; on an
/// exception from a signal handler the operation is dropped (cancelled) and it propagates.
fn wait<T: Send>(py: Python<'_>, mut pending: Pending<T>) -> Result<T, WaitError> {
    loop {
        if let Some(result) = py.detach(|| pending.wait_timeout(SIGNAL_SLICE)) {
            return result.map_err(WaitError::Engine);
        }
        if let Err(e) = py.check_signals() {
            drop(pending);
            return Err(WaitError::Interrupted(e));
        }
    }
}

/// The text an engine peer gets for a handler's exception.
fn handler_failure(py: Python<'_>, err: &PyErr) -> String {
    let kind = err
        .get_type(py)
        .name()
        .map_or_else(|_| "Exception".to_owned(), |n| n.to_string());
    format!("{kind}: {}", err.value(py))
}

/// `"host:port"` to one socket address.
pub(crate) fn resolve(address: &str) -> PyResult<SocketAddr> {
    address
        .to_socket_addrs()
        .map_err(|e| InvalidArgument::new_err(format!("address {address:?}: {e}")))?
        .next()
        .ok_or_else(|| InvalidArgument::new_err(format!("address {address:?} resolves to nothing")))
}

/// `transport=` to the router's preference (`None` for `auto` and `local`).
fn preference(name: &str) -> PyResult<Option<Preference>> {
    Ok(match name {
        "auto" | "local" => None,
        "raw" => Some(Preference::Raw),
        "http2" => Some(Preference::Http2),
        "shm" => Some(Preference::SharedMemory),
        other => {
            return Err(InvalidArgument::new_err(format!(
                "unknown transport {other:?}: expected auto, local, shm, raw or http2"
            )));
        }
    })
}

fn route_name(route: Route) -> &'static str {
    match route {
        Route::LocalMailbox => "local",
        Route::SharedMemory => "shm",
        Route::RawTcp => "raw",
        Route::Http2 => "http2",
    }
}

fn seconds(timeout: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(timeout).map_err(|_| {
        InvalidArgument::new_err(format!(
            "timeout must be a finite number of seconds >= 0, not {timeout}"
        ))
    })
}

/// HTTP/2 settings: the environment (`TENSORWIRE_TLS_*`, `TENSORWIRE_HTTP2_*`), with TLS
/// keyword arguments taking precedence.
fn http2_config(tls: &TlsArgs, require_tls: Option<bool>) -> PyResult<Http2Config> {
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
