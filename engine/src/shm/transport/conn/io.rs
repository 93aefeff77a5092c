//! Moving bytes: records into this side's queue and `Map` datagrams (with descriptors) onto
//! the socket, in the order the session gives them; the peer rung; datagrams in from the
//! socket, a peer's segment mapped (after its checks and this node's bounds).

use std::cell::Cell;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

use tensorwire_proto::shm::{
    BELL, CloseReason, ConnEvent, FdArrival, MAX_SOCKET_DATAGRAM, Transmit,
};
use tensorwire_proto::stats;

use super::{After, Conn, State};

/// Datagrams one drain reads at most. A correct peer leaves at most one bell unread per
/// thread that rings (it rings only when nothing it sent is unread: [`Conn::ring`]) and a
/// `Map` per segment it announces; a peer that sends more as fast as they are read (bells, or
/// `Map`s whose descriptors it makes this side lose) cannot keep this thread, and the
/// connection's lock, here.
const MAX_DATAGRAMS_PER_DRAIN: usize = 1024;

thread_local! {
    /// Whether this thread sent a bell since it last asked ([`take_rang`]).
    static RANG: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread rang a peer since the last call (and forgets it).
pub(in crate::shm::transport) fn take_rang() -> bool {
    RANG.with(|rang| rang.replace(false))
}
use crate::shm::os::FileMap;
use crate::shm::queue::Full;
use crate::shm::socket;
use crate::shm::transport::Transport;
use crate::shm::transport::views::{Counted, Mapped};
use crate::sync::lock;

impl Conn {
    /// Receives the datagrams on the socket — every one, or (`until_bell`, as the driver's
    /// poll does) up to the first `Bell`: what follows it keeps the socket readable for the
    /// next poll, and a wake-up costs one receive. `Map`s are mapped at once (the descriptor
    /// is in hand), a `Bell` only woke the reader, the end of stream closes the session.
    ///
    /// Either stops after [`MAX_DATAGRAMS_PER_DRAIN`] datagrams, or once the session closed;
    /// the session then judges with what was read (a record naming a segment still
    /// unannounced closes the connection).
    pub(super) fn drain(
        self: &Arc<Self>,
        t: &Arc<Transport>,
        st: &mut State,
        after: &mut After,
        until_bell: bool,
    ) {
        // Only `Map` and `Bell` are expected: a longer datagram, cut to this, never decodes as
        // either (and anything else closes the connection).
        let mut buf = [0u8; MAX_SOCKET_DATAGRAM];
        let mut read = 0;
        loop {
            match socket::receive(self.socket(), &mut buf, 1) {
                Ok(Some(received)) if received.len == 0 => {
                    st.session.handle_peer_closed();
                    return;
                }
                Ok(Some(received)) => {
                    let arrival = if received.truncated {
                        stats::global().record_shm_fd_failure();
                        FdArrival::Lost
                    } else if received.fds.is_empty() {
                        FdArrival::None
                    } else {
                        FdArrival::Arrived
                    };
                    let mut fds = received.fds;
                    let bell = buf[..received.len] == *BELL;
                    st.session.handle_datagram(&buf[..received.len], arrival);
                    while let Some(event) = st.session.poll_event() {
                        match event {
                            ConnEvent::Map { segment, len } => {
                                let outcome = match fds.pop() {
                                    Some(fd) => self.map(t, st, segment, len, &fd),
                                    None => Err(CloseReason::Local("no descriptor".into())),
                                };
                                st.session.handle_mapped(segment, outcome);
                            }
                            other => self.on_event(t, st, other, after),
                        }
                    }
                    read += 1;
                    if !reads_on(until_bell, bell, read) || st.session.closed().is_some() {
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    st.session
                        .close(CloseReason::Local(format!("the socket failed: {e}")));
                    return;
                }
            }
        }
    }

    /// Maps a segment the peer announced, after checking it and this node's bounds.
    pub(super) fn map(
        &self,
        t: &Transport,
        st: &mut State,
        segment: u64,
        len: u64,
        fd: &OwnedFd,
    ) -> Result<(), CloseReason> {
        if let Err(why) = crate::shm::os::check_segment(fd.as_raw_fd(), len) {
            stats::global().record_shm_fd_failure();
            return Err(CloseReason::Protocol(format!(
                "segment {segment} refused: {why}"
            )));
        }
        lock(&t.book)
            .mapping(self.peer.pid, len)
            .map_err(CloseReason::OverBound)?;
        let size = usize::try_from(len).map_err(|_| CloseReason::Local("segment too large".into()));
        // Read-only and not pre-faulted: nothing is committed for the peer's pages until they
        // are read (and the check above saw them allocated).
        let map = size.and_then(|size| {
            FileMap::new(fd.as_raw_fd(), 0, size, false, false)
                .map_err(|e| CloseReason::Local(format!("mmap of a peer segment: {e}")))
        });
        match map {
            Ok(map) => {
                let counted = Counted {
                    book: Arc::downgrade(&t.book),
                    pid: self.peer.pid,
                    len,
                    born: crate::fork::generation(),
                };
                st.mapped.insert(
                    segment,
                    Arc::new(Mapped {
                        map,
                        _counted: counted,
                    }),
                );
                self.mapped_changed(st);
                Ok(())
            }
            Err(reason) => {
                lock(&t.book).unmapped(self.peer.pid, len);
                Err(reason)
            }
        }
    }

    /// Moves the session's transmits: records into our queue, `Map`s onto the socket.
    pub(super) fn flush(&self, st: &mut State, after: &mut After) {
        let mut pushed = false;
        while let Some(transmit) = st.session.poll_transmit() {
            match transmit {
                Transmit::Record(record) => {
                    match st
                        .queue
                        .push_with(&self.peer_queue, record.len(), |out| record.write_to(out))
                    {
                        Ok(Ok(())) => {
                            st.session.handle_queued(st.queue.head());
                            pushed = true;
                        }
                        Ok(Err(Full)) => {
                            let len = record.len();
                            if pushed && st.queue.publish(&self.peer_queue) {
                                after.ring_peer = true;
                            }
                            if st.queue.blocked(&self.peer_queue, len) {
                                // Room came meanwhile; the word is set, so clear it like any
                                // other block once everything is out.
                                st.blocked = true;
                                continue;
                            }
                            st.blocked = true;
                            st.session.handle_blocked(Instant::now());
                            break;
                        }
                        Err(e) => st.session.close(CloseReason::Queue(e)),
                    }
                }
                Transmit::Map { datagram, segment } => {
                    let Some(fd) = st.attach.get(segment).map(|s| s.read_only_fd().as_raw_fd())
                    else {
                        st.session.close(CloseReason::Local(format!(
                            "segment {segment} was to be announced but is not at hand"
                        )));
                        break;
                    };
                    match socket::send(self.socket(), datagram, &[fd]) {
                        Ok(()) => {
                            let segment = *segment;
                            st.attach.remove(&segment);
                            st.session.handle_transmitted();
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            st.session.handle_blocked(Instant::now());
                            break;
                        }
                        Err(e) => st
                            .session
                            .close(CloseReason::Local(format!("the socket failed: {e}"))),
                    }
                }
            }
        }
        if pushed && st.queue.publish(&self.peer_queue) {
            after.ring_peer = true;
        }
        if st.session.poll_transmit().is_none() {
            // No `Map` waits to be sent: the segments kept for one are not needed. (A send
            // over a segment the peer has mapped already announces nothing, so its entry
            // would otherwise keep the segment, retired or not, for the connection's life.)
            if !st.attach.is_empty() {
                st.attach.clear();
            }
            if st.blocked {
                st.blocked = false;
                if !st.awaits_reading {
                    st.queue.unblocked();
                }
            }
        }
    }

    /// Rings the peer: a `Bell` on the socket, never waiting, and only if everything sent
    /// before was read — a datagram of ours still unread keeps the peer's socket readable,
    /// which wakes its reader as a bell would, and a peer that reads nothing gets one bell,
    /// not a socket full. Each end of the socket is a file of its own: nothing the peer does
    /// to its end can make this send wait. Whether a bell went out.
    pub(super) fn ring(&self) -> bool {
        let socket = self.socket();
        if socket::unread_sent(socket).is_ok_and(|bytes| bytes > 0) {
            return false;
        }
        match socket::send(socket, BELL, &[]) {
            Ok(()) => {
                RANG.with(|rang| rang.set(true));
                true
            }
            // Full (the peer is woken by what fills it), or the peer is gone or shut its end
            // (reading it shows the end, or the next `Map` fails and closes the connection).
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || matches!(
                        e.raw_os_error(),
                        Some(libc::EPIPE | libc::ECONNRESET | libc::ENOTCONN)
                    ) =>
            {
                false
            }
            Err(e) => {
                // Lost: the peer looks again at its next periodic turn (500 ms).
                tracing::warn!(node = %self.node, pid = self.peer.pid, error = %e, "ringing a shared-memory peer failed");
                false
            }
        }
    }
}

/// Whether a drain reads on after a datagram (`bell`: it was one; `read`: how many so far).
fn reads_on(until_bell: bool, bell: bool, read: usize) -> bool {
    !(bell && until_bell) && read < MAX_DATAGRAMS_PER_DRAIN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_stops_at_the_first_bell_or_after_its_bound_of_datagrams() {
        assert!(
            reads_on(true, false, 1),
            "a Map before the bell is read past"
        );
        assert!(
            !reads_on(true, true, 1),
            "the driver's drain stops at the first bell"
        );
        for bell in [true, false] {
            let read = (1..=10 * MAX_DATAGRAMS_PER_DRAIN)
                .take_while(|&read| reads_on(false, bell, read))
                .count();
            assert_eq!(
                read + 1,
                MAX_DATAGRAMS_PER_DRAIN,
                "a full drain stops at its bound"
            );
        }
        assert!(!reads_on(true, false, MAX_DATAGRAMS_PER_DRAIN));
    }
}
