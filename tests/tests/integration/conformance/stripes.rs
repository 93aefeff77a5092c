//! Striping over every driver pair: a large request cut into stripes on several connections
//! arrives whole; a peer that takes no stripes, or never heard of them, gets whole frames; a
//! stripe lost mid-body fails the call within its deadline and nothing is delivered.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_engine::{Node, Reply, TensorMessage};
use tensorwire_proto::ptr1::Frame;
use tensorwire_proto::stats;
use tensorwire_proto::stripe::CAPABILITIES_PATH;
use tensorwire_tests::stripes::{Cut, StrictPeer, StripeCutter};
use tensorwire_tests::*;

use super::conformance;

conformance!(
    pairs: [
        a_striped_ask_arrives_whole_over_four_connections,
        a_striped_tell_is_delivered_once,
        a_node_that_takes_no_stripes_gets_whole_frames,
        a_loopback_peer_is_striped_only_from_32_mib_unless_asked_for,
        a_large_ask_to_a_loopback_peer_goes_whole_while_another_is_unanswered,
        a_stripe_cut_off_mid_body_fails_the_ask_and_nothing_is_delivered,
        a_black_holed_stripe_fails_the_ask_at_its_deadline_and_nothing_is_delivered,
        a_peer_restarted_without_striping_is_asked_again_and_served_whole,
        a_large_ask_while_another_is_striping_to_the_same_peer_goes_whole,
    ],
    servers: [
        a_ptr1_peer_that_never_heard_of_striping_sees_only_plain_frames,
        a_large_ask_to_a_peer_that_never_answers_fails_at_its_own_deadline,
    ],
);

/// A client that cuts requests of at least 1 MiB into 4 stripes, to loopback peers too (the
/// servers here listen on 127.0.0.1).
fn striping_client(drivers: Drivers) -> Node {
    let node = drivers
        .client()
        .stripes(4)
        .stripe_threshold(1 << 20)
        .stripe_loopback(true)
        .build()
        .expect("the client node starts");
    assert_eq!(node.stats().driver, drivers.client.name());
    node
}

/// Buffer `i` of a test message: `len` bytes of its own pattern.
fn patterned(i: usize, len: usize) -> Bytes {
    Bytes::from((0..len).map(|j| pattern(i, j)).collect::<Vec<u8>>())
}

/// Two long buffers (cut) around a short one (sent in the request frame).
fn large_message() -> TensorMessage {
    TensorMessage::new(
        11,
        Bytes::from_static(b"striped"),
        vec![
            patterned(0, 3 << 20),
            patterned(1, 100),
            patterned(2, (5 << 20) + 4097),
        ],
    )
}

/// Like [`large_message`], but large enough to be striped to a loopback peer (32 MiB and more)
/// without `stripe_loopback`; built once.
fn loopback_large_message() -> TensorMessage {
    static MESSAGE: std::sync::OnceLock<TensorMessage> = std::sync::OnceLock::new();
    MESSAGE
        .get_or_init(|| {
            TensorMessage::new(
                12,
                Bytes::from_static(b"striped on loopback"),
                vec![
                    patterned(0, 30 << 20),
                    patterned(1, 100),
                    patterned(2, (2 << 20) + 4097),
                ],
            )
        })
        .clone()
}

/// A server whose `count` endpoint counts what it is handed and echoes it.
fn counting_server(drivers: Drivers) -> (Node, Arc<AtomicUsize>) {
    let server = drivers.echo_server();
    let delivered = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&delivered);
    server
        .serve("count", 2, move |request| {
            seen.fetch_add(1, Ordering::SeqCst);
            Ok(Reply::Tensor(request.message))
        })
        .expect("count registers");
    (server, delivered)
}

fn a_striped_ask_arrives_whole_over_four_connections(drivers: Drivers) {
    let (server, client) = (drivers.echo_server(), striping_client(drivers));
    let before = stats::global().snapshot();
    for _ in 0..3 {
        let message = large_message();
        let reply = client
            .ask(server.local_addr(), "echo-core", message.clone(), TIMEOUT)
            .wait()
            .expect("the striped ask is answered");
        assert_eq!(tensor(reply), message);
    }
    let after = stats::global().snapshot();
    assert_eq!(
        after.striped_requests_sent - before.striped_requests_sent,
        3
    );
    assert_eq!(
        after.stripes_sent - before.stripes_sent,
        12,
        "4 stripes each"
    );
    assert_eq!(
        after.striped_requests_received - before.striped_requests_received,
        3
    );
    assert_eq!(after.stripes_received - before.stripes_received, 12);
}

