//! Two connections joined in memory ([`Pair`]): the client's queue feeds the server and back,
//! `Map` datagrams wait on a socket that is read only when a session asks for it (the worst
//! order a real driver can see), and time is virtual.

mod pair;
mod unread;

use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::shm::wire::{Part, Shared};
use pair::{Pair, config};

fn shared(segment: u64, offset: u64, len: u64, lease: u64) -> Part {
    Part::Shared(Shared {
        segment,
        offset,
        len,
        lease,
    })
}

fn parts(parts: Vec<Part>) -> Body {
    Body::Parts {
        version: 1,
        metadata: Part::Inline(Bytes::from_static(b"meta")),
        buffers: parts,
    }
}

const SEG: u64 = 4;
const SEG_LEN: u64 = 1 << 20;

#[test]
fn an_ask_naming_shared_memory_is_served_and_answered_on_its_connection() {
    let mut pair = Pair::new();
    let id = pair.ask(parts(vec![shared(SEG, 4096, 1000, 9)]), &[(SEG, SEG_LEN)]);
    let (served, body) = pair.served();
    assert_eq!((served, body.leases()), (id, vec![9]));
    let reply = WireReply::Tensor(parts(vec![shared(2, 0, 64, 77)]));
    assert!(
        pair.server
            .conn
            .send_reply(id, reply.clone(), &[(2, 4096)], 0)
    );
    pair.drive();
    assert_eq!(
        pair.client.take(),
        vec![ConnEvent::Reply {
            id,
            kind: RequestKind::Ask,
            reply
        }]
    );
    assert!(pair.client.conn.is_idle() && pair.server.conn.is_idle());
}

#[test]
fn a_segment_is_announced_once_per_connection() {
    let mut pair = Pair::new();
    for _ in 0..3 {
        pair.ask(parts(vec![shared(SEG, 0, 10, 1)]), &[(SEG, SEG_LEN)]);
        pair.served();
    }
    assert!(pair.to_server.socket.is_empty());
    let mut second = Pair::new();
    second
        .client
        .conn
        .send_request(
            second.now,
            RequestKind::Tell,
            "/actors/sink".into(),
            parts(vec![shared(SEG, 0, 10, 1)]),
            &[(SEG, SEG_LEN)],
            None,
        )
        .unwrap();
    let maps = std::iter::from_fn(|| {
        let t = second.client.conn.poll_transmit()?.clone();
        second.client.conn.handle_transmitted();
        Some(t)
    })
    .filter(|t| matches!(t, Transmit::Map { .. }))
    .count();
    assert_eq!(
        maps, 1,
        "the Map datagram goes before the record that names it"
    );
}

#[test]
fn a_reply_for_an_id_of_another_connection_is_never_taken_and_its_leases_go_back() {
    // The forger's connection carries no request; the reply names an id that is waiting on
    // another connection of the same node.
    let mut honest = Pair::new();
    let id = honest.ask(Body::Inline(Bytes::from_static(b"q")), &[]);
    honest.served();
    let mut forger = Pair::new();
    forger.to_client.socket.push_back(
        encode(&Control::Map {
            segment: 5,
            len: 4096,
        })
        .unwrap(),
    );
    forger.client.conn.handle_datagram(
        &forger.to_client.socket.pop_front().unwrap(),
        FdArrival::Arrived,
    );
    Pair::events(&mut forger.client, &mut forger.to_client);
    let forged = encode(&Control::Reply {
        id,
        reply: WireReply::Tensor(parts(vec![shared(5, 0, 8, 31)])),
    })
    .unwrap();
    forger.client.conn.handle_record(Bytes::from(forged));
    forger.drive();
    assert_eq!(forger.client.take(), vec![], "nobody there waits for it");
    assert_eq!(
        forger.server.take(),
        vec![ConnEvent::Released { leases: vec![31] }],
        "the forger's lease goes straight back"
    );
    assert_eq!(honest.client.take(), vec![], "the real ask still waits");
    assert_eq!(honest.client.conn.in_flight(), 1);
}

#[test]
fn an_ask_fails_at_its_deadline_and_a_late_reply_gives_its_leases_back() {
    let mut pair = Pair::new();
    let deadline = pair.now + Duration::from_millis(100);
    let id = pair
        .client
        .conn
        .send_request(
            pair.now,
            RequestKind::Ask,
            "/actors/slow".into(),
            Body::Inline(Bytes::new()),
            &[],
            Some(deadline),
        )
        .unwrap();
    pair.drive();
    pair.served();
    assert_eq!(pair.client.conn.poll_timeout(), Some(deadline));
    pair.advance(Duration::from_millis(100));
    assert_eq!(
        pair.client.take(),
        vec![ConnEvent::Failed {
            id,
            kind: RequestKind::Ask,
            why: Failure::Deadline
        }]
    );
    let late = WireReply::Tensor(parts(vec![shared(2, 0, 8, 50)]));
    pair.server.conn.send_reply(id, late, &[(2, 4096)], 0);
    pair.drive();
    assert_eq!(pair.client.take(), vec![]);
    assert_eq!(
        pair.server.take(),
        vec![ConnEvent::Released { leases: vec![50] }]
    );
}

