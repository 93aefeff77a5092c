//! The defects found in review of the first engine, each with a test that fails on it.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_engine::{Error, PoolConfig, Reply};
use tensorwire_proto::ptr1::{self, Frame};
use tensorwire_proto::{Limits, TensorMessage};
use tensorwire_tests::*;

const URING: Drivers = Drivers {
    client: Driver::Uring,
    server: Driver::Uring,
};

/// A header that declares `lens` buffers for `/actors/echo`, and no body.
fn declaring_header(metadata_len: u64, lens: &[u64]) -> Vec<u8> {
    let mut frame = raw_header(1, 1, 12, metadata_len, u32::try_from(lens.len()).unwrap());
    for len in lens {
        frame.extend_from_slice(&len.to_le_bytes());
    }
    frame.extend_from_slice(b"/actors/echo");
    frame
}

#[test]
fn a_header_declaring_4_gib_commits_no_memory_and_other_clients_are_still_answered() {
    let _serial = serial();
    let server = URING.echo_server_with(|b| b.cores(1));
    let client = URING.client_node();
    let before = resident_bytes();
    let cpu_before = cpu_time();
    let mut attacker = raw_stream(server.local_addr());
    attacker
        .write_all(&declaring_header(0, &[256 << 20; 16]))
        .unwrap();
    // Another client on the same (only) core is answered at once.
    for i in 0..20 {
        let started = Instant::now();
        let message = patterned(i, 1, 1000);
        let reply = client
            .ask(server.local_addr(), "echo-core", message.clone(), TIMEOUT)
            .wait();
        assert_eq!(tensor(reply.unwrap()), message);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }
    let grown = resident_bytes().saturating_sub(before);
    assert!(
        grown < 64 << 20,
        "resident memory grew by {grown} bytes for a header"
    );
    let cpu = cpu_time().saturating_sub(cpu_before);
    assert!(cpu < Duration::from_secs(1), "{cpu:?} of CPU");
    assert!(server.stats().pool.receiving_bytes <= 128 << 10);
}