fn a_striped_tell_is_delivered_once(drivers: Drivers) {
    let (server, delivered) = counting_server(drivers);
    let client = striping_client(drivers);
    let before = stats::global().snapshot();
    client
        .tell(server.local_addr(), "count", large_message(), TIMEOUT)
        .wait()
        .expect("the striped tell is acknowledged");
    let deadline = Instant::now() + Duration::from_secs(10);
    while delivered.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(delivered.load(Ordering::SeqCst), 1);
    let after = stats::global().snapshot();
    assert_eq!(
        after.striped_requests_sent - before.striped_requests_sent,
        1
    );
}

fn a_loopback_peer_is_striped_only_from_32_mib_unless_asked_for(drivers: Drivers) {
    let server = drivers.echo_server();
    assert!(server.local_addr().ip().is_loopback());
    let client = drivers
        .client()
        .stripes(4)
        .stripe_threshold(1 << 20)
        .build()
        .expect("the client node starts");
    let striped = |node: &Node, message: TensorMessage| -> u64 {
        let before = stats::global().snapshot().striped_requests_sent;
        let reply = node
            .ask(server.local_addr(), "echo", message.clone(), TIMEOUT)
            .wait()
            .expect("the ask is answered");
        assert_eq!(tensor(reply), message);
        stats::global().snapshot().striped_requests_sent - before
    };
    let two_mib = TensorMessage::new(3, Bytes::new(), vec![Bytes::from(vec![7u8; 2 << 20])]);
    assert_eq!(
        striped(&client, two_mib.clone()),
        0,
        "2 MiB to loopback goes whole"
    );
    assert!(large_message().total_bytes() < 32 << 20);
    assert_eq!(
        striped(&client, large_message()),
        0,
        "below 32 MiB, loopback goes whole"
    );
    let just_below = TensorMessage::new(
        5,
        Bytes::new(),
        vec![Bytes::from(vec![5u8; (32 << 20) - 1])],
    );
    assert_eq!(
        striped(&client, just_below),
        0,
        "a byte short of 32 MiB, loopback goes whole"
    );
    let thirty_two_mib =
        TensorMessage::new(4, Bytes::new(), vec![Bytes::from(vec![9u8; 32 << 20])]);
    assert_eq!(
        striped(&client, thirty_two_mib),
        1,
        "32 MiB exactly is striped"
    );
    assert_eq!(
        striped(&striping_client(drivers), two_mib),
        1,
        "stripe_loopback(true) stripes from the threshold"
    );
}

