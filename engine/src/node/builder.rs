//! Building a node: its settings; starting it from them is `start.rs`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tensorwire_proto::Limits;
use tensorwire_proto::congestion::SameHostCongestion;
use tensorwire_proto::route::Preference;
use tensorwire_proto::session::{ConnectionPoolConfig, Keepalive, SessionConfig};
use tensorwire_proto::shm::{PeerBounds, QueueShape};
use tensorwire_proto::transport::{DriverFactory, HandOff, TransportFactory};

use crate::pool::PoolConfig;
use crate::shm::ShmBackend;
use crate::shm::transport::WhenFull;
use crate::uring::ZeroCopy;

mod start;

/// How long an idle shared-memory segment beyond the idle cache stays mapped: 8 asks of
/// 64 MiB in bursts 3 s apart took 267–353 ms a burst with 2 s (every burst faulted fresh
/// segments in) against 86–97 ms with bursts 0.5 s apart (`docs/benchmarks.md`, "A working set
/// kept between bursts").
const DEFAULT_SHM_IDLE_AFTER: Duration = Duration::from_secs(30);

/// Builds a [`Node`](crate::Node). Every setting has a default; explicit values win over the environment.
#[derive(Clone)]
pub struct NodeBuilder {
    bind: SocketAddr,
    cores: usize,
    ring_entries: u32,
    mailbox_capacity: usize,
    mailbox_waiting: usize,
    session: SessionConfig,
    pool: ConnectionPoolConfig,
    limits: Option<Limits>,
    same_host_congestion: Option<SameHostCongestion>,
    receive_pool: PoolConfig,
    handoff: Option<Arc<dyn HandOff>>,
    fallback: Option<Arc<dyn DriverFactory>>,
    transport: Option<Arc<dyn TransportFactory>>,
    preference: Option<Preference>,
    shm_access: ShmAccess,
    shm_backend: ShmBackend,
    shm_quota: Option<u64>,
    shm_credit_wait: Duration,
    shm_when_full: WhenFull,
    shm_idle_keep: u64,
    shm_idle_after: Duration,
    shm_hello_timeout: Duration,
    shm_spin: Duration,
    shm_queue_bytes: u32,
    shm_bounds: Option<PeerBounds>,
    force_fallback: bool,
    require_tls: bool,
    in_process_delivery: bool,
    zero_copy: ZeroCopy,
    zero_copy_min_bytes: u64,
    request_queue_capacity: usize,
    shutdown_timeout: Duration,
    busy_poll: Duration,
    core_busy_poll: Duration,
    stripes: Option<u16>,
    stripe_threshold: Option<u64>,
    stripe_loopback: bool,
    stripes_taken: u16,
}

impl std::fmt::Debug for NodeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeBuilder")
            .field("bind", &self.bind)
            .field("cores", &self.cores)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

impl NodeBuilder {
    /// A node that will listen on `bind` (port 0 picks a free port).
    pub fn new(bind: SocketAddr) -> Self {
        let cores = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(4);
        Self {
            bind,
            cores,
            ring_entries: 256,
            mailbox_capacity: 256,
            mailbox_waiting: 4096,
            session: SessionConfig::default(),
            pool: ConnectionPoolConfig::default(),
            limits: None,
            same_host_congestion: None,
            receive_pool: PoolConfig::default(),
            handoff: None,
            transport: None,
            preference: None,
            shm_access: ShmAccess::Auto,
            shm_backend: ShmBackend::Memfd,
            shm_quota: None,
            shm_credit_wait: Duration::from_secs(1),
            shm_when_full: WhenFull::FallBack,
            shm_idle_keep: 128 << 20,
            shm_idle_after: DEFAULT_SHM_IDLE_AFTER,
            shm_hello_timeout: Duration::from_secs(1),
            shm_spin: default_shm_spin(),
            shm_queue_bytes: QueueShape::DEFAULT.bytes,
            shm_bounds: None,
            fallback: None,
            force_fallback: false,
            require_tls: false,
            in_process_delivery: true,
            zero_copy: ZeroCopy::Auto,
            zero_copy_min_bytes: 64 << 10,
            request_queue_capacity: 65_536,
            shutdown_timeout: Duration::from_secs(5),
            busy_poll: default_busy_poll(),
            core_busy_poll: default_core_busy_poll(),
            stripes: None,
            stripe_threshold: None,
            stripe_loopback: false,
            stripes_taken: tensorwire_proto::session::DEFAULT_MAX_STRIPES,
        }
    }

