//! One same-host connection as a state machine: what a TWS4 connection means, written once,
//! without I/O. The engine's driver owns the socket, the queue memory, the mappings and the
//! threads; it feeds what arrives in and moves what comes out.
//!
//! - Inputs: [`ShmConnection::handle_record`] (a message read from the peer's queue, already
//!   copied out of shared memory), [`ShmConnection::handle_datagram`] (a message from the
//!   socket and whether its descriptor arrived), [`ShmConnection::handle_mapped`] (the driver
//!   mapped a segment, or could not), the sends ([`ShmConnection::send_request`],
//!   [`ShmConnection::send_reply`], [`ShmConnection::send_releases`],
//!   [`ShmConnection::retire`]), the driver's progress ([`ShmConnection::handle_queued`],
//!   [`ShmConnection::handle_transmitted`], [`ShmConnection::handle_blocked`],
//!   [`ShmConnection::handle_consumed`]) and time ([`ShmConnection::handle_timeout`]).
//! - Outputs: [`ShmConnection::poll_transmit`] (the next record for this side's queue, or a
//!   `Map` datagram with a segment's descriptor for the socket — in the order they must go),
//!   [`ShmConnection::poll_event`] ([`ConnEvent`]) and [`ShmConnection::poll_timeout`].
//!
//! What it decides: a reply is matched only against requests that went out on this very
//! connection (ids are per connection); a segment is announced once and again after the peer
//! lost its descriptor; a message naming memory is checked against the peer's announced
//! segments before the node sees it; leases of a message nobody takes go back at once; every
//! per-connection bound (requests in flight, segments and their bytes, queued bytes, slot
//! bytes of replies not read yet, time without progress) holds, and a peer that breaks the
//! protocol is disconnected with the reason.

mod body;
mod failures;
mod outbox;
mod receive;
mod unread;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use crate::limits::Limits;
use crate::shm::requests::Outstanding;
use crate::shm::wire::{Body, Control, MAX_DATAGRAM, Record, WireReply, encode};
use crate::transport::RequestKind;
use outbox::Outbox;
use unread::Unread;

pub use failures::{CloseReason, Failure, SendError};
pub use outbox::Transmit;

/// Which end of the connection this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// It connected (after a knock) and sends requests.
    Client,
    /// It accepted, and answers requests.
    Server,
}

/// The bounds of one connection.
#[derive(Clone, Debug)]
pub struct ConnectionConfig {
    /// Which end this is.
    pub role: Role,
    /// The message limits (buffer count, metadata and wire bytes).
    pub limits: Limits,
    /// Requests outstanding (client) or being served (server) at most.
    pub max_in_flight: usize,
    /// Bytes of records and datagrams queued for the peer at most. A request past it is
    /// refused ([`SendError::PeerNotReading`]); a reply past it closes the connection.
    pub max_queued_bytes: u64,
    /// While more than this is queued, a server reads no new requests (the peer is slower
    /// than its own requests).
    pub read_pause_bytes: u64,
    /// While replies the peer has not read yet (queued, or in the queue past its tail) lend
    /// it more than this of our slots, a server reads no new requests; a peer that reads
    /// none of them for `stall_after` meanwhile is disconnected. (A reply in a slot holds
    /// its memory from the moment it is queued, and its record is small: `read_pause_bytes`
    /// does not bound it.) Requests read before the pause are still answered, so the bytes
    /// lent can pass this by the replies to up to `max_in_flight` requests.
    pub read_pause_lent_bytes: u64,
    /// Queued messages that made no progress this long mean the peer stalled: disconnect.
    pub stall_after: Duration,
    /// Peer segments mapped on this connection at most.
    pub max_peer_segments: usize,
    /// The largest peer segment accepted.
    pub max_segment_bytes: u64,
}

impl ConnectionConfig {
    /// The defaults for `role` under `limits`.
    pub fn new(role: Role, limits: Limits) -> Self {
        Self {
            role,
            limits,
            max_in_flight: match role {
                Role::Client => 1 << 16,
                Role::Server => 1024,
            },
            max_queued_bytes: 16 << 20,
            read_pause_bytes: 4 << 20,
            read_pause_lent_bytes: 16 << 20,
            stall_after: Duration::from_secs(5),
            max_peer_segments: 4096,
            max_segment_bytes: 1 << 40,
        }
    }
}

