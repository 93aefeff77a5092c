//! A graceful close (`Node::close`): replies and acknowledgements in flight are written in full
//! over PTR1 on either driver and on the in-process path; new requests are refused with a
//! clear error; the close is bounded by its timeout.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use tensorwire_engine::{Error, Node, Reply};
use tensorwire_tests::*;

/// 64 MiB in one buffer: many writes, so a close that cut the connection would show.
const BIG: usize = 64 << 20;

/// A server whose `big` endpoint says when a request reached its handler, waits `hold`, then
/// replies with a patterned 64 MiB buffer.
fn big_server(
    builder: tensorwire_engine::NodeBuilder,
    hold: Duration,
) -> (Node, mpsc::Receiver<()>) {
    let node = builder.build().expect("the server starts");
    let (started, handler_started) = mpsc::channel();
    let started = std::sync::Mutex::new(started);
    node.serve("big", 2, move |_| {
        let _ = started.lock().unwrap().send(());
        std::thread::sleep(hold);
        Ok(Reply::Tensor(patterned(1, 1, BIG)))
    })
    .expect("big registers");
    (node, handler_started)
}

fn a_reply_in_flight_is_written_in_full_when_the_server_closes(server: Driver, client: Driver) {
    let _serial = serial();
    let (node, handler_started) = big_server(server.builder(), Duration::from_millis(300));
    let asker = client.builder().in_process_delivery(false).build().unwrap();
    let pending = asker.ask(node.local_addr(), "big", patterned(1, 1, 16), TIMEOUT);
    handler_started
        .recv_timeout(TIMEOUT)
        .expect("the handler got the ask");
    let started = Instant::now();
    node.close(Duration::from_secs(20));
    let closed_after = started.elapsed();
    let reply = tensor(pending.wait().expect("the reply arrives in full"));
    assert_eq!(reply.total_bytes(), BIG as u64);
    assert_eq!(checksum(&reply), checksum(&patterned(1, 1, BIG)));
    assert!(
        closed_after < Duration::from_secs(20),
        "the close returned once the reply was out, not at its timeout ({closed_after:?})"
    );
    assert!(node.is_shut_down());
}

#[test]
fn a_64_mib_reply_in_flight_is_written_in_full_when_an_io_uring_server_closes() {
    a_reply_in_flight_is_written_in_full_when_the_server_closes(Driver::Uring, Driver::Uring);
}

#[test]
fn a_64_mib_reply_in_flight_is_written_in_full_when_a_tokio_server_closes() {
    a_reply_in_flight_is_written_in_full_when_the_server_closes(Driver::Tokio, Driver::Tokio);
}

#[test]
fn a_64_mib_reply_to_a_blocking_ask_is_written_in_full_when_the_server_closes() {
    let _serial = serial();
    for server in [Driver::Uring, Driver::Tokio] {
        let (node, handler_started) = big_server(server.builder(), Duration::from_millis(300));
        let asker = Driver::Uring
            .builder()
            .in_process_delivery(false)
            .build()
            .unwrap();
        let to = node.local_addr();
        let blocking =
            std::thread::spawn(move || asker.ask_blocking(to, "big", patterned(1, 1, 16), TIMEOUT));
        handler_started
            .recv_timeout(TIMEOUT)
            .expect("the handler got the ask");
        node.close(Duration::from_secs(20));
        let reply = tensor(blocking.join().unwrap().expect("the reply arrives in full"));
        assert_eq!(
            checksum(&reply),
            checksum(&patterned(1, 1, BIG)),
            "{server:?}"
        );
    }
}

#[test]
fn a_reply_in_flight_on_the_in_process_path_arrives_when_the_node_closes() {
    let _serial = serial();
    let (node, handler_started) = big_server(Driver::Uring.builder(), Duration::from_millis(300));
    let pending = node.ask(node.local_addr(), "big", patterned(1, 1, 16), TIMEOUT);
    handler_started
        .recv_timeout(TIMEOUT)
        .expect("the handler got the ask");
    node.close(Duration::from_secs(20));
    let reply = tensor(pending.wait().expect("the in-process reply arrives"));
    assert_eq!(reply.total_bytes(), BIG as u64);
}

