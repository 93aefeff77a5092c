//! The suite's columns: every path a tensorwire message can take, and the baselines, each a
//! client with the fixture it talks to. A column that cannot be set up here (no io_uring, no
//! shared memory, a router that would not take the path) is listed with the reason.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tensorwire_engine::{Node, Reply, Route, TensorMessage};

use crate::cli::Part;
use crate::measure::{self, Sample};
use crate::report::say;
use crate::suite::server::Server;
use crate::suite::verdict::Transfer;
use crate::suite::{Case, FixtureMemory, IDLE_WAIT};

/// The largest body the engine's shared memory carries inside a control record of its queue
/// (the engine's `INLINE_REQUEST`, 8 KiB with the message's head; a reply that is not an echo
/// by reference goes in a record up to 32 KiB): such a message is copied into
/// the queue and out of it, as MPI's eager path copies through its shared-memory queues, and
/// never handed off, loaned or not.
pub(crate) const SHM_INLINE_BYTES: usize = 8 << 10;
use crate::{Handlers, Options, Transport, blocking, engine_side, seed};

/// Stripes per large request in the striped column (its threshold is the node's default).
pub(crate) const SUITE_STRIPES: u16 = 4;

/// One column of the tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Column {
    /// Both nodes in the suite's process: the receiver aliases the sender's buffers.
    Local,
    /// Same host, the buffers slices of one sealed loaned slot per message (no copy).
    ShmLoaned,
    /// Same host, buffers copied into a slot (one copy).
    ShmCopied,
    /// PTR1 on the io_uring driver.
    Engine,
    /// PTR1 on the io_uring driver, requests of at least the node's stripe threshold cut
    /// into [`SUITE_STRIPES`] stripes (`NodeBuilder::stripes`, default threshold), as a user
    /// who turns striping on gets them (to a loopback fixture only from 32 MiB).
    EngineStriped,
    /// PTR1 on the tokio fallback driver (the same sessions).
    Tokio,
    /// The seed design (tokio, a fresh zero-filled `Vec` per buffer).
    Seed,
    /// Blocking `std::net`, a thread per connection.
    Std,
    /// PTM1 over clear-text HTTP/2.
    H2c,
    /// PTM1 over HTTP/2 + TLS 1.3.
    Tls,
}

impl Column {
    pub(crate) const ALL: [Self; 10] = [
        Self::Local,
        Self::ShmLoaned,
        Self::ShmCopied,
        Self::Engine,
        Self::EngineStriped,
        Self::Tokio,
        Self::Seed,
        Self::Std,
        Self::H2c,
        Self::Tls,
    ];

