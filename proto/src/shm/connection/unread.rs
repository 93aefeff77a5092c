//! Replies lent in shared memory that the peer has not read yet. A reply in a slot holds this
//! node's memory from the moment it is queued, and its record is a few dozen bytes: the bytes
//! queued for the peer do not bound it. Each such reply is kept here with where its record
//! ends in this side's queue until the peer's tail (how far it consumed) passes it, so a server
//! stops reading the requests of a peer that does not read its replies by the slot bytes they
//! hold too.

use std::collections::VecDeque;
use std::time::Instant;

#[derive(Debug, Default)]
pub(super) struct Unread {
    /// `(queue head after the record, bytes of our slots it lends)`, in queue order.
    records: VecDeque<(u64, u64)>,
    lent: u64,
    /// Since when reading has been paused for them without the peer reading any.
    stuck_since: Option<Instant>,
}

impl Unread {
    /// A record lending `lent` bytes went into the queue, which now ends at `end`.
    pub(super) fn queued(&mut self, end: u64, lent: u64) {
        if lent > 0 {
            self.records.push_back((end, lent));
            self.lent += lent;
        }
    }

    /// The peer consumed the queue up to `tail`: the replies before it are read. Whether any
    /// were.
    pub(super) fn consumed(&mut self, tail: u64) -> bool {
        let mut read = false;
        while let Some(&(end, lent)) = self.records.front() {
            if end > tail {
                break;
            }
            self.records.pop_front();
            self.lent -= lent;
            read = true;
        }
        read
    }

    /// Whether the peer's `tail` passed a reply not counted as read yet.
    pub(super) fn read_by(&self, tail: u64) -> bool {
        self.records.front().is_some_and(|&(end, _)| end <= tail)
    }

    /// Bytes of our slots lent by replies not read yet.
    pub(super) fn lent(&self) -> u64 {
        self.lent
    }

    pub(super) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Reading is `paused` (or not) for these replies at `now`, and the peer read some
    /// (`progressed`) or none since the last look: the time it has been stuck restarts on
    /// progress and ends with the pause.
    pub(super) fn note(&mut self, paused: bool, progressed: bool, now: Instant) {
        if !paused {
            self.stuck_since = None;
        } else if progressed || self.stuck_since.is_none() {
            self.stuck_since = Some(now);
        }
    }

    /// Since when the peer has read none of them while reading was paused for them.
    pub(super) fn stuck_since(&self) -> Option<Instant> {
        self.stuck_since
    }

    pub(super) fn clear(&mut self) {
        self.records.clear();
        self.lent = 0;
        self.stuck_since = None;
    }
}
