//! A frame on its way out, and the minimum-rate meter for transfers.

use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::encode::Encoded;
use crate::len::len_u64;

/// The most a large frame's first write covers in the blocking calls and the tokio driver
/// (not the io_uring driver: `engine/src/uring/op/sendmsg.rs` says why); the rest follows in
/// the next write.
///
/// Over loopback with the kernel's default congestion control here (BBR), one write of a
/// whole 1 MiB frame let segments reach the receiver out of order: 282–354
/// `TcpExtTCPOFOQueue` and 45–171 spurious retransmissions per 2 s of one-way 1 MiB asks,
/// against 0–1 of each with the first 64 KiB written alone, and the median ask took twice as
/// long (p50 254–260 µs against 122–127). One-way 1 MiB went from 5.80 to 10.21 GB/s
/// (io_uring fixture, blocking client) and from 4.28 to 9.20 (tokio), medians of fresh pairs.
/// A first write of 4 KiB did about as well. At 512 KiB the cut lost 5–8 % in three runs of
/// five, at 256 KiB 10–30 % one-way, hence [`SPLIT_ABOVE`]; at 4 and 64 MiB it changed nothing
/// (docs/benchmarks.md, "The first write of a large frame"). Same-host connections now ask for
/// reno, which does not pace ([`crate::congestion`]); the cut stays for connections that keep
/// a pacing congestion control (another host's, or `TENSORWIRE_SAME_HOST_CONGESTION=system`).
pub(crate) const FIRST_WRITE: usize = 64 << 10;
/// Frames at most this long go out in one write.
pub(crate) const SPLIT_ABOVE: u64 = 768 << 10;

/// Encoded frames for a driver to write in full, in order: each one's head, path, metadata
/// and buffers (one `sendmsg` over [`Transmit::slices`] or [`Transmit::write_slices`], more
/// past 1024 slices, after a short write, or after a large frame's first bytes). Usually one
/// frame; a server answering pipelined requests hands out the replies it has ready together
/// ([`Transmit::frames`]). It owns the frames, so a driver keeps it alive as long as the
/// kernel may read it.
#[derive(Debug)]
pub struct Transmit {
    /// Every frame's head, then its parts, frame after frame (empty parts left out).
    slices: Vec<Bytes>,
    /// First slice not completely written.
    next: usize,
    /// Bytes of that slice already written.
    offset: usize,
    remaining: u64,
    wire_len: u64,
    /// The longest frame's wire length.
    largest: u64,
}

impl Transmit {
    pub(crate) fn new(encoded: Encoded) -> Self {
        let wire_len = encoded.wire_len();
        let (head, mut slices) = encoded.into_parts();
        slices.insert(0, head); // the parts were allocated with room for it
        Self {
            slices,
            next: 0,
            offset: 0,
            remaining: wire_len,
            wire_len,
            largest: wire_len,
        }
    }

    /// `first`, then `rest`, written one after another as one transmit.
    pub(crate) fn frames(first: Encoded, rest: impl IntoIterator<Item = Encoded>) -> Self {
        let mut transmit = Self::new(first);
        for encoded in rest {
            transmit.push(encoded);
        }
        transmit
    }

    /// Appends a frame, written after the others (before any byte of this transmit is).
    pub(crate) fn push(&mut self, encoded: Encoded) {
        let len = encoded.wire_len();
        let (head, parts) = encoded.into_parts();
        self.slices.push(head);
        self.slices.extend(parts);
        self.wire_len += len;
        self.remaining += len;
        self.largest = self.largest.max(len);
    }

    /// What is still to be written, in order.
    pub fn slices(&self) -> impl Iterator<Item = &[u8]> {
        let offset = self.offset;
        self.slices
            .get(self.next..)
            .unwrap_or_default()
            .iter()
            .enumerate()
            .map(move |(i, slice)| if i == 0 { &slice[offset..] } else { &slice[..] })
            .filter(|slice| !slice.is_empty())
    }