    /// The heading in tables and plots.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Local => "local mailbox",
            Self::ShmLoaned => "shm loaned",
            Self::ShmCopied => "shm copied in",
            Self::Engine => "PTR1 io_uring",
            Self::EngineStriped => "PTR1 io_uring ×4 stripes",
            Self::Tokio => "PTR1 tokio",
            Self::Seed => "seed design",
            Self::Std => "std blocking",
            Self::H2c => "h2c",
            Self::Tls => "TLS",
        }
    }

    /// The key in results.json.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::ShmLoaned => "shm_loaned",
            Self::ShmCopied => "shm_copied",
            Self::Engine => "engine",
            Self::EngineStriped => "engine_striped",
            Self::Tokio => "tokio",
            Self::Seed => "seed",
            Self::Std => "std",
            Self::H2c => "h2c",
            Self::Tls => "tls",
        }
    }

    /// The `--only` part it belongs to (the io_uring column is always measured: every ratio
    /// refers to it).
    pub(crate) fn part(self) -> Part {
        match self {
            Self::Local => Part::Local,
            Self::ShmLoaned | Self::ShmCopied => Part::Shm,
            Self::Engine | Self::EngineStriped | Self::Tokio | Self::Seed | Self::Std => Part::Ptr1,
            Self::H2c | Self::Tls => Part::Http2,
        }
    }

    /// Whether the bytes cross between processes (the local mailbox's do not).
    pub(crate) fn crosses_processes(self) -> bool {
        self != Self::Local
    }

    /// What this column does with a message's bytes in `case` (`None`: the local mailbox, in
    /// one process, has no peer to compare with). Shared memory carries a message whose body
    /// is at most [`SHM_INLINE_BYTES`] inside a record of its queue, loaned or not: copied
    /// through shared memory.
    pub(crate) fn transfer(self, case: &Case) -> Option<Transfer> {
        match self {
            Self::Local => None,
            Self::ShmLoaned | Self::ShmCopied if case.size < SHM_INLINE_BYTES => {
                Some(Transfer::OneCopy)
            }
            Self::ShmLoaned => Some(Transfer::ZeroCopy),
            Self::ShmCopied => Some(Transfer::OneCopy),
            _ => Some(Transfer::Kernel),
        }
    }

    /// Whether the column busy-polls: the engine's io_uring threads (`core_busy_poll`), its
    /// blocking callers (`busy_poll`) and the shared-memory receiver poll, bounded, before they
    /// sleep. Its tables show the CPU it burned beside its figure.
    pub(crate) fn spins(self) -> bool {
        matches!(
            self,
            Self::Engine | Self::EngineStriped | Self::ShmLoaned | Self::ShmCopied
        )
    }

    fn transport(self) -> Transport {
        match self {
            Self::Local | Self::Engine | Self::EngineStriped => Transport::Engine,
            Self::ShmLoaned | Self::ShmCopied => Transport::Shm,
            Self::Tokio => Transport::Tokio,
            Self::Seed => Transport::Seed,
            Self::Std => Transport::Std,
            Self::H2c => Transport::H2c,
            Self::Tls => Transport::Tls,
        }
    }

    /// The route a tensorwire client of this column must take.
    fn route(self) -> Option<Route> {
        match self {
            Self::Local => Some(Route::LocalMailbox),
            Self::ShmLoaned | Self::ShmCopied => Some(Route::SharedMemory),
            Self::Engine | Self::EngineStriped | Self::Tokio => Some(Route::RawTcp),
            Self::H2c | Self::Tls => Some(Route::Http2),
            Self::Seed | Self::Std => None,
        }
    }
}

/// A client and the fixture it measures.
pub(crate) struct Lane {
    pub(crate) column: Column,
    client: Client,
    addr: SocketAddr,
    /// The fixture's process (`None`: this process).
    server_pid: Option<u32>,
}

enum Client {
    Node(Node),
    Seed(seed::Client),
    Std,
}

/// Every column that could be set up, the fixtures they talk to, and what could not.
pub(crate) struct Lanes {
    pub(crate) lanes: Vec<Lane>,
    pub(crate) unavailable: Vec<(Column, String)>,
    servers: Vec<(Transport, Server)>,
    /// The local mailbox's fixture node, in this process.
    _local_fixture: Option<Node>,
    tls_dir: PathBuf,
}

impl Lanes {
    /// Starts the fixtures and clients of the columns in `parts` (and always the io_uring
    /// PTR1 column: every ratio refers to it).
    pub(crate) fn start(exe: &Path, options: &Options, parts: &[Part]) -> Result<Self> {
        let mut lanes = Self::empty();
        let client_options = lanes.client_options(options);
        for column in Column::ALL {
            if column != Column::Engine && !parts.contains(&column.part()) {
                continue;
            }
            match lanes.lane(exe, column, &client_options) {
                Ok(lane) => lanes.lanes.push(lane),
                Err(e) if column == Column::Engine => {
                    return Err(e.context("the io_uring PTR1 column (every ratio refers to it)"));
                }
                Err(e) => lanes.unavailable.push((column, format!("{e:#}"))),
            }
        }
        Ok(lanes)
    }

    /// `column` alone, with fixtures of its own.
    pub(crate) fn single(exe: &Path, options: &Options, column: Column) -> Result<Self> {
        let mut lanes = Self::empty();
        let client_options = lanes.client_options(options);
        let lane = lanes.lane(exe, column, &client_options)?;
        lanes.lanes.push(lane);
        Ok(lanes)
    }

