//! `ptr1-bench suite` (alias `compare`): every path tensorwire has and the baselines, side by
//! side on one machine, over one matrix of modes × sizes × buffer counts; then the physical
//! references (iperf3, single-thread memcpy) and the peers users would pick instead (from
//! Python, each in its own process).
//!
//! Each repetition runs every case on every column, rotating the column order per case and
//! repetition, so the slow and fast moments of a noisy machine fall on all of them; tables
//! show medians, `results.json` keeps every sample. CPU is user + system time of both
//! processes (from `/proc`, 10 ms ticks; softirq time the kernel accounts separately is not
//! included) per GB of payload.

mod cases;
mod columns;
mod cpu_pair;
mod drift;
mod fresh;
mod json;
mod paired;
mod peers;
mod ray_rdt;
mod references;
mod server;
mod setup;
mod steered;
mod table;
mod verdict;

pub(crate) use cpu_pair::probe as cpu_pair_probe;

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::cli::Part;
use crate::measure::{self, Sample};
use crate::progress::Progress;
use crate::report::say;
use crate::{Options, environment};
pub(crate) use cases::{Case, human};
use columns::{Column, Lanes};
use peers::PeerInfo;
use verdict::{Entrant, Verdict};

/// What one cell of one repetition measured.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Measurement {
    pub(crate) gb_per_s: f64,
    pub(crate) ops_per_s: f64,
    pub(crate) p50_us: f64,
    pub(crate) p90_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    pub(crate) max_us: f64,
    pub(crate) cpu_s_per_gb: f64,
    /// User + system seconds both processes burned in the cell (its warm-up included).
    pub(crate) cpu_s: f64,
    pub(crate) ops: u64,
    pub(crate) seconds: f64,
    pub(crate) verified: bool,
    /// The untimed sleep before each operation, on average (µs; 0 without a gap).
    pub(crate) gap_us: f64,
    /// The host's CPU pair right before the cell ([`cpu_pair::probe`], µs; NaN: not probed).
    pub(crate) cpu_pair_us: f64,
}

/// One fixture process's resident memory in bytes: after it started, its peak, right after the
/// matrix and after [`IDLE_WAIT`] of idleness (what it gives back).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FixtureMemory {
    pub(crate) name: &'static str,
    pub(crate) start: u64,
    pub(crate) peak: u64,
    pub(crate) end: u64,
    pub(crate) idle: u64,
}

/// How long the fixtures stay idle after the matrix before their memory is read again.
pub(crate) const IDLE_WAIT: Duration = Duration::from_secs(5);

/// How a run is shaped: repetitions, time per cell, the matrix, the parts, and which passes.
pub(crate) struct Plan {
    pub(crate) reps: usize,
    pub(crate) seconds: f64,
    pub(crate) sizes: &'static [usize],
    pub(crate) cases: Vec<Case>,
    pub(crate) parts: Vec<Part>,
    pub(crate) quick: bool,
    pub(crate) smoke: bool,
    /// The warm pass: every fixture and client made once, every cell measured on them.
    pub(crate) warm: bool,
    /// The fresh pass: new processes for every cell, short cells (a user's first seconds).
    pub(crate) fresh: bool,
    pub(crate) fresh_reps: usize,
    pub(crate) fresh_seconds: f64,
}

/// One pass over the matrix: the tensorwire columns and the peers.
pub(crate) struct Pass {
    /// New processes for every cell (else: warm processes for the whole pass).
    pub(crate) fresh: bool,
    pub(crate) columns: Vec<Column>,
    /// `[case][column][repetition]`.
    pub(crate) samples: Vec<Vec<Vec<Measurement>>>,
    pub(crate) peers: peers::Peers,
    /// The 1-minute load average when the pass started.
    pub(crate) load: f64,
}

/// Everything measured, for the tables, the plots and the JSON.
pub(crate) struct Results {
    pub(crate) plan: Plan,
    /// The warm pass first, then the fresh one (each when the plan has it).
    pub(crate) passes: Vec<Pass>,
    pub(crate) unavailable: Vec<(Column, String)>,
    pub(crate) references: references::References,
    /// Ray actor to actor: tensorwire's Ray Direct Transport and Ray's object store.
    pub(crate) ray: ray_rdt::RayRdt,
    /// Every fixture process's resident memory.
    pub(crate) fixture_memory: Vec<FixtureMemory>,
    /// A fresh receiver's peak resident memory after one 1 GiB message, per column.
    pub(crate) peak_rss_1gib: Vec<(Column, Result<u64, String>)>,
    pub(crate) environment: serde_json::Value,
}

