//! Fresh against warm: the cells whose figure in new processes differs from the warm pass's by
//! more than [`FLAG_FACTOR`] (either way), for every column and peer measured in both passes.

use crate::suite::{Pass, Results};

/// A fresh figure this many times worse or better than the warm one is flagged.
pub(crate) const FLAG_FACTOR: f64 = 1.5;

/// One cell measured in both passes.
#[derive(Clone, Debug)]
pub(crate) struct Drift {
    /// Index into the plan's cases.
    pub(crate) case: usize,
    /// The column's or peer's name.
    pub(crate) who: String,
    pub(crate) warm: f64,
    pub(crate) fresh: f64,
    /// How many times better warm is than fresh (< 1: fresh is better).
    pub(crate) warm_over_fresh: f64,
}

impl Drift {
    /// Whether the two figures differ by more than [`FLAG_FACTOR`], either way.
    pub(crate) fn flagged(&self) -> bool {
        self.warm_over_fresh > FLAG_FACTOR || self.warm_over_fresh < 1.0 / FLAG_FACTOR
    }
}

/// Every cell with a figure in both passes (none without both passes).
pub(crate) fn compare(r: &Results) -> Vec<Drift> {
    let (Some(warm), Some(fresh)) = (r.warm(), r.fresh()) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for (c, case) in r.plan.cases.iter().enumerate() {
        let mut push = |who: &str, w: f64, f: f64| {
            if w.is_finite() && f.is_finite() && w > 0.0 && f > 0.0 {
                found.push(Drift {
                    case: c,
                    who: who.to_owned(),
                    warm: w,
                    fresh: f,
                    warm_over_fresh: case.better(w, f),
                });
            }
        };
        for (l, column) in warm.columns.iter().enumerate() {
            if let Some(fl) = fresh.index(*column) {
                let cases = &r.plan.cases;
                push(
                    column.name(),
                    warm.median(cases, c, l),
                    fresh.median(cases, c, fl),
                );
            }
        }
        for peer in &warm.peers.names {
            push(
                peer,
                warm.peers.median(peer, case),
                fresh.peers.median(peer, case),
            );
        }
    }
    found
}

/// The pass's 1-minute load average as the tables say it.
pub(crate) fn load_note(pass: &Pass) -> String {
    if pass.load.is_finite() {
        format!("1-minute load average {:.2} when it started", pass.load)
    } else {
        "load average unknown".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_is_flagged_beyond_one_and_a_half_times_either_way() {
        let drift = |warm_over_fresh| Drift {
            case: 0,
            who: "shm copied in".into(),
            warm: 1.0,
            fresh: 1.0,
            warm_over_fresh,
        };
        assert!(drift(9.5).flagged());
        assert!(drift(0.5).flagged());
        assert!(!drift(1.4).flagged());
        assert!(!drift(1.0 / 1.4).flagged());
    }
}
