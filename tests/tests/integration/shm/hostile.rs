//! What a local process of the same user can do to a node over shared memory, tried with an
//! independent peer written from `docs/protocol.md` (`tensorwire_tests::raw_shm`), in this
//! process or in a child (this test binary run again as a hostile peer process:
//! `shm::hostile_harness`).
//! Most cases are attacks that used to work: forged replies, memory committed by declaration,
//! descriptors and mappings used up, replies never read, lent memory reopened writable, the
//! hello slots taken, the node's memory held without release, and a ring made to wait.

use std::os::fd::AsRawFd;
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_engine::shm::PeerBounds;
use tensorwire_engine::{Node, Reply, RequestKind, TensorMessage};
use tensorwire_proto::Limits;
use tensorwire_proto::shm::{Body, Control, Part, Shared, WireReply};
use tensorwire_tests::raw_shm::{RawConn, connect_socket, sealed_memfd, send_bell, socket_name};
use tensorwire_tests::*;

use super::hostile_harness::{HostilePeer, kib, node, node_with};

/// The value of a `/proc/self/status` field, in bytes.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"));
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb << 10
}

/// A message as a body carried inside a record.
fn inline_body(message: &TensorMessage) -> Body {
    let encoded = tensorwire_proto::ptm1::encode(message, &Limits::default()).unwrap();
    let mut bytes = Vec::new();
    for slice in encoded.slices() {
        bytes.extend_from_slice(slice);
    }
    Body::Inline(Bytes::from(bytes))
}

/// A connection's first ask (id 1) to `path`, its body carried inside the record.
fn first_ask(path: &str, message: &TensorMessage) -> Control {
    Control::Request {
        id: 1,
        kind: RequestKind::Ask,
        path: path.into(),
        body: inline_body(message),
    }
}

fn mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count()
}

#[test]
fn a_reply_forged_on_another_connection_never_answers_an_ask() {
    let _serial = serial();
    let asker = node();
    let server = node();
    server
        .serve("slow", 1, |_| {
            thread::sleep(Duration::from_millis(300));
            Ok(Reply::Single {
                msg_type: "real".into(),
                data: Bytes::new(),
            })
        })
        .unwrap();
    let mut forger = RawConn::open(asker.local_addr()).expect("the forger connects");
    let to = server.local_addr();
    let ask = thread::spawn(move || {
        asker.ask_blocking(to, "/actors/slow", kib(1), Duration::from_secs(5))
    });
    thread::sleep(Duration::from_millis(100));
    for id in 1..=4096u64 {
        let forged = Control::Reply {
            id,
            reply: WireReply::Single {
                msg_type: "forged".into(),
                data: Bytes::new(),
            },
        };
        if !forger.push(&forged) {
            break;
        }
    }
    forger.publish();
    match ask.join().unwrap().expect("the ask is answered") {
        Reply::Single { msg_type, .. } => assert_eq!(msg_type, "real"),
        other => panic!("unexpected reply {other:?}"),
    }
    assert!(
        forger.closed_by_node(Duration::from_secs(2)),
        "a peer that sends replies to a node it never asked is disconnected"
    );
}

#[test]
fn a_segment_announced_larger_than_it_is_allocated_is_refused_without_committing_memory() {
    let _serial = serial();
    let server = node();
    let mut raw = RawConn::open(server.local_addr()).unwrap();
    let declared = 512u64 << 20;
    let sparse = sealed_memfd(declared, false, true).unwrap();
    let before = status_bytes("RssShmem:");
    raw.announce(1, declared, sparse.as_raw_fd()).unwrap();
    let request = Control::Request {
        id: 1,
        kind: RequestKind::Tell,
        path: "/actors/sink".into(),
        body: Body::Parts {
            version: 1,
            metadata: Part::Inline(Bytes::new()),
            buffers: vec![Part::Shared(Shared {
                segment: 1,
                offset: 0,
                len: 256 << 20,
                lease: 1,
            })],
        },
    };
    assert!(raw.push(&request));
    raw.publish();
    assert!(
        raw.closed_by_node(Duration::from_secs(3)),
        "a sparse segment closes the connection"
    );
    let grown = status_bytes("RssShmem:").saturating_sub(before);
    assert!(
        grown < 32 << 20,
        "{grown} bytes of shared memory were committed for a segment nobody paid for"
    );
}