pub(crate) fn suite(options: &Options) -> Result<()> {
    let exe = std::env::current_exe()?;
    if options.netns {
        crate::placement::across_hosts(
            options.rate.as_deref(),
            options.flow_rate.as_deref(),
            options.loss_percent,
        )?;
        say!(
            "across hosts: fixtures on 10.201.0.1, this process on 10.201.0.2 (network \
             namespaces, veth through a bridge){}{}; the local mailbox, shared memory and the \
             Python peers are same-host paths and not measured",
            options.rate.as_ref().map_or(String::new(), |rate| format!(
                ", client link limited to {rate}"
            )) + &options
                .flow_rate
                .as_ref()
                .map_or(String::new(), |rate| format!(
                    ", each connection from the client limited to {rate} (an htb class per flow)"
                )),
            options.loss_percent.map_or(String::new(), |p| format!(
                ", {p}% of TCP packets dropped at random"
            ))
        );
    }
    let plan = Plan::new(options);
    if plan.parts.is_empty() {
        anyhow::bail!("--netns measures the ptr1 and http2 parts only; --only left none of them");
    }
    let mut environment = environment::describe();
    environment["netns"] = crate::placement::describe();
    if plan.smoke {
        say!(
            "smoke run: tiny sizes, one short repetition, every echoed payload verified byte for \
             byte and every sink's byte count checked"
        );
    }
    say!(
        "machine: {} ({} cores, {}), Linux {}, commit {}",
        environment["cpu"].as_str().unwrap_or("?"),
        environment["cores"],
        environment["memory"].as_str().unwrap_or("?"),
        environment["kernel"].as_str().unwrap_or("?"),
        environment["commit"].as_str().unwrap_or("?")
    );
    let args: Vec<String> = std::env::args().skip(1).collect();
    say!("command: ptr1-bench {}", args.join(" "));
    setup::prepare(&plan);
    let mut passes = Vec::new();
    let mut unavailable = Vec::new();
    let mut fixture_memory = Vec::new();
    let mut columns = Vec::new();
    if plan.warm {
        let load = load_average();
        let mut lanes = Lanes::start(&exe, options, &plan.parts)?;
        for (column, why) in &lanes.unavailable {
            say!("{}: not measured here: {why}", column.name());
        }
        let rss_start = lanes.fixture_rss();
        let mut steered = steered::Steered::start(options, &plan, false);
        let samples = measure_matrix(&mut lanes, &plan, options, steered.as_mut())?;
        fixture_memory = lanes.fixture_memory(&rss_start);
        columns = lanes.lanes.iter().map(|lane| lane.column).collect();
        unavailable = std::mem::take(&mut lanes.unavailable);
        drop(lanes);
        let peers = peers::Peers::measure(options, &plan, false, steered);
        passes.push(Pass {
            fresh: false,
            columns: columns.clone(),
            samples,
            peers,
            load,
        });
    }
    if plan.fresh {
        let load = load_average();
        say!(
            "\nfresh pass: new processes for every cell ({} s cells); 1-minute load average {load:.2} \
             before it{}",
            plan.fresh_seconds,
            if load > 0.5 {
                " — the machine is not idle, so fresh figures carry other work's noise"
            } else {
                ""
            }
        );
        let mut steered = steered::Steered::start(options, &plan, true);
        let matrix = fresh::measure_matrix(&exe, &plan, options, &unavailable, steered.as_mut())?;
        if !plan.warm {
            columns.clone_from(&matrix.columns);
            unavailable = matrix.refused;
        }
        let peers = peers::Peers::measure(options, &plan, true, steered);
        passes.push(Pass {
            fresh: true,
            columns: matrix.columns,
            samples: matrix.samples,
            peers,
            load,
        });
    }
    let references = references::References::measure(&plan);
    let ray = ray_rdt::RayRdt::measure(&plan);
    let peak_rss_1gib = if plan.quick || !plan.warm {
        Vec::new()
    } else {
        references::peak_rss_for_one_gib(&exe, options, &columns)
    };
    environment["packages"] = passes.first().map_or(serde_json::Value::Null, |p| {
        p.peers.versions_json(&references)
    });
    let results = Results {
        plan,
        passes,
        unavailable,
        references,
        ray,
        fixture_memory,
        peak_rss_1gib,
        environment,
    };
    table::print(&results);
    smoke_requires_peers(&results)?;
    let json = json::to_json(&results, options);
    if let Some(path) = &options.json {
        std::fs::write(path, serde_json::to_string_pretty(&json)?)?;
        say!("\nwrote {path}");
    }
    if let Some(dir) = &options.out {
        let dir = Path::new(dir);
        let mut written = vec![crate::report::write(dir)?];
        let path = dir.join("results.json");
        std::fs::write(&path, serde_json::to_string_pretty(&json)?)?;
        written.push(path);
        written.extend(crate::plots::write(&json, dir)?);
        println!("\nwrote the table, the JSON and the plots:");
        for path in written {
            println!("  {}", path.display());
        }
    }
    Ok(())
}

