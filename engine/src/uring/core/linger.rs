//! Sockets closed while the kernel still holds pages of their zero-copy sends: reset once the
//! peer stops taking the data at the minimum rate, so a peer that never reads cannot keep the
//! socket and the memory.
//!
//! A `SENDMSG_ZC`'s pages (and with them the frame and the socket, which the operation owns
//! until its last notification) are let go only once the peer acknowledged the data. A peer
//! that closes its receive window and never reads, while its kernel answers the window
//! probes, keeps them forever: closing the connection (a deadline, the minimum rate, the end
//! of a graceful drain) lets the descriptor go only once the operation does, and the unsent
//! data stays queued. So the transfer's own rule goes on after the close: every rate window,
//! the bytes the socket still has unacknowledged (`SIOCOUTQ`) must have gone down by what the
//! minimum rate requires per window; a socket still held by an operation whose peer took less
//! is reset (`connect(AF_UNSPEC)`: an RST, and the kernel drops what was queued, which
//! completes the notifications). A peer that keeps the rate still gets everything written
//! before the close; with no minimum rate (`min_rate` 0) nothing is reset for it, as the
//! transfer itself would never have been cut off. One with nothing left unacknowledged whose
//! socket is still held (a notification on its way) is reset too: it has all its data, and
//! reads it before the reset. A node that stops resets them all at its stop deadline instead
//! of leaking them.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Weak};
use std::time::Instant;

use tensorwire_proto::session::RateMeter;

use crate::sys;

/// Closed sockets that an operation may still hold, oldest look first.
#[derive(Debug, Default)]
pub(super) struct Lingering {
    closed: VecDeque<Entry>,
}

#[derive(Debug)]
struct Entry {
    fd: Weak<OwnedFd>,
    /// The peer's rate since the close, window by window (its deadline is the next look).
    meter: RateMeter,
    /// Bytes unacknowledged at the last look (`None`: unknown).
    unacked: Option<u64>,
}

impl Entry {
    fn due(&self) -> Option<Instant> {
        self.meter.deadline()
    }
}

impl Lingering {
    /// `fd` was closed at `now`; while something still holds it, its peer must keep the rate
    /// `meter` requires (a new meter of the connection's minimum rate). Nothing is kept for a
    /// socket nothing else holds; entries of sockets let go meanwhile are dropped from the
    /// front.
    pub(super) fn closed(&mut self, fd: &Arc<OwnedFd>, now: Instant, mut meter: RateMeter) {
        while self
            .closed
            .front()
            .is_some_and(|entry| entry.fd.strong_count() == 0)
        {
            self.closed.pop_front();
        }
        if Arc::strong_count(fd) > 1 {
            meter.start(now);
            self.closed.push_back(Entry {
                fd: Arc::downgrade(fd),
                meter,
                unacked: sys::unacknowledged(fd.as_raw_fd()).ok(),
            });
        }
    }

    /// When the next look is due. Entries are in the order of their looks: each is due one
    /// window (the node's, the same for all) after it was added or last looked at.
    pub(super) fn next(&self) -> Option<Instant> {
        self.closed.front().and_then(Entry::due)
    }

    /// Looks at the sockets due by `now`: one let go is forgotten, one whose peer kept the
    /// minimum rate since the last look is looked at again a window later, the others are
    /// reset. Returns how many were reset. Costs nothing while none is due.
    pub(super) fn check(&mut self, now: Instant) -> usize {
        let mut reset = 0;
        while self
            .closed
            .front()
            .and_then(Entry::due)
            .is_some_and(|at| at <= now)
        {
            let Some(mut entry) = self.closed.pop_front() else {
                break;
            };
            let Some(fd) = entry.fd.upgrade() else {
                continue;
            };
            let unacked = sys::unacknowledged(fd.as_raw_fd()).ok();
            if let (Some(before), Some(left)) = (entry.unacked, unacked) {
                entry
                    .meter
                    .progress(usize::try_from(before.saturating_sub(left)).unwrap_or(usize::MAX));
            }
            if unacked.is_some_and(|left| left > 0) && entry.meter.check(now) {
                entry.unacked = unacked;
                self.closed.push_back(entry);
                continue;
            }
            reset += usize::from(reset_socket(&fd));
        }
        reset
    }

    /// Resets every socket still held (the node stops); returns how many.
    pub(super) fn reset_all(&mut self) -> usize {
        self.closed
            .drain(..)
            .filter_map(|entry| entry.fd.upgrade())
            .map(|fd| usize::from(reset_socket(&fd)))
            .sum()
    }
}

