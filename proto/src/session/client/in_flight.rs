//! The requests on one client connection, in the order their frames go out — which is the
//! order their replies come back in.
//!
//! A request is *queued* (its frame not handed to the driver yet), *writing* (handed out, some
//! bytes still to go) or *sent*. One whose caller has its outcome already (its deadline passed,
//! or it was cancelled, after its frame began to go out) is *abandoned*: it keeps its place, so
//! the reply it is owed is read and dropped and the replies behind it still match.

use std::collections::VecDeque;
use std::time::Instant;

use super::ClientRequest;
use super::request::Routing;
use crate::encode::Encoded;
use crate::len::len_u64;
use crate::session::transmit::Transmit;
use crate::transport::{Deadline, RequestKind};

/// Request frames written together at most (one frame always goes, however large).
const COALESCED_BYTES: u64 = 256 << 10;

/// Identifies a request started on a [`super::ClientSession`]; its
/// [`super::ClientEvent::Done`] (or, if it is handed back, [`super::ClientEvent::Unsent`])
/// carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestToken(u64);

/// One request on the connection.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) token: RequestToken,
    pub(super) kind: RequestKind,
    pub(super) deadline: Deadline,
    pub(super) stage: Stage,
    /// Its caller has its outcome already; its reply is read and dropped.
    pub(super) abandoned: bool,
    routing: Routing,
}

/// A request whose caller still waited, taken off a connection that failed.
#[derive(Debug)]
pub(super) enum Taken {
    /// It fails with the connection.
    Failing(RequestToken),
    /// Not a byte of it was handed out and it was not given back before: it can go another
    /// way, as the same request.
    Unwritten(RequestToken, ClientRequest),
}

/// How far a request's frame got.
#[derive(Debug)]
pub(super) enum Stage {
    /// Not handed to the driver yet: taking it out leaves nothing on the wire.
    Queued(Encoded),
    /// Handed out; `remaining` of its `len` bytes are not written yet.
    Writing { remaining: u64, len: u64 },
    /// Written whole.
    Sent,
}

/// The connection's requests, front first.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    requests: VecDeque<Pending>,
    next_token: u64,
    /// Bytes of frames answered while still being written (the peer read them before the
    /// driver heard the write finish): the next written bytes are theirs.
    answered_unwritten: u64,
}

impl InFlight {
    /// A new token (for a request that is answered at once, or queued next).
    pub(super) fn token(&mut self) -> RequestToken {
        let token = RequestToken(self.next_token);
        self.next_token += 1;
        token
    }

    /// Queues a request's frame behind the others.
    pub(super) fn push(&mut self, token: RequestToken, request: ClientRequest) {
        let ClientRequest {
            kind,
            encoded,
            deadline,
            routing,
        } = request;
        self.requests.push_back(Pending {
            token,
            kind,
            deadline,
            stage: Stage::Queued(encoded),
            abandoned: false,
            routing,
        });
    }

    pub(super) fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    pub(super) fn len(&self) -> usize {
        self.requests.len()
    }

    /// The request the next reply answers.
    pub(super) fn front(&self) -> Option<&Pending> {
        self.requests.front()
    }

    /// Takes the answered request out (a frame still being written keeps its bytes counted).
    pub(super) fn pop_front(&mut self) -> Option<Pending> {
        let request = self.requests.pop_front()?;
        if let Stage::Writing { remaining, .. } = request.stage {
            self.answered_unwritten += remaining;
        }
        Some(request)
    }

    /// The front request's frame is being written.
    pub(super) fn front_is_writing(&self) -> bool {
        self.requests
            .front()
            .is_some_and(|r| matches!(r.stage, Stage::Writing { .. }))
    }

    /// The request the next reply answers was not handed out yet.
    pub(super) fn front_is_queued(&self) -> bool {
        self.requests
            .front()
            .is_some_and(|r| matches!(r.stage, Stage::Queued(_)))
    }

    /// No request is owed a reply: each one left (if any) was never handed out.
    pub(super) fn all_queued(&self) -> bool {
        self.requests
            .iter()
            .all(|r| matches!(r.stage, Stage::Queued(_)))
    }

