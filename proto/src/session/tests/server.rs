use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Bytes;

use super::pair::{NodeMode, Pair, message};
use crate::ptr1::{self, Frame};
use crate::session::{CloseReason, SessionConfig};
use crate::transport::{Answer, Error, Reply, RequestKind};
use crate::transport::{LimitSide, OverLimit, RemoteKind};
use crate::{LimitExceeded, LimitField, Limits};

fn encoded(frame: &Frame) -> Vec<u8> {
    ptr1::encode(frame, &Limits::default()).unwrap().to_vec()
}

pub(super) fn ask_frame(path: &str, message: crate::TensorMessage) -> Vec<u8> {
    encoded(&Frame::Ask {
        path: path.into(),
        message,
    })
}

/// Decodes every frame the server wrote.
pub(super) fn frames(bytes: &[u8]) -> Vec<Frame> {
    let mut decoder = ptr1::Decoder::new(Limits::default());
    let mut rest = bytes;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (n, frame) = decoder.decode(rest).unwrap();
        out.extend(frame);
        rest = &rest[n..];
    }
    out
}

pub(super) fn header(kind: u8, path_len: u32, metadata_len: u64, lens: &[u64]) -> Vec<u8> {
    let mut h = b"PTR1".to_vec();
    h.extend_from_slice(&[kind, 0, 0, 0]);
    h.extend_from_slice(&7u32.to_le_bytes());
    h.extend_from_slice(&path_len.to_le_bytes());
    h.extend_from_slice(&metadata_len.to_le_bytes());
    h.extend_from_slice(&u32::try_from(lens.len()).unwrap().to_le_bytes());
    for len in lens {
        h.extend_from_slice(&len.to_le_bytes());
    }
    h
}

#[test]
fn an_ask_gets_its_reply_and_the_connection_stays_usable() {
    let mut sut = Pair::new();
    sut.read_chunk = 7; // every read returns at most 7 bytes
    let request = message(&[3, 0, 70_000]);
    let answer = sut.ask(request.clone()).unwrap();
    assert_eq!(answer, Answer::Reply(Reply::Tensor(request.clone())));
    assert!(sut.client.is_reusable());
    assert_eq!(
        sut.ask(request.clone()).unwrap(),
        Answer::Reply(Reply::Tensor(request))
    );
    assert_eq!(sut.requests.len(), 2);
    assert!(sut.server_closed.is_none());
}

#[test]
fn a_tell_is_acknowledged_only_once_it_is_in_the_mailbox() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Full;
    sut.start(RequestKind::Tell, message(&[10]), Duration::from_secs(30));
    sut.drive();
    assert_eq!(sut.requests.len(), 1, "delivered, waiting for space");
    assert!(sut.done.is_empty(), "no Ack while the mailbox is full");
    sut.advance(Duration::from_secs(5));
    assert!(sut.done.is_empty());
    sut.enqueue(0);
    assert_eq!(sut.done.pop().unwrap().unwrap(), Answer::Ack);
    assert!(sut.client.is_reusable());
}

#[test]
fn a_request_waiting_for_mailbox_space_is_withdrawn_and_answered_at_its_deadline() {
    let config = SessionConfig {
        enqueue_timeout: Duration::from_secs(3),
        ..SessionConfig::default()
    };
    let mut sut = Pair::with(config);
    sut.node = NodeMode::Full;
    sut.start(RequestKind::Tell, message(&[10]), Duration::from_secs(30));
    sut.drive();
    sut.advance(Duration::from_secs(2));
    assert!(sut.withdrawn.is_empty());
    sut.advance(Duration::from_secs(1));
    assert_eq!(sut.withdrawn, vec![0]);
    let error = sut.done.pop().unwrap().unwrap_err();
    let text = error.remote_text().unwrap();
    assert!(text.contains("/actors/echo stayed full for 3s"), "{text}");
    // A late Enqueued for the withdrawn request changes nothing; the connection goes on.
    sut.enqueue(0);
    assert!(sut.done.is_empty());
    assert!(sut.client.is_reusable() && sut.server_closed.is_none());
}

#[test]
fn a_request_that_got_in_just_as_its_wait_was_given_up_is_delivered_after_all() {
    let config = SessionConfig {
        enqueue_timeout: Duration::from_secs(3),
        ..SessionConfig::default()
    };
    let mut sut = Pair::with(config);
    sut.node = NodeMode::Full;
    sut.withdraw_succeeds = false; // a taker admitted it a moment before the withdraw
    sut.start(RequestKind::Tell, message(&[10]), Duration::from_secs(30));
    sut.drive();
    sut.advance(Duration::from_secs(3));
    assert_eq!(sut.withdrawn, vec![0]);
    assert_eq!(
        sut.done.pop().unwrap().unwrap(),
        Answer::Ack,
        "never told 'not delivered' for a request that was delivered"
    );
}

