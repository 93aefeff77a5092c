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
    /// [`Column::ShmCopied`] against a fixture that spins through the sporadic row's gaps;
    /// measured on that row only ([`Column::spins_through_gaps`]).
    ShmSpinning,
    /// PTR1 on the io_uring driver.
    Engine,
    /// PTR1 on the io_uring driver, requests of at least the node's stripe threshold cut
    /// into [`SUITE_STRIPES`] stripes (`NodeBuilder::stripes`, default threshold), as a user
    /// who turns striping on gets them (to a loopback fixture only from 32 MiB).
    EngineStriped,
    /// [`Column::Engine`] against a fixture that spins through the sporadic row's gaps;
    /// measured on that row only ([`Column::spins_through_gaps`]).
    EngineSpinning,
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
    pub(crate) const ALL: [Self; 12] = [
        Self::Local,
        Self::ShmLoaned,
        Self::ShmCopied,
        Self::ShmSpinning,
        Self::Engine,
        Self::EngineStriped,
        Self::EngineSpinning,
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
            Self::ShmSpinning => "shm spinning",
            Self::Engine => "PTR1 io_uring",
            Self::EngineStriped => "PTR1 io_uring ×4 stripes",
            Self::EngineSpinning => "PTR1 io_uring spinning",
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
            Self::ShmSpinning => "shm_spinning",
            Self::Engine => "engine",
            Self::EngineStriped => "engine_striped",
            Self::EngineSpinning => "engine_spinning",
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
            Self::ShmLoaned | Self::ShmCopied | Self::ShmSpinning => Part::Shm,
            Self::Engine
            | Self::EngineStriped
            | Self::EngineSpinning
            | Self::Tokio
            | Self::Seed
            | Self::Std => Part::Ptr1,
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
            Self::ShmLoaned if case.size < SHM_INLINE_BYTES => Some(Transfer::OneCopy),
            Self::ShmLoaned => Some(Transfer::ZeroCopy),
            Self::ShmCopied | Self::ShmSpinning => Some(Transfer::OneCopy),
            _ => Some(Transfer::Kernel),
        }
    }

    /// Whether the column busy-polls: the engine's io_uring threads (`core_busy_poll`), its
    /// blocking callers (`busy_poll`) and the shared-memory receiver poll, bounded, before they
    /// sleep. Its tables show the CPU it burned beside its figure.
    pub(crate) fn spins(self) -> bool {
        self.spins_through_gaps()
            || matches!(
                self,
                Self::Engine | Self::EngineStriped | Self::ShmLoaned | Self::ShmCopied
            )
    }

    /// Whether the column's fixture keeps polling through the sporadic row's gaps (`serve
    /// --core-poll-us` and `--shm-spin-us` at twice the gap, as the Python peers' spinning
    /// fixture), like MPI's ranks and iceoryx2's server: the like-with-like figure beside
    /// peers that spin through them. Such a column measures that row only; the verdict takes
    /// it only where a peer that spins through gaps has a figure.
    pub(crate) fn spins_through_gaps(self) -> bool {
        matches!(self, Self::ShmSpinning | Self::EngineSpinning)
    }

    /// Whether the column measures `case` (a column that spins through gaps: the sporadic
    /// row only; on the others its default twin's bounded polling is the figure).
    pub(crate) fn measures(self, case: &Case) -> bool {
        !self.spins_through_gaps() || !case.gap.is_zero()
    }

    fn transport(self) -> Transport {
        match self {
            Self::Local | Self::Engine | Self::EngineStriped | Self::EngineSpinning => {
                Transport::Engine
            }
            Self::ShmLoaned | Self::ShmCopied | Self::ShmSpinning => Transport::Shm,
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
            Self::ShmLoaned | Self::ShmCopied | Self::ShmSpinning => Some(Route::SharedMemory),
            Self::Engine | Self::EngineStriped | Self::EngineSpinning | Self::Tokio => {
                Some(Route::RawTcp)
            }
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
    /// Every fixture started, by [`fixture_name`].
    servers: Vec<(&'static str, Server)>,
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
                let (addr, pid) = self.server(exe, Transport::Engine, false, options)?;
                let client = engine_side::client(column.transport(), options)?;
                (Client::Node(client), addr, Some(pid))
            }
            Column::ShmSpinning | Column::EngineSpinning => {
                let (addr, pid) = self.server(exe, Transport::Engine, true, options)?;
                let client = engine_side::client(column.transport(), options)?;
                (Client::Node(client), addr, Some(pid))
            }
            Column::EngineStriped => {
                let (addr, pid) = self.server(exe, Transport::Engine, false, options)?;
                let striping = Options {
                    stripes: Some(SUITE_STRIPES),
                    ..options.clone()
                };
                let client = engine_side::client(Transport::Engine, &striping)?;
                (Client::Node(client), addr, Some(pid))
            }
            Column::Tokio => {
                let (addr, pid) = self.server(exe, Transport::Tokio, false, options)?;
                let client = engine_side::client(Transport::Tokio, options)?;
                (Client::Node(client), addr, Some(pid))
            }
            Column::Seed => {
                let (addr, pid) = self.server(exe, Transport::Seed, false, options)?;
                (Client::Seed(seed::Client::new()?), addr, Some(pid))
            }
            Column::Std => {
                let (addr, pid) = self.server(exe, Transport::Std, false, options)?;
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

    /// The fixture of `transport` (`spinning`: the engine's, polling through the sporadic
    /// row's gaps), started on first use.
    fn server(
        &mut self,
        exe: &Path,
        transport: Transport,
        spinning: bool,
        options: &Options,
    ) -> Result<(SocketAddr, u32)> {
        let name = fixture_name(transport, spinning);
        if let Some((_, server)) = self.servers.iter().find(|(n, _)| *n == name) {
            return Ok((server.addr, server.pid()));
        }
        // The engine fixture serves PTR1, h2c, TLS (a CA of its own) and shared memory.
        let tls_dir = self.tls_dir.display().to_string();
        let window = spinning_window_us();
        let extra: Vec<&str> = match (transport, spinning) {
            (Transport::Engine, false) => vec!["--tls-self-signed", &tls_dir],
            (Transport::Engine, true) => {
                vec!["--core-poll-us", &window, "--shm-spin-us", &window]
            }
            _ => Vec::new(),
        };
        let server = Server::start(exe, transport, options.handlers, &extra)?;
        let found = (server.addr, server.pid());
        self.servers.push((name, server));
        Ok(found)
    }

    /// Resident memory of every fixture process now, by fixture name (its transport's, or
    /// "engine spinning").
    pub(crate) fn fixture_rss(&self) -> Vec<(&'static str, u64)> {
        self.servers
            .iter()
            .filter_map(|(name, s)| measure::rss(s.pid()).ok().map(|rss| (*name, rss)))
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
            .map(|(i, (fixture, _))| FixtureMemory {
                name: fixture,
                start: start
                    .iter()
                    .find(|(name, _)| name == fixture)
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

/// A fixture's name in the memory table: its transport's, or the spinning engine fixture's
/// (only the engine's fixture is started spinning).
fn fixture_name(transport: Transport, spinning: bool) -> &'static str {
    match (transport, spinning) {
        (Transport::Engine, true) => "engine spinning",
        (transport, _) => transport.name(),
    }
}

/// The spinning fixture's `--core-poll-us` and `--shm-spin-us`: twice the sporadic row's gap
/// (as `pybind/bench/peers.py`'s `spinning_flags`), so its threads sleep through few if any
/// of that row's gaps.
fn spinning_window_us() -> String {
    (2 * crate::suite::cases::SPORADIC_GAP.as_micros()).to_string()
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

    #[test]
    fn a_column_that_spins_through_gaps_measures_the_sporadic_row_only_and_keeps_its_kind() {
        let cases = crate::suite::cases::matrix(crate::suite::cases::sizes(false, false), 64);
        let sporadic: Vec<&Case> = cases.iter().filter(|c| !c.gap.is_zero()).collect();
        assert_eq!(sporadic.len(), 1);
        for (spinning, twin) in [
            (Column::ShmSpinning, Column::ShmCopied),
            (Column::EngineSpinning, Column::Engine),
        ] {
            assert!(spinning.spins_through_gaps() && spinning.spins());
            assert!(!twin.spins_through_gaps());
            let measured: Vec<&Case> = cases.iter().filter(|c| spinning.measures(c)).collect();
            assert_eq!(measured, sporadic, "{}", spinning.name());
            assert!(cases.iter().all(|c| twin.measures(c)));
            // Compared with the peers its default twin is compared with.
            assert_eq!(spinning.transfer(sporadic[0]), twin.transfer(sporadic[0]));
            assert_eq!(
                (spinning.part(), spinning.route()),
                (twin.part(), twin.route())
            );
        }
        let keys: Vec<&str> = Column::ALL.iter().map(|c| c.key()).collect();
        let names: Vec<&str> = Column::ALL.iter().map(|c| c.name()).collect();
        for list in [&keys, &names] {
            let mut unique = list.to_vec();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), list.len(), "{list:?}");
        }
        assert_ne!(
            fixture_name(Transport::Engine, true),
            fixture_name(Transport::Engine, false)
        );
        assert_eq!(spinning_window_us(), "20000");
    }
}
