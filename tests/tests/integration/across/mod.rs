//! Across hosts: nodes in separate network namespaces joined by a bridge (`netns::Testbed`),
//! with faults on the wire — rate limits, random loss, black holes, resets, link flaps, MTU
//! changes, a peer that goes away — each case on both PTR1 drivers and, where it applies,
//! over h2c and TLS. Every address is inside the test bed; nothing leaves it.

mod faults;
mod flap;
mod link;
mod loss;
mod route;
mod stripes;

use std::time::{Duration, Instant};

use tensorwire_engine::{Node, Reply};
use tensorwire_tests::http2::{Pki, Wire};
use tensorwire_tests::{checksum, patterned};

/// Instantiates each case (a `fn(Driver)`) for the io_uring driver and the tokio fallback.
macro_rules! across {
    ($($case:ident),* $(,)?) => {
        across!(@mod uring, Uring, [$($case),*]);
        across!(@mod tokio, Tokio, [$($case),*]);
    };
    (@mod $name:ident, $driver:ident, [$($case:ident),*]) => {
        mod $name {
            use tensorwire_tests::{Driver, serial};
            $(
                #[test]
                fn $case() {
                    let _serial = serial();
                    super::$case(Driver::$driver);
                }
            )*
        }
    };
}

pub(crate) use across;

/// Instantiates `case` (called with the io_uring driver and the server's and client's HTTP/2
/// wires) as a test over h2c named `$h2c` and one over mutual TLS named `$tls`.
macro_rules! over_http2 {
    ($case:expr => $h2c:ident, $tls:ident) => {
        #[test]
        fn $h2c() {
            let _serial = tensorwire_tests::serial();
            let wire = tensorwire_tests::http2::Wire::H2c;
            ($case)(tensorwire_tests::Driver::Uring, Some((&wire, &wire)));
        }

        #[test]
        fn $tls() {
            let _serial = tensorwire_tests::serial();
            let (server, client) = super::mutual_tls();
            ($case)(tensorwire_tests::Driver::Uring, Some((&server, &client)));
        }
    };
}

pub(crate) use over_http2;

/// TLS for a server on host 0 that requires client certificates, and for a client with one.
pub(crate) fn mutual_tls() -> (Wire, Wire) {
    let pki = Pki::new();
    let server = pki.ca.server_for(&["10.201.0.1"]);
    let server_tls = tensorwire_compat::TlsConfig::builder()
        .identity_pem(server.cert, server.key)
        .trust_pem(pki.ca.cert.clone())
        .require_client_cert(true)
        .build()
        .expect("server TLS");
    (
        Wire::Tls(server_tls),
        Wire::Tls(pki.client_tls(Some(&pki.client))),
    )
}

/// A deadline for asks that must succeed.
pub(crate) const LONG: Duration = Duration::from_secs(60);

/// A message of `count` buffers and `len` bytes each, whose `version` is its id.
pub(crate) fn message(id: u32, count: usize, len: usize) -> tensorwire_engine::TensorMessage {
    patterned(id, count, len)
}

/// Asks `digest` at `peer` and checks the answer names `id` and the message's checksum.
pub(crate) fn ask_digest(
    client: &Node,
    peer: std::net::SocketAddr,
    id: u32,
    count: usize,
    len: usize,
    timeout: Duration,
) -> Result<(), tensorwire_engine::Error> {
    ask_digest_of(client, peer, message(id, count, len), timeout)
}

/// [`ask_digest`] of a message made beforehand (its `version` is its id).
pub(crate) fn ask_digest_of(
    client: &Node,
    peer: std::net::SocketAddr,
    request: tensorwire_engine::TensorMessage,
    timeout: Duration,
) -> Result<(), tensorwire_engine::Error> {
    let (id, want) = (request.version, checksum(&request));
    let reply = client.ask(peer, "digest", request, timeout).wait()?;
    check_digest(&reply, id, want);
    Ok(())
}

/// Panics unless `reply` is `digest`'s answer for `id` with checksum `want`.
pub(crate) fn check_digest(reply: &Reply, id: u32, want: u64) {
    let Reply::Single { msg_type, data } = reply else {
        panic!("digest answers with a single message, got {reply:?}");
    };
    assert_eq!(msg_type, "digest");
    assert_eq!(data.len(), 12, "id and checksum");
    let got_id = u32::from_le_bytes(data[..4].try_into().expect("4 bytes"));
    let got_sum = u64::from_le_bytes(data[4..].try_into().expect("8 bytes"));
    assert_eq!(
        (got_id, got_sum),
        (id, want),
        "the reply belongs to its request"
    );
}

/// Waits up to `limit` for `done` to hold; whether it did.
pub(crate) fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Latency percentiles of `samples`, as text (`p50 … p99 … max`).
pub(crate) fn percentiles(samples: &mut [Duration]) -> String {
    samples.sort_unstable();
    let at = |percent: usize| samples[(samples.len() - 1) * percent / 100];
    format!("p50 {:?}, p99 {:?}, max {:?}", at(50), at(99), at(100))
}
