//! Moving bytes: records into this side's queue and `Map` datagrams (with descriptors) onto
//! the socket, in the order the session gives them; datagrams in from the socket, a peer's
//! segment mapped (after its checks and this node's bounds).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

use tensorwire_proto::shm::{CloseReason, ConnEvent, FdArrival, MAX_SOCKET_DATAGRAM, Transmit};
use tensorwire_proto::stats;

use super::{After, Conn, State};
use crate::shm::os::FileMap;
use crate::shm::queue::Full;
use crate::shm::socket;
use crate::shm::transport::Transport;
use crate::shm::transport::views::{Counted, Mapped};
use crate::sync::lock;

impl Conn {
    /// Receives every datagram on the socket: `Map`s are mapped at once (the descriptor is in
    /// hand), the end of stream closes the session.
    pub(super) fn drain(self: &Arc<Self>, t: &Arc<Transport>, st: &mut State, after: &mut After) {
        // Only a `Map` is expected: a longer datagram, cut to this, never decodes.
        let mut buf = [0u8; MAX_SOCKET_DATAGRAM];
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
}
