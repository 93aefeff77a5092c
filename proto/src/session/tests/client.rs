use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use proptest::prelude::*;

use super::pair::{NodeMode, Pair, message, peer};
use crate::Limits;
use crate::ptr1::{self, Frame};
use crate::session::{ClientEvent, ClientRequest, ClientSession, CloseReason, SessionConfig};
use crate::transport::{ActorPath, Answer, Deadline, Error, HeapMemory, Reply, RequestKind};

#[test]
fn an_idle_connection_notices_the_peer_closing_and_is_never_reused() {
    let mut sut = Pair::new();
    sut.ask(message(&[1])).unwrap();
    assert!(sut.client.is_reusable());
    sut.to_client.finished = true; // the server closes
    sut.drive();
    assert!(matches!(sut.client_closed, Some(CloseReason::PeerClosed)));
    assert!(!sut.client.is_reusable());
}

#[test]
fn bytes_nobody_asked_for_make_an_idle_connection_unusable() {
    let mut sut = Pair::new();
    sut.ask(message(&[1])).unwrap();
    sut.to_client.bytes.extend(b"PTR1 leftover");
    sut.drive();
    assert!(matches!(
        sut.client_closed,
        Some(CloseReason::UnexpectedData)
    ));
    assert!(!sut.client.is_reusable());
}

#[test]
fn a_reply_of_the_wrong_kind_fails_before_payload_memory_is_committed() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    sut.start(RequestKind::Tell, message(&[4]), Duration::from_secs(30));
    // A server that answers a tell with a TensorResponse of 1 MiB.
    sut.server_closed = Some(CloseReason::Shutdown); // take over the server's side
    let reply = ptr1::encode(
        &Frame::TensorResponse(message(&[1 << 20])),
        &Limits::default(),
    )
    .unwrap()
    .to_vec();
    let before = sut.memory.allocations.load(Relaxed);
    sut.to_client.bytes.extend(&reply);
    sut.drive();
    let error = sut.done.pop().unwrap().unwrap_err();
    assert!(
        matches!(
            error,
            Error::UnexpectedReply {
                request: "Tell",
                reply: "TensorResponse",
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(sut.memory.allocations.load(Relaxed), before);
    assert!(matches!(sut.client_closed, Some(CloseReason::OutOfStep)));
}

#[test]
fn an_error_reply_while_the_request_is_still_being_written_fails_it_and_the_rest_is_written() {
    let mut sut = Pair::new();
    sut.pipe_capacity = 64 << 10;
    let refuse = std::rc::Rc::new(std::cell::Cell::new(true));
    let refusing = std::rc::Rc::clone(&refuse);
    sut.admit = Box::new(move |_, _| {
        if refusing.get() {
            Err("not here".into())
        } else {
            Ok(())
        }
    });
    sut.start(
        RequestKind::Ask,
        message(&[8 << 20]),
        Duration::from_secs(30),
    );
    sut.drive();
    let error = sut.done.pop().unwrap().unwrap_err();
    assert_eq!(error.remote_text(), Some("not here"));
    // The server read past the refused body; the client wrote all of it: both in step, so
    // the connection carries the next request.
    assert!(sut.client_closed.is_none() && sut.server_closed.is_none());
    assert!(sut.client.is_reusable());
    refuse.set(false);
    assert_eq!(
        sut.ask(message(&[5])).map(|_| ()).ok(),
        Some(()),
        "the next ask on it is answered"
    );
}

#[test]
fn a_connect_timeout_is_reported_as_a_connect_timeout() {
    let memory: Arc<dyn crate::transport::ReceiveMemory> = Arc::new(HeapMemory::new(1 << 20));
    let config = Arc::new(SessionConfig::default());
    let start = std::time::Instant::now();
    let mut sut = ClientSession::connecting(config, memory, peer(), start);
    let request = ClientRequest::encode(
        RequestKind::Ask,
        &ActorPath::parse("echo").unwrap(),
        message(&[1]),
        &Limits::default(),
        Deadline::after(start, Duration::from_secs(30)),
    )
    .unwrap();
    sut.start(request, start).unwrap();
    assert!(
        sut.poll_transmit(start).is_none(),
        "nothing is written before the connect"
    );
    let at = sut.poll_timeout().unwrap();
    assert_eq!(at - start, Duration::from_secs(5));
    sut.handle_timeout(at);
    let Some(ClientEvent::Done {
        outcome: Err(error),
        ..
    }) = sut.poll_event()
    else {
        panic!("no outcome");
    };
    assert_eq!(error.to_string(), "connect timed out after 5s");
}

#[test]
fn a_connect_that_outlasts_its_timeout_is_given_up_even_without_a_request() {
    let memory: Arc<dyn crate::transport::ReceiveMemory> = Arc::new(HeapMemory::new(1 << 20));
    let start = std::time::Instant::now();
    let mut sut =
        ClientSession::connecting(Arc::new(SessionConfig::default()), memory, peer(), start);
    // A request whose deadline passed before it could start leaves the connect on its own.
    let late = ClientRequest::encode(
        RequestKind::Ask,
        &ActorPath::parse("echo").unwrap(),
        message(&[1]),
        &Limits::default(),
        Deadline::after(start, Duration::ZERO),
    )
    .unwrap();
    sut.start(late, start).unwrap();
    assert!(
        matches!(sut.poll_event(), Some(ClientEvent::Done { outcome: Err(e), .. }) if e.is_timeout())
    );
    let at = sut.poll_timeout().expect("the connect deadline");
    sut.handle_timeout(at);
    assert!(matches!(
        sut.poll_event(),
        Some(ClientEvent::Close(CloseReason::Timeout {
            phase: "connect",
            ..
        }))
    ));
    assert_eq!(sut.poll_timeout(), None, "nothing left to time out");
}

#[test]
fn a_request_deadline_shorter_than_the_connect_timeout_is_reported_as_the_requests() {
    let memory: Arc<dyn crate::transport::ReceiveMemory> = Arc::new(HeapMemory::new(1 << 20));
    let start = std::time::Instant::now();
    let mut sut =
        ClientSession::connecting(Arc::new(SessionConfig::default()), memory, peer(), start);
    let request = ClientRequest::encode(
        RequestKind::Tell,
        &ActorPath::parse("echo").unwrap(),
        message(&[1]),
        &Limits::default(),
        Deadline::after(start, Duration::from_millis(300)),
    )
    .unwrap();
    sut.start(request, start).unwrap();
    let at = sut.poll_timeout().unwrap();
    sut.handle_timeout(at);
    let Some(ClientEvent::Done {
        outcome: Err(error),
        ..
    }) = sut.poll_event()
    else {
        panic!("no outcome");
    };
    assert_eq!(error.to_string(), "tell timed out after 300ms");
}

#[test]
fn a_request_deadline_fails_the_request_and_closes_the_connection() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    sut.start(RequestKind::Ask, message(&[4]), Duration::from_secs(2));
    sut.drive();
    sut.advance(Duration::from_secs(2));
    let error = sut.done.pop().unwrap().unwrap_err();
    assert!(error.is_timeout(), "{error}");
    assert_eq!(error.to_string(), "ask timed out after 2s");
    assert!(matches!(sut.client_closed, Some(CloseReason::OutOfStep)));
}

#[test]
fn a_connection_lost_after_the_request_was_sent_fails_it_and_never_replays_it() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    sut.start(RequestKind::Ask, message(&[4]), Duration::from_secs(30));
    sut.drive();
    sut.server.shut_down();
    sut.drive();
    let error = sut.done.pop().unwrap().unwrap_err();
    assert!(error.is_connection(), "{error}");
    assert_eq!(sut.client_transmits, 1, "the request was written once");
    assert!(!sut.client.is_reusable());
}

