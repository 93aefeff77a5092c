//! Every deadline of a connection fires, on every driver, without spinning while it waits.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use tensorwire_engine::Reply;
use tensorwire_proto::ptr1::Frame;
use tensorwire_tests::*;

use super::conformance;

conformance!(
    pairs: [
        an_ask_times_out_when_the_handler_is_too_slow,
        a_blocking_ask_fails_at_its_deadline,
        a_tell_waiting_for_mailbox_space_is_refused_at_the_enqueue_deadline,
    ],
    servers: [
        a_silent_client_is_closed_at_the_preface_deadline_without_spinning,
        a_header_trickling_in_is_closed_at_the_head_deadline,
        a_body_below_the_minimum_rate_is_closed,
        an_idle_server_connection_is_closed_at_the_idle_deadline,
        a_slow_handler_is_not_cut_off_by_the_idle_deadline,
        a_reply_the_peer_does_not_read_is_given_up_at_the_minimum_rate,
    ],
);

/// Reads until the server closes; how long that took.
fn closed_after(stream: &mut std::net::TcpStream) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return started.elapsed(),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return started.elapsed(),
            Err(e) => panic!("expected the server to close, got {e}"),
        }
    }
}

fn an_ask_times_out_when_the_handler_is_too_slow(drivers: Drivers) {
    let server = drivers.server().build().unwrap();
    server
        .serve("slow", 1, |r| {
            std::thread::sleep(Duration::from_secs(2));
            Ok(Reply::Tensor(r.message))
        })
        .unwrap();
    let client = drivers.client_node();
    let started = Instant::now();
    let err = client
        .ask(
            server.local_addr(),
            "slow",
            patterned(1, 1, 1),
            Duration::from_millis(150),
        )
        .wait()
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert_eq!(err.to_string(), "ask timed out after 150ms");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "failed at the deadline"
    );
}

fn a_blocking_ask_fails_at_its_deadline(drivers: Drivers) {
    let server = drivers.server().build().unwrap();
    server
        .serve("slow", 1, |r| {
            std::thread::sleep(Duration::from_secs(2));
            Ok(Reply::Tensor(r.message))
        })
        .unwrap();
    let client = drivers.client_node();
    let started = Instant::now();
    let err = client
        .ask_blocking(
            server.local_addr(),
            "slow",
            patterned(1, 1, 1),
            Duration::from_millis(150),
        )
        .unwrap_err();
    assert_eq!(err.to_string(), "ask timed out after 150ms");
    assert!(started.elapsed() < Duration::from_millis(1500));
}

