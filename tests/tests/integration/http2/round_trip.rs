//! Messages of every shape over h2c and TLS, through the node's router and the HTTP/2 client.

use std::time::{Duration, Instant};

use tensorwire_engine::{Node, Reply, TensorMessage};
use tensorwire_proto::stats;
use tensorwire_tests::http2::{Pki, Wire};
use tensorwire_tests::*;

/// Both wires: h2c, and TLS with a server certificate from a fresh CA.
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

fn ask(client: &Node, server: &Node, path: &str, message: TensorMessage) -> TensorMessage {
    tensor(
        client
            .ask(server.local_addr(), path, message, TIMEOUT)
            .wait()
            .unwrap_or_else(|e| panic!("ask to {path}: {e}")),
    )
}

#[test]
fn asks_with_0_1_16_and_1024_buffers_round_trip_over_h2c_and_tls() {
    let _serial = serial();
    for (name, server_wire, client_wire) in wires() {
        let server = server_wire.echo_server(Driver::Uring);
        let client = client_wire.builder(Driver::Uring).build().unwrap();
        for path in ["echo", "/actors/echo-core"] {
            for (count, len) in [(0, 0), (1, 4096), (16, 65_536), (1024, 1000)] {
                let message = patterned(u32::try_from(count).unwrap(), count, len);
                let reply = ask(&client, &server, path, message.clone());
                assert_eq!(
                    reply, message,
                    "{name}: {count} buffers of {len} bytes to {path}"
                );
            }
        }
        assert_eq!(
            server.stats().transport,
            Some(if name == "tls" { "http2+tls" } else { "http2" })
        );
    }
}

#[test]
fn a_64_mib_message_arrives_intact_over_h2c_and_tls() {
    let _serial = serial();
    for (name, server_wire, client_wire) in wires() {
        let server = server_wire.echo_server(Driver::Uring);
        let client = client_wire.builder(Driver::Uring).build().unwrap();
        let message = patterned(3, 4, 16 << 20);
        let started = Instant::now();
        let reply = ask(&client, &server, "echo", message.clone());
        let elapsed = started.elapsed();
        assert_eq!(checksum(&reply), checksum(&message), "{name}");
        assert_eq!(reply, message, "{name}");
        println!("{name}: 64 MiB echoed (128 MiB moved) in {elapsed:?}");
    }
}

#[test]
fn a_tell_is_acknowledged_once_it_is_in_the_mailbox() {
    let _serial = serial();
    for (name, server_wire, client_wire) in wires() {
        let server = server_wire.builder(Driver::Uring).build().unwrap();
        let inbox = server.endpoint("inbox").unwrap();
        let client = client_wire.builder(Driver::Uring).build().unwrap();
        client
            .tell(server.local_addr(), "inbox", patterned(7, 2, 100), TIMEOUT)
            .wait()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let incoming = inbox
            .recv_blocking(Some(TIMEOUT))
            .unwrap()
            .expect("the tell arrived");
        assert_eq!(incoming.request().message, patterned(7, 2, 100), "{name}");
    }
}

#[test]
fn handler_errors_and_unknown_endpoints_come_back_as_remote_errors() {
    let _serial = serial();
    for (name, server_wire, client_wire) in wires() {
        let server = server_wire.builder(Driver::Uring).build().unwrap();
        server
            .serve("fails", 1, |_| Err("no such tensor".into()))
            .unwrap();
        let client = client_wire.builder(Driver::Uring).build().unwrap();
        let err = client
            .ask(server.local_addr(), "fails", patterned(1, 1, 10), TIMEOUT)
            .wait()
            .unwrap_err();
        assert!(err.is_remote(), "{name}: {err}");
        assert!(err.remote_text().unwrap().contains("500"), "{name}: {err}");
        assert!(
            err.remote_text().unwrap().contains("no such tensor"),
            "{name}: {err}"
        );
        let err = client
            .ask(server.local_addr(), "nobody", patterned(1, 1, 10), TIMEOUT)
            .wait()
            .unwrap_err();
        assert!(
            err.remote_text().is_some_and(|t| t.starts_with("404")),
            "{name}: {err}"
        );
        // The connection survived both.
        server
            .serve_on_core("echo", |r| Ok(Reply::Tensor(r.message)))
            .unwrap();
        assert_eq!(
            ask(&client, &server, "echo", patterned(2, 1, 10)),
            patterned(2, 1, 10)
        );
        assert_eq!(client.stats().transport_connections, 1, "{name}");
    }
}

#[test]
fn concurrent_asks_to_one_peer_share_one_connection() {
    let _serial = serial();
    for (name, server_wire, client_wire) in wires() {
        let server = server_wire.echo_server(Driver::Uring);
        let client = client_wire.builder(Driver::Uring).build().unwrap();
        let before = stats::global().snapshot().http2_fallback_frames;
        let asks: Vec<_> = (0..100)
            .map(|i| client.ask(server.local_addr(), "echo", patterned(i, 2, 1000), TIMEOUT))
            .collect();
        for (i, ask) in asks.into_iter().enumerate() {
            let reply = tensor(ask.wait().unwrap_or_else(|e| panic!("{name}: {e}")));
            assert_eq!(
                reply,
                patterned(u32::try_from(i).unwrap(), 2, 1000),
                "{name}"
            );
        }
        assert_eq!(
            server.stats().transport_connections,
            1,
            "{name}: one connection served all"
        );
        assert_eq!(client.stats().transport_connections, 1, "{name}");
        let snapshot = stats::global().snapshot();
        assert!(
            snapshot.http2_fallback_frames >= before + 100,
            "{name}: requests counted"
        );
        assert_eq!(
            snapshot.active_copy_model.as_str(),
            "packed_http2_compatibility"
        );
    }
}

