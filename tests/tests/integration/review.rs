//! The defects found in the review of the engine under concurrency (issue 19), each with a test
//! that fails on the code before its fix. The driver-internal ones (a core whose ring fails)
//! are tested in `engine/src/uring/tests.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorwire_engine::{Error, Node, PoolConfig, Preference, Reply};
use tensorwire_proto::transport::{
    Answer, HandOff, Outbound, OutboundRequest, Transport, TransportFactory, TransportSetup,
};
use tensorwire_tests::*;

/// A plugged-in transport that misbehaves on purpose: it answers asks to `ack` with an Ack and
/// drops the requests to `drop` without answering them.
struct Misbehaving;

impl TransportFactory for Misbehaving {
    fn name(&self) -> &'static str {
        "misbehaving"
    }

    fn start(&self, _: TransportSetup) -> Result<Arc<dyn Transport>, Error> {
        Ok(Arc::new(Self))
    }
}

impl Outbound for Misbehaving {
    fn send(&self, request: OutboundRequest) {
        match request.path.to_string().as_str() {
            "/actors/ack" => request.completion.complete(Ok(Answer::Ack)),
            _ => drop(request.completion),
        }
    }
}

impl Transport for Misbehaving {
    fn name(&self) -> &'static str {
        "misbehaving"
    }
    fn handoff(&self) -> Option<Arc<dyn HandOff>> {
        None
    }
    fn encrypts(&self) -> bool {
        false
    }
    fn requires_encryption(&self) -> bool {
        false
    }
    fn connections(&self) -> usize {
        0
    }
    fn shutdown(&self) {}
}

fn misbehaving_node() -> Node {
    Node::builder(any_local_address())
        .in_process_delivery(false)
        .shared_memory(false)
        .preference(Preference::Http2)
        .transport(Arc::new(Misbehaving))
        .build()
        .unwrap()
}

#[test]
fn an_ack_answering_an_ask_is_blamed_on_the_peer_not_on_the_caller() {
    let _serial = serial();
    let node = misbehaving_node();
    let peer = "127.0.0.1:9".parse().unwrap();
    let err = node
        .ask(peer, "ack", patterned(1, 1, 16), TIMEOUT)
        .wait()
        .expect_err("an Ack is no reply to an ask");
    assert!(
        matches!(
            err,
            Error::UnexpectedReply {
                peer: p,
                request: "ask",
                reply: "Ack"
            } if p == peer
        ) && err.is_protocol(),
        "{err:?}"
    );
}

#[test]
fn a_request_its_transport_dropped_is_reported_as_abandoned_not_as_shutdown() {
    let _serial = serial();
    let node = misbehaving_node();
    let peer = "127.0.0.1:9".parse().unwrap();
    let err = node
        .ask(peer, "drop", patterned(1, 1, 16), TIMEOUT)
        .wait()
        .expect_err("nobody answered");
    assert!(matches!(err, Error::Abandoned), "{err:?}");
    assert!(!err.is_shutdown(), "the node is not shut down: {err}");
    // The node itself is fine.
    let err = node
        .ask(peer, "ack", patterned(1, 1, 16), TIMEOUT)
        .wait()
        .expect_err("an Ack");
    assert!(err.is_protocol(), "{err:?}");
}

#[test]
fn an_in_process_ask_beyond_the_mailbox_waiting_bound_is_overloaded_and_withdrawal_is_exact() {
    let _serial = serial();
    let node = Node::builder(any_local_address())
        .mailbox_capacity(1)
        .mailbox_waiting_capacity(3)
        .build()
        .unwrap();
    let inbox = node.endpoint("inbox").unwrap();
    let peer = node.local_addr();
    let ask = |i| node.ask(peer, "inbox", patterned(i, 1, 8), TIMEOUT);
    let queued = ask(0);
    let waiting: Vec<_> = (1..4).map(ask).collect();
    let err = ask(4).wait().expect_err("a fourth waiter was accepted");
    assert!(
        matches!(err, Error::Overloaded { capacity: 3, .. }) && err.is_limit(),
        "{err:?}"
    );
    // The middle waiter gives up: the others keep their order, and its place is free again.
    let mut waiting = waiting.into_iter();
    let (first, middle, last) = (waiting.next(), waiting.next(), waiting.next());
    drop(middle);
    let again = ask(5);
    let mut versions = Vec::new();
    for _ in 0..4 {
        let incoming = inbox.recv_blocking(Some(TIMEOUT)).unwrap().unwrap();
        let message = incoming.request().message.clone();
        versions.push(message.version);
        incoming.reply(Ok(Reply::Tensor(message)));
    }
    assert_eq!(versions, [0, 1, 3, 5]);
    for pending in [Some(queued), first, last, Some(again)]
        .into_iter()
        .flatten()
    {
        pending.wait().unwrap();
    }
}

#[test]
fn a_burst_s_memory_goes_back_within_seconds_of_idleness_on_both_drivers() {
    let _serial = serial();
    for driver in [Driver::Uring, Driver::Tokio] {
        let drivers = Drivers {
            client: driver,
            server: driver,
        };
        // The defaults: a burst's memory goes back within a few seconds.
        let pool = PoolConfig::default();
        let server = drivers.echo_server_with(|b| b.receive_pool(pool));
        // All eight asks at once (the default byte budget would send them one or two at a
        // time), so the burst is large.
        let client = drivers
            .client()
            .receive_pool(pool)
            .busy_bytes_per_peer(1 << 40)
            .build()
            .unwrap();
        let message = patterned(1, 4, 16 << 20);
        let peer = server.local_addr();
        assert_eq!(
            tensor(
                client
                    .ask(peer, "echo", patterned(2, 1, 64), TIMEOUT)
                    .wait()
                    .unwrap()
            ),
            patterned(2, 1, 64)
        );
        let before = resident_bytes();
        let asks: Vec<_> = (0..8)
            .map(|_| client.ask(peer, "echo", message.clone(), TIMEOUT))
            .collect();
        for ask in asks {
            assert_eq!(checksum(&tensor(ask.wait().unwrap())), checksum(&message));
        }
        let peak = resident_bytes();
        assert!(
            peak > before + (512 << 20),
            "{driver:?}: the burst took memory in the first place ({before} -> {peak} bytes)"
        );
        // Back to the working set plus both nodes' idle caches, within a few seconds.
        let allowed = before + 2 * pool.idle_keep_bytes + (32 << 20);
        let started = Instant::now();
        let mut now = resident_bytes();
        while now > allowed && started.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(100));
            now = resident_bytes();
        }
        assert!(
            now <= allowed,
            "{driver:?}: {now} bytes resident {:?} after the burst; at most {allowed} expected (peak {peak}, before {before})",
            started.elapsed()
        );
    }
}
