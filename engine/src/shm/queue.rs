//! The two queues of a same-host connection, in memory (the format and its checks are
//! `tensorwire_proto::shm::queue`): this side's file, which it maps writable and produces into,
//! and the peer's, which it maps read-only and consumes from. Every byte has one writer; every
//! index read from the peer's memory is checked before it is used, and a record is copied out
//! before anything reads it.
//!
//! Signalling costs no system call while both sides are busy: a producer rings the consumer
//! (a `Bell` datagram on the connection's socket) only when the consumer said it may sleep, and
//! a consumer rings the producer only when the producer said it is blocked (it waits for room, or for the peer to
//! read the replies it queued: [`OwnQueue::await_consumption`]). Both flags follow the same
//! order — set the flag, full fence, look again — so a wake-up is never lost.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

use tensorwire_proto::shm::QueueError;
use tensorwire_proto::shm::queue::{
    BLOCKED_AT, HEAD_AT, QUEUE_HEADER, QUEUE_MAGIC, QUEUE_VERSION, QueueShape, RECORD_HEADER,
    SLEEPING_AT, Step, TAIL_AT, WRAP, place, read_step, room,
};

use crate::shm::os::{self, FileMap};

/// This side's queue file: the ring it produces into, and its consumer's index and flags.
pub(crate) struct OwnQueue {
    fd: OwnedFd,
    map: FileMap,
    ring: u32,
    /// Bytes produced (published up to here once `publish` ran).
    head: u64,
    /// Bytes of the peer's ring consumed (published with `commit`).
    tail: u64,
    /// The peer's tail in this side's ring as last read (checked then; it only grows): room
    /// reckoned from it is never more than there is, so the peer's word — a line the peer
    /// wrote, read across the CPUs — is read again only when that room is too small.
    peer_tail: u64,
}

/// Sets a flag word of ours to 0 unless it is 0 already.
fn clear(word: &AtomicU32) {
    if word.load(Ordering::Relaxed) != 0 {
        word.store(0, Ordering::Relaxed);
    }
}

/// The peer's queue file, mapped read-only.
pub(crate) struct PeerQueue {
    map: FileMap,
    ring: u32,
}

/// A record could not be queued: the ring has no room now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Full;

impl OwnQueue {
    /// A new queue file with a ring of `ring` bytes (a power of two in the accepted range),
    /// reserved, sealed against resizing and against new writable mappings, and mapped
    /// writable here.
    pub(crate) fn create(ring: u32) -> std::io::Result<Self> {
        let len = QueueShape::file_len(ring);
        let fd = os::memfd("tensorwire-queue", len)?;
        let size = usize::try_from(len).map_err(|_| std::io::Error::other("queue too large"))?;
        let map = FileMap::new(fd.as_raw_fd(), 0, size, true, true)?;
        // Only this mapping may write: a read-only descriptor a peer re-opens writable through
        // /proc cannot map it writable or write(2) it.
        os::add_seals(fd.as_raw_fd(), os::SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL)?;
        let queue = Self {
            fd,
            map,
            ring,
            head: 0,
            tail: 0,
            peer_tail: 0,
        };
        // SAFETY: the header lies within the mapping (the file is QUEUE_HEADER + ring bytes)
        // and this side is its only writer; nothing reads it until the peer gets the file.
        unsafe {
            let base = queue.map.as_ptr();
            std::ptr::copy_nonoverlapping(QUEUE_MAGIC.as_ptr(), base, 4);
            std::ptr::copy_nonoverlapping(QUEUE_VERSION.to_le_bytes().as_ptr(), base.add(4), 4);
            std::ptr::copy_nonoverlapping(ring.to_le_bytes().as_ptr(), base.add(8), 4);
        }
        Ok(queue)
    }

    /// The descriptor the peer gets: read-only.
    pub(crate) fn share(&self) -> std::io::Result<OwnedFd> {
        os::read_only(self.fd.as_raw_fd())
    }

