//! Two processes on this host: round trips from 1 MiB to 256 MiB checksummed, a holder killed
//! (its leases come back), the owner killed (the reader's views stay valid), a receiver at its
//! descriptor limit (a clean error), and `/dev/shm` untouched.
//!
//! The peer is this test binary run again as `shm::cross_process::peer` (ignored when run
//! normally): it serves `echo`, `hold` (keeps every message it gets), `make` (answers with a
//! fresh 64 MiB tensor) and `limit-fds` (lowers its descriptor limit to what it uses now).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use bytes::Bytes;
use tensorwire_engine::{Node, Reply, TensorMessage};
use tensorwire_proto::stats;
use tensorwire_tests::*;

use super::data_path::eventually;

struct Peer {
    child: Child,
    addr: SocketAddr,
}

impl Peer {
    fn start() -> Self {
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new(exe)
            .args([
                "--ignored",
                "--exact",
                "shm::cross_process::peer",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("TENSORWIRE_SHM_PEER", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = loop {
            let line = lines
                .next()
                .expect("the peer says where it listens")
                .unwrap();
            // libtest prints "test … ... " before the peer's own output on the same line.
            if let Some(addr) = line.split("peer listening on ").nth(1) {
                break addr.trim().parse().unwrap();
            }
        };
        Self { child, addr }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn client() -> Node {
    shm_builder().build().unwrap()
}

fn dev_shm() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn two_process_round_trips_from_1_mib_to_256_mib_arrive_intact() {
    let _serial = serial();
    let shm_before = dev_shm();
    let peer = Peer::start();
    let client = client();
    let before = stats::global().snapshot().shm_messages_sent;
    for (count, len) in [(1, 1 << 20), (16, 1 << 20), (1, 64 << 20), (4, 64 << 20)] {
        let message = patterned(u32::try_from(count).unwrap(), count, len);
        let reply = tensor(
            client
                .ask(peer.addr, "echo", message.clone(), TIMEOUT)
                .wait()
                .unwrap(),
        );
        assert_eq!(checksum(&reply), checksum(&message), "{count} × {len}");
        assert_eq!(reply, message);
    }
    assert!(
        stats::global().snapshot().shm_messages_sent >= before + 4,
        "it went over shared memory"
    );
    assert!(
        eventually(|| client.stats().shm_leases == 0),
        "the peer released everything we lent"
    );
    assert_eq!(dev_shm(), shm_before, "nothing was created in /dev/shm");
}

#[test]
fn a_holder_killed_gives_its_leases_back() {
    let _serial = serial();
    let mut peer = Peer::start();
    let client = client();
    for i in 0..3 {
        client
            .tell(peer.addr, "hold", patterned(i, 1, 1 << 20), TIMEOUT)
            .wait()
            .unwrap();
    }
    assert_eq!(
        client.stats().shm_leases,
        3,
        "the peer holds three messages"
    );
    peer.kill();
    assert!(
        eventually(|| client.stats().shm_leases == 0),
        "its death gave them back"
    );
    // The slots are reusable: a new peer gets messages again.
    let peer = Peer::start();
    let message = patterned(9, 1, 1 << 20);
    assert_eq!(
        tensor(
            client
                .ask(peer.addr, "echo", message.clone(), TIMEOUT)
                .wait()
                .unwrap()
        ),
        message
    );
}

#[test]
fn the_owner_killed_leaves_the_readers_views_valid() {
    let _serial = serial();
    let mut peer = Peer::start();
    let client = client();
    let reply = tensor(
        client
            .ask(peer.addr, "make", patterned(1, 0, 0), TIMEOUT)
            .wait()
            .unwrap(),
    );
    let sum = checksum(&reply);
    peer.kill();
    // The memfd lives as long as our mapping: same bytes, no fault.
    assert_eq!(checksum(&reply), sum);
    assert_eq!(reply, patterned(2, 1, 64 << 20));
    assert!(
        eventually(|| client.stats().shm_connections == 0),
        "the dead peer's connection is gone"
    );
}

#[test]
fn a_received_view_cannot_be_made_writable() {
    let _serial = serial();
    let peer = Peer::start();
    let client = client();
    let reply = tensor(
        client
            .ask(peer.addr, "make", patterned(1, 0, 0), TIMEOUT)
            .wait()
            .unwrap(),
    );
    let buffer = &reply.buffers[0];
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap();
    let start = buffer.as_ptr() as usize / page * page;
    // SAFETY: asks the kernel to change the protection of pages the reply maps; it refuses,
    // so nothing changes (had it succeeded, nothing would write through them).
    let res = unsafe {
        libc::mprotect(
            start as *mut libc::c_void,
            page,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    assert_eq!(res, -1, "a view of a peer's memory cannot be made writable");
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EACCES)
    );
    assert_eq!(reply, patterned(2, 1, 64 << 20), "and it is intact");
}

#[test]
fn a_receiver_at_its_descriptor_limit_answers_with_a_clean_error() {
    let _serial = serial();
    let peer = Peer::start();
    let client = client();
    // Above what travels inline in the datagram: its memory needs a descriptor (once per
    // segment: the peer maps it and keeps it).
    let message = patterned(1, 1, 1 << 20);
    assert_eq!(
        tensor(
            client
                .ask(peer.addr, "echo", message.clone(), TIMEOUT)
                .wait()
                .unwrap()
        ),
        message
    );
    client
        .ask(peer.addr, "limit-fds", patterned(0, 0, 0), TIMEOUT)
        .wait()
        .unwrap();
    // A size whose segment the peer has not mapped yet: its descriptor must cross now.
    let err = client
        .ask(peer.addr, "echo", patterned(1, 1, 5 << 20), TIMEOUT)
        .wait()
        .unwrap_err();
    let text = err.remote_text().unwrap_or_default().to_owned();
    assert!(text.contains("descriptor limit"), "{err}");
    assert!(
        eventually(|| client.stats().shm_leases == 0),
        "the refused message's slot came back"
    );
}

/// The peer process (run by the tests above; ignored otherwise).
#[test]
#[ignore = "run by the cross-process tests as their peer"]
fn peer() {
    assert_eq!(
        std::env::var("TENSORWIRE_SHM_PEER").as_deref(),
        Ok("1"),
        "only as a child"
    );
    static HELD: Mutex<Vec<TensorMessage>> = Mutex::new(Vec::new());
    let node = Node::builder(any_local_address())
        .shared_memory(true)
        .build()
        .unwrap();
    node.serve("echo", 2, |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    node.serve("hold", 1, |r| {
        HELD.lock().unwrap().push(r.message);
        Ok(Reply::Single {
            msg_type: "held".into(),
            data: Bytes::new(),
        })
    })
    .unwrap();
    node.serve("make", 1, |_| Ok(Reply::Tensor(patterned(2, 1, 64 << 20))))
        .unwrap();
    node.serve("limit-fds", 1, |r| {
        // Descriptors 0-2 stay open, so no new descriptor fits under 3: deterministic, unlike
        // a limit at the open count (a descriptor closed meanwhile would make room).
        let limit = libc::rlimit {
            rlim_cur: 3,
            rlim_max: 4096,
        };
        // SAFETY: setrlimit reads a live rlimit.
        let res = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) };
        assert_eq!(res, 0);
        Ok(Reply::Tensor(r.message))
    })
    .unwrap();
    println!("peer listening on {}", node.local_addr());
    // Until the parent closes our stdin (or kills us).
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}