#[test]
fn tells_waiting_in_a_mailbox_are_taken_and_acknowledged_before_the_node_closes() {
    let _serial = serial();
    for server in [Driver::Uring, Driver::Tokio] {
        let node = server.builder().build().unwrap();
        let (seen_tx, seen) = mpsc::channel();
        let seen_tx = std::sync::Mutex::new(seen_tx);
        node.serve("slow", 1, move |_| {
            std::thread::sleep(Duration::from_millis(50));
            let _ = seen_tx.lock().unwrap().send(());
            Ok(Reply::Single {
                msg_type: "ack".into(),
                data: bytes::Bytes::new(),
            })
        })
        .unwrap();
        let sender = Driver::Uring
            .builder()
            .in_process_delivery(false)
            .build()
            .unwrap();
        let tells: Vec<_> = (0..5)
            .map(|_| sender.tell(node.local_addr(), "slow", patterned(1, 1, 1024), TIMEOUT))
            .collect();
        // Every tell is acknowledged once it is in the mailbox; the handler takes 50 ms each.
        for tell in tells {
            tell.wait().expect("the tell is acknowledged");
        }
        node.close(Duration::from_secs(20));
        assert_eq!(
            seen.try_iter().count(),
            5,
            "{server:?}: every queued tell was handled"
        );
    }
}

#[test]
fn a_request_that_arrives_while_the_node_closes_is_refused_saying_so() {
    let _serial = serial();
    for server in [Driver::Uring, Driver::Tokio] {
        let (node, handler_started) = big_server(server.builder(), Duration::from_millis(800));
        let asker = Driver::Uring
            .builder()
            .in_process_delivery(false)
            .build()
            .unwrap();
        let first = asker.ask(node.local_addr(), "big", patterned(1, 1, 16), TIMEOUT);
        handler_started.recv_timeout(TIMEOUT).unwrap();
        let closer = {
            let node = node.clone();
            std::thread::spawn(move || node.close(Duration::from_secs(20)))
        };
        std::thread::sleep(Duration::from_millis(100)); // the close has begun
        // In process: refused saying so.
        let err = node
            .ask(node.local_addr(), "big", patterned(1, 1, 16), TIMEOUT)
            .wait()
            .expect_err("refused");
        assert!(err.to_string().contains("the node is closing"), "{err}");
        // Over PTR1: a new connection is not accepted, or its request is refused.
        let late = asker
            .ask(node.local_addr(), "big", patterned(1, 1, 16), TIMEOUT)
            .wait();
        match late {
            Err(Error::Remote { text, .. }) => assert!(text.contains("closing"), "{text}"),
            Err(e) if e.is_connection() => {}
            other => panic!("{server:?}: a late ask got {other:?}"),
        }
        assert!(
            first.wait().is_ok(),
            "{server:?}: the ask taken before the close is answered"
        );
        closer.join().unwrap();
    }
}

#[test]
fn a_close_gives_up_at_its_timeout_and_fails_what_is_left() {
    let _serial = serial();
    for server in [Driver::Uring, Driver::Tokio] {
        let (node, handler_started) = big_server(server.builder(), Duration::from_secs(3));
        let asker = Driver::Uring
            .builder()
            .in_process_delivery(false)
            .build()
            .unwrap();
        let pending = asker.ask(node.local_addr(), "big", patterned(1, 1, 16), TIMEOUT);
        handler_started.recv_timeout(TIMEOUT).unwrap();
        let started = Instant::now();
        node.close(Duration::from_millis(200));
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(2500),
            "{server:?}: the close waited {took:?}, past its timeout of 200 ms and the handler"
        );
        assert!(
            pending.wait().is_err(),
            "{server:?}: the unanswered ask fails"
        );
    }
}

#[test]
fn a_close_waits_for_the_sends_the_node_started() {
    let _serial = serial();
    let (server, handler_started) = big_server(Driver::Uring.builder(), Duration::from_millis(300));
    let sender = Driver::Uring
        .builder()
        .in_process_delivery(false)
        .build()
        .unwrap();
    let pending = sender.ask(server.local_addr(), "big", patterned(1, 1, 16), TIMEOUT);
    handler_started.recv_timeout(TIMEOUT).unwrap();
    sender.close(Duration::from_secs(20));
    let reply = tensor(
        pending
            .wait()
            .expect("the sender's own ask completed before it closed"),
    );
    assert_eq!(reply.total_bytes(), BIG as u64);
}
