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
mod json;
mod peers;
mod ray_rdt;
mod references;
mod server;
mod setup;
mod table;

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
    pub(crate) ops: u64,
    pub(crate) seconds: f64,
    pub(crate) verified: bool,
}

/// Resident bytes of each fixture process, by transport.
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

/// How a run is shaped: repetitions, time per cell, the matrix, the parts.
pub(crate) struct Plan {
    pub(crate) reps: usize,
    pub(crate) seconds: f64,
    pub(crate) sizes: &'static [usize],
    pub(crate) cases: Vec<Case>,
    pub(crate) parts: Vec<Part>,
    pub(crate) quick: bool,
    pub(crate) smoke: bool,
}

/// Everything measured, for the tables, the plots and the JSON.
pub(crate) struct Results {
    pub(crate) plan: Plan,
    pub(crate) columns: Vec<Column>,
    pub(crate) unavailable: Vec<(Column, String)>,
    /// `[case][column][repetition]`.
    pub(crate) samples: Vec<Vec<Vec<Measurement>>>,
    pub(crate) references: references::References,
    pub(crate) peers: peers::Peers,
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
        crate::placement::across_hosts(options.rate.as_deref(), options.loss_percent)?;
        say!(
            "across hosts: fixtures on 10.201.0.1, this process on 10.201.0.2 (network \
             namespaces, veth through a bridge){}{}; the local mailbox, shared memory and the \
             Python peers are same-host paths and not measured",
            options.rate.as_ref().map_or(String::new(), |rate| format!(
                ", client link limited to {rate}"
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
    let mut lanes = Lanes::start(&exe, options, &plan.parts)?;
    for (column, why) in &lanes.unavailable {
        say!("{}: not measured here: {why}", column.name());
    }
    let rss_start = lanes.fixture_rss();
    let samples = measure_matrix(&mut lanes, &plan, options)?;
    let fixture_memory = lanes.fixture_memory(&rss_start);
    let columns: Vec<Column> = lanes.lanes.iter().map(|lane| lane.column).collect();
    let unavailable = std::mem::take(&mut lanes.unavailable);
    drop(lanes);
    let references = references::References::measure(&plan);
    let peers = peers::Peers::measure(options, &plan);
    let ray = ray_rdt::RayRdt::measure(&plan);
    let peak_rss_1gib = if plan.quick {
        Vec::new()
    } else {
        references::peak_rss_for_one_gib(&exe, options, &columns)
    };
    environment["packages"] = peers.versions_json(&references);
    let results = Results {
        plan,
        columns,
        unavailable,
        samples,
        references,
        peers,
        ray,
        fixture_memory,
        peak_rss_1gib,
        environment,
    };
    table::print(&results);
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

/// Every case on every column, `plan.reps` times, interleaved.
fn measure_matrix(
    lanes: &mut Lanes,
    plan: &Plan,
    options: &Options,
) -> Result<Vec<Vec<Vec<Measurement>>>> {
    let n = lanes.lanes.len();
    let mut samples = vec![vec![Vec::new(); n]; plan.cases.len()];
    let mut progress = Progress::new("suite", plan.reps * plan.cases.len());
    for rep in 0..plan.reps {
        for (c, case) in plan.cases.iter().enumerate() {
            let message = measure::message(case.size, case.buffers);
            let run = Options {
                mode: case.mode,
                size: case.size,
                buffers: case.buffers,
                inflight: case.inflight,
                duration: Duration::from_secs_f64(plan.seconds),
                messages: None,
                ..options.clone()
            };
            for k in 0..n {
                let l = (k + rep + c) % n;
                let lane = &mut lanes.lanes[l];
                let (sample, cpu) = lane.measure(&run, &message).with_context(|| {
                    format!("{} over {} failed", case.label(), lane.column.name())
                })?;
                samples[c][l].push(Measurement::new(&sample, cpu));
            }
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
        Self {
            reps,
            seconds,
            sizes,
            cases: cases::matrix(sizes, options.inflight),
            parts,
            quick,
            smoke,
        }
    }
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
            ops: sample.ops,
            seconds: sample.elapsed.as_secs_f64(),
            verified: sample.verified,
        }
    }
}

impl Results {
    /// The median figure of case `c` on column index `l`.
    pub(crate) fn median(&self, c: usize, l: usize) -> f64 {
        let case = &self.plan.cases[c];
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

    /// The index of `column` among the measured columns.
    pub(crate) fn index(&self, column: Column) -> Option<usize> {
        self.columns.iter().position(|c| *c == column)
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
