//! The node: listener, cores, endpoint registry, and the ask/tell API.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tensorwire_proto::ptr1::{self, Frame};
use tensorwire_proto::route::{self, Capabilities, Locality, Preference, Route};
use tensorwire_proto::{Limits, TensorMessage};

use crate::blocking::BlockingClient;
use crate::completion::{self, Pending};
use crate::core::{self, ClientCompleter, ClientRequest, Command, CoreHandle};
use crate::endpoint::{Endpoint, Incoming, Mailbox, Reply, Request, RequestKind, Responder};
use crate::pool::{PoolConfig, ReceivePool};
use crate::{Error, sys};

type Callers = Vec<(u64, Weak<Shared>, BlockingClient)>;

thread_local! {
    /// This thread's caller cores, one per node it made blocking calls to.
    static CALLERS: std::cell::RefCell<Callers> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Receives connections whose first four bytes are not `PTR1` (TLS, HTTP/2), together with
/// those bytes. The HTTP/2 + TLS server of `tensorwire-compat` implements it.
pub trait Handoff: Send + Sync + 'static {
    /// Takes over the connection; `already_read` are the bytes read from it so far (at least
    /// four, in order), which the new owner must treat as the start of the stream.
    fn hand_off(&self, fd: OwnedFd, already_read: Vec<u8>);
}

/// Node settings (see [`NodeBuilder`] for the defaults).
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) cores: usize,
    pub(crate) ring_entries: u32,
    pub(crate) mailbox_capacity: usize,
    pub(crate) preface_timeout: Duration,
    pub(crate) frame_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) drain_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) idle_connections_per_peer: usize,
    pub(crate) max_connections_per_peer: usize,
    pub(crate) require_tls: bool,
    pub(crate) force_fallback: bool,
    pub(crate) in_process_delivery: bool,
    pub(crate) zero_copy: ZeroCopy,
    pub(crate) zero_copy_min_bytes: u64,
}

/// When frames are sent with `SENDMSG_ZC` (the kernel sends from the caller's pages instead of
/// copying them; the memory is held until the kernel's notification).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroCopy {
    /// For frames of at least `zero_copy_min_bytes` to peers that are not on loopback (where
    /// the kernel copies anyway); a connection whose sends come back "copied" stops using it.
    Auto,
    /// For every frame of at least `zero_copy_min_bytes`, loopback included (for measuring).
    Always,
    /// Never.
    Never,
}

/// Everything the cores of one node share.
pub(crate) struct Shared {
    /// Unique per node in this process (never reused).
    pub(crate) id: u64,
    /// Set by `Node::shutdown`; blocking calls check it.
    pub(crate) shut_down: std::sync::atomic::AtomicBool,
    pub(crate) config: Config,
    pub(crate) limits: Limits,
    pub(crate) pool: ReceivePool,
    pub(crate) registry: Arc<Registry>,
    pub(crate) handoff: Option<Arc<dyn Handoff>>,
}

/// Builds a [`Node`].
#[derive(Clone)]
pub struct NodeBuilder {
    bind: SocketAddr,
    config: Config,
    limits: Option<Limits>,
    pool: PoolConfig,
    handoff: Option<Arc<dyn Handoff>>,
}

impl std::fmt::Debug for NodeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeBuilder")
            .field("bind", &self.bind)
            .field("config", &self.config)
            .finish()
    }
}

impl NodeBuilder {
    /// A node that will listen on `bind` (port 0 picks a free port).
    pub fn new(bind: SocketAddr) -> Self {
        let cores = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(4);
        Self {
            bind,
            config: Config {
                cores,
                ring_entries: 256,
                mailbox_capacity: 256,
                preface_timeout: Duration::from_secs(5),
                frame_timeout: Duration::from_secs(300),
                idle_timeout: Duration::from_secs(300),
                drain_timeout: Duration::from_secs(2),
                connect_timeout: Duration::from_secs(5),
                idle_connections_per_peer: 8,
                max_connections_per_peer: 32,
                require_tls: false,
                force_fallback: false,
                in_process_delivery: true,
                zero_copy: ZeroCopy::Auto,
                zero_copy_min_bytes: 64 << 10,
            },
            limits: None,
            pool: PoolConfig::default(),
            handoff: None,
        }
    }

