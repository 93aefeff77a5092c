//! More of what local processes of the same user can do to a node over shared memory
//! (`shm::hostile` has the rest): rewrite their own segment under a receiver's views (the
//! documented limit, and the private copy that escapes it), fill the node's descriptor table
//! while others are connected, and map as many segments as the node's bound allows together.

use std::io::Write;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_engine::shm::PeerBounds;
use tensorwire_engine::{Node, Reply, RequestKind, Route, Via};
use tensorwire_proto::Limits;
use tensorwire_proto::ptr1::Frame;
use tensorwire_proto::shm::{Body, Control, Part, Shared, WireReply};
use tensorwire_tests::raw_shm::{
    F_SEAL_FUTURE_WRITE, Mapping, RawConn, connect_socket, socket_name,
};
use tensorwire_tests::*;

use super::hostile_harness::{HostilePeer, kib, node};

#[test]
fn a_sender_that_rewrites_its_own_segment_changes_the_view_but_never_the_private_copy() {
    let _serial = serial();
    let server = node();
    let kept = Arc::new(Mutex::new(Vec::new()));
    let keeping = Arc::clone(&kept);
    server
        .serve("keep", 1, move |request| {
            let copy = request.message.private_copy();
            keeping.lock().unwrap().push((request.message, copy));
            Ok(Reply::Single {
                msg_type: "kept".into(),
                data: Bytes::new(),
            })
        })
        .unwrap();
    let mut raw = RawConn::open(server.local_addr()).unwrap();
    let (offset, len) = (64 << 10, 256 << 10);
    let segment = OwnSegment::new(1 << 20);
    let sent: Vec<u8> = (0..len).map(|j| pattern(0, j)).collect();
    segment.write(offset, &sent);
    raw.announce(1, 1 << 20, segment.fd.as_raw_fd()).unwrap();
    let ask = Control::Request {
        id: 1,
        kind: RequestKind::Ask,
        path: "/actors/keep".into(),
        body: Body::Parts {
            version: 1,
            metadata: Part::Inline(Bytes::from_static(b"meta")),
            buffers: vec![Part::Shared(Shared {
                segment: 1,
                offset: offset as u64,
                len: len as u64,
                lease: 1,
            })],
        },
    };
    assert!(raw.push(&ask));
    raw.publish();
    // (A node that copied the part would release its lease before it answers.)
    let answer = std::iter::from_fn(|| raw.pop_within(Duration::from_secs(5)))
        .find(|c| !matches!(c, Control::Release { .. }));
    match answer {
        Some(Control::Reply {
            id: 1,
            reply: WireReply::Single { msg_type, .. },
        }) => assert_eq!(msg_type, "kept"),
        other => panic!("the handler's answer: {other:?}"),
    }
    let (view, copy) = kept.lock().unwrap().pop().expect("the handler kept it");
    assert_eq!(
        &view.buffers[0][..],
        &sent[..],
        "the view shows what was sent"
    );
    assert_eq!(copy, view, "the private copy is equal");

    // The sender writes its own pages through the mapping it made before sealing.
    segment.write(offset, &vec![0xEE; len]);
    assert!(
        copy.buffers[0][..] == sent[..],
        "the private copy keeps the bytes that were sent"
    );
    assert!(
        view.buffers[0].iter().all(|&b| b == 0xEE),
        "docs/python.md: a same-user sender can change the bytes of its own segments while \
         the receiver holds views of them (the view shows its rewrite)"
    );
}

