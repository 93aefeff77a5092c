//! What is particular to the io_uring engine and the node: zero-copy sends, in-process
//! delivery, futures, cancellation, statistics, and a core that survives a panic.

use std::future::Future;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_engine::{Node, Reply, TensorMessage, ZeroCopy};
use tensorwire_proto::ptr1::Frame;
use tensorwire_proto::{Limits, stats};
use tensorwire_tests::*;

const URING: Drivers = Drivers {
    client: Driver::Uring,
    server: Driver::Uring,
};

/// The smallest executor there is: poll, park until woken, repeat.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
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

#[test]
fn pending_results_can_be_awaited_by_any_executor() {
    let _serial = serial();
    let (server, client) = (URING.echo_server(), URING.client_node());
    let message = patterned(9, 2, 5000);
    let reply = block_on(client.ask(server.local_addr(), "echo", message.clone(), TIMEOUT));
    assert_eq!(tensor(reply.unwrap()), message);
    let mut pendings: Vec<_> = (0..32u32)
        .map(|i| {
            Some(client.ask(
                server.local_addr(),
                "echo-core",
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
}

#[test]
fn an_endpoint_can_be_awaited_as_well_as_blocked_on() {
    let _serial = serial();
    let server = URING.server().build().unwrap();
    let inbox = server.endpoint("inbox").unwrap();
    let client = URING.client_node();
    let mut ask = client.ask(server.local_addr(), "inbox", patterned(5, 1, 10), TIMEOUT);
    let incoming = block_on(inbox.recv()).unwrap();
    assert_eq!(incoming.request().message.version, 5);
    assert_eq!(incoming.request().path, "/actors/inbox");
    assert!(
        incoming.request().peer.is_some(),
        "a network request names its peer"
    );
    incoming.reply(Ok(Reply::Single {
        msg_type: "seen".into(),
        data: Bytes::new(),
    }));
    assert!(matches!(
        ask.wait_timeout(TIMEOUT).unwrap().unwrap(),
        Reply::Single { msg_type, .. } if msg_type == "seen"
    ));
    assert!(
        inbox
            .recv_blocking(Some(Duration::from_millis(50)))
            .unwrap()
            .is_none()
    );
}

#[test]
fn same_process_ask_hands_the_receiver_the_senders_buffers() {
    let _serial = serial();
    let server = URING.server().build().unwrap();
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
            .ask(server.local_addr(), "local", message, TIMEOUT)
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
    let node = URING.server().build().unwrap();
    let inbox = node.endpoint("inbox").unwrap();
    let started = Instant::now();
    let err = node
        .ask(
            node.local_addr(),
            "inbox",
            patterned(1, 1, 1),
            Duration::from_millis(200),
        )
        .wait()
        .unwrap_err();
    assert_eq!(err.to_string(), "ask timed out after 200ms");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(inbox.queued(), 1, "it was delivered; nobody answered");
    let err = node
        .ask(node.local_addr(), "nobody", patterned(1, 1, 1), TIMEOUT)
        .wait()
        .unwrap_err();
    assert!(
        matches!(err, tensorwire_engine::Error::UnknownEndpoint { .. }),
        "{err}"
    );
}

#[test]
fn dropping_a_pending_cancels_its_request_and_closes_its_connection() {
    let _serial = serial();
    let server = URING.server().build().unwrap();
    let handled = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&handled);
    server
        .serve("slow", 1, move |r| {
            count.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(300));
            Ok(Reply::Tensor(r.message))
        })
        .unwrap();
    let client = URING
        .client()
        .cores(1)
        .max_connections_per_peer(1)
        .build()
        .unwrap();
    let peer = server.local_addr();
    let first = client.ask(peer, "slow", patterned(1, 1, 1), TIMEOUT);
    // Queued behind the first (one connection at most): dropped before it is ever sent.
    let second = client.ask(peer, "slow", patterned(2, 1, 1), TIMEOUT);
    std::thread::sleep(Duration::from_millis(50));
    drop(second);
    drop(first); // on the wire: its connection is closed
    let deadline = Instant::now() + Duration::from_secs(5);
    while client.stats().gauges.connections > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        client.stats().gauges.connections,
        0,
        "the connection was closed"
    );
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(
        handled.load(Ordering::SeqCst),
        1,
        "the queued ask was never sent"
    );
    // The client works on.
    let third = client
        .ask(peer, "slow", patterned(3, 1, 1), TIMEOUT)
        .wait()
        .unwrap();
    assert_eq!(tensor(third).version, 3);
}

#[test]
fn a_panic_on_a_core_thread_closes_its_connections_and_the_core_goes_on() {
    /// A buffer whose owner panics when the last reference drops (on the core that sent it).
    struct Fragile(Vec<u8>);
    impl AsRef<[u8]> for Fragile {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }
    impl Drop for Fragile {
        fn drop(&mut self) {
            panic!("a user buffer's drop panicked");
        }
    }
    let _serial = serial();
    let server = URING.echo_server();
    let client = URING.client().cores(1).build().unwrap();
    let fragile = TensorMessage::new(
        1,
        Bytes::new(),
        vec![Bytes::from_owner(Fragile(vec![1; 4096]))],
    );
    let _ = client
        .tell(server.local_addr(), "echo-core", fragile, TIMEOUT)
        .wait();
    for i in 0..5 {
        let message = patterned(i, 1, 100);
        let reply = client
            .ask(server.local_addr(), "echo-core", message.clone(), TIMEOUT)
            .wait();
        assert_eq!(tensor(reply.expect("the core still serves")), message);
    }
}

#[test]
fn forced_zero_copy_sends_arrive_intact_and_every_notification_is_counted() {
    let _serial = serial();
    let server = URING.echo_server_with(|b| b.zero_copy(ZeroCopy::Always));
    let client = URING.client().zero_copy(ZeroCopy::Always).build().unwrap();
    let before = tensorwire_engine::stats::snapshot();
    let message = patterned(3, 4, 1 << 20); // 4 MiB: above the 64 KiB zero-copy threshold
    for _ in 0..3 {
        let reply = client
            .ask(server.local_addr(), "echo-core", message.clone(), TIMEOUT)
            .wait();
        assert_eq!(tensor(reply.unwrap()), message);
    }
    // Notifications come after the sends complete: wait for them.
    let deadline = Instant::now() + Duration::from_secs(5);
    let (requests, notified) = loop {
        let now = tensorwire_engine::stats::snapshot();
        let requests = now.zero_copy_requests - before.zero_copy_requests;
        let copied = now.zero_copy_copied - before.zero_copy_copied;
        let notified = now.zero_copy_done - before.zero_copy_done + copied;
        if notified >= requests || Instant::now() > deadline {
            break (requests, notified);
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        requests >= 6,
        "requests and echoes went out zero-copy: {requests}"
    );
    assert_eq!(
        notified, requests,
        "one notification per zero-copy submission"
    );
}

#[test]
fn a_zero_copy_reply_a_peer_never_reads_does_not_keep_the_socket_once_closed() {
    // A peer that closes its receive window and never reads leaves a zero-copy send's pages
    // unacknowledged, and the operation holding them holds the socket too. Once the minimum
    // rate closes the connection, the socket must go when the peer still takes nothing a rate
    // window later (it is reset), however long the peer keeps the TCP connection alive.
    let _serial = serial();
    let window = Duration::from_millis(500);
    let server = URING.echo_server_with(|b| {
        b.zero_copy(ZeroCopy::Always)
            .min_transfer_rate(1 << 20, window)
    });
    let before = tensorwire_engine::stats::snapshot().zero_copy_requests;
    let baseline = open_fd_count();
    let mut peer = raw_stream_small_window(server.local_addr(), 64 << 10);
    let wire = encoded_ask("/actors/echo-core", patterned(5, 1, 8 << 20));
    peer.write_all(&wire).unwrap();
    // The peer's own socket stays open (it never reads): only the server's may go.
    let left = settle_fds(baseline + 1);
    assert!(
        tensorwire_engine::stats::snapshot().zero_copy_requests > before,
        "the reply went out zero-copy"
    );
    assert!(
        left <= baseline + 1,
        "the server let its socket go ({left} fds open, {baseline} before the peer came)"
    );
    // What reached the peer before comes first, then the reset.
    let mut buf = vec![0u8; 1 << 20];
    let ended = loop {
        match peer.read(&mut buf) {
            Ok(0) => break None,
            Ok(_) => continue,
            Err(e) => break Some(e.kind()),
        }
    };
    assert_eq!(
        ended,
        Some(std::io::ErrorKind::ConnectionReset),
        "the server reset the connection"
    );
}

#[test]
fn automatic_zero_copy_is_not_used_on_loopback() {
    let _serial = serial();
    let (server, client) = (URING.echo_server(), URING.client_node());
    let before = tensorwire_engine::stats::snapshot().zero_copy_requests;
    let message = patterned(3, 1, 4 << 20);
    let reply = client
        .ask(server.local_addr(), "echo", message.clone(), TIMEOUT)
        .wait();
    assert_eq!(tensor(reply.unwrap()), message);
    assert_eq!(
        tensorwire_engine::stats::snapshot().zero_copy_requests,
        before
    );
}

#[test]
fn stats_count_frames_bytes_and_connections() {
    let _serial = serial();
    let (server, client) = (URING.echo_server(), URING.client_node());
    let before = stats::global().snapshot();
    let message = patterned(1, 2, 1000);
    let wire = tensorwire_proto::ptr1::encode(
        &Frame::Ask {
            path: "/actors/echo-core".into(),
            message: message.clone(),
        },
        &Limits::default(),
    )
    .unwrap()
    .wire_len();
    tensor(
        client
            .ask(server.local_addr(), "echo-core", message, TIMEOUT)
            .wait()
            .unwrap(),
    );
    // The server counts its reply once the write completes, which can be a moment after the
    // asker already has it.
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
    // The reply is the request without its 17-byte path.
    assert!(after.raw_bytes_sent >= before.raw_bytes_sent + 2 * wire - 17);
    assert!(after.raw_connections_accepted > before.raw_connections_accepted);
    assert_eq!(after.active_copy_model.as_str(), "direct_tcp");
    let engine = tensorwire_engine::stats::snapshot();
    assert!(
        engine.drivers.contains(&(server.local_addr(), "io_uring")),
        "{:?}",
        engine.drivers
    );
}

#[test]
fn one_name_means_one_endpoint_everywhere() {
    let _serial = serial();
    let server = URING.server().build().unwrap();
    server
        .serve_on_core("echo", |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    let err = server.endpoint("/actors/echo").unwrap_err();
    assert!(
        matches!(err, tensorwire_engine::Error::EndpointExists { .. }),
        "{err}"
    );
    let client = URING.client_node();
    for path in ["echo", "/actors/echo"] {
        let reply = client
            .ask(server.local_addr(), path, patterned(1, 1, 1), TIMEOUT)
            .wait();
        assert_eq!(tensor(reply.unwrap()).version, 1, "{path}");
    }
    server
        .serve_on_core("/named/ns/echo", |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    let reply = client.ask(
        server.local_addr(),
        "/named/ns/echo",
        patterned(2, 1, 1),
        TIMEOUT,
    );
    assert_eq!(tensor(reply.wait().unwrap()).version, 2);
}

#[test]
fn nodes_built_and_dropped_in_a_loop_leave_no_fd_or_thread_behind() {
    let _serial = serial();
    let baseline = open_fd_count();
    for _ in 0..20 {
        let node: Node = URING.echo_server();
        let client = URING.client_node();
        let reply = client.ask(node.local_addr(), "echo-core", patterned(1, 1, 1), TIMEOUT);
        tensor(reply.wait().unwrap());
    }
    assert!(settle_fds(baseline) <= baseline, "fds back to {baseline}");
}
