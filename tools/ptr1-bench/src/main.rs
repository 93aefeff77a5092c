//! `ptr1-bench`: the PTR1 test fixture and transport microbenchmark.
//!
//! ```text
//! ptr1-bench serve   [--listen ADDR] [--transport T] [--handlers core|threads] [--stripes N]
//!                    [TLS options]
//! ptr1-bench run     --to ADDR [--transport T] [--mode oneway|rtt|inflight] [--size 4KiB]
//!                    [--buffers N] [--duration 5s | --messages N] [--inflight K] [--verify]
//!                    [--stripes N [--stripe-threshold 1MiB] [--stripe-loopback]] [--json]
//! ptr1-bench suite   [--quick | --smoke] [--reps N] [--seconds S] [--out DIR] [--json FILE]
//!                    [--only local,shm,ptr1,http2,peers]                          (alias: compare)
//! ptr1-bench plot    --from DIR/results.json [--out DIR]
//! ```
//! (`--help` on each for everything.)
//!
//! `serve` hosts two endpoints on one port: `/actors/echo` (ask → the same TensorMessage back)
//! and `/actors/sink` (ask → SingleResponse `ack` with the payload byte count as decimal ASCII;
//! tell → Ack). On the engine and tokio transports they run on the driver thread that received
//! the request (`--handlers core`, the default) or on handler threads (`--handlers threads`).
//! It prints `listening on ADDR` once ready. `run` measures one transport against one address
//! (a table, or JSON). `suite` measures every path and baseline side by side over modes ×
//! sizes × buffer counts, with iperf3, memcpy and the Python peers (see `suite/`); `plot`
//! redraws a saved run's plots.

mod blocking;
mod cli;
mod engine_side;
mod environment;
mod in_flight;
mod measure;
mod memcpy;
mod placement;
mod plots;
mod progress;
mod report;
mod seed;
mod socket_options;
mod suite;
mod tls;
mod units;

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// The heap of the fixtures and the benchmark client. glibc's malloc gives freed memory back to
/// the kernel as soon as the top of a heap or an mmapped chunk is freed, so h2's per-frame
/// buffers of a 64 MiB HTTP/2 body fault in fresh pages over and over, and memory freed after
/// a burst stays in fragmented arenas; mimalloc reuses freed pages at once and returns unused
/// ones after a short delay. Measured in docs/benchmarks.md ("The allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    use clap::Parser;
    let cli = cli::Cli::parse();
    match dispatch(&cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn dispatch(cli: &cli::Cli) -> Result<()> {
    match &cli.command {
        cli::Command::Serve(args) => serve(&Options::from(args)),
        cli::Command::Run(args) => {
            let options = Options::from(args);
            let report = run(&options)?;
            if args.json() {
                println!("{report}");
            } else {
                print_run(&report);
            }
            Ok(())
        }
        cli::Command::Compare(args) => suite::suite(&Options::from(args)),
        cli::Command::Plot(args) => plots::replot(&args.from, &args.out),
        cli::Command::CpuPair => {
            println!("{:.3}", suite::cpu_pair_probe());
            Ok(())
        }
    }
}

/// One `run` result as a small table.
fn print_run(report: &serde_json::Value) {
    let number = |key: &str| report[key].as_f64().unwrap_or(f64::NAN);
    println!(
        "{} {} {} B × {} buffers: {} ops in {:.2} s",
        report["transport"].as_str().unwrap_or("?"),
        report["mode"].as_str().unwrap_or("?"),
        report["size"],
        report["buffers"],
        report["ops"],
        number("seconds")
    );
    println!(
        "  {:.3} GB/s   {:.0} ops/s{}",
        number("gb_per_s"),
        number("ops_per_s"),
        if report["verified"].as_bool() == Some(true) {
            "   payload verified"
        } else {
            ""
        }
    );
    if let Some(stripes) = report["stripes"].as_u64() {
        println!(
            "  {stripes} stripes from {} B: {} requests striped",
            report["stripe_threshold"], report["striped_requests"]
        );
    }
    if report["latency_p50_us"].is_number() {
        println!(
            "  latency µs: p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
            number("latency_p50_us"),
            number("latency_p90_us"),
            number("latency_p99_us"),
            number("latency_p999_us"),
            number("latency_max_us")
        );
    }
}

/// Which implementation is on each end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Transport {
    /// tensorwire's node on its io_uring driver.
    Engine,
    /// tensorwire's node on the tokio fallback driver of `tensorwire-compat`: the same sessions
    /// and receive pool, only the driver differs.
    Tokio,
    /// The seed design: tokio, `write_vectored` of at most 64 slices, `read_exact` into a fresh
    /// zero-filled `Vec` per buffer.
    Seed,
    /// Blocking `std::net`, one thread per connection.
    Std,
    /// tensorwire's node sending PTM1 over clear-text HTTP/2 (the engine fixture serves it on
    /// the same port).
    H2c,
    /// tensorwire's node sending PTM1 over HTTP/2 + TLS (`--ca FILE`).
    Tls,
    /// tensorwire's node sending over same-host shared memory (memfds over a Unix socket; the
    /// engine fixture serves it).
    Shm,
}

