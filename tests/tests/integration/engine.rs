//! The io_uring engine over loopback: real sockets, real rings, a second node or a hand-played
//! raw peer on the other side.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_engine::{Error, Handoff, Node, Reply, TensorMessage};
use tensorwire_proto::ptr1::Frame;
use tensorwire_proto::{Limits, stats};
use tensorwire_tests::*;

fn ask(client: &Node, server: &Node, path: &str, message: TensorMessage) -> Result<Reply, Error> {
    client
        .ask(server.local_addr(), path, message, TIMEOUT)
        .wait()
}

#[test]
fn round_trips_with_0_1_16_and_1024_buffers_return_the_same_message() {
    let _serial = serial();
    let (server, client) = (echo_node(), client_node());
    for (count, len) in [(0, 0), (1, 4096), (16, 65_536), (1024, 1000)] {
        let message = patterned(u32::try_from(count).unwrap(), count, len);
        let reply = tensor(ask(&client, &server, "/actors/echo", message.clone()).unwrap());
        assert_eq!(reply, message, "{count} buffers of {len} bytes");
    }
}

#[test]
fn more_than_1024_buffers_need_several_sendmsg_calls_and_still_arrive_in_order() {
    let _serial = serial();
    let (server, client) = (echo_node(), client_node());
    let message = patterned(5, 3000, 17);
    assert_eq!(
        tensor(ask(&client, &server, "/actors/echo", message.clone()).unwrap()),
        message
    );
}

#[test]
fn empty_buffers_between_non_empty_ones_survive_the_round_trip() {
    let _serial = serial();
    let (server, client) = (echo_node(), client_node());
    let buffers = vec![
        Bytes::new(),
        Bytes::from_static(b"abc"),
        Bytes::new(),
        Bytes::new(),
        Bytes::from_static(b"d"),
    ];
    let message = TensorMessage::new(3, Bytes::new(), buffers);
    assert_eq!(
        tensor(ask(&client, &server, "/actors/echo", message.clone()).unwrap()),
        message
    );
}

#[test]
fn message_over_the_senders_buffer_limit_is_refused_before_sending() {
    let _serial = serial();
    let server = echo_node();
    let client = Node::builder(any_local_address())
        .limits(Limits::builder().max_buffers(4).build())
        .in_process_delivery(false)
        .build()
        .unwrap();
    let accepted_before = stats::global().snapshot().raw_connections_accepted;
    let err = ask(&client, &server, "/actors/echo", patterned(1, 5, 1)).unwrap_err();
    assert!(matches!(err, Error::Encode(_)), "{err}");
    assert!(
        err.to_string()
            .contains("buffer count is 5, over the limit of 4"),
        "{err}"
    );
    let accepted = stats::global().snapshot().raw_connections_accepted - accepted_before;
    assert_eq!(accepted, 0, "refused before any connection was made");
}

#[test]
fn frame_over_the_receivers_limit_is_answered_with_an_error_frame() {
    let _serial = serial();
    let server = Node::builder(any_local_address())
        .limits(
            Limits::builder()
                .max_buffers(8)
                .max_wire_bytes(1 << 20)
                .build(),
        )
        .build()
        .unwrap();
    server
        .serve("echo", 1, |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    let client = client_node();
    let err = ask(&client, &server, "/actors/echo", patterned(1, 9, 10)).unwrap_err();
    assert!(err.is_remote(), "{err}");
    assert!(
        err.to_string()
            .contains("buffer count is 9, over the limit of 8"),
        "{err}"
    );
    // A big frame: the client is still sending when the server answers; it sees the answer.
    let err = ask(&client, &server, "/actors/echo", patterned(1, 1, 8 << 20)).unwrap_err();
    assert!(err.is_remote(), "{err}");
    assert!(err.to_string().contains("frame size in bytes is"), "{err}");
    assert_eq!(
        server.pool_stats().misses,
        0,
        "no receive memory was committed"
    );
    // The node still serves requests within its limits afterwards.
    let ok = patterned(2, 8, 10);
    assert_eq!(
        tensor(ask(&client, &server, "/actors/echo", ok.clone()).unwrap()),
        ok
    );
}

#[test]
fn message_of_256_mib_arrives_intact() {
    let _serial = serial();
    let (server, client) = (echo_node(), client_node());
    let len = 256 << 20;
    let mut data = vec![0u8; len];
    for (i, chunk) in data.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(
            &u64::try_from(i)
                .unwrap()
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .to_le_bytes(),
        );
    }
    let message = TensorMessage::new(1, Bytes::from_static(b"big"), vec![Bytes::from(data)]);
    let expected = checksum(&message);
    let reply = tensor(ask(&client, &server, "/actors/echo", message).unwrap());
    assert_eq!(reply.buffers[0].len(), len);
    assert_eq!(checksum(&reply), expected);
    assert!(
        client.pool_stats().misses >= 1,
        "the reply landed in a receive-pool slot"
    );
}

