//! The physical reference for large one-way transfers: single-thread `memcpy` bandwidth at a
//! message's size. Loopback TCP copies every byte twice (sender into the kernel, kernel out
//! to the receiver), on two CPUs at once, so a transport of messages too large for the caches
//! can at best approach one copy's bandwidth between memory that is not cache-resident.

use std::time::{Duration, Instant};

/// GB/s of copying `size` bytes between two buffers of that size, over about `budget` (median
/// of three timed runs, after one untimed copy that faults both buffers in).
pub(crate) fn bandwidth(size: usize, budget: Duration) -> f64 {
    let source = vec![0x5au8; size];
    let mut target = vec![0u8; size];
    target.copy_from_slice(&source);
    // Assume about 4 GB/s to size the run; the measurement does not depend on it.
    let budget_bytes = budget.as_millis() * 4_000_000;
    let copies = usize::try_from(budget_bytes / size.max(1) as u128)
        .unwrap_or(usize::MAX)
        .max(1);
    let mut runs: Vec<f64> = (0..3)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..copies {
                target.copy_from_slice(std::hint::black_box(&source));
                std::hint::black_box(&mut target);
            }
            (size * copies) as f64 / started.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[1]
}
