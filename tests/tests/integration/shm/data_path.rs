//! The same-host data path between two nodes of this process (sockets and memfds are real; only
//! the process is shared): round trips, zero-copy loans, leases given back, limits.

use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_engine::shm::{PeerBounds, WhenFull};
use tensorwire_engine::{Error, Node, NodeBuilder, Preference, Reply, Route, TensorMessage, Via};
use tensorwire_proto::stats;
use tensorwire_tests::*;

fn echo_server() -> Node {
    let node = shm_builder().build().unwrap();
    node.serve("echo", 2, |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    node.serve_on_core("echo-core", |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    node
}

/// Waits until `f` holds (up to 5 s).
pub(super) fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

#[test]
fn asks_of_every_shape_round_trip_over_shared_memory() {
    let _serial = serial();
    let (server, client) = (echo_server(), shm_builder().build().unwrap());
    let before = stats::global().snapshot().shm_messages_sent;
    for path in ["echo", "echo-core"] {
        for (count, len) in [(0, 0), (1, 4096), (16, 65_536), (1024, 1000), (3, 0)] {
            let message = patterned(u32::try_from(count).unwrap(), count, len);
            let reply = client
                .ask(server.local_addr(), path, message.clone(), TIMEOUT)
                .wait()
                .unwrap();
            assert_eq!(
                tensor(reply),
                message,
                "{count} buffers of {len} bytes to {path}"
            );
        }
    }
    // A sender counts a message once its transmit returned, which may be just after the
    // receiver answered: the count is read until it is there.
    assert!(
        eventually(|| stats::global().snapshot().shm_messages_sent >= before + 20),
        "requests and replies went over shared memory"
    );
    let after = stats::global().snapshot();
    assert_eq!(after.active_copy_model.as_str(), "shared_memory");
    assert_eq!(
        client.stats().shm_connections,
        1,
        "one connection to the peer"
    );
}

#[test]
fn a_256_mib_message_arrives_intact_and_its_memory_goes_back() {
    let _serial = serial();
    let (server, client) = (echo_server(), shm_builder().build().unwrap());
    let message = patterned(3, 4, 64 << 20);
    let reply = tensor(
        client
            .ask(server.local_addr(), "echo", message.clone(), TIMEOUT)
            .wait()
            .unwrap(),
    );
    assert_eq!(checksum(&reply), checksum(&message));
    assert_eq!(reply, message);
    // The echo sent our own memory back: the server released its views and lent nothing,
    // and the reply's views hold our slot.
    assert!(
        eventually(|| client.stats().shm_leases == 0),
        "the server released the request"
    );
    assert_eq!(server.stats().shm_leases, 0, "the reply lent nothing");
    assert!(
        client.shm().held_bytes() >= 256 << 20,
        "our slot is held by the reply"
    );
    drop(reply);
    assert!(
        eventually(|| client.shm().held_bytes() == 0),
        "dropping the reply gave the slot back"
    );
}

#[test]
fn a_tell_is_acknowledged_and_its_buffers_are_read_only_views() {
    let _serial = serial();
    let server = shm_builder().build().unwrap();
    let inbox = server.endpoint("inbox").unwrap();
    let client = shm_builder().build().unwrap();
    client
        .tell(
            server.local_addr(),
            "inbox",
            patterned(7, 2, 100_000),
            TIMEOUT,
        )
        .wait()
        .unwrap();
    let incoming = inbox.recv_blocking(Some(TIMEOUT)).unwrap().unwrap();
    assert_eq!(incoming.request().message, patterned(7, 2, 100_000));
    assert_eq!(
        client.stats().shm_leases,
        1,
        "the receiver still holds the message"
    );
    drop(incoming);
    assert!(eventually(|| client.stats().shm_leases == 0));
}

#[test]
fn buffers_in_loaned_slots_travel_without_a_copy() {
    let _serial = serial();
    let (server, client) = (echo_server(), shm_builder().build().unwrap());
    let mut loan = client.shm().loan(1 << 20).unwrap();
    loan.as_mut_slice()
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = i.to_le_bytes()[0]);
    let buffer = loan.freeze();
    let before = stats::global().snapshot();
    let message = TensorMessage::new(
        1,
        Bytes::from_static(b"{}"),
        vec![buffer.clone(), buffer.slice(10..20)],
    );
    let reply = tensor(
        client
            .ask(server.local_addr(), "echo", message.clone(), TIMEOUT)
            .wait()
            .unwrap(),
    );
    assert_eq!(reply, message);
    let after = stats::global().snapshot();
    assert!(
        after.shm_zero_copy_buffers >= before.shm_zero_copy_buffers + 2,
        "both buffers went as they were"
    );
}

#[test]
fn an_echo_sends_the_asker_its_own_memory_back_without_a_copy() {
    let _serial = serial();
    let (server, client) = (echo_server(), shm_builder().build().unwrap());
    let message = patterned(5, 2, 1 << 20);
    // Once to set up the connection and map the segments.
    client
        .ask(server.local_addr(), "echo", message.clone(), TIMEOUT)
        .wait()
        .unwrap();
    for path in ["echo", "echo-core"] {
        // The counters are the process's: a test running beside this one may add to them, so
        // a round trip counts if one of a few tries saw nothing but its own request copied.
        let mut copied = Vec::new();
        for _ in 0..5 {
            let before = stats::global().snapshot();
            let reply = client
                .ask(server.local_addr(), path, message.clone(), TIMEOUT)
                .wait()
                .unwrap();
            assert_eq!(tensor(reply), message);
            // The sender counts a message once it is queued, which may be just after the reply
            // came back.
            assert!(eventually(|| {
                let after = stats::global().snapshot();
                after.shm_messages_sent >= before.shm_messages_sent + 2
            }));
            let after = stats::global().snapshot();
            copied.push(after.shm_bytes_copied - before.shm_bytes_copied);
            if copied.last() == Some(&message.total_bytes()) {
                break;
            }
        }
        assert_eq!(
            copied.last(),
            Some(&message.total_bytes()),
            "only the request was copied: the reply went back by reference ({path}; bytes \
             copied per try: {copied:?})"
        );
    }
}

#[test]
fn handler_errors_and_unknown_endpoints_come_back_as_remote_errors() {
    let _serial = serial();
    let server = shm_builder().build().unwrap();
    server
        .serve("fails", 1, |_| Err("no such tensor".into()))
        .unwrap();
    let client = shm_builder().build().unwrap();
    let err = client
        .ask(server.local_addr(), "fails", patterned(1, 1, 8), TIMEOUT)
        .wait()
        .unwrap_err();
    assert_eq!(err.remote_text(), Some("no such tensor"), "{err}");
    let err = client
        .ask(server.local_addr(), "nobody", patterned(1, 1, 8), TIMEOUT)
        .wait()
        .unwrap_err();
    assert!(err.is_remote(), "{err}");
    assert!(
        eventually(|| client.stats().shm_leases == 0),
        "refused requests gave their memory back"
    );
}

#[test]
fn an_ask_fails_at_its_deadline() {
    let _serial = serial();
    let server = shm_builder().build().unwrap();
    server
        .serve("slow", 1, |r| {
            std::thread::sleep(Duration::from_secs(2));
            Ok(Reply::Tensor(r.message))
        })
        .unwrap();
    let client = shm_builder().build().unwrap();
    let err = client
        .ask(
            server.local_addr(),
            "slow",
            patterned(1, 1, 1),
            Duration::from_millis(200),
        )
        .wait()
        .unwrap_err();
    assert_eq!(err.to_string(), "ask timed out after 200ms");
}

#[test]
fn auto_picks_shared_memory_only_for_a_peer_that_proved_it_is_on_this_host() {
    let _serial = serial();
    let server = echo_server();
    let client = Node::builder(any_local_address())
        .in_process_delivery(false)
        .preference(Preference::Auto)
        .build()
        .unwrap();
    let before = stats::global().snapshot();
    let message = patterned(1, 1, 100);
    assert_eq!(
        tensor(
            client
                .ask(server.local_addr(), "echo", message.clone(), TIMEOUT)
                .wait()
                .unwrap()
        ),
        message
    );
    assert!(
        eventually(|| stats::global().snapshot().shm_messages_sent > before.shm_messages_sent),
        "same host: shared memory"
    );
    // A node without shared memory is reached over PTR1.
    let plain = Node::builder(any_local_address())
        .shared_memory(false)
        .build()
        .unwrap();
    plain
        .serve_on_core("echo", |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    let before = stats::global().snapshot();
    assert_eq!(
        tensor(
            client
                .ask(plain.local_addr(), "echo", message.clone(), TIMEOUT)
                .wait()
                .unwrap()
        ),
        message
    );
    let after = stats::global().snapshot();
    assert!(
        after.raw_frames_sent > before.raw_frames_sent,
        "no shared memory there: PTR1"
    );
}

#[test]
fn held_messages_never_change_while_the_sender_reuses_its_memory() {
    let _serial = serial();
    let server = shm_builder().build().unwrap();
    let inbox = server.endpoint_with_capacity("inbox", 1024).unwrap();
    let client = shm_builder().build().unwrap();
    let send = |fill: u8| {
        let message = TensorMessage::new(1, Bytes::new(), vec![Bytes::from(vec![fill; 1 << 20])]);
        client
            .tell(server.local_addr(), "inbox", message, TIMEOUT)
            .wait()
            .unwrap();
        inbox.recv_blocking(Some(TIMEOUT)).unwrap().unwrap()
    };
    // Hold some, drop others: the dropped ones' slots are reused under the held ones' eyes.
    let mut held = Vec::new();
    for round in 0..64u8 {
        let incoming = send(round);
        if round % 4 == 0 {
            held.push((round, incoming));
        }
    }
    for (fill, incoming) in &held {
        assert!(
            incoming.request().message.buffers[0]
                .iter()
                .all(|b| b == fill),
            "message {fill} changed while it was held"
        );
    }
    // The last dropped message's release reaches the client after its recv returned.
    assert!(
        eventually(|| client.stats().shm_leases == held.len()),
        "exactly the held slots stay lent: {} lent, {} held",
        client.stats().shm_leases,
        held.len()
    );
    drop(held);
    assert!(eventually(|| client.stats().shm_leases == 0));
}

/// A server with an inbox, and a client whose shared-memory quota holds four
/// [`sixteen_mib`] messages, configured further by `configure`.
fn quota_of_four_messages(
    configure: impl FnOnce(NodeBuilder) -> NodeBuilder,
) -> (Node, tensorwire_engine::Endpoint, Node) {
    let server = shm_builder().build().unwrap();
    let inbox = server.endpoint_with_capacity("inbox", 64).unwrap();
    let client = configure(
        shm_builder()
            .shm_quota(64 << 20)
            .shm_credit_wait(Duration::from_millis(100)),
    )
    .build()
    .unwrap();
    (server, inbox, client)
}

/// 16 MiB of `fill`.
fn sixteen_mib(fill: u8) -> TensorMessage {
    TensorMessage::new(1, Bytes::new(), vec![Bytes::from(vec![fill; 16 << 20])])
}

#[test]
fn a_sender_whose_memory_is_all_held_waits_for_credit_then_goes_over_ptr1() {
    let _serial = serial();
    // One receiver may hold the whole quota here (by default it may hold half of it:
    // `shm::hostile`).
    let (server, inbox, client) = quota_of_four_messages(|b| {
        b.shm_bounds(PeerBounds {
            held_bytes_per_process: 64 << 20,
            ..PeerBounds::default()
        })
    });
    let message = sixteen_mib;
    let mut held = Vec::new();
    for fill in 0..4 {
        client
            .tell(server.local_addr(), "inbox", message(fill), TIMEOUT)
            .wait()
            .unwrap();
        held.push(inbox.recv_blocking(Some(TIMEOUT)).unwrap().unwrap());
    }
    // The quota is held by the receiver: the next send waits, then takes PTR1.
    let before = stats::global().snapshot();
    client
        .tell(server.local_addr(), "inbox", message(9), TIMEOUT)
        .wait()
        .unwrap();
    let over_tcp = inbox.recv_blocking(Some(TIMEOUT)).unwrap().unwrap();
    assert!(
        over_tcp.request().message.buffers[0]
            .iter()
            .all(|&b| b == 9)
    );
    assert!(over_tcp.request().local_peer.is_none(), "it came over TCP");
    let after = stats::global().snapshot();
    assert_eq!(after.shm_credit_fallbacks, before.shm_credit_fallbacks + 1);
    for (fill, incoming) in held.iter().enumerate() {
        let fill = u8::try_from(fill).unwrap();
        assert!(
            incoming.request().message.buffers[0]
                .iter()
                .all(|&b| b == fill)
        );
    }
    // Credit comes back with the views: shared memory again, once the release of the view
    // dropped here has travelled back to the sender (asynchronously: under load it can take
    // longer than the sender's credit wait).
    held.pop();
    assert!(
        eventually(|| client.stats().shm_leases == held.len()),
        "the sender sees the dropped view released"
    );
    let before = stats::global().snapshot();
    client
        .tell(server.local_addr(), "inbox", message(7), TIMEOUT)
        .wait()
        .unwrap();
    let again = inbox.recv_blocking(Some(TIMEOUT)).unwrap().unwrap();
    assert!(
        again.request().local_peer.is_some(),
        "it came over shared memory"
    );
    // Counted once the transmit returned (see above).
    assert!(eventually(
        || stats::global().snapshot().shm_messages_sent > before.shm_messages_sent
    ));
}

#[test]
fn a_receiver_that_holds_half_the_senders_memory_gets_further_messages_over_ptr1() {
    let _serial = serial();
    let (server, inbox, client) = quota_of_four_messages(|b| b);
    let send = |fill: u8| {
        client
            .tell(server.local_addr(), "inbox", sixteen_mib(fill), TIMEOUT)
            .wait()
            .unwrap();
        let incoming = inbox.recv_blocking(Some(TIMEOUT)).unwrap().unwrap();
        assert!(
            incoming.request().message.buffers[0]
                .iter()
                .all(|&b| b == fill)
        );
        incoming
    };
    let mut held = vec![send(0), send(1)];
    assert!(held.iter().all(|m| m.request().local_peer.is_some()));
    // The receiver's process holds 32 MiB, half the sender's quota, its bound: the next
    // message takes PTR1 at once, with the quota half free.
    let before = stats::global().snapshot();
    let over_tcp = send(2);
    assert!(over_tcp.request().local_peer.is_none(), "it came over TCP");
    let after = stats::global().snapshot();
    assert_eq!(after.shm_credit_fallbacks, before.shm_credit_fallbacks + 1);
    let lent = client.stats().shm_lent_bytes;
    held.pop();
    // The release reaches the sender in a datagram of its own, after the drop.
    assert!(eventually(|| client.stats().shm_lent_bytes < lent));
    assert!(
        send(3).request().local_peer.is_some(),
        "a release makes room under the bound: shared memory again"
    );
}

#[test]
fn a_sender_configured_to_refuse_fails_with_a_classified_error_when_its_memory_is_held() {
    let _serial = serial();
    let server = shm_builder().build().unwrap();
    let inbox = server.endpoint_with_capacity("inbox", 64).unwrap();
    let client = shm_builder()
        .shm_quota(32 << 20)
        .shm_credit_wait(Duration::from_millis(50))
        .shm_when_full(WhenFull::Refuse)
        .build()
        .unwrap();
    let message = TensorMessage::new(1, Bytes::new(), vec![Bytes::from(vec![1; 30 << 20])]);
    client
        .tell(server.local_addr(), "inbox", message.clone(), TIMEOUT)
        .wait()
        .unwrap();
    let held = inbox.recv_blocking(Some(TIMEOUT)).unwrap().unwrap();
    let err = client
        .tell(server.local_addr(), "inbox", message, TIMEOUT)
        .wait()
        .unwrap_err();
    assert!(matches!(err, Error::SharedMemoryFull { .. }), "{err}");
    assert!(err.is_limit());
    drop(held);
}

#[test]
fn a_timeout_of_zero_fails_at_once_instead_of_waiting_for_the_reply() {
    let _serial = serial();
    let server = shm_builder().build().unwrap();
    server
        .serve("slow", 1, |r| {
            std::thread::sleep(Duration::from_millis(300));
            Ok(Reply::Tensor(r.message))
        })
        .unwrap();
    let client = shm_builder().build().unwrap();
    // Set the connection up first, so the zero timeout meets the shared-memory path itself.
    client
        .ask(server.local_addr(), "slow", patterned(1, 1, 1), TIMEOUT)
        .wait()
        .unwrap();
    for size in [1, 1 << 20] {
        let started = Instant::now();
        let err = client
            .ask(
                server.local_addr(),
                "slow",
                patterned(1, 1, size),
                Duration::ZERO,
            )
            .wait()
            .unwrap_err();
        assert!(err.is_timeout(), "{err}");
        assert!(
            started.elapsed() < Duration::from_millis(250),
            "it did not wait for the reply"
        );
    }
}

#[test]
fn a_handler_error_of_70_kib_is_cut_and_the_connection_keeps_serving() {
    let _serial = serial();
    let server = echo_server();
    server
        .serve("verbose", 1, |_| Err("e".repeat(70 << 10)))
        .unwrap();
    let client = shm_builder().build().unwrap();
    let err = client
        .ask(server.local_addr(), "verbose", patterned(1, 1, 8), TIMEOUT)
        .wait()
        .unwrap_err();
    let text = err.remote_text().expect("a remote error");
    assert!(
        text.len() <= 4096 && text.starts_with("eeee"),
        "{} bytes",
        text.len()
    );
    let message = patterned(2, 2, 4096);
    let reply = client
        .ask(server.local_addr(), "echo", message.clone(), TIMEOUT)
        .wait()
        .unwrap();
    assert_eq!(tensor(reply), message);
    assert_eq!(client.stats().shm_connections, 1, "the same connection");
}

#[test]
fn the_route_says_why_shared_memory_is_or_is_not_used() {
    let _serial = serial();
    let server = echo_server();
    let client = Node::builder(any_local_address())
        .in_process_delivery(false)
        .build()
        .unwrap();
    let choice = client.route_to(server.local_addr(), None).unwrap();
    assert_eq!(choice.route, Route::SharedMemory, "{}", choice.reason);
    assert!(
        choice.reason.contains("proved it is on this host"),
        "{}",
        choice.reason
    );
    let plain = Node::builder(any_local_address())
        .shared_memory(false)
        .build()
        .unwrap();
    let choice = client.route_to(plain.local_addr(), None).unwrap();
    assert_eq!(choice.route, Route::RawTcp);
    assert!(
        choice.reason.contains("shared memory is off"),
        "{}",
        choice.reason
    );
    // Insisting on shared memory to a peer without it is an error that says why.
    let to = client
        .destination(plain.local_addr(), "echo", Via::Only(Route::SharedMemory))
        .unwrap();
    let err = client
        .ask_to(&to, patterned(1, 1, 8), TIMEOUT)
        .wait()
        .unwrap_err();
    assert!(
        matches!(err, Error::RouteUnavailable { route: "shm", .. }),
        "{err}"
    );
}
