//! Slow and silent clients are closed at their deadlines, without the server spinning while
//! it waits (its CPU time is checked), on the node's port and on a standalone listener.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorwire_compat::{Http2, Http2Config, Http2Transport};
use tensorwire_engine::Node;
use tensorwire_proto::session::SessionConfig;
use tensorwire_proto::transport::{
    Delivery, HeapMemory, Inbound, InboundRequest, Reply, RequestKind, Responder, TransportSetup,
};
use tensorwire_tests::http2::{Pki, Wire};
use tensorwire_tests::*;

const DEADLINE: Duration = Duration::from_millis(600);

fn short(mut config: Http2Config) -> Http2Config {
    config.first_request_timeout = DEADLINE;
    config.handshake_timeout = DEADLINE;
    config.preface_timeout = DEADLINE;
    config
}

fn node(config: Http2Config) -> Node {
    Driver::Uring
        .builder()
        .transport(Arc::new(Http2::new(short(config))))
        .build()
        .unwrap()
}

/// Sends `bytes`, then waits until the server closes; how long that took and the CPU this
/// process spent meanwhile (the server runs in it).
fn closed_after(addr: std::net::SocketAddr, bytes: &[u8]) -> (Duration, Duration) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(bytes).unwrap();
    let (started, cpu) = (Instant::now(), cpu_time());
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {} // the server's SETTINGS or GOAWAY
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("expected the server to close, got {e}"),
        }
    }
    (started.elapsed(), cpu_time() - cpu)
}

fn assert_closed_at_the_deadline(what: &str, (elapsed, cpu): (Duration, Duration)) {
    assert!(
        elapsed >= DEADLINE - Duration::from_millis(50),
        "{what}: closed after {elapsed:?}, before the deadline"
    );
    assert!(
        elapsed < DEADLINE * 4,
        "{what}: closed only after {elapsed:?}"
    );
    assert!(
        cpu < Duration::from_millis(200),
        "{what}: {cpu:?} of CPU while waiting"
    );
}

#[test]
fn an_h2_preface_without_a_request_is_closed_at_the_first_request_deadline() {
    let _serial = serial();
    let node = node(Http2Config::h2c());
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    assert_closed_at_the_deadline("h2 preface", closed_after(node.local_addr(), preface));
}

#[test]
fn a_partial_client_hello_is_closed_at_the_handshake_deadline() {
    let _serial = serial();
    let pki = Pki::new();
    let node = node(Http2Config::tls(pki.server_tls(false), true));
    assert_closed_at_the_deadline(
        "partial ClientHello",
        closed_after(node.local_addr(), &[0x16, 0x03, 0x01, 0x02, 0x00]),
    );
}

/// An inbound that echoes asks, for a transport used without a node.
struct Echo;

impl Inbound for Echo {
    fn admit(&self, _kind: RequestKind, _path: &str) -> Result<(), String> {
        Ok(())
    }

    fn deliver(&self, request: InboundRequest, responder: Box<dyn Responder>) -> Delivery {
        responder.respond(Ok(Reply::Tensor(request.message)));
        Delivery::Enqueued
    }
}

fn standalone() -> (Arc<Http2Transport>, std::net::SocketAddr) {
    let setup = TransportSetup::new(
        Arc::new(Echo),
        Arc::new(HeapMemory::new(1 << 30)),
        Arc::new(SessionConfig::default()),
    );
    let transport = Http2Transport::start(short(Http2Config::h2c()), setup).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = transport.listen(listener).unwrap();
    (transport, addr)
}

#[test]
fn a_standalone_listener_serves_asks_and_closes_silent_connections_at_the_preface_deadline() {
    let _serial = serial();
    let (_transport, addr) = standalone();
    let client = Wire::H2c.builder(Driver::Uring).build().unwrap();
    let message = patterned(4, 3, 1000);
    assert_eq!(
        tensor(
            client
                .ask(addr, "anything", message.clone(), TIMEOUT)
                .wait()
                .unwrap()
        ),
        message
    );
    assert_closed_at_the_deadline("silent connection", closed_after(addr, b""));
    assert_closed_at_the_deadline("two bytes", closed_after(addr, b"PR"));
}
