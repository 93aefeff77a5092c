//! The suite's tables (markdown, printed and kept for `table.md`) and the points of its plots.

use crate::Mode;
use crate::report::say;
use crate::suite::columns::Column;
use crate::suite::peers::is_tensorwire;
use crate::suite::{Results, human};

pub(crate) fn print(r: &Results) {
    let plan = &r.plan;
    say!(
        "\nmedians of {} interleaved repetition(s), {} s per cell; one-way = asks to a sink \
         (GB/s of payload), RTT = asks to an echo (p50 µs), in flight = asks to the echo with K \
         outstanding (asks/s, at most 512 MiB outstanding)",
        plan.reps,
        plan.seconds
    );
    for (column, why) in &r.unavailable {
        say!("{}: not measured here: {why}", column.name());
    }
    main_table(r);
    cpu_table(r);
    references(r);
    memory(r);
    peers_table(r);
    r.ray.print();
}

/// Every case on every column, with the ratios.
fn main_table(r: &Results) {
    say!(
        "\nratios: io_uring ÷ best baseline = PTR1 on io_uring against the best of the tokio \
         fallback, the seed design and std; PTR1 ÷ iperf3 and shm ÷ memcpy = how close PTR1 and \
         shm (copied in) come to their physical bound; best ÷ best peer = the best \
         cross-process tensorwire path against the best other transport measured from Python \
         below (for RTT: latency ÷ latency, inverted, so > 1× is always better)\n"
    );
    let names: Vec<&str> = r.columns.iter().map(|c| c.name()).collect();
    say!(
        "| case | {} | io_uring ÷ best baseline | PTR1 ÷ iperf3 | shm ÷ memcpy | best ÷ best peer |",
        names.join(" | ")
    );
    say!("|---|{}---:|---:|---:|---|", "---:|".repeat(names.len()));
    let iperf3 = r.references.iperf3_median();
    for (c, case) in r.plan.cases.iter().enumerate() {
        let values: Vec<f64> = (0..r.columns.len()).map(|l| r.median(c, l)).collect();
        let of = |column: Column| r.index(column).map_or(f64::NAN, |l| values[l]);
        let engine = of(Column::Engine);
        let baseline = case.best([Column::Tokio, Column::Seed, Column::Std].map(of));
        let big_one_way = case.mode == Mode::OneWay && case.size >= 1 << 20;
        let (vs_iperf, vs_memcpy) = if big_one_way {
            (
                engine / iperf3,
                of(Column::ShmCopied) / r.references.memcpy_median(case.size),
            )
        } else {
            (f64::NAN, f64::NAN)
        };
        let crossing: Vec<(Column, f64)> = r
            .columns
            .iter()
            .zip(&values)
            .filter(|(c, v)| c.crosses_processes() && v.is_finite())
            .map(|(c, v)| (*c, *v))
            .collect();
        let best = case.best(crossing.iter().map(|(_, v)| *v));
        let best_name = crossing
            .iter()
            .find(|(_, v)| *v == best)
            .map_or("?", |(c, _)| c.name());
        let vs_peer = match r.peers.best_other(case) {
            Some((peer, v)) => format!("{} ({best_name} ÷ {peer})", ratio(case.better(best, v))),
            None => "–".into(),
        };
        let cells: Vec<String> = values.iter().map(|v| case.cell(*v)).collect();
        say!(
            "| {} ({}) | {} | {} | {} | {} | {vs_peer} |",
            case.label(),
            case.unit(),
            cells.join(" | "),
            ratio(case.better(engine, baseline)),
            ratio(vs_iperf),
            ratio(vs_memcpy),
        );
    }
}