    /// The ring's bytes.
    pub(crate) fn ring(&self) -> u32 {
        self.ring
    }

    /// Writes one record (the bytes of one control message) at the head, if the peer has
    /// consumed enough; it is visible to the peer after [`OwnQueue::publish`].
    ///
    /// # Errors
    ///
    /// `Ok(Err(Full))` when there is no room now; `Err` when the peer's tail is impossible.
    #[cfg(test)]
    pub(crate) fn push(
        &mut self,
        peer: &PeerQueue,
        record: &[u8],
    ) -> Result<Result<(), Full>, QueueError> {
        self.push_with(peer, record.len(), |out| out.copy_from_slice(record))
    }

    /// Places a record of `len` bytes at the head, if the peer has consumed enough, and has
    /// `write` fill it in place (`write` gets exactly `len` bytes of the ring; what it leaves
    /// is zeros from before or older records, never another process's bytes); it is visible
    /// to the peer after [`OwnQueue::publish`].
    ///
    /// # Errors
    ///
    /// As [`OwnQueue::push`].
    pub(crate) fn push_with(
        &mut self,
        peer: &PeerQueue,
        len: usize,
        write: impl FnOnce(&mut [u8]),
    ) -> Result<Result<(), Full>, QueueError> {
        let Some(placement) = place(self.head, self.ring, len) else {
            return Err(QueueError::BadRecord {
                len: u32::try_from(len).unwrap_or(u32::MAX),
            });
        };
        let need = placement.taken(self.head);
        if need > room(self.head, self.peer_tail, self.ring)? {
            let tail = peer.word(TAIL_AT).load(Ordering::Acquire);
            if need > room(self.head, tail, self.ring)? {
                return Ok(Err(Full));
            }
            self.peer_tail = tail;
        }
        crate::phase_marks::mark(crate::phase_marks::Phase::RecordWrite);
        let ring = self.ring_ptr();
        let len32 = u32::try_from(len).unwrap_or(u32::MAX);
        // SAFETY: `place` put the record (header, bytes, padding) and any wrap marker inside
        // the ring, in bytes the peer has consumed (`room`): this side is their only writer
        // (the peer maps the file read-only, sealed against new writable mappings), the peer
        // does not read them before the head is published past them, and `&mut self` keeps
        // every other writer of this process out while `write` holds the slice.
        let record = unsafe {
            if let Some(at) = placement.wrap_at {
                let at = usize::try_from(at % u64::from(self.ring)).unwrap_or(0);
                std::ptr::copy_nonoverlapping(WRAP.to_le_bytes().as_ptr(), ring.add(at), 4);
            }
            let at = ring.add(placement.start);
            std::ptr::copy_nonoverlapping(len32.to_le_bytes().as_ptr(), at, 4);
            std::ptr::write_bytes(at.add(4), 0, 4);
            std::slice::from_raw_parts_mut(at.add(RECORD_HEADER), len)
        };
        write(record);
        self.head = placement.next_head;
        Ok(Ok(()))
    }

    /// Makes what was pushed visible; whether the peer must be rung (it said it may sleep).
    pub(crate) fn publish(&mut self, peer: &PeerQueue) -> bool {
        let word = self.word(HEAD_AT);
        if word.load(Ordering::Relaxed) == self.head {
            return false;
        }
        word.store(self.head, Ordering::Release);
        crate::phase_marks::mark(crate::phase_marks::Phase::Published);
        fence(Ordering::SeqCst);
        peer.word32(SLEEPING_AT).load(Ordering::Relaxed) != 0
    }

