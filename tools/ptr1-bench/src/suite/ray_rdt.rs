//! Ray, actor to actor: tensorwire's Ray Direct Transport beside Ray's object store, driven by
//! `pybind/bench/ray_bench.py --json` (same host, copied in and from `tensorwire.ray.empty()`;
//! two raylets over PTR1; the consumer's peak RSS). Not measured, with the reason, where Ray
//! is not installed.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::cli::Part;
use crate::report::say;
use crate::suite::peers::{python_with_tensorwire, workspace_root};
use crate::suite::{Plan, median};

/// What `ray_bench.py` measured.
#[derive(Default)]
pub(crate) struct RayRdt {
    pub(crate) skipped: Option<String>,
    /// (group, column) in the script's order.
    columns: Vec<(String, String)>,
    /// GB/s and µs per transfer, by (group, column, size).
    samples: BTreeMap<(String, String, usize), Vec<(f64, f64)>>,
    /// (column, consumer RSS growth ÷ the array).
    rss: Vec<(String, f64)>,
    /// (column, text): notes, unavailable peers and failures.
    notes: Vec<(String, String)>,
}

impl RayRdt {
    pub(crate) fn measure(plan: &Plan) -> Self {
        let skipped = |why: &str| Self {
            skipped: Some(why.to_owned()),
            ..Self::default()
        };
        if plan.smoke {
            return skipped("not run in --smoke");
        }
        if !plan.warm {
            return skipped("not run with --fresh (its cells are warm; the full suite runs it)");
        }
        if crate::placement::is_across() {
            return skipped("same-host peers: not run with --netns");
        }
        if !plan.parts.contains(&Part::Peers) {
            return skipped("not asked for (--only)");
        }
        let Some(root) = workspace_root() else {
            return skipped("pybind/bench/ray_bench.py not found next to this binary's workspace");
        };
        let Some(python) = python_with_tensorwire(&root) else {
            return skipped(
                "no Python with tensorwire (scripts/python-env installs it into .venv)",
            );
        };
        let sizes: Vec<String> = plan.sizes.iter().map(ToString::to_string).collect();
        let output = Command::new(&python)
            .arg(root.join("pybind/bench/ray_bench.py"))
            .args(["--json", "--reps", &plan.reps.to_string()])
            .args([
                "--seconds",
                &plan.seconds.to_string(),
                "--sizes",
                &sizes.join(","),
            ])
            .stderr(Stdio::null())
            .output();
        match output {
            Ok(out) => {
                let mut found = Self::parse(&String::from_utf8_lossy(&out.stdout));
                if !out.status.success() {
                    found.notes.push((
                        "ray_bench.py".into(),
                        format!(
                            "FAILED: exited with {} (run it alone to see why)",
                            out.status
                        ),
                    ));
                }
                found
            }
            Err(e) => skipped(&format!("ray_bench.py could not start: {e}")),
        }
    }

    fn parse(text: &str) -> Self {
        let mut found = Self::default();
        for line in text.lines() {
            let Ok(r) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let s = |key: &str| r[key].as_str().unwrap_or("?").to_owned();
            let f = |key: &str| r[key].as_f64().unwrap_or(f64::NAN);
            match r["kind"].as_str() {
                Some("sample") => {
                    let column = (s("group"), s("peer"));
                    if !found.columns.contains(&column) {
                        found.columns.push(column.clone());
                    }
                    let size = r["size"].as_u64().and_then(|v| usize::try_from(v).ok());
                    found
                        .samples
                        .entry((column.0, column.1, size.unwrap_or(0)))
                        .or_default()
                        .push((f("value"), f("micros")));
                }
                Some("rss") => found.rss.push((s("peer"), f("ratio"))),
                Some("note") => found.notes.push((s("peer"), s("text"))),
                Some("unavailable") => {
                    found
                        .notes
                        .push((s("peer"), format!("not measured: {}", s("reason"))));
                }
                _ => {}
            }
        }
        found
    }

    /// (GB/s, µs) medians of one cell.
    fn cell(&self, group: &str, column: &str, size: usize) -> (f64, f64) {
        let Some(runs) = self
            .samples
            .get(&(group.to_owned(), column.to_owned(), size))
        else {
            return (f64::NAN, f64::NAN);
        };
        let gbps: Vec<f64> = runs.iter().map(|r| r.0).collect();
        let micros: Vec<f64> = runs.iter().map(|r| r.1).collect();
        (median(&gbps), median(&micros))
    }

    fn groups(&self) -> Vec<&str> {
        let mut groups: Vec<&str> = Vec::new();
        for (group, _) in &self.columns {
            if !groups.contains(&group.as_str()) {
                groups.push(group);
            }
        }
        groups
    }

    fn sizes(&self) -> Vec<usize> {
        let mut sizes: Vec<usize> = self.samples.keys().map(|k| k.2).collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    }

