//! Sending striped requests ([`tensorwire_proto::stripe`]): a large request to a peer that
//! said it takes stripes is cut into stripes, each sent on a connection of its own through
//! the PTR1 driver (io_uring or the fallback: any driver carries them), and the request
//! itself follows once every stripe was acknowledged.
//!
//! What a peer takes is asked once (the capabilities Ask) and remembered; a peer that does not
//! take stripes keeps getting whole frames (asked again after a minute, in case it was
//! upgraded). A failed stripe fails the call at once, cancels the other stripes and the
//! request is never sent, so nothing is delivered; the caller's deadline covers the stripes
//! and the request alike.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_proto::stats;
use tensorwire_proto::stripe::{CAPABILITIES_TYPE, Capabilities, Framing, Token, plan};
use tensorwire_proto::transport::{
    ActorPath, Answer, Completion, Deadline, Driver, Error, OutboundRequest, Reply, RequestKind,
};
use tensorwire_proto::{TensorMessage, route::Route};

use crate::sync::lock;

/// How long a peer that takes no stripes is sent whole frames before it is asked again.
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(60);
/// How long after a failed capabilities Ask (the peer was not reachable) it is asked again.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// The capabilities Ask's own deadline (or the first waiting request's, if earlier).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Payload bytes from which requests to a loopback peer are striped (unless
/// [`StripeConfig::loopback`]): one flow through loopback is not capped, and below this
/// size stripes cost more (a second round trip, four connections' wake-ups) than the copies
/// they spread over both CPUs save. Measured one-way on the 2-vCPU machine, 4 stripes ÷ whole
/// frames, both drivers: 0.69–0.82× at 1 MiB, 0.88–1.21× at 4 MiB, 1.05–1.16× at 8 MiB,
/// 1.24–1.44× at 64 MiB (`docs/benchmarks.md`, "Striping").
pub(crate) const LOOPBACK_THRESHOLD: u64 = 8 << 20;

/// How a node stripes its requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StripeConfig {
    /// Stripes per request (below 2: none).
    pub(crate) count: u16,
    /// Requests of at least this many payload bytes are striped.
    pub(crate) threshold: u64,
    /// Whether requests to loopback peers are striped as to any other (else only from
    /// [`LOOPBACK_THRESHOLD`], and only while no other large request to the peer is
    /// unanswered).
    pub(crate) loopback: bool,
}

/// The sending side of striping for one node.
pub(crate) struct StripeSender {
    config: StripeConfig,
    driver: Weak<dyn Driver>,
    peers: Mutex<HashMap<SocketAddr, PeerState>>,
}

enum PeerState {
    /// The capabilities Ask is on its way; these wait for its answer.
    Asking(Vec<OutboundRequest>),
    /// It takes this many stripes; `striping`: a striped request's stripes are on their way
    /// to it (one at a time per peer: requests meanwhile go whole, under the pool's
    /// busy-bytes rule, instead of opening `count` more connections each); `large`: requests
    /// of at least the threshold sent to it and not answered yet, striped or whole (counted
    /// only where they decide, for a peer striped only alone).
    Takes {
        max: u16,
        striping: bool,
        large: u32,
    },
    /// It takes none (or could not be asked): whole frames until then.
    Whole(Instant),
}

impl StripeSender {
    pub(crate) fn new(config: StripeConfig, driver: Weak<dyn Driver>) -> Arc<Self> {
        Arc::new(Self {
            config,
            driver,
            peers: Mutex::new(HashMap::new()),
        })
    }

    /// Whether a request of `message` to `peer` would be striped (if the peer takes stripes).
    /// A loopback peer is striped only from [`LOOPBACK_THRESHOLD`] (or the threshold, if
    /// larger) unless [`StripeConfig::loopback`] says otherwise.
    pub(crate) fn wants(&self, peer: SocketAddr, message: &TensorMessage) -> bool {
        let threshold = if self.config.loopback || !peer.ip().to_canonical().is_loopback() {
            self.config.threshold
        } else {
            self.config.threshold.max(LOOPBACK_THRESHOLD)
        };
        self.config.count >= 2 && message.total_bytes() >= threshold
    }