    fn empty() -> Self {
        static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self {
            lanes: Vec::new(),
            unavailable: Vec::new(),
            servers: Vec::new(),
            _local_fixture: None,
            tls_dir: std::env::temp_dir()
                .join(format!("ptr1-bench-suite-{}-{run}", std::process::id())),
        }
    }

    /// Clients trust the CA the engine fixture generates into `tls_dir`.
    fn client_options(&self, options: &Options) -> Options {
        Options {
            ca: Some(self.tls_dir.join("ca.pem").display().to_string()),
            ..options.clone()
        }
    }

    fn lane(&mut self, exe: &Path, column: Column, options: &Options) -> Result<Lane> {
        let (client, addr, server_pid) = match column {
            Column::Local => {
                let fixture = Node::builder("127.0.0.1:0".parse()?)
                    .shared_memory(false)
                    .build()?;
                engine_side::register_fixture(&fixture, Handlers::Core)?;
                let addr = fixture.local_addr();
                self._local_fixture = Some(fixture);
                let client = Node::builder("127.0.0.1:0".parse()?)
                    .shared_memory(false)
                    .build()?;
                (Client::Node(client), addr, None)
            }
            Column::Engine | Column::ShmLoaned | Column::ShmCopied | Column::H2c | Column::Tls => {
                // The server first: the TLS client reads the CA it writes.
                let (addr, pid) = self.server(exe, Transport::Engine, options)?;
                let client = engine_side::client(column.transport(), options)?;
                (Client::Node(client), addr, Some(pid))
            }
            Column::EngineStriped => {
                let (addr, pid) = self.server(exe, Transport::Engine, options)?;
                let striping = Options {
                    stripes: Some(SUITE_STRIPES),
                    ..options.clone()
                };
                let client = engine_side::client(Transport::Engine, &striping)?;
                (Client::Node(client), addr, Some(pid))
            }
            Column::Tokio => {
                let (addr, pid) = self.server(exe, Transport::Tokio, options)?;
                let client = engine_side::client(Transport::Tokio, options)?;
                (Client::Node(client), addr, Some(pid))
            }
            Column::Seed => {
                let (addr, pid) = self.server(exe, Transport::Seed, options)?;
                (Client::Seed(seed::Client::new()?), addr, Some(pid))
            }
            Column::Std => {
                let (addr, pid) = self.server(exe, Transport::Std, options)?;
                (Client::Std, addr, Some(pid))
            }
        };
        if let (Client::Node(node), Some(expected)) = (&client, column.route()) {
            check_route(node, addr, expected)?;
        }
        Ok(Lane {
            column,
            client,
            addr,
            server_pid,
        })
    }

    /// The fixture of `transport`, started on first use.
    fn server(
        &mut self,
        exe: &Path,
        transport: Transport,
        options: &Options,
    ) -> Result<(SocketAddr, u32)> {
        if let Some((_, server)) = self.servers.iter().find(|(t, _)| *t == transport) {
            return Ok((server.addr, server.pid()));
        }
        // The engine fixture serves PTR1, h2c, TLS (a CA of its own) and shared memory.
        let tls_dir = self.tls_dir.display().to_string();
        let extra: &[&str] = if transport == Transport::Engine {
            &["--tls-self-signed", &tls_dir]
        } else {
            &[]
        };
        let server = Server::start(exe, transport, options.handlers, extra)?;
        let found = (server.addr, server.pid());
        self.servers.push((transport, server));
        Ok(found)
    }

    /// Resident memory of every fixture process now, by transport.
    pub(crate) fn fixture_rss(&self) -> Vec<(&'static str, u64)> {
        self.servers
            .iter()
            .filter_map(|(t, s)| measure::rss(s.pid()).ok().map(|rss| (t.name(), rss)))
            .collect()
    }