    pub(crate) fn print(&self) {
        say!(
            "\nRay, actor to actor (pybind/bench/ray_bench.py): GB/s of payload (µs per transfer), × Ray's object store where both copy the same way (one copy on one host, through the kernel between raylets)"
        );
        if let Some(why) = &self.skipped {
            say!("  not measured: {why}");
            return;
        }
        for (column, note) in &self.notes {
            say!("  {column}: {note}");
        }
        for group in self.groups() {
            let columns: Vec<&str> = self
                .columns
                .iter()
                .filter(|(g, _)| g == group)
                .map(|(_, c)| c.as_str())
                .collect();
            say!("\n| {group} | {} |", columns.join(" | "));
            say!("|---|{}", "---:|".repeat(columns.len()));
            for size in self.sizes() {
                let store = columns
                    .iter()
                    .find(|c| c.contains("object store"))
                    .map_or(f64::NAN, |c| self.cell(group, c, size).0);
                let cells: Vec<String> = columns
                    .iter()
                    .map(|c| {
                        let (gbps, us) = self.cell(group, c, size);
                        let vs = if !c.contains("tensorwire") {
                            String::new()
                        } else if !copies_like_the_store(c) {
                            " (zero-copy: no peer of this kind)".to_owned()
                        } else if store.is_finite() {
                            format!(" {:.2}×", gbps / store)
                        } else {
                            String::new()
                        };
                        format!("{gbps:.3} ({us:.0} µs){vs}")
                    })
                    .collect();
                say!(
                    "| {} | {} |",
                    crate::suite::cases::human(size),
                    cells.join(" | ")
                );
            }
        }
        for (column, ratio) in &self.rss {
            say!("  consumer RSS holding one 256 MiB array, {column}: {ratio:.2}× the array");
        }
    }

    pub(crate) fn to_json(&self) -> Value {
        let cells: Vec<Value> = self
            .samples
            .iter()
            .map(|((group, column, size), runs)| {
                let (gbps, us) = self.cell(group, column, *size);
                json!({ "group": group, "column": column, "size": size,
                        "gb_per_s": gbps, "micros": us, "samples": runs })
            })
            .collect();
        json!({
            "skipped": self.skipped,
            "cells": cells,
            "consumer_rss_ratio_256mib": self.rss.iter().map(|(c, r)| json!({ "column": c, "ratio": r })).collect::<Vec<_>>(),
            "notes": self.notes.iter().map(|(c, n)| json!({ "column": c, "note": n })).collect::<Vec<_>>(),
        })
    }
}

/// Whether `column` does with the array's bytes what the object store beside it does — one copy
/// on one host, through the kernel between raylets — so the two may be divided: `tensorwire
/// empty()` hands the array off without a copy, and the RDT floor moves none.
fn copies_like_the_store(column: &str) -> bool {
    !column.contains("empty()") && !column.contains("no bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_lines_become_cells_with_medians() {
        let text = r#"{"kind": "version", "name": "ray", "version": "2.60.0"}
{"kind": "sample", "group": "same host", "peer": "same host: object store", "mode": "actor", "size": 4096, "buffers": 1, "rep": 0, "value": 1.0, "micros": 10.0}
{"kind": "sample", "group": "same host", "peer": "same host: object store", "mode": "actor", "size": 4096, "buffers": 1, "rep": 1, "value": 3.0, "micros": 30.0}
{"kind": "sample", "group": "same host", "peer": "same host: object store", "mode": "actor", "size": 4096, "buffers": 1, "rep": 2, "value": 2.0, "micros": 20.0}
{"kind": "sample", "group": "same host", "peer": "same host: tensorwire", "mode": "actor", "size": 4096, "buffers": 1, "rep": 0, "value": 2.0, "micros": 20.0}
{"kind": "rss", "peer": "same host: tensorwire", "size": 268435456, "idle": 1, "peak": 2, "ratio": 1.05}
{"kind": "unavailable", "peer": "Ray", "reason": "not importable"}
not json"#;
        let found = RayRdt::parse(text);
        assert_eq!(found.columns.len(), 2);
        assert_eq!(
            found.cell("same host", "same host: object store", 4096),
            (2.0, 20.0)
        );
        assert_eq!(
            found.cell("same host", "same host: tensorwire", 4096),
            (2.0, 20.0)
        );
        assert!(
            found
                .cell("same host", "same host: tensorwire", 1)
                .0
                .is_nan()
        );
        assert_eq!(found.rss, vec![("same host: tensorwire".to_owned(), 1.05)]);
        assert_eq!(found.notes[0].1, "not measured: not importable");
        assert_eq!(found.sizes(), vec![4096]);
        assert!(copies_like_the_store("same host: tensorwire"));
        assert!(copies_like_the_store("two raylets: tensorwire"));
        assert!(!copies_like_the_store("same host: tensorwire empty()"));
    }
}