    /// Reads the next record of the peer's ring into `out` (replacing its contents): its
    /// length, or `None` if the ring is empty.
    ///
    /// # Errors
    ///
    /// The peer's indices or record lengths are impossible (it broke the format).
    pub(crate) fn pop(
        &mut self,
        peer: &PeerQueue,
        out: &mut Vec<u8>,
    ) -> Result<Option<usize>, QueueError> {
        loop {
            let head = peer.word(HEAD_AT).load(Ordering::Acquire);
            let ring = peer.ring_ptr();
            let step = read_step(self.tail, head, peer.ring, |at| {
                // SAFETY: `read_step` asks only for an 8-byte-aligned offset inside the ring.
                let word = unsafe { &*(ring.add(at).cast::<AtomicU32>()) };
                word.load(Ordering::Relaxed)
            })?;
            match step {
                Step::Empty => return Ok(None),
                Step::Wrap { next_tail } => self.tail = next_tail,
                Step::Record {
                    start,
                    len,
                    next_tail,
                } => {
                    out.clear();
                    out.reserve(len);
                    // SAFETY: `read_step` checked that the record lies inside the ring and
                    // within what the peer published; the bytes are copied into memory of
                    // ours before anything reads them (the peer could change them meanwhile).
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            ring.add(start + RECORD_HEADER),
                            out.as_mut_ptr(),
                            len,
                        );
                        out.set_len(len);
                    }
                    self.tail = next_tail;
                    crate::phase_marks::mark(crate::phase_marks::Phase::Popped);
                    return Ok(Some(len));
                }
            }
        }
    }

    /// Makes the records consumed so far free for the peer; whether it must be rung (it said
    /// it waits for room).
    pub(crate) fn commit(&mut self, peer: &PeerQueue) -> bool {
        let word = self.word(TAIL_AT);
        if word.load(Ordering::Relaxed) == self.tail {
            return false;
        }
        word.store(self.tail, Ordering::Release);
        fence(Ordering::SeqCst);
        peer.word32(BLOCKED_AT).load(Ordering::Relaxed) != 0
    }

    /// Whether the peer has published records not consumed yet.
    pub(crate) fn has_input(&self, peer: &PeerQueue) -> bool {
        peer.word(HEAD_AT).load(Ordering::Acquire) != self.tail
    }

    /// Bytes of the peer's ring consumed here (published to the peer by `commit`).
    pub(crate) fn tail(&self) -> u64 {
        self.tail
    }

    /// Says this side's consumer may sleep (the peer rings it from now on), then looks once
    /// more: `true` if input arrived meanwhile (the caller must not sleep).
    pub(crate) fn may_sleep(&self, peer: &PeerQueue) -> bool {
        self.word32(SLEEPING_AT).store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.has_input(peer)
    }

    /// Whether the peer was told to ring this side (its consumer may sleep).
    pub(crate) fn may_ring(&self) -> bool {
        self.word32(SLEEPING_AT).load(Ordering::Relaxed) != 0
    }

    /// This side's consumer is awake again (the peer stops ringing it). Written only when it
    /// changes: a store of the same value would still take the line from the peer, whose
    /// next publish then reads it across the CPUs.
    pub(crate) fn awake(&self) {
        clear(self.word32(SLEEPING_AT));
    }

    /// Says this side's producer waits for room (the peer rings it once it consumed), then
    /// looks once more: `true` if room came meanwhile.
    pub(crate) fn blocked(&self, peer: &PeerQueue, record_len: usize) -> bool {
        self.word32(BLOCKED_AT).store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let tail = peer.word(TAIL_AT).load(Ordering::Acquire);
        let need = place(self.head, self.ring, record_len).map(|p| p.taken(self.head));
        matches!((room(self.head, tail, self.ring), need), (Ok(free), Some(need)) if need <= free)
    }

    /// Bytes produced into this side's ring so far (published or not).
    pub(crate) fn head(&self) -> u64 {
        self.head
    }

    /// How far the peer says it consumed this side's ring (untrusted: a number to compare).
    pub(crate) fn consumed(&self, peer: &PeerQueue) -> u64 {
        peer.word(TAIL_AT).load(Ordering::Acquire)
    }

    /// Says this side waits for the peer to consume (it rings once it did), then reads how
    /// far it has: the caller compares that with what it waited for.
    pub(crate) fn await_consumption(&self, peer: &PeerQueue) -> u64 {
        self.word32(BLOCKED_AT).store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.consumed(peer)
    }

    /// This side no longer waits for the peer to consume (for room or for reading); written
    /// only when it changes, as in `awake`.
    pub(crate) fn unblocked(&self) {
        clear(self.word32(BLOCKED_AT));
    }

    fn ring_ptr(&self) -> *mut u8 {
        // SAFETY: the mapping is QUEUE_HEADER + ring bytes long.
        unsafe { self.map.as_ptr().add(QUEUE_HEADER) }
    }

    fn word(&self, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is one of the header's 8-byte-aligned offsets inside the mapping (page
        // aligned), which lives as long as `self`; only atomics touch these words.
        unsafe { &*(self.map.as_ptr().add(at).cast::<AtomicU64>()) }
    }

    fn word32(&self, at: usize) -> &AtomicU32 {
        // SAFETY: as in `word`, for a 4-byte-aligned offset of the header.
        unsafe { &*(self.map.as_ptr().add(at).cast::<AtomicU32>()) }
    }
}