fn reset_socket(fd: &OwnedFd) -> bool {
    match sys::reset(fd.as_raw_fd()) {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(error = %e, "a lingering socket was not reset");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    use super::*;

    const WINDOW: Duration = Duration::from_secs(1);

    /// A meter of 64 KiB/s over 1 s windows.
    fn meter() -> RateMeter {
        RateMeter::new(64 << 10, WINDOW)
    }

    /// A connected pair: the accepted side as an `OwnedFd`, and its peer.
    fn pair(listener: &TcpListener) -> (Arc<OwnedFd>, TcpStream) {
        let peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        (Arc::new(OwnedFd::from(accepted)), peer)
    }

    fn was_reset(peer: &mut TcpStream) -> bool {
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match peer.read(&mut buf) {
                Ok(0) => return false,
                Ok(_) => continue, // what was queued before the reset comes first
                Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
            }
        }
    }

    #[test]
    fn a_socket_nothing_else_holds_is_not_kept() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (fd, _peer) = pair(&listener);
        let mut sut = Lingering::default();
        sut.closed(&fd, Instant::now(), meter());
        assert_eq!(sut.next(), None);
    }

    #[test]
    fn a_socket_let_go_is_forgotten_and_one_still_held_is_reset() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (held, mut held_peer) = pair(&listener);
        let (let_go, mut let_go_peer) = pair(&listener);
        let (op_holds_it, op_lets_it_go) = (Arc::clone(&held), Arc::clone(&let_go));
        let mut sut = Lingering::default();
        let now = Instant::now();
        sut.closed(&held, now, meter());
        sut.closed(&let_go, now, meter());
        drop((held, let_go, op_lets_it_go));
        assert_eq!(sut.next(), now.checked_add(WINDOW));
        assert_eq!(sut.check(now), 0, "not before a window passed");
        assert_eq!(sut.check(now + WINDOW), 1, "only the one still held");
        assert_eq!(sut.next(), None);
        assert!(
            was_reset(&mut held_peer),
            "the peer of the socket held was reset"
        );
        assert!(
            !was_reset(&mut let_go_peer),
            "the socket let go was closed, not reset"
        );
        drop(op_holds_it);
    }

    #[test]
    fn a_peer_that_keeps_the_minimum_rate_is_looked_at_again_not_reset() {
        let window = Duration::from_secs(1);
        let rate = RateMeter::new(4 << 10, window);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (held, mut peer) = pair(&listener);
        // Fill the peer's receive buffer and this side's send buffer: what is still queued
        // here is unacknowledged.
        let mut writer = TcpStream::from(held.try_clone().unwrap());
        writer.set_nonblocking(true).unwrap();
        let chunk = vec![7u8; 64 << 10];
        let mut written = 0;
        while let Ok(n) = writer.write(&chunk) {
            written += n;
        }
        let op_holds_it = Arc::clone(&held);
        let mut sut = Lingering::default();
        let now = Instant::now();
        sut.closed(&held, now, rate);
        drop(held);
        // The peer reads half of it (at most 1 MiB): more leaves the send buffer and is
        // acknowledged.
        let before = sys::unacknowledged(writer.as_raw_fd()).unwrap();
        let mut buf = vec![0u8; (written / 2).min(1 << 20)];
        let mut read = 0;
        while read < buf.len() {
            read += peer.read(&mut buf[read..]).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while sys::unacknowledged(writer.as_raw_fd()).unwrap() + (4 << 10) > before
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(sut.check(now + window), 0, "the peer kept the rate");
        assert_eq!(sut.next(), now.checked_add(window * 2));
        // Then it stops reading: the next look resets the socket.
        assert_eq!(sut.check(now + window * 2), 1, "the peer stopped");
        assert!(was_reset(&mut peer));
        drop((op_holds_it, writer));
    }

    #[test]
    fn without_a_minimum_rate_a_socket_is_never_reset_before_stopping() {
        let window = Duration::from_millis(10);
        let rate = RateMeter::new(0, window);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (held, _peer) = pair(&listener);
        let mut writer = TcpStream::from(held.try_clone().unwrap());
        writer.set_nonblocking(true).unwrap();
        while writer.write(&[7u8; 64 << 10]).is_ok() {}
        let op_holds_it = Arc::clone(&held);
        let mut sut = Lingering::default();
        let now = Instant::now();
        sut.closed(&held, now, rate);
        drop(held);
        assert_eq!(sut.check(now + window), 0);
        assert_eq!(sut.next(), now.checked_add(window * 2), "looked at again");
        assert_eq!(sut.reset_all(), 1);
        drop((op_holds_it, writer));
    }

    #[test]
    fn stopping_resets_every_socket_still_held() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (held, mut peer) = pair(&listener);
        let op_holds_it = Arc::clone(&held);
        let mut sut = Lingering::default();
        sut.closed(&held, Instant::now(), meter());
        drop(held);
        assert_eq!(sut.reset_all(), 1);
        assert_eq!(sut.next(), None);
        assert!(was_reset(&mut peer));
        drop(op_holds_it);
    }
}