    /// What the next write should cover: what is left, but for a large frame's first write
    /// at most [`FIRST_WRITE`] bytes (why, and which drivers: [`FIRST_WRITE`]).
    pub fn write_slices(&self) -> impl Iterator<Item = &[u8]> {
        let mut budget = self.first_write_limit();
        self.slices().map_while(move |slice| {
            if budget == 0 {
                return None;
            }
            let len = slice.len().min(budget);
            budget -= len;
            slice.get(..len)
        })
    }

    /// [`FIRST_WRITE`] while nothing of a transmit larger than [`SPLIT_ABOVE`] is written.
    fn first_write_limit(&self) -> usize {
        if self.remaining == self.wire_len && self.wire_len > SPLIT_ABOVE {
            FIRST_WRITE
        } else {
            usize::MAX
        }
    }

    /// Records that `n` more bytes were written; `true` once everything is.
    pub fn advance(&mut self, n: usize) -> bool {
        let mut n = usize::try_from(self.remaining).map_or(n, |r| n.min(r));
        self.remaining -= len_u64(n);
        while n > 0 {
            let Some(len) = self.slices.get(self.next).map(Bytes::len) else {
                break;
            };
            let left = len - self.offset;
            if n < left {
                self.offset += n;
                break;
            }
            n -= left;
            self.next += 1;
            self.offset = 0;
        }
        self.remaining == 0
    }

    /// Bytes not written yet.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Bytes of every frame in it.
    pub fn wire_len(&self) -> u64 {
        self.wire_len
    }

    /// Bytes of its longest frame (a driver choosing zero-copy sends by frame size looks at
    /// this: small replies written together are still small frames).
    pub fn largest_frame(&self) -> u64 {
        self.largest
    }
}

/// Checks that a transfer keeps a minimum rate: in every window at least `required` bytes.
#[derive(Debug)]
pub struct RateMeter {
    window: Duration,
    required: u64,
    /// Start of the current window; `None` while no transfer is measured.
    since: Option<Instant>,
    bytes: u64,
}

impl RateMeter {
    /// A meter requiring `min_rate` bytes per second over every `window` (at least 1 ms).
    pub fn new(min_rate: u64, window: Duration) -> Self {
        // A window shorter than a millisecond would end again at every check.
        let window = window.max(Duration::from_millis(1));
        let required = u128::from(min_rate) * window.as_millis() / 1000;
        Self {
            window,
            required: u64::try_from(required).unwrap_or(u64::MAX),
            since: None,
            bytes: 0,
        }
    }

    /// Starts measuring (if not measuring already).
    pub fn start(&mut self, now: Instant) {
        if self.since.is_none() {
            self.since = Some(now);
            self.bytes = 0;
        }
    }

    /// Stops measuring (the transfer ended).
    pub fn stop(&mut self) {
        self.since = None;
    }

    /// Counts bytes that moved.
    pub fn progress(&mut self, bytes: usize) {
        self.bytes = self.bytes.saturating_add(len_u64(bytes));
    }

    /// When the current window ends.
    pub fn deadline(&self) -> Option<Instant> {
        self.since.and_then(|since| since.checked_add(self.window))
    }

