//! A client that pipelines: requests sent without waiting for the replies before them.

use std::time::Duration;

use bytes::Bytes;

use super::pair::{NodeMode, Pair, message};
use super::server::{ask_frame, frames, header};
use crate::ptr1::Frame;
use crate::session::server::{PIPELINED_REPLIES, PIPELINED_REPLY_BYTES};
use crate::session::{CloseReason, SessionConfig};
use crate::transport::Reply;

/// `count` asks to `/actors/echo`, ask `i` with one buffer of `base + i` bytes.
fn asks(count: usize, base: usize) -> Vec<u8> {
    (0..count)
        .flat_map(|i| ask_frame("/actors/echo", message(&[base + i])))
        .collect()
}

/// The buffer length of every reply, in order (panics on anything but a tensor reply).
fn reply_lens(replies: &[Frame]) -> Vec<usize> {
    replies
        .iter()
        .map(|frame| match frame {
            Frame::TensorResponse(message) => message.buffers[0].len(),
            other => panic!("expected a tensor reply, got {other:?}"),
        })
        .collect()
}

/// Everything the server writes while the client reads as fast as it can.
fn read_all(sut: &mut Pair) -> Vec<u8> {
    let mut written = Vec::new();
    loop {
        let bytes = sut.take_from_server();
        if bytes.is_empty() {
            return written;
        }
        written.extend(bytes);
        sut.drive();
    }
}

#[test]
fn replies_to_pipelined_requests_go_out_together_and_in_order() {
    let mut sut = Pair::new();
    sut.raw_to_server(&asks(16, 100));
    assert_eq!(sut.requests.len(), 16);
    let replies = frames(&sut.take_from_server());
    assert_eq!(reply_lens(&replies), (100..116).collect::<Vec<_>>());
    assert_eq!(
        sut.server_transmits, 1,
        "the sixteen replies were ready together: one transmit"
    );
    assert!(sut.server_closed.is_none());
}

#[test]
fn one_request_is_with_the_node_at_a_time() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    sut.raw_to_server(&asks(3, 10));
    assert_eq!(
        sut.requests.len(),
        1,
        "the next waits for this one's answer"
    );
    let reply = |n: &str| {
        Ok(Reply::Single {
            msg_type: n.into(),
            data: Bytes::new(),
        })
    };
    sut.answer(0, reply("a"));
    assert_eq!(sut.requests.len(), 2);
    sut.answer(1, reply("b"));
    sut.answer(2, reply("c"));
    let types: Vec<String> = frames(&sut.take_from_server())
        .into_iter()
        .map(|frame| match frame {
            Frame::SingleResponse { msg_type, .. } => msg_type,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(types, ["a", "b", "c"]);
}

#[test]
fn a_pipelining_client_that_does_not_read_holds_a_bounded_number_of_replies() {
    let mut sut = Pair::new();
    sut.pipe_capacity = 64 << 10;
    let total = 300;
    sut.raw_to_server(&asks(total, 4096));
    // Replies in the pipe (at most 64 KiB of ~4 KiB each), the one being written, and the
    // bounded queue behind it; nothing more is read.
    let in_pipe = (64 << 10) / 4096;
    let delivered = sut.requests.len();
    assert!(
        (PIPELINED_REPLIES..=PIPELINED_REPLIES + in_pipe + 1).contains(&delivered),
        "{delivered} requests read while the client reads nothing"
    );
    let replies = read_all(&mut sut);
    let lens = reply_lens(&frames(&replies));
    assert_eq!(lens, (4096..4096 + total).collect::<Vec<_>>());
}

#[test]
fn the_next_request_is_not_read_while_a_large_reply_is_written() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    sut.pipe_capacity = 64 << 10;
    sut.raw_to_server(&asks(2, 1));
    let large = usize::try_from(PIPELINED_REPLY_BYTES).unwrap();
    sut.answer(0, Ok(Reply::Tensor(message(&[large]))));
    assert_eq!(
        sut.requests.len(),
        1,
        "read only once the large reply is out"
    );
    let mut written = Vec::new();
    while sut.requests.len() < 2 {
        let bytes = sut.take_from_server();
        assert!(!bytes.is_empty(), "the server stopped writing");
        written.extend(bytes);
        sut.drive();
    }
    written.extend(sut.take_from_server());
    assert_eq!(reply_lens(&frames(&written)), [large]);
}