/// What the driver must do.
#[derive(Debug, PartialEq, Eq)]
pub enum ConnEvent {
    /// Map the peer's segment whose descriptor came with the datagram just handled (read-only,
    /// after checking its seals, size and allocation), then call
    /// [`ShmConnection::handle_mapped`].
    Map {
        /// The peer's id for it.
        segment: u64,
        /// Its announced length.
        len: u64,
    },
    /// Drop the mapping of the peer's segment (views still using it keep it alive).
    Unmap {
        /// The segment.
        segment: u64,
    },
    /// A message names a segment not announced yet: receive every datagram waiting on the
    /// socket ([`ShmConnection::handle_datagram`]), then call [`ShmConnection::resume`].
    /// Until then no record is read.
    DrainSocket,
    /// A request to deliver (server); its shared parts lie within segments mapped here.
    Request {
        /// Its id on this connection.
        id: u64,
        /// Ask or tell.
        kind: RequestKind,
        /// The actor path.
        path: String,
        /// Where the message is.
        body: Body,
    },
    /// The answer to a request that went out on this connection (client).
    Reply {
        /// The request's id.
        id: u64,
        /// The request's kind.
        kind: RequestKind,
        /// The answer; a tensor body's shared parts lie within segments mapped here.
        reply: WireReply,
    },
    /// A request that went out on this connection failed (client).
    Failed {
        /// The request's id.
        id: u64,
        /// Its kind.
        kind: RequestKind,
        /// Why.
        why: Failure,
    },
    /// The peer released these leases of ours (the driver checks them against the lease
    /// book: only leases held by this peer's process are given back).
    Released {
        /// The leases.
        leases: Vec<u64>,
    },
    /// The connection is over; nothing more comes out but this.
    Closed(CloseReason),
}

/// How a descriptor that should have come with a datagram arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FdArrival {
    /// None was sent with it.
    None,
    /// It arrived.
    Arrived,
    /// The kernel dropped it (this process is at its descriptor limit: `MSG_CTRUNC`).
    Lost,
}

/// State of a peer segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PeerSegment {
    /// Announced; the driver maps it.
    Mapping { len: u64 },
    /// Mapped.
    Mapped { len: u64 },
}

/// One same-host connection.
#[derive(Debug)]
pub struct ShmConnection {
    config: ConnectionConfig,
    /// Requests sent here and waiting (client).
    outstanding: Outstanding,
    next_id: u64,
    /// Requests received here and not yet answered (server).
    serving: HashMap<u64, RequestKind>,
    /// Our segments the peer was told to map.
    announced: HashSet<u64>,
    /// The peer's segments.
    peer_segments: HashMap<u64, PeerSegment>,
    /// The peer's segments whose descriptor was lost here.
    lost: HashSet<u64>,
    outbox: Outbox,
    /// Replies in our slots whose records the peer has not consumed yet.
    unread: Unread,
    /// Messages received and not handled yet: the first names a segment not announced yet.
    parked: VecDeque<Control>,
    /// Whether the socket was drained for the first parked message.
    drained: bool,
    events: VecDeque<ConnEvent>,
    closed: Option<CloseReason>,
}

impl ShmConnection {
    /// A connection whose hellos were exchanged and checked.
    pub fn new(config: ConnectionConfig) -> Self {
        Self {
            config,
            outstanding: Outstanding::default(),
            next_id: 1,
            serving: HashMap::new(),
            announced: HashSet::new(),
            peer_segments: HashMap::new(),
            lost: HashSet::new(),
            outbox: Outbox::default(),
            unread: Unread::default(),
            parked: VecDeque::new(),
            drained: false,
            events: VecDeque::new(),
            closed: None,
        }
    }

    /// Which end this is.
    pub fn role(&self) -> Role {
        self.config.role
    }

    // ---- sending ----

    /// Sends an ask or tell whose body names `segments` of ours (each `(id, len)`): they are
    /// announced first where the peer has not mapped them. Its id on this connection.
    ///
    /// # Errors
    ///
    /// [`SendError`] saying why nothing was sent.
    pub fn send_request(
        &mut self,
        now: Instant,
        kind: RequestKind,
        path: String,
        body: Body,
        segments: &[(u64, u64)],
        deadline: Option<Instant>,
    ) -> Result<u64, SendError> {
        if let Some(reason) = &self.closed {
            return Err(SendError::Closed(reason.clone()));
        }
        if self.config.role != Role::Client {
            return Err(SendError::WrongRole(self.config.role));
        }
        if deadline.is_some_and(|at| at <= now) {
            return Err(SendError::Deadline);
        }
        if self.outstanding.len() >= self.config.max_in_flight {
            return Err(SendError::TooManyInFlight(self.outstanding.len()));
        }
        if self.outbox.bytes() >= self.config.max_queued_bytes {
            return Err(SendError::PeerNotReading(self.outbox.bytes()));
        }
        let id = self.next_id;
        let record = Record::new(Control::Request {
            id,
            kind,
            path,
            body,
        })
        .map_err(|e| SendError::TooLarge(e.len))?;
        self.next_id += 1;
        self.announce(segments);
        self.outbox.push(Transmit::Record(record), 0);
        self.outstanding.insert(id, kind, deadline);
        Ok(id)
    }

