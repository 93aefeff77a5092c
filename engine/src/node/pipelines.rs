//! How many requests each peer takes on one PTR1 connection before it has answered the first
//! (`pipeline=` in its capabilities, [`tensorwire_proto::stripe::pipeline_depth`]), learned
//! once per peer in the background and marked on every whole request sent to it
//! ([`OutboundRequest::with_pipeline`]); the drivers' pools pipeline small requests up to it.
//!
//! A peer is asked once this node has more than [`ASK_FROM_IN_FLIGHT`] requests on their way
//! (below that the pools give each its own connection anyway, so a node that sends one request
//! at a time never asks). Requests go one per connection while the Ask is on its way (nothing
//! waits for it); once the answer is in, the drivers' pools gather them onto a few connections. A peer that does not answer it with capabilities — another
//! PTR1 implementation, or an older tensorwire — is never pipelined to, and asked again after
//! a minute, as is one that said it pipelines (in case it was replaced). It does not stripe:
//! that is [`super::stripes`], which asks the same question for large requests only.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_proto::TensorMessage;
use tensorwire_proto::stripe::{self, CAPABILITIES_TYPE, Framing};
use tensorwire_proto::transport::{
    ActorPath, Answer, Completion, Deadline, Driver, Error, OutboundRequest, Reply, RequestKind,
};

use crate::sync::lock;

/// How long an answer (or the lack of one) holds before the peer is asked again.
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(60);
/// How long after a capabilities Ask that could not be made (the peer was not reachable) it
/// is asked again.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// The capabilities Ask's deadline.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests pipelined on one connection at most, whatever a peer says (a tensorwire server
/// reads no further than 64 replies ahead).
const MAX_DEPTH: u16 = 64;
/// Peers remembered at most; requests to further peers go one per connection.
const MAX_PEERS: usize = 4096;
/// Requests this node has on their way (to any peer) from which a peer not asked yet is asked:
/// the pools' `pipeline_connections` by default.
const ASK_FROM_IN_FLIGHT: usize = 4;

/// The pipeline depth of every peer this node sent to.
pub(crate) struct PipelineDepths {
    driver: Weak<dyn Driver>,
    peers: Mutex<HashMap<SocketAddr, Known>>,
}

#[derive(Clone, Copy, Debug)]
struct Known {
    /// Requests per connection at once (1: one at a time).
    depth: u16,
    /// When to ask again (`None`: an Ask is on its way).
    until: Option<Instant>,
}

impl PipelineDepths {
    pub(crate) fn new(driver: Weak<dyn Driver>) -> Arc<Self> {
        Arc::new(Self {
            driver,
            peers: Mutex::new(HashMap::new()),
        })
    }

    /// `request`, marked with its peer's depth (a whole request only: stripes and the
    /// capabilities Ask go one per connection), while this node has `in_flight` requests on
    /// their way; asks the peer if it is new (and there are enough) or its answer is old.
    pub(crate) fn mark(
        self: &Arc<Self>,
        request: OutboundRequest,
        in_flight: usize,
    ) -> OutboundRequest {
        if request.framing != Framing::Whole {
            return request;
        }
        let depth = self.depth(request.peer, in_flight, Instant::now());
        request.with_pipeline(depth)
    }

    /// The depth to use for `peer` now.
    fn depth(self: &Arc<Self>, peer: SocketAddr, in_flight: usize, now: Instant) -> u16 {
        let mut peers = lock(&self.peers);
        if !peers.contains_key(&peer)
            && (in_flight <= ASK_FROM_IN_FLIGHT || peers.len() >= MAX_PEERS)
        {
            return 1;
        }
        let known = peers.entry(peer).or_insert(Known {
            depth: 1,
            until: Some(now),
        });
        let depth = known.depth;
        if known.until.is_some_and(|until| until <= now) {
            known.until = None;
            drop(peers);
            self.ask(peer, now);
        }
        depth
    }

    /// Sends the capabilities Ask to `peer`; its answer lands in [`PipelineDepths::answered`].
    fn ask(self: &Arc<Self>, peer: SocketAddr, now: Instant) {
        let (Some(driver), Ok(path)) = (self.driver.upgrade(), ActorPath::parse("capabilities"))
        else {
            return self.answered(peer, 1, now + RETRY_AFTER);
        };
        let query = OutboundRequest::new(
            peer,
            path, // not sent: the capabilities framing has its own path
            RequestKind::Ask,
            TensorMessage::new(0, Bytes::new(), Vec::new()),
            Deadline::after(now, ASK_TIMEOUT),
            Box::new(Probe {
                depths: Arc::downgrade(self),
                peer,
            }),
        )
        .with_framing(Framing::Capabilities);
        driver.send(query);
    }

    fn answered(&self, peer: SocketAddr, depth: u16, until: Instant) {
        if let Some(known) = lock(&self.peers).get_mut(&peer) {
            *known = Known {
                depth: depth.clamp(1, MAX_DEPTH),
                until: Some(until),
            };
        }
    }
}

/// The capabilities Ask's completion.
struct Probe {
    depths: Weak<PipelineDepths>,
    peer: SocketAddr,
}

impl Completion for Probe {
    fn complete(self: Box<Self>, outcome: Result<Answer, Error>) {
        let Some(depths) = self.depths.upgrade() else {
            return;
        };
        let now = Instant::now();
        let (depth, after) = match outcome {
            Ok(Answer::Reply(Reply::Single { msg_type, data }))
                if msg_type == CAPABILITIES_TYPE =>
            {
                (stripe::pipeline_depth(&data).unwrap_or(1), ASK_AGAIN_AFTER)
            }
            // It answered, but not with capabilities: a peer that does not pipeline.
            Ok(_) | Err(Error::Remote { .. }) => (1, ASK_AGAIN_AFTER),
            Err(e) => {
                tracing::debug!(peer = %self.peer, error = %e, "pipeline depth not asked");
                (1, RETRY_AFTER)
            }
        };
        depths.answered(self.peer, depth, now + after);
    }

    fn is_cancelled(&self) -> bool {
        false
    }
}

#[cfg(test)]
#[path = "pipelines_tests.rs"]
mod tests;