/// The run options of one cell: `case` for `seconds`, the rest as `options` say.
fn case_options(case: &Case, seconds: f64, options: &Options) -> Options {
    Options {
        mode: case.mode,
        size: case.size,
        buffers: case.buffers,
        inflight: case.inflight,
        gap: case.gap,
        duration: Duration::from_secs_f64(seconds),
        messages: None,
        ..options.clone()
    }
}

/// Every case on every column, `plan.reps` times, interleaved; MPI's C peers (`steered`)
/// measured on each case right before or right after the columns.
fn measure_matrix(
    lanes: &mut Lanes,
    plan: &Plan,
    options: &Options,
    mut steered: Option<&mut steered::Steered>,
) -> Result<Vec<Vec<Vec<Measurement>>>> {
    let n = lanes.lanes.len();
    let mut samples = vec![vec![Vec::new(); n]; plan.cases.len()];
    let mut progress = Progress::new("suite", plan.reps * plan.cases.len());
    for rep in 0..plan.reps {
        for (c, case) in plan.cases.iter().enumerate() {
            let message = measure::message(case.size, case.buffers);
            let run = case_options(case, plan.seconds, options);
            steered::around(steered.as_deref_mut(), rep, c, case, || -> Result<()> {
                for k in 0..n {
                    let l = (k + rep + c) % n;
                    let lane = &mut lanes.lanes[l];
                    if !lane.column.measures(case) {
                        continue;
                    }
                    let cpu_pair_us = cpu_pair::probe();
                    let (sample, cpu) = lane.measure(&run, &message).with_context(|| {
                        format!("{} over {} failed", case.label(), lane.column.name())
                    })?;
                    samples[c][l].push(Measurement::new(&sample, cpu).probed(cpu_pair_us));
                }
                Ok(())
            })?;
            progress.step(&format!("rep {}/{}: {}", rep + 1, plan.reps, case.label()));
        }
    }
    Ok(samples)
}

impl Plan {
    fn new(options: &Options) -> Self {
        let (quick, smoke) = (options.quick || options.smoke, options.smoke);
        let reps = if quick { 1 } else { options.reps };
        let seconds = options.seconds.unwrap_or(if smoke {
            0.05
        } else if quick {
            0.1
        } else {
            0.5
        });
        let sizes = cases::sizes(quick, smoke);
        let mut parts = options.only.clone().unwrap_or_else(|| Part::ALL.to_vec());
        if options.netns {
            // Across hosts only the network paths apply.
            parts.retain(|part| matches!(part, Part::Ptr1 | Part::Http2));
        }
        // `--fresh` alone is the fresh pass; the full suite and the smoke run both; --quick
        // only the warm one, and so does --netns unless --fresh asks for it.
        let fresh_seconds = if smoke {
            0.05
        } else if options.fresh {
            options.seconds.unwrap_or(FRESH_SECONDS)
        } else {
            FRESH_SECONDS
        };
        Self {
            reps,
            seconds,
            sizes,
            cases: cases::matrix(sizes, options.inflight),
            parts,
            quick,
            smoke,
            warm: !options.fresh,
            fresh: options.fresh || (!options.netns && (smoke || !quick)),
            // The full suite's fresh pass is one repetition (it starts processes for every
            // cell); `--fresh` alone takes --reps.
            fresh_reps: if options.fresh { reps } else { 1 },
            fresh_seconds,
        }
    }
}

/// A fresh cell's length: a user's first half second.
pub(crate) const FRESH_SECONDS: f64 = 0.5;

