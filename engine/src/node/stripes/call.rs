//! One striped call: its request cut into stripes, each sent on a connection of its own, the
//! request frame once every stripe is acknowledged; a failed stripe fails the call and the
//! request is never sent.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tensorwire_proto::stats;
use tensorwire_proto::stripe::{Framing, Token, plan};
use tensorwire_proto::transport::{
    ActorPath, Answer, Completion, Deadline, Driver, Error, OutboundRequest, RequestKind,
};
use tensorwire_proto::{TensorMessage, route::Route};

use super::StripeSender;
use crate::sync::lock;

/// Cuts `request` into `count` stripes and sends them; the request follows from
/// [`Call::stripe_done`].
pub(super) fn send_striped(
    sender: &Arc<StripeSender>,
    driver: &Arc<dyn Driver>,
    request: OutboundRequest,
    count: u16,
) {
    let token = match crate::sys::random_16() {
        Ok(bytes) => Token(bytes),
        Err(e) => {
            tracing::debug!(error = %e, "no randomness for a stripe token; sent whole");
            return send_whole(sender, driver, request);
        }
    };
    let Some(plan) = plan(&request.message, count, token) else {
        return send_whole(sender, driver, request);
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

/// `request`, which was to be striped, goes whole; what was held for it goes behind it.
fn send_whole(sender: &Arc<StripeSender>, driver: &Arc<dyn Driver>, request: OutboundRequest) {
    let peer = request.peer;
    driver.send(request);
    sender.release(peer);
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
        if let (Some(caller), Some((path, message))) = (caller, request) {
            match self.driver.upgrade() {
                Some(driver) => {
                    stats::global().record_striped_request_sent(self.stripes);
                    let (peer, kind, deadline) = (self.peer, self.kind, self.deadline);
                    let request = OutboundRequest::new(peer, path, kind, message, deadline, caller)
                        .with_framing(Framing::Striped);
                    driver.send(request);
                }
                None => caller.complete(Err(Error::Shutdown)),
            }
        }
        // After the request frame: requests held for these stripes go behind it.
        self.release();
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
        let (caller, hooks) = {
            let mut state = lock(&self.state);
            state.request = None;
            (state.caller.take(), std::mem::take(&mut state.hooks))
        };
        // The other stripes stop first, so what was held does not go beside them; the caller
        // hears last, so its request still counts as unanswered while the held ones go.
        hooks.into_iter().for_each(|hook| hook());
        self.release();
        if let Some(caller) = caller {
            let error = match error {
                // The stripes carry the call's deadline: its expiry is the call's.
                Error::Timeout { what: "tell", .. } => self.deadline.error(self.kind.as_str()),
                other => other,
            };
            caller.complete(Err(error));
        }
    }
}

impl Drop for Call {
    /// Stripes its driver dropped unanswered still end the call's hold on its peer.
    fn drop(&mut self) {
        self.release();
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
