//! The defects found in the review of the engine under concurrency (issue 19), each with a test
//! that fails on the code before its fix. The driver-internal ones (a core whose ring fails)
//! are tested in `engine/src/uring/tests.rs`.

use std::sync::Arc;

use tensorwire_engine::{Error, Node, Preference, Reply};
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