#[test]
fn thousand_concurrent_asks_over_several_connections_are_neither_lost_nor_mixed_up() {
    let _serial = serial();
    let (server, client) = (echo_node(), client_node());
    let peer = server.local_addr();
    let accepted_before = stats::global().snapshot().raw_connections_accepted;
    let pendings: Vec<_> = (0..1000u32)
        .map(|i| {
            let message = TensorMessage::new(
                i,
                Bytes::from(i.to_string()),
                vec![Bytes::from(vec![
                    u8::try_from(i % 251).unwrap();
                    100 + i as usize
                ])],
            );
            (i, client.ask(peer, "/actors/echo", message, TIMEOUT))
        })
        .collect();
    for (i, pending) in pendings {
        let reply = tensor(pending.wait().unwrap_or_else(|e| panic!("ask {i}: {e}")));
        assert_eq!(reply.version, i);
        assert_eq!(reply.metadata, Bytes::from(i.to_string()));
        assert_eq!(
            reply.buffers[0],
            Bytes::from(vec![u8::try_from(i % 251).unwrap(); 100 + i as usize])
        );
    }
    let accepted = stats::global().snapshot().raw_connections_accepted - accepted_before;
    assert!(
        accepted > 2,
        "several connections were used, not one: {accepted}"
    );
}

#[test]
fn tell_waits_for_mailbox_space_when_the_mailbox_is_full() {
    let _serial = serial();
    let server = Node::builder(any_local_address())
        .mailbox_capacity(2)
        .build()
        .unwrap();
    let inbox = server.endpoint("inbox").unwrap();
    let client = client_node();
    let peer = server.local_addr();
    for i in 0..2 {
        client
            .tell(peer, "/actors/inbox", patterned(i, 1, 10), TIMEOUT)
            .wait()
            .unwrap();
    }
    let third = client.tell(peer, "/actors/inbox", patterned(2, 1, 10), TIMEOUT);
    assert!(
        third.wait_timeout(Duration::from_millis(300)).is_none(),
        "ack held back while full"
    );
    let first = inbox.recv(TIMEOUT).unwrap().expect("a queued tell");
    assert_eq!(first.request().message.version, 0);
    third
        .wait_timeout(TIMEOUT)
        .expect("ack after space")
        .unwrap();
    assert_eq!(inbox.queued(), 2);
}

#[test]
fn ask_to_an_unknown_endpoint_gets_a_remote_error() {
    let _serial = serial();
    let (server, client) = (echo_node(), client_node());
    let err = ask(&client, &server, "/actors/nobody", patterned(1, 1, 1)).unwrap_err();
    assert!(err.is_remote(), "{err}");
    assert!(err.to_string().contains("/actors/nobody"), "{err}");
    let err = ask(&client, &server, "/elsewhere/echo", patterned(1, 1, 1)).unwrap_err();
    assert!(err.to_string().contains("invalid actor path"), "{err}");
}

#[test]
fn handler_error_text_reaches_the_asker() {
    let _serial = serial();
    let server = client_node();
    server
        .serve("fail", 1, |_| {
            Err("disk full: bucket 7 is read-only".to_owned())
        })
        .unwrap();
    let client = client_node();
    let err = ask(&client, &server, "/actors/fail", patterned(1, 1, 1)).unwrap_err();
    assert!(
        matches!(&err, Error::Remote { text } if text == "disk full: bucket 7 is read-only"),
        "{err}"
    );
}

#[test]
fn single_response_reaches_the_asker() {
    let _serial = serial();
    let server = client_node();
    server
        .serve("sink", 1, |r| {
            let total = r.message.total_bytes();
            Ok(Reply::Single {
                msg_type: "ack".into(),
                data: Bytes::from(total.to_string()),
            })
        })
        .unwrap();
    let client = client_node();
    let reply = ask(&client, &server, "/actors/sink", patterned(1, 3, 1000)).unwrap();
    assert_eq!(
        reply,
        Reply::Single {
            msg_type: "ack".into(),
            data: Bytes::from_static(b"3000")
        }
    );
}

#[test]
fn ask_times_out_when_the_handler_is_too_slow() {
    let _serial = serial();
    let server = slow_echo_node(1, Duration::from_secs(2));
    let client = client_node();
    let started = Instant::now();
    let err = client
        .ask(
            server.local_addr(),
            "/actors/slow",
            patterned(1, 1, 1),
            Duration::from_millis(150),
        )
        .wait()
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "failed at the deadline"
    );
}

#[test]
fn next_request_after_a_server_restart_reconnects() {
    let _serial = serial();
    let first = echo_node();
    let addr = first.local_addr();
    let client = client_node();
    let message = patterned(1, 2, 100);
    assert_eq!(
        tensor(
            client
                .ask(addr, "/actors/echo", message.clone(), TIMEOUT)
                .wait()
                .unwrap()
        ),
        message
    );
    first.shutdown();
    drop(first);
    let second = Node::builder(addr)
        .cores(2)
        .build()
        .expect("rebinds the same port");
    second
        .serve("echo", 1, |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    // The pooled connection to the old server is dead; the next request must not use it.
    let reply = client
        .ask(addr, "/actors/echo", message.clone(), TIMEOUT)
        .wait();
    assert_eq!(
        tensor(reply.expect("reconnected to the new server")),
        message
    );
}

#[test]
fn peer_closing_mid_reply_fails_the_ask_cleanly_without_leaking_fds() {
    let _serial = serial();
    let client = client_node();
    let baseline = open_fd_count();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let request = read_frame(&mut stream).unwrap().expect("a request");
        assert!(matches!(request, Frame::Ask { .. }));
        // Half a reply header, then gone.
        stream.write_all(&raw_header(3, 1, 0, 0, 1)[..20]).unwrap();
        drop(stream);
    });
    let err = client
        .ask(addr, "/actors/echo", patterned(1, 1, 10), TIMEOUT)
        .wait()
        .unwrap_err();
    assert!(matches!(err, Error::ConnectionClosed { .. }), "{err}");
    fake.join().unwrap();
    assert!(settle_fds(baseline) <= baseline, "fds back to {baseline}");
}

