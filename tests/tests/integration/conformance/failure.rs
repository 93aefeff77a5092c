//! Every failure reaches the caller as a typed error with its text, and leaves nothing behind.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use tensorwire_engine::{Error, Node, Reply};
use tensorwire_proto::ptr1::Frame;
use tensorwire_proto::{Limits, stats};
use tensorwire_tests::*;

use super::conformance;

conformance!(
    pairs: [
        a_message_over_the_senders_limit_is_refused_before_sending,
        a_frame_over_the_receivers_limit_is_answered_with_an_error,
        an_ask_to_an_unknown_endpoint_gets_a_remote_error,
        handler_error_text_reaches_the_asker,
        a_panicking_handler_answers_with_an_error_and_keeps_serving,
        a_tell_waits_for_mailbox_space_when_the_mailbox_is_full,
        a_tell_beyond_the_mailbox_waiting_bound_is_refused_at_once,
        the_next_request_after_a_server_restart_reconnects,
        a_peer_closing_mid_reply_fails_the_ask_cleanly_without_leaking_fds,
    ],
    servers: [
        a_client_dying_mid_request_frees_the_server_connection,
    ],
);

fn a_message_over_the_senders_limit_is_refused_before_sending(drivers: Drivers) {
    let server = drivers.echo_server();
    let client = drivers
        .client()
        .limits(Limits::builder().max_buffers(4).build())
        .build()
        .unwrap();
    let accepted_before = stats::global().snapshot().raw_connections_accepted;
    let err = client
        .ask(server.local_addr(), "echo", patterned(1, 5, 1), TIMEOUT)
        .wait()
        .unwrap_err();
    assert!(matches!(err, Error::Encode(_)) && err.is_limit(), "{err}");
    assert!(
        err.to_string()
            .contains("buffer count is 5, over the limit of 4"),
        "{err}"
    );
    let accepted = stats::global().snapshot().raw_connections_accepted - accepted_before;
    assert_eq!(accepted, 0, "refused before any connection was made");
}

fn a_frame_over_the_receivers_limit_is_answered_with_an_error(drivers: Drivers) {
    let server = drivers
        .server()
        .limits(
            Limits::builder()
                .max_buffers(8)
                .max_wire_bytes(1 << 20)
                .build(),
        )
        .build()
        .unwrap();
    server
        .serve_on_core("echo", |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    let client = drivers.client_node();
    let ask = |message| {
        client
            .ask(server.local_addr(), "echo", message, TIMEOUT)
            .wait()
    };
    let err = ask(patterned(1, 9, 10)).unwrap_err();
    assert!(err.is_remote(), "{err}");
    assert!(
        err.to_string()
            .contains("buffer count is 9, over the limit of 8"),
        "{err}"
    );
    // A big frame: the client is still sending when the server answers; it sees the answer.
    let err = ask(patterned(1, 1, 8 << 20)).unwrap_err();
    assert!(err.is_remote(), "{err}");
    assert!(err.to_string().contains("frame size in bytes is"), "{err}");
    assert_eq!(
        server.stats().pool.misses,
        0,
        "no receive memory was committed"
    );
    // The node still serves requests within its limits afterwards.
    let ok = patterned(2, 8, 10);
    assert_eq!(tensor(ask(ok.clone()).unwrap()), ok);
}

fn an_ask_to_an_unknown_endpoint_gets_a_remote_error(drivers: Drivers) {
    let (server, client) = (drivers.echo_server(), drivers.client_node());
    let big = patterned(1, 4, 1 << 20);
    let err = client
        .ask(server.local_addr(), "nobody", big, TIMEOUT)
        .wait()
        .unwrap_err();
    assert!(err.is_remote(), "{err}");
    assert_eq!(
        err.remote_text(),
        Some("no endpoint at path \"/actors/nobody\"")
    );
    assert_eq!(
        server.stats().pool.misses,
        0,
        "refused before its payload was received"
    );
    let err = client
        .ask(
            server.local_addr(),
            "/elsewhere/echo",
            patterned(1, 1, 1),
            TIMEOUT,
        )
        .wait()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidPath { .. }), "{err}");
    // The connection stayed usable.
    let ok = patterned(3, 1, 10);
    let reply = client
        .ask(server.local_addr(), "echo", ok.clone(), TIMEOUT)
        .wait();
    assert_eq!(tensor(reply.unwrap()), ok);
}

fn handler_error_text_reaches_the_asker(drivers: Drivers) {
    let server = drivers.server().build().unwrap();
    server
        .serve("fail", 1, |_| {
            Err("disk full: bucket 7 is read-only".to_owned())
        })
        .unwrap();
    server
        .serve_on_core("fail-core", |_| Err("quota exceeded".to_owned()))
        .unwrap();
    let client = drivers.client_node();
    for (path, text) in [
        ("fail", "disk full: bucket 7 is read-only"),
        ("fail-core", "quota exceeded"),
    ] {
        let err = client
            .ask(server.local_addr(), path, patterned(1, 1, 1), TIMEOUT)
            .wait()
            .unwrap_err();
        assert!(
            matches!(&err, Error::Remote { text: got, peer: Some(_) } if got == text),
            "{err}"
        );
    }
}

fn a_panicking_handler_answers_with_an_error_and_keeps_serving(drivers: Drivers) {
    let server = drivers.server().build().unwrap();
    let fragile = |r: tensorwire_engine::Request| {
        if r.message.version == 13 {
            panic!("unlucky version");
        }
        Ok(Reply::Tensor(r.message))
    };
    server.serve("fragile", 1, fragile).unwrap();
    server.serve_on_core("fragile-core", fragile).unwrap();
    let client = drivers.client_node();
    for path in ["fragile", "fragile-core"] {
        let err = client
            .ask(server.local_addr(), path, patterned(13, 1, 1), TIMEOUT)
            .wait()
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("handler panicked: unlucky version"),
            "{err}"
        );
        let ok = patterned(14, 1, 1);
        let reply = client
            .ask(server.local_addr(), path, ok.clone(), TIMEOUT)
            .wait();
        assert_eq!(tensor(reply.unwrap()), ok, "{path} still serves");
    }
}