#[test]
fn thirty_two_connections_declaring_64_mib_of_metadata_each_commit_almost_nothing() {
    let _serial = serial();
    let server = URING.echo_server();
    let before = resident_bytes();
    let attackers: Vec<TcpStream> = (0..32)
        .map(|_| {
            let mut stream = raw_stream(server.local_addr());
            let mut frame = declaring_header(64 << 20, &[]);
            frame.extend_from_slice(&[1; 100]); // a few bytes of the metadata
            stream.write_all(&frame).unwrap();
            stream
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let grown = resident_bytes().saturating_sub(before);
    assert!(
        grown < 128 << 20,
        "resident memory grew by {grown} bytes for 6 KiB sent"
    );
    let charged = server.stats().pool.receiving_bytes;
    assert!(
        charged <= 32 * (128 << 10),
        "{charged} bytes charged to the budget"
    );
    drop(attackers);
}

#[test]
fn the_pool_gives_memory_back_after_a_burst() {
    let _serial = serial();
    let mut pool = PoolConfig::default();
    pool.idle_ttl = Duration::from_secs(2);
    pool.idle_keep_bytes = 0;
    let server = URING.echo_server_with(|b| b.receive_pool(pool));
    let client = URING.client_node();
    let message = patterned(1, 4, 16 << 20);
    let pendings: Vec<_> = (0..4)
        .map(|_| client.ask(server.local_addr(), "echo-core", message.clone(), TIMEOUT))
        .collect();
    for pending in pendings {
        assert_eq!(
            checksum(&tensor(pending.wait().unwrap())),
            checksum(&message)
        );
    }
    // The last replies' slots come back once their writes complete.
    let deadline = Instant::now() + Duration::from_secs(2);
    while server.stats().pool.idle_bytes == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        server.stats().pool.idle_bytes > 0,
        "the burst's slots went back to the pool"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.stats().pool.idle_bytes > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let pool = server.stats().pool;
    assert_eq!(pool.idle_bytes, 0, "unused slots were given back: {pool:?}");
    assert!(pool.released > 0);
}

#[test]
fn a_waiter_whose_client_left_does_not_swallow_the_wake_up_of_the_next() {
    let _serial = serial();
    let server = URING.server().mailbox_capacity(1).build().unwrap();
    let inbox = server.endpoint("inbox").unwrap();
    let peer = server.local_addr();
    let first = URING.client_node();
    first
        .tell(peer, "inbox", patterned(0, 1, 1), TIMEOUT)
        .wait()
        .unwrap();
    // A waits for space, then its node goes away (its connection closes).
    let leaving = URING.client_node();
    let mut a = leaving.tell(peer, "inbox", patterned(1, 1, 1), TIMEOUT);
    assert!(a.wait_timeout(Duration::from_millis(200)).is_none());
    leaving.shutdown();
    drop(a);
    // B waits too.
    let staying = URING.client_node();
    let mut b = staying.tell(peer, "inbox", patterned(2, 1, 1), TIMEOUT);
    assert!(b.wait_timeout(Duration::from_millis(200)).is_none());
    // One slot frees up: it goes to B, not to the request of the client that left.
    let taken = inbox.recv_blocking(Some(TIMEOUT)).unwrap().unwrap();
    assert_eq!(taken.request().message.version, 0);
    b.wait_timeout(TIMEOUT).expect("B got the slot").unwrap();
    let next = inbox.recv_blocking(Some(TIMEOUT)).unwrap().unwrap();
    assert_eq!(
        next.request().message.version,
        2,
        "A's request was withdrawn"
    );
}

#[test]
fn every_freed_slot_admits_one_waiting_request() {
    let _serial = serial();
    let server = URING.server().mailbox_capacity(1).build().unwrap();
    let inbox = server.endpoint("inbox").unwrap();
    let peer = server.local_addr();
    let client = URING.client_node();
    client
        .tell(peer, "inbox", patterned(0, 1, 1), TIMEOUT)
        .wait()
        .unwrap();
    let mut waiting: Vec<_> = (1..=5)
        .map(|i| client.tell(peer, "inbox", patterned(i, 1, 1), TIMEOUT))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut versions = Vec::new();
    for _ in 0..6 {
        let incoming = inbox
            .recv_blocking(Some(TIMEOUT))
            .unwrap()
            .expect("a request");
        versions.push(incoming.request().message.version);
    }
    versions.sort_unstable();
    assert_eq!(versions, [0, 1, 2, 3, 4, 5]);
    for pending in &mut waiting {
        pending
            .wait_timeout(TIMEOUT)
            .expect("acknowledged")
            .unwrap();
    }
}

#[test]
fn per_peer_state_goes_away_with_the_peers() {
    let _serial = serial();
    let client = URING.client_node();
    // 200 peers that refuse connections.
    let refused: Vec<SocketAddr> = (0..200)
        .map(|_| {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        })
        .collect();
    let pendings: Vec<_> = refused
        .iter()
        .map(|&peer| client.ask(peer, "echo", patterned(1, 1, 1), TIMEOUT))
        .collect();
    for pending in pendings {
        let err = pending.wait().unwrap_err();
        assert!(err.is_connection(), "{err}");
    }
    // Gauges are updated at the end of each driver loop turn.
    let deadline = Instant::now() + Duration::from_secs(2);
    while client.stats().gauges.peers > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let gauges = client.stats().gauges;
    assert_eq!(gauges.peers, 0, "{gauges:?}");
    assert_eq!(gauges.connections, 0, "{gauges:?}");
}

#[test]
fn timers_stay_bounded_by_connections_not_by_requests() {
    let _serial = serial();
    let server = URING.echo_server();
    let client = URING.client_node();
    let long = Duration::from_secs(600); // far beyond the test: no deadline fires
    for _ in 0..5_000 {
        client
            .ask(server.local_addr(), "echo-core", patterned(1, 1, 16), long)
            .wait()
            .unwrap();
    }
    let (client, server) = (client.stats().gauges, server.stats().gauges);
    assert!(
        client.timers <= 4 && server.timers <= 4,
        "{client:?} {server:?}"
    );
}

#[test]
fn a_thread_that_made_a_blocking_call_does_not_keep_a_shut_down_node_alive() {
    let _serial = serial();
    let server = URING.echo_server();
    let baseline = open_fd_count();
    let client = URING.client_node();
    let peer = server.local_addr();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let caller = {
        let client = client.clone();
        std::thread::spawn(move || {
            client
                .ask_blocking(peer, "echo", patterned(1, 1, 1), TIMEOUT)
                .unwrap();
            drop(client);
            done_tx.send(()).unwrap();
            let _ = release_rx.recv(); // stays alive, making no further call
        })
    };
    done_rx.recv().unwrap();
    client.shutdown();
    drop(client);
    assert!(
        settle_fds(baseline) <= baseline,
        "the node's connections closed while the caller thread lives on"
    );
    release_tx.send(()).unwrap();
    caller.join().unwrap();
}

#[test]
fn ask_and_tell_futures_never_block_on_a_full_in_process_mailbox() {
    let _serial = serial();
    let node = URING.server().mailbox_capacity(1).build().unwrap();
    let inbox = node.endpoint("inbox").unwrap();
    let me = node.local_addr();
    node.tell(me, "inbox", patterned(0, 1, 1), TIMEOUT)
        .wait()
        .unwrap();
    let started = Instant::now();
    let mut tell = node.tell(me, "inbox", patterned(1, 1, 1), TIMEOUT);
    let mut ask = node.ask(me, "inbox", patterned(2, 1, 1), TIMEOUT);
    assert!(
        started.elapsed() < Duration::from_millis(50),
        "returned at once"
    );
    assert!(
        tell.wait_timeout(Duration::from_millis(100)).is_none(),
        "still waiting for space"
    );
    let first = inbox.recv_blocking(Some(TIMEOUT)).unwrap().unwrap();
    assert_eq!(first.request().message.version, 0);
    tell.wait_timeout(TIMEOUT).expect("in the mailbox").unwrap();
    let second = inbox.recv_blocking(Some(TIMEOUT)).unwrap().unwrap();
    assert_eq!(second.request().message.version, 1);
    let third = inbox.recv_blocking(Some(TIMEOUT)).unwrap().unwrap();
    third.reply(Ok(Reply::Single {
        msg_type: "done".into(),
        data: Bytes::new(),
    }));
    assert!(matches!(
        ask.wait_timeout(TIMEOUT).unwrap().unwrap(),
        Reply::Single { msg_type, .. } if msg_type == "done"
    ));
}

#[test]
fn a_blocking_call_never_reuses_a_connection_with_bytes_left_over() {
    let _serial = serial();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let reply = |version| {
        let frame = Frame::TensorResponse(TensorMessage::new(version, Bytes::new(), vec![]));
        ptr1::encode(&frame, &Limits::default()).unwrap().to_vec()
    };
    let server = std::thread::spawn(move || {
        let mut connections = Vec::new();
        for (i, mut extra) in [b"PTR1 stray bytes".to_vec(), Vec::new()]
            .into_iter()
            .enumerate()
        {
            let (mut stream, _) = listener.accept().unwrap();
            read_frame(&mut stream).unwrap().expect("a request");
            let mut answer = reply(u32::try_from(i).unwrap());
            answer.append(&mut extra); // the first reply comes with bytes nobody asked for
            stream.write_all(&answer).unwrap();
            connections.push(stream);
        }
        connections.len()
    });
    let client = URING.client_node();
    for version in [0, 1] {
        let got = client
            .ask_blocking(addr, "echo", patterned(9, 1, 1), TIMEOUT)
            .unwrap();
        assert_eq!(tensor(got).version, version);
    }
    assert_eq!(
        server.join().unwrap(),
        2,
        "the second ask opened a new connection"
    );
}

/// A listener (backlog 0) whose accept queue is full: further connects hang.
fn full_listener() -> (SocketAddr, Vec<TcpStream>, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket calls on a descriptor this function creates and owns.
    let fd = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let addr = libc::sockaddr_in {
            sin_family: libc::sa_family_t::try_from(libc::AF_INET).unwrap(),
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
            },
            sin_zero: [0; 8],
        };
        let len = libc::socklen_t::try_from(size_of::<libc::sockaddr_in>()).unwrap();
        assert_eq!(libc::bind(fd, (&raw const addr).cast(), len), 0);
        assert_eq!(libc::listen(fd, 0), 0);
        std::os::fd::OwnedFd::from_raw_fd(fd)
    };
    let listener = TcpListener::from(fd.try_clone().unwrap());
    let addr = listener.local_addr().unwrap();
    std::mem::forget(listener); // `fd` owns the socket
    let mut fillers = Vec::new();
    for _ in 0..4 {
        if let Ok(stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            fillers.push(stream);
        }
    }
    (addr, fillers, fd)
}

