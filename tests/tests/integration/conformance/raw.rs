//! A hand-played client against each server driver: malformed, pipelined, trickling and
//! foreign input.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tensorwire_engine::Reply;
use tensorwire_proto::ptr1::Frame;
use tensorwire_proto::stripe::{CAPABILITIES_PATH, CAPABILITIES_TYPE, pipeline_depth};
use tensorwire_proto::transport::HandOff;
use tensorwire_tests::*;

use super::conformance;

conformance!(
    pairs: [],
    servers: [
        bad_magic_is_closed_without_a_reply,
        an_unknown_kind_is_answered_with_an_error_frame_then_a_close,
        a_reply_kind_sent_as_a_request_is_answered_with_an_error_and_the_connection_stays,
        oversized_lengths_are_answered_with_an_error_frame_before_any_allocation,
        ten_thousand_connect_disconnect_cycles_leave_no_fd_behind,
        asks_pipelined_on_one_connection_are_answered_one_at_a_time_in_order,
        many_pipelined_asks_are_all_answered_in_order_before_the_half_close_closes,
        the_capabilities_ask_says_how_many_requests_the_server_reads_ahead,
        a_client_that_half_closes_after_its_ask_still_gets_the_reply,
        a_large_request_trickling_in_is_received_whole,
        a_large_reply_read_slowly_but_above_the_minimum_rate_is_sent_whole,
        a_non_ptr1_connection_is_handed_off_with_its_first_bytes,
        a_tls_only_node_refuses_plaintext_ptr1_with_an_error_frame,
    ],
);

fn bad_magic_is_closed_without_a_reply(drivers: Drivers) {
    let server = drivers.echo_server();
    let mut stream = raw_stream(server.local_addr());
    stream.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut buf = Vec::new();
    let _ = stream.read_to_end(&mut buf);
    assert!(
        buf.is_empty(),
        "no bytes answered to a non-PTR1 peer: {buf:?}"
    );
}