    /// Sends `request` through the driver: striped if it is large enough and its peer takes
    /// stripes, else whole.
    pub(crate) fn send(self: &Arc<Self>, request: OutboundRequest) {
        let Some(driver) = self.driver.upgrade() else {
            return request.completion.complete(Err(Error::Shutdown));
        };
        if request.framing != Framing::Whole || !self.wants(request.peer, &request.message) {
            return driver.send(request);
        }
        let peer = request.peer;
        let alone_only = self.stripes_only_alone(peer);
        let now = Instant::now();
        let mut peers = lock(&self.peers);
        let state = peers.entry(peer).or_insert(PeerState::Whole(now));
        match state {
            PeerState::Takes {
                max,
                striping,
                large,
            } => {
                let others_unanswered = alone_only && *large > 0;
                let stripe = !(*striping || others_unanswered);
                let count = self.config.count.min(*max);
                *striping |= stripe;
                if alone_only {
                    *large = large.saturating_add(1);
                }
                drop(peers);
                let request = if alone_only {
                    self.counted(request)
                } else {
                    request
                };
                if stripe {
                    send_striped(self, &driver, request, count);
                } else {
                    driver.send(request);
                }
            }
            PeerState::Whole(until) if *until > now => {
                drop(peers);
                driver.send(request);
            }
            PeerState::Whole(_) => {
                // The request waits for the answer: the Ask gives up no later than it does.
                let deadline = Deadline::after(now, PROBE_TIMEOUT).min(request.deadline);
                *state = PeerState::Asking(vec![request]);
                drop(peers);
                self.ask_capabilities(&driver, peer, deadline);
            }
            PeerState::Asking(waiting) => waiting.push(request),
        }
    }

    /// Whether requests to `peer` are striped only while no other large request to it is
    /// unanswered: to a loopback peer (unless [`StripeConfig::loopback`]) stripes gain only by
    /// spreading one request's copies over the CPUs, which requests already in flight on
    /// their own connections do; striping beside them made 8 asks of 64 MiB in flight 0.28–0.54×
    /// as fast as whole frames (`docs/benchmarks.md`, "Striping").
    fn stripes_only_alone(&self, peer: SocketAddr) -> bool {
        !self.config.loopback && peer.ip().to_canonical().is_loopback()
    }

    /// `request` with a completion that tells this sender when it is answered (before its
    /// caller hears of it, so that the caller's next request sees it gone).
    fn counted(self: &Arc<Self>, mut request: OutboundRequest) -> OutboundRequest {
        let caller = std::mem::replace(&mut request.completion, Box::new(Unset));
        request.completion = Box::new(Counted {
            caller: Some(caller),
            sender: Arc::downgrade(self),
            peer: request.peer,
        });
        request
    }

    /// A large request to `peer` was answered (or failed, or was dropped unanswered).
    fn answered_large(&self, peer: SocketAddr) {
        if let Some(PeerState::Takes { large, .. }) = lock(&self.peers).get_mut(&peer) {
            *large = large.saturating_sub(1);
        }
    }

    /// Asks `peer` what it takes; the requests waiting for the answer go on from
    /// [`StripeSender::answered`].
    fn ask_capabilities(
        self: &Arc<Self>,
        driver: &Arc<dyn Driver>,
        peer: SocketAddr,
        deadline: Deadline,
    ) {
        let Ok(path) = ActorPath::parse("capabilities") else {
            return self.answered(peer, PeerState::Whole(Instant::now() + RETRY_AFTER));
        };
        let query = OutboundRequest::new(
            peer,
            path, // not sent: the capabilities framing has its own path
            RequestKind::Ask,
            TensorMessage::new(0, Bytes::new(), Vec::new()),
            deadline,
            Box::new(Probe {
                sender: Arc::clone(self),
                peer,
            }),
        )
        .with_framing(Framing::Capabilities);
        driver.send(query);
    }

    /// `peer` refused a stripe: it may have been restarted without striping, so the next
    /// large request asks it again (this call fails with the refusal).
    fn forget(&self, peer: SocketAddr) {
        let mut peers = lock(&self.peers);
        if let Some(state @ PeerState::Takes { .. }) = peers.get_mut(&peer) {
            *state = PeerState::Whole(Instant::now());
        }
    }

    /// The stripes of the striped request to `peer` are done (acknowledged, or failed): the
    /// next large request to it may be striped.
    fn release(&self, peer: SocketAddr) {
        if let Some(PeerState::Takes { striping, .. }) = lock(&self.peers).get_mut(&peer) {
            *striping = false;
        }
    }

    /// The capabilities of `peer` are known: the requests that waited go out.
    fn answered(self: &Arc<Self>, peer: SocketAddr, state: PeerState) {
        let waiting = {
            let mut peers = lock(&self.peers);
            match peers.insert(peer, state) {
                Some(PeerState::Asking(waiting)) => waiting,
                _ => Vec::new(),
            }
        };
        for request in waiting {
            self.send(request);
        }
    }
}

