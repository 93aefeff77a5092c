//! The suite's tables (markdown, printed and kept for `table.md`): per pass the columns, the
//! verdict, the CPU and the peers; then fresh against warm, the references and the memory.

use crate::Mode;
use crate::report::say;
use crate::suite::columns::Column;
use crate::suite::cpu_pair::{self, SLOW_FACTOR};
use crate::suite::drift::{self, FLAG_FACTOR};
use crate::suite::paired;
use crate::suite::verdict::{Transfer, Verdict, language_name};
use crate::suite::{Case, Pass, Results, human};

pub(crate) fn print(r: &Results) {
    let plan = &r.plan;
    say!(
        "\none-way = asks to a sink (GB/s of payload), RTT = asks to an echo (p50 µs), in flight \
         = asks to the echo with K outstanding (asks/s, at most 512 MiB outstanding). Each \
         figure is tagged with what its transfer does with a message's bytes: [0] zero-copy \
         hand-off, [1] one copy through shared memory, [k] through the kernel (a socket). \
         \"(cpu X)\" = CPU seconds (user + system, every process of it) burned in that cell, \
         shown for columns and peers that busy-poll."
    );
    for (column, why) in &r.unavailable {
        say!("{}: not measured here: {why}", column.name());
    }
    for pass in &r.passes {
        let (reps, seconds) = if pass.fresh {
            (plan.fresh_reps, plan.fresh_seconds)
        } else {
            (plan.reps, plan.seconds)
        };
        say!(
            "\n## {} pass: medians of {reps} interleaved repetition(s), {seconds} s per cell, {}; {}",
            pass.name(),
            if pass.fresh {
                "every cell in new processes (fixture, client, peer servers), as a user's first \
                 seconds"
            } else {
                "processes kept for the whole pass"
            },
            drift::load_note(pass)
        );
        main_table(r, pass);
        placement(pass);
        verdict_table(r, pass);
        cpu_table(r, pass);
        peers_table(r, pass);
    }
    fresh_against_warm(r);
    references(r);
    memory(r);
    r.ray.print();
}

/// A figure with its transfer tag and, for a busy-polling side, the CPU it burned.
fn cell(case: &Case, value: f64, transfer: Option<Transfer>, cpu: Option<f64>) -> String {
    let mut text = case.cell(value);
    if value.is_finite() {
        if let Some(t) = transfer {
            text = format!("{text} {}", t.tag());
        }
        if let Some(cpu) = cpu.filter(|c| c.is_finite()) {
            text = format!("{text} (cpu {cpu:.2})");
        }
    }
    text
}

