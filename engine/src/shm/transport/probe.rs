//! The client side of setting up shared memory with a peer: knock on the peer's TCP port,
//! connect to the socket it names, check who is there, exchange hellos. Runs on a probe
//! thread, never on a caller's.
//!
//! The peer counts as the node that was addressed only if all of this holds: it answered the
//! knock on the very port the caller addressed; the socket it named belongs (`SO_PEERCRED`)
//! to the process and user it said; it is on this boot, in this user namespace, under this
//! user; and on the socket it sent back the secret of the ticket it gave over TCP, which this
//! side never sends. Anything less is refused, with the reason kept for `route()`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use tensorwire_proto::shm::{
    Control, Hello, KNOCK, KnockReply, MAX_DATAGRAM, MAX_KNOCK_REPLY, decode, encode,
};

use crate::shm::socket;
use crate::shm::transport::conn::Conn;
use crate::sys;

/// Who this node is, as it says in its hello.
#[derive(Clone, Debug)]
pub(crate) struct Identity {
    pub(crate) boot_id: String,
    pub(crate) user_ns: u64,
    pub(crate) uid: u32,
    pub(crate) pid: u32,
    pub(crate) node: SocketAddr,
}

impl Identity {
    pub(crate) fn of_this_process(node: SocketAddr) -> Self {
        Self {
            boot_id: crate::shm::os::boot_id(),
            user_ns: crate::shm::os::user_namespace(),
            uid: crate::shm::os::uid(),
            pid: std::process::id(),
            node,
        }
    }

    /// The hello this side sends.
    pub(crate) fn hello(&self, ticket: u64, via: String, proof: [u8; 16]) -> Hello {
        Hello {
            boot_id: self.boot_id.clone(),
            user_ns: self.user_ns,
            uid: self.uid,
            pid: self.pid,
            node: self.node.to_string(),
            ticket,
            via,
            proof,
        }
    }

    /// Why `theirs` is not a peer of this host, user namespace and user, if it is not.
    pub(crate) fn mismatch(&self, theirs: &Hello) -> Option<String> {
        if self.boot_id.is_empty() || self.boot_id != theirs.boot_id {
            return Some("it runs on another host (boot ids differ)".into());
        }
        if self.user_ns != theirs.user_ns {
            return Some("it runs in another user namespace".into());
        }
        if self.uid != theirs.uid {
            return Some(format!(
                "it runs as uid {}, this node as uid {}",
                theirs.uid, self.uid
            ));
        }
        None
    }
}

/// Knocks on `peer` and sets up a verified connection to it, within `timeout`.
///
/// # Errors
///
/// Why shared memory with `peer` is not possible, for `route()` and the logs.
pub(crate) fn probe(ours: &Identity, peer: SocketAddr, timeout: Duration) -> Result<Conn, String> {
    let deadline = Instant::now() + timeout;
    let (offer, via) = knock(peer, deadline)?;
    if offer.boot_id != ours.boot_id || ours.boot_id.is_empty() {
        return Err(format!("{peer} runs on another host (its boot id differs)"));
    }
    if offer.uid != ours.uid {
        return Err(format!(
            "{peer} runs as uid {}, this node as uid {}: shared memory is same-user only",
            offer.uid, ours.uid
        ));
    }
    let fd = socket::connect(&offer.socket).map_err(|e| {
        format!(
            "{peer} names a shared-memory socket this process cannot reach ({e}): another \
             host or network namespace"
        )
    })?;
    let cred = socket::peer_cred(fd.as_raw_fd())
        .map_err(|e| format!("SO_PEERCRED of {peer}'s shared-memory socket: {e}"))?;
    if cred.uid != ours.uid {
        return Err(format!(
            "the shared-memory socket {peer} named belongs to uid {}, not uid {} (refused: \
             another user may be squatting it)",
            cred.uid, ours.uid
        ));
    }
    if cred.pid != offer.pid {
        return Err(format!(
            "the shared-memory socket {peer} named belongs to pid {}, but the node said it is \
             pid {} (refused)",
            cred.pid, offer.pid
        ));
    }
    let hello = ours.hello(offer.ticket, via, [0; 16]);
    let datagram = encode(&Control::Hello(hello)).map_err(|e| e.to_string())?;
    socket::send(fd.as_raw_fd(), &datagram, &[]).map_err(|e| format!("shm hello: {e}"))?;
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let theirs = loop {
        match socket::receive(fd.as_raw_fd(), &mut buf, 0) {
            Ok(Some(received)) if received.len > 0 => match decode(&buf[..received.len]) {
                Ok(Control::Hello(theirs)) => break theirs,
                _ => return Err(format!("{peer} answered the hello with something else")),
            },
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
    };
    if theirs.proof != offer.secret {
        return Err(format!(
            "the process on {peer}'s shared-memory socket could not prove it issued the ticket \
             (refused)"
        ));
    }
    if let Some(why) = ours.mismatch(&theirs) {
        return Err(format!("{peer}: {why}"));
    }
    if theirs.pid != cred.pid {
        return Err(format!(
            "{peer} says pid {} but is pid {}",
            theirs.pid, cred.pid
        ));
    }
    let pidfd = socket::peer_pidfd(fd.as_raw_fd(), cred.pid).ok();
    Ok(Conn::new(fd, cred, pidfd, theirs.node))
}

/// The knock: the offer, and the local address it was made from.
fn knock(
    peer: SocketAddr,
    deadline: Instant,
) -> Result<(tensorwire_proto::shm::Offer, String), String> {
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
