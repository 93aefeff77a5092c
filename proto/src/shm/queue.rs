//! The queue format: how control messages travel between the two ends of a same-host
//! connection without a system call per message.
//!
//! Each end owns one memfd, which it maps writable and the other end maps read-only: every
//! byte has exactly one writer. It holds a header page and then a ring this end produces into:
//!
//! ```text
//! offset  0   magic "TWSQ" (u32 LE), version u32 = 1, ring bytes u32      (written once)
//! offset 64   head:     u64  bytes this end has produced into its ring (only grows)
//! offset 128  tail:     u64  bytes this end has consumed of the PEER's ring (only grows)
//! offset 192  sleeping: u32  1 while this end's consumer may sleep: the producer must ring
//! offset 256  blocked:  u32  1 while this end's producer waits for room: the consumer must
//!                            ring once it consumed
//! offset 4096 ring      `ring bytes` bytes (a power of two)
//! ```
//!
//! A record is `len:u32 LE`, four bytes of zero, then `len` bytes of one control message
//! (`wire.rs`), padded to a multiple of 8; records never wrap: one that does not fit before the
//! ring's end is preceded by the marker `len = u32::MAX` and starts again at offset 0. The
//! consumer copies a record out before decoding it (the producer could change it meanwhile)
//! and checks every index it reads from the peer's memory ([`read_step`]). Each end rings the
//! other (a `Bell` datagram on the connection's socket) only when the other said it may sleep
//! (or is blocked): a busy conversation makes no system call.
//!
//! This module is the format and its checks, as pure functions; the engine owns the memory.

use crate::shm::identity::Refusal;
use crate::shm::wire::MAX_DATAGRAM;

/// The magic at the start of a queue file.
pub const QUEUE_MAGIC: &[u8; 4] = b"TWSQ";
/// The format version at offset 4.
pub const QUEUE_VERSION: u32 = 1;
/// Bytes before the ring.
pub const QUEUE_HEADER: usize = 4096;
/// Where the producer index is.
pub const HEAD_AT: usize = 64;
/// Where the consumer index (of the peer's ring) is.
pub const TAIL_AT: usize = 128;
/// Where the consumer's "may sleep, ring me" flag is.
pub const SLEEPING_AT: usize = 192;
/// Where the producer's "blocked, ring me" flag is.
pub const BLOCKED_AT: usize = 256;
/// Bytes before a record's message.
pub const RECORD_HEADER: usize = 8;
/// The largest message a record carries.
pub const MAX_RECORD: usize = MAX_DATAGRAM;
/// The length that marks a wrap to the ring's start.
pub const WRAP: u32 = u32::MAX;

/// A ring's size, as one end announces it in its hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueShape {
    /// The ring's bytes.
    pub bytes: u32,
}

impl QueueShape {
    /// The smallest ring accepted (four of the largest records).
    pub const MIN: u32 = 256 << 10;
    /// The largest ring accepted.
    pub const MAX: u32 = 16 << 20;
    /// What a node creates unless told otherwise.
    pub const DEFAULT: Self = Self { bytes: 1 << 20 };

    /// Checks a size a peer announced.
    ///
    /// # Errors
    ///
    /// [`Refusal::BadQueue`] unless it is a power of two in `MIN..=MAX`.
    pub fn check(self, bytes: u32) -> Result<(), Refusal> {
        if bytes.is_power_of_two() && (Self::MIN..=Self::MAX).contains(&bytes) {
            Ok(())
        } else {
            Err(Refusal::BadQueue {
                bytes,
                min: Self::MIN,
                max: Self::MAX,
            })
        }
    }

    /// The size of the memfd holding a ring of `bytes`.
    pub fn file_len(bytes: u32) -> u64 {
        QUEUE_HEADER as u64 + u64::from(bytes)
    }
}

/// Where a record of `len` message bytes goes in a ring of `ring` bytes whose head is at `head`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Where a wrap marker must be written first (the record does not fit before the end).
    pub wrap_at: Option<u64>,
    /// The ring offset where the record header goes.
    pub start: usize,
    /// The head after it.
    pub next_head: u64,
}

