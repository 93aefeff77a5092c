//! `ptr1-bench compare`: every transport against a server in its own process, side by side.
//!
//! Each repetition runs every case on every transport, rotating the transport order, so slow
//! and fast moments of a noisy machine fall on all of them; the table shows medians. CPU is
//! user + system time of both processes (from `/proc`, 10 ms ticks; softirq time the kernel
//! accounts separately is not included) per GB of payload.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::cli::Part;
use crate::measure::{self, Sample};
use crate::report::say;
use crate::{Handlers, Mode, Options, Transport, blocking, engine_side, seed};

/// Every transport, the engine first (ratios are the engine's against the others).
const TRANSPORTS: [Transport; 4] = [
    Transport::Engine,
    Transport::Tokio,
    Transport::Seed,
    Transport::Std,
];

/// A fixture server in a child process; killed on drop.
pub(crate) struct Server {
    child: Child,
    pub(crate) addr: SocketAddr,
}

impl Server {
    fn start(exe: &Path, transport: Transport, handlers: Handlers) -> Result<Self> {
        Self::start_with(exe, transport, handlers, &[])
    }

    /// A server with extra `serve` arguments.
    pub(crate) fn start_with(
        exe: &Path,
        transport: Transport,
        handlers: Handlers,
        extra: &[&str],
    ) -> Result<Self> {
        let mut child = Command::new(exe)
            .args([
                "serve",
                "--transport",
                transport.name(),
                "--listen",
                "127.0.0.1:0",
                "--handlers",
                handlers.name(),
            ])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting a fixture server")?;
        let stdout = child.stdout.take().context("server stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .with_context(|| format!("server said {line:?}"))?
            .parse()?;
        Ok(Self { child, addr })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Case {
    label: String,
    mode: Mode,
    size: usize,
    buffers: usize,
}

#[derive(Clone, Copy, Default)]
pub(crate) struct Measurement {
    pub(crate) gb_per_s: f64,
    pub(crate) ops_per_s: f64,
    pub(crate) latency_p50_us: f64,
    pub(crate) cpu_s_per_gb: f64,
}

struct Clients {
    engine: tensorwire_engine::Node,
    tokio: tensorwire_engine::Node,
    seed: seed::Client,
}

pub(crate) fn compare(options: &Options) -> Result<()> {
    let exe = std::env::current_exe()?;
    let quick = options.quick;
    let reps = if quick { 1 } else { options.reps };
    let seconds = if options.smoke {
        0.05
    } else if quick {
        0.25
    } else {
        1.0
    };
    let part = |part: Part| options.only.is_none_or(|only| only == part);
    let env = crate::environment::describe();
    if options.smoke {
        say!(
            "smoke run: tiny sizes, one short repetition, every echoed payload verified byte for byte (engine, tokio, h2c, TLS, shm clients)"
        );
    }
    say!(
        "machine: {} ({} cores, {}), Linux {}, commit {}",
        env["cpu"].as_str().unwrap_or("?"),
        env["cores"],
        env["memory"].as_str().unwrap_or("?"),
        env["kernel"].as_str().unwrap_or("?"),
        env["commit"].as_str().unwrap_or("?")
    );
    if !part(Part::Ptr1) {
        if part(Part::Http2) {
            crate::compare_http2::compare(&exe, options, reps, seconds)?;
        }
        if part(Part::Shm) {
            crate::compare_shm::compare(&exe, options, reps, seconds)?;
        }
        return Ok(());
    }
    let mut cases = Vec::new();
    let sizes: &[usize] = if options.smoke {
        &[4 << 10, 64 << 10]
    } else if quick {
        &[4 << 10, 1 << 20, 64 << 20]
    } else {
        &[4 << 10, 1 << 20, 64 << 20, 256 << 20]
    };
    for &size in sizes {
        for buffers in [1, 16] {
            let label = format!("one-way {} × {buffers}", human(size));
            cases.push(Case {
                label,
                mode: Mode::OneWay,
                size,
                buffers,
            });
        }
    }
    cases.push(Case {
        label: "ask RTT 4 KiB".into(),
        mode: Mode::Rtt,
        size: 4 << 10,
        buffers: 1,
    });
    let inflight_label = format!("asks 4 KiB, {} in flight", options.inflight);
    cases.push(Case {
        label: inflight_label,
        mode: Mode::InFlight,
        size: 4 << 10,
        buffers: 1,
    });

    let servers: Vec<Server> = TRANSPORTS
        .iter()
        .map(|&t| Server::start(&exe, t, options.handlers))
        .collect::<Result<_>>()?;
    let mut clients = Clients {
        engine: engine_side::client(Transport::Engine, options)?,
        tokio: engine_side::client(Transport::Tokio, options)?,
        seed: seed::Client::new()?,
    };
    say!(
        "fixture handlers: {} (engine and tokio servers)",
        match options.handlers {
            Handlers::Core => "on the driver thread that received the request",
            Handlers::Threads => "on handler threads",
        }
    );
    let mut results = vec![vec![Vec::<Measurement>::new(); TRANSPORTS.len()]; cases.len()];

    let mut progress = crate::progress::Progress::new("PTR1 transports", reps * cases.len());
    for rep in 0..reps {
        for (c, case) in cases.iter().enumerate() {
            let message = measure::message(case.size, case.buffers);
            let run_options = Options {
                mode: case.mode,
                size: case.size,
                buffers: case.buffers,
                duration: Duration::from_secs_f64(seconds),
                ..options.clone()
            };
            for k in 0..TRANSPORTS.len() {
                let t = (k + rep + c) % TRANSPORTS.len();
                let server = &servers[t];
                let measurement =
                    measure_one(&mut clients, TRANSPORTS[t], server, &run_options, &message)?;
                results[c][t].push(measurement);
            }
            progress.step(&format!("rep {}/{reps}: {}", rep + 1, case.label));
        }
    }
    drop(servers);

    // The main table first: the extra steps below cannot lose it.
    print_table(&cases, &results, reps);
    let iperf = iperf3(reps, if quick { 1 } else { 3 });
    match &iperf {
        Ok(gb_per_s) => print_iperf(&cases, &results, *gb_per_s),
        Err(e) => say!("\niperf3: {e:#}"),
    }
    print_memcpy(&cases, &results, quick);
    let rss = if quick {
        Ok(Vec::new())
    } else {
        peak_rss_for_one_gib(&exe, &mut clients)
    };
    match &rss {
        Ok(rss) => print_rss(rss),
        Err(e) => say!("\npeak RSS measurement failed: {e:#}"),
    }
    if let Err(e) = crate::compare_local::compare(options, reps, seconds) {
        say!("\nlocal-mailbox measurement failed: {e:#}");
    }
    if part(Part::Http2) {
        if let Err(e) = crate::compare_http2::compare(&exe, options, reps, seconds) {
            say!("\nHTTP/2 measurement failed: {e:#}");
        }
    }
    if part(Part::Shm) {
        if let Err(e) = crate::compare_shm::compare(&exe, options, reps, seconds) {
            say!("\nshared-memory measurement failed: {e:#}");
        }
    }
    if !options.smoke {
        crate::peers::measure(options, reps, seconds);
    }
    let json = to_json(&cases, &results, iperf.ok(), &rss.unwrap_or_default());
    if let Some(path) = &options.json {
        std::fs::write(path, serde_json::to_string_pretty(&json)?)?;
        say!("\nwrote {path}");
    }
    if let Some(dir) = &options.out {
        let mut written = crate::report::write(Path::new(dir))?;
        let path = Path::new(dir).join("results.json");
        std::fs::write(&path, serde_json::to_string_pretty(&json)?)?;
        written.push(path);
        println!("\nwrote the table, the JSON and the plots:");
        for path in written {
            println!("  {}", path.display());
        }
    }
    Ok(())
}

fn measure_one(
    clients: &mut Clients,
    transport: Transport,
    server: &Server,
    options: &Options,
    message: &tensorwire_proto::TensorMessage,
) -> Result<Measurement> {
    measured(server, || match transport {
        Transport::Engine => engine_side::measure(&clients.engine, server.addr, options, message),
        Transport::Tokio => engine_side::measure(&clients.tokio, server.addr, options, message),
        Transport::Seed => clients.seed.measure(server.addr, options, message),
        Transport::Std => blocking::run(server.addr, options, message),
        Transport::H2c | Transport::Tls | Transport::Shm => {
            anyhow::bail!("HTTP/2 and shared memory are measured in their own table")
        }
    })
}

/// Runs `sample` against `server`; its figures with the CPU both processes spent.
pub(crate) fn measured(
    server: &Server,
    sample: impl FnOnce() -> Result<Sample>,
) -> Result<Measurement> {
    let (client_cpu, server_cpu) = (
        measure::cpu_time(None)?,
        measure::cpu_time(Some(server.pid()))?,
    );
    let sample = sample()?;
    let cpu = (measure::cpu_time(None)? - client_cpu)
        + (measure::cpu_time(Some(server.pid()))? - server_cpu);
    let gb = sample.payload_bytes as f64 / 1e9;
    Ok(Measurement {
        gb_per_s: sample.gb_per_s(),
        ops_per_s: sample.ops_per_s(),
        latency_p50_us: sample.latency_us(0.5),
        cpu_s_per_gb: if gb > 0.0 {
            cpu.as_secs_f64() / gb
        } else {
            f64::NAN
        },
    })
}

/// iperf3 single-stream loopback throughput in GB/s (median of `reps` runs).
fn iperf3(reps: usize, seconds: u32) -> Result<f64> {
    let port = free_port()?;
    let mut runs = Vec::new();
    for _ in 0..reps {
        let mut server = Command::new("iperf3")
            .args(["-s", "-1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("iperf3 is not installed (apt-get install iperf3); skipped")?;
        std::thread::sleep(Duration::from_millis(300));
        let output = Command::new("iperf3")
            .args([
                "-c",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-t",
                &seconds.to_string(),
                "-J",
            ])
            .output()?;
        let _ = server.wait();
        let json: serde_json::Value = serde_json::from_slice(&output.stdout)?;
        let bits = json["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .context("iperf3 output")?;
        runs.push(bits / 8e9);
    }
    Ok(median(&runs))
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Peak RSS of a fresh receiver process after it received one 1 GiB message.
fn peak_rss_for_one_gib(exe: &Path, clients: &mut Clients) -> Result<Vec<(Transport, u64)>> {
    let message = measure::message(1 << 30, 1);
    let mut out = Vec::new();
    for &transport in &TRANSPORTS {
        let server = Server::start(exe, transport, Handlers::Core)?;
        let options = Options {
            mode: Mode::OneWay,
            size: 1 << 30,
            buffers: 1,
            duration: Duration::ZERO,
            ..Options::for_compare()
        };
        let _ = measure_one(clients, transport, &server, &options, &message)?;
        out.push((transport, measure::peak_rss(server.pid())?));
    }
    Ok(out)
}

impl Options {
    pub(crate) fn for_compare() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            connect: None,
            transport: Transport::Engine,
            cores: None,
            handlers: Handlers::Core,
            busy_poll: None,
            mode: Mode::OneWay,
            size: 0,
            buffers: 1,
            duration: Duration::ZERO,
            inflight: 64,
            quick: false,
            reps: 1,
            json: None,
            only: None,
            messages: None,
            verify: false,
            smoke: false,
            out: None,
            cert: None,
            key: None,
            client_ca: None,
            ca: None,
            tls_self_signed: None,
            require_tls: false,
        }
    }
}

pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

pub(crate) fn pick(results: &[Measurement], f: impl Fn(&Measurement) -> f64) -> f64 {
    median(&results.iter().map(f).collect::<Vec<_>>())
}

fn print_table(cases: &[Case], results: &[Vec<Vec<Measurement>>], reps: usize) {
    say!(
        "\nmedians of {reps} interleaved repetition(s); CPU = both processes, s per GB of payload; \
         ratios: how many times better the engine is (for RTT: the other's latency ÷ the engine's)\n"
    );
    say!(
        "| case | engine (io_uring) | tokio (fallback) | seed (tokio) | std (blocking) | engine ÷ tokio | engine ÷ seed | engine ÷ std | engine ÷ best other | CPU s/GB engine / tokio / seed / std | CPU engine ÷ tokio |"
    );
    say!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|");
    for (case, per_transport) in cases.iter().zip(results) {
        let cpu: Vec<f64> = per_transport
            .iter()
            .map(|r| pick(r, |m| m.cpu_s_per_gb))
            .collect();
        let cpu_text: Vec<String> = cpu.iter().map(|c| format!("{c:.2}")).collect();
        let (label, v, unit): (String, Vec<f64>, &str) = match case.mode {
            Mode::OneWay | Mode::Tell => (
                case.label.clone(),
                column(per_transport, |m| m.gb_per_s),
                "GB/s",
            ),
            Mode::Rtt => (
                format!("{} (p50)", case.label),
                column(per_transport, |m| m.latency_p50_us),
                "µs",
            ),
            Mode::InFlight => (
                case.label.clone(),
                column(per_transport, |m| m.ops_per_s),
                "asks/s",
            ),
        };
        let cell = |x: f64| match case.mode {
            Mode::OneWay | Mode::Tell => format!("{x:.2} {unit}"),
            Mode::Rtt => format!("{x:.1} {unit}"),
            Mode::InFlight => format!("{x:.0} {unit}"),
        };
        // "How many times better the engine is": inverted for latencies.
        let better = |other: f64| match case.mode {
            Mode::Rtt => other / v[0],
            _ => v[0] / other,
        };
        let best_other = (1..v.len())
            .map(|i| better(v[i]))
            .fold(f64::INFINITY, f64::min);
        for (t, value) in TRANSPORTS.iter().zip(&v) {
            match case.mode {
                Mode::OneWay if case.buffers == 1 => {
                    crate::report::throughput(t.name(), case.size, *value);
                }
                Mode::Rtt => crate::report::latency(t.name(), *value),
                _ => {}
            }
        }
        say!(
            "| {label} | {} | {} | {} | {} | {:.2}× | {:.2}× | {:.2}× | {best_other:.2}× | {} | {:.2}× |",
            cell(v[0]),
            cell(v[1]),
            cell(v[2]),
            cell(v[3]),
            better(v[1]),
            better(v[2]),
            better(v[3]),
            cpu_text.join(" / "),
            cpu[0] / cpu[1],
        );
    }
}

/// One figure per transport, in `TRANSPORTS` order.
fn column(per_transport: &[Vec<Measurement>], f: impl Fn(&Measurement) -> f64 + Copy) -> Vec<f64> {
    per_transport.iter().map(|r| pick(r, f)).collect()
}

fn print_iperf(cases: &[Case], results: &[Vec<Vec<Measurement>>], iperf: f64) {
    {
        say!("\niperf3 single stream, loopback: {iperf:.2} GB/s");
        crate::report::reference("iperf3 loopback", iperf);
        for (case, per_transport) in cases.iter().zip(results) {
            if case.mode == Mode::OneWay && case.size >= 64 << 20 {
                let engine = pick(&per_transport[0], |m| m.gb_per_s);
                let tokio = pick(&per_transport[1], |m| m.gb_per_s);
                say!(
                    "  {}: engine ÷ iperf3 = {:.2}×, tokio ÷ iperf3 = {:.2}×",
                    case.label,
                    engine / iperf,
                    tokio / iperf
                );
            }
        }
    }
}

/// Single-thread memcpy at each large one-way size, and how close the transports come to it.
fn print_memcpy(cases: &[Case], results: &[Vec<Vec<Measurement>>], quick: bool) {
    say!("\nsingle-thread memcpy (the bound for messages larger than the caches):");
    let budget = Duration::from_millis(if quick { 100 } else { 500 });
    for (case, per_transport) in cases.iter().zip(results) {
        if case.mode == Mode::OneWay && case.size >= 1 << 20 && case.buffers == 1 {
            let gb_per_s = crate::memcpy::bandwidth(case.size, budget);
            crate::report::throughput("memcpy (1 thread)", case.size, gb_per_s);
            let engine = pick(&per_transport[0], |m| m.gb_per_s);
            let tokio = pick(&per_transport[1], |m| m.gb_per_s);
            say!(
                "  {}: memcpy {gb_per_s:.2} GB/s; engine ÷ memcpy = {:.2}×, tokio ÷ memcpy = {:.2}×",
                human(case.size),
                engine / gb_per_s,
                tokio / gb_per_s
            );
        }
    }
}

fn print_rss(rss: &[(Transport, u64)]) {
    if !rss.is_empty() {
        say!("\nreceiver peak RSS after one 1 GiB message:");
        for (transport, bytes) in rss {
            say!(
                "  {}: {:.2} GiB",
                transport.name(),
                *bytes as f64 / f64::from(1u32 << 30)
            );
        }
    }
}

fn to_json(
    cases: &[Case],
    results: &[Vec<Vec<Measurement>>],
    iperf: Option<f64>,
    rss: &[(Transport, u64)],
) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = cases
        .iter()
        .zip(results)
        .map(|(case, per_transport)| {
            let by_transport: serde_json::Map<String, serde_json::Value> = TRANSPORTS
                .iter()
                .zip(per_transport)
                .map(|(t, r)| {
                    (
                        t.name().to_owned(),
                        serde_json::json!({
                            "gb_per_s": pick(r, |m| m.gb_per_s),
                            "ops_per_s": pick(r, |m| m.ops_per_s),
                            "latency_p50_us": pick(r, |m| m.latency_p50_us),
                            "cpu_s_per_gb": pick(r, |m| m.cpu_s_per_gb),
                        }),
                    )
                })
                .collect();
            serde_json::json!({ "case": case.label, "size": case.size, "buffers": case.buffers, "results": by_transport })
        })
        .collect();
    let rss: serde_json::Map<String, serde_json::Value> = rss
        .iter()
        .map(|(t, b)| (t.name().to_owned(), serde_json::json!(b)))
        .collect();
    serde_json::json!({
        "environment": crate::environment::describe(),
        "cases": rows,
        "iperf3_gb_per_s": iperf,
        "peak_rss_1gib_bytes": rss,
    })
}

pub(crate) fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}
