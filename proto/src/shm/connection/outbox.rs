//! What waits to go to the peer, in order, with its bytes counted (and the bytes of our slots
//! each reply lends) and the time it last made no progress.

use std::collections::VecDeque;
use std::time::Instant;

/// One thing to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transmit {
    /// A control message for this side's queue.
    Record(Vec<u8>),
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
    /// The message's bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Self::Record(bytes) => bytes,
            Self::Map { datagram, .. } => datagram,
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
        self.bytes += transmit.bytes().len() as u64;
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
        self.bytes -= sent.bytes().len() as u64;
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
