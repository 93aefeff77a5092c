//! The stripe sender against a driver that only keeps what it is handed: which requests are
//! striped, which a loopback peer's burst holds and when they go, and that a large request's
//! count comes back however it ends (answered, failed, dropped by its driver), so a loopback
//! peer is striped again once it is alone.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_proto::TensorMessage;
use tensorwire_proto::stripe::{CAPABILITIES_TYPE, Capabilities, Framing};
use tensorwire_proto::transport::{
    ActorPath, Answer, Completion, Deadline, Driver, Error, OutboundRequest, Reply, RequestKind,
};

use super::{LOOPBACK_THRESHOLD, StripeConfig, StripeSender};
use crate::node::keeper::Keeper;
use crate::sync::lock;

const LOOPBACK: &str = "127.0.0.1:7000";
const REMOTE: &str = "10.0.0.7:7000";

#[test]
fn a_burst_to_a_loopback_peer_waits_for_the_stripes_then_goes_whole_behind_the_request() {
    let t = Harness::new();
    let _first = t.send(LOOPBACK);
    let stripes = t.taken();
    assert_eq!(framings(&stripes), vec!["stripe"; 4], "alone: striped");
    let _second = t.send(LOOPBACK);
    let _third = t.send(LOOPBACK);
    assert!(
        t.taken().is_empty(),
        "held while the stripes are on their way"
    );
    ack(stripes);
    assert_eq!(
        framings(&t.taken()),
        vec!["striped", "whole", "whole"],
        "the request frame, then what was held, whole"
    );
    assert_eq!(
        crate::pending::timer_sizes().1,
        0,
        "the hold's timer was cancelled"
    );
}

#[test]
fn a_request_that_may_not_wait_that_long_is_not_held() {
    let t = Harness::new();
    let _first = t.send(LOOPBACK);
    let stripes = t.taken();
    let _hurried = t.send_within(LOOPBACK, Duration::from_secs(1));
    assert_eq!(
        framings(&t.taken()),
        vec!["whole"],
        "its deadline is before the stripes'"
    );
    drop(stripes);
}

#[test]
fn a_burst_is_held_no_longer_than_its_hold_allows() {
    let t = Harness::new();
    let _first = t.send(LOOPBACK);
    let stripes = t.taken();
    let _second = t.send(LOOPBACK);
    assert!(t.taken().is_empty(), "held");
    // The stripes never come in: after `MAX_HOLD` (a quarter of a minute is more) it goes.
    let waited = Instant::now();
    let mut sent = Vec::new();
    while sent.is_empty() && waited.elapsed() < super::MAX_HOLD * 5 {
        std::thread::sleep(Duration::from_millis(10));
        sent = t.taken();
    }
    assert_eq!(framings(&sent), vec!["whole"], "the hold ended");
    assert!(
        waited.elapsed() >= super::MAX_HOLD / 2,
        "not before its time"
    );
    let _third = t.send(LOOPBACK);
    assert_eq!(
        framings(&t.taken()),
        vec!["whole"],
        "no new hold for the same stripes"
    );
    drop(stripes);
}

#[test]
fn stripes_dropped_unanswered_send_what_was_held() {
    let t = Harness::new();
    let first = t.send(LOOPBACK);
    let stripes = t.taken();
    let _second = t.send(LOOPBACK);
    assert!(t.taken().is_empty());
    drop(stripes); // the driver lost them: the call ends
    assert!(first.outcome().is_none(), "nobody answered it");
    assert_eq!(framings(&t.taken()), vec!["whole"], "the held request goes");
}

#[test]
fn a_refused_stripe_sends_what_was_held_to_a_peer_asked_again() {
    let t = Harness::new();
    let first = t.send(LOOPBACK);
    let mut stripes = t.taken().into_iter();
    let _second = t.send(LOOPBACK);
    let refusal = Error::Remote {
        peer: None,
        text: "no stripes here".into(),
    };
    stripes
        .next()
        .expect("a stripe")
        .completion
        .complete(Err(refusal));
    assert!(matches!(first.outcome(), Some(Err(Error::Remote { .. }))));
    assert_eq!(
        framings(&t.taken()),
        vec!["capabilities"],
        "the held request waits for the peer's new answer"
    );
}