    /// At or after the deadline: `false` if the window moved too few bytes; otherwise a new
    /// window starts.
    pub fn check(&mut self, now: Instant) -> bool {
        match self.deadline() {
            Some(deadline) if deadline <= now => {
                if self.bytes < self.required {
                    return false;
                }
                self.since = Some(now);
                self.bytes = 0;
                true
            }
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::{FIRST_WRITE, SPLIT_ABOVE, Transmit};
    use crate::encode::head;
    use crate::error::Format;
    use crate::kind::FrameKind;
    use crate::limits::Limits;

    fn frame(buffers: &[usize]) -> Transmit {
        Transmit::new(encoded(buffers))
    }

    fn encoded(buffers: &[usize]) -> crate::encode::Encoded {
        let buffers: Vec<Bytes> = buffers
            .iter()
            .map(|&len| Bytes::from(vec![7_u8; len]))
            .collect();
        let metadata = Bytes::from_static(b"meta");
        head(
            Format::Ptr1,
            Some(FrameKind::Ask),
            0,
            1,
            b"/actors/sink",
            &metadata,
            &buffers,
            &Limits::default(),
        )
        .expect("a small frame encodes")
        .share(&metadata, &buffers)
    }

    fn covered(tx: &Transmit) -> usize {
        tx.write_slices().map(<[u8]>::len).sum()
    }

    /// A frame of one buffer whose whole wire length is `wire_len`.
    fn frame_of(wire_len: u64) -> Transmit {
        let overhead = frame(&[1]).wire_len() - 1;
        let payload = usize::try_from(wire_len - overhead).unwrap();
        let tx = frame(&[payload]);
        assert_eq!(tx.wire_len(), wire_len);
        tx
    }

    #[test]
    fn frames_together_are_written_in_order_across_their_boundaries() {
        let (one, two) = (encoded(&[100]), encoded(&[200, 300]));
        let expected: Vec<u8> = one
            .slices()
            .chain(two.slices())
            .flatten()
            .copied()
            .collect();
        let largest = one.wire_len().max(two.wire_len());
        let mut tx = Transmit::frames(one, [two]);
        assert_eq!(tx.largest_frame(), largest);
        assert_eq!(tx.wire_len(), u64::try_from(expected.len()).unwrap());
        let mut written: Vec<u8> = Vec::new();
        // Short writes of 7 bytes, each ending anywhere.
        loop {
            let chunk: Vec<u8> = tx.write_slices().flatten().copied().take(7).collect();
            written.extend(&chunk);
            if tx.advance(chunk.len()) {
                break;
            }
        }
        assert_eq!(written, expected);
        assert_eq!(tx.slices().count(), 0);
    }

    #[test]
    fn a_large_frame_s_first_write_is_limited_then_the_rest_goes_whole() {
        let mut tx = frame(&[1 << 20]);
        assert_eq!(covered(&tx), FIRST_WRITE);
        assert!(!tx.advance(FIRST_WRITE));
        assert_eq!(u64::try_from(covered(&tx)).unwrap(), tx.remaining());
        assert!(tx.advance(covered(&tx)));
        assert_eq!(covered(&tx), 0, "nothing left: no slices");
    }

    #[test]
    fn a_first_write_cut_short_by_the_kernel_lifts_the_limit() {
        let mut tx = frame(&[600 << 10, 600 << 10]);
        assert!(!tx.advance(10));
        assert_eq!(u64::try_from(covered(&tx)).unwrap(), tx.remaining());
    }

    #[test]
    fn the_threshold_itself_goes_whole_and_one_byte_more_is_cut() {
        let at = frame_of(SPLIT_ABOVE);
        assert_eq!(u64::try_from(covered(&at)).unwrap(), SPLIT_ABOVE);
        let above = frame_of(SPLIT_ABOVE + 1);
        assert_eq!(covered(&above), FIRST_WRITE);
    }

    #[test]
    fn frames_up_to_the_threshold_go_in_one_write_across_their_slices() {
        let tx = frame(&[150 << 10, 150 << 10]);
        assert!(tx.wire_len() <= SPLIT_ABOVE);
        assert_eq!(
            tx.write_slices().count(),
            4,
            "head, metadata and both buffers"
        );
        assert_eq!(u64::try_from(covered(&tx)).unwrap(), tx.wire_len());
    }

    #[test]
    fn the_cut_ends_inside_a_slice_and_no_slice_after_it_is_offered() {
        let tx = frame(&[1 << 20, 16]);
        let slices: Vec<&[u8]> = tx.write_slices().collect();
        assert_eq!(
            slices.len(),
            3,
            "head, metadata and the start of the first buffer"
        );
        assert!(slices.iter().all(|slice| !slice.is_empty()));
        assert_eq!(slices.iter().map(|s| s.len()).sum::<usize>(), FIRST_WRITE);
    }
}