#[test]
fn a_timeout_of_zero_fails_at_once_without_sending() {
    let mut pair = Pair::new();
    let sent = pair.client.conn.send_request(
        pair.now,
        RequestKind::Tell,
        "/actors/sink".into(),
        Body::Inline(Bytes::new()),
        &[],
        Some(pair.now),
    );
    assert_eq!(sent, Err(SendError::Deadline));
    assert!(pair.client.conn.poll_transmit().is_none());
}

#[test]
fn a_peer_that_stops_reading_is_disconnected_after_the_stall_limit() {
    let mut pair = Pair::new();
    let id = pair.ask(Body::Inline(Bytes::new()), &[]);
    pair.served();
    pair.server.room = false;
    pair.server.conn.send_reply(
        id,
        WireReply::Single {
            msg_type: "ack".into(),
            data: Bytes::new(),
        },
        &[],
        0,
    );
    pair.drive();
    pair.advance(Duration::from_secs(4));
    assert!(pair.server.conn.closed().is_none());
    pair.advance(Duration::from_secs(1));
    assert!(matches!(
        pair.server.conn.closed(),
        Some(CloseReason::Stalled { .. })
    ));
}

fn small_server() -> Pair {
    let mut server = config(Role::Server);
    server.read_pause_bytes = 10_000;
    server.max_queued_bytes = 30_000;
    let mut pair = Pair::with(config(Role::Client), server);
    pair.server.room = false; // the client never reads its replies
    pair
}

fn answer_all(pair: &mut Pair) -> usize {
    let data = Bytes::from(vec![0u8; 4000]);
    let ids = pair.served_ids();
    for &id in &ids {
        let single = WireReply::Single {
            msg_type: "x".into(),
            data: data.clone(),
        };
        pair.server.conn.send_reply(id, single, &[], 0);
    }
    pair.drive();
    ids.len()
}

#[test]
fn a_server_reads_no_new_requests_while_its_replies_are_not_read() {
    let mut pair = small_server();
    pair.asks(3);
    assert_eq!(answer_all(&mut pair), 3);
    assert!(pair.server.conn.queued_bytes() > 10_000);
    pair.asks(5);
    assert_eq!(answer_all(&mut pair), 0, "reading paused");
    assert_eq!(
        pair.to_server.queue.len(),
        5,
        "the requests wait in the queue"
    );
    assert!(pair.server.conn.closed().is_none());
}

#[test]
fn a_server_whose_replies_pass_the_queued_bound_closes_the_connection() {
    let mut pair = small_server();
    pair.asks(20);
    answer_all(&mut pair);
    assert!(matches!(
        pair.server.conn.closed(),
        Some(CloseReason::NotReading { .. })
    ));
    assert_eq!(
        pair.server.conn.queued_bytes(),
        0,
        "what it queued is dropped"
    );
}

#[test]
fn a_client_refuses_requests_while_the_peer_reads_nothing() {
    let mut client = config(Role::Client);
    client.max_queued_bytes = 1000;
    let mut pair = Pair::with(client, config(Role::Server));
    pair.client.room = false;
    let body = Body::Inline(Bytes::from(vec![1u8; 600]));
    let send = |pair: &mut Pair| {
        pair.client.conn.send_request(
            pair.now,
            RequestKind::Tell,
            "/actors/sink".into(),
            body.clone(),
            &[],
            None,
        )
    };
    assert!(send(&mut pair).is_ok());
    assert!(send(&mut pair).is_ok());
    assert!(matches!(send(&mut pair), Err(SendError::PeerNotReading(_))));
}

#[test]
fn a_message_naming_a_segment_before_its_map_waits_for_the_socket() {
    let mut pair = Pair::new();
    // The Map datagram is on the socket, the record in the queue: the server reads the
    // queue first, asks for the socket, then serves.
    let id = pair.ask(parts(vec![shared(SEG, 0, 8, 1)]), &[(SEG, SEG_LEN)]);
    let (served, _) = pair.served();
    assert_eq!(served, id);
}

#[test]
fn a_message_naming_a_segment_never_announced_closes_the_connection() {
    let mut pair = Pair::new();
    pair.ask(parts(vec![shared(SEG, 0, 8, 1)]), &[]);
    assert!(matches!(
        pair.server.conn.closed(),
        Some(CloseReason::Protocol(text)) if text.contains("never announced")
    ));
}