fn an_unknown_kind_is_answered_with_an_error_frame_then_a_close(drivers: Drivers) {
    let server = drivers.echo_server();
    let mut stream = raw_stream(server.local_addr());
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

fn a_reply_kind_sent_as_a_request_is_answered_with_an_error_and_the_connection_stays(
    drivers: Drivers,
) {
    let server = drivers.echo_server();
    let mut stream = raw_stream(server.local_addr());
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

fn oversized_lengths_are_answered_with_an_error_frame_before_any_allocation(drivers: Drivers) {
    let server = drivers.echo_server();
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
        let mut stream = raw_stream(server.local_addr());
        stream.write_all(&frame).unwrap();
        match read_frame(&mut stream).unwrap() {
            Some(Frame::Error { text, .. }) => assert!(text.contains(expected), "{text}"),
            other => panic!("expected an Error frame for {expected}, got {other:?}"),
        }
    }
    let pool = server.stats().pool;
    assert_eq!(
        (pool.misses, pool.hits, pool.heap),
        (0, 0, 0),
        "nothing was allocated"
    );
}

fn ten_thousand_connect_disconnect_cycles_leave_no_fd_behind(drivers: Drivers) {
    let server = drivers.echo_server();
    let baseline = open_fd_count();
    for i in 0..10_000 {
        let stream =
            TcpStream::connect(server.local_addr()).unwrap_or_else(|e| panic!("cycle {i}: {e}"));
        if i % 2 == 0 {
            stream.shutdown(Shutdown::Both).unwrap();
        }
    }
    assert!(settle_fds(baseline) <= baseline, "fds back to {baseline}");
    let mut stream = raw_stream(server.local_addr());
    stream.write_all(&raw_ask(b"/actors/echo", 1)).unwrap();
    assert!(matches!(
        read_frame(&mut stream).unwrap(),
        Some(Frame::TensorResponse(_))
    ));
}

fn slow_echo(node: &tensorwire_engine::Node, threads: usize, delay: Duration) {
    node.serve("slow", threads, move |r| {
        std::thread::sleep(delay);
        Ok(Reply::Tensor(r.message))
    })
    .unwrap();
}

fn asks_pipelined_on_one_connection_are_answered_one_at_a_time_in_order(drivers: Drivers) {
    // Two handler threads could answer both at once if the server let them.
    let server = drivers.server().build().unwrap();
    slow_echo(&server, 2, Duration::from_millis(150));
    let mut stream = raw_stream(server.local_addr());
    let started = Instant::now();
    let asks = [
        patterned(1, 3, 100 << 10),
        patterned(2, 1, 100),
        patterned(3, 3, 100 << 10),
    ];
    let all: Vec<u8> = asks
        .iter()
        .flat_map(|m| encoded_ask("/actors/slow", m.clone()))
        .collect();
    let writer = {
        let mut stream = stream.try_clone().unwrap();
        std::thread::spawn(move || stream.write_all(&all))
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

fn many_pipelined_asks_are_all_answered_in_order_before_the_half_close_closes(drivers: Drivers) {
    // Written at once, then the write side shut: the server reads them while it writes the
    // replies before them, several together, and closes only once all are out.
    let server = drivers.echo_server();
    let mut stream = raw_stream(server.local_addr());
    let asks: Vec<_> = (0..300)
        .map(|i| patterned(i, 1 + (i as usize % 3), 1 + (i as usize * 97) % 9000))
        .collect();
    let all: Vec<u8> = asks
        .iter()
        .flat_map(|m| encoded_ask("/actors/echo", m.clone()))
        .collect();
    let writer = {
        let mut stream = stream.try_clone().unwrap();
        std::thread::spawn(move || {
            stream.write_all(&all)?;
            stream.shutdown(Shutdown::Write)
        })
    };
    let replies = read_frames_to_end(&mut stream).unwrap();
    writer.join().unwrap().unwrap();
    assert_eq!(
        replies.len(),
        asks.len(),
        "every ask answered, then the close"
    );
    for (expected, reply) in asks.iter().zip(&replies) {
        match reply {
            Frame::TensorResponse(message) => {
                assert_eq!(message.version, expected.version);
                assert_eq!(checksum(message), checksum(expected));
            }
            other => panic!("reply {}: {other:?}", expected.version),
        }
    }
}

fn the_capabilities_ask_says_how_many_requests_the_server_reads_ahead(drivers: Drivers) {
    // Answered by the session itself, never by a handler.
    let server = drivers.echo_server();
    let mut stream = raw_stream(server.local_addr());
    stream
        .write_all(&raw_ask(CAPABILITIES_PATH.as_bytes(), 0))
        .unwrap();
    match read_frame(&mut stream).unwrap() {
        Some(Frame::SingleResponse { msg_type, data, .. }) => {
            assert_eq!(msg_type, CAPABILITIES_TYPE);
            assert_eq!(pipeline_depth(&data), Some(64), "{data:?}");
        }
        other => panic!("expected the capabilities, got {other:?}"),
    }
}

fn a_client_that_half_closes_after_its_ask_still_gets_the_reply(drivers: Drivers) {
    let server = drivers.server().build().unwrap();
    slow_echo(&server, 1, Duration::from_millis(100));
    let mut stream = raw_stream(server.local_addr());
    stream.write_all(&raw_ask(b"/actors/slow", 7)).unwrap();
    stream.shutdown(Shutdown::Write).unwrap();
    match read_frame(&mut stream).unwrap() {
        Some(Frame::TensorResponse(message)) => assert_eq!(message.version, 7),
        other => panic!("the reply despite the half-close: {other:?}"),
    }
    assert!(read_frame(&mut stream).unwrap().is_none(), "then the close");
}

fn a_large_request_trickling_in_is_received_whole(drivers: Drivers) {
    // Large bodies are read in steps that wait for a share of what is still to come: a sender
    // that pauses, or ends with a few odd bytes, must never leave one waiting.
    let server = drivers.echo_server();
    let message = patterned(9, 2, (1 << 20) + 3);
    let wire = encoded_ask("/actors/echo-core", message.clone());
    let mut stream = raw_stream(server.local_addr());
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

fn a_large_reply_read_slowly_but_above_the_minimum_rate_is_sent_whole(drivers: Drivers) {
    // A send must report progress as the peer takes bytes: a driver that reported a large
    // reply only once all of it was written would see no progress for longer than the rate
    // window while this reader takes 16 MiB, and cut an honest peer off. The reader takes at
    // most 64 KiB per 10 ms (so at least 2.56 s in all, over two windows) through a 128 KiB
    // receive buffer; a send is woken in lumps of about a third of the server's send buffer
    // (under 1.4 MiB), so the reader must drain one lump per window: 1.4 MiB/s against its
    // 6.25 MiB/s, room for a reader thread descheduled for most of a second.
    let window = Duration::from_secs(1);
    let server = drivers.echo_server_with(|b| b.min_transfer_rate(256 << 10, window));
    let message = patterned(4, 1, 16 << 20);
    let mut stream = raw_stream_small_window(server.local_addr(), 128 << 10);
    let writer = {
        let mut stream = stream.try_clone().unwrap();
        let wire = encoded_ask("/actors/echo-core", message.clone());
        std::thread::spawn(move || stream.write_all(&wire))
    };
    let reply = read_frame_slowly(&mut stream, 64 << 10, Duration::from_millis(10));
    writer.join().unwrap().unwrap();
    match reply.unwrap() {
        Some(Frame::TensorResponse(reply)) => assert_eq!(checksum(&reply), checksum(&message)),
        other => panic!("expected the whole echo, got {other:?}"),
    }
}

fn a_non_ptr1_connection_is_handed_off_with_its_first_bytes(drivers: Drivers) {
    struct Catch(Mutex<Vec<Vec<u8>>>);
    impl HandOff for Catch {
        fn hand_off(&self, mut stream: TcpStream, already_read: Vec<u8>) {
            // The rest of the 24-byte HTTP/2 preface, after what the driver already read.
            let mut rest = vec![0u8; 24 - already_read.len()];
            let _ = stream.read_exact(&mut rest);
            self.0.lock().unwrap().push([already_read, rest].concat());
            let _ = stream.write_all(b"handled");
        }
    }
    let catch = Arc::new(Catch(Mutex::new(Vec::new())));
    let server = drivers.server().handoff(catch.clone()).build().unwrap();
    let mut stream = raw_stream(server.local_addr());
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

fn a_tls_only_node_refuses_plaintext_ptr1_with_an_error_frame(drivers: Drivers) {
    let server = drivers.server().require_tls(true).build().unwrap();
    server
        .serve_on_core("echo", |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    let mut stream = raw_stream(server.local_addr());
    stream.write_all(&raw_ask(b"/actors/echo", 4)).unwrap();
    match read_frame(&mut stream).unwrap() {
        Some(Frame::Error { version, text }) => {
            assert_eq!(version, 4);
            assert!(text.contains("requires TLS"), "{text}");
        }
        other => panic!("expected an Error frame, got {other:?}"),
    }
    assert!(
        read_frame(&mut stream).unwrap().is_none(),
        "then the connection closes"
    );
}