    /// Gives up waiting for request `id` (its caller left): whether it was waiting. A reply
    /// that comes later gives its leases straight back.
    pub fn cancel(&mut self, id: u64) -> bool {
        self.outstanding.remove(id).is_some()
    }

    /// Answers request `id` (server) with `reply`, whose body names `segments` of ours and
    /// lends the peer `lent` bytes of our memory (the capacity of the slots it leases; they
    /// count against `read_pause_lent_bytes` until the peer reads the reply). A reply too
    /// large for one message goes as an error saying so. Whether the request was being
    /// served (an answer for anything else is dropped).
    pub fn send_reply(
        &mut self,
        id: u64,
        reply: WireReply,
        segments: &[(u64, u64)],
        lent: u64,
    ) -> bool {
        if self.closed.is_some() || self.serving.remove(&id).is_none() {
            return false;
        }
        let (record, lent) = match Record::new(Control::Reply { id, reply }) {
            Ok(record) => (record, lent),
            Err(e) => {
                let text = format!(
                    "the reply's control message of {} bytes is larger than {MAX_DATAGRAM}",
                    e.len
                );
                match Record::new(Control::Reply {
                    id,
                    reply: WireReply::Error(text),
                }) {
                    Ok(record) => (record, 0),
                    Err(_) => return false,
                }
            }
        };
        self.announce(segments);
        self.outbox.push(Transmit::Record(record), lent);
        if self.outbox.bytes() > self.config.max_queued_bytes {
            let queued = self.outbox.bytes();
            self.close(CloseReason::NotReading { queued });
        }
        true
    }

    /// Tells the peer it may reuse the memory of these leases of its own (this side dropped
    /// its last view of each).
    pub fn send_releases(&mut self, leases: &[u64]) {
        if self.closed.is_some() {
            return;
        }
        for chunk in leases.chunks((MAX_DATAGRAM - 64) / 8) {
            if let Ok(record) = Record::new(Control::Release {
                leases: chunk.to_vec(),
            }) {
                self.outbox.push(Transmit::Record(record), 0);
            }
        }
    }

    /// Our segment `segment` is gone: the peer unmaps it if it was told to map it.
    pub fn retire(&mut self, segment: u64) {
        if self.closed.is_none()
            && self.announced.remove(&segment)
            && let Ok(record) = Record::new(Control::Retire { segment })
        {
            self.outbox.push(Transmit::Record(record), 0);
        }
    }

    // ---- the driver's progress ----

    /// The next thing to send, in order: the driver sends it, then calls
    /// [`ShmConnection::handle_queued`] (a record) or [`ShmConnection::handle_transmitted`]
    /// (a datagram); if there is no room, it calls [`ShmConnection::handle_blocked`] and
    /// tries again later.
    pub fn poll_transmit(&self) -> Option<&Transmit> {
        self.outbox.front()
    }

    /// The record [`ShmConnection::poll_transmit`] gave is in this side's queue, whose head
    /// (bytes produced into its ring so far) is now `head`: the reply it carries counts as
    /// unread until [`ShmConnection::handle_consumed`] reports a tail at or past `head`.
    pub fn handle_queued(&mut self, head: u64) {
        let lent = self.outbox.pop();
        self.unread.queued(head, lent);
    }

    /// The transmit [`ShmConnection::poll_transmit`] gave was sent (a datagram; a record sent
    /// this way is not tracked until read: a server's driver reports records with
    /// [`ShmConnection::handle_queued`]).
    pub fn handle_transmitted(&mut self) {
        self.outbox.pop();
    }

    /// The peer consumed this side's queue up to `tail` (the word in its header, untrusted:
    /// a tail claimed without reading ends the count as reading would, and the replies are
    /// then the peer's to hold until it releases them — bounded by the node's quota, not per
    /// peer). Call it while [`ShmConnection::reads_pending`] and when reading paused for them
    /// ([`ShmConnection::paused_for_unread`]).
    pub fn handle_consumed(&mut self, tail: u64, now: Instant) {
        let read = self.unread.consumed(tail);
        let paused = self.lent_unread() > self.config.read_pause_lent_bytes;
        self.unread.note(paused, read, now);
    }

