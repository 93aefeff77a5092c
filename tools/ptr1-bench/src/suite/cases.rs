//! The matrix the suite measures: modes × message sizes × buffer counts, one row of asks that
//! come now and then, and the figure each case reports (one-way: GB/s; RTT: p50 µs; in
//! flight: asks/s).

use std::time::Duration;

use crate::Mode;
use crate::suite::Measurement;

/// The sporadic row: asks of the smallest size, one buffer, each after an untimed sleep this
/// long (a training step's asks come this way), so the threads of both ends go idle unless
/// they busy-poll through it (MPI, iceoryx2's server; their CPU column says so). The rows
/// without a gap measure asks sent back to back, which keep every thread awake. The suite
/// passes it to the peers' driver (`bench.py --sporadic-gap`).
pub(crate) const SPORADIC_GAP: Duration = Duration::from_millis(10);

/// In-flight cases keep at most this many payload bytes outstanding (64 asks of 4 KiB or
/// 1 MiB; 8 of 64 MiB; 2 of 256 MiB). Echoes double it, every peer keeps its pools for the
/// whole run, and with 1 GiB a full run took the 24 GiB machine to its last gigabyte (Ray's
/// memory monitor killed its actor): 512 MiB keeps the whole suite well inside memory.
pub(crate) const IN_FLIGHT_BYTES: usize = 512 << 20;

/// One row of the tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Case {
    pub(crate) mode: Mode,
    pub(crate) size: usize,
    pub(crate) buffers: usize,
    /// Asks outstanding (1 unless `mode` is in-flight).
    pub(crate) inflight: usize,
    /// An untimed sleep before each ask ([`SPORADIC_GAP`] in the sporadic row, else zero).
    pub(crate) gap: Duration,
}

/// The sizes a run covers: tiny for `--smoke`, three for `--quick`, four otherwise.
pub(crate) fn sizes(quick: bool, smoke: bool) -> &'static [usize] {
    if smoke {
        &[4 << 10, 64 << 10]
    } else if quick {
        &[4 << 10, 1 << 20, 64 << 20]
    } else {
        &[4 << 10, 1 << 20, 64 << 20, 256 << 20]
    }
}

/// Every mode × size × buffer count, one-way first; after the RTT rows, the sporadic row (RTT
/// of the smallest size, one buffer, [`SPORADIC_GAP`] between asks).
pub(crate) fn matrix(sizes: &[usize], inflight: usize) -> Vec<Case> {
    let mut cases = Vec::new();
    for mode in [Mode::OneWay, Mode::Rtt, Mode::InFlight] {
        for &size in sizes {
            for buffers in [1, 16] {
                let inflight = match mode {
                    Mode::InFlight => inflight.min((IN_FLIGHT_BYTES / size.max(1)).max(1)),
                    _ => 1,
                };
                cases.push(Case {
                    mode,
                    size,
                    buffers,
                    inflight,
                    gap: Duration::ZERO,
                });
            }
        }
        if let (Mode::Rtt, Some(&size)) = (mode, sizes.iter().min()) {
            cases.push(Case {
                mode,
                size,
                buffers: 1,
                inflight: 1,
                gap: SPORADIC_GAP,
            });
        }
    }
    cases
}

impl Case {
    /// "one-way 4 KiB × 16", "RTT p50 1 MiB × 1", "64 in flight 4 KiB × 1", "RTT p50 4 KiB ×
    /// 1, 10 ms apart".
    pub(crate) fn label(&self) -> String {
        let what = match self.mode {
            Mode::OneWay | Mode::Tell => "one-way".to_owned(),
            Mode::Rtt => "RTT p50".to_owned(),
            Mode::InFlight => format!("{} in flight", self.inflight),
        };
        let apart = if self.gap.is_zero() {
            String::new()
        } else {
            format!(", {} ms apart", self.gap.as_millis())
        };
        format!("{what} {} × {}{apart}", human(self.size), self.buffers)
    }