#[test]
fn a_peer_that_finished_sending_gets_its_answer_until_the_idle_deadline() {
    let config = SessionConfig {
        idle_timeout: Duration::from_secs(60),
        ..SessionConfig::default()
    };
    let mut sut = Pair::with(config);
    sut.node = NodeMode::Hold;
    sut.raw_to_server(&ask_frame("/actors/echo", message(&[4])));
    sut.to_server.finished = true;
    sut.drive();
    sut.advance(Duration::from_secs(59));
    assert!(sut.server_closed.is_none(), "still waiting for the handler");
    sut.advance(Duration::from_secs(1));
    assert!(
        matches!(sut.server_closed, Some(CloseReason::Timeout { phase, .. }) if phase.contains("finished sending")),
        "{:?}",
        sut.server_closed
    );
}

#[test]
fn a_client_leaving_while_its_request_waits_for_space_withdraws_it() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Full;
    sut.start(RequestKind::Tell, message(&[10]), Duration::from_secs(30));
    sut.drive();
    sut.client.cancel(sut.last());
    sut.drive();
    assert!(matches!(sut.client_closed, Some(CloseReason::OutOfStep)));
    assert_eq!(sut.withdrawn, vec![0]);
    assert!(matches!(sut.server_closed, Some(CloseReason::PeerClosed)));
}

