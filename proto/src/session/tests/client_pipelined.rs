//! A client session with several requests on their way on one connection: frames written
//! together, replies matched in order, a request given up on without taking the others down.

use std::sync::Arc;
use std::time::Duration;

use super::pair::{NodeMode, Pair, ask, feed, message, peer};
use crate::Limits;
use crate::ptr1::{self, Frame};
use crate::session::{ClientEvent, ClientSession, CloseReason, SessionConfig};
use crate::transport::{Answer, Error, HeapMemory, ReceiveMemory, Reply, RequestKind};

/// The length of the only buffer of a reply.
fn reply_len(outcome: &Result<Answer, Error>) -> usize {
    match outcome {
        Ok(Answer::Reply(Reply::Tensor(message))) => message.buffers[0].len(),
        other => panic!("not a tensor reply: {other:?}"),
    }
}

#[test]
fn pipelined_asks_go_out_in_one_transmit_and_their_replies_match_in_order() {
    let mut sut = Pair::new();
    let sizes = [5, 700, 3, 4096, 1];
    let tokens: Vec<_> = sizes
        .iter()
        .map(|&n| sut.start(RequestKind::Ask, message(&[n]), Duration::from_secs(30)))
        .collect();
    assert_eq!(sut.client.in_flight(), sizes.len());
    sut.drive();
    assert_eq!(
        sut.client_transmits, 1,
        "the five frames were written together"
    );
    assert_eq!(sut.done_tokens, tokens);
    let lens: Vec<_> = sut.done.iter().map(reply_len).collect();
    assert_eq!(lens, sizes);
    assert_eq!(sut.requests.len(), sizes.len());
    assert!(sut.client.is_reusable());
}

#[test]
fn a_request_started_while_another_is_written_goes_out_next() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    let first = sut.start(RequestKind::Ask, message(&[8]), Duration::from_secs(30));
    sut.drive();
    let second = sut.start(RequestKind::Tell, message(&[9]), Duration::from_secs(30));
    sut.drive();
    assert_eq!(sut.client_transmits, 2);
    assert!(sut.done.is_empty(), "the held ask is not answered yet");
    sut.answer(0, Ok(Reply::Tensor(message(&[2]))));
    assert_eq!(sut.done_tokens, vec![first, second]);
    assert_eq!(reply_len(&sut.done[0]), 2);
    assert!(matches!(sut.done[1], Ok(Answer::Ack)));
    assert!(sut.client.is_reusable());
}

#[test]
fn a_pipelined_request_past_its_deadline_fails_alone_and_its_late_reply_is_dropped() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    let slow = sut.start(RequestKind::Ask, message(&[4]), Duration::from_secs(30));
    let hurried = sut.start(RequestKind::Ask, message(&[5]), Duration::from_secs(1));
    let third = sut.start(RequestKind::Ask, message(&[6]), Duration::from_secs(30));
    sut.drive();
    sut.advance(Duration::from_secs(2));
    assert_eq!(
        sut.done_tokens,
        vec![hurried],
        "only the hurried one is over"
    );
    assert!(sut.done[0].as_ref().is_err_and(Error::is_timeout));
    assert!(
        sut.client_closed.is_none(),
        "the others keep the connection"
    );
    // The server answers all three, in order; the hurried one's reply is read and dropped.
    sut.answer(0, Ok(Reply::Tensor(message(&[40]))));
    sut.answer(1, Ok(Reply::Tensor(message(&[50]))));
    sut.answer(2, Ok(Reply::Tensor(message(&[60]))));
    assert_eq!(sut.done_tokens, vec![hurried, slow, third]);
    assert_eq!(reply_len(&sut.done[1]), 40);
    assert_eq!(reply_len(&sut.done[2]), 60);
    assert!(sut.client.is_reusable(), "in step after the dropped reply");
}

#[test]
fn cancelling_a_request_not_yet_handed_out_leaves_nothing_on_the_wire() {
    let mut sut = Pair::new();
    let kept = sut.start(RequestKind::Ask, message(&[3]), Duration::from_secs(30));
    let dropped = sut.start(RequestKind::Ask, message(&[4]), Duration::from_secs(30));
    sut.client.cancel(dropped);
    sut.drive();
    assert_eq!(sut.done_tokens, vec![dropped, kept]);
    assert!(matches!(sut.done[0], Err(Error::Cancelled)));
    assert_eq!(reply_len(&sut.done[1]), 3);
    assert_eq!(
        sut.requests.len(),
        1,
        "the server never saw the cancelled one"
    );
    assert!(sut.client.is_reusable());
}