/// Every case on every column, with the ratios inside tensorwire and to the physical bounds.
fn main_table(r: &Results, pass: &Pass) {
    say!(
        "\nratios: io_uring ÷ best baseline = PTR1 on io_uring against the best of the tokio \
         fallback, the seed design and std, like with like: the median of the repetitions' own \
         ratios, over the repetitions in which all four ran on one placement of the host's CPU \
         pair (below the table); ×4 stripes ÷ io_uring = the same client cutting \
         requests of at least 4 MiB (the node's default threshold) into 4 stripes on \
         connections of their own, against it unstriped (to a loopback fixture only from 32 MiB, \
         as for any node's users); PTR1 ÷ iperf3 and shm ÷ memcpy = how \
         close PTR1 and shm (copied in) come to their physical bound (for RTT: latency ÷ latency, inverted, so \
         > 1× is always better); shm spinning and PTR1 io_uring spinning = the same clients \
         against a fixture that polls through the gaps of the sporadic row (serve \
         --core-poll-us and --shm-spin-us at twice the gap), as MPI's ranks and iceoryx2's \
         server do: measured on that row only, its CPU counted. The verdict against other \
         transports follows the table.\n"
    );
    let cases = &r.plan.cases;
    let names: Vec<&str> = pass.columns.iter().map(|c| c.name()).collect();
    say!(
        "| case | {} | io_uring ÷ best baseline | ×4 stripes ÷ io_uring | PTR1 ÷ iperf3 | shm ÷ \
         memcpy |",
        names.join(" | ")
    );
    say!("|---|{}---:|---:|---:|---:|", "---:|".repeat(names.len()));
    let iperf3 = r.references.iperf3_median();
    let usual = paired::usual_probe(pass);
    for (c, case) in cases.iter().enumerate() {
        let values: Vec<f64> = (0..pass.columns.len())
            .map(|l| pass.median(cases, c, l))
            .collect();
        let of = |column: Column| pass.index(column).map_or(f64::NAN, |l| values[l]);
        let engine = of(Column::Engine);
        let big_one_way = case.mode == Mode::OneWay && case.size >= 1 << 20;
        let (vs_iperf, vs_memcpy) = if big_one_way {
            (
                engine / iperf3,
                of(Column::ShmCopied) / r.references.memcpy_median(case.size),
            )
        } else {
            (f64::NAN, f64::NAN)
        };
        let cells: Vec<String> = pass
            .columns
            .iter()
            .enumerate()
            .map(|(l, column)| {
                let cpu = column.spins().then(|| pass.median_of(c, l, |m| m.cpu_s));
                cell(case, values[l], column.transfer(case), cpu)
            })
            .collect();
        let against = paired::engine_over_baseline(pass, case, c, usual);
        say!(
            "| {} ({}) | {} | {}{} | {} | {} | {} |",
            case.label(),
            case.unit(),
            cells.join(" | "),
            ratio(against.value),
            paired_note(&against),
            ratio(case.better(of(Column::EngineStriped), engine)),
            ratio(vs_iperf),
            ratio(vs_memcpy),
        );
    }
}

/// The host's CPU pair during the pass, as probed before every cell, and how many cells ran on
/// a slow placement (their ratios are marked † in the table above).
fn placement(pass: &Pass) {
    columns_placement(pass);
    let usual = paired::usual_probe(pass);
    let peers: Vec<f64> = pass.peers.probes().filter(|p| p.is_finite()).collect();
    if !peers.is_empty() {
        let slow = peers
            .iter()
            .filter(|&&p| cpu_pair::is_slow(p, usual))
            .count();
        say!(
            "\nthe peers' driver probed the same pair (before each case's cells warm, before \
             each cell's processes fresh): {slow} of {} cells ran on a slow placement by those \
             probes, against the usual probe ({usual:.2} µs: the columns' lower quartile, or \
             the peers' own where no column was probed); their figures are marked in the \
             verdict: § a peer's, ‡ tensorwire's from Python.",
            peers.len()
        );
    }
    for note in &pass.peers.probe_notes {
        say!("\nthe peers' driver: {note}");
    }
}

/// The columns' probes: the pass's usual probe and the cells on a slow placement.
fn columns_placement(pass: &Pass) {
    let mut probes: Vec<f64> = all_samples(pass)
        .map(|m| m.cpu_pair_us)
        .filter(|p| p.is_finite())
        .collect();
    if probes.is_empty() {
        return;
    }
    probes.sort_by(f64::total_cmp);
    let usual = cpu_pair::usual(probes.iter().copied());
    let slow = probes
        .iter()
        .filter(|&&p| cpu_pair::is_slow(p, usual))
        .count();
    say!(
        "\nthe host's CPU pair (a 4 KiB round trip between two threads through memory, probed \
         before every cell): fastest {:.2} µs, lower quartile {usual:.2}, median {:.2}, slowest \
         {:.2}; {slow} of {} cells ran on a slow placement (> {SLOW_FACTOR}× the lower \
         quartile: the hypervisor had moved the vCPUs apart, and every same-host and loopback \
         figure slows with it). An io_uring ÷ baseline ratio followed by \"(k of n)\" is the \
         median of the k repetitions that ran io_uring and the three baselines on one placement; \
         † = none did: that ratio of the medians compares the host as much as the drivers \
         (per-cell probes in results.json, `cpu_pair_us`; the ratios under \
         `io_uring_over_baseline`).",
        probes[0],
        probes[probes.len() / 2],
        probes[probes.len() - 1],
        probes.len()
    );
}

