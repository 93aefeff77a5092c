//! The node: endpoints, the router, in-process delivery, and the public ask/tell API. The
//! PTR1 driver that carries remote requests (io_uring, or a plugged-in fallback) sits behind
//! the `Driver` seam; the node never names it beyond that.

mod builder;
mod close;
#[cfg(test)]
mod keeper;
mod local;
mod pipelines;
mod routing;
mod send;
mod stripes;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tensorwire_proto::route::{Preference, Route};
use tensorwire_proto::transport::{ActorPath, Driver, DriverGauges, Error, Reply, Transport};
use tensorwire_proto::{Limits, TensorMessage};

pub use builder::{NodeBuilder, ShmAccess};
pub use routing::{RouteChoice, Via};
use send::{Ask, Tell};

use crate::blocking::BlockingPool;
use crate::endpoint::{Endpoint, Registry, Request, Served, spawn_handler_threads};
use crate::fork::Birth;
use crate::inflight::InFlightCount;
use crate::pending::Pending;
use crate::pool::{PoolStats, ReceivePool};
use crate::shm::ShmManager;
use crate::shm::transport::ShmTransport;
use crate::stats;
use crate::sync::lock;

/// A running tensorwire node: it serves its endpoints on one port and sends to other nodes.
///
/// Cheap to clone; the node shuts down when [`Node::shutdown`] (or [`Node::close`]) is called
/// or the last clone is dropped.
///
/// A child made by `fork()` inherits a copy of the node without its threads: there every call
/// fails at once with [`Error::Forked`], and dropping it leaks it (nothing of the parent's is
/// touched). The child makes a node of its own.
#[derive(Clone, Debug)]
pub struct Node {
    inner: Arc<NodeInner>,
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.inner.birth.is_inherited() {
            // Never drop an inherited node: it would join threads that do not exist here.
            std::mem::forget(Arc::clone(&self.inner));
        }
    }
}

pub(crate) struct NodeInner {
    local_addr: SocketAddr,
    driver: Arc<dyn Driver>,
    /// Cuts large requests to peers that take stripes.
    stripes: Arc<stripes::StripeSender>,
    /// How many requests each peer takes on one connection at once.
    pipelines: Arc<pipelines::PipelineDepths>,
    /// Where peers' stripes go (`None`: this node takes none).
    stripe_store: Option<Arc<tensorwire_proto::session::StripeStore>>,
    pub(crate) registry: Arc<Registry>,
    pool: ReceivePool,
    blocking: BlockingPool,
    limits: Limits,
    preference: Preference,
    in_process_delivery: bool,
    require_tls: bool,
    /// Remote sends are encrypted: the transport beside PTR1 has TLS.
    encrypts: bool,
    /// The transport beside PTR1 (HTTP/2 + TLS), if one is plugged in.
    transport: Option<Arc<dyn Transport>>,
    /// The same-host shared-memory path, unless off or unavailable.
    shm: Option<ShmTransport>,
    /// Why there is no shared-memory path, when there is none.
    shm_off: String,
    /// How long a shared-memory probe may take (`route()` waits for one that runs).
    shm_hello_timeout: Duration,
    shm_manager: ShmManager,
    /// How long a blocking call polls for its reply before it sleeps.
    busy_poll: Duration,
    handler_threads: Mutex<Vec<JoinHandle<()>>>,
    /// Sends started and not completed yet (for a graceful close).
    outbound: InFlightCount,
    /// The process that made the node.
    birth: Birth,
    shut_down: AtomicBool,
}

impl std::fmt::Debug for NodeInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("local_addr", &self.local_addr)
            .field("driver", &self.driver.name())
            .finish_non_exhaustive()
    }
}

