//! The transports users would pick instead, driven from Python in their own processes by
//! `pybind/bench/bench.py --json` over the suite's own cases: tensorwire from Python (PTR1 and
//! shared memory), pyzmq, gRPC, `multiprocessing.shared_memory`, Ray, iceoryx2, MPI (mpi4py's
//! ranks, and the same ranks in C, which the verdict sets beside the Rust columns). A peer that is
//! not installed, or a case a peer has no way to run, is listed with the reason, never skipped
//! silently.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Options;
use crate::cli::Part;
use crate::suite::cpu_pair;
use crate::suite::references::References;
use crate::suite::steered::{self, Steered};
use crate::suite::verdict::{Entrant, Transfer};
use crate::suite::{Case, Plan, median};

/// What the peers' driver found.
#[derive(Default)]
pub(crate) struct Peers {
    /// Why no peer was measured, if none was.
    pub(crate) skipped: Option<String>,
    /// The peers measured, in the driver's order (tensorwire from Python first).
    pub(crate) names: Vec<String>,
    /// What each peer is: its language, whether it busy-polls, whether it is tensorwire.
    info: BTreeMap<String, PeerInfo>,
    /// Samples by (peer, mode, size, buffers).
    samples: BTreeMap<(String, String, usize, usize), Vec<PeerSample>>,
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
    /// The 1-minute load average when the driver started (a fresh run wants an idle machine).
    pub(crate) load: Option<f64>,
    /// Whether MPI's C peers were measured case by case with the Rust columns
    /// ([`Steered`]) rather than after them.
    pub(crate) steered: bool,
    /// Why the driver stopped probing the host's CPU pair, if it did (once per reason).
    pub(crate) probe_notes: Vec<String>,
}

/// What the driver says a peer is.
#[derive(Clone, Debug)]
pub(crate) struct PeerInfo {
    pub(crate) language: String,
    pub(crate) spins: bool,
    /// Whether its threads stay busy between messages however far apart they come (the
    /// verdict divides ours that do only by peers that do).
    pub(crate) spins_through_gaps: bool,
    pub(crate) ours: bool,
}

/// One cell of one peer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerSample {
    pub(crate) value: f64,
    /// User + system seconds of the driver and the peer's processes during the cell.
    pub(crate) cpu_s: f64,
    /// How long the cell took.
    pub(crate) seconds: f64,
    pub(crate) transfer: Option<Transfer>,
    /// The host's CPU pair right before the cell, as the driver probed it (`ptr1-bench
    /// cpu-pair`, µs; NaN: not probed).
    pub(crate) cpu_pair_us: f64,
}

impl Peers {
    /// Runs the driver over the plan's cases: warm (each peer's processes made once), or
    /// `fresh` (new processes for every cell). The peers `steered` measured case by case
    /// beside the Rust columns are left out here and their records taken as they are.
    pub(crate) fn measure(
        options: &Options,
        plan: &Plan,
        fresh: bool,
        steered: Option<Steered>,
    ) -> Self {
        let skipped = |why: String| Self {
            skipped: Some(why),
            ..Self::default()
        };
        let (python, script, mut args) = match driver(options, plan, fresh) {
            Ok(driver) => driver,
            Err(why) => return skipped(why),
        };
        let was_steered = steered.is_some();
        let skip = if was_steered {
            format!("rust,{}", steered::KEYS)
        } else {
            "rust".to_owned()
        };
        args.extend(["--skip".into(), skip]);
        // Its ranks are not kept alive through the Python peers' phase.
        let steered = steered.map(Steered::finish).unwrap_or_default();
        let output = Command::new(&python)
            .arg(script)
            .args(&args)
            .stderr(Stdio::inherit())
            .output();
        let (records, failed, skipped) = match output {
            // What it measured before a failure still counts; the failure is listed.
            Ok(out) => (
                String::from_utf8_lossy(&out.stdout).into_owned(),
                (!out.status.success()).then(|| {
                    let why = format!("exited with {} (its stderr is above)", out.status);
                    ("bench.py".to_owned(), why)
                }),
                None,
            ),
            Err(e) => (
                String::new(),
                None,
                Some(format!("bench.py could not start: {e}")),
            ),
        };
        // The steered peers' records after the main driver's: the table keeps its order.
        let mut peers = Self::parse(&(records + &steered));
        peers.steered = was_steered;
        peers.skipped = skipped;
        peers.failed.extend(failed);
        peers
    }