#[test]
fn a_connect_timeout_is_reported_as_one_and_not_as_the_request_timeout() {
    let _serial = serial();
    let (addr, _fillers, _listener) = full_listener();
    for blocking in [false, true] {
        let client = URING
            .client()
            .connect_timeout(Duration::from_millis(300))
            .build()
            .unwrap();
        let started = Instant::now();
        let err = if blocking {
            client
                .ask_blocking(addr, "echo", patterned(1, 1, 1), TIMEOUT)
                .unwrap_err()
        } else {
            client
                .ask(addr, "echo", patterned(1, 1, 1), TIMEOUT)
                .wait()
                .unwrap_err()
        };
        assert!(err.is_timeout(), "{err}");
        assert_eq!(
            err.to_string(),
            "connect timed out after 300ms",
            "blocking: {blocking}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}

#[test]
fn a_full_in_process_mailbox_times_out_with_the_real_timeout_in_the_text() {
    let _serial = serial();
    let node = URING.server().mailbox_capacity(1).build().unwrap();
    let _inbox = node.endpoint("inbox").unwrap();
    let me = node.local_addr();
    node.tell(me, "inbox", patterned(0, 1, 1), TIMEOUT)
        .wait()
        .unwrap();
    let err = node
        .tell(me, "inbox", patterned(1, 1, 1), Duration::from_millis(200))
        .wait()
        .unwrap_err();
    assert_eq!(err.to_string(), "tell timed out after 200ms");
    let err = node
        .tell_blocking(me, "inbox", patterned(1, 1, 1), Duration::from_millis(150))
        .unwrap_err();
    assert_eq!(err.to_string(), "tell timed out after 150ms");
}

#[test]
fn a_connection_closed_by_the_server_is_reported_as_closed_not_as_shutdown() {
    let _serial = serial();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        for _ in 0..2 {
            let (mut stream, _) = listener.accept().unwrap();
            read_frame(&mut stream).unwrap();
            // Closed without a reply.
        }
    });
    let client = URING.client_node();
    let err = client
        .ask(addr, "echo", patterned(1, 1, 1), TIMEOUT)
        .wait()
        .unwrap_err();
    assert!(matches!(err, Error::ConnectionClosed { .. }), "{err}");
    let err = client
        .ask_blocking(addr, "echo", patterned(1, 1, 1), TIMEOUT)
        .unwrap_err();
    assert!(matches!(err, Error::ConnectionClosed { .. }), "{err}");
    server.join().unwrap();
}

#[test]
fn huge_timeouts_and_deadlines_do_not_panic() {
    let _serial = serial();
    let max = Duration::MAX;
    let server = URING.echo_server_with(|b| {
        b.preface_timeout(max)
            .head_timeout(max)
            .idle_timeout(max)
            .enqueue_timeout(max)
            .connect_timeout(max)
            .min_transfer_rate(1, max)
    });
    let client = URING.client().connect_timeout(max).build().unwrap();
    let message = patterned(1, 1, 100);
    let peer = server.local_addr();
    assert_eq!(
        tensor(
            client
                .ask(peer, "echo", message.clone(), max)
                .wait()
                .unwrap()
        ),
        message
    );
    assert_eq!(
        tensor(
            client
                .ask_blocking(peer, "echo", message.clone(), max)
                .unwrap()
        ),
        message
    );
    client
        .tell(peer, "echo", message.clone(), max)
        .wait()
        .unwrap();
    assert_eq!(
        tensor(
            server
                .ask(peer, "echo", message.clone(), max)
                .wait()
                .unwrap()
        ),
        message
    );
    let mut pending = server.ask(peer, "echo", message.clone(), max);
    assert_eq!(tensor(pending.wait_timeout(max).unwrap().unwrap()), message);
}