impl PeerQueue {
    /// Bytes the peer has published into its ring (a look, not a check: compare it with what
    /// was consumed, never use it as an index).
    pub(crate) fn published(&self) -> u64 {
        self.word(HEAD_AT).load(Ordering::Acquire)
    }

    /// Maps the peer's queue file read-only after checking it: a sealed memfd of exactly the
    /// size its ring of `ring` bytes needs, whose pages are all allocated (a sparse file would
    /// make this side commit memory by reading it), with the right header.
    ///
    /// # Errors
    ///
    /// Why the file is refused.
    pub(crate) fn open(fd: &OwnedFd, ring: u32) -> Result<Self, String> {
        let raw = fd.as_raw_fd();
        let len = QueueShape::file_len(ring);
        let file = os::check_segment(raw, len)?;
        if file.size != len {
            return Err(format!(
                "the peer's queue file has {} bytes, not {len}",
                file.size
            ));
        }
        let size = usize::try_from(len).map_err(|_| "the peer's queue is too large".to_owned())?;
        let map = FileMap::new(raw, 0, size, false, false)
            .map_err(|e| format!("mmap of the peer's queue: {e}"))?;
        let header = &map.as_slice()[..12];
        if &header[..4] != QUEUE_MAGIC
            || header[4..8] != QUEUE_VERSION.to_le_bytes()
            || header[8..12] != ring.to_le_bytes()
        {
            return Err("the peer's queue file has a wrong header".into());
        }
        Ok(Self { map, ring })
    }

    fn ring_ptr(&self) -> *const u8 {
        // SAFETY: the mapping is QUEUE_HEADER + ring bytes long.
        unsafe { self.map.as_ptr().add(QUEUE_HEADER) }
    }

    fn word(&self, at: usize) -> &AtomicU64 {
        // SAFETY: an 8-byte-aligned offset of the header inside the (read-only) mapping,
        // which lives as long as `self`; atomics here are only ever loaded.
        unsafe { &*(self.map.as_ptr().add(at).cast::<AtomicU64>()) }
    }