    /// The name the peers' driver and the JSON use: `oneway`, `rtt`, `sporadic` (RTT with a
    /// gap), `inflight`.
    pub(crate) fn mode_key(&self) -> &'static str {
        debug_assert!(
            self.gap.is_zero() || self.mode == Mode::Rtt,
            "only RTT rows have a gap: another would share the sporadic row's key"
        );
        match self.mode {
            _ if !self.gap.is_zero() => "sporadic",
            Mode::OneWay => "oneway",
            Mode::Tell => "tell",
            Mode::Rtt => "rtt",
            Mode::InFlight => "inflight",
        }
    }

    /// The figure this case reports.
    pub(crate) fn figure(&self, m: &Measurement) -> f64 {
        match self.mode {
            Mode::OneWay | Mode::Tell => m.gb_per_s,
            Mode::Rtt => m.p50_us,
            Mode::InFlight => m.ops_per_s,
        }
    }

    pub(crate) fn unit(&self) -> &'static str {
        match self.mode {
            Mode::OneWay | Mode::Tell => "GB/s",
            Mode::Rtt => "µs",
            Mode::InFlight => "asks/s",
        }
    }

    /// How many times better `a` is than `b` (for latencies: `b ÷ a`).
    pub(crate) fn better(&self, a: f64, b: f64) -> f64 {
        match self.mode {
            Mode::Rtt => b / a,
            _ => a / b,
        }
    }

    /// The best of `values` (NaN when none is finite).
    pub(crate) fn best(&self, values: impl IntoIterator<Item = f64>) -> f64 {
        values
            .into_iter()
            .filter(|v| v.is_finite() && *v > 0.0)
            .reduce(|a, b| if self.better(a, b) >= 1.0 { a } else { b })
            .unwrap_or(f64::NAN)
    }

    /// A figure as the tables print it.
    pub(crate) fn cell(&self, v: f64) -> String {
        if !v.is_finite() {
            return "–".into();
        }
        match self.mode {
            Mode::OneWay | Mode::Tell if v >= 1000.0 => format!("{v:.0}"),
            Mode::OneWay | Mode::Tell if v < 0.1 => format!("{v:.3}"),
            Mode::OneWay | Mode::Tell => format!("{v:.2}"),
            Mode::Rtt => format!("{v:.1}"),
            Mode::InFlight => format!("{v:.0}"),
        }
    }
}

#[cfg(test)]
impl Case {
    /// A case of `mode`, 1 MiB in one buffer, one ask at a time, no gap (for the tests).
    pub(crate) fn of_one_mib(mode: Mode) -> Self {
        Self {
            mode,
            size: 1 << 20,
            buffers: 1,
            inflight: 1,
            gap: Duration::ZERO,
        }
    }
}

/// 4096 → "4 KiB", 1048576 → "1 MiB".
pub(crate) fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_matrix_is_every_mode_size_and_buffer_count_with_bounded_in_flight_bytes() {
        let cases = matrix(sizes(false, false), 64);
        assert_eq!(cases.len(), 3 * 4 * 2 + 1);
        for case in &cases {
            assert!(case.inflight * case.size <= IN_FLIGHT_BYTES.max(case.size));
        }
        let big = cases
            .iter()
            .find(|c| c.mode == Mode::InFlight && c.size == 256 << 20)
            .map(|c| c.inflight);
        assert_eq!(big, Some(2));
        assert_eq!(cases[0].label(), "one-way 4 KiB × 1");
        assert_eq!(cases[cases.len() - 1].label(), "2 in flight 256 MiB × 16");
        let sporadic: Vec<&Case> = cases.iter().filter(|c| !c.gap.is_zero()).collect();
        assert_eq!(sporadic.len(), 1);
        assert_eq!(sporadic[0].label(), "RTT p50 4 KiB × 1, 10 ms apart");
        assert_eq!(sporadic[0].mode_key(), "sporadic");
        assert_eq!(
            cases[16].label(),
            "RTT p50 4 KiB × 1, 10 ms apart",
            "after the RTT rows"
        );
    }

    #[test]
    fn better_and_best_invert_for_latencies() {
        let rtt = Case {
            mode: Mode::Rtt,
            size: 4096,
            buffers: 1,
            inflight: 1,
            gap: Duration::ZERO,
        };
        assert!((rtt.better(10.0, 20.0) - 2.0).abs() < 1e-9);
        assert!((rtt.best([30.0, 10.0, f64::NAN, 20.0]) - 10.0).abs() < 1e-9);
        let oneway = Case {
            mode: Mode::OneWay,
            ..rtt
        };
        assert!((oneway.best([3.0, 5.0, 1.0]) - 5.0).abs() < 1e-9);
        assert!(oneway.best([f64::NAN]).is_nan());
    }
}