#[test]
fn client_dying_mid_request_frees_the_server_connection() {
    let _serial = serial();
    let server = echo_node();
    let baseline = open_fd_count();
    let mut stream = TcpStream::connect(server.local_addr()).unwrap();
    let mut frame = raw_header(1, 1, 12, 0, 1);
    frame.extend_from_slice(&(1u64 << 20).to_le_bytes());
    frame.extend_from_slice(b"/actors/echo");
    frame.extend_from_slice(&[7u8; 1000]); // 1000 of the promised 1 MiB
    stream.write_all(&frame).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    drop(stream);
    assert!(
        settle_fds(baseline) <= baseline,
        "server connection closed, fds back to {baseline}"
    );
    // The server is fine.
    let client = client_node();
    let message = patterned(1, 1, 10);
    assert_eq!(
        tensor(ask(&client, &server, "/actors/echo", message.clone()).unwrap()),
        message
    );
}

#[test]
fn silent_client_is_closed_at_the_preface_deadline() {
    let _serial = serial();
    let server = Node::builder(any_local_address())
        .preface_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let mut stream = raw_stream(&server);
    let started = Instant::now();
    let mut buf = [0u8; 1];
    assert_eq!(stream.read(&mut buf).unwrap(), 0, "closed by the server");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(150) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
}

#[test]
fn slow_client_is_closed_at_the_frame_deadline() {
    let _serial = serial();
    let server = Node::builder(any_local_address())
        .frame_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let mut stream = raw_stream(&server);
    let started = Instant::now();
    stream.write_all(&raw_header(1, 1, 12, 0, 0)).unwrap(); // header, then no path
    let mut buf = [0u8; 1];
    assert_eq!(stream.read(&mut buf).unwrap(), 0, "closed by the server");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
}

#[test]
fn idle_server_connection_is_closed_at_the_idle_deadline() {
    let _serial = serial();
    let server = echo_node_with(|b| b.idle_timeout(Duration::from_millis(200)));
    let mut stream = raw_stream(&server);
    stream.write_all(&raw_ask(b"/actors/echo", 1)).unwrap();
    assert!(matches!(
        read_frame(&mut stream).unwrap(),
        Some(Frame::TensorResponse(_))
    ));
    let started = Instant::now();
    let mut buf = [0u8; 1];
    assert_eq!(stream.read(&mut buf).unwrap(), 0, "closed after being idle");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[test]
fn a_slow_handler_is_not_cut_off_by_the_idle_deadline_which_runs_from_its_reply() {
    let _serial = serial();
    let delay = Duration::from_millis(400);
    let server = client_node_with(|b| b.idle_timeout(Duration::from_millis(150)));
    serve_slow_echo(&server, 1, delay);
    let mut stream = raw_stream(&server);
    stream.write_all(&raw_ask(b"/actors/slow", 3)).unwrap();
    match read_frame(&mut stream).unwrap() {
        Some(Frame::TensorResponse(message)) => assert_eq!(message.version, 3),
        other => panic!("the reply, not a close, after the handler's delay: {other:?}"),
    }
    let replied = Instant::now();
    let mut buf = [0u8; 1];
    assert_eq!(stream.read(&mut buf).unwrap(), 0, "closed once idle");
    let idle = replied.elapsed();
    assert!(
        idle >= Duration::from_millis(50) && idle < Duration::from_secs(3),
        "idle deadline counted from the reply: {idle:?}"
    );
}

#[test]
fn asks_pipelined_on_one_connection_are_answered_one_at_a_time_in_order() {
    let _serial = serial();
    // Two handler threads could answer both at once if the server let them.
    let server = client_node();
    serve_slow_echo(&server, 2, Duration::from_millis(150));
    let mut stream = raw_stream(&server);
    let started = Instant::now();
    // Large replies are sent by the core, small ones written by the handler thread.
    let asks = [
        patterned(1, 3, 100 << 10),
        patterned(2, 1, 100),
        patterned(3, 3, 100 << 10),
    ];
    let mut both = Vec::new();
    for message in &asks {
        let frame = Frame::Ask {
            path: "/actors/slow".into(),
            message: message.clone(),
        };
        both.extend(
            tensorwire_proto::ptr1::encode(&frame, &Limits::default())
                .unwrap()
                .to_vec(),
        );
    }
    let writer = {
        let mut stream = stream.try_clone().unwrap();
        std::thread::spawn(move || stream.write_all(&both))
    };
    for expected in &asks {
        match read_frame(&mut stream).unwrap() {
            Some(Frame::TensorResponse(message)) => {
                assert_eq!(message.version, expected.version);
                assert_eq!(checksum(&message), checksum(expected));
            }
            other => panic!("reply {}: {other:?}", expected.version),
        }
    }
    writer.join().unwrap().unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(440),
        "each ask is dispatched only after the previous reply: {:?}",
        started.elapsed()
    );
}

