//! `ptr1-bench`: the PTR1 test fixture and transport microbenchmark.
//!
//! ```text
//! ptr1-bench serve   [--listen ADDR] [--transport engine|tokio|seed|std] [--cores N]
//!                    [--handlers core|threads]
//! ptr1-bench run     --connect ADDR [--transport engine|tokio|seed|std] [--mode oneway|rtt|inflight]
//!                    [--size BYTES] [--buffers N] [--seconds S] [--inflight K]
//! ptr1-bench compare [--quick] [--reps N] [--json FILE] [--handlers core|threads] [--only ptr1|http2|shm]
//! ```
//!
//! `serve` hosts two endpoints on one port: `/actors/echo` (ask → the same TensorMessage back)
//! and `/actors/sink` (ask → SingleResponse `ack` with the payload byte count as decimal ASCII;
//! tell → Ack). On the engine and tokio transports they run on the driver thread that received
//! the request (`--handlers core`, the default) or on handler threads (`--handlers threads`).
//! It prints `listening on ADDR` once ready. `run` measures one transport against one address
//! and prints JSON. `compare` starts a server process per transport and measures them side by
//! side (interleaved repetitions, medians), plus iperf3 when installed.

mod blocking;
mod compare;
mod compare_http2;
mod compare_shm;
mod engine_side;
mod measure;
mod memcpy;
mod seed;
mod tls;

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let command = args.next().unwrap_or_default();
    let options = Options::parse(args)?;
    match command.as_str() {
        "serve" => serve(&options),
        "run" => {
            let report = run(&options)?;
            println!("{report}");
            Ok(())
        }
        "compare" => compare::compare(&options),
        _ => {
            eprintln!("{}", USAGE);
            bail!("unknown command {command:?}")
        }
    }
}

const USAGE: &str = "usage:
  ptr1-bench serve   [--listen ADDR] [--transport engine|tokio|seed|std] [--cores N]
                     [--handlers core|threads] [--busy-poll-us N]
                     [--cert FILE --key FILE [--client-ca FILE] | --tls-self-signed DIR] [--require-tls]
  ptr1-bench run     --connect ADDR [--transport engine|tokio|seed|std|h2c|tls|shm] [--ca FILE]
                     [--cert FILE --key FILE] [--mode oneway|rtt|inflight]
                     [--size BYTES] [--buffers N] [--seconds S] [--inflight K] [--busy-poll-us N]
  ptr1-bench compare [--quick] [--reps N] [--json FILE] [--handlers core|threads] [--only ptr1|http2|shm]";

/// Which implementation is on each end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    fn parse(text: &str) -> Result<Self> {
        Ok(match text {
            "engine" => Self::Engine,
            "tokio" => Self::Tokio,
            "seed" => Self::Seed,
            "std" => Self::Std,
            "h2c" => Self::H2c,
            "tls" => Self::Tls,
            "shm" => Self::Shm,
            _ => bail!("unknown transport {text:?} (engine, tokio, seed, std, h2c, tls or shm)"),
        })
    }

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Asks to `sink`, one at a time: payload throughput one way.
    OneWay,
    /// Asks to `echo`, one at a time: round-trip time.
    Rtt,
    /// Asks to `echo` with `inflight` outstanding: request rate.
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
    pub(crate) mode: Mode,
    pub(crate) size: usize,
    pub(crate) buffers: usize,
    pub(crate) duration: Duration,
    pub(crate) inflight: usize,
    pub(crate) quick: bool,
    pub(crate) reps: usize,
    pub(crate) json: Option<String>,
    /// compare: only this part (`ptr1`, `http2` or `shm`); all of them when unset.
    pub(crate) only: Option<String>,
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
}

impl Options {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Self> {
        let mut o = Self {
            listen: "127.0.0.1:0".parse()?,
            connect: None,
            transport: Transport::Engine,
            cores: None,
            handlers: Handlers::Core,
            busy_poll: None,
            mode: Mode::OneWay,
            size: 1 << 20,
            buffers: 1,
            duration: Duration::from_secs(2),
            inflight: 64,
            quick: false,
            reps: 3,
            json: None,
            only: None,
            cert: None,
            key: None,
            client_ca: None,
            ca: None,
            tls_self_signed: None,
            require_tls: false,
        };
        while let Some(flag) = args.next() {
            let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "--listen" => o.listen = value()?.parse()?,
                "--connect" => o.connect = Some(value()?.parse()?),
                "--transport" => o.transport = Transport::parse(&value()?)?,
                "--cores" => o.cores = Some(value()?.parse()?),
                "--busy-poll-us" => {
                    o.busy_poll = Some(Duration::from_micros(value()?.parse()?));
                }
                "--handlers" => {
                    o.handlers = match value()?.as_str() {
                        "core" => Handlers::Core,
                        "threads" => Handlers::Threads,
                        other => bail!("unknown handlers {other:?} (core or threads)"),
                    }
                }
                "--mode" => {
                    o.mode = match value()?.as_str() {
                        "oneway" => Mode::OneWay,
                        "rtt" => Mode::Rtt,
                        "inflight" => Mode::InFlight,
                        other => bail!("unknown mode {other:?}"),
                    }
                }
                "--size" => o.size = value()?.parse()?,
                "--buffers" => o.buffers = value()?.parse::<usize>()?.max(1),
                "--seconds" => o.duration = Duration::from_secs_f64(value()?.parse()?),
                "--inflight" => o.inflight = value()?.parse::<usize>()?.max(1),
                "--quick" => o.quick = true,
                "--reps" => o.reps = value()?.parse::<usize>()?.max(1),
                "--json" => o.json = Some(value()?),
                "--only" => {
                    let part = value()?;
                    if !["ptr1", "http2", "shm"].contains(&part.as_str()) {
                        bail!("unknown part {part:?} (ptr1, http2 or shm)");
                    }
                    o.only = Some(part);
                }
                "--cert" => o.cert = Some(value()?),
                "--key" => o.key = Some(value()?),
                "--client-ca" => o.client_ca = Some(value()?),
                "--ca" => o.ca = Some(value()?),
                "--tls-self-signed" => o.tls_self_signed = Some(value()?),
                "--require-tls" => o.require_tls = true,
                "--help" | "-h" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                other => bail!("unknown option {other:?}\n{USAGE}"),
            }
        }
        Ok(o)
    }
}

fn serve(options: &Options) -> Result<()> {
    match options.transport {
        Transport::Engine | Transport::Tokio => engine_side::serve(options),
        Transport::H2c | Transport::Tls | Transport::Shm => {
            bail!("serve --transport engine (or tokio) serves PTR1, h2c, TLS and shared memory")
        }
        Transport::Seed => seed::serve(options.listen),
        Transport::Std => blocking::serve(options.listen),
    }
}

/// Runs one measurement against a server and returns it as JSON.
pub(crate) fn run(options: &Options) -> Result<serde_json::Value> {
    let peer = options.connect.context("run needs --connect ADDR")?;
    let message = measure::message(options.size, options.buffers);
    let result = match options.transport {
        Transport::Engine | Transport::Tokio | Transport::H2c | Transport::Tls | Transport::Shm => {
            engine_side::run(peer, options, &message)?
        }
        Transport::Seed => seed::run(peer, options, &message)?,
        Transport::Std => blocking::run(peer, options, &message)?,
    };
    Ok(result.to_json(options))
}
