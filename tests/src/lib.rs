//! Helpers for the integration tests in `tests/integration/`.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use tensorwire_engine::{Node, Reply, TensorMessage};

/// A loopback address with a free port.
pub fn any_local_address() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Fails loudly (instead of skipping) when io_uring is missing: these tests exist to run on it.
pub fn require_io_uring() {
    if let Err(reason) = tensorwire_engine::io_uring_available() {
        panic!(
            "io_uring is not available on this machine ({reason}); the engine tests need it. \
             Run on a kernel with io_uring enabled (CI does)."
        );
    }
}

/// A node on loopback with two cores and an `echo` endpoint that returns the request.
pub fn echo_node() -> Node {
    require_io_uring();
    let node = Node::builder(any_local_address())
        .cores(2)
        .build()
        .expect("node starts");
    node.serve("echo", 2, |request| Ok(Reply::Tensor(request.message)))
        .expect("echo registers");
    node
}

/// A second node to send from (so the send crosses a real socket, not the local mailbox).
pub fn client_node() -> Node {
    require_io_uring();
    Node::builder(any_local_address())
        .cores(2)
        .build()
        .expect("client node starts")
}

/// A message with `count` buffers of `len` bytes each, filled with a pattern that depends on
/// the buffer index and byte offset.
pub fn patterned(version: u32, count: usize, len: usize) -> TensorMessage {
    let buffers = (0..count)
        .map(|i| Bytes::from((0..len).map(|j| pattern(i, j)).collect::<Vec<u8>>()))
        .collect();
    TensorMessage::new(version, Bytes::from(format!("meta-{count}-{len}")), buffers)
}

/// The byte at offset `j` of buffer `i` in [`patterned`] messages.
pub fn pattern(i: usize, j: usize) -> u8 {
    (i.wrapping_mul(31) ^ j.wrapping_mul(7) ^ (j >> 8)) as u8
}

/// A generous per-request timeout for tests on a noisy machine.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// The reply as a tensor message, or a panic naming what came instead.
pub fn tensor(reply: Reply) -> TensorMessage {
    match reply {
        Reply::Tensor(message) => message,
        other => panic!("expected a tensor reply, got {other:?}"),
    }
}

/// FNV-1a over every buffer, for checksumming big messages.
pub fn checksum(message: &TensorMessage) -> u64 {
    message
        .buffers
        .iter()
        .flat_map(|b| b.iter())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}