impl Transport {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Engine => "engine",
            Self::Tokio => "tokio",
            Self::Seed => "seed",
            Self::Std => "std",
            Self::H2c => "h2c",
            Self::Tls => "tls",
            Self::Shm => "shm",
        }
    }
}

/// Where the fixture's handlers run (engine and tokio transports).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Handlers {
    /// On the driver thread that received the request.
    Core,
    /// On handler threads of their own.
    Threads,
}

impl Handlers {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Core => "core",
            Self::Threads => "threads",
        }
    }
}

/// What `run` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Mode {
    /// Asks to `sink`, one at a time: payload throughput one way.
    #[value(name = "oneway", alias = "one-way", alias = "ask")]
    OneWay,
    /// Tells to `sink`, one at a time (each acknowledged once it is in the mailbox).
    Tell,
    /// Asks to `echo`, one at a time: round-trip time.
    Rtt,
    /// Asks to `echo` with `inflight` outstanding: request rate.
    #[value(name = "inflight", alias = "in-flight")]
    InFlight,
}

#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub(crate) listen: SocketAddr,
    pub(crate) connect: Option<SocketAddr>,
    pub(crate) transport: Transport,
    pub(crate) cores: Option<usize>,
    pub(crate) handlers: Handlers,
    /// The engine node's busy-poll budget (`NodeBuilder::busy_poll`), if set.
    pub(crate) busy_poll: Option<Duration>,
    /// The io_uring threads' busy-poll budget (`NodeBuilder::core_busy_poll`), if set.
    pub(crate) core_poll: Option<Duration>,
    /// The shared-memory threads' spin window (`NodeBuilder::shm_spin`), if set.
    pub(crate) shm_spin: Option<Duration>,
    /// run: the client node's `NodeBuilder::busy_bytes_per_peer`, if set.
    pub(crate) busy_bytes: Option<usize>,
    pub(crate) mode: Mode,
    pub(crate) size: usize,
    pub(crate) buffers: usize,
    pub(crate) duration: Duration,
    pub(crate) inflight: usize,
    pub(crate) quick: bool,
    pub(crate) reps: usize,
    pub(crate) json: Option<String>,
    /// suite: only these parts; all of them when unset.
    pub(crate) only: Option<Vec<cli::Part>>,
    /// suite: seconds per cell (its default depends on --quick / --smoke).
    pub(crate) seconds: Option<f64>,
    /// run: exactly this many messages instead of `duration`.
    pub(crate) messages: Option<u64>,
    /// run: an untimed sleep before each message of the one-at-a-time modes.
    pub(crate) gap: Duration,
    /// run: check every echoed payload.
    pub(crate) verify: bool,
    /// run: buffers in loaned shared-memory slots (`--transport shm`).
    pub(crate) loaned: bool,
    /// suite: tiny sizes, one short repetition, payloads verified (a correctness check).
    pub(crate) smoke: bool,
    /// suite: only the fresh pass (new processes for every cell).
    pub(crate) fresh: bool,
    /// suite: write the table, JSON and plots into this directory.
    pub(crate) out: Option<String>,
    /// TLS: this end's certificate chain and key (PEM files).
    pub(crate) cert: Option<String>,
    pub(crate) key: Option<String>,
    /// Server: require client certificates from this CA.
    pub(crate) client_ca: Option<String>,
    /// Client: the CA the server's certificate must chain to.
    pub(crate) ca: Option<String>,
    /// Server: generate a CA and certificate, writing the CA to this directory's `ca.pem`.
    pub(crate) tls_self_signed: Option<String>,
    /// Server: refuse plaintext (PTR1 and h2c).
    pub(crate) require_tls: bool,
    /// suite: fixtures on another host of a network test bed.
    pub(crate) netns: bool,
    /// suite --netns: the client link's rate limit (tc syntax).
    pub(crate) rate: Option<String>,
    /// suite --netns: each client connection's rate limit (tc syntax).
    pub(crate) flow_rate: Option<String>,
    /// suite --netns: random loss at the client host, in percent.
    pub(crate) loss_percent: Option<f64>,
    /// run: stripes per large request (`NodeBuilder::stripes`); serve: most stripes taken
    /// per request (`NodeBuilder::stripes_taken`; below 2: none, as a peer without striping).
    pub(crate) stripes: Option<u16>,
    /// run: payload bytes from which a request is striped (`NodeBuilder::stripe_threshold`).
    pub(crate) stripe_threshold: Option<u64>,
    /// run: stripe requests to a loopback peer too (`NodeBuilder::stripe_loopback`).
    pub(crate) stripe_loopback: bool,
}

