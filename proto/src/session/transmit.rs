//! A frame on its way out, and the minimum-rate meter for transfers.

use std::time::{Duration, Instant};

use crate::encode::Encoded;
use crate::len::len_u64;

/// An encoded frame for a driver to write in full: head, path, metadata and every buffer, in
/// order (one `sendmsg` over [`Transmit::slices`], more past 1024 slices or after a short
/// write). It owns the frame, so a driver keeps it alive as long as the kernel may read it.
#[derive(Debug)]
pub struct Transmit {
    encoded: Encoded,
    /// First slice not completely written (0 = the head, then the parts).
    next: usize,
    /// Bytes of that slice already written.
    offset: usize,
    remaining: u64,
}

impl Transmit {
    pub(crate) fn new(encoded: Encoded) -> Self {
        Self {
            remaining: encoded.wire_len(),
            encoded,
            next: 0,
            offset: 0,
        }
    }

    /// What is still to be written, in order.
    pub fn slices(&self) -> impl Iterator<Item = &[u8]> {
        let (next, offset) = (self.next, self.offset);
        self.encoded
            .slices()
            .skip(next)
            .enumerate()
            .map(move |(i, slice)| if i == 0 { &slice[offset..] } else { slice })
            .filter(|slice| !slice.is_empty())
    }

    /// Records that `n` more bytes were written; `true` once everything is.
    pub fn advance(&mut self, n: usize) -> bool {
        let mut n = usize::try_from(self.remaining).map_or(n, |r| n.min(r));
        self.remaining -= len_u64(n);
        while n > 0 {
            let Some(len) = self.slice_len(self.next) else {
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

    /// Bytes of the whole frame.
    pub fn wire_len(&self) -> u64 {
        self.encoded.wire_len()
    }

    fn slice_len(&self, index: usize) -> Option<usize> {
        match index {
            0 => Some(self.encoded.head().len()),
            n => self.encoded.parts().get(n - 1).map(|part| part.len()),
        }
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