/// What a node is and holds now.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeStats {
    /// The PTR1 driver running the node (`"io_uring"`, `"tokio"`, …).
    pub driver: &'static str,
    /// Why io_uring is not used in this process, if it is not.
    pub fallback_reason: Option<String>,
    /// Connections, timers, operations and peers the driver holds.
    pub gauges: DriverGauges,
    /// The receive pool's counters.
    pub pool: PoolStats,
    /// The transport beside PTR1 (`"http2"`, `"http2+tls"`), if one is plugged in.
    pub transport: Option<&'static str>,
    /// Its open connections.
    pub transport_connections: usize,
    /// Shared-memory connections open (either direction).
    pub shm_connections: usize,
    /// Leases of this node's shared memory held by peers now.
    pub shm_leases: usize,
    /// Bytes of the slots those leases hold.
    pub shm_lent_bytes: u64,
    /// Shared-memory segments alive, and their bytes (slots lent, held here, idle).
    pub shm_segments: usize,
    /// Bytes of those segments.
    pub shm_segment_bytes: u64,
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

    /// Limits in force on this node.
    pub fn limits(&self) -> Limits {
        self.inner.limits
    }

    /// The driver, its gauges and the receive pool's counters.
    pub fn stats(&self) -> NodeStats {
        let shm = self
            .inner
            .shm
            .as_ref()
            .map(ShmTransport::gauges)
            .unwrap_or_default();
        NodeStats {
            driver: self.inner.driver.name(),
            fallback_reason: stats::fallback_reason(),
            gauges: self.inner.driver.gauges(),
            pool: self.inner.pool.stats(),
            transport: self.inner.transport.as_ref().map(|t| t.name()),
            transport_connections: self.inner.transport.as_ref().map_or(0, |t| t.connections()),
            shm_connections: shm.connections,
            shm_leases: shm.leases,
            shm_lent_bytes: shm.lent_bytes,
            shm_segments: shm.segments,
            shm_segment_bytes: shm.segment_bytes,
        }
    }

    /// The node's shared-memory manager: regions, names, leases and loaned slots.
    pub fn shm(&self) -> &ShmManager {
        &self.inner.shm_manager
    }

    /// Registers an endpoint (a name such as `echo`, or an actor path such as
    /// `/actors/echo`) and returns it for pulling requests with [`Endpoint::recv`].
    ///
    /// # Errors
    ///
    /// [`Error::EndpointExists`], [`Error::InvalidPath`].
    pub fn endpoint(&self, name: &str) -> Result<Endpoint, Error> {
        self.inner.usable()?;
        let path = ActorPath::parse(name)?;
        let mailbox = self.inner.registry.insert(&path, Served::Mailbox)?;
        Ok(Endpoint {
            path: path.to_string(),
            mailbox,
            registry: Arc::downgrade(&self.inner.registry),
            birth: self.inner.birth,
        })
    }

    /// [`Node::endpoint`] with a mailbox of `capacity` requests (at least 1) instead of the
    /// node's [`NodeBuilder::mailbox_capacity`]: a full mailbox delays tells and asks to it
    /// (backpressure) until the enqueue deadline.
    ///
    /// # Errors
    ///
    /// As [`Node::endpoint`].
    pub fn endpoint_with_capacity(&self, name: &str, capacity: usize) -> Result<Endpoint, Error> {
        self.inner.usable()?;
        let path = ActorPath::parse(name)?;
        let mailbox = self
            .inner
            .registry
            .insert_with_capacity(&path, Served::Mailbox, capacity)?;
        Ok(Endpoint {
            path: path.to_string(),
            mailbox,
            registry: Arc::downgrade(&self.inner.registry),
            birth: self.inner.birth,
        })
    }

    /// Registers an endpoint served by `handler` on `threads` handler threads of its own: for
    /// handlers that block or take long. The handler's result answers asks; for tells it is
    /// ignored. A panicking handler answers with an error and its thread keeps serving.
    ///
    /// # Errors
    ///
    /// As [`Node::endpoint`], and [`Error::Io`] if a thread cannot be started.
    pub fn serve<F>(&self, name: &str, threads: usize, handler: F) -> Result<(), Error>
    where
        F: Fn(Request) -> Result<Reply, String> + Send + Sync + 'static,
    {
        self.inner.usable()?;
        let path = ActorPath::parse(name)?;
        let mailbox = self.inner.registry.insert(&path, Served::Mailbox)?;
        let handler: Arc<crate::endpoint::Handler> = Arc::new(handler);
        let threads = spawn_handler_threads(path.as_str(), &mailbox, &handler, threads)?;
        lock(&self.inner.handler_threads).extend(threads);
        Ok(())
    }

    /// Registers an endpoint served by `handler` **on the thread that received the request**:
    /// a driver thread for requests from the network (no mailbox, no thread hop, the answer
    /// goes out on the same thread), the sender's thread for requests from this process.
    ///
    /// The handler must never block or take long: while it runs, nothing else on that driver
    /// thread moves. A panic in it becomes an error answer; the driver thread goes on.
    ///
    /// # Errors
    ///
    /// As [`Node::endpoint`].
    pub fn serve_on_core<F>(&self, name: &str, handler: F) -> Result<(), Error>
    where
        F: Fn(Request) -> Result<Reply, String> + Send + Sync + 'static,
    {
        self.inner.usable()?;
        let path = ActorPath::parse(name)?;
        self.inner
            .registry
            .insert(&path, Served::OnCore(Arc::new(handler)))?;
        Ok(())
    }

    /// An endpoint of a peer and the paths sends to it may take, resolved once (the path
    /// parsed, the address given) so that repeated sends pay only for routing and the send.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPath`]; [`Error::Shutdown`] once the node is shut down (or closing),
    /// [`Error::Forked`] in a child made by `fork()`.
    pub fn destination(
        &self,
        peer: SocketAddr,
        path: &str,
        via: Via,
    ) -> Result<Destination, Error> {
        self.inner.usable()?;
        Ok(Destination {
            peer,
            path: ActorPath::parse(path)?,
            via,
        })
    }

    /// Sends `message` to the endpoint `path` (a name or an actor path) on `peer` and returns
    /// its reply, to await or [`Pending::wait`] on, within `timeout`. A target in this process
    /// gets the message through its mailbox without a copy.
    pub fn ask(
        &self,
        peer: SocketAddr,
        path: &str,
        message: TensorMessage,
        timeout: Duration,
    ) -> Pending<Reply> {
        self.ask_via(peer, path, message, timeout, None)
    }

    /// [`Node::ask`] over the path `force` names instead of the node's preference (see
    /// [`Node::route_to`]); `None` is [`Node::ask`].
    pub fn ask_via(
        &self,
        peer: SocketAddr,
        path: &str,
        message: TensorMessage,
        timeout: Duration,
        force: Option<Preference>,
    ) -> Pending<Reply> {
        match self.destination(peer, path, Via::from_force(force)) {
            Ok(to) => self.ask_to(&to, message, timeout),
            Err(e) => Pending::ready(Err(e)),
        }
    }

    /// [`Node::ask`] to a resolved [`Destination`]. The send never waits on this thread: a
    /// copy into shared memory, a connection or a hello happens on the transport's threads.
    pub fn ask_to(
        &self,
        to: &Destination,
        message: TensorMessage,
        timeout: Duration,
    ) -> Pending<Reply> {
        self.start::<Ask>(to, message, timeout, false)
    }

    /// Sends `message` and completes once the receiver has it in the endpoint's mailbox (a
    /// full mailbox delays this: backpressure), or `timeout` passes.
    pub fn tell(
        &self,
        peer: SocketAddr,
        path: &str,
        message: TensorMessage,
        timeout: Duration,
    ) -> Pending<()> {
        self.tell_via(peer, path, message, timeout, None)
    }

    /// [`Node::tell`] over the path `force` names; `None` is [`Node::tell`].
    pub fn tell_via(
        &self,
        peer: SocketAddr,
        path: &str,
        message: TensorMessage,
        timeout: Duration,
        force: Option<Preference>,
    ) -> Pending<()> {
        match self.destination(peer, path, Via::from_force(force)) {
            Ok(to) => self.tell_to(&to, message, timeout),
            Err(e) => Pending::ready(Err(e)),
        }
    }

    /// [`Node::tell`] to a resolved [`Destination`].
    pub fn tell_to(
        &self,
        to: &Destination,
        message: TensorMessage,
        timeout: Duration,
    ) -> Pending<()> {
        self.start::<Tell>(to, message, timeout, false)
    }

    /// The blocking form of [`Node::ask`]: the exchange runs on the calling thread where that
    /// is fastest — PTR1 with plain system calls (non-blocking `sendmsg`, `poll`, `recvmsg`
    /// into the receive pool, so no driver thread is woken on the way out or back), a
    /// shared-memory copy into the slot — and the wait for the reply polls briefly before it
    /// sleeps ([`NodeBuilder::busy_poll`]).
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
        let to = self.destination(peer, path, Via::Preferred)?;
        self.ask_blocking_to(&to, message, timeout, None)
            .map(|(reply, _)| reply)
    }

    /// [`Node::ask_blocking`] to a resolved [`Destination`]; also says which path carried it.
    /// `interrupt` is asked every 100 ms while waiting: `true` gives up (the request is
    /// cancelled, [`Error::Cancelled`]).
    ///
    /// # Errors
    ///
    /// As the result of [`Node::ask`].
    pub fn ask_blocking_to(
        &self,
        to: &Destination,
        message: TensorMessage,
        timeout: Duration,
        interrupt: Option<&dyn Fn() -> bool>,
    ) -> Result<(Reply, Route), Error> {
        crate::phase_marks::mark(crate::phase_marks::Phase::AskStart);
        let answered = self.blocking::<Ask>(to, message, timeout, interrupt);
        crate::phase_marks::mark(crate::phase_marks::Phase::AskEnd);
        answered
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
        let to = self.destination(peer, path, Via::Preferred)?;
        self.tell_blocking_to(&to, message, timeout, None)
            .map(|_| ())
    }

    /// [`Node::tell_blocking`] to a resolved [`Destination`], interruptible like
    /// [`Node::ask_blocking_to`].
    ///
    /// # Errors
    ///
    /// As the result of [`Node::tell`].
    pub fn tell_blocking_to(
        &self,
        to: &Destination,
        message: TensorMessage,
        timeout: Duration,
        interrupt: Option<&dyn Fn() -> bool>,
    ) -> Result<((), Route), Error> {
        self.blocking::<Tell>(to, message, timeout, interrupt)
    }

    /// Stops accepting, fails every request in flight, closes every connection and endpoint,
    /// and joins the threads. Idempotent. [`Node::close`] finishes what is in flight first.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }

    /// Whether the node is shut down.
    pub fn is_shut_down(&self) -> bool {
        self.inner.is_shut_down()
    }

    /// `Ok` in the process that made the node.
    ///
    /// # Errors
    ///
    /// [`Error::Forked`] in a child made by `fork()` since: the node cannot be used there.
    pub fn check_process(&self) -> Result<(), Error> {
        self.inner.birth.check()
    }
}