    /// Whether replies in our slots wait to be read by the peer.
    pub fn reads_pending(&self) -> bool {
        !self.unread.is_empty()
    }

    /// Whether the peer's `tail` passed a reply still counted as unread (the driver then
    /// calls [`ShmConnection::handle_consumed`]).
    pub fn read_by(&self, tail: u64) -> bool {
        self.unread.read_by(tail)
    }

    /// Whether a server reads no new requests because its replies are not read: too many
    /// bytes queued, or too many of our slots lent by replies not read yet. The driver asks
    /// the peer to signal when it consumes, and looks again then.
    pub fn paused_for_unread(&self) -> bool {
        self.config.role == Role::Server
            && (self.outbox.bytes() > self.config.read_pause_bytes
                || self.lent_unread() > self.config.read_pause_lent_bytes)
    }

    /// Bytes of our slots lent by replies the peer has not read (queued or in the queue).
    fn lent_unread(&self) -> u64 {
        self.outbox.lent() + self.unread.lent()
    }

    /// The queue or the socket had no room for the next transmit.
    pub fn handle_blocked(&mut self, now: Instant) {
        self.outbox.blocked(now);
    }

    /// Bytes queued for the peer.
    pub fn queued_bytes(&self) -> u64 {
        self.outbox.bytes()
    }

    /// Whether the driver should read the peer's queue now: not while a message waits for
    /// the socket to be drained, and (server) not while the peer does not read its replies.
    pub fn wants_records(&self) -> bool {
        self.closed.is_none() && self.parked.is_empty() && !self.paused_for_unread()
    }

    /// Whether nothing is owed either way: no request outstanding or being served, nothing
    /// queued (a graceful close waits for this).
    pub fn is_idle(&self) -> bool {
        self.outstanding.is_empty() && self.serving.is_empty() && self.outbox.is_empty()
    }

    /// Requests outstanding (client) or being served (server).
    pub fn in_flight(&self) -> usize {
        self.outstanding.len() + self.serving.len()
    }

    // ---- time ----

    /// Deadlines passed and stalls noticed by `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.closed.is_some() {
            return;
        }
        for (id, kind) in self.outstanding.expired(now) {
            self.events.push_back(ConnEvent::Failed {
                id,
                kind,
                why: Failure::Deadline,
            });
        }
        if self
            .outbox
            .blocked_since()
            .is_some_and(|since| now.saturating_duration_since(since) >= self.config.stall_after)
        {
            let after = self.config.stall_after;
            self.close(CloseReason::Stalled { after });
            return;
        }
        if self
            .unread
            .stuck_since()
            .is_some_and(|since| now.saturating_duration_since(since) >= self.config.stall_after)
        {
            let after = self.config.stall_after;
            self.close(CloseReason::Stalled { after });
        }
    }

    /// When [`ShmConnection::handle_timeout`] has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.closed.is_some() {
            return None;
        }
        let since = match (self.outbox.blocked_since(), self.unread.stuck_since()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let stall = since.map(|since| since + self.config.stall_after);
        match (self.outstanding.next_deadline(), stall) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    // ---- the end ----

    /// Closes it: every outstanding request fails with `reason`, nothing more is sent.
    pub fn close(&mut self, reason: CloseReason) {
        if self.closed.is_some() {
            return;
        }
        for (id, kind) in self.outstanding.drain() {
            self.events.push_back(ConnEvent::Failed {
                id,
                kind,
                why: Failure::Closed(reason.clone()),
            });
        }
        self.serving.clear();
        self.outbox.clear();
        self.unread.clear();
        self.parked.clear();
        self.closed = Some(reason.clone());
        self.events.push_back(ConnEvent::Closed(reason));
    }

    /// Why it closed, if it did.
    pub fn closed(&self) -> Option<&CloseReason> {
        self.closed.as_ref()
    }

    /// The next thing the driver must do.
    pub fn poll_event(&mut self) -> Option<ConnEvent> {
        self.events.pop_front()
    }

    /// Queues `Map` for each of `segments` the peer has not been told to map.
    fn announce(&mut self, segments: &[(u64, u64)]) {
        for &(segment, len) in segments {
            if self.announced.insert(segment)
                && let Ok(datagram) = encode(&Control::Map { segment, len })
            {
                self.outbox.push(Transmit::Map { datagram, segment }, 0);
            }
        }
    }
}