/// The capabilities Ask's completion.
struct Probe {
    sender: Arc<StripeSender>,
    peer: SocketAddr,
}

impl Completion for Probe {
    fn complete(self: Box<Self>, outcome: Result<Answer, Error>) {
        let now = Instant::now();
        let state = match outcome {
            Ok(Answer::Reply(Reply::Single { msg_type, data }))
                if msg_type == CAPABILITIES_TYPE =>
            {
                Capabilities::parse(&data).map_or(PeerState::Whole(now + ASK_AGAIN_AFTER), |c| {
                    PeerState::Takes {
                        max: c.max_stripes,
                        striping: false,
                        large: 0,
                    }
                })
            }
            // It answered, but not with capabilities: a peer that does not know striping.
            Ok(_) | Err(Error::Remote { .. }) => PeerState::Whole(now + ASK_AGAIN_AFTER),
            Err(e) => {
                tracing::debug!(peer = %self.peer, error = %e, "capabilities not asked");
                PeerState::Whole(now + RETRY_AFTER)
            }
        };
        self.sender.answered(self.peer, state);
    }

    fn is_cancelled(&self) -> bool {
        false
    }
}

/// A large request's completion: tells the sender it is unanswered no longer, then its caller.
struct Counted {
    /// The caller's completion (taken when it completes).
    caller: Option<Box<dyn Completion>>,
    sender: Weak<StripeSender>,
    peer: SocketAddr,
}

impl Counted {
    fn caller(&self) -> Option<&dyn Completion> {
        self.caller.as_deref()
    }
}

impl Completion for Counted {
    fn complete(mut self: Box<Self>, outcome: Result<Answer, Error>) {
        let caller = self.caller.take();
        if let Some(sender) = self.sender.upgrade() {
            sender.answered_large(self.peer);
        }
        if let Some(caller) = caller {
            caller.complete(outcome);
        }
    }

    fn is_cancelled(&self) -> bool {
        self.caller().is_none_or(Completion::is_cancelled)
    }

    fn on_cancel(&self, hook: Box<dyn FnOnce() + Send>) {
        match self.caller() {
            Some(caller) => caller.on_cancel(hook),
            None => hook(),
        }
    }

    fn routed(&self, route: Route) {
        if let Some(caller) = self.caller() {
            caller.routed(route);
        }
    }
}

impl Drop for Counted {
    /// A request dropped unanswered (a driver gone mid-shutdown) is not counted as in flight
    /// for ever.
    fn drop(&mut self) {
        if self.caller.is_some() {
            if let Some(sender) = self.sender.upgrade() {
                sender.answered_large(self.peer);
            }
        }
    }
}

/// What a request's completion is for the moment [`StripeSender::counted`] moves it out.
struct Unset;

impl Completion for Unset {
    fn complete(self: Box<Self>, _outcome: Result<Answer, Error>) {}

    fn is_cancelled(&self) -> bool {
        true
    }
}

/// Cuts `request` into `count` stripes and sends them; the request follows from
/// [`Call::stripe_done`].
fn send_striped(
    sender: &Arc<StripeSender>,
    driver: &Arc<dyn Driver>,
    request: OutboundRequest,
    count: u16,
) {
    let token = match crate::sys::random_16() {
        Ok(bytes) => Token(bytes),
        Err(e) => {
            tracing::debug!(error = %e, "no randomness for a stripe token; sent whole");
            sender.release(request.peer);
            return driver.send(request);
        }
    };
    let Some(plan) = plan(&request.message, count, token) else {
        sender.release(request.peer);
        return driver.send(request);
    };
    let OutboundRequest {
        peer,
        path,
        kind,
        deadline,
        completion,
        ..
    } = request;
    let stripes = plan.stripes.len();
    let call = Arc::new(Call {
        driver: Arc::downgrade(driver),
        sender: Arc::downgrade(sender),
        released: AtomicBool::new(false),
        cancelled: AtomicBool::new(false),
        state: Mutex::new(CallState {
            remaining: stripes,
            caller: None,
            request: Some((path.clone(), plan.request)),
            hooks: Vec::new(),
        }),
        peer,
        kind,
        deadline,
        stripes: u64::try_from(stripes).unwrap_or(u64::MAX),
    });
    // The caller gives up: the stripes still on their way are cancelled.
    let weak = Arc::downgrade(&call);
    completion.on_cancel(Box::new(move || {
        if let Some(call) = weak.upgrade() {
            call.fail(Error::Cancelled);
        }
    }));
    lock(&call.state).caller = Some(completion);
    if call.cancelled.load(Ordering::Acquire) {
        return call.fail(Error::Cancelled);
    }
    for (descriptor, parts) in plan.stripes {
        let stripe = OutboundRequest::new(
            peer,
            path.clone(),
            RequestKind::Tell,
            parts,
            deadline,
            Box::new(StripeCompletion {
                call: Arc::clone(&call),
            }),
        )
        .with_framing(Framing::Stripe(descriptor));
        driver.send(stripe);
    }
}