fn serve(options: &Options) -> Result<()> {
    match options.transport {
        // The engine fixture serves PTR1, h2c and shared memory on one port, and TLS with a
        // certificate.
        Transport::Engine | Transport::Tokio => engine_side::serve(options),
        Transport::H2c | Transport::Shm => engine_side::serve(&Options {
            transport: Transport::Engine,
            ..options.clone()
        }),
        Transport::Tls => engine_side::serve(&tls_only(options)),
        Transport::Seed => seed::serve(options.listen),
        Transport::Std => blocking::serve(options.listen),
    }
}

/// `serve --transport tls`: TLS only (plaintext refused), with `--cert/--key` or, without
/// them, a generated test CA whose path is printed before the address.
fn tls_only(options: &Options) -> Options {
    let mut options = Options {
        transport: Transport::Engine,
        require_tls: true,
        ..options.clone()
    };
    if options.cert.is_none() && options.tls_self_signed.is_none() {
        let dir = std::env::temp_dir().join(format!("ptr1-bench-tls-{}", std::process::id()));
        options.tls_self_signed = Some(dir.display().to_string());
        println!(
            "test CA (pass it to run --ca): {}",
            dir.join("ca.pem").display()
        );
    }
    options
}

impl Options {
    /// Every setting at its default; each command fills in its own.
    pub(crate) fn defaults() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            connect: None,
            transport: Transport::Engine,
            cores: None,
            handlers: Handlers::Core,
            busy_poll: None,
            core_poll: None,
            shm_spin: None,
            busy_bytes: None,
            mode: Mode::OneWay,
            size: 0,
            buffers: 1,
            duration: Duration::ZERO,
            inflight: 64,
            quick: false,
            reps: 1,
            json: None,
            only: None,
            seconds: None,
            messages: None,
            gap: Duration::ZERO,
            verify: false,
            loaned: false,
            smoke: false,
            fresh: false,
            out: None,
            cert: None,
            key: None,
            client_ca: None,
            ca: None,
            tls_self_signed: None,
            require_tls: false,
            netns: false,
            rate: None,
            flow_rate: None,
            loss_percent: None,
            stripes: None,
            stripe_threshold: None,
            stripe_loopback: false,
        }
    }
}

/// Runs one measurement against a server and returns it as JSON.
pub(crate) fn run(options: &Options) -> Result<serde_json::Value> {
    let peer = options.connect.context("run needs --connect ADDR")?;
    if options.verify && matches!(options.mode, Mode::OneWay | Mode::Tell) {
        bail!(
            "--verify checks echoed payloads: it needs --mode rtt or inflight (a sink only \
             acknowledges the byte count, which every mode checks)"
        );
    }
    if options.mode == Mode::Tell && matches!(options.transport, Transport::Seed | Transport::Std) {
        bail!("--mode tell needs a tensorwire client (engine, tokio, h2c, tls, shm)");
    }
    if options.messages.is_some()
        && options.mode == Mode::InFlight
        && matches!(options.transport, Transport::Seed | Transport::Std)
    {
        bail!(
            "--messages with --mode inflight needs a tensorwire client; seed and std run for --duration"
        );
    }
    if options.stripes.is_some()
        && !matches!(options.transport, Transport::Engine | Transport::Tokio)
    {
        bail!("--stripes cuts PTR1 requests: it needs --transport engine or tokio");
    }
    if !options.gap.is_zero() && options.mode == Mode::InFlight {
        bail!(
            "--gap sleeps between messages sent one at a time: it needs --mode rtt, oneway or tell"
        );
    }
    if options.loaned && options.transport != Transport::Shm {
        bail!("--loaned sends buffers in shared-memory loans: it needs --transport shm");
    }
    let message = measure::message(options.size, options.buffers);
    let striped_before = tensorwire_proto::stats::global().snapshot();
    let result = match options.transport {
        Transport::Engine | Transport::Tokio | Transport::H2c | Transport::Tls | Transport::Shm => {
            engine_side::run(peer, options, &message)?
        }
        Transport::Seed => seed::run(peer, options, &message)?,
        Transport::Std => blocking::run(peer, options, &message)?,
    };
    let mut report = result.to_json(options);
    if let Some(stripes) = options.stripes {
        let after = tensorwire_proto::stats::global().snapshot();
        report["stripes"] = stripes.into();
        report["stripe_threshold"] = options.stripe_threshold.into();
        report["stripe_loopback"] = options.stripe_loopback.into();
        // Warm-up included: a peer that takes no stripes shows 0 here.
        report["striped_requests"] =
            (after.striped_requests_sent - striped_before.striped_requests_sent).into();
    }
    Ok(report)
}