    /// Core threads (default: available CPUs, at most 4).
    pub fn cores(mut self, cores: usize) -> Self {
        self.config.cores = cores.max(1);
        self
    }

    /// Mailbox capacity of each endpoint (default 256).
    pub fn mailbox_capacity(mut self, capacity: usize) -> Self {
        self.config.mailbox_capacity = capacity.max(1);
        self
    }

    /// How long a new connection may take to send its first 4 bytes (default 5 s).
    pub fn preface_timeout(mut self, timeout: Duration) -> Self {
        self.config.preface_timeout = timeout;
        self
    }

    /// How long one request frame may take to arrive once it started (default 300 s).
    pub fn frame_timeout(mut self, timeout: Duration) -> Self {
        self.config.frame_timeout = timeout;
        self
    }

    /// How long a server connection may sit idle between requests (default 300 s).
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.config.idle_timeout = timeout;
        self
    }

    /// Connect timeout for outgoing connections (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// Idle pooled connections kept per peer and core (default 8).
    pub fn idle_connections_per_peer(mut self, count: usize) -> Self {
        self.config.idle_connections_per_peer = count;
        self
    }

    /// Most connections to one peer per core (default 32); further requests wait, in order,
    /// for one to become free (their deadline still runs).
    pub fn max_connections_per_peer(mut self, count: usize) -> Self {
        self.config.max_connections_per_peer = count.max(1);
        self
    }

    /// Refuse plaintext PTR1 connections (only handed-off TLS connections are served).
    pub fn require_tls(mut self, require: bool) -> Self {
        self.config.require_tls = require;
        self
    }

    /// Behave as if io_uring were unavailable (as `TENSORWIRE_FORCE_FALLBACK=1` does), to
    /// exercise the fallback path.
    pub fn force_fallback(mut self, force: bool) -> Self {
        self.config.force_fallback = force;
        self
    }

    /// Whether sends to a node in this same process go straight to its mailbox (default
    /// `true`, no copy). Tests and benchmarks turn it off to exercise the TCP path in one
    /// process.
    pub fn in_process_delivery(mut self, enabled: bool) -> Self {
        self.config.in_process_delivery = enabled;
        self
    }

    /// When to send with `SENDMSG_ZC` (default [`ZeroCopy::Auto`]).
    pub fn zero_copy(mut self, mode: ZeroCopy) -> Self {
        self.config.zero_copy = mode;
        self
    }

    /// Smallest frame sent with `SENDMSG_ZC` (default 64 KiB; below it copying is cheaper).
    pub fn zero_copy_min_bytes(mut self, bytes: u64) -> Self {
        self.config.zero_copy_min_bytes = bytes;
        self
    }

    /// Limits (default: from the `PULSING_MAX_TENSOR_*` environment, read once here).
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = Some(limits);
        self
    }

    /// Receive-pool settings.
    pub fn receive_pool(mut self, pool: PoolConfig) -> Self {
        self.pool = pool;
        self
    }

    /// Where connections that do not start with `PTR1` go (default: they are closed).
    pub fn handoff(mut self, handoff: Arc<dyn Handoff>) -> Self {
        self.handoff = Some(handoff);
        self
    }

    /// Binds, starts the core threads and returns the running node.
    ///
    /// # Errors
    ///
    /// [`Error::IoUringUnavailable`] if io_uring cannot be used here (the reason says why;
    /// `TENSORWIRE_FORCE_FALLBACK=1` forces it); [`Error::Config`] for a bad limit variable;
    /// [`Error::Io`] if binding fails.
    pub fn build(self) -> Result<Node, Error> {
        let limits = match self.limits {
            Some(limits) => limits,
            None => Limits::from_env()?,
        };
        let preference = Preference::from_env()?;
        let available = if self.config.force_fallback {
            Err("forced by NodeBuilder::force_fallback".to_owned())
        } else {
            crate::ring::availability()
        };
        if let Err(reason) = available {
            crate::stats::record_fallback(&reason);
            return Err(Error::IoUringUnavailable { reason });
        }
        let listener = sys::tcp_listener(self.bind, 1024).map_err(|e| Error::io("bind", e))?;
        let local_addr =
            sys::local_addr(listener.as_raw_fd()).map_err(|e| Error::io("getsockname", e))?;
        let registry = Arc::new(Registry::default());
        static NODE_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let shared = Arc::new(Shared {
            id: NODE_IDS.fetch_add(1, Ordering::Relaxed),
            shut_down: std::sync::atomic::AtomicBool::new(false),
            config: self.config.clone(),
            limits,
            pool: ReceivePool::new(self.pool),
            registry: Arc::clone(&registry),
            handoff: self.handoff,
        });
        let mut cores = Vec::new();
        let mut threads = Vec::new();
        for index in 0..self.config.cores {
            match core::spawn(index, Arc::clone(&shared), Some(listener.as_raw_fd())) {
                Ok((handle, thread)) => {
                    cores.push(handle);
                    threads.push(thread);
                }
                Err(e) => {
                    for handle in &cores {
                        let _ = handle.send(Command::Shutdown);
                    }
                    threads.into_iter().for_each(|t| drop(t.join()));
                    return Err(e);
                }
            }
        }
        let inner = Arc::new(NodeInner {
            local_addr,
            shared,
            registry,
            cores,
            next_core: AtomicUsize::new(0),
            threads: Mutex::new(threads),
            handler_threads: Mutex::new(Vec::new()),
            listener: Mutex::new(Some(listener)),
            preference,
        });
        local_nodes().insert(local_addr, Arc::downgrade(&inner));
        Ok(Node { inner })
    }
}

