//! How much a read brings: a small body's rest through scratch with what follows it, and a
//! larger scratch for a peer that pipelines.

use super::Receiver;

/// The rest of a body at most this long (and at most half of scratch) is read through scratch
/// (then copied into place) rather than straight into its memory: one read then also brings
/// what follows it. A client that pipelines 4 KiB asks had every body's last bytes read on
/// their own (one receive per ask, `benches/examples/ptr1_pipelined_client.rs`); copying at
/// most this much costs less than a receive.
const SMALL_REST: u64 = 8 << 10;

/// Scratch grows to this many times [`crate::config::SessionConfig::scratch_len`] on a
/// connection whose peer pipelines (a read filled it with two or more whole frames): with 16
/// KiB, a client keeping 64 asks of 4 KiB in flight on one connection had 4–5 of them read per
/// receive; with 64 KiB, about 10, and up to twice the asks a second (`ptr1_pipelined_client`,
/// docs/benchmarks.md).
const PIPELINED_SCRATCH_GROWTH: usize = 4;

impl Receiver {
    /// The longest rest of a body read through scratch.
    pub(super) fn small_rest(&self) -> u64 {
        SMALL_REST.min(crate::len::len_u64(self.config.scratch_len / 2))
    }

    /// A peer that pipelines (the last read filled scratch with two or more whole frames) gets
    /// a larger scratch, once: more of its requests come in each read.
    pub(super) fn grow_scratch_if_pipelined(&mut self) {
        let max = self
            .config
            .scratch_len
            .saturating_mul(PIPELINED_SCRATCH_GROWTH);
        let Some(scratch) = &self.scratch else {
            return;
        };
        if !self.scratch_filled || self.frames_since_read < 2 || scratch.len() >= max {
            return;
        }
        let mut grown = vec![0; max].into_boxed_slice();
        let held = self.end - self.start;
        grown[..held].copy_from_slice(&scratch[self.start..self.end]);
        self.scratch = Some(grown);
        self.start = 0;
        self.end = held;
        self.scratch_filled = false;
    }
}