    /// After the matrix: every fixture's memory now, at its peak and once it has been idle
    /// for [`IDLE_WAIT`] (`start`: what [`Lanes::fixture_rss`] read before the matrix).
    pub(crate) fn fixture_memory(&self, start: &[(&'static str, u64)]) -> Vec<FixtureMemory> {
        let read = |f: fn(u32) -> Result<u64>| -> Vec<u64> {
            self.servers
                .iter()
                .map(|(_, s)| f(s.pid()).unwrap_or(0))
                .collect()
        };
        let (end, peak) = (read(measure::rss), read(measure::peak_rss));
        say!(
            "fixtures idle for {} s, then their memory is read again",
            IDLE_WAIT.as_secs()
        );
        std::thread::sleep(IDLE_WAIT);
        let idle = read(measure::rss);
        self.servers
            .iter()
            .enumerate()
            .map(|(i, (t, _))| FixtureMemory {
                name: t.name(),
                start: start
                    .iter()
                    .find(|(name, _)| *name == t.name())
                    .map_or(0, |(_, rss)| *rss),
                peak: peak[i],
                end: end[i],
                idle: idle[i],
            })
            .collect()
    }
}

impl Drop for Lanes {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.tls_dir);
    }
}

impl Lane {
    /// The fixture's peak resident memory so far.
    pub(crate) fn server_peak_rss(&self) -> Result<u64> {
        let pid = self
            .server_pid
            .context("this column's fixture runs in this process")?;
        measure::peak_rss(pid)
    }

    /// Measures `options.mode` with `message` (loaned columns send the same shape with its
    /// buffers in one loaned slot instead); the figures with the CPU both processes spent.
    pub(crate) fn measure(
        &mut self,
        options: &Options,
        message: &TensorMessage,
    ) -> Result<(Sample, Duration)> {
        let loaned;
        let message = match (&self.client, self.column) {
            (Client::Node(node), Column::ShmLoaned) => {
                loaned = engine_side::loaned_like(node, message)?;
                &loaned
            }
            _ => message,
        };
        let cpu = || -> Result<Duration> {
            let mut total = measure::cpu_time(None)?;
            if let Some(pid) = self.server_pid {
                total += measure::cpu_time(Some(pid))?;
            }
            Ok(total)
        };
        let before = cpu()?;
        let sample = match &mut self.client {
            Client::Node(node) => engine_side::measure(node, self.addr, options, message)?,
            Client::Seed(client) => client.measure(self.addr, options, message)?,
            Client::Std => blocking::run(self.addr, options, message)?,
        };
        let cpu_used = cpu()?.saturating_sub(before);
        Ok((sample, cpu_used))
    }
}

/// One echo, then the route the node takes to `addr` must be `expected` (shared memory is
/// chosen only after the first exchange proved the peer is on this host).
fn check_route(node: &Node, addr: SocketAddr, expected: Route) -> Result<()> {
    let probe = measure::message(64, 1);
    match node.ask_blocking(addr, "/actors/echo", probe, Duration::from_secs(30))? {
        Reply::Tensor(_) => {}
        other => bail!("the fixture's echo answered {other:?}"),
    }
    let choice = node.route_to(addr, None)?;
    if choice.route != expected {
        bail!(
            "the router takes {:?}, not {expected:?}: {}",
            choice.route,
            choice.reason
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Mode;

    #[test]
    fn shared_memory_below_its_inline_size_is_copied_through_its_queue_loaned_or_not() {
        let at = |size| Case {
            mode: Mode::OneWay,
            size,
            buffers: 16,
            inflight: 1,
            gap: Duration::ZERO,
        };
        for column in [Column::ShmLoaned, Column::ShmCopied] {
            assert_eq!(column.transfer(&at(4 << 10)), Some(Transfer::OneCopy));
        }
        assert_eq!(
            Column::ShmLoaned.transfer(&at(64 << 10)),
            Some(Transfer::ZeroCopy)
        );
        assert_eq!(
            Column::ShmCopied.transfer(&at(1 << 20)),
            Some(Transfer::OneCopy)
        );
        assert_eq!(
            Column::Engine.transfer(&at(1 << 20)),
            Some(Transfer::Kernel)
        );
        assert_eq!(Column::Local.transfer(&at(1 << 20)), None);
        assert!(Column::ShmLoaned.spins() && !Column::Tokio.spins());
    }
}
