//! How other threads reach a core: a bounded queue of new requests (its memory taken as
//! requests queue, not at start: a bound of 65,536 preallocated would commit ~10 MiB per core
//! before the first request), an unbounded queue of
//! events about requests it already carries (bounded in practice by its connections: one
//! request each), and an eventfd the core keeps a read armed on, written only when the core is
//! about to sleep. A core posting to itself (a handler run on the core) skips both.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, SendError, Sender, TryRecvError};
use tensorwire_proto::session::{ClientRequest, WaiterId};
use tensorwire_proto::transport::{Completion, Error, Reply};

use crate::sync::lock;
use crate::sys;
use crate::uring::conn::ConnKey;

/// A request for a core to carry.
pub(crate) struct Outgoing {
    pub(crate) peer: SocketAddr,
    pub(crate) request: ClientRequest,
    pub(crate) completion: Box<dyn Completion>,
}

/// News about a request a core carries or serves.
pub(crate) enum Event {
    /// A served request that waited for mailbox space got in.
    Enqueued { conn: ConnKey, seq: u64 },
    /// The answer to a served request.
    Answer {
        conn: ConnKey,
        seq: u64,
        answer: Result<Reply, String>,
    },
    /// The caller of a carried request gave up.
    Cancel { conn: ConnKey, request: u64 },
    /// The caller of a request waiting for a connection gave up.
    CancelWaiting { id: WaiterId },
    /// A connection another core accepted, for this one to serve.
    Adopt(OwnedFd),
    /// Close gracefully: accept nothing more, close each served connection once its request
    /// is answered (`CoreShared::draining` says so too, for a core restarted meanwhile).
    Drain,
    /// Fail everything, close every connection, stop.
    Shutdown,
    /// A fault for the driver's tests to inject.
    #[cfg(test)]
    Fault(Fault),
}

/// Faults the driver's tests inject into a core (through [`Event::Fault`]).
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The next turn fails as if the ring had.
    RingError,
    /// As `RingError`, and the core thread then stalls for 200 ms before its ring goes (as a
    /// thread the scheduler preempts there would).
    RingErrorThenStall,
    /// The next turn panics (once).
    Panic,
    /// The next turn panics, and so does the recovery from it.
    PanicInRecovery,
}

/// The way into a core from any thread (cheap to clone).
#[derive(Clone)]
pub(crate) struct CoreHandle {
    pub(crate) shared: Arc<CoreShared>,
}

pub(crate) struct CoreShared {
    requests: Sender<Outgoing>,
    /// Requests in `requests`, for its bound.
    queued: Arc<AtomicUsize>,
    events: Sender<Event>,
    pub(crate) capacity: usize,
    /// Written to wake the core; a blocking eventfd the core keeps a READ armed on.
    pub(crate) wake: Arc<OwnedFd>,
    /// Set by the core just before it waits; whoever clears it must write the eventfd.
    pub(crate) sleeping: AtomicBool,
    /// Gauges for statistics, updated by the core.
    pub(crate) connections: AtomicUsize,
    /// When the core's two connections that moved bytes last did so (`poll_policy::stamp`;
    /// 0: none), for the other cores' busy-poll decision.
    pub(crate) recent_io: [AtomicU64; 2],
    pub(crate) timers: AtomicUsize,
    pub(crate) operations: AtomicUsize,
    pub(crate) peers: AtomicUsize,
    pub(crate) waiting: AtomicUsize,
    /// Whether the core is out of the driver (it failed, and is not restarted or not yet):
    /// the driver sends it nothing while it is.
    failed: AtomicBool,
    /// Why it failed (its ring failed, or recovering from a panic panicked).
    failure: Mutex<Option<String>>,
    /// How often the core was restarted after a failure.
    pub(crate) restarts: AtomicUsize,
    /// The driver closes gracefully ([`Event::Drain`]).
    pub(crate) draining: AtomicBool,
    /// Served connections the core holds (updated with the gauges).
    pub(crate) serving: AtomicUsize,
    /// The core has seen the drain and published `serving` since (set with the gauges).
    pub(crate) drain_seen: AtomicBool,
}

impl CoreShared {
    /// The error for a request this core cannot carry because it failed.
    pub(crate) fn failed_error(&self) -> Option<Error> {
        self.failure().map(|reason| Error::DriverFailed {
            driver: "io_uring",
            reason,
        })
    }

    /// Whether the core is out of the driver.
    pub(crate) fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Why the core is out of the driver, if it is.
    pub(crate) fn failure(&self) -> Option<String> {
        if !self.is_failed() {
            return None;
        }
        lock(&self.failure).clone()
    }

    /// Takes the core out of the driver, for `reason`.
    pub(crate) fn set_failed(&self, reason: String) {
        *lock(&self.failure) = Some(reason);
        self.failed.store(true, Ordering::Release);
    }

    /// Whether the core closed every served connection after a drain (or is out of the
    /// driver: a failed core serves nothing).
    pub(crate) fn is_drained(&self) -> bool {
        self.is_failed()
            || (self.drain_seen.load(Ordering::Acquire)
                && self.serving.load(Ordering::Acquire) == 0)
    }

