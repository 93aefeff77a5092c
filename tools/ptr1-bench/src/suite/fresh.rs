//! The fresh pass: every cell of every column in new processes — a new fixture process, a new
//! client node, one probe exchange that picks the route, then the cell — as a user's first
//! seconds look, against the warm pass's processes that have run the whole matrix.

use std::path::Path;

use anyhow::{Context, Result};

use crate::Options;
use crate::measure;
use crate::progress::Progress;
use crate::report::say;
use crate::suite::columns::{Column, Lanes};
use crate::suite::steered::{self, Steered};
use crate::suite::{Measurement, Plan, case_options};

/// What the fresh pass measured.
pub(crate) struct FreshMatrix {
    pub(crate) columns: Vec<Column>,
    /// `[case][column][repetition]`.
    pub(crate) samples: Vec<Vec<Vec<Measurement>>>,
    /// Columns that could not be set up (besides the ones the warm pass found, which are not
    /// tried again).
    pub(crate) refused: Vec<(Column, String)>,
}

/// Every case on every column, each cell with new processes; MPI's C peers (`steered`, new
/// processes per cell too) measured on each case right before or right after the columns.
pub(crate) fn measure_matrix(
    exe: &Path,
    plan: &Plan,
    options: &Options,
    known_unavailable: &[(Column, String)],
    mut steered: Option<&mut Steered>,
) -> Result<FreshMatrix> {
    let mut refused = Vec::new();
    let wanted: Vec<Column> = Column::ALL
        .into_iter()
        .filter(|c| *c == Column::Engine || plan.parts.contains(&c.part()))
        .filter(|c| !known_unavailable.iter().any(|(u, _)| u == c))
        .collect();
    let mut columns = Vec::new();
    for column in wanted {
        // A column that cannot start once is not tried per cell.
        match Lanes::single(exe, options, column) {
            Ok(_) => columns.push(column),
            Err(e) if column == Column::Engine => {
                return Err(e.context("the io_uring PTR1 column (every ratio refers to it)"));
            }
            Err(e) => {
                say!("{}: not measured fresh: {e:#}", column.name());
                refused.push((column, format!("{e:#}")));
            }
        }
    }
    let n = columns.len();
    let mut samples = vec![vec![Vec::new(); n]; plan.cases.len()];
    let mut progress = Progress::new("fresh", plan.fresh_reps * plan.cases.len());
    for rep in 0..plan.fresh_reps {
        for (c, case) in plan.cases.iter().enumerate() {
            let message = measure::message(case.size, case.buffers);
            let run = case_options(case, plan.fresh_seconds, options);
            steered::around(steered.as_deref_mut(), rep, c, case, || -> Result<()> {
                for k in 0..n {
                    let l = (k + rep + c) % n;
                    let column = columns[l];
                    if !column.measures(case) {
                        continue;
                    }
                    let failed =
                        || format!("{} over {} (fresh) failed", case.label(), column.name());
                    let mut lanes = Lanes::single(exe, options, column).with_context(failed)?;
                    let lane = lanes.lanes.first_mut().context("no lane")?;
                    let cpu_pair_us = crate::suite::cpu_pair::probe();
                    let (sample, cpu) = lane.measure(&run, &message).with_context(failed)?;
                    samples[c][l].push(Measurement::new(&sample, cpu).probed(cpu_pair_us));
                }
                Ok(())
            })?;
            progress.step(&format!(
                "fresh rep {}/{}: {}",
                rep + 1,
                plan.fresh_reps,
                case.label()
            ));
        }
    }
    Ok(FreshMatrix {
        columns,
        samples,
        refused,
    })
}
