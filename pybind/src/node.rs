//! `Node`: the composition root. One engine node with the io_uring driver, the tokio
//! fallback (used where io_uring is unavailable), HTTP/2 + TLS and shared memory plugged in;
//! references to endpoints (`Ref`) that carry the asks and tells; handlers served on threads
//! of their own; the router's choice explained.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3::{PyTraverseError, Python};
use tensorwire_compat::{Http2, TokioFallback};
use tensorwire_engine::{Node, Preference};

use crate::buffers::drain_releases;
use crate::config::{TlsArgs, http2_config, shm_access};
use crate::convert::route_name;
use crate::endpoint::PyEndpoint;
use crate::errors::{InvalidArgument, OutOfMemory, to_py};
use crate::handlers::{self, HandlerSlot};
use crate::loan::PyLoan;
use crate::reference::{PyRef, via};
use crate::shm::PyShm;
use crate::stats::node_stats;
use crate::sync::lock;

/// A tensorwire node: serves endpoints on one port and sends to other nodes.
#[pyclass(frozen, module = "tensorwire._native", name = "Node")]
pub(crate) struct PyNode {
    node: Node,
    /// The handlers served, shared with their threads; listed here so the garbage collector
    /// sees them (a handler that refers to its own node is a cycle).
    handlers: Mutex<Vec<Arc<HandlerSlot>>>,
    /// The handler threads, joined when the node closes.
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// `spin=`: how long its handler threads poll their mailbox before they sleep (`None`:
    /// their own adaptive window).
    spin: Option<Duration>,
}

impl Drop for PyNode {
    /// A node collected without `close()`: shut it down and join its handler threads with the
    /// GIL released (they may wait for it to finish their last request).
    fn drop(&mut self) {
        let threads = std::mem::take(&mut *lock(&self.threads));
        if self.node.check_process().is_err() {
            // Inherited by a child made by fork(): its threads are not in this process.
            std::mem::forget(threads);
            return;
        }
        let node = self.node.clone();
        let detached = Python::try_attach(|py| {
            let finalizing = finalizing(py);
            py.detach(|| {
                node.shutdown();
                if !finalizing {
                    join(threads);
                }
            })
        });
        if detached.is_none() {
            // Not attached (interpreter finalizing): shutting down cannot wait on the GIL, and
            // the handler threads cannot finish: they are left to the process's exit.
            self.node.shutdown();
        }
    }
}

/// `spin=` seconds as a window: finite, at least 0 and at most a second (a longer poll is a
/// CPU kept busy for nothing a sleep would not do as well).
fn spin_window(seconds: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|window| *window <= MAX_SPIN)
        .ok_or_else(|| {
            InvalidArgument::new_err(format!(
                "spin must be a number of seconds from 0 to 1, not {seconds}"
            ))
        })
}

/// The longest `spin=` window.
const MAX_SPIN: Duration = Duration::from_secs(1);

/// Whether the interpreter is shutting down: a thread that tries to take the GIL then blocks
/// forever, so handler threads must not be joined (the process's exit ends them).
fn finalizing(py: Python<'_>) -> bool {
    py.import("sys")
        .and_then(|sys| sys.call_method0("is_finalizing"))
        .and_then(|v| v.extract::<bool>())
        .unwrap_or(true)
}

/// Joins handler threads, except the calling one (a handler that closed its own node).
fn join(threads: Vec<JoinHandle<()>>) {
    let current = std::thread::current().id();
    for thread in threads {
        if thread.thread().id() != current {
            let _ = thread.join();
        }
    }
}

