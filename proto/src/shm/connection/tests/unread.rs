//! Replies lent in our slots that the peer does not read: they pause reading its requests by
//! the memory they hold, not by their small records, and a peer that reads none of them for
//! the stall time is disconnected.

use std::time::Duration;

use bytes::Bytes;

use super::pair::{Pair, config};
use super::{parts, shared};
use crate::shm::connection::{CloseReason, Role, WireReply};
use crate::shm::queue::record_size;

const SLOT: u64 = 64 << 10;

/// A server that pauses past 100,000 lent bytes, and a client that reads nothing.
fn lending_server() -> Pair {
    let mut server = config(Role::Server);
    server.read_pause_lent_bytes = 100_000;
    let mut pair = Pair::with(config(Role::Client), server);
    pair.client.reads = false;
    pair
}

/// Answers every request served so far with a reply in a 64 KiB slot: how many.
fn answer_in_slots(pair: &mut Pair) -> usize {
    let ids = pair.served_ids();
    for &id in &ids {
        let reply = WireReply::Tensor(parts(vec![shared(2, 0, 40 << 10, id)]));
        assert!(
            pair.server
                .conn
                .send_reply(id, reply, &[(2, 1 << 20)], SLOT)
        );
    }
    pair.drive();
    ids.len()
}

/// A lending server paused by two unread replies (128 KiB of slots).
fn paused_by_two_replies() -> Pair {
    let mut pair = lending_server();
    for _ in 0..2 {
        pair.asks(1);
        answer_in_slots(&mut pair);
    }
    pair
}

#[test]
fn a_server_reads_no_new_requests_while_replies_in_its_slots_are_not_read() {
    let mut pair = lending_server();
    pair.asks(1);
    assert_eq!(answer_in_slots(&mut pair), 1);
    pair.asks(1);
    assert_eq!(answer_in_slots(&mut pair), 1);
    assert!(
        pair.server.conn.queued_bytes() < 1000,
        "the records are small"
    );
    pair.asks(3);
    assert_eq!(
        answer_in_slots(&mut pair),
        0,
        "128 KiB of slots unread: reading paused"
    );
    assert_eq!(
        pair.to_server.queue.len(),
        3,
        "the requests wait in the queue"
    );
    pair.client.reads = true;
    pair.drive();
    assert_eq!(
        answer_in_slots(&mut pair),
        3,
        "the peer read its replies: reading resumes"
    );
    assert!(pair.server.conn.closed().is_none());
}

#[test]
fn a_peer_that_reads_none_of_its_lent_replies_is_disconnected_after_the_stall_time() {
    let mut pair = paused_by_two_replies();
    pair.asks(1);
    assert!(!pair.server.conn.wants_records());
    pair.advance(Duration::from_secs(4));
    assert!(pair.server.conn.closed().is_none());
    pair.advance(Duration::from_secs(1));
    assert!(matches!(
        pair.server.conn.closed(),
        Some(CloseReason::Stalled { .. })
    ));
}

#[test]
fn a_peer_that_keeps_reading_its_replies_is_never_paused_for_long_nor_disconnected() {
    let mut pair = lending_server();
    pair.client.reads = true;
    for _ in 0..20 {
        pair.asks(2);
        assert_eq!(answer_in_slots(&mut pair), 2);
        pair.advance(Duration::from_secs(1));
    }
    assert!(pair.server.conn.closed().is_none());
    assert!(pair.server.conn.wants_records());
    assert!(!pair.server.conn.reads_pending(), "every reply was read");
}

#[test]
fn a_peer_that_reads_slowly_restarts_the_stall_time_with_every_reply_it_reads() {
    let mut pair = lending_server();
    pair.asks(4);
    assert_eq!(answer_in_slots(&mut pair), 4, "read before the pause");
    assert!(!pair.server.conn.wants_records(), "256 KiB lent: paused");
    for _ in 0..3 {
        pair.advance(Duration::from_secs(4));
        assert!(pair.server.conn.closed().is_none());
        let record = pair.to_client.queue.pop_front().unwrap();
        pair.to_client.tail += record_size(record.len());
        pair.client.conn.handle_record(Bytes::from(record));
        Pair::consumed(&mut pair.server, &pair.to_client, pair.now);
    }
    pair.advance(Duration::from_secs(4));
    assert!(
        pair.server.conn.closed().is_none(),
        "a reply read every 4 s is progress"
    );
    assert!(
        pair.server.conn.wants_records(),
        "64 KiB lent: reading again"
    );
}

#[test]
fn a_tail_claimed_past_the_head_counts_everything_read_and_nothing_more() {
    let mut pair = paused_by_two_replies();
    assert!(pair.server.conn.paused_for_unread());
    pair.server
        .conn
        .handle_consumed(u64::MAX, pair.now + Duration::from_secs(1));
    assert!(!pair.server.conn.reads_pending());
    assert!(pair.server.conn.wants_records());
    pair.server.conn.handle_consumed(0, pair.now);
    assert!(
        pair.server.conn.wants_records(),
        "a tail moving back changes nothing"
    );
}
