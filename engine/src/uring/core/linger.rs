//! Sockets closed while the kernel still holds pages of their zero-copy sends: reset once a
//! grace period passes, so a peer that never takes the data cannot keep the socket and the
//! memory.
//!
//! A `SENDMSG_ZC`'s pages (and with them the frame and the socket, which the operation owns
//! until its last notification) are let go only once the peer acknowledged the data. A peer
//! that closes its receive window and never reads, while its kernel answers the window
//! probes, keeps them forever: closing the connection (a deadline, the minimum rate) shuts
//! the socket down, but the unsent data stays queued behind the FIN. So a closed connection
//! whose socket is still held by an operation after the grace period is reset
//! (`connect(AF_UNSPEC)`: an RST, and the kernel drops what was queued, which completes the
//! notifications). The grace lets a peer that is only slow take what was written before the
//! close, as it would from a socket closed without zero-copy.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::sys;

/// Closed sockets that an operation may still hold, oldest first.
#[derive(Debug, Default)]
pub(super) struct Lingering {
    closed: VecDeque<(Instant, Weak<OwnedFd>)>,
}

impl Lingering {
    /// `fd` was closed at `now`; if something still holds it after `grace`, it is reset.
    /// Nothing is kept for a socket nothing else holds.
    pub(super) fn closed(&mut self, fd: &Arc<OwnedFd>, now: Instant, grace: Duration) {
        if Arc::strong_count(fd) > 1 {
            let at = now.checked_add(grace).unwrap_or(now);
            self.closed.push_back((at, Arc::downgrade(fd)));
        }
    }

    /// When the oldest grace period ends.
    pub(super) fn next(&self) -> Option<Instant> {
        self.closed.front().map(|(at, _)| *at)
    }

    /// Resets the sockets whose grace ended by `now` and that an operation still holds;
    /// returns how many.
    pub(super) fn reset_expired(&mut self, now: Instant) -> usize {
        let mut reset = 0;
        while let Some((at, fd)) = self.closed.front() {
            if *at > now {
                break;
            }
            if let Some(fd) = fd.upgrade() {
                match sys::reset(fd.as_raw_fd()) {
                    Ok(()) => reset += 1,
                    Err(e) => tracing::debug!(error = %e, "a lingering socket was not reset"),
                }
            }
            self.closed.pop_front();
        }
        reset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_nothing_else_holds_is_not_kept() {
        let mut sut = Lingering::default();
        let fd = Arc::new(OwnedFd::from(std::fs::File::open("/dev/null").unwrap()));
        sut.closed(&fd, Instant::now(), Duration::ZERO);
        assert_eq!(sut.next(), None);
    }

    #[test]
    fn a_socket_let_go_within_the_grace_is_left_alone_and_one_still_held_is_reset() {
        use std::io::Read;
        use std::net::{TcpListener, TcpStream};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let connect = || TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut held_peer, mut let_go_peer) = (connect(), connect());
        let held = Arc::new(OwnedFd::from(listener.accept().unwrap().0));
        let let_go = Arc::new(OwnedFd::from(listener.accept().unwrap().0));
        let (op_holds_it, op_lets_it_go) = (Arc::clone(&held), Arc::clone(&let_go));
        let mut sut = Lingering::default();
        let now = Instant::now();
        let grace = Duration::from_secs(1);
        sut.closed(&held, now, grace);
        sut.closed(&let_go, now, grace);
        drop((held, let_go, op_lets_it_go));
        assert_eq!(sut.next(), now.checked_add(grace));
        assert_eq!(sut.reset_expired(now), 0, "not before the grace ends");
        assert_eq!(sut.reset_expired(now + grace), 1, "only the one still held");
        assert_eq!(sut.next(), None);
        let mut buf = [0u8; 1];
        let read = held_peer.read(&mut buf);
        assert!(
            read.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "the peer of the socket still held was reset: {read:?}"
        );
        assert!(
            matches!(let_go_peer.read(&mut buf), Ok(0)),
            "the socket let go was closed, not reset"
        );
        drop(op_holds_it);
    }
}