/// A running tensorwire node: it serves its endpoints on one port and sends to other nodes.
///
/// Cheap to clone; the node shuts down when [`Node::shutdown`] is called or the last clone is
/// dropped.
#[derive(Clone, Debug)]
pub struct Node {
    inner: Arc<NodeInner>,
}

struct NodeInner {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    registry: Arc<Registry>,
    cores: Vec<CoreHandle>,
    next_core: AtomicUsize,
    threads: Mutex<Vec<JoinHandle<()>>>,
    handler_threads: Mutex<Vec<JoinHandle<()>>>,
    /// Closed only after every core thread has stopped using it.
    listener: Mutex<Option<OwnedFd>>,
    preference: Preference,
}

impl std::fmt::Debug for NodeInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("local_addr", &self.local_addr)
            .field("cores", &self.cores.len())
            .finish()
    }
}

impl Node {
    /// Starts building a node that listens on `bind`.
    pub fn builder(bind: SocketAddr) -> NodeBuilder {
        NodeBuilder::new(bind)
    }

    /// The address the node listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// Timer entries queued on this node's cores (internal; lets tests check that timers stay
    /// bounded by connections, not requests).
    #[doc(hidden)]
    pub fn queued_timers(&self) -> usize {
        self.inner.cores.iter().map(CoreHandle::timer_entries).sum()
    }

    /// Limits in force on this node.
    pub fn limits(&self) -> Limits {
        self.inner.shared.limits
    }

    /// Counters of the node's receive pool.
    pub fn pool_stats(&self) -> crate::PoolStats {
        self.inner.shared.pool.stats()
    }

    /// Registers `/actors/{name}` and returns it for pulling requests with
    /// [`Endpoint::recv`].
    ///
    /// # Errors
    ///
    /// [`Error::EndpointExists`], [`Error::InvalidPath`] for an empty name.
    pub fn endpoint(&self, name: &str) -> Result<Endpoint, Error> {
        let (path, mailbox) = self.register(name)?;
        Ok(Endpoint {
            path,
            mailbox,
            registry: Arc::downgrade(&self.inner.registry),
        })
    }

