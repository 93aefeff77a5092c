//! What the peer sends: records from its queue and `Map` datagrams from the socket. Every
//! message is checked before the node sees it; what breaks the protocol closes the
//! connection; leases of a message nobody takes go straight back.

use bytes::Bytes;

use crate::shm::wire::{Body, Control, WireReply, decode, decode_shared};

use super::body::{Check, LOST};
use super::{
    CloseReason, ConnEvent, Failure, FdArrival, PeerSegment, Role, ShmConnection, Transmit,
};

impl ShmConnection {
    /// A message read from the peer's queue (copied out of shared memory first, into memory
    /// of its own: what it carries inline stays there, as slices).
    pub fn handle_record(&mut self, record: Bytes) {
        if self.closed.is_some() {
            return;
        }
        let control = match decode_shared(&record) {
            Ok(control) => control,
            Err(e) => return self.close(CloseReason::Protocol(e.to_string())),
        };
        if matches!(
            control,
            Control::Hello(_) | Control::Map { .. } | Control::Bell
        ) {
            return self.close(CloseReason::Protocol(
                "a Hello, Map or Bell came through the queue (socket only)".into(),
            ));
        }
        if self.parked.is_empty() {
            // Nothing waits before it: handled now, parked only if it must wait.
            self.run_one(control);
            return;
        }
        self.parked.push_back(control);
        self.run_parked();
    }

    /// A datagram from the socket (after the hello only `Map` and `Bell` travel there), and
    /// whether the descriptor it carries arrived. A `Bell` asks for nothing here: the driver
    /// looks at the queues whenever the socket was readable.
    pub fn handle_datagram(&mut self, bytes: &[u8], descriptor: FdArrival) {
        if self.closed.is_some() {
            return;
        }
        let (segment, len) = match decode(bytes) {
            Ok(Control::Map { segment, len }) => (segment, len),
            Ok(Control::Bell) if descriptor == FdArrival::None => return,
            Ok(Control::Bell) => {
                return self.close(CloseReason::Protocol("a Bell came with descriptors".into()));
            }
            Ok(_) => {
                return self.close(CloseReason::Protocol(
                    "only Map and Bell travel over the socket after the hello".into(),
                ));
            }
            Err(e) => return self.close(CloseReason::Protocol(e.to_string())),
        };
        if descriptor == FdArrival::None {
            return self.close(CloseReason::Protocol(format!(
                "segment {segment} was announced without its descriptor"
            )));
        }
        if descriptor == FdArrival::Lost {
            // At the descriptor limit: the segment never arrived. The peer announces it again
            // when it next uses it; what names it now fails cleanly. As many as it may have
            // mapped, at most.
            if !self.lost.contains(&segment) && self.lost.len() >= self.config.max_peer_segments {
                return self.close(CloseReason::Protocol(format!(
                    "the descriptors of more than {} segments were lost",
                    self.config.max_peer_segments
                )));
            }
            self.lost.insert(segment);
            if let Ok(record) = crate::shm::wire::Record::new(Control::Unmapped { segment }) {
                self.outbox.push(Transmit::Record(record), 0);
            }
            return;
        }
        if self.peer_segments.contains_key(&segment) {
            return self.close(CloseReason::Protocol(format!(
                "segment {segment} was announced twice"
            )));
        }
        if len == 0 || len > self.config.max_segment_bytes {
            return self.close(CloseReason::Protocol(format!(
                "a segment of {len} bytes was announced (at most {} are accepted)",
                self.config.max_segment_bytes
            )));
        }
        if self.peer_segments.len() >= self.config.max_peer_segments {
            return self.close(CloseReason::Protocol(format!(
                "more than {} segments were announced on one connection",
                self.config.max_peer_segments
            )));
        }
        self.lost.remove(&segment);
        self.peer_segments
            .insert(segment, PeerSegment::Mapping { len });
        self.events.push_back(ConnEvent::Map { segment, len });
    }

    /// The driver mapped the segment of a [`ConnEvent::Map`], or could not (the reason closes
    /// the connection: a bad descriptor, or a bound of this node).
    pub fn handle_mapped(&mut self, segment: u64, outcome: Result<(), CloseReason>) {
        let Some(PeerSegment::Mapping { len }) = self.peer_segments.get(&segment).copied() else {
            return;
        };
        match outcome {
            Ok(()) => {
                self.peer_segments
                    .insert(segment, PeerSegment::Mapped { len });
                if self.drained && !self.parked.is_empty() && !self.mapping() {
                    self.run_parked();
                }
            }
            Err(reason) => {
                self.peer_segments.remove(&segment);
                self.close(reason);
            }
        }
    }

    /// The socket was drained after [`ConnEvent::DrainSocket`]: the waiting messages go on.
    pub fn resume(&mut self) {
        self.drained = true;
        if !self.mapping() {
            self.run_parked();
        }
    }

    /// The peer hung up (the socket's end of stream, or its process exited).
    pub fn handle_peer_closed(&mut self) {
        self.close(CloseReason::PeerClosed);
    }