    /// Driver threads (default: available CPUs, at most 4).
    pub fn cores(mut self, cores: usize) -> Self {
        self.cores = cores.max(1);
        self
    }

    /// Mailbox capacity of each endpoint (default 256).
    pub fn mailbox_capacity(mut self, capacity: usize) -> Self {
        self.mailbox_capacity = capacity.max(1);
        self
    }

    /// Requests that may wait for space in each endpoint's full mailbox, in order (default
    /// 4,096); a request beyond it is refused at once with `Error::Overloaded` (its peer gets
    /// that text as an error reply).
    pub fn mailbox_waiting_capacity(mut self, capacity: usize) -> Self {
        self.mailbox_waiting = capacity;
        self
    }

    /// Connection deadlines, rates and receive windows (see [`SessionConfig`]).
    pub fn session(mut self, session: SessionConfig) -> Self {
        self.session = session;
        self
    }

    /// How long a new connection may take to send its first bytes (default 5 s).
    pub fn preface_timeout(mut self, timeout: Duration) -> Self {
        self.session.preface_timeout = timeout;
        self
    }

    /// How long a request's head may take to arrive once it started (default 10 s).
    pub fn head_timeout(mut self, timeout: Duration) -> Self {
        self.session.head_timeout = timeout;
        self
    }

    /// The minimum rate of a body or a reply being written, measured over `window`
    /// (default 64 KiB/s over 30 s).
    pub fn min_transfer_rate(mut self, bytes_per_second: u64, window: Duration) -> Self {
        self.session.min_rate = bytes_per_second;
        self.session.rate_window = window;
        self
    }

