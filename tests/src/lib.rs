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
        .in_process_delivery(false)
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
    (i.wrapping_mul(31) ^ j.wrapping_mul(7) ^ (j >> 8)).to_le_bytes()[0]
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

/// Serializes the tests that count file descriptors or set process-wide state; every engine
/// test takes it so fd counts are not disturbed by a neighbour.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Waits up to 5 s for the process's open fd count to drop to `baseline`; returns the last count.
pub fn settle_fds(baseline: usize) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let now = tensorwire_engine::open_fd_count().expect("/proc/self/fd is readable");
        if now <= baseline || std::time::Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads one PTR1 frame from a plain socket (for tests that play a raw peer).
pub fn read_frame(
    stream: &mut std::net::TcpStream,
) -> std::io::Result<Option<tensorwire_proto::ptr1::Frame>> {
    use std::io::Read;
    let mut decoder = tensorwire_proto::ptr1::Decoder::new(tensorwire_proto::Limits::default());
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(None);
        }
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            let (used, frame) = decoder
                .decode(rest)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            if frame.is_some() {
                return Ok(frame);
            }
            rest = &rest[used..];
        }
    }
}

/// A PTR1 fixed header with the given fields (for hand-made frames).
pub fn raw_header(kind: u8, version: u32, path_len: u32, metadata_len: u64, count: u32) -> Vec<u8> {
    let mut h = b"PTR1".to_vec();
    h.extend_from_slice(&[kind, 0, 0, 0]);
    h.extend_from_slice(&version.to_le_bytes());
    h.extend_from_slice(&path_len.to_le_bytes());
    h.extend_from_slice(&metadata_len.to_le_bytes());
    h.extend_from_slice(&count.to_le_bytes());
    h
}