#[test]
fn a_malformed_frame_after_pipelined_requests_is_answered_after_their_replies() {
    let config = SessionConfig {
        drain_timeout: Duration::from_secs(2),
        ..SessionConfig::default()
    };
    let mut sut = Pair::with(config);
    let mut wire = asks(3, 10);
    wire.extend(header(9, 0, 0, &[]));
    wire.extend(asks(1, 50)); // after the bad frame: never read
    sut.raw_to_server(&wire);
    let replies = frames(&sut.take_from_server());
    assert_eq!(reply_lens(&replies[..3]), [10, 11, 12]);
    assert!(
        matches!(&replies[3..], [Frame::Error { text, .. }] if text.contains("unknown frame kind 9")),
        "{replies:?}"
    );
    assert_eq!(sut.requests.len(), 3);
    assert!(
        sut.to_client.finished,
        "write side shut down after the replies"
    );
    sut.advance(Duration::from_secs(2));
    assert!(matches!(sut.server_closed, Some(CloseReason::Drained)));
}

#[test]
fn a_client_that_finishes_sending_after_pipelining_gets_every_reply() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    sut.raw_to_server(&asks(3, 10));
    sut.to_server.finished = true;
    for seq in 0..3 {
        let request = sut.requests[usize::try_from(seq).unwrap()]
            .1
            .message
            .clone();
        sut.answer(seq, Ok(Reply::Tensor(request)));
    }
    assert_eq!(reply_lens(&frames(&sut.take_from_server())), [10, 11, 12]);
    assert!(matches!(sut.server_closed, Some(CloseReason::PeerClosed)));
}

#[test]
fn a_client_that_pipelines_has_more_of_its_requests_read_at_once() {
    let mut sut = Pair::new();
    let scratch = SessionConfig::default().scratch_len;
    sut.raw_to_server(&asks(64, 4096));
    assert_eq!(reply_lens(&frames(&sut.take_from_server())).len(), 64);
    assert_eq!(
        sut.server_scratch_max,
        4 * scratch,
        "scratch grows for a peer that pipelines"
    );
    // 64 × ~4.1 KiB: about 17 reads of 16 KiB (and as many of the bodies' rests) without the
    // growth; with it, a few of 16 KiB, then 64 KiB each.
    assert!(sut.server_reads <= 10, "{} reads", sut.server_reads);
}

#[test]
fn a_client_that_does_not_pipeline_keeps_the_small_scratch() {
    let mut sut = Pair::new();
    let scratch = SessionConfig::default().scratch_len;
    for size in [100, 20 << 10, 1 << 20, 4096, 3 << 20] {
        let answer = sut.ask(message(&[size, size / 2])).expect("echoed");
        assert!(matches!(answer, crate::transport::Answer::Reply(_)));
    }
    assert_eq!(sut.server_scratch_max, scratch);
}

#[test]
fn the_small_rest_of_a_body_is_read_with_the_requests_after_it() {
    // Scratch (16 KiB) takes two asks of 6 KiB and the start of a third: the third's rest
    // comes through scratch, with the fourth ask, in one more read (not a read of its own).
    let mut sut = Pair::new();
    sut.raw_to_server(&asks(4, 6 << 10));
    assert_eq!(reply_lens(&frames(&sut.take_from_server())).len(), 4);
    assert_eq!(sut.server_reads, 2);
}

#[test]
fn a_client_that_finishes_while_its_next_request_waits_still_gets_the_replies_before_it() {
    let mut sut = Pair::new();
    sut.node = NodeMode::Hold;
    sut.pipe_capacity = 16; // the first reply is still being written when the end arrives
    sut.raw_to_server(&asks(2, 10));
    sut.node = NodeMode::Full; // the second waits for mailbox space
    let first = sut.requests[0].1.message.clone();
    sut.answer(0, Ok(Reply::Tensor(first)));
    assert_eq!(sut.requests.len(), 2, "the second was read and waits");
    sut.to_server.finished = true;
    sut.drive();
    let written = read_all(&mut sut);
    assert_eq!(
        reply_lens(&frames(&written)),
        [10],
        "the first reply was written"
    );
    assert_eq!(sut.withdrawn, [1], "the waiting one was withdrawn");
    assert!(matches!(sut.server_closed, Some(CloseReason::PeerClosed)));
}

#[test]
fn replies_before_a_frame_without_a_readable_head_are_written_then_input_drained() {
    let config = SessionConfig {
        drain_timeout: Duration::from_secs(2),
        ..SessionConfig::default()
    };
    let mut sut = Pair::with(config);
    let mut wire = asks(3, 10);
    wire.extend(b"NOPE");
    wire.extend([0; 60]);
    sut.raw_to_server(&wire);
    assert_eq!(reply_lens(&frames(&sut.take_from_server())), [10, 11, 12]);
    assert!(
        sut.to_client.finished,
        "write side shut down after the replies"
    );
    assert!(sut.server_closed.is_none(), "draining");
    sut.advance(Duration::from_secs(2));
    assert!(matches!(sut.server_closed, Some(CloseReason::Drained)));
}