impl Placement {
    /// Bytes of the ring it takes (marker padding included).
    pub fn taken(&self, head: u64) -> u64 {
        self.next_head - head
    }
}

/// Where a record of `len` message bytes goes, or `None` if `len` is over [`MAX_RECORD`].
pub fn place(head: u64, ring: u32, len: usize) -> Option<Placement> {
    if len > MAX_RECORD {
        return None;
    }
    let ring = u64::from(ring);
    let size = record_size(len);
    let at = head % ring;
    if at + size <= ring {
        return Some(Placement {
            wrap_at: None,
            start: usize::try_from(at).ok()?,
            next_head: head + size,
        });
    }
    let wrapped = head + (ring - at);
    Some(Placement {
        wrap_at: Some(head),
        start: 0,
        next_head: wrapped + size,
    })
}

/// Ring bytes a record of `len` message bytes takes (header and padding included).
pub fn record_size(len: usize) -> u64 {
    (RECORD_HEADER as u64 + len as u64).next_multiple_of(8)
}

/// What the consumer finds at its tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing new.
    Empty,
    /// A wrap marker: the next record is at `next_tail`.
    Wrap {
        /// The tail after the marker.
        next_tail: u64,
    },
    /// A record: `len` message bytes at ring offset `start + RECORD_HEADER`.
    Record {
        /// The ring offset of the record header.
        start: usize,
        /// The message's bytes.
        len: usize,
        /// The tail after it.
        next_tail: u64,
    },
}

/// How the peer broke the queue format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The producer's head is behind the consumer, or more than a ring ahead of it.
    #[error("the peer's queue head {head} is not within one ring ahead of its tail {tail}")]
    HeadOutOfRange {
        /// The head read.
        head: u64,
        /// The consumer's tail.
        tail: u64,
    },
    /// The consumer's tail is ahead of the producer, or more than a ring behind it.
    #[error("the peer's queue tail {tail} is not within one ring behind this head {head}")]
    TailOutOfRange {
        /// The tail read.
        tail: u64,
        /// The producer's head.
        head: u64,
    },
    /// A record is longer than allowed or than what was produced.
    #[error("a queue record of {len} bytes does not fit what the peer produced or allows")]
    BadRecord {
        /// The length read.
        len: u32,
    },
}

/// The consumer's next step, from its `tail`, the producer's `head` (read from the peer's
/// memory) and the length word at the tail (read only if the ring is not empty).
///
/// # Errors
///
/// [`QueueError`] if the indices or the length cannot have come from a correct producer.
pub fn read_step(
    tail: u64,
    head: u64,
    ring: u32,
    len_at_tail: impl FnOnce(usize) -> u32,
) -> Result<Step, QueueError> {
    let ring64 = u64::from(ring);
    if head < tail || head - tail > ring64 {
        return Err(QueueError::HeadOutOfRange { head, tail });
    }
    if head == tail {
        return Ok(Step::Empty);
    }
    let at = tail % ring64;
    let start = usize::try_from(at).map_err(|_| QueueError::HeadOutOfRange { head, tail })?;
    let len = len_at_tail(start);
    let available = head - tail;
    if len == WRAP {
        let next_tail = tail + (ring64 - at);
        if next_tail > head {
            return Err(QueueError::BadRecord { len });
        }
        return Ok(Step::Wrap { next_tail });
    }
    let len_usize = len as usize;
    let size = record_size(len_usize);
    if len_usize > MAX_RECORD || size > available || at + size > ring64 {
        return Err(QueueError::BadRecord { len });
    }
    Ok(Step::Record {
        start,
        len: len_usize,
        next_tail: tail + size,
    })
}

