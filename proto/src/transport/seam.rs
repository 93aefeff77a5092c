//! The traits a node and its transports meet at. No threads, no runtime: a node implements
//! [`Inbound`], each transport implements [`Outbound`] (and, if it serves connections,
//! [`Driver`]), and whoever wires them together passes trait objects.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;

use crate::config::{ConnectionPoolConfig, SessionConfig};
use crate::limits::Limits;
use crate::message::TensorMessage;
use crate::transport::ReceiveMemory;
use crate::transport::{ActorPath, Answer, Deadline, Error, InboundRequest, Reply, RequestKind};

/// The node side of a transport that receives requests.
pub trait Inbound: Send + Sync + 'static {
    /// Whether a request of `kind` for `path` can be taken, checked as soon as the path has
    /// arrived and before any payload memory is committed. `Err(text)` refuses it; the peer is
    /// told `text`.
    ///
    /// # Errors
    ///
    /// The refusal text.
    fn admit(&self, kind: RequestKind, path: &str) -> Result<(), String>;

    /// Hands over a received request. Its answer goes to `responder`: at once (a handler that
    /// runs on the calling thread), later from another thread, or never if the request waits
    /// for mailbox space and is withdrawn.
    fn deliver(&self, request: InboundRequest, responder: Box<dyn Responder>) -> Delivery;
}

/// What became of a delivered request.
pub enum Delivery {
    /// It is in the endpoint's mailbox (a tell may be acknowledged now).
    Enqueued,
    /// The mailbox is full; [`Responder::enqueued`] is called once it gets in. Withdraw it to
    /// give up (the peer left, or the transport's deadline passed).
    Waiting(Box<dyn Withdraw>),
    /// It cannot be taken; the peer is told the text.
    Refused(String),
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Enqueued => f.write_str("Enqueued"),
            Self::Waiting(_) => f.write_str("Waiting"),
            Self::Refused(text) => f.debug_tuple("Refused").field(text).finish(),
        }
    }
}

/// Takes back a request that waits for mailbox space; it is dropped without being delivered.
pub trait Withdraw: Send + 'static {
    /// Removes the request from the wait: `true` if it was still waiting (and is dropped
    /// undelivered), `false` if it got into the mailbox meanwhile ([`Responder::enqueued`] is
    /// called or on its way).
    fn withdraw(self: Box<Self>) -> bool;
}

/// Where the answer to one inbound request goes (implemented by each transport).
pub trait Responder: Send + 'static {
    /// A request that waited for mailbox space is now in the mailbox.
    ///
    /// Called from whichever thread freed the space, possibly while the mailbox is locked:
    /// it must only hand the news on (send a message, wake a task), never block or call back
    /// into the node.
    fn enqueued(&self);

    /// The answer to an ask, or the failure of an ask or a tell (`Err(text)` reaches the peer
    /// as a remote error carrying `text`). For a tell, `Ok` answers are ignored.
    fn respond(self: Box<Self>, answer: Result<Reply, String>);
}

/// The transport side of sending: the node hands over a request and a completion.
pub trait Outbound: Send + Sync + 'static {
    /// Starts sending `request`; its outcome goes to `request.completion`, exactly once.
    fn send(&self, request: OutboundRequest);
}

/// One request for a transport to carry.
#[non_exhaustive]
pub struct OutboundRequest {
    /// Where to.
    pub peer: SocketAddr,
    /// Which endpoint there.
    pub path: ActorPath,
    /// Ask or tell.
    pub kind: RequestKind,
    /// The message (buffers are shared, never copied).
    pub message: TensorMessage,
    /// When to give up.
    pub deadline: Deadline,
    /// Where the outcome goes.
    pub completion: Box<dyn Completion>,
    /// How it travels: whole (the default), or as a stripe or striped request of a striped
    /// send ([`crate::stripe`]). Only PTR1 drivers carry the striped forms.
    pub framing: crate::stripe::Framing,
    /// How many requests the peer takes on one connection before it has answered the first,
    /// as it said in its capabilities (1, the default: one at a time). PTR1 drivers pipeline
    /// small requests up to it; other transports ignore it.
    pub pipeline: u16,
}

impl OutboundRequest {
    /// Bundles a request.
    pub fn new(
        peer: SocketAddr,
        path: ActorPath,
        kind: RequestKind,
        message: TensorMessage,
        deadline: Deadline,
        completion: Box<dyn Completion>,
    ) -> Self {
        Self {
            peer,
            path,
            kind,
            message,
            deadline,
            completion,
            framing: crate::stripe::Framing::Whole,
            pipeline: 1,
        }
    }

    /// The same request, to a peer that takes `depth` requests on one connection at once.
    #[must_use]
    pub fn with_pipeline(mut self, depth: u16) -> Self {
        self.pipeline = depth.max(1);
        self
    }

    /// The same request, travelling as `framing`.
    #[must_use]
    pub fn with_framing(mut self, framing: crate::stripe::Framing) -> Self {
        self.framing = framing;
        self
    }
}

impl std::fmt::Debug for OutboundRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboundRequest")
            .field("peer", &self.peer)
            .field("path", &self.path)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// Receives the outcome of one outbound request.