#[test]
fn one_process_cannot_take_every_connection_and_others_are_still_served() {
    let _serial = serial();
    let bounds = PeerBounds {
        connections_per_process: 8,
        ..PeerBounds::default()
    };
    let server = node_with(|b| b.shm_bounds(bounds));
    let fds = open_fd_count();
    let mut open = Vec::new();
    let mut refused = 0;
    for _ in 0..40 {
        match RawConn::open(server.local_addr()) {
            Ok(conn) => open.push(conn),
            Err(_) => refused += 1,
        }
    }
    assert_eq!(open.len(), 8, "the bound per process holds");
    assert_eq!(refused, 32);
    let grown = open_fd_count().saturating_sub(fds);
    assert!(
        grown < 8 * 8 + 16,
        "{grown} descriptors for 8 connections and 32 refused ones"
    );
    // Another node (over TCP: shared memory from this process is at its bound) is served.
    let other = Node::builder(any_local_address())
        .in_process_delivery(false)
        .shared_memory(false)
        .build()
        .unwrap();
    let reply = other
        .ask_blocking(
            server.local_addr(),
            "/actors/echo",
            kib(4),
            Duration::from_secs(5),
        )
        .unwrap();
    assert_eq!(tensor(reply).buffers[0].len(), 4 << 10);
}

#[test]
fn a_full_descriptor_table_pauses_accepting_instead_of_spinning() {
    let _serial = serial();
    let mut peer = HostilePeer::start("limit-fds", None);
    let addr = peer.addr.expect("the peer serves");
    // Learn the socket (a knock needs a descriptor there), then use up the peer's table.
    let name = socket_name(addr).unwrap();
    peer.command("limit");
    let waiting: Vec<_> = (0..64).filter_map(|_| connect_socket(&name).ok()).collect();
    assert!(
        !waiting.is_empty(),
        "connections wait in the listener's backlog"
    );
    let cpu = peer.cpu_seconds_over(Duration::from_secs(1));
    assert!(
        cpu < 0.3,
        "the node burned {cpu:.2} s of CPU in one second at its descriptor limit"
    );
}

#[test]
fn replies_nobody_reads_hold_bounded_memory_and_the_reader_is_disconnected() {
    unread_replies_stay_bounded(30);
}

/// Replies above 32 KiB always went in slots, whose memory the bytes queued for a peer do not
/// count: asks of 40 KiB whose replies nobody read grew the node by 1 GB in 2 s.
#[test]
fn replies_in_slots_nobody_reads_hold_bounded_memory_and_the_reader_is_disconnected() {
    unread_replies_stay_bounded(40);
}

/// Two raw clients send asks of `size` KiB to the echo as fast as their queues take them and
/// read none of the replies: the node grows by less than 96 MiB and disconnects both.
fn unread_replies_stay_bounded(size: usize) {
    let _serial = serial();
    let server = node();
    let mut readers: Vec<RawConn> = (0..2)
        .map(|_| RawConn::open(server.local_addr()).unwrap())
        .collect();
    let inline = inline_body(&kib(size));
    let before = resident_bytes();
    let started = Instant::now();
    let mut sent = [0u64; 2];
    let mut peak = 0;
    while started.elapsed() < Duration::from_secs(4) && sent.iter().sum::<u64>() < 16_000 {
        for (i, raw) in readers.iter_mut().enumerate() {
            for _ in 0..64 {
                let ask = Control::Request {
                    id: sent[i] + 1,
                    kind: RequestKind::Ask,
                    path: "/actors/echo".into(),
                    body: inline.clone(),
                };
                if !raw.push(&ask) {
                    break;
                }
                sent[i] += 1;
            }
            raw.publish();
        }
        peak = peak.max(resident_bytes());
        thread::sleep(Duration::from_millis(5));
    }
    let grown = peak.saturating_sub(before);
    assert!(
        grown < 96 << 20,
        "the node grew by {grown} bytes for replies nobody reads ({sent:?} asks)"
    );
    for raw in &readers {
        assert!(
            raw.closed_by_node(Duration::from_secs(10)),
            "a peer that reads none of its replies is disconnected"
        );
    }
}

#[test]
fn one_process_cannot_use_up_the_nodes_mappings() {
    let _serial = serial();
    let server = node();
    let before = mappings();
    let first = RawConn::open(server.local_addr()).unwrap();
    let second = RawConn::open(server.local_addr()).unwrap();
    let announce = |raw: &RawConn, base: u64, n: u64| -> u64 {
        let mut announced = 0;
        for i in 0..n {
            let fd = sealed_memfd(4096, true, true).unwrap();
            if raw.announce(base + i, 4096, fd.as_raw_fd()).is_err() {
                break;
            }
            announced += 1;
        }
        announced
    };
    announce(&first, 1, 600);
    announce(&second, 10_000, 600);
    // Let the node map what it accepts (a record makes it drain the socket).
    for raw in [&first, &second] {
        let _ = raw.closed_by_node(Duration::from_millis(300));
    }
    thread::sleep(Duration::from_millis(500));
    let grown = mappings().saturating_sub(before);
    assert!(
        grown <= PeerBounds::default().segments_per_process + 64,
        "{grown} new mappings for one process"
    );
    assert!(
        second.closed_by_node(Duration::from_secs(2)),
        "the connection that passed the bound is closed"
    );
    // The node's own memory still maps: a 16 MiB round trip from another node.
    let asker = node();
    let reply = asker
        .ask_blocking(
            server.local_addr(),
            "/actors/echo",
            kib(16 << 10),
            Duration::from_secs(10),
        )
        .unwrap();
    assert_eq!(tensor(reply).buffers[0].len(), 16 << 20);
}