    fn word32(&self, at: usize) -> &AtomicU32 {
        // SAFETY: as in `word`, for a 4-byte-aligned offset; only loaded.
        unsafe { &*(self.map.as_ptr().add(at).cast::<AtomicU32>()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ends joined as in a connection: each maps its own file writable and the other's
    /// read-only (through the descriptor it would get over the socket).
    fn pair() -> (OwnQueue, PeerQueue, OwnQueue, PeerQueue) {
        let ring = QueueShape::MIN;
        let a = OwnQueue::create(ring).unwrap();
        let b = OwnQueue::create(ring).unwrap();
        let a_seen_by_b = PeerQueue::open(&a.share().unwrap(), ring).unwrap();
        let b_seen_by_a = PeerQueue::open(&b.share().unwrap(), ring).unwrap();
        (a, b_seen_by_a, b, a_seen_by_b)
    }

    #[test]
    fn records_go_through_in_order_across_wraps() {
        let (mut a, b_from_a, mut b, a_from_b) = pair();
        let mut out = Vec::new();
        let mut sent = 0u32;
        let mut received = 0u32;
        while received < 5000 {
            while sent < 5000 {
                let record = vec![u8::try_from(sent % 251).unwrap(); (sent as usize * 37) % 3000];
                match a.push(&b_from_a, &record).unwrap() {
                    Ok(()) => sent += 1,
                    Err(Full) => break,
                }
            }
            a.publish(&b_from_a);
            while let Some(len) = b.pop(&a_from_b, &mut out).unwrap() {
                assert_eq!(len, (received as usize * 37) % 3000);
                assert!(
                    out.iter()
                        .all(|&x| x == u8::try_from(received % 251).unwrap())
                );
                received += 1;
            }
            b.commit(&a_from_b);
        }
    }

    #[test]
    fn a_producer_rings_only_a_consumer_that_may_sleep() {
        let (mut a, b_from_a, b, a_from_b) = pair();
        a.push(&b_from_a, b"one").unwrap().unwrap();
        assert!(!a.publish(&b_from_a), "the consumer is awake");
        assert!(
            b.may_sleep(&a_from_b),
            "input came: the consumer must not sleep"
        );
        b.awake();
        let mut b = b;
        let mut out = Vec::new();
        b.pop(&a_from_b, &mut out).unwrap();
        b.commit(&a_from_b);
        assert!(!b.may_sleep(&a_from_b), "nothing new: it may sleep");
        a.push(&b_from_a, b"two").unwrap().unwrap();
        assert!(a.publish(&b_from_a), "it sleeps: ring it");
    }

    #[test]
    fn a_full_ring_refuses_and_the_consumer_rings_a_blocked_producer() {
        let (mut a, b_from_a, mut b, a_from_b) = pair();
        let record = vec![7u8; 60_000];
        let mut pushed = 0;
        while a.push(&b_from_a, &record).unwrap().is_ok() {
            pushed += 1;
        }
        assert_eq!(pushed, 4, "a 256 KiB ring holds four records of ~60 KB");
        a.publish(&b_from_a);
        assert!(!a.blocked(&b_from_a, record.len()));
        let mut out = Vec::new();
        b.pop(&a_from_b, &mut out).unwrap();
        b.pop(&a_from_b, &mut out).unwrap();
        assert!(
            b.commit(&a_from_b),
            "the producer said it is blocked: ring it"
        );
        a.unblocked();
    }

    #[test]
    fn a_peer_queue_that_is_not_what_it_claims_is_refused() {
        let ring = QueueShape::MIN;
        let a = OwnQueue::create(ring).unwrap();
        let shared = a.share().unwrap();
        assert!(PeerQueue::open(&shared, ring * 2).is_err(), "another size");
        // A memfd sealed like a queue but with garbage in its header.
        let plain = os::memfd("not-a-queue", QueueShape::file_len(ring)).unwrap();
        os::add_seals(plain.as_raw_fd(), os::SEAL_FUTURE_WRITE).unwrap();
        let refused = PeerQueue::open(&plain, ring).err();
        assert!(
            refused.is_some_and(|why| why.contains("header") || why.contains("seals")),
            "no header"
        );
    }

    #[test]
    fn only_the_owner_can_write_its_queue_even_through_a_reopened_descriptor() {
        let a = OwnQueue::create(QueueShape::MIN).unwrap();
        let shared = a.share().unwrap();
        let reopened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", shared.as_raw_fd()));
        if let Ok(file) = reopened {
            let len = usize::try_from(QueueShape::file_len(QueueShape::MIN)).unwrap();
            assert!(
                FileMap::new(file.as_raw_fd(), 0, len, true, false).is_err(),
                "a writable mapping of a reopened descriptor is refused"
            );
            use std::io::Write;
            assert!((&file).write(b"x").is_err(), "write(2) is refused");
        }
    }
}
