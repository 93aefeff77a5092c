//! What waits to go to the peer, in order, with its bytes counted (and the bytes of our slots
//! each reply lends) and the time it last made no progress.

use std::collections::VecDeque;
use std::time::Instant;

use crate::shm::wire::Record;

/// One thing to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transmit {
    /// A control message for this side's queue, written straight into it.
    Record(Record),
    /// A `Map` datagram for the socket, with the read-only descriptor of our segment
    /// `segment` beside it. Records after it wait until it is sent, so the peer always has
    /// the segment before a message names it.
    Map {
        /// The datagram.
        datagram: Vec<u8>,
        /// Which of our segments goes with it.
        segment: u64,
    },
}

impl Transmit {
    /// The message's length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Self::Record(record) => record.len(),
            Self::Map { datagram, .. } => datagram.len(),
        }
    }

    /// Never: every message has a magic and a tag.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The message's bytes, in a vector of their own (a record is otherwise written straight
    /// into the queue: [`Record::write_to`]).
    pub fn to_vec(&self) -> Vec<u8> {
        match self {
            Self::Record(record) => record.to_vec(),
            Self::Map { datagram, .. } => datagram.clone(),
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Outbox {
    /// Each transmit with the bytes of our slots it lends (a reply in shared memory).
    queue: VecDeque<(Transmit, u64)>,
    bytes: u64,
    lent: u64,
    blocked_since: Option<Instant>,
}

impl Outbox {
    pub(super) fn push(&mut self, transmit: Transmit, lent: u64) {
        self.bytes += transmit.len() as u64;
        self.lent += lent;
        self.queue.push_back((transmit, lent));
    }

    pub(super) fn front(&self) -> Option<&Transmit> {
        self.queue.front().map(|(transmit, _)| transmit)
    }

    /// The front went out (progress): the bytes of our slots it lends.
    pub(super) fn pop(&mut self) -> u64 {
        self.blocked_since = None;
        let Some((sent, lent)) = self.queue.pop_front() else {
            return 0;
        };
        self.bytes -= sent.len() as u64;
        self.lent -= lent;
        lent
    }

    /// The front could not go out (no room).
    pub(super) fn blocked(&mut self, now: Instant) {
        if !self.queue.is_empty() {
            self.blocked_since.get_or_insert(now);
        }
    }

    pub(super) fn blocked_since(&self) -> Option<Instant> {
        self.blocked_since
    }

    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Bytes of our slots the queued replies lend.
    pub(super) fn lent(&self) -> u64 {
        self.lent
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub(super) fn clear(&mut self) {
        self.queue.clear();
        self.bytes = 0;
        self.lent = 0;
        self.blocked_since = None;
    }
}