    /// Requests remain, and every one of them is abandoned: nobody waits for this connection.
    pub(super) fn only_abandoned(&self) -> bool {
        !self.requests.is_empty() && self.requests.iter().all(|r| r.abandoned)
    }

    /// The earliest deadline of a request whose caller still waits.
    pub(super) fn earliest_deadline(&self) -> Option<Instant> {
        self.requests
            .iter()
            .filter(|r| !r.abandoned)
            .filter_map(|r| r.deadline.at())
            .min()
    }

    /// The frames not handed out yet, oldest first, as one transmit of about
    /// [`COALESCED_BYTES`] at most; they are *writing* from now on.
    pub(super) fn take_transmit(&mut self) -> Option<Transmit> {
        let mut transmit: Option<Transmit> = None;
        for request in &mut self.requests {
            let Stage::Queued(encoded) = &request.stage else {
                continue;
            };
            let len = encoded.wire_len();
            if transmit
                .as_ref()
                .is_some_and(|t| t.wire_len() + len > COALESCED_BYTES)
            {
                break;
            }
            let writing = Stage::Writing {
                remaining: len,
                len,
            };
            let Stage::Queued(encoded) = std::mem::replace(&mut request.stage, writing) else {
                continue;
            };
            match &mut transmit {
                Some(transmit) => transmit.push(encoded),
                None => transmit = Some(Transmit::new(encoded)),
            }
        }
        transmit
    }

    /// `n` more bytes were written; returns how many frames (and their bytes) that finished.
    pub(super) fn written(&mut self, n: usize) -> (u64, u64) {
        let mut left = len_u64(n);
        let (mut frames, mut bytes) = (0u64, 0u64);
        let skip = left.min(self.answered_unwritten);
        self.answered_unwritten -= skip;
        left -= skip;
        for request in &mut self.requests {
            if left == 0 {
                break;
            }
            let Stage::Writing { remaining, len } = &mut request.stage else {
                continue;
            };
            let step = left.min(*remaining);
            *remaining -= step;
            left -= step;
            if *remaining == 0 {
                bytes += *len;
                frames += 1;
                request.stage = Stage::Sent;
            }
        }
        (frames, bytes)
    }

    /// The request `token` is given up on: a queued one is taken out (nothing of it was
    /// written), one whose frame began to go out is abandoned. Returns its kind if its caller
    /// still waited for it.
    pub(super) fn give_up(&mut self, token: RequestToken) -> Option<RequestKind> {
        let index = self.requests.iter().position(|r| r.token == token)?;
        let request = &mut self.requests[index];
        if request.abandoned {
            return None;
        }
        let kind = request.kind;
        if matches!(request.stage, Stage::Queued(_)) {
            self.requests.remove(index);
        } else {
            request.abandoned = true;
        }
        Some(kind)
    }

    /// The tokens and kinds of requests whose deadline passed by `now` (their callers still
    /// waiting).
    pub(super) fn expired(&self, now: Instant) -> Vec<(RequestToken, RequestKind, Deadline)> {
        self.requests
            .iter()
            .filter(|r| !r.abandoned && r.deadline.has_passed(now))
            .map(|r| (r.token, r.kind, r.deadline))
            .collect()
    }

    /// Takes every request out; returns those whose callers still wait, front first. With
    /// `give_back`, a request not a byte of which was handed out comes back whole (once in
    /// its life: one given back before fails like the others).
    pub(super) fn drain_waiting(&mut self, give_back: bool) -> Vec<Taken> {
        self.answered_unwritten = 0;
        self.requests
            .drain(..)
            .filter(|r| !r.abandoned)
            .map(|r| match r.stage {
                Stage::Queued(encoded) if give_back && !r.routing.was_given_back() => {
                    let request = ClientRequest {
                        kind: r.kind,
                        encoded,
                        deadline: r.deadline,
                        routing: r.routing.given_back(),
                    };
                    Taken::Unwritten(r.token, request)
                }
                _ => Taken::Failing(r.token),
            })
            .collect()
    }
}
