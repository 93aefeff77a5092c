//! How fast the two CPUs this process may use pass memory between them right now: the round
//! trip of a 4 KiB message between two threads, each copying it out of the other's slot and
//! into its own (the shared-memory floor of `benches/examples/shm_floor.rs`, in miniature).
//! The suite probes it for a few milliseconds before every cell.
//!
//! On the 2-vCPU VMs this project is measured on, it is not a constant: within minutes it flips
//! between about 0.6–0.7 µs, about 1.0 µs and 2.3–3.8 µs (where the hypervisor places the two
//! vCPUs), and every same-host and loopback figure flips with it — a 4 KiB shared-memory round
//! trip from 3.1 to 6.5 µs, a 1 MiB PTR1 round trip from 300 to 660 µs, for every transport
//! alike. A ratio of two cells measured in different modes compares the host, not the
//! transports: the report marks them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Round trips per probe (about 1–8 ms).
const ROUND_TRIPS: u64 = 2_000;
/// 4 KiB, as 8-byte words.
const WORDS: usize = 512;

/// A probe this many times the pass's usual one (its lower quartile: the fastest probe can be
/// an outlier, and the fixtures' polling between cells slows every probe a little) counts as
/// a slow placement. The modes differ by 3–4×; within one, probes vary by less than 1.5×.
pub(crate) const SLOW_FACTOR: f64 = 2.0;

/// One direction's slot: written by one thread only, then handed over by `seq`.
struct Slot {
    seq: AtomicU64,
    words: Vec<AtomicU64>,
}

impl Slot {
    fn new() -> Self {
        Self {
            seq: AtomicU64::new(0),
            words: (0..WORDS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Waits for round `seq`, copies the message out into `into`.
    fn take(&self, seq: u64, into: &mut [u64]) {
        while self.seq.load(Ordering::Acquire) < seq {
            std::hint::spin_loop();
        }
        for (word, out) in self.words.iter().zip(into.iter_mut()) {
            *out = word.load(Ordering::Relaxed);
        }
    }

    /// Copies `from` in and hands round `seq` over.
    fn put(&self, seq: u64, from: &[u64]) {
        for (word, value) in self.words.iter().zip(from) {
            word.store(*value, Ordering::Relaxed);
        }
        self.seq.store(seq, Ordering::Release);
    }
}

/// The median 4 KiB round trip between this thread and a new one, in microseconds.
pub(crate) fn probe() -> f64 {
    let (ping, pong) = (Arc::new(Slot::new()), Arc::new(Slot::new()));
    let echo = {
        let (ping, pong) = (Arc::clone(&ping), Arc::clone(&pong));
        std::thread::spawn(move || {
            let mut message = vec![0u64; WORDS];
            for seq in 1..=ROUND_TRIPS {
                ping.take(seq, &mut message);
                pong.put(seq, &message);
            }
        })
    };
    let mut message = vec![7u64; WORDS];
    let mut trips = Vec::with_capacity(usize::try_from(ROUND_TRIPS).unwrap_or(0));
    for seq in 1..=ROUND_TRIPS {
        let start = Instant::now();
        ping.put(seq, &message);
        pong.take(seq, &mut message);
        trips.push(start.elapsed().as_secs_f64() * 1e6);
    }
    let _ = echo.join();
    trips.sort_by(f64::total_cmp);
    trips[trips.len() / 2]
}

/// What a pass's probes are read against: their lower quartile (NaN without any).
pub(crate) fn usual(probes: impl Iterator<Item = f64>) -> f64 {
    let mut probes: Vec<f64> = probes.filter(|p| p.is_finite()).collect();
    probes.sort_by(f64::total_cmp);
    probes.get(probes.len() / 4).copied().unwrap_or(f64::NAN)
}

/// Whether `probe` is a slow placement against the pass's `usual` probe.
pub(crate) fn is_slow(probe: f64, usual: f64) -> bool {
    probe.is_finite() && usual.is_finite() && probe > usual * SLOW_FACTOR
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_measures_a_round_trip() {
        let p = probe();
        assert!(p.is_finite() && p > 0.0, "{p} µs");
    }

    #[test]
    fn only_a_probe_well_above_the_usual_one_is_slow() {
        // Probes of the suite's quick run: two modes, an outlier below.
        let probes = [0.91, 1.44, 1.46, 1.5, 1.53, 1.7, 1.95, 5.4, 6.1, f64::NAN];
        let quartile = usual(probes.into_iter());
        assert_eq!(quartile, 1.46);
        let slow: Vec<f64> = probes
            .into_iter()
            .filter(|&p| is_slow(p, quartile))
            .collect();
        assert_eq!(slow, [5.4, 6.1]);
        assert!(
            !is_slow(f64::NAN, quartile),
            "a cell without a probe is not marked"
        );
        assert!(usual(std::iter::empty()).is_nan());
    }
}
