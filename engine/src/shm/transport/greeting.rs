//! The server side of setting up shared memory: an accepted connection waits for its hello
//! (bounded per peer process and in all, and in time); the hello is checked
//! (`tensorwire_proto::shm::Identity`), its ticket redeemed, the peer process's connection
//! bound taken, and the answer carries this side's proof and queue.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

use tensorwire_proto::shm::{Control, Credentials, MAX_DATAGRAM, QueueShape, Role, decode};
use tensorwire_proto::stats;

use super::Transport;
use super::conn::{Conn, Setup};
use super::probe::{peer_channel, send_hello};
use crate::shm::queue::{OwnQueue, PeerQueue};
use crate::shm::socket;
use crate::sync::lock;

/// An accepted connection before its hello.
pub(super) struct Greeting {
    pub(super) fd: OwnedFd,
    pub(super) cred: Credentials,
    pub(super) since: Instant,
}

/// Reads an accepted connection's hello and answers it: the connection, if the peer is who it
/// must be — this boot, user namespace and user, the pid the kernel saw, holding a ticket this
/// node gave to the TCP address it says it knocked from — and within its process's bound.
///
/// # Errors
///
/// Why it was refused (for the logs; the peer sees its socket closed).
pub(super) fn greet(t: &Arc<Transport>, greeting: Greeting) -> Result<Arc<Conn>, String> {
    let Greeting { fd, cred, .. } = greeting;
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let received = socket::receive(fd.as_raw_fd(), &mut buf, 2)
        .map_err(|e| format!("receiving the hello: {e}"))?
        .ok_or("no hello yet")?;
    if received.truncated {
        stats::global().record_shm_fd_failure();
        return Err("this process is at its descriptor limit".into());
    }
    let Ok(Control::Hello(theirs)) = decode(&buf[..received.len]) else {
        return Err("the first datagram is not a hello".into());
    };
    let mut fds = received.fds;
    t.identity
        .check_client_hello(cred, &theirs, QueueShape::DEFAULT)
        .map_err(|e| e.to_string())?;
    let secret = t
        .desk
        .redeem(theirs.ticket, &theirs.via)
        .ok_or("the hello redeems no valid ticket")?;
    if let Err(over) = lock(&t.book).connection(cred.pid) {
        stats::global().record_shm_peer_refused();
        return Err(over.to_string());
    }
    let opened = open(t, &fd, &mut fds, theirs.queue, secret);
    let (queue, peer_queue) = match opened {
        Ok(parts) => parts,
        Err(why) => {
            lock(&t.book).connection_closed(cred.pid);
            return Err(why);
        }
    };
    let setup = Setup {
        socket: fd,
        peer: cred,
        node: theirs.node,
        role: Role::Server,
        queue,
        peer_queue,
    };
    Ok(Arc::new(Conn::new(setup, t)))
}

/// This side's queue, sent with the proving hello; the peer's, opened.
fn open(
    t: &Transport,
    fd: &OwnedFd,
    fds: &mut Vec<OwnedFd>,
    ring: u32,
    secret: [u8; 16],
) -> Result<(OwnQueue, PeerQueue), String> {
    let peer_queue = peer_channel(fds, ring)?;
    let queue = OwnQueue::create(t.config.queue_bytes)
        .map_err(|e| format!("cannot create a shared-memory queue: {e}"))?;
    let ours = t.identity.hello(0, String::new(), secret, queue.ring());
    send_hello(fd, &ours, &queue)?;
    Ok((queue, peer_queue))
}