/// CPU seconds both processes spent per GB of payload, one-way cases.
fn cpu_table(r: &Results) {
    say!(
        "\nCPU: user + system seconds of both processes per GB of payload, one-way (lower is better)\n"
    );
    let names: Vec<&str> = r.columns.iter().map(|c| c.name()).collect();
    say!("| case | {} |", names.join(" | "));
    say!("|---|{}", "---:|".repeat(names.len()));
    for (c, case) in r.plan.cases.iter().enumerate() {
        if case.mode != Mode::OneWay {
            continue;
        }
        let cells: Vec<String> = (0..r.columns.len())
            .map(|l| format!("{:.2}", r.median_of(c, l, |m| m.cpu_s_per_gb)))
            .collect();
        say!("| {} | {} |", case.label(), cells.join(" | "));
    }
}

fn references(r: &Results) {
    match &r.references.iperf3 {
        Ok(_) => {
            let gb = r.references.iperf3_median();
            let over = if crate::placement::is_across() {
                "across the test bed's veth pair"
            } else {
                "over loopback"
            };
            say!("\niperf3, one TCP stream {over}: {gb:.2} GB/s");
        }
        Err(why) => say!("\niperf3: {why}"),
    }
    for (size, _) in &r.references.memcpy {
        say!(
            "single-thread memcpy, warm, {}: {:.2} GB/s",
            human(*size),
            r.references.memcpy_median(*size)
        );
    }
}

fn memory(r: &Results) {
    let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
    for m in &r.fixture_memory {
        say!(
            "{} fixture RSS: {:.0} MiB after start, {:.0} MiB at its peak, {:.0} MiB after the \
             matrix, {:.0} MiB after {} s idle",
            m.name,
            mib(m.start),
            mib(m.peak),
            mib(m.end),
            mib(m.idle),
            crate::suite::IDLE_WAIT.as_secs()
        );
    }
    if !r.peak_rss_1gib.is_empty() {
        say!("\nreceiver peak RSS after one 1 GiB one-way message (a fresh fixture each):");
        for (column, rss) in &r.peak_rss_1gib {
            match rss {
                Ok(bytes) => say!(
                    "  {}: {:.2} GiB",
                    column.name(),
                    *bytes as f64 / f64::from(1u32 << 30)
                ),
                Err(e) => say!("  {}: not measured: {e}", column.name()),
            }
        }
    }
}

/// The peers, case by case, and tensorwire from Python against the best of them.
fn peers_table(r: &Results) {
    let peers = &r.peers;
    say!(
        "\nPeers: the transports users would pick instead, driven from Python (pybind/bench/bench.py), each server in its own process"
    );
    if let Some(why) = &peers.skipped {
        say!("  not measured: {why}");
        return;
    }
    for (name, note) in &peers.notes {
        say!("  {name}: {note}");
    }
    for (name, why) in &peers.unavailable {
        say!("  {name}: not measured: {why}");
    }
    for (name, why) in &peers.not_applicable {
        say!("  {name}: some cases not measured: {why}");
    }
    for (name, why) in &peers.failed {
        say!("  {name}: FAILED part-way (its later cases are missing): {why}");
    }
    if peers.names.is_empty() {
        return;
    }
    say!(
        "\n| case | {} | tensorwire (Python) ÷ best other |",
        peers.names.join(" | ")
    );
    say!("|---|{}---|", "---:|".repeat(peers.names.len()));
    for case in &r.plan.cases {
        let values: Vec<f64> = peers.names.iter().map(|p| peers.median(p, case)).collect();
        if values.iter().all(|v| !v.is_finite()) {
            continue;
        }
        let ours = case.best(
            peers
                .names
                .iter()
                .zip(&values)
                .filter(|(n, _)| is_tensorwire(n))
                .map(|(_, v)| *v),
        );
        let vs = match peers.best_other(case) {
            Some((name, v)) => format!("{} (÷ {name})", ratio(case.better(ours, v))),
            None => "–".into(),
        };
        let cells: Vec<String> = values.iter().map(|v| case.cell(*v)).collect();
        say!(
            "| {} ({}) | {} | {vs} |",
            case.label(),
            case.unit(),
            cells.join(" | ")
        );
    }
}

fn ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}×")
    } else {
        "–".into()
    }
}
