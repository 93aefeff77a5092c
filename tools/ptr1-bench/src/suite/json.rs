//! `results.json`: the environment, the settings, and every sample of every case on every
//! column, reference and peer (with the median the tables print).

use serde_json::{Value, json};

use crate::Options;
use crate::suite::drift::{self, FLAG_FACTOR};
use crate::suite::paired;
use crate::suite::peers::Peers;
use crate::suite::verdict::{Transfer, Verdict};
use crate::suite::{Measurement, Pass, Results, median};

pub(crate) fn to_json(r: &Results, options: &Options) -> Value {
    let plan = &r.plan;
    // The plots read `columns` and `peers` of each case: the warm pass's, or the fresh one's
    // when it is the only one; a fresh pass beside a warm one is under `fresh`.
    let primary = r.passes.first();
    let second = r.passes.get(1);
    let cases: Vec<Value> = plan
        .cases
        .iter()
        .enumerate()
        .map(|(c, case)| {
            let mut value = json!({
                "label": case.label(),
                "mode": case.mode_key(),
                "size": case.size,
                "buffers": case.buffers,
                "inflight": case.inflight,
                "gap_ms": case.gap.as_secs_f64() * 1e3,
                "unit": case.unit(),
            });
            if let Some(pass) = primary {
                merge(&mut value, pass_case(r, pass, c));
            }
            if let Some(pass) = second {
                value["fresh"] = pass_case(r, pass, c);
            }
            value
        })
        .collect();
    json!({
        "environment": r.environment,
        "settings": {
            "reps": plan.reps,
            "seconds_per_cell": plan.seconds,
            "sizes": plan.sizes,
            "buffers": [1, 16],
            "modes": ["oneway", "rtt", "sporadic", "inflight"],
            "sporadic_gap_ms": crate::suite::cases::SPORADIC_GAP.as_secs_f64() * 1e3,
            "inflight": options.inflight,
            "inflight_bytes_cap": crate::suite::cases::IN_FLIGHT_BYTES,
            "handlers": options.handlers.name(),
            "quick": plan.quick,
            "smoke": plan.smoke,
            "warm": plan.warm,
            "fresh": plan.fresh,
            "fresh_reps": plan.fresh_reps,
            "fresh_seconds_per_cell": plan.fresh_seconds,
            "fresh_flag_factor": FLAG_FACTOR,
            "verified": options.verify,
        },
        "columns": primary.map_or(&[][..], |p| &p.columns[..]).iter().map(|c| json!({ "key": c.key(), "name": c.name(), "busy_polls": c.spins(), "spins_through_gaps": c.spins_through_gaps() })).collect::<Vec<_>>(),
        "passes": r.passes.iter().map(|p| json!({ "pass": p.name(), "loadavg_1m": number(p.load) })).collect::<Vec<_>>(),
        "fresh_vs_warm": drift::compare(r).iter().map(|d| json!({
            "case": plan.cases[d.case].label(),
            "who": d.who,
            "warm": d.warm,
            "fresh": d.fresh,
            "warm_over_fresh": number(d.warm_over_fresh),
            "flagged": d.flagged(),
        })).collect::<Vec<_>>(),
        "unavailable": r.unavailable.iter().map(|(c, why)| json!({ "column": c.key(), "reason": why })).collect::<Vec<_>>(),
        "cases": cases,
        "references": {
            "iperf3_gb_per_s": match &r.references.iperf3 {
                Ok(runs) => json!({ "median": number(median(runs)), "samples": runs }),
                Err(why) => json!({ "unavailable": why }),
            },
            "memcpy_gb_per_s": r.references.memcpy.iter().map(|(size, runs)| {
                json!({ "size": size, "median": number(median(runs)), "samples": runs })
            }).collect::<Vec<_>>(),
        },
        "fixture_rss_bytes": r.fixture_memory.iter().map(|m| (m.name.to_owned(), json!({
            "after_start": m.start,
            "peak": m.peak,
            "after_matrix": m.end,
            "after_idle": m.idle,
            "idle_seconds": crate::suite::IDLE_WAIT.as_secs(),
        }))).collect::<serde_json::Map<_, _>>(),
        "peak_rss_1gib_bytes": r.peak_rss_1gib.iter().map(|(c, found)| {
            (c.key().to_owned(), match found { Ok(b) => json!(b), Err(e) => json!({ "unavailable": e }) })
        }).collect::<serde_json::Map<_, _>>(),
        "peers": primary.map_or(Value::Null, |p| peers_json(&p.peers)),
        "fresh_peers": second.map_or(Value::Null, |p| peers_json(&p.peers)),
        "ray_rdt": r.ray.to_json(),
    })
}