    /// Whether a segment is being mapped by the driver (parked messages wait for it).
    fn mapping(&self) -> bool {
        self.peer_segments
            .values()
            .any(|s| matches!(s, PeerSegment::Mapping { .. }))
    }

    /// Handles parked messages in order until one needs the socket drained.
    fn run_parked(&mut self) {
        while let Some(control) = self.parked.pop_front() {
            if self.closed.is_some() {
                return;
            }
            if !self.run_one(control) {
                return; // it went back to the front, waiting for the socket
            }
        }
    }

    /// Handles the first message in order; one that names a segment not announced yet goes
    /// back to the front of the parked ones, and the socket is drained for it (once: after a
    /// drain it is a protocol error). Whether the next may go on.
    fn run_one(&mut self, control: Control) -> bool {
        match self.handle(control) {
            Ok(()) => {
                self.drained = false;
                true
            }
            Err(waiting) => {
                let (control, segment) = *waiting;
                if self.drained {
                    self.close(CloseReason::Protocol(format!(
                        "a message names segment {segment}, which was never announced"
                    )));
                    return false;
                }
                self.parked.push_front(control);
                self.events.push_back(ConnEvent::DrainSocket);
                false
            }
        }
    }

    /// Handles one message; `Err` gives it back with the segment it names that is not
    /// announced yet.
    fn handle(&mut self, control: Control) -> Result<(), Box<(Control, u64)>> {
        match control {
            Control::Request {
                id,
                kind,
                path,
                body,
            } => {
                if self.config.role != Role::Server {
                    self.close(CloseReason::Protocol("a client was sent a request".into()));
                    return Ok(());
                }
                if self.serving.contains_key(&id) {
                    self.close(CloseReason::Protocol(format!(
                        "request {id} came again while it was being served"
                    )));
                    return Ok(());
                }
                let refuse = |this: &mut Self, body: &Body, text: String| {
                    this.send_releases(&body.leases());
                    this.serving.insert(id, kind);
                    this.send_reply(id, WireReply::Error(text), &[], 0);
                };
                if self.serving.len() >= self.config.max_in_flight {
                    let text = format!(
                        "the node is already serving {} requests of this connection (its bound)",
                        self.serving.len()
                    );
                    refuse(self, &body, text);
                    return Ok(());
                }
                match self.check_body(&body) {
                    Check::Fine => {
                        self.serving.insert(id, kind);
                        self.events.push_back(ConnEvent::Request {
                            id,
                            kind,
                            path,
                            body,
                        });
                    }
                    Check::Unknown(segment) => {
                        let control = Control::Request {
                            id,
                            kind,
                            path,
                            body,
                        };
                        return Err(Box::new((control, segment)));
                    }
                    Check::Lost(segment) if !self.drained => {
                        let control = Control::Request {
                            id,
                            kind,
                            path,
                            body,
                        };
                        return Err(Box::new((control, segment)));
                    }
                    Check::Lost(_) => refuse(self, &body, LOST.into()),
                    Check::Invalid(text) => refuse(self, &body, text),
                }
            }
            Control::Reply { id, reply } => {
                if self.config.role != Role::Client {
                    self.close(CloseReason::Protocol("a server was sent a reply".into()));
                    return Ok(());
                }
                let leases = match &reply {
                    WireReply::Tensor(body) => body.leases(),
                    _ => Vec::new(),
                };
                let Some(kind) = self.outstanding.kind(id) else {
                    // Nobody waits (its caller left, or the id was never ours on this
                    // connection): what it lent goes straight back.
                    self.send_releases(&leases);
                    return Ok(());
                };
                let check = match &reply {
                    WireReply::Tensor(body) => self.check_body(body),
                    _ => Check::Fine,
                };
                match check {
                    Check::Fine => {
                        self.outstanding.remove(id);
                        self.events.push_back(ConnEvent::Reply { id, kind, reply });
                    }
                    Check::Unknown(segment) => {
                        return Err(Box::new((Control::Reply { id, reply }, segment)));
                    }
                    Check::Lost(segment) if !self.drained => {
                        return Err(Box::new((Control::Reply { id, reply }, segment)));
                    }
                    Check::Lost(_) | Check::Invalid(_) => {
                        let text = match check {
                            Check::Invalid(text) => text,
                            _ => LOST.into(),
                        };
                        self.outstanding.remove(id);
                        self.send_releases(&leases);
                        self.events.push_back(ConnEvent::Failed {
                            id,
                            kind,
                            why: Failure::Unreadable(text),
                        });
                    }
                }
            }
            Control::Release { leases } => {
                if !leases.is_empty() {
                    self.events.push_back(ConnEvent::Released { leases });
                }
            }
            Control::Retire { segment } => {
                self.lost.remove(&segment);
                if self.peer_segments.remove(&segment).is_some() {
                    self.events.push_back(ConnEvent::Unmap { segment });
                }
            }
            Control::Unmapped { segment } => {
                self.announced.remove(&segment);
            }
            Control::Hello(_) | Control::Map { .. } | Control::Bell => {
                self.close(CloseReason::Protocol(
                    "a Hello, Map or Bell out of place".into(),
                ));
            }
        }
        Ok(())
    }
}
