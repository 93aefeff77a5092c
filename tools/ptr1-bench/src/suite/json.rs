//! `results.json`: the environment, the settings, and every sample of every case on every
//! column, reference and peer (with the median the tables print).

use serde_json::{Value, json};

use crate::Options;
use crate::suite::{Measurement, Results, median};

pub(crate) fn to_json(r: &Results, options: &Options) -> Value {
    let plan = &r.plan;
    let cases: Vec<Value> = plan
        .cases
        .iter()
        .enumerate()
        .map(|(c, case)| {
            let columns: serde_json::Map<String, Value> = r
                .columns
                .iter()
                .enumerate()
                .map(|(l, column)| {
                    let samples: Vec<Value> = r.samples[c][l].iter().map(sample).collect();
                    (
                        column.key().to_owned(),
                        json!({ "median": number(r.median(c, l)), "samples": samples }),
                    )
                })
                .collect();
            let peers: serde_json::Map<String, Value> = r
                .peers
                .names
                .iter()
                .filter(|p| !r.peers.samples(p, case).is_empty())
                .map(|p| {
                    let samples = r.peers.samples(p, case);
                    (
                        p.clone(),
                        json!({ "median": number(median(samples)), "samples": samples }),
                    )
                })
                .collect();
            json!({
                "label": case.label(),
                "mode": case.mode_key(),
                "size": case.size,
                "buffers": case.buffers,
                "inflight": case.inflight,
                "unit": case.unit(),
                "columns": columns,
                "peers": peers,
            })
        })
        .collect();
    let pairs = |list: &[(String, String)], a: &str, b: &str| -> Vec<Value> {
        list.iter().map(|(x, y)| json!({ a: x, b: y })).collect()
    };
    json!({
        "environment": r.environment,
        "settings": {
            "reps": plan.reps,
            "seconds_per_cell": plan.seconds,
            "sizes": plan.sizes,
            "buffers": [1, 16],
            "modes": ["oneway", "rtt", "inflight"],
            "inflight": options.inflight,
            "inflight_bytes_cap": crate::suite::cases::IN_FLIGHT_BYTES,
            "handlers": options.handlers.name(),
            "quick": plan.quick,
            "smoke": plan.smoke,
            "verified": options.verify,
        },
        "columns": r.columns.iter().map(|c| json!({ "key": c.key(), "name": c.name() })).collect::<Vec<_>>(),
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
        "peers": {
            "skipped": r.peers.skipped,
            "measured": r.peers.names,
            "unavailable": pairs(&r.peers.unavailable, "peer", "reason"),
            "notes": pairs(&r.peers.notes, "peer", "how"),
            "not_applicable": pairs(&r.peers.not_applicable, "peer", "reason"),
            "failed": pairs(&r.peers.failed, "peer", "reason"),
        },
        "ray_rdt": r.ray.to_json(),
    })
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
        "ops": m.ops,
        "seconds": m.seconds,
        "verified": m.verified,
    })
}

/// A figure, or null when there is none (JSON has no NaN).
fn number(x: f64) -> Value {
    if x.is_finite() { json!(x) } else { Value::Null }
}
