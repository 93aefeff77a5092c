//! The endpoints of a node by actor path: the node's side of every inbound transport.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::sync::{read, write};

use tensorwire_proto::transport::{
    ActorPath, Delivery, Error, Inbound, InboundRequest, NO_ENDPOINT, RequestKind, Responder,
    Withdraw,
};

use crate::endpoint::handler::{self, Handler};
use crate::endpoint::{Incoming, Mailbox, Push, Request};
use crate::inflight::{InFlight, InFlightCount};
use tensorwire_proto::fast_hash::FastHash;

/// How an endpoint's requests are served.
#[derive(Clone)]
pub(crate) enum Served {
    /// Taken from the mailbox by the user ([`crate::Endpoint`]) or by handler threads.
    Mailbox,
    /// By a handler run on the thread that received the request (a core thread for network
    /// requests): no mailbox, no thread hop.
    OnCore(Arc<Handler>),
}

struct Entry {
    mailbox: Arc<Mailbox>,
    served: Served,
}

/// The endpoints of one node.
pub(crate) struct Registry {
    endpoints: RwLock<HashMap<String, Arc<Entry>, FastHash>>,
    mailbox_capacity: usize,
    /// Requests that may wait for space in each mailbox.
    waiting_capacity: usize,
    /// The node closes gracefully: no new request is admitted.
    closing: AtomicBool,
    /// Requests in a mailbox, and asks taken and not answered yet.
    in_flight: InFlightCount,
    closed: AtomicBool,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = read(&self.endpoints).len();
        f.debug_struct("Registry")
            .field("endpoints", &count)
            .finish()
    }
}

impl Registry {
    /// Endpoints whose mailboxes hold `mailbox_capacity` requests, and `waiting_capacity` more
    /// that wait for space.
    pub(crate) fn new(mailbox_capacity: usize, waiting_capacity: usize) -> Self {
        Self {
            endpoints: RwLock::new(HashMap::default()),
            mailbox_capacity,
            waiting_capacity,
            closing: AtomicBool::new(false),
            in_flight: InFlightCount::default(),
            closed: AtomicBool::new(false),
        }
    }

    /// Registers `path`; its mailbox.
    pub(crate) fn insert(&self, path: &ActorPath, served: Served) -> Result<Arc<Mailbox>, Error> {
        self.insert_with_capacity(path, served, self.mailbox_capacity)
    }

    /// [`Registry::insert`] with a mailbox of `capacity` requests instead of the node's default.
    pub(crate) fn insert_with_capacity(
        &self,
        path: &ActorPath,
        served: Served,
        capacity: usize,
    ) -> Result<Arc<Mailbox>, Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Shutdown);
        }
        let mut endpoints = write(&self.endpoints);
        if endpoints.contains_key(path.as_str()) {
            return Err(Error::EndpointExists {
                path: path.to_string(),
            });
        }
        let mailbox = Arc::new(Mailbox::new(capacity.max(1), self.waiting_capacity));
        let entry = Entry {
            mailbox: Arc::clone(&mailbox),
            served,
        };
        endpoints.insert(path.to_string(), Arc::new(entry));
        Ok(mailbox)
    }

    pub(crate) fn remove(&self, path: &str) {
        let removed = write(&self.endpoints).remove(path);
        drop(removed); // outside the lock
    }

    /// Admits no new request from now on (a graceful close): what was admitted is still
    /// delivered and answered.
    pub(crate) fn start_closing(&self) {
        self.closing.store(true, Ordering::Release);
    }

    /// Counts one more request in flight (a tell put back into a mailbox), until dropped.
    pub(crate) fn enter(&self) -> InFlight {
        self.in_flight.enter()
    }

    /// Requests waiting in a mailbox, and asks taken but not answered yet.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.get()
    }

    /// Whether a request of `kind` for `path` is taken now; the error says why not.
    pub(crate) fn admit_error(&self, path: &str) -> Option<Error> {
        if self.closed.load(Ordering::Acquire) {
            return Some(Error::Shutdown);
        }
        if self.closing.load(Ordering::Acquire) {
            return Some(Error::Remote {
                peer: None,
                text: CLOSING.to_owned(),
            });
        }
        match self.lookup(path) {
            Some(_) => None,
            None => Some(Error::UnknownEndpoint {
                path: path.to_owned(),
            }),
        }
    }

    /// Closes every mailbox (shutdown); queued asks are answered with an error.
    pub(crate) fn close_all(&self) {
        self.closed.store(true, Ordering::Release);
        let endpoints = std::mem::take(&mut *write(&self.endpoints));
        endpoints.values().for_each(|entry| entry.mailbox.close());
    }

    fn lookup(&self, path: &str) -> Option<Arc<Entry>> {
        read(&self.endpoints).get(path).cloned()
    }
}

fn unknown(path: &str) -> String {
    format!("{NO_ENDPOINT}{path:?}")
}

/// What a request gets that arrives while its node closes.
const CLOSING: &str = "the node is closing: it finishes the requests it has and takes no new ones";

impl Inbound for Registry {
    fn admit(&self, _kind: RequestKind, path: &str) -> Result<(), String> {
        match self.admit_error(path) {
            None => Ok(()),
            Some(Error::Remote { text, .. }) => Err(text),
            Some(Error::UnknownEndpoint { path }) => Err(unknown(&path)),
            Some(error) => Err(error.to_string()),
        }
    }

    fn deliver(&self, request: InboundRequest, responder: Box<dyn Responder>) -> Delivery {
        self.deliver_or_refuse(request, responder)
            .unwrap_or_else(|refusal| Delivery::Refused(refusal.to_string()))
    }
}

impl Registry {
    /// [`Inbound::deliver`] with the refusal as an error (the in-process path hands it to the
    /// caller as it is).
    pub(crate) fn deliver_or_refuse(
        &self,
        request: InboundRequest,
        responder: Box<dyn Responder>,
    ) -> Result<Delivery, Error> {
        let Some(entry) = self.lookup(&request.path) else {
            return Err(Error::UnknownEndpoint { path: request.path });
        };
        match &entry.served {
            Served::OnCore(handler) => {
                let kind = request.kind;
                let result = handler::run(&**handler, Request::from(request));
                if kind == RequestKind::Ask {
                    responder.respond(result);
                }
                Ok(Delivery::Enqueued)
            }
            Served::Mailbox => {
                match entry.mailbox.push(Incoming::new(
                    Request::from(request),
                    responder,
                    Some(self.in_flight.enter()),
                )) {
                    Push::Pushed => Ok(Delivery::Enqueued),
                    Push::Waiting(ticket) => Ok(Delivery::Waiting(Box::new(Ticket {
                        mailbox: Arc::clone(&entry.mailbox),
                        ticket,
                    }))),
                    Push::Closed(incoming) => {
                        incoming.disarm();
                        Err(Error::MailboxClosed)
                    }
                    Push::Full(incoming) => {
                        incoming.disarm();
                        Err(entry.mailbox.full_error())
                    }
                }
            }
        }
    }
}

/// A request waiting for mailbox space, for its transport to withdraw.
struct Ticket {
    mailbox: Arc<Mailbox>,
    ticket: u64,
}

impl Withdraw for Ticket {
    fn withdraw(self: Box<Self>) -> bool {
        match self.mailbox.withdraw(self.ticket) {
            Some(incoming) => {
                incoming.disarm();
                true
            }
            None => false,
        }
    }
}