#[test]
fn pipelined_requests_are_buffered_until_the_reply_is_out() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    let mut wire = ask_frame("/actors/a", message(&[5]));
    wire.extend(ask_frame("/actors/b", message(&[6])));
    sut.raw_to_server(&wire);
    assert_eq!(
        sut.requests.len(),
        1,
        "the second waits for the first reply"
    );
    sut.answer(
        0,
        Ok(Reply::Single {
            msg_type: "one".into(),
            data: Bytes::new(),
        }),
    );
    assert_eq!(sut.requests.len(), 2);
    assert_eq!(sut.requests[1].1.path, "/actors/b");
    sut.answer(
        1,
        Ok(Reply::Single {
            msg_type: "two".into(),
            data: Bytes::new(),
        }),
    );
    let replies: Vec<String> = frames(&sut.take_from_server())
        .into_iter()
        .map(|f| match f {
            Frame::SingleResponse { msg_type, .. } => msg_type,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(replies, ["one", "two"]);
}

#[test]
fn a_late_answer_to_an_earlier_request_is_ignored() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    let mut wire = ask_frame("/actors/a", message(&[5]));
    wire.extend(ask_frame("/actors/a", message(&[6])));
    sut.raw_to_server(&wire);
    sut.answer(0, Err("first".into()));
    sut.answer(0, Err("stale".into()));
    sut.answer(1, Err("second".into()));
    let texts: Vec<String> = frames(&sut.take_from_server())
        .into_iter()
        .map(|f| match f {
            Frame::Error { text, .. } => text,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(texts, ["first", "second"]);
}

#[test]
fn an_unknown_endpoint_is_refused_before_any_payload_memory_is_committed() {
    let mut sut = Pair::new();
    sut.admit = Box::new(|_, path| Err(format!("no endpoint at path {path:?}")));
    let error = sut.ask(message(&[1 << 20, 1 << 20])).unwrap_err();
    assert_eq!(
        error.remote_text(),
        Some("no endpoint at path \"/actors/echo\"")
    );
    assert_eq!(sut.memory.allocations.load(Relaxed), 0);
    assert!(sut.requests.is_empty());
    assert!(
        sut.client.is_reusable(),
        "the body was skipped: still in step"
    );
    assert_eq!(sut.memory.heap.charged(), 0);
}

#[test]
fn a_reply_kind_sent_as_a_request_is_answered_with_an_error_and_the_connection_stays() {
    let mut sut = Pair::new();
    let mut wire = encoded(&Frame::TensorResponse(message(&[100])));
    wire.extend(ask_frame("/actors/echo", message(&[4])));
    sut.raw_to_server(&wire);
    let replies = frames(&sut.take_from_server());
    assert!(
        matches!(&replies[0], Frame::Error { text, .. } if text.contains("unexpected request frame: TensorResponse")),
        "{replies:?}"
    );
    assert!(matches!(&replies[1], Frame::TensorResponse(_)));
    assert_eq!(
        sut.memory.allocated.load(Relaxed),
        4 + 4,
        "only the ask's metadata and buffer"
    );
}

#[test]
fn a_malformed_header_is_answered_then_the_server_drains_and_closes() {
    let config = SessionConfig {
        drain_timeout: Duration::from_secs(2),
        ..SessionConfig::default()
    };
    let mut sut = Pair::with(config);
    sut.raw_to_server(&header(9, 0, 0, &[]));
    let replies = frames(&sut.take_from_server());
    assert!(
        matches!(&replies[..], [Frame::Error { version: 7, text }] if text.contains("unknown frame kind 9")),
        "{replies:?}"
    );
    assert!(
        sut.to_client.finished,
        "write side shut down after the reply"
    );
    sut.raw_to_server(&[0; 100_000]);
    assert!(sut.server_closed.is_none(), "still draining");
    sut.advance(Duration::from_secs(2));
    assert!(matches!(sut.server_closed, Some(CloseReason::Drained)));
}

#[test]
fn a_silent_connection_is_closed_at_the_preface_deadline() {
    let mut sut = Pair::new();
    sut.drive();
    sut.advance(Duration::from_millis(4_900));
    assert!(sut.server_closed.is_none());
    sut.advance(Duration::from_millis(100));
    assert!(matches!(
        sut.server_closed,
        Some(CloseReason::Timeout {
            phase: "preface",
            ..
        })
    ));
}

#[test]
fn a_header_trickling_in_is_closed_at_the_head_deadline() {
    let mut sut = Pair::new();
    let wire = ask_frame("/actors/echo", message(&[4]));
    for byte in &wire[..20] {
        sut.raw_to_server(std::slice::from_ref(byte));
        sut.advance(Duration::from_millis(600));
        if sut.server_closed.is_some() {
            break;
        }
    }
    assert!(
        matches!(
            sut.server_closed,
            Some(CloseReason::Timeout {
                phase: "request head",
                ..
            })
        ),
        "{:?}",
        sut.server_closed
    );
}

#[test]
fn a_body_below_the_minimum_rate_is_closed() {
    let config = SessionConfig {
        min_rate: 1000,
        rate_window: Duration::from_secs(2),
        ..SessionConfig::default()
    };
    let mut sut = Pair::with(config);
    let wire = ask_frame("/actors/echo", message(&[100_000]));
    sut.raw_to_server(&wire[..60]);
    let mut sent = 60;
    // 500 bytes per second: half the minimum rate.
    while sut.server_closed.is_none() && sent < wire.len() {
        sut.raw_to_server(&wire[sent..sent + 500]);
        sent += 500;
        sut.advance(Duration::from_secs(1));
    }
    assert!(matches!(
        sut.server_closed,
        Some(CloseReason::TooSlow {
            what: "request body"
        })
    ));
    assert!(sent < 3_000, "closed after one window, at {sent} bytes");
}

#[test]
fn a_body_at_the_minimum_rate_is_received() {
    let config = SessionConfig {
        min_rate: 1000,
        rate_window: Duration::from_secs(2),
        ..SessionConfig::default()
    };
    let mut sut = Pair::with(config);
    sut.node = NodeMode::Hold;
    let wire = ask_frame("/actors/echo", message(&[10_000]));
    let mut sent = 0;
    while sent < wire.len() {
        let n = 1200.min(wire.len() - sent);
        sut.raw_to_server(&wire[sent..sent + n]);
        sent += n;
        sut.advance(Duration::from_secs(1));
    }
    assert!(sut.server_closed.is_none(), "{:?}", sut.server_closed);
    assert_eq!(sut.requests.len(), 1);
}

#[test]
fn an_idle_connection_is_closed_at_the_idle_deadline() {
    let config = SessionConfig {
        idle_timeout: Duration::from_secs(60),
        ..SessionConfig::default()
    };
    let mut sut = Pair::with(config);
    sut.ask(message(&[1])).unwrap();
    sut.advance(Duration::from_secs(59));
    assert!(sut.server_closed.is_none());
    sut.advance(Duration::from_secs(1));
    assert!(matches!(
        sut.server_closed,
        Some(CloseReason::Timeout {
            phase: "idle connection",
            ..
        })
    ));
    // The client's armed read sees the close: the idle connection leaves the pool.
    assert!(matches!(sut.client_closed, Some(CloseReason::PeerClosed)));
    assert!(!sut.client.is_reusable());
}

#[test]
fn a_slow_handler_is_not_cut_off_by_any_deadline() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    sut.start(RequestKind::Ask, message(&[8]), Duration::from_secs(3600));
    sut.drive();
    sut.run_for(Duration::from_secs(1000), Duration::from_secs(100));
    assert!(sut.server_closed.is_none());
    sut.answer(
        0,
        Ok(Reply::Single {
            msg_type: "late".into(),
            data: Bytes::new(),
        }),
    );
    assert!(matches!(
        sut.done.pop().unwrap().unwrap(),
        Answer::Reply(Reply::Single { msg_type, .. }) if msg_type == "late"
    ));
}

#[test]
fn a_reply_the_peer_does_not_read_is_closed_at_the_minimum_rate() {
    let config = SessionConfig {
        min_rate: 10_000,
        rate_window: Duration::from_secs(5),
        ..SessionConfig::default()
    };
    let mut sut = Pair::with(config);
    sut.pipe_capacity = 64 << 10;
    sut.client_reads = false;
    sut.start(
        RequestKind::Ask,
        message(&[1 << 20]),
        Duration::from_secs(3600),
    );
    sut.drive();
    assert_eq!(sut.requests.len(), 1);
    sut.run_for(Duration::from_secs(10), Duration::from_secs(1));
    assert!(matches!(
        sut.server_closed,
        Some(CloseReason::TooSlow { what: "reply" })
    ));
}

#[test]
fn foreign_first_bytes_are_handed_off_with_every_byte_read() {
    let mut sut = Pair::new();
    sut.raw_to_server(b"PRI * HTTP/2.0\r\n");
    assert!(matches!(sut.server_closed, Some(CloseReason::Shutdown)));
}

#[test]
fn a_tls_only_server_refuses_ptr1_with_an_error_frame() {
    let mut sut = Pair::new();
    let shared: std::sync::Arc<dyn crate::transport::ReceiveMemory> = sut.memory.clone();
    sut.server = crate::session::ServerSession::new(
        std::sync::Arc::new(SessionConfig::default()),
        shared,
        true,
        sut.now,
    );
    let error = sut.ask(message(&[4])).unwrap_err();
    assert!(
        error
            .remote_text()
            .is_some_and(|t| t.contains("requires TLS")),
        "{error}"
    );
    assert!(sut.requests.is_empty());
}

#[test]
fn a_client_that_half_closes_after_its_ask_still_gets_the_reply() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    sut.raw_to_server(&ask_frame("/actors/echo", message(&[4])));
    sut.to_server.finished = true;
    sut.drive();
    assert!(sut.server_closed.is_none(), "the handler is still at work");
    sut.answer(0, Err("done".into()));
    assert!(matches!(
        &frames(&sut.take_from_server())[..],
        [Frame::Error { .. }]
    ));
    assert!(matches!(sut.server_closed, Some(CloseReason::PeerClosed)));
}