/// [`join`] until `until`; a handler still busy then is left to finish by itself (its answer
/// goes nowhere: the node is shut down).
fn join_until(threads: Vec<JoinHandle<()>>, until: Instant) {
    let current = std::thread::current().id();
    let mut left: Vec<_> = threads
        .into_iter()
        .filter(|t| t.thread().id() != current)
        .collect();
    while !left.is_empty() && Instant::now() < until {
        let (done, running): (Vec<_>, Vec<_>) = left.into_iter().partition(JoinHandle::is_finished);
        done.into_iter().for_each(|t| drop(t.join()));
        left = running;
        if !left.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    if !left.is_empty() {
        tracing::warn!(
            threads = left.len(),
            "closing a node: Python handlers still busy at the close timeout are left to finish"
        );
    }
}

#[pymethods]
impl PyNode {
    #[new]
    #[pyo3(signature = (
        bind = "127.0.0.1:0", *, transport = None, shared_memory = None, cores = None,
        mailbox_capacity = None, cert = None, key = None, ca = None,
        require_client_cert = false, require_tls = None, server_name = None,
        shm_idle_keep = None, shm_idle_after = None, spin = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        bind: &str,
        transport: Option<&str>,
        shared_memory: Option<&Bound<'_, PyAny>>,
        cores: Option<usize>,
        mailbox_capacity: Option<usize>,
        cert: Option<String>,
        key: Option<String>,
        ca: Option<String>,
        require_client_cert: bool,
        require_tls: Option<bool>,
        server_name: Option<String>,
        shm_idle_keep: Option<u64>,
        shm_idle_after: Option<f64>,
        spin: Option<f64>,
    ) -> PyResult<Self> {
        drain_releases(py);
        let bind = resolve(bind)?;
        let access = match shared_memory {
            Some(value) => shm_access(value)?,
            None => tensorwire_engine::ShmAccess::Auto,
        };
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
            .shm_access(access)
            .require_tls(requires_tls)
            .fallback(Arc::new(TokioFallback::default()))
            .transport(Arc::new(Http2::new(http2)));
        if let Some(name) = transport {
            builder = builder.preference(preference(name)?);
        }
        if let Some(cores) = cores {
            builder = builder.cores(cores);
        }
        if let Some(capacity) = mailbox_capacity {
            builder = builder.mailbox_capacity(capacity);
        }
        if let Some(bytes) = shm_idle_keep {
            builder = builder.shm_idle_keep(bytes);
        }
        if let Some(seconds) = shm_idle_after {
            let idle = Duration::try_from_secs_f64(seconds).map_err(|_| {
                InvalidArgument::new_err(format!(
                    "shm_idle_after must be a finite number of seconds ≥ 0, not {seconds}"
                ))
            })?;
            builder = builder.shm_idle_after(idle);
        }
        let spin = spin.map(spin_window).transpose()?;
        if let Some(window) = spin {
            builder = builder
                .core_busy_poll(window)
                .shm_spin(window)
                .busy_poll(window);
        }
        let node = py
            .detach(move || builder.build())
            .map_err(|e| to_py(&e, &format!("starting a node on {bind}")))?;
        Ok(Self {
            node,
            handlers: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            spin,
        })
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
        let endpoint = self
            .node
            .endpoint(name)
            .map_err(|e| to_py(&e, &format!("serving {name:?}")))?;
        let slot = HandlerSlot::new(handler);
        let threads = handlers::spawn(&Arc::new(endpoint), &slot, threads, pickle, self.spin)
            .map_err(|e| {
                to_py(
                    &tensorwire_engine::Error::io("spawning a handler thread", e),
                    name,
                )
            })?;
        lock(&self.handlers).push(slot);
        lock(&self.threads).extend(threads);
        Ok(())
    }

    /// A reference to endpoint `name` at `address`, resolved once. `transport` is `auto`
    /// (the node's preference) or the only path its sends may take (`local`, `shm`, `raw`,
    /// `http2`: one the router cannot take is an error saying why, never a silent fallback).
    #[pyo3(signature = (address, name, transport = "auto", pickle = false))]
    fn r#ref(&self, address: &str, name: &str, transport: &str, pickle: bool) -> PyResult<PyRef> {
        let peer = resolve(address)?;
        let (via, transport) = via(transport)?;
        let to = self
            .node
            .destination(peer, name, via)
            .map_err(|e| to_py(&e, &format!("a reference to {name:?} at {peer}")))?;
        Ok(PyRef::new(self.node.clone(), to, transport, pickle))
    }

    /// The path a send to `address` takes with `transport`, and why: `(path, reason)` with
    /// path one of `local`, `shm`, `raw`, `http2`.
    #[pyo3(signature = (address, transport = "auto"))]
    fn route(&self, py: Python<'_>, address: &str, transport: &str) -> PyResult<(String, String)> {
        let peer = resolve(address)?;
        let (via, _) = via(transport)?;
        let choice = py
            .detach(|| self.node.route_for(peer, via))
            .map_err(|e| to_py(&e, &format!("routing to {peer}")))?;
        Ok((route_name(choice.route).to_owned(), choice.reason))
    }

    /// A writable shared-memory slot of `nbytes` to fill in place; `freeze()` it into a
    /// buffer that reaches a same-host peer without a copy.
    fn loan(&self, py: Python<'_>, nbytes: usize) -> PyResult<PyLoan> {
        drain_releases(py);
        self.usable(&format!("a shared-memory loan of {nbytes} bytes"))?;
        // A new segment and the loan's window are mapped with their pages (tens of ms for
        // hundreds of MiB): other Python threads run meanwhile.
        let node = &self.node;
        py.detach(|| {
            let loan = node.shm().loan(nbytes).map_err(|e| {
                OutOfMemory::new_err(format!("a shared-memory loan of {nbytes} bytes: {e}"))
            })?;
            PyLoan::new(loan)
        })
    }

    /// The node's shared-memory regions and leases.
    #[getter]
    fn shm(&self) -> PyShm {
        PyShm::new(self.node.shm().clone())
    }

    /// This node's counters and gauges, as numbers and dicts.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.node
            .check_process()
            .map_err(|e| to_py(&e, "the statistics of a node"))?;
        node_stats(py, &self.node)
    }

    /// Closes the node gracefully within `timeout` seconds: takes nothing new, finishes the
    /// replies, acknowledgements and sends in flight, then stops (what is left then fails)
    /// and joins its handler threads (until the timeout; busy ones are left to finish).
    /// Idempotent; does nothing to a node inherited through `fork()`.
    #[pyo3(signature = (timeout = 5.0))]
    fn close(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let timeout = crate::calls::seconds(timeout)?;
        let threads = std::mem::take(&mut *lock(&self.threads));
        if self.node.check_process().is_err() {
            std::mem::forget(threads); // a fork's copy: its threads are not in this process
            return Ok(());
        }
        let node = self.node.clone();
        let finalizing = finalizing(py);
        py.detach(move || {
            let until = Instant::now().checked_add(timeout);
            node.close(timeout);
            match (finalizing, until) {
                (true, _) => {}
                (false, Some(until)) => join_until(threads, until),
                (false, None) => join(threads),
            }
        });
        drain_releases(py);
        Ok(())
    }

    /// Whether the node is closed.
    #[getter]
    fn closed(&self) -> bool {
        self.node.is_shut_down()
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        // Never wait during a collection: a handler thread may hold a slot briefly.
        let Ok(handlers) = self.handlers.try_lock() else {
            return Ok(());
        };
        for slot in handlers.iter() {
            if let Ok(handler) = slot.handler.try_lock() {
                visit.call(&*handler)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        let slots = std::mem::take(&mut *lock(&self.handlers));
        for slot in slots {
            let handler = lock(&slot.handler).take();
            drop(handler);
        }
    }
}

impl PyNode {
    /// `Ok` if the node takes calls (made by this process, not closed); the error says what
    /// was being done.
    fn usable(&self, what: &str) -> PyResult<()> {
        self.node.check_process().map_err(|e| to_py(&e, what))?;
        if self.node.is_shut_down() {
            return Err(to_py(&tensorwire_engine::Error::Shutdown, what));
        }
        Ok(())
    }
}

/// `"host:port"` to one socket address.
pub(crate) fn resolve(address: &str) -> PyResult<SocketAddr> {
    if let Ok(addr) = address.parse::<SocketAddr>() {
        return Ok(addr);
    }
    address
        .to_socket_addrs()
        .map_err(|e| InvalidArgument::new_err(format!("address {address:?}: {e}")))?
        .next()
        .ok_or_else(|| InvalidArgument::new_err(format!("address {address:?} resolves to nothing")))
}

/// A node's `transport=`: its preference for every send.
fn preference(name: &str) -> PyResult<Preference> {
    Ok(match name {
        "auto" => Preference::Auto,
        "raw" => Preference::Raw,
        "http2" => Preference::Http2,
        "shm" => Preference::SharedMemory,
        "local" => {
            return Err(InvalidArgument::new_err(
                "transport=\"local\" is a per-send choice (node.ref(..., transport=\"local\")); \
                 a node's preference is auto, raw, http2 or shm",
            ));
        }
        other => {
            return Err(InvalidArgument::new_err(format!(
                "unknown transport {other:?}: expected auto, raw, http2 or shm"
            )));
        }
    })
}