#[test]
fn a_connection_whose_every_request_was_given_up_on_closes() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    let first = sut.start(RequestKind::Ask, message(&[3]), Duration::from_secs(30));
    let second = sut.start(RequestKind::Ask, message(&[3]), Duration::from_secs(30));
    sut.drive();
    sut.client.cancel(second);
    sut.drive();
    assert!(sut.client_closed.is_none(), "the first one still waits");
    sut.client.cancel(first);
    sut.drive();
    assert!(matches!(sut.client_closed, Some(CloseReason::OutOfStep)));
    assert_eq!(sut.done_tokens, vec![second, first]);
    assert!(sut.done.iter().all(|d| matches!(d, Err(Error::Cancelled))));
}

#[test]
fn the_peer_closing_mid_pipeline_fails_the_requests_it_did_not_answer() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    let tokens: Vec<_> = (0..5)
        .map(|_| sut.start(RequestKind::Ask, message(&[7]), Duration::from_secs(30)))
        .collect();
    sut.drive();
    sut.answer(0, Ok(Reply::Tensor(message(&[1]))));
    sut.to_client.finished = true; // the server goes away after its first reply
    sut.drive();
    assert_eq!(sut.done_tokens, tokens, "one outcome each, in order");
    assert_eq!(reply_len(&sut.done[0]), 1);
    for outcome in &sut.done[1..] {
        assert!(
            matches!(outcome, Err(Error::ConnectionClosed { .. })),
            "{outcome:?}"
        );
    }
    // The ones behind the first failure are told its cause, the same for each (not nested
    // once more per request: 64 of them made texts of kilobytes).
    let text = |i: usize| sut.done[i].as_ref().unwrap_err().to_string();
    assert_eq!(text(2), text(4));
    assert!(text(4).len() < 2 * text(1).len() + 64, "{}", text(4));
    assert!(matches!(sut.client_closed, Some(CloseReason::PeerClosed)));
}

#[test]
fn a_session_whose_write_failed_takes_no_more_requests() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    sut.start(RequestKind::Ask, message(&[3]), Duration::from_secs(30));
    sut.drive();
    assert!(sut.client.can_take());
    sut.client
        .handle_write_error(std::io::ErrorKind::BrokenPipe.into(), sut.now);
    assert!(!sut.client.can_take());
    assert!(sut.client_closed.is_none(), "the read decides");
}

#[test]
fn a_reply_heard_before_its_coalesced_write_is_reported_matches_and_keeps_the_connection() {
    // io_uring reports a transmit written only once all of it is: the peer may answer the
    // first frame of it before the driver hears that.
    let now = std::time::Instant::now();
    let memory: Arc<dyn ReceiveMemory> = Arc::new(HeapMemory::new(1 << 20));
    let mut client = ClientSession::connected(Arc::new(SessionConfig::default()), memory, peer());
    let first = client.start(ask(3, now), now).unwrap();
    let second = client.start(ask(4, now), now).unwrap();
    let transmit = client.poll_transmit(now).expect("both frames");
    let reply = |n: usize| {
        ptr1::encode(&Frame::TensorResponse(message(&[n])), &Limits::default())
            .unwrap()
            .to_vec()
    };
    feed(&mut client, &reply(30), now);
    assert!(matches!(
        client.poll_event(),
        Some(ClientEvent::Done { token, outcome: Ok(_) }) if token == first
    ));
    assert!(!client.is_reusable(), "its frame is still being written");
    let written = usize::try_from(transmit.remaining()).unwrap();
    client.handle_written(written, now);
    feed(&mut client, &reply(40), now);
    let Some(ClientEvent::Done { token, outcome }) = client.poll_event() else {
        panic!("the second reply")
    };
    assert_eq!(token, second);
    assert_eq!(reply_len(&outcome), 40);
    assert!(client.poll_event().is_none(), "nothing closed");
    assert!(client.is_reusable());
}

#[test]
fn a_pipelined_write_stalled_behind_an_unanswered_request_is_not_too_slow() {
    let config = SessionConfig {
        min_rate: 1 << 20,
        rate_window: Duration::from_secs(1),
        ..SessionConfig::default()
    };
    let mut sut = Pair::with(config);
    sut.node = NodeMode::Hold;
    sut.pipe_capacity = 16 << 10;
    let slow = sut.start(RequestKind::Ask, message(&[4]), Duration::from_secs(60));
    let behind = sut.start(
        RequestKind::Ask,
        message(&[1 << 20]),
        Duration::from_secs(60),
    );
    sut.drive();
    // The handler takes 10 s; the server reads no further meanwhile.
    sut.run_for(Duration::from_secs(10), Duration::from_millis(500));
    assert!(sut.done.is_empty(), "{:?}", sut.done);
    assert!(sut.client_closed.is_none());
    sut.answer(0, Ok(Reply::Tensor(message(&[2]))));
    sut.answer(1, Ok(Reply::Tensor(message(&[3]))));
    assert_eq!(sut.done_tokens, vec![slow, behind]);
    assert!(sut.done.iter().all(Result::is_ok), "{:?}", sut.done);
}
