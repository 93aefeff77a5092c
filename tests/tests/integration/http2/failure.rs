//! The PTR1 conformance cases that apply to HTTP/2: backpressure on a full mailbox and its
//! deadline, a panicking handler, a client that dies mid-request.

use std::process::Command;
use std::time::{Duration, Instant};

use tensorwire_proto::Limits;
use tensorwire_tests::http2::{Pki, Wire};
use tensorwire_tests::pki::PemDir;
use tensorwire_tests::*;

fn wires() -> Vec<(&'static str, Wire, Wire)> {
    let pki = Pki::new();
    vec![
        ("h2c", Wire::H2c, Wire::H2c),
        (
            "tls",
            Wire::Tls(pki.server_tls(false)),
            Wire::Tls(pki.client_tls(None)),
        ),
    ]
}

#[test]
fn a_tell_to_a_full_mailbox_waits_and_is_refused_at_the_enqueue_deadline() {
    let _serial = serial();
    for (name, server_wire, client_wire) in wires() {
        let server = server_wire
            .builder(Driver::Uring)
            .mailbox_capacity(1)
            .enqueue_timeout(Duration::from_millis(300))
            .build()
            .unwrap();
        let inbox = server.endpoint("inbox").unwrap();
        let client = client_wire.builder(Driver::Uring).build().unwrap();
        let peer = server.local_addr();
        client
            .tell(peer, "inbox", patterned(0, 1, 1), TIMEOUT)
            .wait()
            .unwrap();
        // The mailbox is full: the next tell waits (backpressure) ...
        let started = Instant::now();
        let err = client
            .tell(peer, "inbox", patterned(1, 1, 1), TIMEOUT)
            .wait()
            .unwrap_err();
        let text = err.remote_text().unwrap_or_default().to_owned();
        assert!(text.starts_with("503"), "{name}: {err}");
        assert!(
            text.contains("stayed full for 300ms; the tell was not delivered"),
            "{name}: {err}"
        );
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "{name}: it waited"
        );
        // ... and one that gets space in time is delivered.
        let waiting = client.tell(peer, "inbox", patterned(2, 1, 1), TIMEOUT);
        std::thread::sleep(Duration::from_millis(100));
        let first = inbox.recv_blocking(Some(TIMEOUT)).unwrap().unwrap();
        assert_eq!(first.request().message, patterned(0, 1, 1), "{name}");
        waiting.wait().unwrap_or_else(|e| panic!("{name}: {e}"));
        let second = inbox.recv_blocking(Some(TIMEOUT)).unwrap().unwrap();
        assert_eq!(
            second.request().message,
            patterned(2, 1, 1),
            "{name}: the refused tell was dropped"
        );
    }
}

#[test]
fn a_panicking_handler_answers_500_and_the_server_keeps_serving() {
    let _serial = serial();
    for (name, server_wire, client_wire) in wires() {
        let server = server_wire.echo_server(Driver::Uring);
        server
            .serve("panics", 1, |_| panic!("deliberately"))
            .unwrap();
        let client = client_wire.builder(Driver::Uring).build().unwrap();
        let err = client
            .ask(server.local_addr(), "panics", patterned(1, 1, 1), TIMEOUT)
            .wait()
            .unwrap_err();
        let text = err.remote_text().unwrap_or_default();
        assert!(
            text.starts_with("500") && text.contains("panicked"),
            "{name}: {err}"
        );
        let reply = client
            .ask(server.local_addr(), "echo", patterned(2, 1, 8), TIMEOUT)
            .wait()
            .unwrap();
        assert_eq!(tensor(reply), patterned(2, 1, 8), "{name}");
    }
}

#[test]
fn a_client_dying_mid_body_frees_the_server_connection_and_its_memory() {
    let _serial = serial();
    let server = Wire::H2c.echo_server(Driver::Uring);
    let dir = PemDir::new();
    let body = dir.write("big.ptm1", "");
    let message = patterned(1, 4, 16 << 20);
    std::fs::write(
        &body,
        tensorwire_proto::ptm1::encode(&message, &Limits::default())
            .unwrap()
            .to_vec(),
    )
    .unwrap();
    // curl uploads 64 MiB at 4 MiB/s and is killed half a second in.
    let mut curl = Command::new("curl")
        .args([
            "--http2-prior-knowledge",
            "-s",
            "-o",
            "/dev/null",
            "--limit-rate",
            "4M",
        ])
        .args(["-H", "x-message-type: __pulsing_tensor_message__"])
        .arg("--data-binary")
        .arg(format!("@{}", body.display()))
        .arg(format!("http://{}/actors/echo", server.local_addr()))
        .spawn()
        .expect("curl is installed");
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.stats().pool.receiving_bytes == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        server.stats().pool.receiving_bytes > 0,
        "the body is being received"
    );
    assert_eq!(server.stats().transport_connections, 1);
    curl.kill().unwrap();
    curl.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while (server.stats().transport_connections > 0 || server.stats().pool.receiving_bytes > 0)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        server.stats().transport_connections,
        0,
        "the connection closed"
    );
    assert_eq!(
        server.stats().pool.receiving_bytes,
        0,
        "the receive budget was given back"
    );
}