fn a_large_ask_to_a_loopback_peer_goes_whole_while_another_is_unanswered(drivers: Drivers) {
    let server = drivers.echo_server();
    // `gate` holds its request until told to answer.
    let (open, gate) = std::sync::mpsc::channel::<()>();
    let gate = std::sync::Mutex::new(gate);
    server
        .serve("gate", 1, move |request| {
            let held = gate.lock().map(|gate| gate.recv_timeout(TIMEOUT));
            assert!(matches!(held, Ok(Ok(()))), "the gate is opened");
            Ok(Reply::Tensor(request.message))
        })
        .expect("gate registers");
    // Room in the pool for a second large ask beside the held one (by default a large ask
    // waits for the connection of the one before it).
    let client = drivers
        .client()
        .stripes(4)
        .stripe_threshold(1 << 20)
        .busy_bytes_per_peer(256 << 20)
        .build()
        .expect("the client node starts");
    let striped = || stats::global().snapshot().striped_requests_sent;
    let before = striped();
    let held = client.ask(
        server.local_addr(),
        "gate",
        loopback_large_message(),
        TIMEOUT,
    );
    let waited = Instant::now();
    while striped() == before && waited.elapsed() < TIMEOUT {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(striped() - before, 1, "the first large ask is striped");
    let echoed = || {
        let message = loopback_large_message();
        let reply = client
            .ask(server.local_addr(), "echo", message.clone(), TIMEOUT)
            .wait()
            .expect("the echo answers");
        assert_eq!(tensor(reply), message);
    };
    echoed();
    assert_eq!(
        striped() - before,
        1,
        "a large ask beside an unanswered one goes whole on loopback"
    );
    open.send(()).expect("the gate is waiting");
    assert_eq!(
        tensor(held.wait().expect("the held ask is answered")),
        loopback_large_message()
    );
    echoed();
    assert_eq!(striped() - before, 2, "alone again, a large ask is striped");
}

fn a_node_that_takes_no_stripes_gets_whole_frames(drivers: Drivers) {
    let server = drivers.echo_server_with(|builder| builder.stripes_taken(0));
    let client = striping_client(drivers);
    let before = stats::global().snapshot();
    for _ in 0..2 {
        let message = large_message();
        let reply = client
            .ask(server.local_addr(), "echo", message.clone(), TIMEOUT)
            .wait()
            .expect("answered whole");
        assert_eq!(tensor(reply), message);
    }
    let after = stats::global().snapshot();
    assert_eq!(
        after.stripes_sent, before.stripes_sent,
        "no stripe was sent"
    );
    assert_eq!(after.stripes_received, before.stripes_received);
    assert_eq!(after.striped_requests_sent, before.striped_requests_sent);
}

fn a_stripe_cut_off_mid_body_fails_the_ask_and_nothing_is_delivered(drivers: Drivers) {
    let (server, delivered) = counting_server(drivers);
    let cutter = StripeCutter::start(server.local_addr(), 2, Cut::Close);
    let client = striping_client(drivers);
    let started = Instant::now();
    let outcome = client
        .ask(cutter.addr(), "count", large_message(), TIMEOUT)
        .wait();
    let error = outcome.expect_err("a stripe was cut off");
    assert!(cutter.cut_done());
    assert!(
        !error.is_timeout(),
        "a cut connection fails at once, not at the deadline: {error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(delivered.load(Ordering::SeqCst), 0, "nothing was delivered");
    // The next request goes through (other connections, a new stripe token).
    let message = large_message();
    let reply = client
        .ask(cutter.addr(), "count", message.clone(), TIMEOUT)
        .wait()
        .expect("the next striped ask goes through");
    assert_eq!(tensor(reply), message);
    assert_eq!(delivered.load(Ordering::SeqCst), 1);
}

fn a_black_holed_stripe_fails_the_ask_at_its_deadline_and_nothing_is_delivered(drivers: Drivers) {
    let (server, delivered) = counting_server(drivers);
    let cutter = StripeCutter::start(server.local_addr(), 3, Cut::BlackHole);
    let client = striping_client(drivers);
    let deadline = Duration::from_secs(2);
    let started = Instant::now();
    let outcome = client
        .ask(cutter.addr(), "count", large_message(), deadline)
        .wait();
    let elapsed = started.elapsed();
    let error = outcome.expect_err("a stripe went into a black hole");
    assert!(cutter.cut_done());
    assert!(error.is_timeout(), "{error}");
    assert!(
        elapsed >= deadline && elapsed < deadline + Duration::from_secs(2),
        "failed after {elapsed:?}, deadline {deadline:?}"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(delivered.load(Ordering::SeqCst), 0, "nothing was delivered");
}

fn a_ptr1_peer_that_never_heard_of_striping_sees_only_plain_frames(drivers: Drivers) {
    let peer = StrictPeer::start();
    let client = striping_client(drivers);
    for _ in 0..2 {
        let message = large_message();
        let reply = client
            .ask(peer.addr(), "echo", message.clone(), TIMEOUT)
            .wait()
            .expect("the strict peer answers");
        assert_eq!(tensor(reply), message);
    }
    let seen = peer.seen();
    assert!(
        seen.iter().all(|s| s.reserved == [0, 0, 0]),
        "a frame with a reserved byte set reached a peer that never agreed to it: {seen:?}"
    );
    let paths: Vec<&str> = seen
        .iter()
        .map(|s| match &s.frame {
            Frame::Ask { path, .. } | Frame::Tell { path, .. } => path.as_str(),
            _ => "",
        })
        .collect();
    assert_eq!(
        paths,
        [CAPABILITIES_PATH, "/actors/echo", "/actors/echo"],
        "asked once, then sent whole"
    );
    for s in &seen[1..] {
        let Frame::Ask { message, .. } = &s.frame else {
            panic!("{s:?}");
        };
        assert_eq!(message.buffers.len(), 3, "every buffer in the one frame");
    }
}

fn a_large_ask_to_a_peer_that_never_answers_fails_at_its_own_deadline(drivers: Drivers) {
    // Connections complete in its backlog; nothing is ever read or answered, so the
    // capabilities Ask the ask waits for gets no answer either.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
    let client = striping_client(drivers);
    let deadline = Duration::from_secs(1);
    let started = Instant::now();
    let outcome = client
        .ask(
            silent.local_addr().expect("an address"),
            "echo",
            large_message(),
            deadline,
        )
        .wait();
    let elapsed = started.elapsed();
    let error = outcome.expect_err("nobody answers");
    assert!(error.is_timeout(), "{error}");
    assert!(
        elapsed >= deadline && elapsed < deadline + Duration::from_millis(1500),
        "failed after {elapsed:?}, deadline {deadline:?} (the capabilities Ask alone waits 5 s)"
    );
}

fn a_peer_restarted_without_striping_is_asked_again_and_served_whole(drivers: Drivers) {
    let server = drivers.echo_server();
    let addr = server.local_addr();
    let client = striping_client(drivers);
    let message = large_message();
    let reply = client
        .ask(addr, "echo", message.clone(), TIMEOUT)
        .wait()
        .expect("striped to the first server");
    assert_eq!(tensor(reply), message);
    server.shutdown();
    drop(server);
    // The same address, a node that takes no stripes: it refuses the next stripes, the call
    // fails with its refusal (or a pooled connection to the old node fails), and the client
    // asks again what the peer takes.
    let restarted = drivers.echo_server_with(|_| drivers.server.builder_on(addr).stripes_taken(0));
    let mut outcomes = Vec::new();
    for _ in 0..4 {
        let outcome = client.ask(addr, "echo", large_message(), TIMEOUT).wait();
        let answered = outcome.is_ok();
        outcomes.push(outcome.map(tensor));
        if answered {
            break;
        }
    }
    let Some(Ok(reply)) = outcomes.last() else {
        panic!("never served whole after the restart: {outcomes:?}");
    };
    assert_eq!(*reply, message);
    let before = stats::global().snapshot();
    let reply = client
        .ask(addr, "echo", message.clone(), TIMEOUT)
        .wait()
        .expect("served whole");
    assert_eq!(tensor(reply), message);
    let after = stats::global().snapshot();
    assert_eq!(
        after.stripes_sent, before.stripes_sent,
        "no stripe was sent"
    );
    drop(restarted);
}

fn a_large_ask_while_another_is_striping_to_the_same_peer_goes_whole(drivers: Drivers) {
    let (server, delivered) = counting_server(drivers);
    // The first stripe frame through the proxy stops half-way: its call stays striping.
    let cutter = StripeCutter::start(server.local_addr(), 1, Cut::BlackHole);
    let client = striping_client(drivers);
    let stuck = client.ask(
        cutter.addr(),
        "count",
        large_message(),
        Duration::from_secs(3),
    );
    let waited = Instant::now();
    while (!cutter.cut_done() || cutter.stripes_seen() < 4)
        && waited.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(cutter.cut_done(), "the first striped ask reached the proxy");
    let stripes = cutter.stripes_seen();
    assert_eq!(stripes, 4, "the first ask's stripes started");
    let message = large_message();
    let reply = client
        .ask(cutter.addr(), "count", message.clone(), TIMEOUT)
        .wait()
        .expect("the second ask goes whole, past the stuck stripes");
    assert_eq!(tensor(reply), message);
    assert_eq!(
        cutter.stripes_seen(),
        stripes,
        "no stripe of the second ask"
    );
    let error = stuck.wait().expect_err("the stuck ask fails");
    assert!(error.is_timeout(), "{error}");
    assert_eq!(delivered.load(Ordering::SeqCst), 1, "only the whole ask");
}