#[test]
fn a_receiver_cannot_reopen_lent_memory_writable() {
    let _serial = serial();
    let server = node();
    server
        .serve("make", 1, |_| Ok(Reply::Tensor(patterned(1, 1, 1 << 20))))
        .unwrap();
    let mut raw = RawConn::open(server.local_addr()).unwrap();
    let ask = first_ask("/actors/make", &kib(0));
    assert!(raw.push(&ask));
    raw.publish();
    let (map, fds) = raw
        .datagram(Duration::from_secs(3))
        .expect("the reply's segment is announced");
    assert!(matches!(map, Control::Map { .. }));
    let fd = fds.into_iter().next().expect("with its descriptor");
    let len = usize::try_from(
        std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .unwrap()
            .len(),
    )
    .unwrap();
    let reopened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .expect("the reopen itself is allowed: it is the same user's file");
    // SAFETY: a new mapping without an address hint touches no existing memory.
    let writable = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            reopened.as_raw_fd(),
            0,
        )
    };
    assert_eq!(
        writable,
        libc::MAP_FAILED,
        "a writable mapping of lent memory"
    );
    use std::io::Write;
    assert!(
        (&reopened).write(b"x").is_err(),
        "write(2) into lent memory"
    );
    let reply = raw.pop_within(Duration::from_secs(3));
    assert!(matches!(reply, Some(Control::Reply { id: 1, .. })));
}

#[test]
fn connections_that_never_say_hello_cannot_shut_out_other_processes() {
    let _serial = serial();
    let server = node();
    let peer = HostilePeer::start("hellos", Some(server.local_addr()));
    let client = node();
    let choice = client.route_to(server.local_addr(), None).unwrap();
    assert_eq!(
        choice.route,
        tensorwire_engine::Route::SharedMemory,
        "{choice:?} while another process holds {} connections without a hello",
        peer.flooded
    );
    let reply = client
        .ask_blocking(
            server.local_addr(),
            "/actors/echo",
            kib(64),
            Duration::from_secs(5),
        )
        .unwrap();
    assert_eq!(tensor(reply).buffers[0].len(), 64 << 10);
    assert!(peer.flooded >= 200, "the flood was real: {}", peer.flooded);
}

#[test]
fn one_process_that_keeps_every_reply_cannot_take_the_memory_others_are_answered_from() {
    let _serial = serial();
    // Replies of 8 MiB from a 64 MiB quota, asked for four at a time (copied on four handler
    // threads at once): one process may hold half of it by default.
    let server = node_with(|b| {
        b.shm_quota(64 << 20)
            .shm_credit_wait(Duration::from_millis(300))
    });
    server
        .serve("make", 4, |_| {
            Ok(Reply::Tensor(TensorMessage::new(
                1,
                Bytes::new(),
                vec![Bytes::from(vec![3u8; 8 << 20])],
            )))
        })
        .unwrap();
    let hoarder = HostilePeer::start("hoard", Some(server.local_addr()));
    let (hoarded, refusal) = hoarder
        .report
        .split_once(" then ")
        .expect("the hoarder reports");
    let hoarded: u64 = hoarded.parse().unwrap();
    assert!(
        (8 << 20..=32 << 20).contains(&hoarded),
        "one process held {hoarded} bytes of the node's 64 MiB"
    );
    assert!(
        refusal.contains("holds") && refusal.contains("its bound"),
        "the hoarder is told why: {refusal}"
    );
    let client = node();
    for _ in 0..2 {
        let reply = client
            .ask_blocking(
                server.local_addr(),
                "/actors/make",
                kib(1),
                Duration::from_secs(5),
            )
            .expect("another peer process (this one) is still answered while the hoarder holds its bound");
        assert_eq!(tensor(reply).buffers[0].len(), 8 << 20);
    }
}

