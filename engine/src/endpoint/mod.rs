//! Endpoints: a bounded mailbox per actor path, what travels through it, and how requests
//! are served (pulled, handler threads, or handlers on the core).

mod handler;
mod local;
mod mailbox;
mod registry;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use tensorwire_proto::TensorMessage;
use tensorwire_proto::transport::{Error, InboundRequest, Reply, RequestKind, Responder};

pub(crate) use handler::{Handler, spawn_handler_threads};

use crate::fork::Birth;
use crate::inflight::InFlight;
pub(crate) use local::{LocalResponder, SharedCompleter};
pub(crate) use mailbox::{Mailbox, Push};
pub(crate) use registry::{Registry, Served};

/// A request as an endpoint receives it.
#[derive(Debug)]
#[non_exhaustive]
pub struct Request {
    /// The actor path it was sent to (e.g. `/actors/echo`).
    pub path: String,
    /// Ask or tell.
    pub kind: RequestKind,
    /// The message. Buffers from the network are in receive-pool memory; buffers from this
    /// process are the sender's own (no copy).
    pub message: TensorMessage,
    /// Where it came from, when it crossed a socket.
    pub peer: Option<SocketAddr>,
    /// The peer's authenticated identity (TLS client certificate), if any.
    pub identity: Option<String>,
    /// The peer process, as the kernel reports it, when the request came over shared memory
    /// from this host (its buffers are then read-only views of the peer's memory).
    pub local_peer: Option<tensorwire_proto::transport::LocalPeer>,
}

impl From<InboundRequest> for Request {
    fn from(request: InboundRequest) -> Self {
        Self {
            path: request.path,
            kind: request.kind,
            message: request.message,
            peer: request.peer,
            identity: request.identity,
            local_peer: request.local_peer,
        }
    }
}

/// A request taken from a mailbox, with the means to answer it.
///
/// For an ask, call [`Incoming::reply`] (or [`Replier::reply`] after [`Incoming::into_parts`]);
/// dropping it unanswered sends the asker an error ("endpoint dropped the request without
/// replying") so nobody waits forever. A tell was acknowledged when it entered the mailbox;
/// its answer goes nowhere.
#[derive(Debug)]
pub struct Incoming {
    request: Request,
    replier: Replier,
    /// Its place in its mailbox's order (set when it enters the queue), so requests put back
    /// return to where they were.
    pub(crate) seq: u64,
}

/// Answers one ask (does nothing for a tell).
pub struct Replier {
    responder: Option<Box<dyn Responder>>,
    /// Counts the request as in flight for a graceful close: an ask until it is answered, a
    /// tell until it is taken from the mailbox.
    in_flight: Option<InFlight>,
}

impl std::fmt::Debug for Replier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replier")
            .field("answered", &self.responder.is_none())
            .finish()
    }
}

impl Incoming {
    pub(crate) fn new(
        request: Request,
        responder: Box<dyn Responder>,
        in_flight: Option<InFlight>,
    ) -> Self {
        Self {
            request,
            replier: Replier {
                responder: Some(responder),
                in_flight,
            },
            seq: 0,
        }
    }

    /// The request.
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// Splits into the request (owned, so its buffers can be sent back without a copy) and the
    /// means to answer it.
    pub fn into_parts(self) -> (Request, Replier) {
        (self.request, self.replier)
    }

    /// Answers an ask (a tell ignores the answer). `Err(text)` reaches the asker as a remote
    /// error carrying `text`.
    pub fn reply(self, result: Result<Reply, String>) {
        self.replier.reply(result);
    }

    /// The request entered the mailbox (`waited`: after waiting for space, so its sender is
    /// told now). A tell's sender needs nothing more.
    fn settle(&mut self, waited: bool) {
        if waited {
            if let Some(responder) = &self.replier.responder {
                responder.enqueued();
            }
        }
        if self.request.kind == RequestKind::Tell {
            self.replier.responder = None;
        }
    }

    /// Taken out of the mailbox: a tell is no longer in flight (its sender was acknowledged
    /// when it got in); an ask is until it is answered.
    pub(crate) fn taken(&mut self) {
        if self.request.kind == RequestKind::Tell {
            self.replier.in_flight = None;
        }
    }

    /// Forgets the sender: the request is dropped without anyone being told.
    pub(crate) fn disarm(mut self) {
        self.replier.responder = None;
    }
}