    /// Registers `/actors/{name}` served by `handler` on `threads` handler threads (never on a
    /// core thread). The handler's result answers asks; for tells it is ignored.
    ///
    /// # Errors
    ///
    /// As [`Node::endpoint`].
    pub fn serve<F>(&self, name: &str, threads: usize, handler: F) -> Result<(), Error>
    where
        F: Fn(Request) -> Result<Reply, String> + Send + Sync + 'static,
    {
        let (_, mailbox) = self.register(name)?;
        let handler = Arc::new(handler);
        let mut handles = self
            .inner
            .handler_threads
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for i in 0..threads.max(1) {
            let mailbox = Arc::clone(&mailbox);
            let handler = Arc::clone(&handler);
            let thread = std::thread::Builder::new()
                .name(format!("tensorwire-handler-{name}-{i}"))
                .spawn(move || {
                    while let Ok(Some(incoming)) = mailbox.pop(None) {
                        let (request, replier) = incoming.into_parts();
                        // A panicking handler answers with an error and keeps serving.
                        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            handler(request)
                        }))
                        .unwrap_or_else(|panic| {
                            Err(format!("handler panicked: {}", panic_text(&*panic)))
                        });
                        replier.reply(result);
                    }
                })
                .map_err(|e| Error::io("spawning a handler thread", e))?;
            handles.push(thread);
        }
        Ok(())
    }

    /// Sends `message` to the endpoint at `path` on `peer` and waits (up to `timeout`) for its
    /// reply. A target in this process gets the message through its mailbox without a copy.
    pub fn ask(
        &self,
        peer: SocketAddr,
        path: &str,
        message: TensorMessage,
        timeout: Duration,
    ) -> Pending<Reply> {
        let (completer, pending) = completion::pair();
        if self.route(peer) == Route::LocalMailbox {
            completer.expire_at(Instant::now() + timeout, move || Error::Timeout {
                what: "ask",
                after: timeout,
            });
            let responder = Some(Responder::Local(completer));
            return match self.local_deliver(
                peer,
                path,
                message,
                timeout,
                RequestKind::Ask,
                responder,
            ) {
                Ok(()) => pending,
                Err(e) => Pending::ready(Err(e)),
            };
        }
        let frame = Frame::Ask {
            path: path.to_owned(),
            message,
        };
        self.remote_send(peer, &frame, timeout, ClientCompleter::Ask(completer));
        pending
    }

    /// Sends `message` and returns once the receiver has enqueued it (a full mailbox delays
    /// this: backpressure), or `timeout` passes.
    pub fn tell(
        &self,
        peer: SocketAddr,
        path: &str,
        message: TensorMessage,
        timeout: Duration,
    ) -> Pending<()> {
        if self.route(peer) == Route::LocalMailbox {
            return Pending::ready(self.local_deliver(
                peer,
                path,
                message,
                timeout,
                RequestKind::Tell,
                None,
            ));
        }
        let (completer, pending) = completion::pair();
        let frame = Frame::Tell {
            path: path.to_owned(),
            message,
        };
        self.remote_send(peer, &frame, timeout, ClientCompleter::Tell(completer));
        pending
    }

    /// The blocking form of [`Node::ask`]: the exchange runs on the calling thread with plain
    /// system calls (non-blocking `sendmsg`, `poll`, `recv` into the receive pool) over a
    /// connection pool of that thread's own, so no core thread is woken on the way out or back.
    ///
    /// # Errors
    ///
    /// As the result of [`Node::ask`].
    pub fn ask_blocking(
        &self,
        peer: SocketAddr,
        path: &str,
        message: TensorMessage,
        timeout: Duration,
    ) -> Result<Reply, Error> {
        if self.route(peer) == Route::LocalMailbox {
            return self.ask(peer, path, message, timeout).wait();
        }
        let frame = Frame::Ask {
            path: path.to_owned(),
            message,
        };
        let reply = self.on_caller(peer, &frame, timeout, "ask")?;
        core::ask_reply(peer, reply)
    }

    /// The blocking form of [`Node::tell`], run on the calling thread like
    /// [`Node::ask_blocking`].
    ///
    /// # Errors
    ///
    /// As the result of [`Node::tell`].
    pub fn tell_blocking(
        &self,
        peer: SocketAddr,
        path: &str,
        message: TensorMessage,
        timeout: Duration,
    ) -> Result<(), Error> {
        if self.route(peer) == Route::LocalMailbox {
            return self.tell(peer, path, message, timeout).wait();
        }
        let frame = Frame::Tell {
            path: path.to_owned(),
            message,
        };
        let reply = self.on_caller(peer, &frame, timeout, "tell")?;
        core::tell_reply(peer, reply)
    }

    /// Runs one exchange on this thread's blocking client for this node.
    fn on_caller(
        &self,
        peer: SocketAddr,
        frame: &Frame,
        timeout: Duration,
        what: &'static str,
    ) -> Result<Frame, Error> {
        let shared = &self.inner.shared;
        if shared.shut_down.load(Ordering::Acquire) {
            return Err(Error::Shutdown);
        }
        let encoded = ptr1::encode(frame, &shared.limits).map_err(Error::Encode)?;
        let deadline = crate::blocking::Deadline {
            at: Instant::now() + timeout,
            timeout,
            what,
        };
        CALLERS.with(|callers| {
            let mut fresh;
            let mut callers = callers.try_borrow_mut();
            let client = match callers.as_mut() {
                Ok(callers) => {
                    // Clients of nodes that have shut down close their connections here.
                    callers.retain(|(_, node, _)| {
                        node.upgrade()
                            .is_some_and(|s| !s.shut_down.load(Ordering::Acquire))
                    });
                    match callers.iter().position(|(id, _, _)| *id == shared.id) {
                        Some(index) => &mut callers[index].2,
                        None => {
                            let client = BlockingClient::new(Arc::clone(shared));
                            callers.push((shared.id, Arc::downgrade(shared), client));
                            let last = callers.len() - 1;
                            &mut callers[last].2
                        }
                    }
                }
                // Re-entered (a blocking call from inside a blocking call on this thread).
                Err(_) => {
                    fresh = BlockingClient::new(Arc::clone(shared));
                    &mut fresh
                }
            };
            client.exchange(peer, encoded, deadline)
        })
    }

    /// Stops accepting, fails every request in flight, closes every connection and endpoint,
    /// and joins the threads. Idempotent.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }

    fn route(&self, peer: SocketAddr) -> Route {
        let in_process =
            self.inner.shared.config.in_process_delivery && lookup_local(peer).is_some();
        let locality = if in_process {
            Locality::SameProcess
        } else {
            Locality::Remote
        };
        let caps = Capabilities {
            raw: true,
            shared_memory: false,
        };
        route::select(
            self.inner.preference,
            locality,
            caps,
            self.inner.shared.config.require_tls,
        )
    }

    /// Puts a request straight into an in-process endpoint's mailbox (no copy of anything),
    /// waiting for space until the deadline.
    fn local_deliver(
        &self,
        peer: SocketAddr,
        path: &str,
        message: TensorMessage,
        timeout: Duration,
        kind: RequestKind,
        responder: Option<Responder>,
    ) -> Result<(), Error> {
        let target = lookup_local(peer).ok_or(Error::ConnectionClosed { peer, detail: None })?;
        let mailbox = target.registry.lookup(path)?;
        let incoming = Incoming::new(
            Request {
                path: path.to_owned(),
                kind,
                message,
            },
            responder,
        );
        mailbox.push_until(incoming, Instant::now() + timeout)
    }

    fn remote_send(
        &self,
        peer: SocketAddr,
        frame: &Frame,
        timeout: Duration,
        completer: ClientCompleter,
    ) {
        let encoded = match ptr1::encode(frame, &self.inner.shared.limits) {
            Ok(encoded) => encoded,
            Err(e) => return completer_fail(completer, Error::Encode(e)),
        };
        let request = ClientRequest {
            peer,
            encoded: Some(encoded),
            deadline: Instant::now() + timeout,
            timeout,
            completer,
        };
        self.send_to_core(request);
    }

    /// Hands a request to a core thread, round-robin.
    fn send_to_core(&self, request: ClientRequest) {
        let cores = &self.inner.cores;
        let index = self.inner.next_core.fetch_add(1, Ordering::Relaxed) % cores.len().max(1);
        match cores
            .get(index)
            .map(|core| core.send(Command::Request(Box::new(request))))
        {
            Some(Ok(())) => {}
            Some(Err(Command::Request(request))) => {
                completer_fail(request.completer, Error::Shutdown)
            }
            Some(Err(_)) | None => {}
        }
    }

    fn register(&self, name: &str) -> Result<(String, Arc<Mailbox>), Error> {
        if name.is_empty() || name.contains('/') {
            return Err(Error::InvalidPath {
                path: name.to_owned(),
            });
        }
        let mailbox = Arc::new(Mailbox::new(self.inner.shared.config.mailbox_capacity));
        self.inner.registry.insert(name, Arc::clone(&mailbox))?;
        Ok((format!("/actors/{name}"), mailbox))
    }
}