/// An endpoint of a peer, and the paths sends to it may take: made once with
/// [`Node::destination`], used for any number of sends from any thread.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Destination {
    peer: SocketAddr,
    path: ActorPath,
    via: Via,
}

impl Destination {
    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The endpoint's actor path.
    pub fn path(&self) -> &str {
        self.path.as_str()
    }

    /// The paths a send may take.
    pub fn via(&self) -> Via {
        self.via
    }
}

impl NodeInner {
    fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    /// `Ok` if the node takes calls: made by this process, and not shut down.
    fn usable(&self) -> Result<(), Error> {
        self.birth.check()?;
        if self.is_shut_down() {
            return Err(Error::Shutdown);
        }
        Ok(())
    }

    fn pool(&self) -> &ReceivePool {
        &self.pool
    }

    fn shutdown(&self) {
        self.shutdown_joining_until(None);
    }

    /// Shuts down; handler threads still running are joined until `join_until` (`None`: until
    /// they end), and left to end by themselves after it.
    fn shutdown_joining_until(&self, join_until: Option<std::time::Instant>) {
        if self.birth.is_inherited() || self.shut_down.swap(true, Ordering::AcqRel) {
            return;
        }
        local::unregister(self.local_addr);
        stats::unregister_node(self.local_addr);
        self.driver.shutdown();
        if let Some(transport) = &self.transport {
            transport.shutdown();
        }
        if let Some(shm) = &self.shm {
            shm.shutdown(join_until);
        }
        self.shm_manager.clear();
        self.blocking.close();
        self.registry.close_all();
        let handlers = std::mem::take(&mut *lock(&self.handler_threads));
        // Shutdown may run on a handler thread (a handler that held the last Node handle):
        // that thread ends by itself once it returns.
        let current = std::thread::current().id();
        let handlers = handlers.into_iter().filter(|t| t.thread().id() != current);
        match join_until {
            None => handlers.for_each(|t| drop(t.join())),
            Some(until) => {
                let left = crate::sync::join_until(handlers, until);
                if left > 0 {
                    tracing::warn!(
                        threads = left,
                        "closing a node: handler threads still busy at the close timeout are left to finish"
                    );
                }
            }
        }
    }
}

impl Drop for NodeInner {
    fn drop(&mut self) {
        self.shutdown();
    }
}