#[test]
fn a_part_past_its_segment_is_refused_with_an_error_and_its_leases_go_back() {
    let mut pair = Pair::new();
    let id = pair.ask(
        parts(vec![shared(SEG, SEG_LEN - 4, 8, 6)]),
        &[(SEG, SEG_LEN)],
    );
    assert_eq!(pair.server.take(), vec![]);
    let events = pair.client.take();
    assert!(
        matches!(&events[..], [
            ConnEvent::Released { leases },
            ConnEvent::Reply { id: got, reply: WireReply::Error(text), .. }
        ] if *got == id && text.contains("ends at byte") && leases == &[6]),
        "{events:?}"
    );
    assert!(
        pair.server.conn.closed().is_none(),
        "the connection keeps serving"
    );
}

#[test]
fn a_lost_descriptor_fails_what_names_it_cleanly_and_the_segment_is_announced_again() {
    let mut pair = Pair::new();
    pair.server.loses_descriptors = true;
    let id = pair.ask(parts(vec![shared(SEG, 0, 8, 3)]), &[(SEG, SEG_LEN)]);
    let events = pair.client.take();
    assert!(
        matches!(&events[..], [
            ConnEvent::Released { leases },
            ConnEvent::Reply { id: got, reply: WireReply::Error(text), .. }
        ] if *got == id && text.contains("descriptor limit") && leases == &[3]),
        "{events:?}"
    );
    pair.server.loses_descriptors = false;
    pair.ask(parts(vec![shared(SEG, 0, 8, 4)]), &[(SEG, SEG_LEN)]);
    let (_, body) = pair.served();
    assert_eq!(body.leases(), vec![4], "announced again after Unmapped");
}

/// The `Map` datagram announcing a 4 KiB `segment`.
fn map_datagram(segment: u64) -> Vec<u8> {
    encode(&Control::Map { segment, len: 4096 }).unwrap()
}

#[test]
fn a_segment_announced_twice_or_through_the_queue_closes_the_connection() {
    let map = map_datagram(1);
    let mut twice = ShmConnection::new(config(Role::Server));
    twice.handle_datagram(&map, FdArrival::Arrived);
    twice.handle_datagram(&map, FdArrival::Arrived);
    assert!(matches!(twice.closed(), Some(CloseReason::Protocol(t)) if t.contains("twice")));
    let mut queued = ShmConnection::new(config(Role::Server));
    queued.handle_record(Bytes::from(map.clone()));
    assert!(matches!(queued.closed(), Some(CloseReason::Protocol(_))));
}

#[test]
fn a_segment_announced_without_its_descriptor_closes_the_connection() {
    let mut sut = ShmConnection::new(config(Role::Server));
    sut.handle_datagram(&map_datagram(1), FdArrival::None);
    assert!(
        matches!(sut.closed(), Some(CloseReason::Protocol(t)) if t.contains("without its descriptor")),
        "{:?}",
        sut.closed()
    );
}

#[test]
fn a_bell_is_taken_from_the_socket_only_and_only_without_descriptors() {
    let bell = encode(&Control::Bell).unwrap();
    let mut rung = ShmConnection::new(config(Role::Server));
    for _ in 0..3 {
        rung.handle_datagram(&bell, FdArrival::None);
    }
    assert_eq!(rung.closed(), None, "bells ask for nothing but a look");
    assert_eq!(rung.poll_event(), None);
    for arrival in [FdArrival::Arrived, FdArrival::Lost] {
        let mut sut = ShmConnection::new(config(Role::Server));
        sut.handle_datagram(&bell, arrival);
        assert!(
            matches!(sut.closed(), Some(CloseReason::Protocol(t)) if t.contains("Bell came with")),
            "{arrival:?}: {:?}",
            sut.closed()
        );
    }
    let mut queued = ShmConnection::new(config(Role::Server));
    queued.handle_record(Bytes::from(bell));
    assert!(matches!(queued.closed(), Some(CloseReason::Protocol(t)) if t.contains("socket only")));
}

#[test]
fn lost_descriptors_are_remembered_for_at_most_as_many_segments_as_a_peer_may_map() {
    let mut server = config(Role::Server);
    server.max_peer_segments = 8;
    let mut sut = ShmConnection::new(server);
    for segment in 1..=8 {
        sut.handle_datagram(&map_datagram(segment), FdArrival::Lost);
        assert!(
            sut.closed().is_none(),
            "a lost descriptor is this process's limit"
        );
    }
    sut.handle_datagram(&map_datagram(9), FdArrival::Lost);
    assert!(
        matches!(sut.closed(), Some(CloseReason::Protocol(t)) if t.contains("were lost")),
        "{:?}",
        sut.closed()
    );
}