/// Every measurement of the pass's columns.
fn all_samples(pass: &Pass) -> impl Iterator<Item = &crate::suite::Measurement> {
    pass.samples.iter().flatten().flatten()
}

/// After an io_uring ÷ baseline ratio: † if no repetition ran the four on one placement,
/// "(k of n)" if only k of the n did.
fn paired_note(r: &paired::EngineRatio) -> String {
    if !r.value.is_finite() {
        String::new()
    } else if r.unpaired() {
        " †".to_owned()
    } else if r.paired < r.reps {
        format!(" ({} of {})", r.paired, r.reps)
    } else {
        String::new()
    }
}

/// The verdict of every case: per kind of transfer and language, the best of tensorwire ÷ the
/// best peer doing the same, or that no peer of the kind was measured.
fn verdict_table(r: &Results, pass: &Pass) {
    let cases = &r.plan.cases;
    let infos = pass.peers.infos();
    let rows: Vec<Vec<Verdict<'_>>> = cases
        .iter()
        .enumerate()
        .map(|(c, _)| pass.verdicts(cases, c, &infos))
        .collect();
    let groups = verdict_groups(&rows);
    say!(
        "\nverdict: the best tensorwire path ÷ the best peer that does the same with each \
         message's bytes ([0], [1] or [k]) from the same language (MPI's ranks in C beside \
         Rust), > 1× favours tensorwire (RTT: latencies inverted); never across kinds or \
         languages (– = no tensorwire path of that kind in that case). {} ‡ = most \
         repetitions of that tensorwire figure ran on the slow placement of the host's CPU pair \
         (the probes above; the Python peers' driver probes before each of its cells with \
         `ptr1-bench cpu-pair`, against the same usual probe): that ratio compares the host as \
         much as the transports; § = most of the peer's repetitions did: the ratio flatters \
         tensorwire; ‡§ = both did (like with like again, on the slow placement).\n",
        if pass.peers.steered {
            "MPI's ranks in C run case by case with the Rust columns (right before or right \
             after them); the Python peers after the columns, interleaved among themselves."
        } else {
            "The peers run after the columns, interleaved among themselves."
        }
    );
    let with_ratio: Vec<&(Transfer, String)> = groups
        .iter()
        .filter(|(t, l)| {
            rows.iter().flatten().any(|v| {
                v.transfer() == *t && v.language() == l && matches!(v, Verdict::Ratio { .. })
            })
        })
        .collect();
    if !with_ratio.is_empty() {
        let heads: Vec<String> = with_ratio
            .iter()
            .map(|(t, l)| format!("{}, from {}", t.name(), language_name(l)))
            .collect();
        say!("| case | {} |", heads.join(" | "));
        say!("|---|{}", "---|".repeat(heads.len()));
        for (case, row) in cases.iter().zip(&rows) {
            let cells: Vec<String> = with_ratio
                .iter()
                .map(|(t, l)| {
                    row.iter()
                        .find(|v| v.transfer() == *t && v.language() == l)
                        .map_or_else(|| "–".to_owned(), ToString::to_string)
                })
                .collect();
            say!("| {} | {} |", case.label(), cells.join(" | "));
        }
    }
    for (t, l) in groups.iter().filter(|g| !with_ratio.contains(g)) {
        let mut ours: Vec<&str> = Vec::new();
        for v in rows.iter().flatten() {
            if let Verdict::NoPeer {
                transfer,
                language,
                ours: name,
            } = v
                && transfer == t
                && language == l
                && !ours.contains(name)
            {
                ours.push(name);
            }
        }
        say!(
            "{}, from {} ({}): no peer of this kind is measured from {}: no verdict",
            t.name(),
            language_name(l),
            ours.join(", "),
            language_name(l)
        );
    }
    if let Some(why) = &pass.peers.skipped {
        say!("(no peer was measured: {why})");
    }
}