pub trait Completion: Send + 'static {
    /// The outcome; called exactly once.
    fn complete(self: Box<Self>, outcome: Result<Answer, Error>);

    /// Whether the caller gave up on the request (its handle was dropped): a transport that
    /// has not sent it yet drops it, one that is sending it gives it up (a PTR1 connection
    /// reads and drops its reply if others are on their way behind it, or closes).
    fn is_cancelled(&self) -> bool;

    /// Asks to be told (by running `hook`, on whatever thread gives up) when the caller gives
    /// up; runs it at once if it already has. A transport registers this once the request is
    /// on a connection, to close it promptly.
    fn on_cancel(&self, hook: Box<dyn FnOnce() + Send>) {
        let _ = hook;
    }

    /// Told which path carries the request (the node calls it when it hands the request to a
    /// transport, again if the request moves to another): the caller learns from it what
    /// memory the reply is in.
    fn routed(&self, route: crate::route::Route) {
        let _ = route;
    }
}

/// Takes over connections whose first bytes are not `PTR1` (a TLS ClientHello, an HTTP/2
/// preface), together with those bytes.
pub trait HandOff: Send + Sync + 'static {
    /// Takes the connection; `already_read` are the bytes read from it so far (at least four,
    /// in order), which the new owner must treat as the start of the stream.
    fn hand_off(&self, stream: TcpStream, already_read: Vec<u8>);
}

/// A running PTR1 driver: it serves a node's listener and carries its outbound requests.
pub trait Driver: Outbound {
    /// `"io_uring"`, `"tokio"`, …
    fn name(&self) -> &'static str;

    /// What the driver holds now (for statistics).
    fn gauges(&self) -> DriverGauges {
        DriverGauges::default()
    }

    /// Begins a graceful close (idempotent, returns at once): stops accepting connections;
    /// each served connection finishes the request it has (its reply or acknowledgement is
    /// written in full), then closes. Requests that start meanwhile are the node's to refuse
    /// (its [`Inbound::admit`]). Outbound requests go on. [`Driver::drained`] says when no
    /// served connection is left; [`Driver::shutdown`] ends the rest. A driver without a
    /// graceful close keeps the default: nothing, and drained at once.
    fn drain(&self) {}

    /// Whether a close begun with [`Driver::drain`] has closed every served connection.
    fn drained(&self) -> bool {
        true
    }

    /// Stops accepting, fails every request in flight, closes every connection and waits
    /// (bounded) for its threads. Idempotent.
    fn shutdown(&self);
}

/// What a running driver holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DriverGauges {
    /// Open connections (server and client).
    pub connections: usize,
    /// Connection deadlines queued.
    pub timers: usize,
    /// Operations the kernel (or the runtime) still has.
    pub operations: usize,
    /// Peers with pooled connections or waiting requests.
    pub peers: usize,
    /// Requests waiting for a connection to their peer (at its connection cap).
    pub waiting: usize,
    /// Driver threads out of the driver now after a failure (their ring failed, or recovering
    /// from a panic did; the log says why), not restarted (yet, or any more): the others carry
    /// the node's requests.
    pub failed_cores: usize,
    /// Times a failed driver thread was restarted (io_uring: a new core on a new ring, at most
    /// 3 times a minute per thread).
    pub core_restarts: usize,
}

/// Starts a PTR1 driver for a node: how the tokio fallback (or any other driver) is plugged in.
pub trait DriverFactory: Send + Sync + 'static {
    /// The name of the drivers it starts.
    fn name(&self) -> &'static str;

    /// Starts a driver on the node's listener.
    ///
    /// # Errors
    ///
    /// Whatever stopped it from starting.
    fn start(&self, setup: DriverSetup) -> Result<Box<dyn Driver>, Error>;
}

/// Everything a driver needs from its node.
#[non_exhaustive]
pub struct DriverSetup {
    /// The node's listening socket (already bound and listening).
    pub listener: TcpListener,
    /// Where received requests go.
    pub inbound: Arc<dyn Inbound>,
    /// Where received payload goes.
    pub memory: Arc<dyn ReceiveMemory>,
    /// Where connections that do not start with `PTR1` go (closed if `None`).
    pub handoff: Option<Arc<dyn HandOff>>,
    /// Deadlines and receive windows of every connection.
    pub session: Arc<SessionConfig>,
    /// Client connection pools.
    pub pool: ConnectionPoolConfig,
    /// Limits of encoded frames.
    pub limits: Limits,
    /// Threads the driver may use for I/O.
    pub threads: usize,
    /// Refuse plaintext PTR1 connections (only handed-off connections are served).
    pub require_tls: bool,
    /// Where striped requests' stripes go (every server session gets it with
    /// `ServerSession::with_stripes`); `None`: the node takes no stripes.
    pub stripes: Option<Arc<super::stripes::StripeStore>>,
}

impl DriverSetup {
    /// A setup with the given parts and the defaults for the rest.
    pub fn new(
        listener: TcpListener,
        inbound: Arc<dyn Inbound>,
        memory: Arc<dyn ReceiveMemory>,
        session: Arc<SessionConfig>,
    ) -> Self {
        Self {
            listener,
            inbound,
            memory,
            handoff: None,
            limits: session.limits,
            session,
            pool: ConnectionPoolConfig::default(),
            threads: 1,
            require_tls: false,
            stripes: None,
        }
    }
}

impl std::fmt::Debug for DriverSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriverSetup")
            .field("listener", &self.listener)
            .field("threads", &self.threads)
            .field("require_tls", &self.require_tls)
            .finish_non_exhaustive()
    }
}
