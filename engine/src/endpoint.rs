//! Endpoints: a bounded mailbox per actor path, and what travels through it.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_proto::TensorMessage;

use crate::Error;
use crate::completion::Completer;
use crate::remote_reply::RemoteReply;

/// Whether a request expects a reply message (ask) or only an acknowledgement (tell).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// Waits for the handler's reply.
    Ask,
    /// Acknowledged once enqueued; the handler's result is not sent back.
    Tell,
}

/// A request as an endpoint receives it.
#[derive(Debug)]
pub struct Request {
    /// The actor path it was sent to (e.g. `/actors/echo`).
    pub path: String,
    /// Ask or tell.
    pub kind: RequestKind,
    /// The message. Buffers from the network are in receive-pool memory; buffers from this
    /// process are the sender's own (no copy).
    pub message: TensorMessage,
}

/// A handler's answer to an ask.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// A tensor message (sent as TensorResponse).
    Tensor(TensorMessage),
    /// An ordinary message: a type name and opaque data (sent as SingleResponse).
    Single {
        /// The message type.
        msg_type: String,
        /// The data.
        data: Bytes,
    },
}

/// A request taken from a mailbox, with the means to answer it.
///
/// For an ask, call [`Incoming::reply`] (or [`Replier::reply`] after [`Incoming::into_parts`]);
/// dropping it unanswered sends the asker an error ("endpoint dropped the request without
/// replying") so nobody waits forever.
#[derive(Debug)]
pub struct Incoming {
    request: Request,
    replier: Replier,
}

/// Answers one ask (does nothing for a tell).
#[derive(Debug)]
pub struct Replier {
    responder: Option<Responder>,
}

#[derive(Debug)]
pub(crate) enum Responder {
    /// The asker is on the network (see `RemoteReply`).
    Remote(RemoteReply),
    /// The asker is in this process.
    Local(Completer<Reply>),
}

impl Incoming {
    pub(crate) fn new(request: Request, responder: Option<Responder>) -> Self {
        Self {
            request,
            replier: Replier { responder },
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
}

impl Replier {
    /// Sends the answer. `Err(text)` reaches the asker as a remote error carrying `text`.
    pub fn reply(mut self, result: Result<Reply, String>) {
        if let Some(responder) = self.responder.take() {
            responder.send(result);
        }
    }
}

impl Drop for Replier {
    fn drop(&mut self) {
        if let Some(responder) = self.responder.take() {
            responder.send(Err(
                "endpoint dropped the request without replying".to_owned()
            ));
        }
    }
}

impl Responder {
    fn send(self, result: Result<Reply, String>) {
        match self {
            Self::Remote(reply) => reply.send(result),
            Self::Local(completer) => {
                completer.complete(result.map_err(|text| Error::Remote { text }))
            }
        }
    }
}

/// A bounded queue of requests for one endpoint.
#[derive(Debug)]
pub(crate) struct Mailbox {
    state: Mutex<MailboxState>,
    not_empty: Condvar,
    not_full: Condvar,
    capacity: usize,
}

type SpaceWaiter = Box<dyn FnOnce() + Send>;

struct MailboxState {
    queue: VecDeque<Incoming>,
    /// Core threads waiting for space (they must not block); called once each.
    space_waiters: VecDeque<SpaceWaiter>,
    closed: bool,
    /// Threads blocked in `pop` / `push_until`: a condition variable is signalled only if
    /// someone waits on it (a signal is a system call even when nobody does).
    takers_waiting: usize,
    pushers_waiting: usize,
}

impl std::fmt::Debug for MailboxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MailboxState")
            .field("queued", &self.queue.len())
            .field("space_waiters", &self.space_waiters.len())
            .field("closed", &self.closed)
            .finish()
    }
}

/// The outcome of a non-blocking push.
pub(crate) enum TryPush {
    Pushed,
    /// Full: the item is handed back and `on_space` will be called once when space frees up.
    Full(Incoming),
    Closed(Incoming),
}