/// Every (kind, language) that has a verdict in some case, by kind.
fn verdict_groups(rows: &[Vec<Verdict<'_>>]) -> Vec<(Transfer, String)> {
    let mut groups: Vec<(Transfer, String)> = Vec::new();
    for v in rows.iter().flatten() {
        let key = (v.transfer(), v.language().to_owned());
        if !groups.contains(&key) {
            groups.push(key);
        }
    }
    groups.sort_by_key(|(t, _)| *t);
    groups
}

/// CPU seconds both processes spent per GB of payload, one-way cases.
fn cpu_table(r: &Results, pass: &Pass) {
    say!(
        "\nCPU: user + system seconds of both processes per GB of payload, one-way (lower is better; \
         every cell's CPU seconds are in results.json)\n"
    );
    // The columns that spin through gaps measure no one-way case.
    let shown: Vec<usize> = (0..pass.columns.len())
        .filter(|&l| !pass.columns[l].spins_through_gaps())
        .collect();
    let names: Vec<&str> = shown.iter().map(|&l| pass.columns[l].name()).collect();
    say!("| case | {} |", names.join(" | "));
    say!("|---|{}", "---:|".repeat(names.len()));
    for (c, case) in r.plan.cases.iter().enumerate() {
        if case.mode != Mode::OneWay {
            continue;
        }
        let cells: Vec<String> = shown
            .iter()
            .map(|&l| format!("{:.2}", pass.median_of(c, l, |m| m.cpu_s_per_gb)))
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

/// The peers, case by case (the verdict table divides them).
fn peers_table(r: &Results, pass: &Pass) {
    let peers = &pass.peers;
    say!(
        "\nPeers: the transports users would pick instead, driven from Python \
         (pybind/bench/bench.py{}; MPI \"(C)\": the same ranks in C, beside the Rust \
         columns{}), each server in its own process",
        if pass.fresh { " --fresh" } else { "" },
        if peers.steered {
            ", measured case by case with them (bench.py --steer)"
        } else {
            ""
        }
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
    say!("\n| case | {} |", peers.names.join(" | "));
    say!("|---|{}", "---:|".repeat(peers.names.len()));
    for case in &r.plan.cases {
        let cells: Vec<String> = peers
            .names
            .iter()
            .map(|p| {
                let cpu = peers.info(p).spins.then(|| peers.cpu_median(p, case));
                cell(case, peers.median(p, case), peers.transfer(p, case), cpu)
            })
            .collect();
        if cells.iter().all(|c| c == "–") {
            continue;
        }
        say!(
            "| {} ({}) | {} |",
            case.label(),
            case.unit(),
            cells.join(" | ")
        );
    }
}

/// The cells whose fresh figure differs from the warm one by more than 1.5×.
fn fresh_against_warm(r: &Results) {
    let drifts = drift::compare(r);
    if drifts.is_empty() {
        return;
    }
    let flagged: Vec<&drift::Drift> = drifts.iter().filter(|d| d.flagged()).collect();
    say!(
        "\nfresh against warm: {} cells measured in both passes; {} differ by more than \
         {FLAG_FACTOR}× (warm ÷ fresh, > 1× = warm is better){}",
        drifts.len(),
        flagged.len(),
        if flagged.is_empty() { "" } else { ":\n" }
    );
    if flagged.is_empty() {
        return;
    }
    say!("| case | column or peer | warm | fresh | warm ÷ fresh |");
    say!("|---|---|---:|---:|---:|");
    for d in flagged {
        let case = &r.plan.cases[d.case];
        say!(
            "| {} ({}) | {} | {} | {} | {} ⚠ |",
            case.label(),
            case.unit(),
            d.who,
            case.cell(d.warm),
            case.cell(d.fresh),
            ratio(d.warm_over_fresh)
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
