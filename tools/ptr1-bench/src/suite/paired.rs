//! io_uring ÷ best baseline, like with like: the ratio of each repetition in which PTR1 on
//! io_uring and every baseline (the tokio fallback, the seed design, std) ran on the same
//! placement of the host's CPU pair, and the median of those ratios.
//!
//! The columns of one repetition run seconds apart, one after the other, and each is probed
//! right before it ([`crate::suite::cpu_pair`]). The hypervisor moves the two vCPUs apart and
//! back within minutes, and every loopback figure moves 2× with it. A ratio of medians taken
//! over repetitions that ran on different placements compares the host; the ratio within a
//! repetition whose four probes agree compares the drivers. Repetitions on the slow placement
//! count as well as fast ones, as long as all four columns ran on it. Where no repetition
//! qualifies, the ratio of the medians is all there is, and the table marks it †.

use crate::suite::columns::Column;
use crate::suite::cpu_pair;
use crate::suite::{Case, Pass};

/// PTR1 on io_uring against these, the best of them per repetition.
pub(crate) const BASELINES: [Column; 3] = [Column::Tokio, Column::Seed, Column::Std];

/// io_uring ÷ the best baseline of one case in one pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct EngineRatio {
    /// > 1: io_uring is better (latencies inverted). NaN: not measured.
    pub(crate) value: f64,
    /// Repetitions whose four columns ran on one placement (the ratio is their median).
    pub(crate) paired: usize,
    /// Repetitions measured.
    pub(crate) reps: usize,
}

impl EngineRatio {
    /// Whether the value is only the ratio of the medians: no repetition ran io_uring and the
    /// baselines on one placement.
    pub(crate) fn unpaired(&self) -> bool {
        self.paired == 0 && self.value.is_finite()
    }
}

/// The probe `pass`'s probes are read against ([`cpu_pair::usual`]): its columns', or where
/// no column was probed (`--only peers`), its peers'.
pub(crate) fn usual_probe(pass: &Pass) -> f64 {
    let columns = cpu_pair::usual(
        pass.samples
            .iter()
            .flatten()
            .flatten()
            .map(|m| m.cpu_pair_us),
    );
    if columns.is_finite() {
        columns
    } else {
        cpu_pair::usual(pass.peers.probes())
    }
}

/// Case `c`'s ratio in `pass`, its probes read against the pass's `usual` one.
pub(crate) fn engine_over_baseline(pass: &Pass, case: &Case, c: usize, usual: f64) -> EngineRatio {
    let none = EngineRatio {
        value: f64::NAN,
        paired: 0,
        reps: 0,
    };
    let Some(engine) = pass.index(Column::Engine) else {
        return none;
    };
    let baselines: Vec<usize> = BASELINES.iter().filter_map(|&b| pass.index(b)).collect();
    if baselines.is_empty() {
        return none; // `--only` without ptr1: io_uring alone, nothing to divide by
    }
    let runs = |l: usize| &pass.samples[c][l];
    let reps = baselines
        .iter()
        .map(|&b| runs(b).len())
        .fold(runs(engine).len(), usize::min);
    let mut ratios = Vec::new();
    for r in 0..reps {
        let mut run = std::iter::once(engine)
            .chain(baselines.iter().copied())
            .map(|l| &runs(l)[r]);
        // A column not probed is not known to share the others' placement.
        if !usual.is_finite() || run.clone().any(|m| !m.cpu_pair_us.is_finite()) {
            continue;
        }
        let first = cpu_pair::is_slow(runs(engine)[r].cpu_pair_us, usual);
        if run.any(|m| cpu_pair::is_slow(m.cpu_pair_us, usual) != first) {
            continue;
        }
        let best = case.best(baselines.iter().map(|&b| case.figure(&runs(b)[r])));
        let ratio = case.better(case.figure(&runs(engine)[r]), best);
        if ratio.is_finite() {
            ratios.push(ratio);
        }
    }
    if ratios.is_empty() {
        let median = |l: usize| pass.median_of(c, l, |m| case.figure(m));
        let best = case.best(baselines.iter().map(|&b| median(b)));
        return EngineRatio {
            value: case.better(median(engine), best),
            paired: 0,
            reps,
        };
    }
    EngineRatio {
        value: middle(&mut ratios),
        paired: ratios.len(),
        reps,
    }
}

