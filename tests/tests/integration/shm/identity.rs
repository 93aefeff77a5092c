//! Who is on the other end: a peer counts as same-host only after it answered the knock on the
//! port that was addressed and proved, on the socket it named, that it is that node. Each
//! test plays a peer that gets one step wrong; the client refuses it, says why in `route_to`,
//! and sends over TCP instead. (A squatter of another user is in the Python tests: it needs a
//! second uid.)

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use tensorwire_engine::{Node, Preference, Route};
use tensorwire_proto::shm::{Control, Hello, KnockReply, Offer, decode, encode};
use tensorwire_tests::*;

/// A fake node: answers one knock with `reply` on a TCP port (and closes anything else).
fn knock_answerer(reply: KnockReply) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(4) {
            let Ok(mut stream) = stream else { return };
            let mut knock = [0u8; 4];
            if stream.read_exact(&mut knock).is_ok() && &knock == b"TWSK" {
                let _ = stream.write_all(&reply.encode());
            }
        }
    });
    addr
}

/// A `SOCK_SEQPACKET` listener at `\0{name}`.
fn abstract_listener(name: &str) -> OwnedFd {
    // SAFETY: socket() takes no pointers; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_un is plain old data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::sa_family_t::try_from(libc::AF_UNIX).unwrap();
    for (dst, &src) in addr.sun_path[1..].iter_mut().zip(name.as_bytes()) {
        *dst = libc::c_char::from_ne_bytes([src]);
    }
    let len = libc::socklen_t::try_from(size_of::<libc::sa_family_t>() + 1 + name.len()).unwrap();
    // SAFETY: `addr` is live and `len` does not exceed its size.
    let bound = unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) };
    assert_eq!(bound, 0);
    // SAFETY: listen() takes no pointers.
    let listening = unsafe { libc::listen(fd.as_raw_fd(), 8) };
    assert_eq!(listening, 0);
    fd
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .trim()
        .to_owned()
}

fn offer(socket: &str, secret: [u8; 16]) -> KnockReply {
    KnockReply::Offered(Offer {
        pid: std::process::id(),
        // SAFETY: getuid has no preconditions.
        uid: unsafe { libc::getuid() },
        boot_id: boot_id(),
        socket: socket.to_owned(),
        ticket: 1,
        secret,
    })
}

fn client() -> Node {
    Node::builder(any_local_address())
        .in_process_delivery(false)
        .preference(Preference::Auto)
        .shm_hello_timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}

#[test]
fn a_same_user_process_that_cannot_prove_it_issued_the_ticket_is_refused() {
    let name = format!("tensorwire-test/impostor-{}", std::process::id());
    let listener = abstract_listener(&name);
    // It answers the hello like a node, but with a secret it made up.
    let impostor = std::thread::spawn(move || {
        // SAFETY: no address is asked for.
        let fd = unsafe {
            libc::accept(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        assert!(fd >= 0);
        // SAFETY: accept just returned it.
        let conn = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut buf = vec![0u8; 65536];
        // SAFETY: reads into a live buffer of its length.
        let n = unsafe { libc::recv(conn.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        let Ok(Control::Hello(theirs)) = decode(&buf[..usize::try_from(n).unwrap()]) else {
            panic!("the client sends a hello first");
        };
        assert_eq!(theirs.proof, [0; 16], "the client never sends the secret");
        let forged = Control::Hello(Hello {
            proof: [0xEE; 16],
            ticket: 0,
            via: String::new(),
            ..theirs
        });
        let bytes = encode(&forged).unwrap();
        // SAFETY: sends a live buffer of its length.
        unsafe { libc::send(conn.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
        std::thread::sleep(Duration::from_millis(200));
    });
    let peer = knock_answerer(offer(&name, [0x11; 16]));
    let node = client();
    let choice = node.route_to(peer, None).unwrap();
    assert_eq!(choice.route, Route::RawTcp, "{}", choice.reason);
    assert!(
        choice
            .reason
            .contains("could not prove it issued the ticket"),
        "{}",
        choice.reason
    );
    assert_eq!(node.stats().shm_connections, 0);
    impostor.join().unwrap();
}

#[test]
fn a_peer_naming_a_socket_this_process_cannot_reach_is_another_host() {
    let peer = knock_answerer(offer("tensorwire-test/nobody-listens-here", [0; 16]));
    let choice = client().route_to(peer, None).unwrap();
    assert_eq!(choice.route, Route::RawTcp);
    assert!(choice.reason.contains("cannot reach"), "{}", choice.reason);
}

#[test]
fn a_peer_on_another_boot_is_not_local() {
    let KnockReply::Offered(mut elsewhere) = offer("tensorwire-test/x", [0; 16]) else {
        unreachable!()
    };
    elsewhere.boot_id = "another-host".into();
    let peer = knock_answerer(KnockReply::Offered(elsewhere));
    let choice = client().route_to(peer, None).unwrap();
    assert_eq!(choice.route, Route::RawTcp);
    assert!(choice.reason.contains("another host"), "{}", choice.reason);
}

#[test]
fn a_peer_that_does_not_speak_the_knock_is_not_local() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        // Another PTR1 implementation: it reads the four bytes, finds no PTR1, closes.
        if let Ok((mut stream, _)) = listener.accept() {
            let mut preface = [0u8; 4];
            let _ = stream.read_exact(&mut preface);
        }
    });
    let choice = client().route_to(peer, None).unwrap();
    assert_eq!(choice.route, Route::RawTcp);
    assert!(
        choice.reason.contains("does not answer"),
        "{}",
        choice.reason
    );
}

#[test]
fn a_node_without_shared_memory_says_so_and_its_sends_go_over_ptr1_without_new_knocks() {
    let server = Node::builder(any_local_address())
        .shared_memory(false)
        .build()
        .unwrap();
    server
        .serve_on_core("echo", |r| Ok(tensorwire_engine::Reply::Tensor(r.message)))
        .unwrap();
    let node = client();
    let choice = node.route_to(server.local_addr(), None).unwrap();
    assert_eq!(choice.route, Route::RawTcp);
    assert!(
        choice.reason.contains("shared memory is off"),
        "{}",
        choice.reason
    );
    // Sends do not wait for another knock: the answer is remembered.
    let message = patterned(1, 1, 64);
    for _ in 0..20 {
        let reply = node
            .ask(server.local_addr(), "echo", message.clone(), TIMEOUT)
            .wait()
            .unwrap();
        assert_eq!(tensor(reply), message);
    }
}