impl Mailbox {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            state: Mutex::new(MailboxState {
                queue: VecDeque::new(),
                space_waiters: VecDeque::new(),
                closed: false,
                takers_waiting: 0,
                pushers_waiting: 0,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            capacity: capacity.max(1),
        }
    }

    /// Pushes without blocking (for core threads).
    pub(crate) fn try_push(
        &self,
        item: Incoming,
        on_space: impl FnOnce() + Send + 'static,
    ) -> TryPush {
        let mut state = self.lock();
        if state.closed {
            return TryPush::Closed(item);
        }
        if state.queue.len() >= self.capacity {
            state.space_waiters.push_back(Box::new(on_space));
            return TryPush::Full(item);
        }
        state.queue.push_back(item);
        let wake = state.takers_waiting > 0;
        drop(state);
        if wake {
            self.not_empty.notify_one();
        }
        TryPush::Pushed
    }

    /// Pushes, blocking while the mailbox is full, until `deadline` (for user threads).
    pub(crate) fn push_until(&self, item: Incoming, deadline: Instant) -> Result<(), Error> {
        let mut state = self.lock();
        loop {
            if state.closed {
                return Err(Error::MailboxClosed);
            }
            if state.queue.len() < self.capacity {
                state.queue.push_back(item);
                let wake = state.takers_waiting > 0;
                drop(state);
                if wake {
                    self.not_empty.notify_one();
                }
                return Ok(());
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return Err(Error::Timeout {
                    what: "waiting for mailbox space",
                    after: Duration::ZERO,
                });
            };
            state.pushers_waiting += 1;
            state = self
                .not_full
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            state.pushers_waiting -= 1;
        }
    }

    /// Takes the oldest request, waiting up to `timeout`. `Ok(None)` on timeout.
    pub(crate) fn pop(&self, timeout: Option<Duration>) -> Result<Option<Incoming>, Error> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut state = self.lock();
        loop {
            if let Some(item) = state.queue.pop_front() {
                let waiter = state.space_waiters.pop_front();
                let wake = state.pushers_waiting > 0;
                drop(state);
                if wake {
                    self.not_full.notify_one();
                }
                if let Some(waiter) = waiter {
                    waiter();
                }
                return Ok(Some(item));
            }
            if state.closed {
                return Err(Error::MailboxClosed);
            }
            let left = match deadline {
                None => None,
                Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                    Some(left) => Some(left),
                    None => return Ok(None),
                },
            };
            state.takers_waiting += 1;
            state = match left {
                None => self
                    .not_empty
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(left) => {
                    self.not_empty
                        .wait_timeout(state, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
            state.takers_waiting -= 1;
        }
    }

    /// Closes the mailbox: queued asks are answered with an error, waiters are woken.
    pub(crate) fn close(&self) {
        let (queued, waiters) = {
            let mut state = self.lock();
            state.closed = true;
            (
                std::mem::take(&mut state.queue),
                std::mem::take(&mut state.space_waiters),
            )
        };
        self.not_empty.notify_all();
        self.not_full.notify_all();
        drop(queued);
        waiters.into_iter().for_each(|waiter| waiter());
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().queue.len()
    }

    fn lock(&self) -> MutexGuard<'_, MailboxState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An endpoint the user pulls requests from (see [`crate::Node::endpoint`]).
///
/// Dropping it unregisters the path and closes the mailbox.
#[derive(Debug)]
pub struct Endpoint {
    pub(crate) path: String,
    pub(crate) mailbox: Arc<Mailbox>,
    pub(crate) registry: std::sync::Weak<crate::node::Registry>,
}

impl Endpoint {
    /// The actor path (`/actors/{name}`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The next request, waiting up to `timeout`; `Ok(None)` if none arrived in time.
    ///
    /// # Errors
    ///
    /// [`Error::MailboxClosed`] once the node shut down.
    pub fn recv(&self, timeout: Duration) -> Result<Option<Incoming>, Error> {
        self.mailbox.pop(Some(timeout))
    }

    /// Requests waiting in the mailbox now.
    pub fn queued(&self) -> usize {
        self.mailbox.len()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(registry) = self.registry.upgrade() {
            registry.remove(&self.path);
        }
        self.mailbox.close();
    }
}
