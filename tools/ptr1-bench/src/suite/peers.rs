//! The transports users would pick instead, driven from Python in their own processes by
//! `pybind/bench/bench.py --json` over the suite's own cases: tensorwire from Python (PTR1 and
//! shared memory), pyzmq, gRPC, `multiprocessing.shared_memory`, Ray, iceoryx2. A peer that is
//! not installed, or a case a peer has no way to run, is listed with the reason, never skipped
//! silently.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Options;
use crate::cli::Part;
use crate::suite::references::References;
use crate::suite::{Case, Plan, median};

/// What the peers' driver found.
#[derive(Default)]
pub(crate) struct Peers {
    /// Why no peer was measured, if none was.
    pub(crate) skipped: Option<String>,
    /// The peers measured, in the driver's order (tensorwire from Python first).
    pub(crate) names: Vec<String>,
    /// Samples by (peer, mode, size, buffers).
    samples: BTreeMap<(String, String, usize, usize), Vec<f64>>,
    /// Peers that could not run here, with the reason.
    pub(crate) unavailable: Vec<(String, String)>,
    /// How each peer was driven.
    pub(crate) notes: Vec<(String, String)>,
    /// Cases a peer has no way to run: (peer, case label, reason), deduplicated by reason.
    pub(crate) not_applicable: Vec<(String, String)>,
    /// Peers that failed part-way, with the case and the error (their samples until then
    /// are kept).
    pub(crate) failed: Vec<(String, String)>,
    /// Python and package versions.
    pub(crate) versions: BTreeMap<String, String>,
}

impl Peers {
    pub(crate) fn measure(options: &Options, plan: &Plan) -> Self {
        let skipped = |why: &str| Self {
            skipped: Some(why.to_owned()),
            ..Self::default()
        };
        if plan.smoke {
            return skipped("not run in --smoke (a correctness check of tensorwire's own paths)");
        }
        if crate::placement::is_across() {
            return skipped("same-host peers: not run with --netns");
        }
        if !plan.parts.contains(&Part::Peers) {
            return skipped("not asked for (--only)");
        }
        let Some(root) = workspace_root() else {
            return skipped("pybind/bench/bench.py not found next to this binary's workspace");
        };
        let Some(python) = python_with_tensorwire(&root) else {
            return skipped(
                "no Python with tensorwire and numpy (scripts/python-env installs them into .venv)",
            );
        };
        let list = |values: &mut dyn Iterator<Item = String>| values.collect::<Vec<_>>().join(",");
        let mut modes: Vec<&str> = plan.cases.iter().map(Case::mode_key).collect();
        modes.dedup();
        let exe = std::env::current_exe().map_or_else(|_| "?".into(), |p| p.display().to_string());
        let args = [
            "--json".to_owned(),
            "--fixture".into(),
            exe,
            "--skip".into(),
            "rust".into(),
            "--reps".into(),
            plan.reps.to_string(),
            "--seconds".into(),
            plan.seconds.to_string(),
            "--sizes".into(),
            list(&mut plan.sizes.iter().map(ToString::to_string)),
            "--modes".into(),
            modes.join(","),
            "--buffers".into(),
            "1,16".into(),
            "--inflight".into(),
            options.inflight.to_string(),
            "--inflight-bytes".into(),
            crate::suite::cases::IN_FLIGHT_BYTES.to_string(),
        ];
        let output = Command::new(&python)
            .arg(root.join("pybind/bench/bench.py"))
            .args(&args)
            .stderr(Stdio::inherit())
            .output();
        match output {
            // What it measured before a failure still counts; the failure is listed.
            Ok(out) => {
                let mut peers = Self::parse(&String::from_utf8_lossy(&out.stdout));
                if !out.status.success() {
                    peers.failed.push((
                        "bench.py".into(),
                        format!("exited with {} (its stderr is above)", out.status),
                    ));
                }
                peers
            }
            Err(e) => skipped(&format!("bench.py could not start: {e}")),
        }
    }

    /// Reads the driver's JSON lines.
    fn parse(text: &str) -> Self {
        let mut peers = Self::default();
        for line in text.lines() {
            let Ok(record) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let s = |key: &str| record[key].as_str().unwrap_or("?").to_owned();
            let n = |key: &str| {
                record[key]
                    .as_u64()
                    .and_then(|v| usize::try_from(v).ok())
                    .unwrap_or(0)
            };
            match record["kind"].as_str() {
                Some("version") => {
                    peers.versions.insert(s("name"), s("version"));
                }
                Some("unavailable") => peers.unavailable.push((s("peer"), s("reason"))),
                Some("note") => peers.notes.push((s("peer"), s("text"))),
                Some("failed") => peers.failed.push((s("peer"), s("reason"))),
                Some("not_applicable") => {
                    let entry = (s("peer"), s("reason"));
                    if !peers.not_applicable.contains(&entry) {
                        peers.not_applicable.push(entry);
                    }
                }
                Some("sample") => {
                    let peer = s("peer");
                    if !peers.names.contains(&peer) {
                        peers.names.push(peer.clone());
                    }
                    let value = record["value"].as_f64().unwrap_or(f64::NAN);
                    peers
                        .samples
                        .entry((peer, s("mode"), n("size"), n("buffers")))
                        .or_default()
                        .push(value);
                }
                _ => {}
            }
        }
        peers
    }