/// The median, the mean of the middle two for an even count (an upper median of two ratios
/// would always pick the one that favours io_uring more).
fn middle(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Mode;
    use crate::suite::Measurement;

    fn case(mode: Mode) -> Case {
        Case::of_one_mib(mode)
    }

    /// A cell whose figure is `value` in every mode, probed at `probe` µs.
    fn sample(value: f64, probe: f64) -> Measurement {
        Measurement {
            gb_per_s: value,
            p50_us: value,
            ops_per_s: value,
            cpu_pair_us: probe,
            ..Measurement::default()
        }
    }

    /// A pass of the four driver columns, one case; `runs[column][rep] = (figure, probe)`.
    fn pass(runs: [&[(f64, f64)]; 4]) -> Pass {
        let columns = vec![Column::Engine, Column::Tokio, Column::Seed, Column::Std];
        let samples = vec![
            runs.iter()
                .map(|reps| reps.iter().map(|&(v, p)| sample(v, p)).collect())
                .collect(),
        ];
        Pass {
            fresh: false,
            columns,
            samples,
            peers: Default::default(),
            load: 0.0,
        }
    }

    #[test]
    fn repetitions_on_mixed_placements_are_left_out() {
        // io_uring's second repetition ran on the slow placement, the baselines' did not:
        // the ratio of medians would read 4/5 = 0.8, the like-with-like ratio 1.2.
        let p = pass([
            &[(6.0, 1.5), (2.0, 5.0), (6.0, 1.5)],
            &[(5.0, 1.5), (5.0, 1.5), (5.0, 1.5)],
            &[(4.0, 1.5), (4.0, 1.5), (4.0, 1.5)],
            &[(3.0, 1.5), (3.0, 1.5), (3.0, 1.5)],
        ]);
        let r = engine_over_baseline(&p, &case(Mode::OneWay), 0, 1.5);
        assert_eq!((r.paired, r.reps), (2, 3));
        assert!((r.value - 1.2).abs() < 1e-9, "{r:?}");
        assert!(!r.unpaired());
    }

    #[test]
    fn a_repetition_all_on_the_slow_placement_counts() {
        let p = pass([
            &[(2.0, 5.0), (9.0, 1.5)],
            &[(4.0, 5.0), (9.0, 5.0)],
            &[(1.0, 5.0), (9.0, 1.5)],
            &[(1.0, 5.0), (9.0, 1.5)],
        ]);
        let r = engine_over_baseline(&p, &case(Mode::OneWay), 0, 1.5);
        assert_eq!((r.paired, r.reps), (1, 2));
        assert!((r.value - 0.5).abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn latencies_are_inverted_and_an_even_count_takes_the_middle_two() {
        // RTT: io_uring 100 µs against a best baseline of 110 (1.1×), then 90 against 80.
        let p = pass([
            &[(100.0, 1.5), (90.0, 1.5)],
            &[(110.0, 1.5), (80.0, 1.5)],
            &[(120.0, 1.5), (95.0, 1.5)],
            &[(130.0, 1.5), (99.0, 1.5)],
        ]);
        let mut rtt = case(Mode::Rtt);
        rtt.size = 4096;
        let r = engine_over_baseline(&p, &rtt, 0, 1.5);
        assert_eq!(r.paired, 2);
        let want = (1.1 + 80.0 / 90.0) / 2.0;
        assert!((r.value - want).abs() < 1e-9, "{r:?} against {want}");
    }

    #[test]
    fn a_repetition_with_a_column_not_probed_is_not_paired() {
        let p = pass([
            &[(2.0, 1.5), (6.0, 1.5)],
            &[(4.0, f64::NAN), (5.0, 1.5)],
            &[(1.0, 1.5), (5.0, 1.5)],
            &[(1.0, 1.5), (5.0, 1.5)],
        ]);
        let r = engine_over_baseline(&p, &case(Mode::OneWay), 0, 1.5);
        assert_eq!((r.paired, r.reps), (1, 2));
        assert!((r.value - 1.2).abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn without_baselines_there_is_no_ratio() {
        let mut p = pass([&[(2.0, 1.5)], &[(4.0, 1.5)], &[(1.0, 1.5)], &[(1.0, 1.5)]]);
        p.columns.truncate(1);
        p.samples[0].truncate(1);
        let r = engine_over_baseline(&p, &case(Mode::OneWay), 0, 1.5);
        assert!(r.value.is_nan() && r.reps == 0 && !r.unpaired(), "{r:?}");
    }

    #[test]
    fn without_a_paired_repetition_it_falls_back_to_the_medians_and_says_so() {
        let p = pass([&[(2.0, 5.0)], &[(4.0, 1.5)], &[(1.0, 1.5)], &[(1.0, 1.5)]]);
        let r = engine_over_baseline(&p, &case(Mode::OneWay), 0, 1.5);
        assert!(r.unpaired(), "{r:?}");
        assert!((r.value - 0.5).abs() < 1e-9, "{r:?}");
    }
}