fn completer_fail(completer: ClientCompleter, error: Error) {
    match completer {
        ClientCompleter::Ask(c) => c.complete(Err(error)),
        ClientCompleter::Tell(c) => c.complete(Err(error)),
    }
}

impl NodeInner {
    fn shutdown(&self) {
        self.shared.shut_down.store(true, Ordering::Release);
        local_nodes().remove(self.local_addr);
        for core in &self.cores {
            let _ = core.send(Command::Shutdown);
        }
        let threads =
            std::mem::take(&mut *self.threads.lock().unwrap_or_else(PoisonError::into_inner));
        threads.into_iter().for_each(|t| drop(t.join()));
        // Every core has stopped: nothing uses the listener any more.
        drop(
            self.listener
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        self.registry.close_all();
        let handlers = std::mem::take(
            &mut *self
                .handler_threads
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        // Shutdown may run on a handler thread (a handler that held the last Node handle):
        // that thread ends by itself once it returns.
        let current = std::thread::current().id();
        handlers
            .into_iter()
            .filter(|t| t.thread().id() != current)
            .for_each(|t| drop(t.join()));
    }
}

/// The message of a panic payload, if it has one.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

impl Drop for NodeInner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The endpoints of a node by actor name.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    endpoints: RwLock<HashMap<String, Arc<Mailbox>>>,
}

impl Registry {
    fn insert(&self, name: &str, mailbox: Arc<Mailbox>) -> Result<(), Error> {
        let mut endpoints = self
            .endpoints
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if endpoints.contains_key(name) {
            return Err(Error::EndpointExists {
                name: name.to_owned(),
            });
        }
        endpoints.insert(name.to_owned(), mailbox);
        Ok(())
    }