#[test]
fn a_client_that_half_closes_after_its_ask_still_gets_the_reply() {
    let _serial = serial();
    let server = client_node();
    serve_slow_echo(&server, 1, Duration::from_millis(100));
    let mut stream = raw_stream(&server);
    stream.write_all(&raw_ask(b"/actors/slow", 7)).unwrap();
    stream.shutdown(Shutdown::Write).unwrap();
    match read_frame(&mut stream).unwrap() {
        Some(Frame::TensorResponse(message)) => assert_eq!(message.version, 7),
        other => panic!("the reply despite the half-close: {other:?}"),
    }
    assert!(read_frame(&mut stream).unwrap().is_none(), "then the close");
}

#[test]
fn a_large_request_trickling_in_is_received_whole() {
    let _serial = serial();
    // Large bodies are read in a few steps that each wait for a share of what is still to
    // come: a sender that pauses, or ends with a few odd bytes, must never leave one waiting.
    let server = echo_node();
    let message = patterned(9, 2, (1 << 20) + 3);
    let frame = Frame::Ask {
        path: "/actors/echo".into(),
        message: message.clone(),
    };
    let wire = tensorwire_proto::ptr1::encode(&frame, &Limits::default())
        .unwrap()
        .to_vec();
    let mut stream = TcpStream::connect(server.local_addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let (body, last) = wire.split_at(wire.len() - 5);
    let writer = {
        let mut stream = stream.try_clone().unwrap();
        let (body, last) = (body.to_vec(), last.to_vec());
        std::thread::spawn(move || -> std::io::Result<()> {
            for piece in body.chunks(100_000) {
                stream.write_all(piece)?;
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(100));
            stream.write_all(&last)
        })
    };
    match read_frame(&mut stream).unwrap() {
        Some(Frame::TensorResponse(reply)) => assert_eq!(checksum(&reply), checksum(&message)),
        other => panic!("expected the echo, got {other:?}"),
    }
    writer.join().unwrap().unwrap();
}

/// A plain TCP connection to `server` for playing a raw peer; reads give up after 5 s.
fn raw_stream(server: &Node) -> TcpStream {
    let stream = TcpStream::connect(server.local_addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
}

/// An Ask frame with no metadata and no buffers.
fn raw_ask(path: &[u8], version: u32) -> Vec<u8> {
    let mut frame = raw_header(1, version, u32::try_from(path.len()).unwrap(), 0, 0);
    frame.extend_from_slice(path);
    frame
}

#[test]
fn bad_magic_is_closed_without_a_reply() {
    let _serial = serial();
    let server = echo_node();
    let mut stream = raw_stream(&server);
    stream.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut buf = Vec::new();
    let _ = stream.read_to_end(&mut buf);
    assert!(
        buf.is_empty(),
        "no bytes answered to a non-PTR1 peer: {buf:?}"
    );
}

#[test]
fn unknown_kind_is_answered_with_an_error_frame() {
    let _serial = serial();
    let server = echo_node();
    let mut stream = raw_stream(&server);
    stream.write_all(&raw_header(9, 42, 0, 0, 0)).unwrap();
    match read_frame(&mut stream).unwrap() {
        Some(Frame::Error { version, text }) => {
            assert_eq!(version, 42, "the request's version is echoed");
            assert!(text.contains("unknown frame kind 9"), "{text}");
        }
        other => panic!("expected an Error frame, got {other:?}"),
    }
    assert!(
        read_frame(&mut stream).unwrap().is_none(),
        "then the connection closes"
    );
}

#[test]
fn reply_kind_sent_as_a_request_is_answered_with_an_error_and_the_connection_stays() {
    let _serial = serial();
    let server = echo_node();
    let mut stream = raw_stream(&server);
    stream.write_all(&raw_header(4, 5, 0, 0, 0)).unwrap(); // an Ack
    match read_frame(&mut stream).unwrap() {
        Some(Frame::Error { text, .. }) => {
            assert!(text.contains("unexpected request frame: Ack"), "{text}")
        }
        other => panic!("expected an Error frame, got {other:?}"),
    }
    stream.write_all(&raw_ask(b"/actors/echo", 1)).unwrap();
    assert!(matches!(
        read_frame(&mut stream).unwrap(),
        Some(Frame::TensorResponse(_))
    ));
}

#[test]
fn oversized_lengths_are_answered_with_an_error_frame_before_any_allocation() {
    let _serial = serial();
    let server = echo_node();
    let limits = server.limits();
    let cases: [(Vec<u8>, &str); 4] = [
        (
            raw_header(1, 1, 70_000, 0, 0),
            "path length in bytes is 70000",
        ),
        (
            raw_header(1, 1, 0, limits.max_metadata_bytes() + 1, 0),
            "metadata length in bytes",
        ),
        (
            raw_header(1, 1, 0, 0, u32::try_from(limits.max_buffers() + 1).unwrap()),
            "buffer count",
        ),
        (
            [
                raw_header(1, 1, 0, 0, 1),
                limits.max_wire_bytes().to_le_bytes().to_vec(),
            ]
            .concat(),
            "frame size in bytes",
        ),
    ];
    for (frame, expected) in cases {
        let mut stream = raw_stream(&server);
        stream.write_all(&frame).unwrap();
        match read_frame(&mut stream).unwrap() {
            Some(Frame::Error { text, .. }) => assert!(text.contains(expected), "{text}"),
            other => panic!("expected an Error frame for {expected}, got {other:?}"),
        }
    }
    let pool = server.pool_stats();
    assert_eq!(
        (pool.misses, pool.hits, pool.heap),
        (0, 0, 0),
        "nothing was allocated"
    );
}

#[test]
fn ten_thousand_connect_disconnect_cycles_leave_no_fd_behind() {
    let _serial = serial();
    let server = echo_node();
    let baseline = open_fd_count();
    for i in 0..10_000 {
        let stream =
            TcpStream::connect(server.local_addr()).unwrap_or_else(|e| panic!("cycle {i}: {e}"));
        if i % 2 == 0 {
            stream.shutdown(Shutdown::Both).unwrap();
        }
    }
    assert!(settle_fds(baseline) <= baseline, "fds back to {baseline}");
    let client = client_node();
    let message = patterned(1, 1, 10);
    assert_eq!(
        tensor(ask(&client, &server, "/actors/echo", message.clone()).unwrap()),
        message
    );
}

#[test]
fn shutdown_of_the_client_fails_or_completes_every_request_in_flight() {
    let _serial = serial();
    let server = slow_echo_node(4, Duration::from_millis(100));
    let client = client_node();
    let pendings = slow_asks(&client, &server, 40);
    std::thread::sleep(Duration::from_millis(150));
    client.shutdown();
    let (mut ok, mut failed) = (0, 0);
    for pending in pendings {
        match pending
            .wait_timeout(Duration::from_secs(10))
            .expect("no request hangs")
        {
            Ok(_) => ok += 1,
            Err(Error::Shutdown) => failed += 1,
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert_eq!(ok + failed, 40);
    assert!(failed > 0, "some were still in flight at shutdown");
    let late = client
        .ask(
            server.local_addr(),
            "/actors/slow",
            patterned(1, 1, 1),
            TIMEOUT,
        )
        .wait();
    assert!(matches!(late, Err(Error::Shutdown)), "{late:?}");
}

#[test]
fn shutdown_of_the_server_fails_or_completes_every_request_in_flight() {
    let _serial = serial();
    let server = slow_echo_node(2, Duration::from_millis(100));
    let client = client_node();
    let pendings = slow_asks(&client, &server, 20);
    std::thread::sleep(Duration::from_millis(150));
    server.shutdown();
    for pending in pendings {
        let result = pending
            .wait_timeout(Duration::from_secs(10))
            .expect("no request hangs");
        if let Err(e) = result {
            assert!(
                matches!(e, Error::ConnectionClosed { .. } | Error::Remote { .. }),
                "{e}"
            );
        }
    }
}

#[test]
fn asks_wait_in_order_when_the_connection_cap_is_reached() {
    let _serial = serial();
    let server = echo_node();
    let client = Node::builder(any_local_address())
        .cores(1)
        .max_connections_per_peer(2)
        .in_process_delivery(false)
        .build()
        .unwrap();
    let accepted_before = stats::global().snapshot().raw_connections_accepted;
    let pendings: Vec<_> = (0..50u32)
        .map(|i| {
            (
                i,
                client.ask(
                    server.local_addr(),
                    "/actors/echo",
                    patterned(i, 1, 64),
                    TIMEOUT,
                ),
            )
        })
        .collect();
    for (i, pending) in pendings {
        assert_eq!(tensor(pending.wait().unwrap()).version, i);
    }
    let accepted = stats::global().snapshot().raw_connections_accepted - accepted_before;
    assert!(
        accepted <= 2,
        "at most 2 connections were opened, saw {accepted}"
    );
}

#[test]
fn same_process_ask_hands_the_receiver_the_senders_buffers() {
    let _serial = serial();
    let server = Node::builder(any_local_address()).build().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    server
        .serve("local", 1, move |r| {
            record
                .lock()
                .unwrap()
                .push(r.message.buffers[0].as_ptr() as usize);
            Ok(Reply::Tensor(r.message))
        })
        .unwrap();
    let message = patterned(1, 1, 4096);
    let sent_at = message.buffers[0].as_ptr() as usize;
    let accepted_before = stats::global().snapshot().raw_connections_accepted;
    let reply = tensor(
        server
            .ask(server.local_addr(), "/actors/local", message, TIMEOUT)
            .wait()
            .unwrap(),
    );
    assert_eq!(
        seen.lock().unwrap()[0],
        sent_at,
        "the handler saw the sender's memory"
    );
    assert_eq!(
        reply.buffers[0].as_ptr() as usize,
        sent_at,
        "and so does the reply"
    );
    let accepted = stats::global().snapshot().raw_connections_accepted - accepted_before;
    assert_eq!(accepted, 0, "no socket was involved");
}

#[test]
fn same_process_ask_fails_at_its_deadline_when_nobody_answers() {
    let _serial = serial();
    let node = client_node();
    let inbox = node.endpoint("inbox").unwrap();
    let local = Node::builder(any_local_address()).build().unwrap();
    let started = Instant::now();
    let err = local
        .ask(
            node.local_addr(),
            "/actors/inbox",
            patterned(1, 1, 1),
            Duration::from_millis(200),
        )
        .wait()
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(inbox.queued(), 1, "it was delivered; nobody answered");
}

#[test]
fn forced_fallback_is_a_clear_error() {
    let _serial = serial();
    let err = Node::builder(any_local_address())
        .force_fallback(true)
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::IoUringUnavailable { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("forced") && text.contains("fallback"),
        "{text}"
    );
}

#[test]
fn tls_required_node_refuses_ptr1() {
    let _serial = serial();
    let server = echo_node_with(|b| b.require_tls(true));
    let client = client_node();
    let err = ask(&client, &server, "/actors/echo", patterned(1, 1, 1)).unwrap_err();
    assert!(matches!(err, Error::ConnectionClosed { .. }), "{err}");
}

#[test]
fn non_ptr1_connection_is_handed_off_with_its_preface() {
    struct Catch(Mutex<Vec<Vec<u8>>>);
    impl Handoff for Catch {
        fn hand_off(&self, fd: OwnedFd, already_read: Vec<u8>) {
            let mut stream = TcpStream::from(fd);
            // The rest of the 24-byte HTTP/2 preface, after what the engine already read.
            let mut rest = vec![0u8; 24 - already_read.len()];
            let _ = stream.read_exact(&mut rest);
            self.0.lock().unwrap().push([already_read, rest].concat());
            let _ = stream.write_all(b"handled");
        }
    }
    let _serial = serial();
    let catch = Arc::new(Catch(Mutex::new(Vec::new())));
    let server = Node::builder(any_local_address())
        .handoff(catch.clone())
        .build()
        .unwrap();
    let mut stream = raw_stream(&server);
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    assert_eq!(answer, b"handled");
    assert_eq!(
        catch.0.lock().unwrap().as_slice(),
        &[b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec()]
    );
}

#[test]
fn stats_count_frames_bytes_and_connections() {
    let _serial = serial();
    let (server, client) = (echo_node(), client_node());
    let before = stats::global().snapshot();
    let message = patterned(1, 2, 1000);
    let wire = tensorwire_proto::ptr1::encode(
        &Frame::Ask {
            path: "/actors/echo".into(),
            message: message.clone(),
        },
        &Limits::default(),
    )
    .unwrap()
    .wire_len();
    tensor(ask(&client, &server, "/actors/echo", message).unwrap());
    // The handler thread counts its reply right after writing it, which can be a moment
    // after the asker already has it.
    let settled = Instant::now() + Duration::from_secs(2);
    let mut after = stats::global().snapshot();
    while after.raw_frames_sent < before.raw_frames_sent + 2 && Instant::now() < settled {
        std::thread::sleep(Duration::from_millis(1));
        after = stats::global().snapshot();
    }
    assert!(
        after.raw_frames_sent >= before.raw_frames_sent + 2,
        "request and reply"
    );
    assert!(after.raw_frames_received >= before.raw_frames_received + 2);
    assert!(
        after.raw_bytes_sent >= before.raw_bytes_sent + 2 * wire - 12,
        "both frames' bytes"
    );
    assert!(after.raw_connections_accepted > before.raw_connections_accepted);
    assert_eq!(after.active_copy_model.as_str(), "direct_tcp");
}

#[test]
fn pooled_connection_is_reused_for_sequential_asks() {
    let _serial = serial();
    let server = echo_node();
    let client = Node::builder(any_local_address())
        .cores(1)
        .in_process_delivery(false)
        .build()
        .unwrap();
    let before = stats::global().snapshot().raw_connections_accepted;
    for i in 0..20 {
        tensor(ask(&client, &server, "/actors/echo", patterned(i, 1, 10)).unwrap());
    }
    let opened = stats::global().snapshot().raw_connections_accepted - before;
    assert_eq!(opened, 1, "one connection served all 20 asks");
}

#[test]
fn timers_stay_bounded_by_connections_not_by_requests() {
    let _serial = serial();
    let server = echo_node();
    let client = client_node();
    let long = Duration::from_secs(600); // deadlines far beyond the test: none fires
    let message = patterned(1, 1, 16);
    for _ in 0..5_000 {
        client
            .ask(server.local_addr(), "/actors/echo", message.clone(), long)
            .wait()
            .unwrap();
    }
    // One pooled connection on each side, whatever the number of requests it carried.
    assert!(client.queued_timers() <= 4, "{}", client.queued_timers());
    assert!(server.queued_timers() <= 4, "{}", server.queued_timers());
}

#[test]
fn receive_pool_slots_are_reused_in_a_steady_loop() {
    let _serial = serial();
    let (server, client) = (echo_node(), client_node());
    let message = patterned(1, 1, 4 << 20);
    for _ in 0..5 {
        let reply = tensor(ask(&client, &server, "/actors/echo", message.clone()).unwrap());
        assert_eq!(reply, message);
    }
    let stats = client.pool_stats();
    assert!(
        stats.hits >= 3,
        "the reply memory came back to the pool and was reused: {stats:?}"
    );
}

fn echo_node_with(
    configure: impl FnOnce(tensorwire_engine::NodeBuilder) -> tensorwire_engine::NodeBuilder,
) -> Node {
    require_io_uring();
    let node = configure(Node::builder(any_local_address()).cores(2))
        .build()
        .unwrap();
    node.serve("echo", 1, |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    node
}

/// A node whose `/actors/slow` echoes after `delay`, on `threads` handler threads.
fn slow_echo_node(threads: usize, delay: Duration) -> Node {
    let node = client_node();
    serve_slow_echo(&node, threads, delay);
    node
}

/// `count` asks to `/actors/slow`, all sent at once.
fn slow_asks(client: &Node, server: &Node, count: u32) -> Vec<tensorwire_engine::Pending<Reply>> {
    (0..count)
        .map(|i| {
            client.ask(
                server.local_addr(),
                "/actors/slow",
                patterned(i, 1, 100),
                TIMEOUT,
            )
        })
        .collect()
}

fn serve_slow_echo(node: &Node, threads: usize, delay: Duration) {
    node.serve("slow", threads, move |r| {
        std::thread::sleep(delay);
        Ok(Reply::Tensor(r.message))
    })
    .unwrap();
}

fn client_node_with(
    configure: impl FnOnce(tensorwire_engine::NodeBuilder) -> tensorwire_engine::NodeBuilder,
) -> Node {
    require_io_uring();
    configure(Node::builder(any_local_address()).cores(2))
        .build()
        .unwrap()
}

fn open_fd_count() -> usize {
    tensorwire_engine::open_fd_count().unwrap()
}

#[test]
fn pending_results_can_be_awaited_by_any_executor() {
    use std::future::Future;
    use std::task::{Context, Poll, Wake, Waker};

    /// The smallest executor there is: poll, park until woken, repeat.
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    fn block_on<F: Future>(future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
                return output;
            }
            std::thread::park_timeout(Duration::from_millis(100));
        }
    }

    let _serial = serial();
    let (server, client) = (echo_node(), client_node());
    let message = patterned(9, 2, 5000);
    let reply = block_on(client.ask(
        server.local_addr(),
        "/actors/echo",
        message.clone(),
        TIMEOUT,
    ));
    assert_eq!(tensor(reply.unwrap()), message);

    // Many at once, polled together by one task.
    let mut pendings: Vec<_> = (0..32u32)
        .map(|i| {
            Some(client.ask(
                server.local_addr(),
                "/actors/echo",
                patterned(i, 1, 100),
                TIMEOUT,
            ))
        })
        .collect();
    block_on(std::future::poll_fn(|cx| {
        let mut done = true;
        for slot in pendings.iter_mut() {
            if let Some(pending) = slot {
                match std::pin::Pin::new(pending).poll(cx) {
                    Poll::Ready(result) => {
                        assert!(result.is_ok(), "{result:?}");
                        *slot = None;
                    }
                    Poll::Pending => done = false,
                }
            }
        }
        if done { Poll::Ready(()) } else { Poll::Pending }
    }));
    assert!(pendings.iter().all(Option::is_none), "every ask completed");
}

#[test]
fn forced_zero_copy_sends_arrive_intact_and_every_notification_is_counted() {
    use tensorwire_engine::ZeroCopy;
    let _serial = serial();
    let server = echo_node_with(|b| b.zero_copy(ZeroCopy::Always));
    let client = Node::builder(any_local_address())
        .zero_copy(ZeroCopy::Always)
        .in_process_delivery(false)
        .build()
        .unwrap();
    let before = tensorwire_engine::stats::snapshot();
    let message = patterned(3, 4, 1 << 20); // 4 MiB: above the 64 KiB zero-copy threshold
    for _ in 0..3 {
        assert_eq!(
            tensor(ask(&client, &server, "/actors/echo", message.clone()).unwrap()),
            message
        );
    }
    // Notifications come after the sends complete (when the peer has the data): wait for them.
    let deadline = Instant::now() + Duration::from_secs(5);
    let (requests, notified, copied) = loop {
        let now = tensorwire_engine::stats::snapshot();
        let requests = now.zero_copy_requests - before.zero_copy_requests;
        let copied = now.zero_copy_copied - before.zero_copy_copied;
        let notified = now.zero_copy_done - before.zero_copy_done + copied;
        if notified >= requests || Instant::now() > deadline {
            break (requests, notified, copied);
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        requests >= 6,
        "3 requests and 3 echoes went out zero-copy: {requests}"
    );
    assert_eq!(notified, requests, "one notification per zero-copy send");
    eprintln!("loopback zero-copy: {requests} sends, {copied} reported copied by the kernel");
}

#[test]
fn automatic_zero_copy_is_not_used_on_loopback() {
    let _serial = serial();
    let (server, client) = (echo_node(), client_node());
    let before = tensorwire_engine::stats::snapshot().zero_copy_requests;
    let message = patterned(3, 1, 4 << 20);
    assert_eq!(
        tensor(ask(&client, &server, "/actors/echo", message.clone()).unwrap()),
        message
    );
    assert_eq!(
        tensorwire_engine::stats::snapshot().zero_copy_requests,
        before
    );
}

#[test]
fn blocking_asks_run_on_the_calling_thread_and_reuse_one_connection() {
    let _serial = serial();
    let server = echo_node();
    let client = client_node();
    let before = stats::global().snapshot().raw_connections_accepted;
    for i in 0..20 {
        let message = patterned(i, 2, 3000);
        let reply = client.ask_blocking(
            server.local_addr(),
            "/actors/echo",
            message.clone(),
            TIMEOUT,
        );
        assert_eq!(tensor(reply.unwrap()), message);
    }
    client
        .tell_blocking(
            server.local_addr(),
            "/actors/echo",
            patterned(1, 1, 1),
            TIMEOUT,
        )
        .unwrap();
    let opened = stats::global().snapshot().raw_connections_accepted - before;
    assert_eq!(opened, 1, "this thread's ring kept one pooled connection");
}

#[test]
fn blocking_ask_fails_at_its_deadline() {
    let _serial = serial();
    let server = slow_echo_node(1, Duration::from_secs(2));
    let client = client_node();
    let started = Instant::now();
    let err = client
        .ask_blocking(
            server.local_addr(),
            "/actors/slow",
            patterned(1, 1, 1),
            Duration::from_millis(150),
        )
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(started.elapsed() < Duration::from_millis(1500));
}

#[test]
fn blocking_ask_after_a_server_restart_reconnects() {
    let _serial = serial();
    let first = echo_node();
    let addr = first.local_addr();
    let client = client_node();
    let message = patterned(1, 1, 100);
    assert_eq!(
        tensor(
            client
                .ask_blocking(addr, "/actors/echo", message.clone(), TIMEOUT)
                .unwrap()
        ),
        message
    );
    first.shutdown();
    drop(first);
    let second = Node::builder(addr).build().unwrap();
    second
        .serve("echo", 1, |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    let reply = client.ask_blocking(addr, "/actors/echo", message.clone(), TIMEOUT);
    assert_eq!(
        tensor(reply.expect("the stale pooled connection was noticed")),
        message
    );
}

#[test]
fn blocking_ask_after_shutdown_fails_with_shutdown() {
    let _serial = serial();
    let server = echo_node();
    let client = client_node();
    client
        .ask_blocking(
            server.local_addr(),
            "/actors/echo",
            patterned(1, 1, 1),
            TIMEOUT,
        )
        .unwrap();
    client.shutdown();
    let err = client.ask_blocking(
        server.local_addr(),
        "/actors/echo",
        patterned(1, 1, 1),
        TIMEOUT,
    );
    assert!(matches!(err, Err(Error::Shutdown)), "{err:?}");
}

#[test]
fn blocking_calls_from_many_threads_are_not_mixed_up_and_free_their_fds_on_exit() {
    let _serial = serial();
    let server = echo_node();
    let client = client_node();
    let baseline = open_fd_count();
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let client = client.clone();
            let peer = server.local_addr();
            std::thread::spawn(move || {
                for i in 0..50 {
                    let message = patterned(t * 1000 + i, 1, 64 + i as usize);
                    let reply = client.ask_blocking(peer, "/actors/echo", message.clone(), TIMEOUT);
                    assert_eq!(tensor(reply.unwrap()), message);
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    // Each thread's ring and pooled connection went away with the thread.
    assert!(settle_fds(baseline) <= baseline, "fds back to {baseline}");
}

#[test]
fn a_panicking_handler_answers_with_an_error_and_keeps_serving() {
    let _serial = serial();
    let server = client_node();
    server
        .serve("fragile", 1, |r| {
            if r.message.version == 13 {
                panic!("unlucky version");
            }
            Ok(Reply::Tensor(r.message))
        })
        .unwrap();
    let client = client_node();
    let err = ask(&client, &server, "/actors/fragile", patterned(13, 1, 1)).unwrap_err();
    assert!(
        err.to_string()
            .contains("handler panicked: unlucky version"),
        "{err}"
    );
    let ok = patterned(14, 1, 1);
    assert_eq!(
        tensor(ask(&client, &server, "/actors/fragile", ok.clone()).unwrap()),
        ok
    );
}

#[test]
fn frame_over_the_receive_budget_is_refused_before_any_allocation() {
    let _serial = serial();
    let pool = tensorwire_engine::PoolConfig {
        max_receiving_bytes: 1 << 20,
        ..Default::default()
    };
    let server = echo_node_with(|b| b.receive_pool(pool));
    let mut stream = raw_stream(&server);
    let mut frame = raw_header(1, 3, 12, 0, 1);
    frame.extend_from_slice(&(64u64 << 20).to_le_bytes());
    frame.extend_from_slice(b"/actors/echo");
    stream.write_all(&frame).unwrap();
    match read_frame(&mut stream).unwrap() {
        Some(Frame::Error { version, text }) => {
            assert_eq!(version, 3);
            assert!(text.contains("max_receiving_bytes"), "{text}");
        }
        other => panic!("expected an Error frame, got {other:?}"),
    }
    let stats = server.pool_stats();
    assert_eq!(
        (stats.misses, stats.hits),
        (0, 0),
        "nothing was allocated for the refused frame"
    );
    // Frames within the budget still go through.
    let client = client_node();
    let message = patterned(1, 2, 256 << 10);
    assert_eq!(
        tensor(ask(&client, &server, "/actors/echo", message.clone()).unwrap()),
        message
    );
}

#[test]
fn a_header_declaring_a_huge_body_commits_no_memory_before_the_data_arrives() {
    fn resident_bytes() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    }
    let _serial = serial();
    let server = echo_node();
    let before = resident_bytes();
    let mut stream = TcpStream::connect(server.local_addr()).unwrap();
    let mut frame = raw_header(1, 1, 12, 0, 1);
    frame.extend_from_slice(&(4u64 << 30).to_le_bytes()); // 4 GiB promised, never sent
    frame.extend_from_slice(b"/actors/echo");
    stream.write_all(&frame).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let grown = resident_bytes().saturating_sub(before);
    assert!(
        grown < 256 << 20,
        "resident memory grew by {grown} bytes for an empty 4 GiB body"
    );
    drop(stream);
}