    /// Puts a restarted core back into the driver.
    pub(crate) fn revive(&self) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
        self.failed.store(false, Ordering::Release);
        *lock(&self.failure) = None;
    }
}

/// The receiving ends, owned by the core (a clone waits on the core's thread for a core
/// restarted after a failure).
#[derive(Clone)]
pub(crate) struct Inbox {
    pub(crate) requests: Requests,
    pub(crate) events: Receiver<Event>,
}

/// The receiving end of a core's request queue.
#[derive(Clone)]
pub(crate) struct Requests {
    queue: Receiver<Outgoing>,
    queued: Arc<AtomicUsize>,
}

impl Requests {
    /// The next queued request, if any.
    pub(crate) fn try_recv(&self) -> Result<Outgoing, TryRecvError> {
        let outgoing = self.queue.try_recv()?;
        self.queued.fetch_sub(1, Ordering::AcqRel);
        Ok(outgoing)
    }

    /// Whether none is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

thread_local! {
    /// On a core thread: its identity and the events it posted to itself.
    static SELF_POSTED: RefCell<Option<(usize, Vec<Event>)>> = const { RefCell::new(None) };
}

impl CoreHandle {
    pub(crate) fn new(capacity: usize) -> Result<(Self, Inbox), Error> {
        let (requests, requests_rx) = crossbeam_channel::unbounded();
        let queued = Arc::new(AtomicUsize::new(0));
        let (events, events_rx) = crossbeam_channel::unbounded();
        let wake = sys::eventfd_blocking().map_err(|e| Error::io("eventfd", e))?;
        let shared = Arc::new(CoreShared {
            requests,
            queued: Arc::clone(&queued),
            events,
            capacity: capacity.max(1),
            wake: Arc::new(wake),
            sleeping: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            recent_io: [AtomicU64::new(0), AtomicU64::new(0)],
            timers: AtomicUsize::new(0),
            operations: AtomicUsize::new(0),
            peers: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            restarts: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            serving: AtomicUsize::new(0),
            drain_seen: AtomicBool::new(false),
        });
        let inbox = Inbox {
            requests: Requests {
                queue: requests_rx,
                queued,
            },
            events: events_rx,
        };
        Ok((Self { shared }, inbox))
    }

    /// Queues a request; one that finds the queue full (or the core stopped) fails at once.
    pub(crate) fn submit(&self, outgoing: Outgoing) {
        let shared = &self.shared;
        if shared.queued.fetch_add(1, Ordering::AcqRel) >= shared.capacity {
            shared.queued.fetch_sub(1, Ordering::AcqRel);
            let error = Error::Overloaded {
                what: "the core's request queue",
                capacity: shared.capacity,
            };
            return outgoing.completion.complete(Err(error));
        }
        match shared.requests.send(outgoing) {
            Ok(()) => self.wake(),
            Err(SendError(outgoing)) => {
                shared.queued.fetch_sub(1, Ordering::AcqRel);
                let error = shared.failed_error().unwrap_or(Error::Shutdown);
                outgoing.completion.complete(Err(error));
            }
        }
    }

    /// Posts an event; from the core's own thread it is kept for the core to take right away.
    pub(crate) fn post(&self, event: Event) {
        let _ = self.offer(event);
    }

    /// Posts an event, or gives it back if the core has stopped taking any.
    pub(crate) fn offer(&self, event: Event) -> Result<(), Event> {
        let me = self.identity();
        let event = SELF_POSTED.with(|posted| match &mut *posted.borrow_mut() {
            Some((core, queue)) if *core == me => {
                queue.push(event);
                None
            }
            _ => Some(event),
        });
        if let Some(event) = event {
            self.shared.events.send(event).map_err(|e| e.into_inner())?;
            self.wake();
        }
        Ok(())
    }

    /// Whether this is the handle of the core running on the calling thread.
    pub(crate) fn is_current(&self) -> bool {
        let me = self.identity();
        SELF_POSTED.with(|posted| matches!(&*posted.borrow(), Some((core, _)) if *core == me))
    }

    fn wake(&self) {
        if self.shared.sleeping.swap(false, Ordering::SeqCst) {
            sys::eventfd_signal(self.shared.wake.as_raw_fd());
        }
    }

    fn identity(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }

    /// Marks the calling thread as this core's (once, when the core starts).
    pub(crate) fn enter(&self) {
        let me = self.identity();
        SELF_POSTED.with(|posted| *posted.borrow_mut() = Some((me, Vec::new())));
    }

    /// Events this core posted to itself since the last call.
    pub(crate) fn take_self_posted() -> Vec<Event> {
        SELF_POSTED.with(|posted| match &mut *posted.borrow_mut() {
            Some((_, queue)) => std::mem::take(queue),
            None => Vec::new(),
        })
    }
}

#[cfg(test)]
#[path = "commands_tests.rs"]
mod tests;
