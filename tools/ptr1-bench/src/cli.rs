//! The command line (clap): `serve`, `run`, `compare` (alias `suite`), turned into the
//! [`Options`] every part reads.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::units::{parse_duration, parse_percent, parse_size};
use crate::{Handlers, Mode, Options, Transport};

/// The PTR1 fixture server and transport benchmark of tensorwire.
#[derive(Debug, Parser)]
#[command(name = "ptr1-bench", version, about, long_about = None)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Serves the fixture endpoints `/actors/echo` (ask → the same message back) and
    /// `/actors/sink` (ask → `ack` with the payload byte count) on one port; prints
    /// `listening on ADDR` once ready.
    Serve(ServeArgs),
    /// Measures one transport against a running fixture.
    Run(RunArgs),
    /// Measures every path and baseline side by side (local mailbox, shared memory, PTR1 on
    /// io_uring / tokio / seed design / std, h2c, TLS) over modes × sizes × buffer counts,
    /// with iperf3 and memcpy as references and the Python peers (pyzmq, gRPC,
    /// multiprocessing.shared_memory, Ray, iceoryx2) where installed.
    #[command(alias = "suite")]
    Compare(CompareArgs),
    /// Redraws the plots (throughput.svg, latency.svg) of a saved suite run from its
    /// results.json.
    Plot(PlotArgs),
    /// Prints how fast the host's two CPUs pass memory right now: the median 4 KiB round trip
    /// between two threads, in µs (the probe the suite runs before each of its cells; the
    /// Python peers' driver runs it before each of theirs).
    CpuPair,
}

#[derive(Debug, Args)]
pub(crate) struct PlotArgs {
    /// A suite run's results.json.
    #[arg(long, value_name = "FILE")]
    pub(crate) from: std::path::PathBuf,
    /// Where to write the plots.
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub(crate) out: std::path::PathBuf,
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on (port 0 picks one).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Server implementation. engine and tokio serve PTR1, h2c and shared memory on one port
    /// (and TLS with a certificate); h2c and shm are the engine fixture; tls is the engine
    /// fixture refusing plaintext, with --cert/--key or a generated test CA.
    #[arg(long, value_enum, default_value_t = Transport::Engine)]
    transport: Transport,
    /// Driver threads of the engine node.
    #[arg(long)]
    cores: Option<usize>,
    /// Where the fixture's handlers run.
    #[arg(long, value_enum, default_value_t = Handlers::Core)]
    handlers: Handlers,
    /// How long a caller polls for an in-process endpoint's answer, in microseconds
    /// (`NodeBuilder::busy_poll`; blocking asks over PTR1 poll on `--core-poll-us`, answers a
    /// driver thread brings are waited for asleep).
    #[arg(long = "busy-poll-us")]
    busy_poll_us: Option<u64>,
    /// The engine's busy-poll budget for its io_uring threads in microseconds
    /// (`NodeBuilder::core_busy_poll`).
    #[arg(long = "core-poll-us")]
    core_poll_us: Option<u64>,
    /// How long the engine's shared-memory threads keep reading their queues after the last
    /// message, in microseconds (`NodeBuilder::shm_spin`).
    #[arg(long = "shm-spin-us")]
    shm_spin_us: Option<u64>,
    /// Most stripes the fixture takes per striped request (`NodeBuilder::stripes_taken`,
    /// 16 by default; 0 or 1: none, it answers like a PTR1 peer that never heard of
    /// striping and is sent whole frames).
    #[arg(long, value_parser = clap::value_parser!(u16).range(0..=64))]
    stripes: Option<u16>,
    #[command(flatten)]
    tls: ServerTls,
}