#[test]
fn a_full_descriptor_table_still_answers_connected_clients_and_serves_new_ones_after() {
    let _serial = serial();
    let peer = HostilePeer::start("few-fds", None);
    let addr = peer.addr.expect("the peer serves");
    // Connected before: a raw PTR1 client over TCP and a raw client over shared memory.
    let mut tcp = raw_stream(addr);
    let mut shm = RawConn::open(addr).unwrap();
    let mut shm_id = 0;
    assert!(tcp_ask(&mut tcp), "the TCP client is answered before");
    assert!(
        shm_ask(&mut shm, &mut shm_id),
        "the shm client is answered before"
    );

    let name = socket_name(addr).unwrap();

    // Hostile TCP connections take the descriptors left (each one asks, so the ones the node
    // accepted are told from the ones waiting in the backlog), then connections to the
    // shared-memory socket wait for the listener (its accepts fail).
    // 112: more than the 64 descriptors left, fewer than those plus the listener's backlog
    // (128), so every connect completes (those not accepted wait in the backlog) and none
    // blocks retrying a dropped SYN.
    let mut hostile: Vec<TcpStream> = (0..112).map(|_| connect_within(addr)).collect();
    let ask = encoded_ask("/actors/echo", kib(0));
    for stream in &mut hostile {
        stream.write_all(&ask).unwrap();
    }
    thread::sleep(Duration::from_secs(1));
    let answered = hostile.iter().filter(|s| has_bytes(s)).count();
    assert!(
        answered >= 1,
        "none of {} hostile connections was answered: the node did not accept",
        hostile.len()
    );
    assert!(
        answered <= 64,
        "{answered} of {} hostile connections were answered, more than the 64 descriptors \
         left: the limit did not hold",
        hostile.len()
    );
    // Pressure on the shared-memory listener too: its accepts fail while the table is full
    // (whether they wait is not asserted: a Unix socket's connect completes in its backlog).
    let waiting: Vec<_> = (0..8).filter_map(|_| connect_socket(&name).ok()).collect();
    let mut newcomer = connect_within(addr);
    newcomer
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    newcomer.write_all(&ask).unwrap();
    assert!(
        read_frame(&mut newcomer).is_err(),
        "a new connection is answered while the table is full: it was not full"
    );
    let cpu = peer.cpu_seconds_over(Duration::from_secs(1));
    assert!(
        cpu < 0.3,
        "the node burned {cpu:.2} s of CPU in one second with its descriptor table full"
    );

    for round in 0..20 {
        assert!(
            tcp_ask(&mut tcp),
            "round {round}: the TCP client connected before"
        );
        assert!(
            shm_ask(&mut shm, &mut shm_id),
            "round {round}: the shm client connected before"
        );
    }

    drop((hostile, waiting));
    let gone = Instant::now();
    let over_tcp = Node::builder(any_local_address())
        .in_process_delivery(false)
        .shared_memory(false)
        .build()
        .unwrap();
    let to = over_tcp
        .destination(addr, "echo", Via::Only(Route::RawTcp))
        .unwrap();
    let tcp_served = served_after(gone, || {
        over_tcp.ask_blocking_to(&to, kib(4), Duration::from_secs(1), None)
    });
    // A node of its own per try: one whose hello failed keeps to TCP for 5 s.
    let shm_served = served_after(gone, || {
        let fresh = node();
        let to = fresh.destination(addr, "echo", Via::Only(Route::SharedMemory))?;
        fresh.ask_blocking_to(&to, kib(64), Duration::from_secs(2), None)
    });
    for (path, served, route, size) in [
        ("TCP", tcp_served, Route::RawTcp, 4 << 10),
        ("shared memory", shm_served, Route::SharedMemory, 64 << 10),
    ] {
        let (at, reply, came) = served
            .unwrap_or_else(|e| panic!("no new client over {path} served {GIVE_UP:?} after: {e}"));
        assert_eq!(came, route);
        assert_eq!(tensor(reply).buffers[0].len(), size);
        assert!(
            at < Duration::from_secs(5),
            "a new client over {path} was served {at:?} after the hostile connections went away"
        );
    }
    assert!(tcp_ask(&mut tcp), "the TCP client connected before, after");
    assert!(
        shm_ask(&mut shm, &mut shm_id),
        "the shm client connected before, after"
    );
}

#[test]
fn processes_together_cannot_map_more_than_the_nodes_bound_and_a_new_peer_maps_once_one_leaves() {
    let _serial = serial();
    let server = node();
    let max_map_count: u64 = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let fitted = PeerBounds::fitted(u64::MAX, max_map_count);
    let (bound, each) = (fitted.segments, fitted.segments_per_process);
    assert_eq!(
        each,
        PeerBounds::default().segments_per_process,
        "the peers announce the default per-process bound: it must be the node's"
    );
    let processes = bound / each + 2;
    let before = mappings();
    // Each process within its own bound, all of them together past the node's.
    let peers: Vec<HostilePeer> = thread::scope(|s| {
        let started: Vec<_> = (0..processes)
            .map(|_| s.spawn(|| HostilePeer::start("maps", Some(server.local_addr()))))
            .collect();
        started.into_iter().map(|p| p.join().unwrap()).collect()
    });
    let grown = mappings().saturating_sub(before);
    let reports: Vec<(usize, bool)> = peers
        .iter()
        .map(|peer| {
            let (announced, closed) = peer.report.split_once(" closed ").unwrap();
            (announced.parse().unwrap(), closed.parse().unwrap())
        })
        .collect();
    let kept: usize = reports.iter().filter(|r| !r.1).map(|r| r.0).sum();
    assert!(
        reports.iter().any(|r| r.1) && kept <= bound,
        "{processes} processes of {each} segments each against a bound of {bound}: {reports:?}"
    );
    assert!(
        grown <= bound + 64,
        "{grown} new mappings of peers' segments, over the node's bound of {bound}"
    );
    // One process that kept its segments leaves: the node gives them back, and a new peer's
    // 16 MiB segment maps (the bound may be full to the last segment, on hosts where it is a
    // multiple of what each process announced).
    let mut peers = peers;
    let leaving = reports
        .iter()
        .position(|r| !r.1)
        .expect("a connection stayed open");
    let (left_behind, held) = (mappings(), reports[leaving].0);
    drop(peers.swap_remove(leaving));
    let gone = Instant::now();
    // Its segments are unmapped, whatever room the bound had left.
    loop {
        let still = (mappings() + held).saturating_sub(left_behind);
        if still == 0 {
            break;
        }
        assert!(
            gone.elapsed() < GIVE_UP,
            "{still} of the {held} segments of a process that left are still mapped after \
             {GIVE_UP:?}"
        );
        thread::sleep(Duration::from_millis(50));
    }
    let served = served_after(gone, || {
        let asker = node();
        let to = asker.destination(server.local_addr(), "echo", Via::Only(Route::SharedMemory))?;
        asker.ask_blocking_to(&to, kib(16 << 10), Duration::from_secs(10), None)
    });
    let (_, reply, route) = served.unwrap_or_else(|e| {
        panic!("no new peer mapped its segment {GIVE_UP:?} after one left: {e}")
    });
    assert_eq!(route, Route::SharedMemory);
    assert_eq!(tensor(reply).buffers[0].len(), 16 << 20);
    drop(peers);
}