    /// How long a server connection may sit idle between requests (default 300 s).
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.session.idle_timeout = timeout;
        self
    }

    /// How long a request may wait for space in a full mailbox (default 60 s).
    pub fn enqueue_timeout(mut self, timeout: Duration) -> Self {
        self.session.enqueue_timeout = timeout;
        self
    }

    /// TCP keepalive on every PTR1 connection (default 15 s idle, 3 probes 3 s apart), so a
    /// peer that vanished without a FIN is noticed on an idle connection; `None` turns it off.
    pub fn keepalive(mut self, keepalive: Option<Keepalive>) -> Self {
        self.session.keepalive = keepalive;
        self
    }

    /// The TCP congestion control a connection (PTR1 or HTTP/2) asks for when both its ends
    /// are on this host (default: `TENSORWIRE_SAME_HOST_CONGESTION`, read once at build, else
    /// `reno`): the kernel's default may pace (BBR), which reorders segments over loopback
    /// and costs a 64 MiB message half again its time (`docs/benchmarks.md`, "Same-host TCP
    /// without pacing"). [`SameHostCongestion::system`] keeps the kernel's. Connections to
    /// other hosts always keep the kernel's.
    pub fn same_host_congestion(mut self, choice: SameHostCongestion) -> Self {
        self.same_host_congestion = Some(choice);
        self
    }

    /// Connect timeout for outgoing connections (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.session.connect_timeout = timeout;
        self
    }

    /// Idle pooled connections kept per peer and driver thread (default 8).
    pub fn idle_connections_per_peer(mut self, count: usize) -> Self {
        self.pool.idle_per_peer = count;
        self
    }

    /// How long a pooled connection above the idle cap may stay idle before it is closed
    /// (default 1 s, so one burst does not close what the next would reopen).
    pub fn idle_trim_after(mut self, after: Duration) -> Self {
        self.pool.trim_after = after;
        self
    }

    /// Most connections to one peer per driver thread (default 32); further requests wait,
    /// in order, for one to become free (their deadline still runs).
    pub fn max_connections_per_peer(mut self, count: usize) -> Self {
        self.pool.max_per_peer = count.max(1);
        self
    }

    /// About how many request bytes may be on their way to one peer per driver thread at once
    /// (default 2 MiB): a request of `n` bytes starts only while fewer than `bytes / n`
    /// connections to its peer are busy (at least one, at most
    /// [`max_connections_per_peer`](Self::max_connections_per_peer)), else it waits in
    /// order. Small requests spread over many connections; large ones over few, since more
    /// messages held in socket buffers than the CPU caches keep make every copy slower.
    pub fn busy_bytes_per_peer(mut self, bytes: u64) -> Self {
        self.pool.busy_bytes_per_peer = bytes.max(1);
        self
    }

    /// Most requests waiting for a connection per driver thread, over all peers (default
    /// 16,384); a request beyond it fails at once with `Error::Overloaded` instead of queueing
    /// without bound behind peers that do not answer.
    pub fn max_waiting_requests(mut self, count: usize) -> Self {
        self.pool.max_waiting = count;
        self
    }

    /// Refuse plaintext PTR1 (answered with an Error frame saying TLS is required).
    pub fn require_tls(mut self, require: bool) -> Self {
        self.require_tls = require;
        self
    }

    /// Behave as if io_uring were unavailable (as `TENSORWIRE_FORCE_FALLBACK=1` does).
    pub fn force_fallback(mut self, force: bool) -> Self {
        self.force_fallback = force;
        self
    }

    /// The driver to use where io_uring cannot be set up or is forced off (the tokio PTR1
    /// driver of `tensorwire-compat`). Without one, such a node fails to build.
    pub fn fallback(mut self, factory: Arc<dyn DriverFactory>) -> Self {
        self.fallback = Some(factory);
        self
    }

    /// Whether sends to a node in this same process go straight to its mailbox (default
    /// `true`, no copy). Tests and benchmarks turn it off to exercise the socket path.
    pub fn in_process_delivery(mut self, enabled: bool) -> Self {
        self.in_process_delivery = enabled;
        self
    }

    /// When to send with `SENDMSG_ZC` (default [`ZeroCopy::Auto`]).
    pub fn zero_copy(mut self, mode: ZeroCopy) -> Self {
        self.zero_copy = mode;
        self
    }

    /// Smallest frame sent with `SENDMSG_ZC` (default 64 KiB; below it copying is cheaper).
    pub fn zero_copy_min_bytes(mut self, bytes: u64) -> Self {
        self.zero_copy_min_bytes = bytes;
        self
    }

    /// Limits (default: from the `PULSING_MAX_TENSOR_*` environment, read once here).
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = Some(limits);
        self
    }

    /// Receive-pool settings.
    pub fn receive_pool(mut self, pool: PoolConfig) -> Self {
        self.receive_pool = pool;
        self
    }

    /// Plugs in a transport beside PTR1 — the HTTP/2 + TLS transport of `tensorwire-compat`
    /// (`Arc::new(tensorwire_compat::Http2::new(config))`): it serves the connections that do
    /// not start with `PTR1` (TLS, h2c) on the node's port, and carries the sends the router
    /// gives it (every remote send when it encrypts, or under `PULSING_TENSOR_TRANSPORT=http2`).
    /// A transport that requires TLS makes the node refuse plaintext PTR1.
    pub fn transport(mut self, factory: Arc<dyn TransportFactory>) -> Self {
        self.transport = Some(factory);
        self
    }

    /// Serve and use the same-host shared-memory path: `true` is [`ShmAccess::Auto`] (the
    /// default), `false` is [`ShmAccess::Off`].
    pub fn shared_memory(mut self, enabled: bool) -> Self {
        self.shm_access = if enabled {
            ShmAccess::Auto
        } else {
            ShmAccess::Off
        };
        self
    }

    /// Who may reach this node over shared memory, and whether it uses it (see
    /// [`ShmAccess`]).
    pub fn shm_access(mut self, access: ShmAccess) -> Self {
        self.shm_access = access;
        self
    }

    /// How long a same-host send waits for credit when receivers hold all of this node's
    /// shared memory (default 1 s, within the send's own deadline).
    pub fn shm_credit_wait(mut self, wait: Duration) -> Self {
        self.shm_credit_wait = wait;
        self
    }

    /// What a same-host send does when no credit came back in time (default: it goes over
    /// the remote path, PTR1 — counted in `shm_credit_fallbacks`).
    pub fn shm_when_full(mut self, when_full: WhenFull) -> Self {
        self.shm_when_full = when_full;
        self
    }

    /// Bytes of idle shared-memory segments kept for reuse however long they stay idle
    /// (default 128 MiB); beyond that a segment is given back to the system once idle for
    /// [`NodeBuilder::shm_idle_after`].
    pub fn shm_idle_keep(mut self, bytes: u64) -> Self {
        self.shm_idle_keep = bytes;
        self
    }

    /// How long a shared-memory segment beyond the idle cache stays mapped after its last
    /// slot came back (default 30 s): a working set used again within it — a training step's
    /// messages, step after step — reuses memory already faulted in instead of paying for
    /// fresh pages each time; a burst not repeated gives its memory back after it.
    pub fn shm_idle_after(mut self, idle: Duration) -> Self {
        self.shm_idle_after = idle;
        self
    }

    /// How long the knock and hello that set up shared memory with a peer may take (default
    /// 1 s). Sends to that peer wait for them (on the transport's threads).
    pub fn shm_hello_timeout(mut self, timeout: Duration) -> Self {
        self.shm_hello_timeout = timeout;
        self
    }

    /// How long the shared-memory driver thread, and a caller waiting for its reply, keep
    /// reading the queues after the last message before they sleep (default 100 µs where the
    /// machine has more than one CPU, else 0). Messages that come closer together than this
    /// never pay a wake-up; the CPU it costs is counted in `shm_spin_micros`.
    pub fn shm_spin(mut self, window: Duration) -> Self {
        self.shm_spin = window;
        self
    }

    /// The bytes of each shared-memory queue ring this node creates (a power of two from
    /// 256 KiB to 16 MiB; default 1 MiB): two per connection, one each way.
    pub fn shm_queue_bytes(mut self, bytes: u32) -> Self {
        self.shm_queue_bytes = bytes;
        self
    }

    /// What each same-host peer process may hold of this node: connections, connections
    /// waiting for their hello, mapped segments and bytes, bytes of this node's slots not yet
    /// released (default: [`PeerBounds::fitted`] to this process's descriptor limit and
    /// `vm.max_map_count`; `held_bytes_per_process` left at `u64::MAX` is half of
    /// [`NodeBuilder::shm_quota`]). A copy for a process that holds its bound goes at once as
    /// [`NodeBuilder::shm_when_full`] says (a reply becomes an error reply).
    pub fn shm_bounds(mut self, bounds: PeerBounds) -> Self {
        self.shm_bounds = Some(bounds);
        self
    }

    /// The backend of [`Node::shm`](crate::Node::shm)'s manager (default memfd).
    pub fn shm_backend(mut self, backend: ShmBackend) -> Self {
        self.shm_backend = backend;
        self
    }

    /// Bytes of shared-memory segments (regions, loans, slots lent to peers, idle) at most;
    /// default a quarter of the physical memory. A memfd is not bounded by `/dev/shm`: this is
    /// the bound. Receivers that hold it all make further sends wait for credit.
    pub fn shm_quota(mut self, bytes: u64) -> Self {
        self.shm_quota = Some(bytes);
        self
    }

    /// The transport preference (default: `PULSING_TENSOR_TRANSPORT`, else auto).
    pub fn preference(mut self, preference: Preference) -> Self {
        self.preference = Some(preference);
        self
    }

    /// Where connections that do not start with `PTR1` go (default: they are closed, or
    /// served by the [`NodeBuilder::transport`]).
    pub fn handoff(mut self, handoff: Arc<dyn HandOff>) -> Self {
        self.handoff = Some(handoff);
        self
    }

    /// New requests queued per driver thread at most (default 65,536); beyond that a
    /// request fails at once with [`Error::Overloaded`](crate::Error::Overloaded).
    pub fn request_queue_capacity(mut self, capacity: usize) -> Self {
        self.request_queue_capacity = capacity.max(1);
        self
    }

    /// How long a caller polls for an answer an in-process endpoint's handler brings instead
    /// of sleeping (default 20 µs where the machine has more than one CPU, else 0;
    /// `Duration::ZERO` turns it off). Polling trades at most this much CPU per wait for not
    /// paying a sleeping thread's wake-up (5–10 µs on a virtual machine) on a round trip of
    /// well under a microsecond. An answer a driver thread brings is waited for asleep: a
    /// caller polling for it took the CPU that thread needed (on 2 vCPUs, asks in flight from
    /// Python lost 15–50 % of their rate). A blocking ask over PTR1 drives its own connection
    /// on the calling thread and polls on the driver's budget instead,
    /// [`NodeBuilder::core_busy_poll`]: to stop all polling, set both to zero.
    pub fn busy_poll(mut self, budget: Duration) -> Self {
        self.busy_poll = budget;
        self
    }

    /// How long an io_uring driver thread polls for its next completion instead of sleeping
    /// (default 250 µs where the machine has more than one CPU, else 0; `Duration::ZERO` turns
    /// it off; [`NodeBuilder::busy_poll`] does not). A blocking ask over PTR1, which drives
    /// its connection on the calling thread, polls on this budget too, while that
    /// connection's recent waits (for the socket to take more bytes, or for the answer) were
    /// at most this long: a 1 MiB one-way ask waits 50–150 µs for its answer after its last
    /// byte left, and sleeping through that wait cost 15–25 % of the rate
    /// (`docs/benchmarks.md`, "1 MiB one-way").
    ///
    /// A driver thread that carries the driver's only active connection (one that moved bytes
    /// in the last 10 ms: idle pooled connections do not count) polls while its recent idle
    /// spells were at most twice this; each poll lasts at most twice the longest recent idle
    /// spell after the last bytes it saw move; and after a poll that found nothing it sleeps
    /// through the next idle spells (1, then twice as many after each further miss in a row,
    /// at most 32). While several connections are active and the thread carries at least one,
    /// it polls up to 20 µs (within this budget) after the last bytes it saw move before it
    /// sleeps: enough to take a busy
    /// exchange's next completion without a wake-up, short enough to leave the CPU to the
    /// threads that produce the work. A thread with no active connection never polls. Polling reads
    /// the ring's shared memory and enters the kernel only to run work the kernel deferred to
    /// the thread, never to wait. What it buys, on 2 CPUs (`docs/benchmarks.md`,
    /// "Busy-polling"): a thread that does not sleep is not pulled onto its peer's CPU when
    /// woken, so a 1 MiB round trip's copies run on both CPUs at once, and a 4 KiB round trip
    /// skips the wake-up.
    pub fn core_busy_poll(mut self, budget: Duration) -> Self {
        self.core_busy_poll = budget;
        self
    }

    /// Stripes per large request (default 1: none; the environment variable
    /// `TENSORWIRE_STRIPES` sets it when this is not called). A request of at least
    /// [`NodeBuilder::stripe_threshold`] payload bytes to a peer that takes stripes is cut
    /// into this many stripes (at most what the peer takes), each sent on a connection of its
    /// own and received straight into its place; the request follows once every stripe is in.
    /// One request per peer is striped at a time: large requests sent meanwhile go whole.
    /// A peer that does not take stripes (any other PTR1 peer) keeps getting whole frames:
    /// it is asked once ([`tensorwire_proto::stripe`], `docs/protocol.md`).
    ///
    /// Where one flow is capped (per-flow hashing or shaping, one core per flow) striping over
    /// N connections can move N times as much. Through loopback one flow is not capped and
    /// small stripes cost more than they save, so requests to a loopback peer are striped
    /// only from 32 MiB (or the threshold, if larger), and only while no other large request
    /// to it is unanswered (requests in flight side by side already keep both ends' CPUs
    /// busy); large requests that come while its stripes are on their way (a burst) wait for
    /// them (if their deadline is no earlier, for at most a quarter of their time and 1 s),
    /// then go whole; unless [`NodeBuilder::stripe_loopback`] is set (`docs/benchmarks.md`,
    /// "Striping"). A large request that goes whole waits for a connection like any other
    /// ([`NodeBuilder::busy_bytes_per_peer`]: by default, behind the answer to the large
    /// request before it to the same peer).
    pub fn stripes(mut self, stripes: u16) -> Self {
        self.stripes = Some(stripes.clamp(1, tensorwire_proto::stripe::MAX_STRIPES));
        self
    }

    /// Payload bytes from which a request is striped (default 4 MiB; the environment
    /// variable `TENSORWIRE_STRIPE_THRESHOLD` sets it when this is not called). Only buffers
    /// of at least 64 KiB per stripe are cut; the rest travel in the request frame.
    pub fn stripe_threshold(mut self, bytes: u64) -> Self {
        self.stripe_threshold = Some(bytes);
        self
    }

    /// Stripes requests to loopback peers as to any other (default false: from 32 MiB, or the
    /// threshold if larger, and only while no other large request to the peer is unanswered,
    /// where striping on loopback was measured to pay). For tests and for measuring what
    /// striping costs on one host.
    pub fn stripe_loopback(mut self, stripe: bool) -> Self {
        self.stripe_loopback = stripe;
        self
    }

    /// Most stripes this node takes per request from its peers (default 16; below 2 it takes
    /// none and answers like a node that never heard of striping).
    pub fn stripes_taken(mut self, stripes: u16) -> Self {
        self.stripes_taken = stripes.min(tensorwire_proto::stripe::MAX_STRIPES);
        self
    }

    /// How long shutdown waits for operations still in flight (default 5 s; then up to 200 ms
    /// more on an io_uring core that had to reset sockets its zero-copy sends still held).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }
}

/// Who may reach a node over shared memory (and whether it uses it for its own sends).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ShmAccess {
    /// Processes of this user on this host — unless the node requires TLS or client
    /// certificates: such a node keeps its security setting on every path and neither serves
    /// nor uses shared memory. The default.
    Auto,
    /// Processes of this user on this host, even when the node uses TLS: an explicit opt-in,
    /// under which handlers see the peer's uid and pid (`Request::local_peer`) instead of a
    /// certificate.
    SameUser,
    /// Nobody: the node neither serves nor uses shared memory.
    Off,
}

/// 20 µs where there is more than one CPU to poll on, else nothing.
fn default_busy_poll() -> Duration {
    if_several_cpus(Duration::from_micros(20))
}

/// 100 µs where there is more than one CPU to spin on, else nothing.
fn default_shm_spin() -> Duration {
    if_several_cpus(Duration::from_micros(100))
}

/// 250 µs where there is more than one CPU to poll on, else nothing.
fn default_core_busy_poll() -> Duration {
    if_several_cpus(Duration::from_micros(250))
}

fn if_several_cpus(budget: Duration) -> Duration {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    if cpus > 1 { budget } else { Duration::ZERO }
}