/// Bytes free for the producer, from its `head` and the consumer's `tail` (read from the
/// peer's memory).
///
/// # Errors
///
/// [`QueueError::TailOutOfRange`] if the tail cannot have come from a correct consumer.
pub fn room(head: u64, tail: u64, ring: u32) -> Result<u64, QueueError> {
    let ring = u64::from(ring);
    if tail > head || head - tail > ring {
        return Err(QueueError::TailOutOfRange { tail, head });
    }
    Ok(ring - (head - tail))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RING: u32 = 1 << 18;

    #[test]
    fn a_record_fits_where_the_head_is_and_is_padded_to_eight_bytes() {
        let p = place(16, RING, 13).unwrap();
        assert_eq!(p.wrap_at, None);
        assert_eq!(p.start, 16);
        assert_eq!(p.next_head, 16 + 24, "8 header + 13, padded to 24");
    }

    #[test]
    fn a_record_that_does_not_fit_before_the_end_wraps_behind_a_marker() {
        let head = u64::from(RING) * 3 - 16;
        let p = place(head, RING, 100).unwrap();
        assert_eq!(p.wrap_at, Some(head));
        assert_eq!(p.start, 0);
        assert_eq!(p.next_head, u64::from(RING) * 3 + 112);
        assert_eq!(p.taken(head), 16 + 112);
    }

    #[test]
    fn a_record_over_the_largest_message_is_not_placed() {
        assert!(place(0, RING, MAX_RECORD + 1).is_none());
        assert!(place(0, RING, MAX_RECORD).is_some());
    }

    #[test]
    fn the_consumer_reads_what_the_producer_placed_in_order() {
        let mut head = u64::from(RING) - 24;
        let mut lens = std::collections::HashMap::new();
        let mut placed = Vec::new();
        for len in [5, 200, 4000] {
            let p = place(head, RING, len).unwrap();
            if let Some(at) = p.wrap_at {
                lens.insert(at % u64::from(RING), WRAP);
            }
            lens.insert(p.start as u64, u32::try_from(len).unwrap());
            placed.push((p.start, len));
            head = p.next_head;
        }
        let mut tail = u64::from(RING) - 24;
        let mut read = Vec::new();
        loop {
            match read_step(tail, head, RING, |at| lens[&(at as u64)]).unwrap() {
                Step::Empty => break,
                Step::Wrap { next_tail } => tail = next_tail,
                Step::Record {
                    start,
                    len,
                    next_tail,
                } => {
                    read.push((start, len));
                    tail = next_tail;
                }
            }
        }
        assert_eq!(read, placed);
    }

    #[test]
    fn indices_a_correct_peer_cannot_produce_are_refused() {
        let ring = u64::from(RING);
        let never = |_| panic!("the length must not be read");
        assert!(matches!(
            read_step(100, 50, RING, never),
            Err(QueueError::HeadOutOfRange { .. })
        ));
        assert!(matches!(
            read_step(0, ring + 8, RING, never),
            Err(QueueError::HeadOutOfRange { .. })
        ));
        assert!(matches!(
            read_step(0, 64, RING, |_| 1 << 20),
            Err(QueueError::BadRecord { .. })
        ));
        assert!(matches!(
            read_step(0, 16, RING, |_| 100),
            Err(QueueError::BadRecord { .. })
        ));
        assert!(
            matches!(
                read_step(0, 64, RING, |_| WRAP),
                Err(QueueError::BadRecord { .. })
            ),
            "a wrap marker whose skip passes the head"
        );
        assert!(matches!(
            room(100, 200, RING),
            Err(QueueError::TailOutOfRange { .. })
        ));
        assert!(matches!(
            room(ring + 200, 100, RING),
            Err(QueueError::TailOutOfRange { .. })
        ));
        assert_eq!(room(ring + 100, 100, RING), Ok(0));
        assert_eq!(room(300, 100, RING), Ok(ring - 200));
    }

    #[test]
    fn a_record_that_would_run_past_the_ring_end_is_refused() {
        let ring = u64::from(RING);
        let tail = ring - 16;
        let got = read_step(tail, tail + 64, RING, |_| 40);
        assert!(matches!(got, Err(QueueError::BadRecord { len: 40 })));
    }
}