#[derive(Debug, Args)]
struct ServerTls {
    /// This server's certificate chain (PEM).
    #[arg(long, requires = "key")]
    cert: Option<String>,
    /// Its private key (PEM).
    #[arg(long, requires = "cert")]
    key: Option<String>,
    /// Require client certificates from this CA (PEM).
    #[arg(long = "client-ca")]
    client_ca: Option<String>,
    /// Generate a CA and certificate, writing the CA to DIR/ca.pem.
    #[arg(long = "tls-self-signed", value_name = "DIR", conflicts_with = "cert")]
    tls_self_signed: Option<String>,
    /// Refuse plaintext (PTR1 and h2c).
    #[arg(long = "require-tls")]
    require_tls: bool,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The fixture's address.
    #[arg(long, visible_alias = "to")]
    connect: SocketAddr,
    /// Client implementation / path.
    #[arg(long, value_enum, default_value_t = Transport::Engine)]
    transport: Transport,
    /// What to measure.
    #[arg(long, value_enum, default_value_t = Mode::OneWay)]
    mode: Mode,
    /// Payload bytes per message (4096, 4KiB, 64MiB, 1GiB).
    #[arg(long, value_parser = parse_size, default_value = "1MiB")]
    size: usize,
    /// Buffers the payload is split over.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    buffers: u32,
    /// How long to measure (5s, 250ms; plain numbers are seconds).
    #[arg(long, visible_alias = "seconds", value_parser = parse_duration, default_value = "2s")]
    duration: Duration,
    /// Measure exactly this many messages instead of a duration.
    #[arg(long, conflicts_with = "duration")]
    messages: Option<u64>,
    /// Sleep this long before each timed message of the one-at-a-time modes (rtt, oneway,
    /// tell; 10ms, 500us): messages that come now and then, as a training step's do, each
    /// after both ends' threads went idle. The sleeps are not timed; a sleep oversleeps (timer
    /// slack, scheduling), and the JSON's `gap_us` says what they took. `--duration` counts
    /// them: at 10 ms, `--messages N` gets N asks.
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    gap: Duration,
    /// Asks outstanding in `inflight` mode.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    inflight: u32,
    /// Check every echoed payload byte for byte (rtt and inflight modes).
    #[arg(long)]
    verify: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Driver threads of the client's engine node (default: available CPUs, at most 4).
    #[arg(long)]
    cores: Option<usize>,
    /// How long a caller polls for an in-process endpoint's answer, in microseconds
    /// (`NodeBuilder::busy_poll`; blocking asks over PTR1 poll on `--core-poll-us`, answers a
    /// driver thread brings are waited for asleep).
    #[arg(long = "busy-poll-us")]
    busy_poll_us: Option<u64>,
    /// The engine's busy-poll budget for its io_uring threads in microseconds
    /// (`NodeBuilder::core_busy_poll`).
    #[arg(long = "core-poll-us")]
    core_poll_us: Option<u64>,
    /// How long the engine's shared-memory threads keep reading their queues after the last
    /// message, in microseconds (`NodeBuilder::shm_spin`).
    #[arg(long = "shm-spin-us")]
    shm_spin_us: Option<u64>,
    /// Request bytes on their way to the fixture at once, per driver thread
    /// (`NodeBuilder::busy_bytes_per_peer`; 2MiB by default): how many connections asks of
    /// a given size spread over (engine and tokio transports).
    #[arg(long = "busy-bytes", value_parser = parse_size)]
    busy_bytes: Option<usize>,
    /// Cut each request of at least --stripe-threshold payload bytes into N stripes, each on
    /// a connection of its own (`NodeBuilder::stripes`; engine and tokio transports; the
    /// fixture must take stripes, else it is sent whole frames).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    stripes: Option<u16>,
    /// With --stripes: payload bytes from which a request is striped (default 1MiB here; the
    /// node's own default is `NodeBuilder::stripe_threshold`'s).
    #[arg(long = "stripe-threshold", requires = "stripes", value_parser = parse_size)]
    stripe_threshold: Option<usize>,
    /// With --stripes: stripe requests to a loopback fixture from --stripe-threshold too
    /// (`NodeBuilder::stripe_loopback`; without it, as for a node's users, only from 32 MiB).
    #[arg(long = "stripe-loopback", requires = "stripes")]
    stripe_loopback: bool,
    /// Shared memory: send the buffers as slices of one loaned slot per message (filled once,
    /// frozen, sent without a copy) instead of copying them in (`--transport shm` only).
    #[arg(long)]
    loaned: bool,
    /// TLS: the CA the server's certificate must chain to (PEM).
    #[arg(long)]
    ca: Option<String>,
    /// TLS: a client certificate chain (PEM), for servers that require one.
    #[arg(long, requires = "key")]
    cert: Option<String>,
    /// TLS: its private key (PEM).
    #[arg(long, requires = "cert")]
    key: Option<String>,
}

/// The parts of `suite`, by column group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Part {
    /// The local mailbox (both nodes in the suite's process).
    Local,
    /// Shared memory, buffers loaned and copied in.
    Shm,
    /// PTR1 over TCP: io_uring, the tokio fallback, the seed design, std.
    Ptr1,
    /// PTM1 over h2c and TLS.
    Http2,
    /// The transports users would pick instead, from Python.
    Peers,
}

impl Part {
    pub(crate) const ALL: [Self; 5] =
        [Self::Local, Self::Shm, Self::Ptr1, Self::Http2, Self::Peers];
}