    /// Reads the driver's JSON lines.
    pub(crate) fn parse(text: &str) -> Self {
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
                // The main driver's (its records come first): the load when the Python
                // peers began.
                Some("load") => peers.load = peers.load.or_else(|| record["loadavg"].as_f64()),
                Some("peer") => {
                    let name = s("peer");
                    let info = PeerInfo {
                        language: record["language"].as_str().unwrap_or("python").to_owned(),
                        spins: record["spins"].as_bool().unwrap_or(false),
                        spins_through_gaps: record["spins_through_gaps"].as_bool().unwrap_or(false),
                        ours: record["ours"]
                            .as_bool()
                            .unwrap_or_else(|| is_tensorwire(&name)),
                    };
                    peers.info.insert(name, info);
                }
                Some("unavailable") => peers.unavailable.push((s("peer"), s("reason"))),
                Some("note") => peers.notes.push((s("peer"), s("text"))),
                Some("probe_note") => {
                    let text = s("text");
                    if !peers.probe_notes.contains(&text) {
                        peers.probe_notes.push(text);
                    }
                }
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
                    let number = |key: &str| record[key].as_f64().unwrap_or(f64::NAN);
                    let sample = PeerSample {
                        value: number("value"),
                        cpu_s: number("cpu_s"),
                        seconds: number("seconds"),
                        transfer: record["transfer"].as_str().and_then(Transfer::parse),
                        cpu_pair_us: number("cpu_pair_us"),
                    };
                    peers
                        .samples
                        .entry((peer, s("mode"), n("size"), n("buffers")))
                        .or_default()
                        .push(sample);
                }
                _ => {}
            }
        }
        peers
    }

    /// Every cell of `peer` in `case`.
    pub(crate) fn cells(&self, peer: &str, case: &Case) -> &[PeerSample] {
        self.samples
            .get(&(
                peer.to_owned(),
                case.mode_key().to_owned(),
                case.size,
                case.buffers,
            ))
            .map_or(&[], Vec::as_slice)
    }

    /// Every probe of the host's CPU pair the driver took (µs; NaN where it took none).
    pub(crate) fn probes(&self) -> impl Iterator<Item = f64> + '_ {
        self.samples.values().flatten().map(|s| s.cpu_pair_us)
    }

    /// Every figure of `peer` in `case`.
    pub(crate) fn samples(&self, peer: &str, case: &Case) -> Vec<f64> {
        self.cells(peer, case).iter().map(|s| s.value).collect()
    }

    pub(crate) fn median(&self, peer: &str, case: &Case) -> f64 {
        median(&self.samples(peer, case))
    }

    /// The median CPU seconds `peer` burned per cell of `case`.
    pub(crate) fn cpu_median(&self, peer: &str, case: &Case) -> f64 {
        median(
            &self
                .cells(peer, case)
                .iter()
                .map(|s| s.cpu_s)
                .collect::<Vec<_>>(),
        )
    }

    /// What `peer`'s transfer does with the bytes in `case`.
    pub(crate) fn transfer(&self, peer: &str, case: &Case) -> Option<Transfer> {
        self.cells(peer, case).iter().find_map(|s| s.transfer)
    }

    /// What the driver said `peer` is (a peer it did not describe: Python, not spinning, and
    /// tensorwire if its name says so).
    pub(crate) fn info(&self, peer: &str) -> PeerInfo {
        self.info.get(peer).cloned().unwrap_or_else(|| PeerInfo {
            language: "python".into(),
            spins: false,
            spins_through_gaps: false,
            ours: is_tensorwire(peer),
        })
    }

    /// Every peer with a figure in `case`, as the verdict takes them; a peer whose cells
    /// mostly ran on the slow placement of the host's CPU pair (their probes against the
    /// pass's `usual` one) is marked so.
    pub(crate) fn entrants<'a>(
        &'a self,
        case: &Case,
        languages: &'a [PeerInfo],
        usual: f64,
    ) -> Vec<Entrant<'a>> {
        self.names
            .iter()
            .zip(languages)
            .filter_map(|(name, info)| {
                let cells = self.cells(name, case);
                let slow = cells
                    .iter()
                    .filter(|s| cpu_pair::is_slow(s.cpu_pair_us, usual))
                    .count();
                Some(Entrant {
                    name,
                    ours: info.ours,
                    transfer: self.transfer(name, case)?,
                    language: &info.language,
                    value: self.median(name, case),
                    spins_through_gaps: info.spins_through_gaps,
                    slow_placement: 2 * slow > cells.len(),
                })
            })
            .collect()
    }

    /// What the driver said about every measured peer, in `names`' order.
    pub(crate) fn infos(&self) -> Vec<PeerInfo> {
        self.names.iter().map(|n| self.info(n)).collect()
    }

    /// Every peer that was asked for and is missing: not installed, could not start, or failed.
    pub(crate) fn missing(&self) -> Vec<(String, String)> {
        let mut missing = self.unavailable.clone();
        missing.extend(self.failed.iter().cloned());
        if let Some(why) = &self.skipped {
            missing.push(("every peer".into(), why.clone()));
        }
        missing
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

/// The peers' driver for a pass over the plan's cases: the Python to run it with, the script,
/// and its arguments (every peer but the caller's `--skip` or `--only`); `Err` says why no peer
/// is measured.
pub(crate) fn driver(
    options: &Options,
    plan: &Plan,
    fresh: bool,
) -> Result<(PathBuf, PathBuf, Vec<String>), String> {
    if crate::placement::is_across() {
        return Err("same-host peers: not run with --netns".into());
    }
    if !plan.parts.contains(&Part::Peers) {
        return Err("not asked for (--only)".into());
    }
    let Some(root) = workspace_root() else {
        return Err("pybind/bench/bench.py not found next to this binary's workspace".into());
    };
    let Some(python) = python_with_tensorwire(&root) else {
        return Err(
            "no Python with tensorwire and numpy (scripts/python-env installs them into .venv)"
                .into(),
        );
    };
    let list = |values: &mut dyn Iterator<Item = String>| values.collect::<Vec<_>>().join(",");
    let mut modes: Vec<&str> = plan.cases.iter().map(Case::mode_key).collect();
    modes.dedup();
    let exe = std::env::current_exe().map_or_else(|_| "?".into(), |p| p.display().to_string());
    let (reps, seconds) = if fresh {
        (plan.fresh_reps, plan.fresh_seconds)
    } else {
        (plan.reps, plan.seconds)
    };
    let mut args = vec![
        "--json".to_owned(),
        "--fixture".into(),
        exe,
        "--reps".into(),
        reps.to_string(),
        "--seconds".into(),
        seconds.to_string(),
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
        "--sporadic-gap".into(),
        crate::suite::cases::SPORADIC_GAP.as_secs_f64().to_string(),
    ];
    if fresh {
        args.push("--fresh".into());
    }
    Ok((python, root.join("pybind/bench/bench.py"), args))
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

    fn one_way_4_kib() -> Case {
        Case {
            mode: Mode::OneWay,
            size: 4096,
            buffers: 1,
            inflight: 1,
            gap: std::time::Duration::ZERO,
        }
    }

    #[test]
    fn the_drivers_lines_become_samples_kinds_versions_and_reasons() {
        let text = r#"{"kind": "version", "name": "pyzmq", "version": "26.2.0"}
{"kind": "load", "loadavg": 0.25, "fresh": true}
{"kind": "peer", "peer": "tensorwire (Python)", "language": "python", "spins": true, "ours": true}
{"kind": "peer", "peer": "MPI one host", "language": "python", "spins": true, "spins_through_gaps": true, "ours": false}
{"kind": "unavailable", "peer": "Ray", "reason": "not installed (No module named 'ray')"}
{"kind": "sample", "peer": "tensorwire (Python)", "mode": "oneway", "size": 4096, "buffers": 1, "inflight": 1, "rep": 0, "value": 0.5, "transfer": "kernel", "cpu_s": 0.2, "seconds": 0.5}
{"kind": "sample", "peer": "pyzmq", "mode": "oneway", "size": 4096, "buffers": 1, "inflight": 1, "rep": 0, "value": 0.2, "transfer": "kernel", "cpu_s": 0.1, "seconds": 0.5}
{"kind": "sample", "peer": "pyzmq", "mode": "oneway", "size": 4096, "buffers": 1, "inflight": 1, "rep": 1, "value": 0.3, "transfer": "kernel", "cpu_s": 0.3, "seconds": 0.5}
{"kind": "sample", "peer": "pyzmq", "mode": "rtt", "size": 4096, "buffers": 1, "inflight": 1, "rep": 0, "value": 30.0, "transfer": "kernel", "cpu_s": 0.1, "seconds": 0.5}
{"kind": "sample", "peer": "pyzmq", "mode": "sporadic", "size": 4096, "buffers": 1, "inflight": 1, "rep": 0, "value": 150.0, "transfer": "kernel", "cpu_s": 0.1, "seconds": 1.2}
{"kind": "sample", "peer": "MPI one host", "mode": "oneway", "size": 4096, "buffers": 1, "inflight": 1, "rep": 0, "value": 1.0, "transfer": "one_copy", "cpu_s": 1.0, "seconds": 0.5}
{"kind": "not_applicable", "peer": "gRPC (Python)", "mode": "oneway", "size": 4096, "buffers": 16, "reason": "one bytes object per call"}
{"kind": "failed", "peer": "Ray", "reason": "one-way 256 MiB × 1: the actor died"}
{"kind": "probe_note", "text": "no more CPU-pair probes: two probes in a row took over 10 s"}
{"kind": "probe_note", "text": "no more CPU-pair probes: two probes in a row took over 10 s"}
not json: ignored"#;
        let peers = Peers::parse(text);
        let case = one_way_4_kib();
        assert_eq!(peers.samples("pyzmq", &case), vec![0.2, 0.3]);
        let rtt = Case {
            mode: Mode::Rtt,
            ..case
        };
        let sporadic = Case {
            gap: crate::suite::cases::SPORADIC_GAP,
            ..rtt
        };
        assert_eq!(peers.samples("pyzmq", &rtt), vec![30.0]);
        assert_eq!(
            peers.samples("pyzmq", &sporadic),
            vec![150.0],
            "apart from RTT"
        );
        assert!((peers.cpu_median("pyzmq", &case) - 0.3).abs() < 1e-9);
        assert_eq!(
            peers.transfer("MPI one host", &case),
            Some(Transfer::OneCopy)
        );
        assert!(peers.info("MPI one host").spins);
        assert!(peers.info("MPI one host").spins_through_gaps);
        assert!(!peers.info("tensorwire (Python)").spins_through_gaps);
        assert!(peers.info("tensorwire (Python)").ours);
        assert!(!peers.info("pyzmq").ours, "undescribed peers are not ours");
        assert_eq!(peers.versions["pyzmq"], "26.2.0");
        assert_eq!(peers.load, Some(0.25));
        assert_eq!(peers.unavailable.len(), 1);
        assert_eq!(peers.not_applicable.len(), 1);
        assert_eq!(peers.failed[0].0, "Ray");
        assert_eq!(peers.missing().len(), 2);
        assert_eq!(peers.probe_notes.len(), 1, "one note per reason");
        assert!(peers.notes.is_empty(), "a probe's note is no peer's");
        let infos = peers.infos();
        let entrants = peers.entrants(&case, &infos, f64::NAN);
        let verdicts = crate::suite::verdict::verdicts(&case, &entrants);
        // tensorwire goes through the kernel here: pyzmq is its peer, MPI (one copy) is not.
        assert_eq!(verdicts.len(), 1);
        assert_eq!(
            verdicts[0].to_string(),
            "1.67× (tensorwire (Python) ÷ pyzmq)"
        );
    }

    #[test]
    fn a_peer_whose_cells_the_driver_probed_on_the_slow_placement_is_marked() {
        let sample = |peer: &str, rep: u32, value: f64, probe: &str| {
            format!(
                r#"{{"kind": "sample", "peer": "{peer}", "mode": "oneway", "size": 4096, "buffers": 1, "inflight": 1, "rep": {rep}, "value": {value}, "transfer": "kernel", "cpu_s": 0.1, "seconds": 0.5, "cpu_pair_us": {probe}}}"#
            )
        };
        let text = [
            r#"{"kind": "peer", "peer": "tensorwire (Python)", "language": "python", "spins": false, "ours": true}"#.to_owned(),
            sample("tensorwire (Python)", 0, 0.5, "1.0"),
            sample("tensorwire (Python)", 1, 0.5, "1.1"),
            sample("tensorwire (Python)", 2, 0.5, "null"),
            // Two of pyzmq's three cells ran where a probe took 3.5 µs.
            sample("pyzmq", 0, 0.2, "3.5"),
            sample("pyzmq", 1, 0.2, "3.5"),
            sample("pyzmq", 2, 0.2, "1.0"),
        ]
        .join("\n");
        let peers = Peers::parse(&text);
        let case = one_way_4_kib();
        let infos = peers.infos();
        let marked = |usual: f64| {
            let entrants = peers.entrants(&case, &infos, usual);
            let slow: Vec<bool> = entrants.iter().map(|e| e.slow_placement).collect();
            let verdicts = crate::suite::verdict::verdicts(&case, &entrants);
            (slow, verdicts[0].to_string())
        };
        assert_eq!(
            marked(1.0),
            (
                vec![false, true],
                "2.50× § (tensorwire (Python) ÷ pyzmq)".to_owned()
            )
        );
        // Without a usual probe to read them against (no column probed), nothing is marked.
        assert_eq!(
            marked(f64::NAN),
            (
                vec![false, false],
                "2.50× (tensorwire (Python) ÷ pyzmq)".to_owned()
            )
        );
    }
}