    /// Every sample of `peer` in `case`.
    pub(crate) fn samples(&self, peer: &str, case: &Case) -> &[f64] {
        self.samples
            .get(&(
                peer.to_owned(),
                case.mode_key().to_owned(),
                case.size,
                case.buffers,
            ))
            .map_or(&[], Vec::as_slice)
    }

    pub(crate) fn median(&self, peer: &str, case: &Case) -> f64 {
        median(self.samples(peer, case))
    }

    /// The peers that are other projects (not tensorwire from Python).
    pub(crate) fn others(&self) -> impl Iterator<Item = &String> {
        self.names.iter().filter(|n| !is_tensorwire(n))
    }

    /// The best other peer in `case`: (name, median).
    pub(crate) fn best_other(&self, case: &Case) -> Option<(&str, f64)> {
        let values: Vec<(&str, f64)> = self
            .others()
            .map(|n| (n.as_str(), self.median(n, case)))
            .filter(|(_, v)| v.is_finite())
            .collect();
        let best = case.best(values.iter().map(|(_, v)| *v));
        values.into_iter().find(|(_, v)| *v == best)
    }

    /// The package versions of everything measured, as JSON.
    pub(crate) fn versions_json(&self, references: &References) -> serde_json::Value {
        let mut map: serde_json::Map<String, serde_json::Value> = self
            .versions
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        map.insert(
            "ptr1-bench".into(),
            serde_json::Value::String(env!("CARGO_PKG_VERSION").into()),
        );
        if let Some(v) = &references.iperf3_version {
            map.insert("iperf3".into(), serde_json::Value::String(v.clone()));
        }
        serde_json::Value::Object(map)
    }
}

/// tensorwire driven from Python (its PTR1 and shared-memory columns).
pub(crate) fn is_tensorwire(name: &str) -> bool {
    name.starts_with("tensorwire")
}

/// The workspace this binary was built in (`target/<profile>/ptr1-bench` → the root).
pub(crate) fn workspace_root() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .find(|dir| dir.join("pybind/bench/bench.py").is_file())
        .map(Path::to_path_buf)
}

pub(crate) fn python_with_tensorwire(root: &Path) -> Option<PathBuf> {
    [root.join(".venv/bin/python"), PathBuf::from("python3")]
        .into_iter()
        .find(|python| {
            Command::new(python)
                .args(["-c", "import tensorwire, numpy"])
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Mode;

    #[test]
    fn the_drivers_lines_become_samples_versions_and_reasons() {
        let text = r#"{"kind": "version", "name": "pyzmq", "version": "26.2.0"}
{"kind": "unavailable", "peer": "Ray", "reason": "not installed (No module named 'ray')"}
{"kind": "sample", "peer": "tensorwire (Python)", "mode": "oneway", "size": 4096, "buffers": 1, "inflight": 1, "rep": 0, "value": 0.5}
{"kind": "sample", "peer": "pyzmq", "mode": "oneway", "size": 4096, "buffers": 1, "inflight": 1, "rep": 0, "value": 0.2}
{"kind": "sample", "peer": "pyzmq", "mode": "oneway", "size": 4096, "buffers": 1, "inflight": 1, "rep": 1, "value": 0.3}
{"kind": "not_applicable", "peer": "gRPC (Python)", "mode": "oneway", "size": 4096, "buffers": 16, "reason": "one bytes object per call"}
{"kind": "failed", "peer": "Ray", "reason": "one-way 256 MiB × 1: the actor died"}
not json: ignored"#;
        let peers = Peers::parse(text);
        let case = Case {
            mode: Mode::OneWay,
            size: 4096,
            buffers: 1,
            inflight: 1,
        };
        assert_eq!(peers.samples("pyzmq", &case), &[0.2, 0.3]);
        assert_eq!(peers.best_other(&case), Some(("pyzmq", 0.3)));
        assert_eq!(peers.versions["pyzmq"], "26.2.0");
        assert_eq!(peers.unavailable.len(), 1);
        assert_eq!(peers.not_applicable.len(), 1);
        assert_eq!(peers.failed[0].0, "Ray");
        assert_eq!(
            peers.others().collect::<Vec<_>>(),
            vec![&"pyzmq".to_owned()]
        );
    }
}