#[test]
fn a_segment_the_driver_refuses_to_map_closes_the_connection_with_its_reason() {
    let mut pair = Pair::new();
    let reason = CloseReason::Local("the segment is sparse".into());
    pair.server.refuse_maps = Some(reason.clone());
    pair.ask(parts(vec![shared(SEG, 0, 8, 1)]), &[(SEG, SEG_LEN)]);
    assert_eq!(pair.server.conn.closed(), Some(&reason));
}

#[test]
fn requests_past_the_servers_bound_are_refused_with_an_error() {
    let mut server = config(Role::Server);
    server.max_in_flight = 2;
    let mut pair = Pair::with(config(Role::Client), server);
    for _ in 0..3 {
        pair.ask(Body::Inline(Bytes::new()), &[]);
    }
    assert_eq!(pair.server.take().len(), 2);
    let refused = pair.client.take();
    assert!(
        matches!(&refused[..], [ConnEvent::Reply { reply: WireReply::Error(t), .. }] if t.contains("bound")),
        "{refused:?}"
    );
}

#[test]
fn a_request_id_repeated_while_served_or_sent_to_a_client_closes_the_connection() {
    let request = encode(&Control::Request {
        id: 1,
        kind: RequestKind::Tell,
        path: "/actors/a".into(),
        body: Body::Inline(Bytes::new()),
    })
    .unwrap();
    let mut server = ShmConnection::new(config(Role::Server));
    server.handle_record(Bytes::from(request.clone()));
    server.handle_record(Bytes::from(request.clone()));
    assert!(matches!(server.closed(), Some(CloseReason::Protocol(t)) if t.contains("again")));
    let mut client = ShmConnection::new(config(Role::Client));
    client.handle_record(Bytes::from(request));
    assert!(matches!(client.closed(), Some(CloseReason::Protocol(_))));
}

#[test]
fn a_message_over_the_limits_is_refused_before_the_node_sees_it() {
    let limits = Limits::builder().max_buffers(2).build();
    let mut pair = Pair::with(
        config(Role::Client),
        ConnectionConfig::new(Role::Server, limits),
    );
    let many = (0..3).map(|_| Part::Inline(Bytes::new())).collect();
    pair.ask(parts(many), &[]);
    assert_eq!(pair.server.take(), vec![]);
    let events = pair.client.take();
    assert!(matches!(
        &events[..],
        [ConnEvent::Reply {
            reply: WireReply::Error(_),
            ..
        }]
    ));
}

#[test]
fn a_retired_segment_is_unmapped_and_releases_are_passed_on() {
    let mut pair = Pair::new();
    pair.ask(parts(vec![shared(SEG, 0, 8, 1)]), &[(SEG, SEG_LEN)]);
    pair.served();
    pair.client.conn.retire(SEG);
    pair.client.conn.retire(SEG);
    pair.server.conn.send_releases(&[1]);
    pair.drive();
    assert_eq!(pair.server.take(), vec![ConnEvent::Unmap { segment: SEG }]);
    assert_eq!(
        pair.client.take(),
        vec![ConnEvent::Released { leases: vec![1] }]
    );
}

#[test]
fn closing_fails_every_outstanding_request_and_sends_nothing_more() {
    let mut pair = Pair::new();
    let a = pair.ask(Body::Inline(Bytes::new()), &[]);
    let b = pair.ask(Body::Inline(Bytes::new()), &[]);
    pair.client.conn.handle_peer_closed();
    pair.drive();
    let events = pair.client.take();
    let failed: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            ConnEvent::Failed {
                id,
                why: Failure::Closed(CloseReason::PeerClosed),
                ..
            } => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(failed, vec![a, b]);
    assert_eq!(
        events.last(),
        Some(&ConnEvent::Closed(CloseReason::PeerClosed))
    );
    assert!(matches!(
        pair.client.conn.send_request(
            pair.now,
            RequestKind::Ask,
            "/a".into(),
            Body::Inline(Bytes::new()),
            &[],
            None
        ),
        Err(SendError::Closed(_))
    ));
}

#[test]
fn a_tell_is_acknowledged_and_an_error_text_is_cut() {
    let mut pair = Pair::new();
    let id = pair.ask(Body::Inline(Bytes::new()), &[]);
    pair.served();
    let long = "x".repeat(70 << 10);
    assert!(
        pair.server
            .conn
            .send_reply(id, WireReply::Error(long), &[], 0)
    );
    pair.drive();
    let events = pair.client.take();
    assert!(
        matches!(&events[..], [ConnEvent::Reply { reply: WireReply::Error(t), .. }] if t.len() <= 4096)
    );
}