/// One striped call: its stripes on their way, then its request.
struct Call {
    driver: Weak<dyn Driver>,
    /// Told when the peer refuses a stripe, and when the stripes are done.
    sender: Weak<StripeSender>,
    /// The sender was told the stripes are done.
    released: AtomicBool,
    /// The call failed or was cancelled: stripes not sent yet are dropped.
    cancelled: AtomicBool,
    state: Mutex<CallState>,
    peer: SocketAddr,
    kind: RequestKind,
    deadline: Deadline,
    /// Stripes of the call.
    stripes: u64,
}

struct CallState {
    /// Stripes not acknowledged yet.
    remaining: usize,
    /// The caller's completion, until the request goes out with it (or the call fails).
    caller: Option<Box<dyn Completion>>,
    /// The request frame's path and message, sent once every stripe is in.
    request: Option<(ActorPath, TensorMessage)>,
    /// Hooks of stripes on connections: run to close them when the call fails.
    hooks: Vec<Box<dyn FnOnce() + Send>>,
}

impl Call {
    /// A stripe was acknowledged; after the last, the request goes out.
    fn stripe_done(&self) {
        let (caller, request) = {
            let mut state = lock(&self.state);
            state.remaining = state.remaining.saturating_sub(1);
            if state.remaining > 0 || self.cancelled.load(Ordering::Acquire) {
                return;
            }
            state.hooks.clear();
            (state.caller.take(), state.request.take())
        };
        self.release();
        let (Some(caller), Some((path, message))) = (caller, request) else {
            return;
        };
        let Some(driver) = self.driver.upgrade() else {
            return caller.complete(Err(Error::Shutdown));
        };
        stats::global().record_striped_request_sent(self.stripes);
        let (peer, kind, deadline) = (self.peer, self.kind, self.deadline);
        let request = OutboundRequest::new(peer, path, kind, message, deadline, caller)
            .with_framing(Framing::Striped);
        driver.send(request);
    }

    /// Tells the sender, once, that this call's stripes are done.
    fn release(&self) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(sender) = self.sender.upgrade() {
            sender.release(self.peer);
        }
    }

    /// A stripe failed (or the caller gave up): the caller gets `error`, the other stripes
    /// are cancelled, the request is never sent.
    fn fail(&self, error: Error) {
        self.cancelled.store(true, Ordering::Release);
        self.release();
        let (caller, hooks) = {
            let mut state = lock(&self.state);
            state.request = None;
            (state.caller.take(), std::mem::take(&mut state.hooks))
        };
        if let Some(caller) = caller {
            let error = match error {
                // The stripes carry the call's deadline: its expiry is the call's.
                Error::Timeout { what: "tell", .. } => self.deadline.error(self.kind.as_str()),
                other => other,
            };
            caller.complete(Err(error));
        }
        hooks.into_iter().for_each(|hook| hook());
    }
}

/// One stripe's completion.
struct StripeCompletion {
    call: Arc<Call>,
}

impl Completion for StripeCompletion {
    fn complete(self: Box<Self>, outcome: Result<Answer, Error>) {
        match outcome {
            Ok(Answer::Ack) => self.call.stripe_done(),
            Ok(Answer::Reply(_)) => self.call.fail(Error::UnexpectedReply {
                peer: self.call.peer,
                request: "stripe",
                reply: "a reply",
            }),
            Err(e) => {
                if e.is_remote() {
                    if let Some(sender) = self.call.sender.upgrade() {
                        sender.forget(self.call.peer);
                    }
                }
                self.call.fail(e);
            }
        }
    }

    fn is_cancelled(&self) -> bool {
        self.call.cancelled.load(Ordering::Acquire)
    }

    fn on_cancel(&self, hook: Box<dyn FnOnce() + Send>) {
        let mut state = lock(&self.call.state);
        if self.call.cancelled.load(Ordering::Acquire) {
            drop(state);
            return hook();
        }
        state.hooks.push(hook);
    }

    fn routed(&self, _route: Route) {}
}

#[cfg(test)]
mod tests;