    /// The mailbox for an actor path (`/actors/{name}` or `/named/{name}`).
    pub(crate) fn lookup(&self, path: &str) -> Result<Arc<Mailbox>, Error> {
        let name = path
            .strip_prefix("/actors/")
            .or_else(|| path.strip_prefix("/named/"))
            .filter(|name| !name.is_empty())
            .ok_or_else(|| Error::InvalidPath {
                path: path.to_owned(),
            })?;
        let endpoints = self
            .endpoints
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        endpoints
            .get(name)
            .cloned()
            .ok_or_else(|| Error::UnknownEndpoint {
                path: path.to_owned(),
            })
    }

    pub(crate) fn remove(&self, path: &str) {
        if let Some(name) = path.strip_prefix("/actors/") {
            self.endpoints
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(name);
        }
    }

    fn close_all(&self) {
        let endpoints = std::mem::take(
            &mut *self
                .endpoints
                .write()
                .unwrap_or_else(PoisonError::into_inner),
        );
        endpoints.values().for_each(|mailbox| mailbox.close());
    }
}

/// Nodes of this process by listening address, so sends to them stay in process.
/// Read on every send (to route it), written only when a node starts or stops.
struct LocalNodes(RwLock<HashMap<SocketAddr, Weak<NodeInner>>>);

fn local_nodes() -> &'static LocalNodes {
    static NODES: std::sync::OnceLock<LocalNodes> = std::sync::OnceLock::new();
    NODES.get_or_init(|| LocalNodes(RwLock::new(HashMap::new())))
}

impl LocalNodes {
    fn insert(&self, addr: SocketAddr, node: Weak<NodeInner>) {
        self.0
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(addr, node);
    }

    fn remove(&self, addr: SocketAddr) {
        self.0
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&addr);
    }
}

/// The in-process node listening at `peer`, if any (an unspecified bind address matches any
/// loopback address with the same port).
fn lookup_local(peer: SocketAddr) -> Option<Arc<NodeInner>> {
    let nodes = local_nodes()
        .0
        .read()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(node) = nodes.get(&peer).and_then(Weak::upgrade) {
        return Some(node);
    }
    if !peer.ip().is_loopback() {
        return None;
    }
    let unspecified: IpAddr = if peer.is_ipv4() {
        [0, 0, 0, 0].into()
    } else {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    };
    nodes
        .get(&SocketAddr::new(unspecified, peer.port()))
        .and_then(Weak::upgrade)
}
