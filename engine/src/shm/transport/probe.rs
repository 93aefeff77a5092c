//! The client side of setting up shared memory with a peer: knock on the peer's TCP port,
//! connect to the socket it names, check who is there, exchange hellos with the queues beside
//! them. Runs on a probe thread, never on a caller's. The checks themselves
//! are `tensorwire_proto::shm::Identity`'s.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

use tensorwire_proto::shm::{
    Control, Credentials, Hello, KNOCK, KnockReply, MAX_DATAGRAM, MAX_KNOCK_REPLY, Offer,
    QueueShape, Role, decode, encode,
};

use super::Transport;
use super::conn::{Conn, Setup};
use crate::shm::queue::{OwnQueue, PeerQueue};
use crate::shm::socket;
use crate::sys;

/// Knocks on `peer` and sets up a verified connection to it, within the hello timeout.
///
/// # Errors
///
/// Why shared memory with `peer` is not possible, for `route()` and the logs.
pub(super) fn probe(t: &Arc<Transport>, peer: SocketAddr) -> Result<Arc<Conn>, String> {
    let deadline = Instant::now() + t.config.hello_timeout;
    let ours = &t.identity;
    let (offer, via) = knock(peer, deadline)?;
    ours.check_offer(&offer)
        .map_err(|e| format!("{peer}: {e}"))?;
    let fd = socket::connect(&offer.socket).map_err(|e| {
        format!(
            "{peer} names a shared-memory socket this process cannot reach ({e}): another \
             host or network namespace"
        )
    })?;
    let cred = socket::peer_cred(fd.as_raw_fd())
        .map_err(|e| format!("SO_PEERCRED of {peer}'s shared-memory socket: {e}"))?;
    let cred = Credentials {
        pid: cred.pid,
        uid: cred.uid,
    };
    ours.check_socket(&offer, cred)
        .map_err(|e| format!("{peer}: {e}"))?;
    let queue = OwnQueue::create(t.config.queue_bytes)
        .map_err(|e| format!("cannot create a shared-memory queue: {e}"))?;
    let hello = ours.hello(offer.ticket, via, [0; 16], queue.ring());
    send_hello(&fd, &hello, &queue)?;
    let (theirs, mut fds) = receive_hello(&fd, peer, deadline)?;
    let shape = QueueShape::DEFAULT;
    ours.check_server_hello(&offer, cred, &theirs, shape)
        .map_err(|e| format!("{peer}: {e}"))?;
    let peer_queue = peer_channel(&mut fds, theirs.queue).map_err(|e| format!("{peer}: {e}"))?;
    let setup = Setup {
        socket: fd,
        peer: cred,
        node: theirs.node,
        role: Role::Client,
        queue,
        peer_queue,
    };
    Ok(Arc::new(Conn::new(setup, t)))
}

/// Sends a hello with this side's queue (read-only) beside it.
///
/// # Errors
///
/// Why it could not be sent.
pub(super) fn send_hello(fd: &OwnedFd, hello: &Hello, queue: &OwnQueue) -> Result<(), String> {
    let datagram = encode(&Control::Hello(hello.clone())).map_err(|e| e.to_string())?;
    let shared = queue
        .share()
        .map_err(|e| format!("cannot share the queue: {e}"))?;
    socket::send(fd.as_raw_fd(), &datagram, &[shared.as_raw_fd()])
        .map_err(|e| format!("shm hello: {e}"))
}

/// Opens the peer's queue from the one descriptor beside its hello (received with room for
/// two, so that a hello with more is refused here rather than cut short).
///
/// # Errors
///
/// Why it is refused.
pub(super) fn peer_channel(fds: &mut Vec<OwnedFd>, ring: u32) -> Result<PeerQueue, String> {
    if fds.len() != 1 {
        return Err(format!(
            "its hello came with {} descriptors, not its queue alone",
            fds.len()
        ));
    }
    let queue_fd = fds.pop().ok_or("no queue")?;
    PeerQueue::open(&queue_fd, ring)
}

/// Waits (until `deadline`) for the server's hello and its descriptor.
fn receive_hello(
    fd: &OwnedFd,
    peer: SocketAddr,
    deadline: Instant,
) -> Result<(Hello, Vec<OwnedFd>), String> {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        match socket::receive(fd.as_raw_fd(), &mut buf, 2) {
            Ok(Some(received)) if received.len > 0 => {
                if received.truncated {
                    return Err("this process is at its descriptor limit".into());
                }
                return match decode(&buf[..received.len]) {
                    Ok(Control::Hello(theirs)) => Ok((theirs, received.fds)),
                    _ => Err(format!("{peer} answered the hello with something else")),
                };
            }
            Ok(Some(_)) => return Err(format!("{peer} refused the shared-memory hello")),
            Ok(None) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(format!(
                        "{peer} did not answer the shared-memory hello in time"
                    ));
                }
                let _ = sys::poll_one(fd.as_raw_fd(), libc::POLLIN, left);
            }
            Err(e) => return Err(format!("shm hello with {peer}: {e}")),
        }
    }
}

/// The knock: the offer, and the local address it was made from.
fn knock(peer: SocketAddr, deadline: Instant) -> Result<(Offer, String), String> {
    let left = deadline.saturating_duration_since(Instant::now());
    let mut stream = TcpStream::connect_timeout(&peer, left)
        .map_err(|e| format!("knocking on {peer} failed: {e}"))?;
    let via = stream
        .local_addr()
        .map_err(|e| format!("getsockname: {e}"))?
        .to_string();
    let _ = stream.set_nodelay(true);
    stream
        .write_all(KNOCK)
        .map_err(|e| format!("knocking on {peer} failed: {e}"))?;
    let mut reply = Vec::with_capacity(128);
    let mut chunk = [0u8; 512];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("{peer} did not answer the knock in time"));
        }
        let _ = stream.set_read_timeout(Some(left));
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) => return Err(format!("{peer} did not answer the knock: {e}")),
        };
        reply.extend_from_slice(&chunk[..n]);
        match KnockReply::decode(&reply) {
            Ok(Some(KnockReply::Offered(offer))) => return Ok((offer, via)),
            Ok(Some(KnockReply::Refused(why))) => {
                return Err(format!("{peer} does not offer shared memory: {why}"));
            }
            Ok(None) if n > 0 && reply.len() <= MAX_KNOCK_REPLY => {}
            Ok(None) | Err(_) => {
                return Err(format!(
                    "{peer} does not answer tensorwire's shared-memory knock (not a tensorwire \
                     node, or an older one)"
                ));
            }
        }
    }
}