impl Replier {
    /// Sends the answer. `Err(text)` reaches the asker as a remote error carrying `text`.
    pub fn reply(mut self, result: Result<Reply, String>) {
        if let Some(responder) = self.responder.take() {
            responder.respond(result);
        }
    }
}

impl Drop for Replier {
    fn drop(&mut self) {
        if let Some(responder) = self.responder.take() {
            responder.respond(Err(
                "endpoint dropped the request without replying".to_owned()
            ));
        }
    }
}

/// An endpoint the user pulls requests from (see [`crate::Node::endpoint`]).
///
/// Dropping it unregisters the path and closes the mailbox (queued asks are answered with an
/// error).
#[derive(Debug)]
pub struct Endpoint {
    pub(crate) path: String,
    pub(crate) mailbox: Arc<Mailbox>,
    pub(crate) registry: Weak<Registry>,
    /// The process that made it (a child made by `fork()` cannot use it).
    pub(crate) birth: Birth,
}

impl Endpoint {
    /// The actor path (`/actors/{name}`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The next request, as a future any executor can await.
    ///
    /// # Errors
    ///
    /// The future fails with [`Error::MailboxClosed`] once the node shut down, and with
    /// [`Error::Forked`] in a child made by `fork()` since the endpoint was made.
    pub fn recv(&self) -> Recv<'_> {
        Recv {
            mailbox: &self.mailbox,
            birth: self.birth,
        }
    }

    /// The next request, blocking the calling thread up to `timeout` (`None`: until one
    /// arrives); `Ok(None)` if none arrived in time.
    ///
    /// # Errors
    ///
    /// [`Error::MailboxClosed`] once the node shut down; [`Error::Forked`] in a child made by
    /// `fork()` since the endpoint was made.
    pub fn recv_blocking(&self, timeout: Option<Duration>) -> Result<Option<Incoming>, Error> {
        self.birth.check()?;
        self.mailbox.pop(timeout)
    }

    /// [`Endpoint::recv_blocking`], polling for up to `spin` before it sleeps — for a thread
    /// that answers a steady stream of requests: while it polls, an arriving request wakes no
    /// sleeping thread.
    ///
    /// # Errors
    ///
    /// As [`Endpoint::recv_blocking`].
    pub fn recv_spinning(
        &self,
        spin: Duration,
        timeout: Option<Duration>,
    ) -> Result<Option<Incoming>, Error> {
        self.birth.check()?;
        self.mailbox.pop_spinning(spin, timeout)
    }

    /// Requests waiting in the mailbox now.
    pub fn queued(&self) -> usize {
        self.mailbox.len()
    }

    /// Puts a request taken from this endpoint back into its mailbox where it was, ahead of
    /// every request that entered after it (its receiver gave up after taking it, e.g. a
    /// cancelled asyncio receive): receivers waiting now are woken, and a graceful close waits
    /// for it again. It may take the mailbox past its capacity by one (it was counted when it
    /// got in). Once the node shut down it is dropped instead (an ask's asker is told). In a
    /// child made by `fork()` it is forgotten, like everything of the parent's.
    pub fn put_back(&self, mut incoming: Incoming) {
        if self.birth.is_inherited() {
            std::mem::forget(incoming);
            return;
        }
        // A tell stopped counting for a graceful close when it was taken: queued again, it
        // counts again (a close waits for it).
        if incoming.replier.in_flight.is_none() {
            incoming.replier.in_flight = self.registry.upgrade().map(|r| r.enter());
        }
        self.mailbox.put_back(incoming);
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if self.birth.is_inherited() {
            // A copy a fork made: the registry and the mailbox belong to the parent's threads
            // (their locks may be held for good here). Leak them.
            std::mem::forget(Arc::clone(&self.mailbox));
            return;
        }
        if let Some(registry) = self.registry.upgrade() {
            registry.remove(&self.path);
        }
        self.mailbox.close();
    }
}

/// The future of [`Endpoint::recv`].
#[derive(Debug)]
#[must_use = "futures do nothing unless awaited"]
pub struct Recv<'a> {
    mailbox: &'a Mailbox,
    birth: Birth,
}

impl Future for Recv<'_> {
    type Output = Result<Incoming, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Err(e) = self.birth.check() {
            return Poll::Ready(Err(e));
        }
        self.mailbox.poll_pop(cx)
    }
}
