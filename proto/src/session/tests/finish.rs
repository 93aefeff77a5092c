//! A graceful close of the server side: what is in progress is finished, then the session
//! closes; nothing new is started.

use std::time::Duration;

use bytes::Bytes;

use super::pair::{NodeMode, Pair, message};
use crate::session::CloseReason;
use crate::transport::{Answer, Reply, RequestKind};

#[test]
fn an_idle_session_closes_as_soon_as_it_is_told_to_finish() {
    let mut sut = Pair::new();
    let request = message(&[3]);
    assert!(sut.ask(request).is_ok());
    sut.server.finish(sut.now);
    sut.drive();
    assert!(matches!(sut.server_closed, Some(CloseReason::Shutdown)));
}

#[test]
fn an_ask_with_its_handler_is_answered_in_full_before_the_session_closes() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    sut.pipe_capacity = 4096; // the reply needs many writes
    sut.start(RequestKind::Ask, message(&[8]), Duration::from_secs(30));
    sut.drive();
    assert_eq!(sut.requests.len(), 1);
    sut.server.finish(sut.now);
    sut.drive();
    assert!(sut.server_closed.is_none(), "the handler has the request");
    let reply = message(&[300_000]);
    sut.answer(0, Ok(Reply::Tensor(reply.clone())));
    assert_eq!(
        sut.done.pop().unwrap().unwrap(),
        Answer::Reply(Reply::Tensor(reply))
    );
    assert!(matches!(sut.server_closed, Some(CloseReason::Shutdown)));
}

#[test]
fn a_tell_waiting_for_mailbox_space_is_acknowledged_before_the_session_closes() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Full;
    sut.start(RequestKind::Tell, message(&[10]), Duration::from_secs(30));
    sut.drive();
    sut.server.finish(sut.now);
    sut.drive();
    assert!(sut.server_closed.is_none());
    sut.enqueue(0);
    assert_eq!(sut.done.pop().unwrap().unwrap(), Answer::Ack);
    assert!(matches!(sut.server_closed, Some(CloseReason::Shutdown)));
}

#[test]
fn a_request_refused_while_finishing_gets_its_error_before_the_session_closes() {
    let mut sut = Pair::new();
    sut.admit = Box::new(|_, _| Err("the node is closing".to_owned()));
    sut.server.finish(sut.now);
    // Closed at once: a connection that was idle takes no new request.
    sut.drive();
    assert!(matches!(sut.server_closed, Some(CloseReason::Shutdown)));

    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    sut.start(RequestKind::Ask, message(&[4]), Duration::from_secs(30));
    sut.drive();
    sut.admit = Box::new(|_, _| Err("the node is closing".to_owned()));
    sut.server.finish(sut.now);
    // A second request pipelined behind the first waits for its reply, then is refused.
    sut.to_server.bytes.extend(second_ask());
    sut.drive();
    sut.answer(
        0,
        Ok(Reply::Single {
            msg_type: "one".into(),
            data: Bytes::new(),
        }),
    );
    assert!(sut.done.pop().unwrap().is_ok(), "the first is answered");
    assert!(matches!(sut.server_closed, Some(CloseReason::Shutdown)));
}

fn second_ask() -> Vec<u8> {
    let frame = crate::ptr1::Frame::Ask {
        path: "/actors/echo".into(),
        message: message(&[2]),
    };
    crate::ptr1::encode(&frame, &crate::Limits::default())
        .unwrap()
        .to_vec()
}