fn a_tell_waiting_for_mailbox_space_is_refused_at_the_enqueue_deadline(drivers: Drivers) {
    let server = drivers
        .server()
        .mailbox_capacity(1)
        .enqueue_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let _inbox = server.endpoint("inbox").unwrap();
    let client = drivers.client_node();
    let peer = server.local_addr();
    client
        .tell(peer, "inbox", patterned(0, 1, 1), TIMEOUT)
        .wait()
        .unwrap();
    let started = Instant::now();
    let err = client
        .tell(peer, "inbox", patterned(1, 1, 1), TIMEOUT)
        .wait()
        .unwrap_err();
    let text = err.remote_text().unwrap_or_default().to_owned();
    assert!(
        text.contains(
            "the mailbox of /actors/inbox stayed full for 300ms; the tell was not delivered"
        ),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

fn a_silent_client_is_closed_at_the_preface_deadline_without_spinning(drivers: Drivers) {
    let server = drivers
        .server()
        .preface_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let cpu_before = cpu_time();
    let mut stream = raw_stream(server.local_addr());
    let waited = closed_after(&mut stream);
    assert!(
        waited >= Duration::from_millis(400) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    let cpu = cpu_time().saturating_sub(cpu_before);
    assert!(
        cpu < Duration::from_millis(200),
        "waiting used {cpu:?} of CPU"
    );
}

fn a_header_trickling_in_is_closed_at_the_head_deadline(drivers: Drivers) {
    let server = drivers.echo_server_with(|b| b.head_timeout(Duration::from_millis(600)));
    let mut stream = raw_stream(server.local_addr());
    let wire = encoded_ask("/actors/echo", patterned(1, 1, 10));
    let started = Instant::now();
    let writer = {
        let mut stream = stream.try_clone().unwrap();
        std::thread::spawn(move || {
            for byte in wire {
                if stream.write_all(&[byte]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let waited = closed_after(&mut stream);
    assert!(
        waited >= Duration::from_millis(500) && started.elapsed() < Duration::from_secs(5),
        "closed after {waited:?}"
    );
    writer.join().unwrap();
}

fn a_body_below_the_minimum_rate_is_closed(drivers: Drivers) {
    let server =
        drivers.echo_server_with(|b| b.min_transfer_rate(100_000, Duration::from_millis(500)));
    let mut stream = raw_stream(server.local_addr());
    let wire = encoded_ask("/actors/echo", patterned(1, 1, 1 << 20));
    stream.write_all(&wire[..4096]).unwrap();
    let writer = {
        let mut stream = stream.try_clone().unwrap();
        let rest = wire[4096..].to_vec();
        std::thread::spawn(move || {
            // 10 KB/s: a tenth of the minimum.
            for piece in rest.chunks(1000) {
                if stream.write_all(piece).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let waited = closed_after(&mut stream);
    assert!(waited < Duration::from_secs(5), "closed after {waited:?}");
    writer.join().unwrap();
}

fn an_idle_server_connection_is_closed_at_the_idle_deadline(drivers: Drivers) {
    let server = drivers.echo_server_with(|b| b.idle_timeout(Duration::from_millis(300)));
    let mut stream = raw_stream(server.local_addr());
    stream.write_all(&raw_ask(b"/actors/echo", 1)).unwrap();
    assert!(matches!(
        read_frame(&mut stream).unwrap(),
        Some(Frame::TensorResponse(_))
    ));
    let idle = closed_after(&mut stream);
    assert!(
        idle >= Duration::from_millis(200) && idle < Duration::from_secs(5),
        "{idle:?}"
    );
}

fn a_slow_handler_is_not_cut_off_by_the_idle_deadline(drivers: Drivers) {
    let server = drivers
        .server()
        .idle_timeout(Duration::from_millis(150))
        .build()
        .unwrap();
    server
        .serve("slow", 1, |r| {
            std::thread::sleep(Duration::from_millis(400));
            Ok(Reply::Tensor(r.message))
        })
        .unwrap();
    let mut stream = raw_stream(server.local_addr());
    stream.write_all(&raw_ask(b"/actors/slow", 3)).unwrap();
    match read_frame(&mut stream).unwrap() {
        Some(Frame::TensorResponse(message)) => assert_eq!(message.version, 3),
        other => panic!("the reply, not a close, after the handler's delay: {other:?}"),
    }
    let idle = closed_after(&mut stream);
    assert!(
        idle >= Duration::from_millis(100) && idle < Duration::from_secs(5),
        "{idle:?}"
    );
}

fn a_reply_the_peer_does_not_read_is_given_up_at_the_minimum_rate(drivers: Drivers) {
    let server =
        drivers.echo_server_with(|b| b.min_transfer_rate(1 << 20, Duration::from_millis(500)));
    let baseline = open_fd_count();
    let stream = raw_stream(server.local_addr());
    // Ask for a 64 MiB echo and never read it.
    let wire = encoded_ask("/actors/echo-core", patterned(1, 1, 64 << 20));
    let mut writer = stream.try_clone().unwrap();
    let send = std::thread::spawn(move || writer.write_all(&wire));
    let started = Instant::now();
    while server.stats().gauges.connections > 0 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        server.stats().gauges.connections,
        0,
        "the server gave the reply up after {:?}",
        started.elapsed()
    );
    drop(stream);
    let _ = send.join();
    assert!(settle_fds(baseline) <= baseline, "fds back to {baseline}");
}