/// The node's mappings of peers' segments (the raw peers name their memfds `raw-peer`).
fn mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|line| line.contains("memfd:raw-peer"))
        .count()
}

/// A plain PTR1 connection, its connect bounded (a dropped SYN would retry for minutes).
fn connect_within(addr: std::net::SocketAddr) -> TcpStream {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connects");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
}

/// A memfd segment as a sender makes one: allocated, mapped writable by its owner, then
/// sealed as a peer's segment must be (`SHRINK | GROW | FUTURE_WRITE`).
struct OwnSegment {
    fd: OwnedFd,
    mapping: Mapping,
}

impl OwnSegment {
    fn new(len: usize) -> Self {
        // SAFETY: a valid NUL-terminated name.
        let fd = unsafe {
            libc::memfd_create(c"own".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: memfd_create just returned it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let size = libc::off_t::try_from(len).unwrap();
        // SAFETY: no pointers.
        assert_eq!(unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, size) }, 0);
        let mapping = Mapping::map(fd.as_raw_fd(), len, true).expect("the owner maps it");
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | F_SEAL_FUTURE_WRITE;
        // SAFETY: integer arguments.
        let sealed = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) };
        assert_eq!(sealed, 0);
        assert!(
            Mapping::map(fd.as_raw_fd(), len, true).is_err(),
            "sealed: no new writable mapping"
        );
        Self { fd, mapping }
    }

    /// Through the mapping made before the seal. The node's views of these pages in this
    /// process are `Bytes` in the handler's list; the test reads them only after.
    fn write(&self, at: usize, bytes: &[u8]) {
        self.mapping.write(at, bytes);
    }
}

/// A 1 KiB ask to the echo on a raw PTR1 connection: whether it was echoed within 2 s.
fn tcp_ask(stream: &mut TcpStream) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    stream
        .write_all(&encoded_ask("/actors/echo", kib(1)))
        .unwrap();
    matches!(
        read_frame(stream),
        Ok(Some(Frame::TensorResponse(reply))) if reply.buffers[0].len() == 1 << 10
    )
}

/// A 1 KiB ask to the echo on a raw shared-memory connection, its body in the record:
/// whether it was echoed within 2 s.
fn shm_ask(raw: &mut RawConn, id: &mut u64) -> bool {
    *id += 1;
    let encoded = tensorwire_proto::ptm1::encode(&kib(1), &Limits::default()).unwrap();
    let body: Vec<u8> = encoded.slices().flat_map(|s| s.iter().copied()).collect();
    let ask = Control::Request {
        id: *id,
        kind: RequestKind::Ask,
        path: "/actors/echo".into(),
        body: Body::Inline(Bytes::from(body)),
    };
    if !raw.push(&ask) {
        return false;
    }
    raw.publish();
    match raw.pop_within(Duration::from_secs(2)) {
        Some(Control::Reply {
            id: replied,
            reply: WireReply::Tensor(Body::Inline(bytes)),
        }) => {
            replied == *id
                && tensorwire_proto::ptm1::decode(bytes, &Limits::default())
                    .is_ok_and(|m| m.buffers[0].len() == 1 << 10)
        }
        _ => false,
    }
}

/// Whether a reply waits to be read on `stream`.
fn has_bytes(stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let waiting = matches!(stream.peek(&mut [0u8; 1]), Ok(n) if n > 0);
    stream.set_nonblocking(false).unwrap();
    waiting
}

/// How long [`served_after`] tries.
const GIVE_UP: Duration = Duration::from_secs(10);

/// Tries `ask` until it succeeds or [`GIVE_UP`] passed since `since`: when it succeeded
/// (since `since`), with its reply and route; else the last error.
fn served_after(
    since: Instant,
    mut ask: impl FnMut() -> Result<(Reply, Route), tensorwire_engine::Error>,
) -> Result<(Duration, Reply, Route), tensorwire_engine::Error> {
    loop {
        match ask() {
            Ok((reply, route)) => return Ok((since.elapsed(), reply, route)),
            Err(e) if since.elapsed() >= GIVE_UP => return Err(e),
            Err(_) => thread::sleep(Duration::from_millis(50)),
        }
    }
}