#[test]
fn a_failed_striped_request_gives_its_count_back() {
    let t = Harness::new();
    let first = t.send(LOOPBACK);
    let mut stripes = t.taken().into_iter();
    stripes
        .next()
        .expect("a stripe")
        .completion
        .complete(Err(Error::Shutdown));
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
    ack(t.taken());
    let request = t.taken();
    assert_eq!(
        framings(&request),
        vec!["striped"],
        "the stripes are in: the request goes"
    );
    let _second = t.send(LOOPBACK);
    let whole = t.taken();
    assert_eq!(
        framings(&whole),
        vec!["whole"],
        "beside an unanswered one: whole"
    );
    drop(whole); // the driver lost it without an answer
    answer(request);
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
    ack(stripes);
    let mut sent = t.taken().into_iter();
    let (request, whole) = (
        sent.next().expect("the request"),
        sent.next().expect("the held one"),
    );
    answer(vec![request]);
    t.send(LOOPBACK);
    assert_eq!(
        framings(&t.taken()),
        vec!["whole"],
        "the second is unanswered yet"
    );
    answer(vec![whole]);
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
        "one striped request at a time, none held"
    );
    ack(stripes);
    assert_eq!(framings(&t.taken()), vec!["striped"]);
    t.send(REMOTE);
    assert_eq!(
        framings(&t.taken()),
        vec!["stripe"; 4],
        "where one flow may be capped, striping beside unanswered requests still pays"
    );
}

fn ack(stripes: Vec<OutboundRequest>) {
    for stripe in stripes {
        stripe.completion.complete(Ok(Answer::Ack));
    }
}

fn answer(requests: Vec<OutboundRequest>) {
    for request in requests {
        request.completion.complete(Ok(Answer::Reply(Reply::Single {
            msg_type: "ack".into(),
            data: Bytes::new(),
        })));
    }
}

/// A stripe sender (4 stripes from 1 MiB, loopback from [`LOOPBACK_THRESHOLD`]) on a driver
/// that keeps what it is handed, both peers already known to take 16 stripes.
struct Harness {
    driver: Arc<Keeper>,
    sender: Arc<StripeSender>,
    /// Keeps the driver alive for the sender's weak reference.
    _as_driver: Arc<dyn Driver>,
    /// Holds schedule deadlines: no test that counts them runs meanwhile.
    _timers: std::sync::MutexGuard<'static, ()>,
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
            _timers: crate::pending::exclusive_timers(),
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
            ack(stripes);
            answer(t.taken());
            assert!(waiting.outcome().is_some());
        }
        t
    }

    /// Sends an ask of [`LOOPBACK_THRESHOLD`] bytes (striped to either peer) to `peer` with a
    /// minute to go; its outcome lands in the returned cell.
    fn send(&self, peer: &str) -> Outcome {
        self.send_within(peer, Duration::from_secs(60))
    }

    fn send_within(&self, peer: &str, timeout: Duration) -> Outcome {
        let peer: SocketAddr = peer.parse().expect("an address");
        let outcome = Outcome::default();
        static PAYLOAD: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
        let payload = PAYLOAD.get_or_init(|| {
            let len = usize::try_from(LOOPBACK_THRESHOLD).expect("fits");
            Bytes::from(vec![7u8; len])
        });
        let message = TensorMessage::new(0, Bytes::new(), vec![payload.clone()]);
        let request = OutboundRequest::new(
            peer,
            ActorPath::parse("sink").expect("a path"),
            RequestKind::Ask,
            message,
            Deadline::after(Instant::now(), timeout),
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