#[test]
fn a_cancelled_request_closes_the_connection() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    sut.start(RequestKind::Ask, message(&[4]), Duration::from_secs(30));
    sut.drive();
    sut.client.cancel(sut.last());
    sut.drive();
    assert!(matches!(sut.done.pop(), Some(Err(Error::Cancelled))));
    assert!(matches!(sut.client_closed, Some(CloseReason::OutOfStep)));
}

#[test]
fn a_deadline_of_duration_max_never_fires() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    sut.start(RequestKind::Ask, message(&[4]), Duration::MAX);
    sut.drive();
    assert_eq!(sut.client.poll_timeout(), None);
    sut.run_for(Duration::from_secs(3600 * 24), Duration::from_secs(3600));
    assert!(sut.done.is_empty() && sut.client_closed.is_none());
    sut.answer(
        0,
        Ok(Reply::Single {
            msg_type: "ok".into(),
            data: bytes::Bytes::new(),
        }),
    );
    assert!(sut.done.pop().unwrap().is_ok());
}

#[test]
fn replies_of_every_kind_reach_the_asker() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    sut.start(RequestKind::Ask, message(&[1]), Duration::from_secs(30));
    sut.drive();
    sut.answer(
        0,
        Ok(Reply::Single {
            msg_type: "ack".into(),
            data: "12".into(),
        }),
    );
    assert_eq!(
        sut.done.pop().unwrap().unwrap(),
        Answer::Reply(Reply::Single {
            msg_type: "ack".into(),
            data: "12".into()
        })
    );
    sut.start(RequestKind::Ask, message(&[1]), Duration::from_secs(30));
    sut.drive();
    sut.answer(1, Err("handler failed: boom".into()));
    assert_eq!(
        sut.done.pop().unwrap().unwrap_err().remote_text(),
        Some("handler failed: boom")
    );
    assert!(
        sut.client.is_reusable(),
        "an Error reply leaves the connection in step"
    );
}

proptest! {
    #[test]
    fn round_trips_are_the_same_however_reads_are_split(
        lens in prop::collection::vec(0usize..5000, 0..6),
        chunk in 1usize..3000,
        tell in any::<bool>(),
    ) {
        let mut sut = Pair::new();
        sut.read_chunk = chunk;
        let request = message(&lens);
        if tell {
            sut.start(RequestKind::Tell, request.clone(), Duration::from_secs(30));
            sut.drive();
            prop_assert_eq!(sut.done.pop().unwrap().unwrap(), Answer::Ack);
            prop_assert_eq!(&sut.requests[0].1.message, &request);
        } else {
            let answer = sut.ask(request.clone()).unwrap();
            prop_assert_eq!(answer, Answer::Reply(Reply::Tensor(request)));
        }
        prop_assert!(sut.client.is_reusable());
        prop_assert_eq!(sut.memory.heap.charged(), 0);
    }
}

#[test]
fn a_connection_whose_request_was_refused_at_its_head_is_not_reused() {
    let server = SessionConfig {
        limits: Limits::builder().max_buffers(1).build(),
        ..SessionConfig::default()
    };
    let mut sut = Pair::with_configs(SessionConfig::default(), server);
    sut.start(RequestKind::Ask, message(&[1, 1]), Duration::from_secs(30));
    sut.drive();
    let error = sut.done.pop().unwrap().unwrap_err();
    assert!(
        error
            .remote_text()
            .unwrap()
            .starts_with("rejected request: buffer count is 2"),
        "{error}"
    );
    assert!(!sut.client.is_reusable(), "the server drains and closes it");
}