#[derive(Debug, Args)]
pub(crate) struct CompareArgs {
    /// Three sizes (4 KiB, 1 MiB, 64 MiB), one repetition, short cells: under 2 minutes on 2
    /// cores (the README's main job).
    #[arg(long)]
    quick: bool,
    /// Tiny sizes, one very short repetition, every echoed payload verified: a correctness
    /// check of every transport (CI runs it).
    #[arg(long)]
    smoke: bool,
    /// Only the fresh pass: every cell in new processes (fixtures, clients, the peers' servers),
    /// 0.5 s cells, as a user's first seconds look; best on an otherwise idle machine. The
    /// full suite runs it after the warm pass and flags cells whose figures differ by more
    /// than 1.5×.
    #[arg(long)]
    fresh: bool,
    /// Write the tables (table.md), every sample (results.json) and the plots
    /// (throughput.svg, latency.svg) into DIR.
    #[arg(long, value_name = "DIR")]
    out: Option<String>,
    /// Repetitions (interleaved); the tables show medians.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    reps: u32,
    /// Time per cell (default 0.5s; 0.1s with --quick, 0.05s with --smoke).
    #[arg(long, value_parser = parse_duration)]
    seconds: Option<Duration>,
    /// Also write every sample as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<String>,
    /// Where the engine and tokio fixtures run their handlers.
    #[arg(long, value_enum, default_value_t = Handlers::Core)]
    handlers: Handlers,
    /// Only these parts, comma-separated (the io_uring PTR1 column is always measured: every
    /// ratio refers to it).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Option<Vec<Part>>,
    /// Asks outstanding in the in-flight cases (at most 512 MiB of payload outstanding).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    inflight: u32,
    /// Across hosts: the fixtures (and iperf3's server) on one host of a network test bed —
    /// two network namespaces joined by veth through a bridge, root needed — and this process
    /// on the other; the PTR1 and HTTP/2 columns, iperf3 between the same hosts.
    #[arg(long)]
    netns: bool,
    /// With --netns: limit the client host's link to RATE both ways (tc syntax: 1gbit, 500mbit).
    #[arg(long, requires = "netns", value_name = "RATE")]
    rate: Option<String>,
    /// With --netns: limit each TCP connection the client host opens to RATE both ways (an
    /// htb class per connection, as per-flow hashing or shaping caps one flow in a
    /// datacenter): where striping over N connections moves N times as much.
    #[arg(
        long = "flow-rate",
        requires = "netns",
        conflicts_with = "rate",
        value_name = "RATE"
    )]
    flow_rate: Option<String>,
    /// With --netns: drop this share of TCP packets at the client host, at random, both ways
    /// (e.g. 0.1%).
    #[arg(long, requires = "netns", value_parser = parse_percent, value_name = "PERCENT")]
    loss: Option<f64>,
}

impl RunArgs {
    /// Whether to print JSON.
    pub(crate) fn json(&self) -> bool {
        self.json
    }
}

impl From<&ServeArgs> for Options {
    fn from(a: &ServeArgs) -> Self {
        Self {
            listen: a.listen,
            transport: a.transport,
            cores: a.cores,
            handlers: a.handlers,
            busy_poll: a.busy_poll_us.map(Duration::from_micros),
            core_poll: a.core_poll_us.map(Duration::from_micros),
            shm_spin: a.shm_spin_us.map(Duration::from_micros),
            cert: a.tls.cert.clone(),
            key: a.tls.key.clone(),
            client_ca: a.tls.client_ca.clone(),
            tls_self_signed: a.tls.tls_self_signed.clone(),
            require_tls: a.tls.require_tls,
            stripes: a.stripes,
            ..Self::defaults()
        }
    }
}

impl From<&RunArgs> for Options {
    fn from(a: &RunArgs) -> Self {
        Self {
            connect: Some(a.connect),
            transport: a.transport,
            mode: a.mode,
            size: a.size,
            buffers: a.buffers as usize,
            duration: a.duration,
            messages: a.messages,
            gap: a.gap,
            inflight: a.inflight as usize,
            cores: a.cores,
            verify: a.verify,
            loaned: a.loaned,
            busy_poll: a.busy_poll_us.map(Duration::from_micros),
            core_poll: a.core_poll_us.map(Duration::from_micros),
            shm_spin: a.shm_spin_us.map(Duration::from_micros),
            busy_bytes: a.busy_bytes,
            ca: a.ca.clone(),
            cert: a.cert.clone(),
            key: a.key.clone(),
            stripes: a.stripes,
            stripe_threshold: a.stripes.map(|_| {
                a.stripe_threshold
                    .map_or(RUN_STRIPE_THRESHOLD, |b| b as u64)
            }),
            stripe_loopback: a.stripe_loopback,
            ..Self::defaults()
        }
    }
}

/// `run --stripes N`: requests of at least this many payload bytes are striped unless
/// `--stripe-threshold` says otherwise.
const RUN_STRIPE_THRESHOLD: u64 = 1 << 20;

impl From<&CompareArgs> for Options {
    fn from(a: &CompareArgs) -> Self {
        Self {
            quick: a.quick || a.smoke,
            smoke: a.smoke,
            fresh: a.fresh,
            verify: a.smoke,
            out: a.out.clone(),
            reps: a.reps as usize,
            json: a.json.clone(),
            seconds: a.seconds.map(|d| d.as_secs_f64()),
            handlers: a.handlers,
            only: a.only.clone(),
            inflight: a.inflight as usize,
            netns: a.netns,
            rate: a.rate.clone(),
            flow_rate: a.flow_rate.clone(),
            loss_percent: a.loss,
            ..Self::defaults()
        }
    }
}
