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
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_proto::stripe::{CAPABILITIES_TYPE, Capabilities, Framing};
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
/// Large requests held per loopback peer at most while its striped request's stripes are on
/// their way; more go whole at once.
const MAX_HELD: usize = 256;
/// The longest a burst is held (or a quarter of its first request's time, if less): the
/// stripes of a request to a loopback peer are in within tens of milliseconds; stripes that
/// are not must not take the burst behind them down with them.
const MAX_HOLD: Duration = Duration::from_secs(1);

/// The striped call on its way to a loopback peer, for which a burst may be held.
#[derive(Clone, Copy, Debug)]
struct Hold {
    /// Counts the peer's striped calls: a hold's timer ends only its own call's hold.
    call: u64,
    /// Requests may be held for it (until its hold timer fires).
    open: bool,
    /// The striped request's deadline: only requests that may wait as long are held.
    until: Deadline,
}

impl Default for Hold {
    fn default() -> Self {
        Self {
            call: 0,
            open: false,
            until: Deadline::never(),
        }
    }
}

/// Requests a peer's state holds back, and the timer that ends their hold.
#[derive(Default)]
struct Held {
    requests: Vec<OutboundRequest>,
    timer: Option<u64>,
}

/// Payload bytes from which requests to a loopback peer are striped (unless
/// [`StripeConfig::loopback`]): one flow through loopback is not capped, and below this
/// size stripes cost more (a second round trip, four connections' wake-ups) than the copies
/// they spread over both CPUs save. Measured one-way on the 2-vCPU machine with same-host
/// connections on reno, 4 stripes ÷ whole frames, io_uring / tokio (medians of 5): 0.91 /
/// 0.87× at 8 MiB, 1.05–1.12 / 0.92–0.95× at 16 MiB, 1.20 / 1.00× at 32 MiB, 1.14 / 1.03× at
/// 64 MiB, 1.22 / 1.11× at 256 MiB (`docs/benchmarks.md`, "Striping", 2026-12-06). Two
/// runs on 2026-12-08, on a slower day of the host (whole frames 5.4–6.1 GB/s against
/// 7.0–7.7): io_uring 0.90–0.96× at 32–64 MiB, 0.97–1.01× at 256 MiB, tokio 0.93–1.10×; the
/// threshold stays until the io_uring loss is traced.
pub(crate) const LOOPBACK_THRESHOLD: u64 = 32 << 20;

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
    /// only where they decide, for a peer striped only alone); `held`: for such a peer, large
    /// requests that came while the striped one's stripes were on their way (a burst), sent
    /// when they are in, or once a quarter of the first one's time is spent (`hold`).
    Takes {
        max: u16,
        striping: bool,
        large: u32,
        held: Held,
        hold: Hold,
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
        let threshold = if self.stripes_only_alone(peer) {
            self.config.threshold.max(LOOPBACK_THRESHOLD)
        } else {
            self.config.threshold
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
                held,
                hold,
            } => {
                if alone_only
                    && *striping
                    && hold.open
                    && held.requests.len() < MAX_HELD
                    && not_before(request.deadline, hold.until)
                {
                    // A burst to a loopback peer: the stripes use both CPUs; copying beside
                    // them only slows both down. It goes when they are in.
                    if held.requests.is_empty() {
                        let until = now + hold_limit(now, request.deadline);
                        held.timer = Some(self.end_hold_at(peer, hold.call, until));
                    }
                    held.requests.push(request);
                    return;
                }
                let others_unanswered = alone_only && *large > 0;
                let stripe = !(*striping || others_unanswered);
                let count = self.config.count.min(*max);
                *striping |= stripe;
                if stripe {
                    *hold = Hold {
                        call: hold.call.wrapping_add(1),
                        open: true,
                        until: request.deadline,
                    };
                }
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
                    call::send_striped(self, &driver, request, count);
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
    fn forget(self: &Arc<Self>, peer: SocketAddr) {
        let held = {
            let mut peers = lock(&self.peers);
            match peers.get_mut(&peer) {
                Some(state @ PeerState::Takes { .. }) => {
                    held_of(std::mem::replace(state, PeerState::Whole(Instant::now())))
                }
                _ => Held::default(),
            }
        };
        self.resend(held);
    }

    /// The stripes of the striped request to `peer` are done (acknowledged, or failed): the
    /// next large request to it may be striped.
    fn release(self: &Arc<Self>, peer: SocketAddr) {
        let held = match lock(&self.peers).get_mut(&peer) {
            Some(PeerState::Takes { striping, held, .. }) => {
                *striping = false;
                std::mem::take(held)
            }
            _ => Held::default(),
        };
        self.resend(held);
    }

    /// At `at`, the burst held for striped call `call` to `peer` (if it is still held) goes on
    /// without waiting further.
    fn end_hold_at(self: &Arc<Self>, peer: SocketAddr, call: u64, at: Instant) -> u64 {
        let sender = Arc::downgrade(self);
        crate::pending::schedule_timer(
            at,
            Box::new(move || {
                if let Some(sender) = sender.upgrade() {
                    sender.end_hold(peer, call);
                }
            }),
        )
    }

    fn end_hold(self: &Arc<Self>, peer: SocketAddr, call: u64) {
        let held = match lock(&self.peers).get_mut(&peer) {
            Some(PeerState::Takes { held, hold, .. }) if hold.call == call && hold.open => {
                hold.open = false;
                held.timer = None; // it fired
                std::mem::take(held)
            }
            _ => Held::default(),
        };
        self.resend(held);
    }

    /// Requests that were held (or waited) go on, in order, as if sent now; the timer that
    /// would have ended their hold is cancelled.
    fn resend(self: &Arc<Self>, held: Held) {
        if let Some(timer) = held.timer {
            crate::pending::cancel_timer(timer);
        }
        for request in held.requests {
            self.send(request);
        }
    }

    /// The capabilities of `peer` are known: the requests that waited go out.
    fn answered(self: &Arc<Self>, peer: SocketAddr, state: PeerState) {
        let waiting = {
            let mut peers = lock(&self.peers);
            peers
                .insert(peer, state)
                .map_or_else(Held::default, held_of)
        };
        self.resend(waiting);
    }
}

/// What a peer's state holds back, if anything.
fn held_of(state: PeerState) -> Held {
    match state {
        PeerState::Takes { held, .. } => held,
        PeerState::Asking(requests) => Held {
            requests,
            timer: None,
        },
        PeerState::Whole(_) => Held::default(),
    }
}

/// Whether `deadline` comes no earlier than `other` (a request held until `other` waits no
/// longer than it may).
fn not_before(deadline: Deadline, other: Deadline) -> bool {
    match (deadline.at(), other.at()) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(at), Some(other)) => at >= other,
    }
}

/// How long a request with `deadline` may be held from `now`: a quarter of its time, at most
/// [`MAX_HOLD`].
fn hold_limit(now: Instant, deadline: Deadline) -> Duration {
    deadline.at().map_or(MAX_HOLD, |at| {
        (at.saturating_duration_since(now) / 4).min(MAX_HOLD)
    })
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
                        held: Held::default(),
                        hold: Hold::default(),
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

mod call;
#[cfg(test)]
mod tests;