#[test]
fn the_next_ask_after_a_server_restart_reconnects() {
    let _serial = serial();
    for (name, server_wire, client_wire) in wires() {
        let server = server_wire.echo_server(Driver::Uring);
        let addr = server.local_addr();
        let client = client_wire.builder(Driver::Uring).build().unwrap();
        assert_eq!(
            ask(&client, &server, "echo", patterned(1, 1, 10)),
            patterned(1, 1, 10)
        );
        server.shutdown();
        drop(server);
        let restarted = server_wire
            .configure(Node::builder(addr))
            .build()
            .unwrap_or_else(|e| panic!("{name}: rebind {addr}: {e}"));
        restarted
            .serve_on_core("echo", |r| Ok(Reply::Tensor(r.message)))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match client
                .ask(addr, "echo", patterned(2, 1, 10), TIMEOUT)
                .wait()
            {
                Ok(reply) => {
                    assert_eq!(tensor(reply), patterned(2, 1, 10), "{name}");
                    break;
                }
                // The first ask may find the old connection closing: it fails, is not replayed.
                Err(e) if e.is_connection() && Instant::now() < deadline => {}
                Err(e) => panic!("{name}: {e}"),
            }
        }
    }
}

#[test]
fn dropping_an_ask_cancels_its_stream_and_the_connection_goes_on() {
    let _serial = serial();
    for (name, server_wire, client_wire) in wires() {
        let server = server_wire.echo_server(Driver::Uring);
        server
            .serve("slow", 1, |r| {
                std::thread::sleep(Duration::from_millis(500));
                Ok(Reply::Tensor(r.message))
            })
            .unwrap();
        let client = client_wire.builder(Driver::Uring).build().unwrap();
        let slow = client.ask(server.local_addr(), "slow", patterned(1, 1, 10), TIMEOUT);
        std::thread::sleep(Duration::from_millis(50));
        drop(slow);
        let started = Instant::now();
        assert_eq!(
            ask(&client, &server, "echo", patterned(3, 1, 10)),
            patterned(3, 1, 10)
        );
        assert!(
            started.elapsed() < Duration::from_millis(400),
            "{name}: not behind the dropped ask"
        );
        assert_eq!(client.stats().transport_connections, 1, "{name}");
    }
}

#[test]
fn an_ask_fails_at_its_deadline() {
    let _serial = serial();
    for (name, server_wire, client_wire) in wires() {
        let server = server_wire.builder(Driver::Uring).build().unwrap();
        server
            .serve("slow", 1, |r| {
                std::thread::sleep(Duration::from_secs(2));
                Ok(Reply::Tensor(r.message))
            })
            .unwrap();
        let client = client_wire.builder(Driver::Uring).build().unwrap();
        let started = Instant::now();
        let err = client
            .ask(
                server.local_addr(),
                "slow",
                patterned(1, 1, 1),
                Duration::from_millis(200),
            )
            .wait()
            .unwrap_err();
        assert!(err.is_timeout(), "{name}: {err}");
        assert_eq!(err.to_string(), "ask timed out after 200ms", "{name}");
        assert!(started.elapsed() < Duration::from_millis(1500), "{name}");
    }
}

#[test]
fn the_tokio_fallback_node_speaks_http2_too() {
    let _serial = serial();
    for (name, server_wire, client_wire) in wires() {
        let server = server_wire.echo_server(Driver::Tokio);
        let client = client_wire.builder(Driver::Tokio).build().unwrap();
        let message = patterned(5, 16, 65_536);
        assert_eq!(
            ask(&client, &server, "echo", message.clone()),
            message,
            "{name}"
        );
    }
}

#[test]
fn one_port_serves_ptr1_h2c_and_tls_clients_at_the_same_time() {
    let _serial = serial();
    let pki = Pki::new();
    let mut config = tensorwire_compat::Http2Config::tls(pki.server_tls(false), false);
    config.require_tls = false;
    let server = Driver::Uring
        .builder()
        .transport(std::sync::Arc::new(tensorwire_compat::Http2::new(config)))
        .build()
        .unwrap();
    server
        .serve_on_core("echo", |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    let clients = vec![
        (
            "ptr1",
            Driver::Uring
                .builder()
                .in_process_delivery(false)
                .build()
                .unwrap(),
        ),
        ("h2c", Wire::H2c.builder(Driver::Uring).build().unwrap()),
        (
            "tls",
            Wire::Tls(pki.client_tls(None))
                .builder(Driver::Uring)
                .build()
                .unwrap(),
        ),
    ];
    let addr = server.local_addr();
    std::thread::scope(|scope| {
        for (name, client) in &clients {
            scope.spawn(move || {
                for i in 0..50 {
                    let message = patterned(i, 3, 2000);
                    let reply = client.ask(addr, "echo", message.clone(), TIMEOUT).wait();
                    assert_eq!(
                        tensor(reply.unwrap_or_else(|e| panic!("{name}: {e}"))),
                        message,
                        "{name}"
                    );
                }
            });
        }
    });
    assert_eq!(
        server.stats().transport_connections,
        2,
        "one h2c and one TLS connection"
    );
}
