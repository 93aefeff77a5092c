//! The request queue's bound: a request over it fails at once, and room comes back as
//! the core takes them.

use std::net::SocketAddr;

use bytes::Bytes;
use tensorwire_proto::session::ClientRequest;
use tensorwire_proto::transport::{ActorPath, Deadline, Error, Reply, RequestKind};
use tensorwire_proto::{Limits, TensorMessage};

use super::{CoreHandle, Outgoing};
use crate::pending::{AskCompletion, Pending, pair};

fn outgoing() -> (Outgoing, Pending<Reply>) {
    let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let (completer, pending) = pair();
    let request = ClientRequest::encode(
        RequestKind::Ask,
        &ActorPath::parse("echo").unwrap(),
        TensorMessage::new(1, Bytes::new(), vec![Bytes::from_static(b"x")]),
        &Limits::default(),
        Deadline::never(),
    )
    .unwrap();
    let outgoing = Outgoing {
        peer,
        request,
        completion: Box::new(AskCompletion { completer, peer }),
    };
    (outgoing, pending)
}

#[test]
fn a_request_beyond_the_queue_bound_fails_at_once_and_room_comes_back_as_the_core_takes_them() {
    let (handle, inbox) = CoreHandle::new(2).unwrap();
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let (outgoing, pending) = outgoing();
        handle.submit(outgoing);
        assert!(!pending.is_ready(), "queued, not failed");
        waiting.push(pending);
    }
    let (third, refused) = outgoing();
    handle.submit(third);
    let error = refused.wait().expect_err("over the bound");
    assert!(
        matches!(error, Error::Overloaded { capacity: 2, .. }),
        "{error:?}"
    );
    assert!(inbox.requests.try_recv().is_ok());
    let (fourth, pending) = outgoing();
    handle.submit(fourth);
    assert!(
        !pending.is_ready(),
        "the core took one: there is room again"
    );
    assert!(inbox.requests.try_recv().is_ok());
    assert!(inbox.requests.try_recv().is_ok());
    assert!(inbox.requests.is_empty());
    assert!(inbox.requests.try_recv().is_err());
}

#[test]
fn a_request_to_a_core_that_stopped_fails_as_shut_down_and_frees_its_place() {
    let (handle, inbox) = CoreHandle::new(1).unwrap();
    drop(inbox);
    for _ in 0..2 {
        let (outgoing, pending) = outgoing();
        handle.submit(outgoing);
        let error = pending.wait().expect_err("nobody takes it");
        assert!(matches!(error, Error::Shutdown), "{error:?}");
    }
}
