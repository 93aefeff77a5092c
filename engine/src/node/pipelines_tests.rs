//! Pipeline depths against a driver that only keeps what it is handed: one capabilities Ask
//! per peer, whole requests marked with what the peer said, everything else one at a time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_proto::TensorMessage;
use tensorwire_proto::stripe::{self, CAPABILITIES_TYPE, Framing};
use tensorwire_proto::transport::{
    ActorPath, Answer, Completion, Deadline, Driver, Error, OutboundRequest, Reply, RequestKind,
};

use super::PipelineDepths;
use crate::node::keeper::Keeper;
use crate::sync::lock;

/// Requests on their way, enough for a new peer to be asked.
const BUSY: usize = 64;

#[test]
fn a_node_sending_one_request_at_a_time_never_asks() {
    let t = Harness::new();
    for in_flight in 1..=super::ASK_FROM_IN_FLIGHT {
        assert_eq!(
            t.depths.mark(request("127.0.0.1:7000"), in_flight).pipeline,
            1
        );
    }
    assert!(t.capabilities_asks().is_empty());
    t.depth_of("127.0.0.1:7000");
    assert_eq!(
        t.capabilities_asks().len(),
        1,
        "asked once it had more on their way"
    );
}

#[test]
fn a_new_peer_is_asked_once_and_its_requests_go_one_at_a_time_until_it_answers() {
    let t = Harness::new();
    assert_eq!(t.depth_of("127.0.0.1:7000"), 1);
    assert_eq!(t.depth_of("127.0.0.1:7000"), 1);
    let asks = t.capabilities_asks();
    assert_eq!(asks.len(), 1, "asked once, whatever was sent meanwhile");
    answer(asks, Ok(capabilities(16)));
    assert_eq!(t.depth_of("127.0.0.1:7000"), 16);
    assert!(t.capabilities_asks().is_empty(), "not asked again");
}

#[test]
fn what_a_peer_says_is_bounded_and_a_peer_without_capabilities_is_never_pipelined_to() {
    let t = Harness::new();
    t.depth_of("10.0.0.1:1");
    answer(t.capabilities_asks(), Ok(capabilities(u16::MAX)));
    assert_eq!(t.depth_of("10.0.0.1:1"), 64);
    t.depth_of("10.0.0.2:1");
    let refusal = Err(Error::Remote {
        peer: None,
        text: "no endpoint at /_tensorwire/capabilities".into(),
    });
    answer(t.capabilities_asks(), refusal);
    assert_eq!(t.depth_of("10.0.0.2:1"), 1);
    t.depth_of("10.0.0.3:1");
    let unlike = Ok(Answer::Reply(Reply::Single {
        msg_type: CAPABILITIES_TYPE.into(),
        data: Bytes::from_static(b"stripes=1 max-stripes=4"),
    }));
    answer(t.capabilities_asks(), unlike);
    assert_eq!(t.depth_of("10.0.0.3:1"), 1, "no pipeline= in it");
}

#[test]
fn a_peer_that_could_not_be_asked_is_asked_again_a_second_later() {
    let t = Harness::new();
    let peer: SocketAddr = "10.0.0.9:1".parse().unwrap();
    let now = Instant::now();
    assert_eq!(t.depths.depth(peer, BUSY, now), 1);
    let refused = Err(Error::ConnectionClosed { peer, detail: None });
    answer(t.capabilities_asks(), refused);
    assert_eq!(t.depths.depth(peer, BUSY, Instant::now()), 1);
    assert!(t.capabilities_asks().is_empty(), "not at once");
    assert_eq!(t.depths.depth(peer, BUSY, now + Duration::from_secs(2)), 1);
    assert_eq!(t.capabilities_asks().len(), 1, "after the retry time");
}

#[test]
fn stripes_keep_going_one_per_connection() {
    let t = Harness::new();
    t.depth_of("10.0.0.1:1");
    answer(t.capabilities_asks(), Ok(capabilities(8)));
    let stripe = request("10.0.0.1:1").with_framing(Framing::Striped);
    assert_eq!(t.depths.mark(stripe, BUSY).pipeline, 1);
    assert_eq!(t.depth_of("10.0.0.1:1"), 8);
}

fn capabilities(depth: u16) -> Answer {
    Answer::Reply(Reply::Single {
        msg_type: CAPABILITIES_TYPE.into(),
        data: stripe::capabilities_reply(None, depth),
    })
}

fn answer(asks: Vec<OutboundRequest>, outcome: Result<Answer, Error>) {
    let mut asks = asks.into_iter();
    let ask = asks.next().expect("a capabilities Ask");
    assert!(asks.next().is_none(), "one Ask");
    ask.completion.complete(outcome);
}

fn request(peer: &str) -> OutboundRequest {
    OutboundRequest::new(
        peer.parse().unwrap(),
        ActorPath::parse("echo").unwrap(),
        RequestKind::Ask,
        TensorMessage::new(0, Bytes::new(), vec![Bytes::from_static(b"x")]),
        Deadline::never(),
        Box::new(Ignore),
    )
}

struct Harness {
    driver: Arc<Keeper>,
    depths: Arc<PipelineDepths>,
    /// Keeps the driver alive for the weak reference.
    _as_driver: Arc<dyn Driver>,
}

impl Harness {
    fn new() -> Self {
        let driver = Arc::new(Keeper::default());
        let as_driver: Arc<dyn Driver> = driver.clone();
        let depths = PipelineDepths::new(Arc::downgrade(&as_driver));
        Self {
            driver,
            depths,
            _as_driver: as_driver,
        }
    }

    /// The depth a whole request to `peer` is marked with now.
    fn depth_of(&self, peer: &str) -> u16 {
        self.depths.mark(request(peer), BUSY).pipeline
    }

    /// The capabilities Asks sent since the last look.
    fn capabilities_asks(&self) -> Vec<OutboundRequest> {
        let sent = std::mem::take(&mut *lock(&self.driver.sent));
        assert!(sent.iter().all(|r| r.framing == Framing::Capabilities));
        sent
    }
}

struct Ignore;

impl Completion for Ignore {
    fn complete(self: Box<Self>, _: Result<Answer, Error>) {}

    fn is_cancelled(&self) -> bool {
        false
    }
}
