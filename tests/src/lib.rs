//! Helpers for the integration tests in `tests/integration/`: nodes on either PTR1 driver,
//! patterned messages, raw peers, and resource probes.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_engine::{Node, NodeBuilder, Reply, TensorMessage};
use tensorwire_proto::Limits;
use tensorwire_proto::ptr1::{self, Frame};

pub mod across;
pub mod http2;
pub mod pki;
pub mod raw_shm;
pub mod stripes;

/// The network test bed (hosts in network namespaces, faults on the wire).
pub use tensorwire_netbed as netns;

/// Which PTR1 driver runs a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    /// The io_uring thread-per-core driver of the engine.
    Uring,
    /// The tokio driver of `tensorwire-compat`, plugged in as the fallback and forced.
    Tokio,
}

impl Driver {
    /// The name a node running it reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Uring => "io_uring",
            Self::Tokio => "tokio",
        }
    }

    /// A builder for a loopback node on this driver, with two driver threads (shared memory
    /// off: these nodes test PTR1).
    pub fn builder(self) -> NodeBuilder {
        self.builder_on(any_local_address())
    }

    /// [`Driver::builder`] for a node listening on `addr`.
    pub fn builder_on(self, addr: SocketAddr) -> NodeBuilder {
        let builder = Node::builder(addr).cores(2).shared_memory(false);
        match self {
            Self::Uring => {
                require_io_uring();
                builder
            }
            Self::Tokio => builder
                .force_fallback(true)
                .fallback(Arc::new(tensorwire_compat::TokioFallback::default())),
        }
    }
}

/// A client driver and a server driver for one conformance run.
#[derive(Clone, Copy, Debug)]
pub struct Drivers {
    /// What the sending node runs.
    pub client: Driver,
    /// What the serving node runs.
    pub server: Driver,
}

impl Drivers {
    /// A builder for the serving node.
    pub fn server(self) -> NodeBuilder {
        self.server.builder()
    }

    /// A builder for the sending node (it never short-cuts to an in-process node).
    pub fn client(self) -> NodeBuilder {
        self.client.builder().in_process_delivery(false)
    }

    /// A serving node with an `echo` endpoint (handler threads) and an `echo-core` endpoint
    /// (on the driver thread), both returning the request.
    pub fn echo_server(self) -> Node {
        self.echo_server_with(|builder| builder)
    }

    /// [`Drivers::echo_server`] with more settings.
    pub fn echo_server_with(self, configure: impl FnOnce(NodeBuilder) -> NodeBuilder) -> Node {
        let node = configure(self.server())
            .build()
            .expect("the server node starts");
        assert_eq!(node.stats().driver, self.server.name());
        node.serve("echo", 2, |request| Ok(Reply::Tensor(request.message)))
            .expect("echo registers");
        node.serve_on_core("echo-core", |request| Ok(Reply::Tensor(request.message)))
            .expect("echo-core registers");
        node
    }

    /// A sending node.
    pub fn client_node(self) -> Node {
        let node = self.client().build().expect("the client node starts");
        assert_eq!(node.stats().driver, self.client.name());
        node
    }
}

/// A loopback address with a free port.
pub fn any_local_address() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// A node on a loopback address with shared memory on, whose sends prefer it (and never take
/// the in-process path, so two nodes of one test process talk over shared memory).
pub fn shm_builder() -> NodeBuilder {
    Node::builder(any_local_address())
        .in_process_delivery(false)
        .shared_memory(true)
        .preference(tensorwire_engine::Preference::SharedMemory)
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

/// Serializes the tests that count file descriptors or read process-wide counters; every
/// test of the suite takes it so counts are not disturbed by a neighbour.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// File descriptors this process has open.
pub fn open_fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd is readable")
        .count()
}

/// Waits up to 5 s for the process's open fd count to drop to `baseline`; returns the last
/// count.
pub fn settle_fds(baseline: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = open_fd_count();
        if now <= baseline || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// This process's resident memory in bytes.
pub fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("a VmRSS line");
    line.split_whitespace()
        .nth(1)
        .and_then(|kib| kib.parse::<u64>().ok())
        .expect("VmRSS in kB")
        * 1024
}

/// CPU time (user + system) this process used so far.
pub fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let after_name = &stat[stat.rfind(')').expect("a comm field") + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: u64 =
        fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// A plain TCP connection for playing a raw peer; reads give up after 10 s.
pub fn raw_stream(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connects");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
}

/// Reads one PTR1 frame from a plain socket; `None` if the peer closed first.
pub fn read_frame(stream: &mut TcpStream) -> std::io::Result<Option<Frame>> {
    read_frames(stream, 1, 4096, Duration::ZERO).map(|frames| frames.into_iter().next())
}

/// [`read_frame`] by a slow reader: `chunk` bytes a read at most, `pause` after each.
pub fn read_frame_slowly(
    stream: &mut TcpStream,
    chunk: usize,
    pause: Duration,
) -> std::io::Result<Option<Frame>> {
    read_frames(stream, 1, chunk, pause).map(|frames| frames.into_iter().next())
}

/// A plain socket connected to `addr` whose receive buffer was limited to `bytes` before it
/// connected (so the peer's sends wait for what this side reads).
pub fn raw_stream_small_window(addr: SocketAddr, bytes: usize) -> TcpStream {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )
    .expect("a socket");
    socket.set_recv_buffer_size(bytes).expect("SO_RCVBUF");
    socket.connect(&addr.into()).expect("connects");
    let stream = TcpStream::from(socket);
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
}

/// Reads PTR1 frames from a plain socket until the peer closes: every whole frame, in order
/// (several may come in one read).
pub fn read_frames_to_end(stream: &mut TcpStream) -> std::io::Result<Vec<Frame>> {
    read_frames(stream, usize::MAX, 64 << 10, Duration::ZERO)
}

/// Frames read, `chunk` bytes a read at most with `pause` after each, until `want` of them are
/// whole or the peer closes (bytes read past the last one wanted are dropped).
fn read_frames(
    stream: &mut TcpStream,
    want: usize,
    chunk: usize,
    pause: Duration,
) -> std::io::Result<Vec<Frame>> {
    let mut decoder = ptr1::Decoder::new(Limits::default());
    let mut buf = vec![0u8; chunk];
    let mut frames = Vec::new();
    while frames.len() < want {
        let n = match stream.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => 0,
            Err(e) => return Err(e),
        };
        if n == 0 {
            break;
        }
        std::thread::sleep(pause);
        let mut rest = &buf[..n];
        while !rest.is_empty() && frames.len() < want {
            let (used, frame) = decoder
                .decode(rest)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            frames.extend(frame);
            rest = &rest[used..];
        }
    }
    Ok(frames)
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

/// An Ask frame with no metadata and no buffers.
pub fn raw_ask(path: &[u8], version: u32) -> Vec<u8> {
    let mut frame = raw_header(1, version, u32::try_from(path.len()).unwrap(), 0, 0);
    frame.extend_from_slice(path);
    frame
}

/// The whole encoded frame of an ask.
pub fn encoded_ask(path: &str, message: TensorMessage) -> Vec<u8> {
    let frame = Frame::Ask {
        path: path.into(),
        message,
    };
    ptr1::encode(&frame, &Limits::default())
        .expect("encodes")
        .to_vec()
}