/// One case of one pass: every column's and peer's samples with their medians, what each
/// transfer does with the bytes, and the verdicts.
fn pass_case(r: &Results, pass: &Pass, c: usize) -> Value {
    let case = &r.plan.cases[c];
    let columns: serde_json::Map<String, Value> = pass
        .columns
        .iter()
        .enumerate()
        // A column that spins through gaps is left out of the cases it does not measure, as
        // a peer is.
        .filter(|(_, column)| column.measures(case))
        .map(|(l, column)| {
            let samples: Vec<Value> = pass.samples[c][l].iter().map(sample).collect();
            (
                column.key().to_owned(),
                json!({
                    "median": number(pass.median(&r.plan.cases, c, l)),
                    "cpu_s_median": number(pass.median_of(c, l, |m| m.cpu_s)),
                    "transfer": column.transfer(case).map(Transfer::key),
                    "samples": samples,
                }),
            )
        })
        .collect();
    let peers: serde_json::Map<String, Value> = pass
        .peers
        .names
        .iter()
        .filter(|p| !pass.peers.cells(p, case).is_empty())
        .map(|p| {
            let cells = pass.peers.cells(p, case);
            (
                p.clone(),
                json!({
                    "median": number(pass.peers.median(p, case)),
                    "cpu_s_median": number(pass.peers.cpu_median(p, case)),
                    "transfer": pass.peers.transfer(p, case).map(Transfer::key),
                    "samples": cells.iter().map(|s| s.value).collect::<Vec<_>>(),
                    "cpu_s": cells.iter().map(|s| number(s.cpu_s)).collect::<Vec<_>>(),
                    "seconds": cells.iter().map(|s| number(s.seconds)).collect::<Vec<_>>(),
                    "cpu_pair_us": cells.iter().map(|s| number(s.cpu_pair_us)).collect::<Vec<_>>(),
                }),
            )
        })
        .collect();
    let infos = pass.peers.infos();
    let verdicts: Vec<Value> = pass
        .verdicts(&r.plan.cases, c, &infos)
        .iter()
        .map(|v| match v {
            Verdict::Ratio {
                transfer,
                language,
                ours,
                peer,
                ratio,
                ours_slow,
                peer_slow,
            } => json!({ "transfer": transfer.key(), "language": language, "ours": ours, "peer": peer, "ratio": number(*ratio), "ours_on_slow_placement": ours_slow, "peer_on_slow_placement": peer_slow }),
            Verdict::NoPeer {
                transfer,
                language,
                ours,
            } => json!({ "transfer": transfer.key(), "language": language, "ours": ours, "peer": Value::Null, "no_peer_of_this_kind": true }),
        })
        .collect();
    let engine = paired::engine_over_baseline(pass, case, c, paired::usual_probe(pass));
    let io_uring_over_baseline = json!({
        "ratio": number(engine.value),
        "paired_reps": engine.paired,
        "reps": engine.reps,
    });
    json!({
        "columns": columns,
        "peers": peers,
        "verdicts": verdicts,
        "io_uring_over_baseline": io_uring_over_baseline,
    })
}

fn peers_json(peers: &Peers) -> Value {
    let pairs = |list: &[(String, String)], a: &str, b: &str| -> Vec<Value> {
        list.iter().map(|(x, y)| json!({ a: x, b: y })).collect()
    };
    json!({
        "skipped": peers.skipped,
        "probe_notes": peers.probe_notes,
        "measured": peers.names,
        "described": peers.names.iter().map(|n| {
            let info = peers.info(n);
            json!({ "peer": n, "language": info.language, "busy_polls": info.spins, "tensorwire": info.ours })
        }).collect::<Vec<_>>(),
        "loadavg_1m": peers.load,
        // MPI's C ranks measured case by case with the Rust columns (bench.py --steer).
        "c_peers_with_the_columns": peers.steered,
        "unavailable": pairs(&peers.unavailable, "peer", "reason"),
        "notes": pairs(&peers.notes, "peer", "how"),
        "not_applicable": pairs(&peers.not_applicable, "peer", "reason"),
        "failed": pairs(&peers.failed, "peer", "reason"),
    })
}

/// Adds `extra`'s keys to `value` (both objects).
fn merge(value: &mut Value, extra: Value) {
    if let (Value::Object(into), Value::Object(from)) = (value, extra) {
        into.extend(from);
    }
}

/// One sample with every figure the run took.
fn sample(m: &Measurement) -> Value {
    json!({
        "gb_per_s": number(m.gb_per_s),
        "ops_per_s": number(m.ops_per_s),
        "latency_p50_us": number(m.p50_us),
        "latency_p90_us": number(m.p90_us),
        "latency_p99_us": number(m.p99_us),
        "latency_p999_us": number(m.p999_us),
        "latency_max_us": number(m.max_us),
        "cpu_s_per_gb": number(m.cpu_s_per_gb),
        "cpu_s": number(m.cpu_s),
        "cpu_pair_us": number(m.cpu_pair_us),
        "ops": m.ops,
        "seconds": m.seconds,
        "verified": m.verified,
        "gap_us": number(m.gap_us),
    })
}

/// A figure, or null when there is none (JSON has no NaN).
fn number(x: f64) -> Value {
    if x.is_finite() { json!(x) } else { Value::Null }
}
