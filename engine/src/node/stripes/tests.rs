//! The stripe sender against a driver that only keeps what it is handed: which requests are
//! striped, and that a large request's count comes back however it ends (answered, failed,
//! dropped by its driver), so a loopback peer is striped again once it is alone.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_proto::TensorMessage;
use tensorwire_proto::stripe::{CAPABILITIES_TYPE, Capabilities, Framing};
use tensorwire_proto::transport::{
    ActorPath, Answer, Completion, Deadline, Driver, Error, Outbound, OutboundRequest, Reply,
    RequestKind,
};

use super::{StripeConfig, StripeSender};
use crate::sync::lock;

const LOOPBACK: &str = "127.0.0.1:7000";
const REMOTE: &str = "10.0.0.7:7000";

#[test]
fn a_failed_striped_request_gives_its_count_back() {
    let t = Harness::new();
    let first = t.send(LOOPBACK);
    let stripes = t.taken();
    assert_eq!(framings(&stripes), vec!["stripe"; 4], "alone: striped");
    let mut stripes = stripes.into_iter();
    let failed = stripes.next().expect("a stripe");
    failed.completion.complete(Err(Error::Shutdown));
    assert!(matches!(first.outcome(), Some(Err(Error::Shutdown))));
    drop(stripes); // the other stripes end unanswered with it
    t.send(LOOPBACK);
    assert_eq!(
        framings(&t.taken()),
        vec!["stripe"; 4],
        "alone again: striped"
    );
}

#[test]
fn a_whole_request_its_driver_dropped_gives_its_count_back() {
    let t = Harness::new();
    let first = t.send(LOOPBACK);
    let stripes = t.taken();
    assert_eq!(stripes.len(), 4);
    let _second = t.send(LOOPBACK);
    let whole = t.taken();
    assert_eq!(
        framings(&whole),
        vec!["whole"],
        "beside an unanswered one: whole"
    );
    drop(whole); // the driver lost it without an answer
    for stripe in stripes {
        stripe.completion.complete(Ok(Answer::Ack));
    }
    let request = t.taken();
    assert_eq!(
        framings(&request),
        vec!["striped"],
        "the stripes are in: the request goes"
    );
    for request in request {
        request.completion.complete(Ok(Answer::Reply(Reply::Single {
            msg_type: "ack".into(),
            data: Bytes::new(),
        })));
    }
    assert!(matches!(first.outcome(), Some(Ok(_))));
    t.send(LOOPBACK);
    assert_eq!(
        framings(&t.taken()),
        vec!["stripe"; 4],
        "nothing unanswered: striped"
    );
}

#[test]
fn a_loopback_peer_is_striped_again_only_once_every_large_request_is_answered() {
    let t = Harness::new();
    let _first = t.send(LOOPBACK);
    let stripes = t.taken();
    let _second = t.send(LOOPBACK);
    let whole = t.taken();
    for stripe in stripes {
        stripe.completion.complete(Ok(Answer::Ack));
    }
    for request in t.taken() {
        request.completion.complete(Err(Error::Cancelled));
    }
    t.send(LOOPBACK);
    assert_eq!(
        framings(&t.taken()),
        vec!["whole"],
        "the second is unanswered yet"
    );
    for request in whole {
        request.completion.complete(Err(Error::Cancelled));
    }
    t.send(LOOPBACK);
    assert_eq!(
        framings(&t.taken()),
        vec!["stripe"; 4],
        "every large one answered"
    );
}

#[test]
fn a_remote_peer_is_striped_again_as_soon_as_the_stripes_are_in() {
    let t = Harness::new();
    let _first = t.send(REMOTE);
    let stripes = t.taken();
    let _second = t.send(REMOTE);
    assert_eq!(
        framings(&t.taken()),
        vec!["whole"],
        "one striped request at a time"
    );
    for stripe in stripes {
        stripe.completion.complete(Ok(Answer::Ack));
    }
    assert_eq!(framings(&t.taken()), vec!["striped"]);
    t.send(REMOTE);
    assert_eq!(
        framings(&t.taken()),
        vec!["stripe"; 4],
        "where one flow may be capped, striping beside unanswered requests still pays"
    );
}