#[test]
fn segments_retired_while_the_node_keeps_views_of_them_still_count_against_their_process() {
    let _serial = serial();
    let server = node();
    let kept = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keeping = std::sync::Arc::clone(&kept);
    server
        .serve("keep", 1, move |request| {
            keeping.lock().unwrap().push(request.message);
            Ok(Reply::Tensor(TensorMessage::new(
                1,
                Bytes::new(),
                Vec::new(),
            )))
        })
        .unwrap();
    let before = mappings();
    let bound = PeerBounds::default().segments_per_process as u64;
    let mut raw = RawConn::open(server.local_addr()).unwrap();
    for segment in 1..=bound + 256 {
        let fd = sealed_memfd(4096, true, true).unwrap();
        if raw.announce(segment, 4096, fd.as_raw_fd()).is_err() {
            break;
        }
        let tell = Control::Request {
            id: segment,
            kind: RequestKind::Tell,
            path: "/actors/keep".into(),
            body: Body::Parts {
                version: 1,
                metadata: Part::Inline(Bytes::new()),
                buffers: vec![Part::Shared(Shared {
                    segment,
                    offset: 0,
                    len: 4096,
                    lease: segment,
                })],
            },
        };
        if !raw.push(&tell) || !raw.push(&Control::Retire { segment }) {
            break;
        }
        raw.publish();
        // Its answer read, so the node never stops for a peer that does not read.
        if raw.pop_within(Duration::from_secs(2)).is_none() {
            break;
        }
    }
    let held = kept.lock().unwrap().len() as u64;
    let grown = mappings().saturating_sub(before) as u64;
    assert!(
        grown <= bound + 64,
        "{grown} new mappings for one process ({held} messages kept, bound {bound})"
    );
    assert!(
        held <= bound,
        "{held} messages kept of segments of one process, more than its bound of {bound}"
    );
    drop(kept);
}

/// A 1 KiB ask to `server`'s echo from a node of its own: whether others are still served.
fn ask_echo_from_another_node(server: &Node) -> Result<Reply, tensorwire_engine::Error> {
    node().ask_blocking(
        server.local_addr(),
        "/actors/echo",
        kib(1),
        Duration::from_secs(5),
    )
}

#[test]
fn a_peer_that_says_it_sleeps_and_never_reads_its_socket_does_not_stall_the_node() {
    // Every reply would ring this peer (it says it sleeps), and its socket is never read: a
    // ring that waited for room would stall the node's thread once bells filled it; the node
    // rings only while nothing it sent is unread, so one bell waits there.
    const ASKS: u64 = 1_000;
    let _serial = serial();
    let server = node();
    let mut raw = RawConn::open(server.local_addr()).unwrap();
    raw.say_asleep();
    let message = TensorMessage::new(1, Bytes::new(), vec![Bytes::from_static(b"ping")]);
    for id in 1..=ASKS {
        let ask = Control::Request {
            id,
            kind: RequestKind::Ask,
            path: "/actors/echo".into(),
            body: inline_body(&message),
        };
        assert!(raw.push(&ask));
        raw.publish();
        match raw.pop_within(Duration::from_secs(5)) {
            Some(Control::Reply { id: replied, .. }) if replied == id => {}
            other => panic!("ask {id}: {other:?}"),
        }
    }
    let served = ask_echo_from_another_node(&server);
    assert_eq!(
        raw.bells_waiting(),
        1,
        "{ASKS} replies each asked for a ring: one bell, then none while it is unread"
    );
    let reply = served.expect("another process is served meanwhile");
    assert_eq!(tensor(reply).buffers[0].len(), 1 << 10);
}

#[test]
fn a_peer_that_rings_as_fast_as_the_node_reads_is_disconnected_not_read_forever() {
    // A record naming a segment never announced makes the node read the socket for its `Map`;
    // bells sent meanwhile must not keep it (and the connection's lock) there. (The node reads
    // faster than two threads ring here, so this checks the outcome — the connection closed,
    // others served — not the bound itself: `conn/io.rs` tests that.)
    let _serial = serial();
    let server = node();
    let mut raw = RawConn::open(server.local_addr()).unwrap();
    let socket = raw.socket.as_raw_fd();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooders: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            thread::spawn(move || {
                let mut sent = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match send_bell(socket) {
                        Ok(()) => sent += 1,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            thread::yield_now();
                        }
                        Err(_) => break,
                    }
                }
                sent
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(50));
    let ask = Control::Request {
        id: 1,
        kind: RequestKind::Ask,
        path: "/actors/echo".into(),
        body: Body::Packed(Shared {
            segment: 999,
            offset: 0,
            len: 8,
            lease: 1,
        }),
    };
    assert!(raw.push(&ask));
    raw.publish();
    let closed = raw.closed_by_node(Duration::from_secs(10));
    let served = ask_echo_from_another_node(&server);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent: u64 = flooders.into_iter().map(|f| f.join().unwrap()).sum();
    assert!(closed, "the node kept reading {sent} bells");
    let reply = served.expect("another process is served meanwhile");
    assert_eq!(tensor(reply).buffers[0].len(), 1 << 10);
}