fn a_tell_waits_for_mailbox_space_when_the_mailbox_is_full(drivers: Drivers) {
    let server = drivers.server().mailbox_capacity(2).build().unwrap();
    let inbox = server.endpoint("inbox").unwrap();
    let client = drivers.client_node();
    let peer = server.local_addr();
    for i in 0..2 {
        client
            .tell(peer, "inbox", patterned(i, 1, 10), TIMEOUT)
            .wait()
            .unwrap();
    }
    let mut third = client.tell(peer, "inbox", patterned(2, 1, 10), TIMEOUT);
    assert!(
        third.wait_timeout(Duration::from_millis(300)).is_none(),
        "the Ack is held back while the mailbox is full"
    );
    let first = inbox
        .recv_blocking(Some(TIMEOUT))
        .unwrap()
        .expect("a queued tell");
    assert_eq!(first.request().message.version, 0);
    third
        .wait_timeout(TIMEOUT)
        .expect("Ack once there is space")
        .unwrap();
    assert_eq!(inbox.queued(), 2);
}

fn a_tell_beyond_the_mailbox_waiting_bound_is_refused_at_once(drivers: Drivers) {
    let server = drivers
        .server()
        .mailbox_capacity(1)
        .mailbox_waiting_capacity(1)
        .build()
        .unwrap();
    let inbox = server.endpoint("inbox").unwrap();
    let client = drivers.client_node();
    let peer = server.local_addr();
    let tell = |i| client.tell(peer, "inbox", patterned(i, 1, 10), TIMEOUT);
    tell(0).wait().unwrap();
    let mut waiting = tell(1);
    assert!(waiting.wait_timeout(Duration::from_millis(200)).is_none());
    let started = Instant::now();
    let refused = tell(2).wait().expect_err("a second waiter was accepted");
    assert!(
        refused
            .remote_text()
            .is_some_and(|text| text.contains("waiting for mailbox space")),
        "{refused:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused at once"
    );
    // The one that waits gets in once there is space; the refused one never does.
    assert_eq!(
        inbox
            .recv_blocking(Some(TIMEOUT))
            .unwrap()
            .unwrap()
            .request()
            .message
            .version,
        0
    );
    waiting
        .wait_timeout(TIMEOUT)
        .expect("in once there is space")
        .unwrap();
    assert_eq!(
        inbox
            .recv_blocking(Some(TIMEOUT))
            .unwrap()
            .unwrap()
            .request()
            .message
            .version,
        1
    );
    assert_eq!(inbox.queued(), 0);
}

fn the_next_request_after_a_server_restart_reconnects(drivers: Drivers) {
    let first = drivers.echo_server();
    let addr = first.local_addr();
    let client = drivers.client_node();
    let message = patterned(1, 2, 100);
    let ask = |client: &Node| client.ask(addr, "echo", message.clone(), TIMEOUT).wait();
    assert_eq!(tensor(ask(&client).unwrap()), message);
    assert_eq!(
        tensor(
            client
                .ask_blocking(addr, "echo", message.clone(), TIMEOUT)
                .unwrap()
        ),
        message
    );
    first.shutdown();
    drop(first);
    let second = Node::builder(addr);
    let second = match drivers.server {
        Driver::Uring => second,
        Driver::Tokio => second.force_fallback(true).fallback(std::sync::Arc::new(
            tensorwire_compat::TokioFallback::default(),
        )),
    }
    .build()
    .expect("rebinds the same port");
    second
        .serve("echo", 1, |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    // The pooled connections to the old server are dead; the next requests must not use them.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(tensor(ask(&client).expect("reconnected")), message);
    let blocking = client.ask_blocking(addr, "echo", message.clone(), TIMEOUT);
    assert_eq!(
        tensor(blocking.expect("the stale blocking connection was noticed")),
        message
    );
}

fn a_client_dying_mid_request_frees_the_server_connection(drivers: Drivers) {
    let server = drivers.echo_server();
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
    assert_eq!(
        server.stats().pool.receiving_bytes,
        0,
        "its receive budget came back"
    );
    let client = drivers.client_node();
    let message = patterned(1, 1, 10);
    let reply = client
        .ask(server.local_addr(), "echo", message.clone(), TIMEOUT)
        .wait();
    assert_eq!(tensor(reply.unwrap()), message);
}

/// A raw server that reads one request and dies half-way through its reply.
fn half_reply_server() -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let thread = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let request = read_frame(&mut stream).unwrap().expect("a request");
        assert!(matches!(request, Frame::Ask { .. }));
        stream.write_all(&raw_header(3, 1, 0, 0, 1)[..20]).unwrap();
    });
    (addr, thread)
}

fn a_peer_closing_mid_reply_fails_the_ask_cleanly_without_leaking_fds(drivers: Drivers) {
    let client = drivers.client_node();
    let baseline = open_fd_count();
    let (addr, fake) = half_reply_server();
    let err = client
        .ask(addr, "echo", patterned(1, 1, 10), TIMEOUT)
        .wait()
        .unwrap_err();
    assert!(matches!(err, Error::ConnectionClosed { .. }), "{err}");
    fake.join().unwrap();
    assert!(settle_fds(baseline) <= baseline, "fds back to {baseline}");
}