/// A stripe sender (4 stripes from 1 MiB, loopback from 8 MiB) on a driver that keeps what
/// it is handed, both peers already known to take 16 stripes.
struct Harness {
    driver: Arc<Keeper>,
    sender: Arc<StripeSender>,
    /// Keeps the driver alive for the sender's weak reference.
    _as_driver: Arc<dyn Driver>,
}

impl Harness {
    fn new() -> Self {
        let driver = Arc::new(Keeper::default());
        let as_driver: Arc<dyn Driver> = driver.clone();
        let config = StripeConfig {
            count: 4,
            threshold: 1 << 20,
            loopback: false,
        };
        let sender = StripeSender::new(config, Arc::downgrade(&as_driver));
        let t = Self {
            driver,
            sender,
            _as_driver: as_driver,
        };
        for peer in [LOOPBACK, REMOTE] {
            let waiting = t.send(peer);
            let mut query = t.taken();
            assert_eq!(framings(&query), vec!["capabilities",]);
            let capabilities = Capabilities { max_stripes: 16 }.encode();
            query
                .remove(0)
                .completion
                .complete(Ok(Answer::Reply(Reply::Single {
                    msg_type: CAPABILITIES_TYPE.into(),
                    data: capabilities,
                })));
            // The request that waited for the answer goes out striped: finish it.
            let stripes = t.taken();
            assert_eq!(framings(&stripes), vec!["stripe"; 4]);
            for stripe in stripes {
                stripe.completion.complete(Ok(Answer::Ack));
            }
            for request in t.taken() {
                request.completion.complete(Err(Error::Cancelled));
            }
            assert!(waiting.outcome().is_some());
        }
        t
    }

    /// Sends an 8 MiB ask to `peer`; its outcome lands in the returned cell.
    fn send(&self, peer: &str) -> Outcome {
        let peer: SocketAddr = peer.parse().expect("an address");
        let outcome = Outcome::default();
        let message = TensorMessage::new(0, Bytes::new(), vec![Bytes::from(vec![7u8; 8 << 20])]);
        let request = OutboundRequest::new(
            peer,
            ActorPath::parse("sink").expect("a path"),
            RequestKind::Ask,
            message,
            Deadline::after(Instant::now(), Duration::from_secs(60)),
            Box::new(outcome.clone()),
        );
        self.sender.send(request);
        outcome
    }

    /// What the driver was handed since the last look.
    fn taken(&self) -> Vec<OutboundRequest> {
        std::mem::take(&mut *lock(&self.driver.sent))
    }
}

/// A driver that keeps every request it is handed.
#[derive(Default)]
struct Keeper {
    sent: Mutex<Vec<OutboundRequest>>,
}

impl Outbound for Keeper {
    fn send(&self, request: OutboundRequest) {
        lock(&self.sent).push(request);
    }
}

impl Driver for Keeper {
    fn name(&self) -> &'static str {
        "keeper"
    }

    fn shutdown(&self) {}
}

/// A caller's completion: where its outcome lands.
#[derive(Clone, Default)]
struct Outcome(Arc<Mutex<Option<Result<Answer, Error>>>>);

impl Outcome {
    fn outcome(&self) -> Option<Result<Answer, Error>> {
        lock(&self.0).take()
    }
}

impl Completion for Outcome {
    fn complete(self: Box<Self>, outcome: Result<Answer, Error>) {
        *lock(&self.0) = Some(outcome);
    }

    fn is_cancelled(&self) -> bool {
        false
    }
}

fn framings(requests: &[OutboundRequest]) -> Vec<&'static str> {
    requests
        .iter()
        .map(|r| match r.framing {
            Framing::Whole => "whole",
            Framing::Stripe(_) => "stripe",
            Framing::Striped => "striped",
            Framing::Capabilities => "capabilities",
        })
        .collect()
}