/// The 1-minute load average (NaN where it cannot be read).
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// In `--smoke`, a peer that could not be measured is said loudly; with
/// `TENSORWIRE_REQUIRE_PEERS=1` (scripts/test-all sets it) it fails the run.
fn smoke_requires_peers(r: &Results) -> Result<()> {
    if !r.plan.smoke || crate::placement::is_across() || !r.plan.parts.contains(&Part::Peers) {
        return Ok(());
    }
    let mut missing: Vec<(String, String)> =
        r.passes.iter().flat_map(|p| p.peers.missing()).collect();
    for pass in &r.passes {
        if pass.peers.skipped.is_none() && !pass.peers.steered {
            missing.push((
                format!("MPI's C ranks ({} pass)", pass.name()),
                "not measured case by case with the Rust columns (bench.py --steer did not \
                 start; said above)"
                    .into(),
            ));
        }
    }
    if missing.is_empty() {
        say!("\nsmoke: every peer was measured, warm and fresh");
        return Ok(());
    }
    say!("\n!!! smoke: PEERS NOT MEASURED — this run does not cover them:");
    for (peer, why) in &missing {
        say!("!!!   {peer}: {why}");
    }
    if std::env::var("TENSORWIRE_REQUIRE_PEERS").is_ok_and(|v| v == "1") {
        anyhow::bail!(
            "TENSORWIRE_REQUIRE_PEERS=1 and {} peer(s) were not measured (above)",
            missing.len()
        );
    }
    say!("!!! (TENSORWIRE_REQUIRE_PEERS=1 turns this into a failure; scripts/test-all sets it)");
    Ok(())
}

impl Measurement {
    fn new(sample: &Sample, cpu: Duration) -> Self {
        // The CPU reading spans the warm-up too, so its bytes count here.
        let gb = (sample.payload_bytes + sample.untimed_bytes) as f64 / 1e9;
        Self {
            gb_per_s: sample.gb_per_s(),
            ops_per_s: sample.ops_per_s(),
            p50_us: sample.latency_us(0.5),
            p90_us: sample.latency_us(0.9),
            p99_us: sample.latency_us(0.99),
            p999_us: sample.latency_us(0.999),
            max_us: sample.latency_us(1.0),
            cpu_s_per_gb: if gb > 0.0 {
                cpu.as_secs_f64() / gb
            } else {
                f64::NAN
            },
            cpu_s: cpu.as_secs_f64(),
            ops: sample.ops,
            seconds: sample.elapsed.as_secs_f64(),
            verified: sample.verified,
            gap_us: sample.gap_us(),
            cpu_pair_us: f64::NAN,
        }
    }
}

impl Measurement {
    /// The same, with the host's CPU pair as probed right before it.
    pub(crate) fn probed(self, cpu_pair_us: f64) -> Self {
        Self {
            cpu_pair_us,
            ..self
        }
    }
}

impl Pass {
    /// The median figure of case `c` on column index `l`.
    pub(crate) fn median(&self, cases: &[Case], c: usize, l: usize) -> f64 {
        let case = &cases[c];
        median(
            &self.samples[c][l]
                .iter()
                .map(|m| case.figure(m))
                .collect::<Vec<_>>(),
        )
    }

    /// The median of `f` over case `c`'s samples on column index `l`.
    pub(crate) fn median_of(&self, c: usize, l: usize, f: impl Fn(&Measurement) -> f64) -> f64 {
        median(&self.samples[c][l].iter().map(f).collect::<Vec<_>>())
    }

    /// The verdicts of case `c`: every column and every peer with a figure in it, paired by
    /// kind and language (`infos`: the peers' [`Peers::infos`], asked once per table).
    pub(crate) fn verdicts<'a>(
        &'a self,
        cases: &[Case],
        c: usize,
        infos: &'a [PeerInfo],
    ) -> Vec<Verdict<'a>> {
        let case = &cases[c];
        let usual = paired::usual_probe(self);
        let mut entrants: Vec<Entrant<'_>> = self
            .columns
            .iter()
            .enumerate()
            .filter_map(|(l, column)| {
                let samples = &self.samples[c][l];
                let slow = samples
                    .iter()
                    .filter(|m| cpu_pair::is_slow(m.cpu_pair_us, usual))
                    .count();
                Some(Entrant {
                    name: column.name(),
                    ours: true,
                    transfer: column.transfer(case)?,
                    language: "rust",
                    value: self.median(cases, c, l),
                    spins_through_gaps: column.spins_through_gaps(),
                    slow_placement: 2 * slow > samples.len(),
                })
            })
            .collect();
        entrants.extend(self.peers.entrants(case, infos, usual));
        verdict::verdicts(case, &entrants)
    }

    /// The index of `column` among the measured columns.
    pub(crate) fn index(&self, column: Column) -> Option<usize> {
        self.columns.iter().position(|c| *c == column)
    }

    /// "warm" or "fresh".
    pub(crate) fn name(&self) -> &'static str {
        if self.fresh { "fresh" } else { "warm" }
    }
}

impl Results {
    pub(crate) fn warm(&self) -> Option<&Pass> {
        self.passes.iter().find(|p| !p.fresh)
    }

    pub(crate) fn fresh(&self) -> Option<&Pass> {
        self.passes.iter().find(|p| p.fresh)
    }
}

/// The median of the finite values (the upper one of an even count); NaN when there are none.
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}
