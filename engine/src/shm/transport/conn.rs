//! One control connection: a `SOCK_SEQPACKET` socket, the capability exchange that proves
//! the peer is on this host, and sends that wait (bounded) when the peer's buffer is full.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tensorwire_proto::shm::{Control, Hello, MAX_DATAGRAM, decode, encode};
use tensorwire_proto::transport::Error;

use crate::shm::os;
use crate::sys;

/// How long a send may wait for room in the peer's socket buffer before the peer counts as
/// stalled and the connection is closed (its leases go back).
const SEND_WAIT: Duration = Duration::from_secs(5);

/// A control connection (either direction).
pub(crate) struct Conn {
    pub(crate) id: u64,
    pub(crate) fd: OwnedFd,
    closed: AtomicBool,
}

impl Conn {
    pub(crate) fn new(fd: OwnedFd) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            fd,
            closed: AtomicBool::new(false),
        }
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Sends `control` with `fds`; waits (at most a few seconds) for room.
    pub(crate) fn send(&self, control: &Control, fds: &[RawFd]) -> std::io::Result<()> {
        if self.is_closed() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "connection closed",
            ));
        }
        let datagram = encode(control);
        let deadline = Instant::now() + SEND_WAIT;
        loop {
            match os::send(self.raw(), &datagram, fds) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        self.close();
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "peer stalled",
                        ));
                    }
                    let _ = sys::poll_one(self.raw(), libc::POLLOUT, left);
                }
                Err(e) => {
                    self.close();
                    return Err(e);
                }
                Ok(()) => return Ok(()),
            }
        }
    }

    /// Marks it closed and shuts the socket down (the poll thread sees the hang-up).
    pub(crate) fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            let _ = sys::shutdown(self.raw(), libc::SHUT_RDWR);
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// This process's side of the capability exchange.
pub(crate) fn hello(node: SocketAddr) -> Hello {
    Hello {
        boot_id: os::boot_id(),
        user_ns: os::user_namespace(),
        uid: os::uid(),
        pid: std::process::id(),
        node: node.to_string(),
    }
}

/// Whether `theirs` is on this host, in this user namespace, under this user.
pub(crate) fn same_host(ours: &Hello, theirs: &Hello) -> bool {
    !ours.boot_id.is_empty()
        && ours.boot_id == theirs.boot_id
        && ours.user_ns == theirs.user_ns
        && ours.uid == theirs.uid
}

/// Connects to the node listening at `peer`'s port and exchanges hellos: the connection, if
/// that node is on this host and is the one at `peer`.
pub(crate) fn connect(
    name: &str,
    peer: SocketAddr,
    ours: &Hello,
    timeout: Duration,
) -> Result<Option<Conn>, Error> {
    let Ok(fd) = os::connect(name) else {
        return Ok(None); // no node of ours listens on that port here
    };
    let conn = Conn::new(fd);
    conn.send(&Control::Hello(ours.clone()), &[])
        .map_err(|e| Error::io("shm hello", e))?;
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let theirs = loop {
        match os::receive(conn.raw(), &mut buf, 0) {
            Ok(Some(received)) if received.len > 0 => match decode(&buf[..received.len]) {
                Ok(Control::Hello(theirs)) => break theirs,
                _ => return Ok(None),
            },
            Ok(Some(_)) => return Ok(None), // closed: refused
            Ok(None) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(None);
                }
                let _ = sys::poll_one(conn.raw(), libc::POLLIN, left);
            }
            Err(_) => return Ok(None),
        }
    };
    if !same_host(ours, &theirs) || !is_that_node(peer, &theirs.node) {
        return Ok(None);
    }
    Ok(Some(conn))
}

/// Whether the node that answered (listening at `theirs`) is the one at `peer`: same port,
/// and `peer`'s address is one of this host's (loopback, the node's own address, or any
/// address this host can bind when the node listens on all of them).
fn is_that_node(peer: SocketAddr, theirs: &str) -> bool {
    let Ok(theirs) = theirs.parse::<SocketAddr>() else {
        return false;
    };
    if theirs.port() != peer.port() {
        return false;
    }
    if peer.ip().is_loopback() || peer.ip() == theirs.ip() {
        return true;
    }
    theirs.ip().is_unspecified() && std::net::UdpSocket::bind(SocketAddr::new(peer.ip(), 0)).is_ok()
}

/// The abstract socket name of the node listening on `port` (per user: another user's node
/// is never reached).
pub(crate) fn socket_name(port: u16) -> String {
    format!("tensorwire/{}/{port}", os::uid())
}