#[test]
fn a_reply_over_the_limits_becomes_an_error_saying_so() {
    let config = SessionConfig {
        limits: Limits::builder().max_buffers(2).build(),
        ..SessionConfig::default()
    };
    let mut sut = Pair::with(config);
    sut.node = NodeMode::Hold;
    sut.start(RequestKind::Ask, message(&[1]), Duration::from_secs(30));
    sut.drive();
    sut.answer(0, Ok(Reply::Tensor(message(&[1, 1, 1]))));
    let error = sut.done.pop().unwrap().unwrap_err();
    assert!(
        matches!(&error, Error::Remote { text, .. } if text.starts_with("reply could not be sent: buffer count is 3")),
        "{error}"
    );
}

#[test]
fn a_request_over_limits_smaller_than_the_error_text_is_refused_with_the_whole_text() {
    let tiny = Limits::builder()
        .max_metadata_bytes(8)
        .max_wire_bytes(64)
        .build();
    let config = SessionConfig {
        limits: tiny,
        ..SessionConfig::default()
    };
    let mut sut = Pair::with(config);
    sut.raw_to_server(&header(1, 4, 1000, &[]));
    // A client whose limits are as small still reads the whole error reply.
    let mut decoder = ptr1::Decoder::new(tiny);
    let (_, frame) = decoder.decode(&sut.take_from_server()).unwrap();
    let Some(Frame::Error { text, .. }) = frame else {
        panic!("expected an Error reply, got {frame:?}");
    };
    let expected = RemoteKind::OverLimit(OverLimit {
        side: LimitSide::Peer,
        exceeded: LimitExceeded {
            field: LimitField::MetadataBytes,
            value: 1000,
            limit: 8,
        },
    });
    assert_eq!(RemoteKind::of_text(&text), expected, "{text}");
    assert!(sut.server_closed.is_none(), "answered, not closed");
}

#[test]
fn an_error_text_longer_than_an_error_reply_carries_is_cut_not_replaced() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    sut.start(RequestKind::Ask, message(&[1]), Duration::from_secs(30));
    sut.drive();
    sut.answer(0, Err(format!("ValueError: {}", "x".repeat(10_000))));
    let error = sut.done.pop().unwrap().unwrap_err();
    let text = error.remote_text().unwrap();
    assert!(text.starts_with("ValueError: xxx"), "{text}");
    assert_eq!(text.len(), 4096);
}
