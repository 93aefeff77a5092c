//! The same-host data path: the driver of `tensorwire_proto::shm`'s sessions. A
//! [`ShmConnection`](tensorwire_proto::shm::ShmConnection) decides what a connection means;
//! this module moves its records through the two queues in shared memory, its `Map`
//! datagrams and descriptors through the Unix socket, and maps what the peer lends.
//!
//! A TensorMessage travels as one control record in the sender's queue; its bytes stay in the
//! sender's segments (see `shm::segments`), which the receiver maps once per connection,
//! read-only. Buffers already in this node's frozen slots (loans) go where they are; the rest
//! are copied once into one fresh slot; a small message rides in the record. The receiver's
//! buffers are views of the sender's memory, and the sender never writes a slot again until
//! every view of it is gone.
//!
//! Locality is proven, never guessed or claimed (`probe.rs`, checks in
//! `tensorwire_proto::shm::Identity`). Every peer is bounded per process
//! (`tensorwire_proto::shm::PeerBook`): connections, hello slots, mapped segments and bytes,
//! queued bytes.
//!
//! Threads: one driver thread per node (`driver.rs`: accepts, greets, reads the queues,
//! sends what waits for room, releases, retires idle segments, watches holders that left),
//! one copy thread (payload copies of sends), short-lived probe threads, and callers that
//! wait for their own reply read their connection's queue themselves for a while.
//!
//! What it does not do: revoke memory from a live holder, or send to a peer it has not proven
//! to be on this host.

mod caller;
mod conn;
mod copier;
mod driver;
mod greeting;
mod inbound;
mod knock;
mod lending;
mod outbound;
mod packing;
mod peers;
mod probe;
mod releases;
mod spin;
mod views;
mod wake;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tensorwire_proto::Limits;
use tensorwire_proto::session::SessionConfig;
use tensorwire_proto::shm::{Identity, PeerBook, PeerBounds, QueueShape};
use tensorwire_proto::transport::{Error, Inbound, OutboundRequest};

use crate::shm::segments::Segments;
use crate::sync::lock;
use conn::Conn;
use copier::Copier;
pub(crate) use knock::{KnockDesk, KnockHandOff, Where};
use lending::Lending;
use peers::Peers;
pub(crate) use peers::Reach;
use wake::Wake;

/// How long a stop waits for the driver and copy threads (they end at their next look; a
/// copy in progress ends first).
const STOP_WITHIN: Duration = Duration::from_secs(5);
/// How long a stop waits for them at least, even past a close's deadline.
const STOP_AT_LEAST: Duration = Duration::from_millis(100);

/// What a node does when its shared memory is all held by receivers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WhenFull {
    /// Send over the remote path (PTR1, or HTTP/2 when TLS is on) instead (the default).
    FallBack,
    /// Fail the send with [`Error::SharedMemoryFull`].
    Refuse,
}

/// Settings of the data path.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShmConfig {
    /// How long a send waits for credit (a slot given back) when the quota is used up.
    pub(crate) credit_wait: Duration,
    /// What it does after that.
    pub(crate) when_full: WhenFull,
    /// The knock and hello must finish within this.
    pub(crate) hello_timeout: Duration,
    /// How long the driver thread, and a caller waiting for its reply, keep reading the
    /// queues after the last message before they sleep.
    pub(crate) spin: Duration,
    /// The bytes of each queue ring this node creates.
    pub(crate) queue_bytes: u32,
    /// What each peer process may hold.
    pub(crate) bounds: PeerBounds,
}

/// A node's same-host transport.
pub(crate) struct ShmTransport {
    transport: Arc<Transport>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// What the transport's threads share. Its parts keep their own state behind their own locks;
/// what a connection means is in each connection's session.
pub(crate) struct Transport {
    identity: Identity,
    inbound: Arc<dyn Inbound>,
    limits: Limits,
    session: Arc<SessionConfig>,
    config: ShmConfig,
    segments: Segments,
    lending: Lending,
    book: Arc<Mutex<PeerBook>>,
    desk: Arc<KnockDesk>,
    copier: Copier,
    peers: Peers,
    wake: Arc<Wake>,
    /// Connections the probes made, for the driver to add.
    joining: Mutex<Vec<Arc<Conn>>>,
    /// Every connection the driver took over (to tell whether all are idle).
    conns: Mutex<Vec<Weak<Conn>>>,
    /// The node is closing: no new connections.
    draining: AtomicBool,
    /// Where a send goes that shared memory cannot take (the node's remote path).
    elsewhere: OnceLock<Box<dyn Fn(OutboundRequest) + Send + Sync>>,
    stop: AtomicBool,
}

impl ShmTransport {
    /// Listens on a fresh abstract socket and starts the driver and copy threads. The desk it
    /// returns answers knocks for it.
    pub(crate) fn start(
        node: SocketAddr,
        inbound: Arc<dyn Inbound>,
        session: Arc<SessionConfig>,
        config: ShmConfig,
        segments: Segments,
    ) -> Result<Self, Error> {
        QueueShape::DEFAULT
            .check(config.queue_bytes)
            .map_err(|e| Error::Misuse(format!("shared-memory queue size: {e}")))?;
        let identity = Identity {
            boot_id: crate::shm::os::boot_id(),
            user_ns: crate::shm::os::user_namespace(),
            uid: crate::shm::os::uid(),
            pid: std::process::id(),
            node: node.to_string(),
        };
        let name = socket_name(identity.uid).map_err(|e| Error::io("getrandom", e))?;
        let listener = crate::shm::socket::listen(&name)
            .map_err(|e| Error::io("listen on the shared-memory socket", e))?;
        let wake = Arc::new(Wake::new().map_err(|e| Error::io("eventfd", e))?);
        let desk = Arc::new(KnockDesk::offering(Where {
            socket: name,
            pid: identity.pid,
            uid: identity.uid,
            boot_id: identity.boot_id.clone(),
        }));
        let transport = Arc::new(Transport {
            identity,
            inbound,
            limits: session.limits,
            session,
            config,
            segments,
            lending: Lending::default(),
            book: Arc::new(Mutex::new(PeerBook::new(config.bounds))),
            desk,
            copier: Copier::default(),
            peers: Peers::default(),
            wake,
            joining: Mutex::new(Vec::new()),
            conns: Mutex::new(Vec::new()),
            draining: AtomicBool::new(false),
            elsewhere: OnceLock::new(),
            stop: AtomicBool::new(false),
        });
        {
            let wake = Arc::downgrade(&transport.wake);
            transport.segments.set_listener(Arc::new(move || {
                if let Some(wake) = wake.upgrade() {
                    wake.signal();
                }
            }));
        }
        let spawn = |name: &str, run: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(run)
                .map_err(|e| Error::io("spawn a shared-memory thread", e))
        };
        let driver = {
            let transport = Arc::clone(&transport);
            spawn(
                "tensorwire-shm",
                Box::new(move || driver::run(&transport, &listener)),
            )?
        };
        let copy = {
            let transport = Arc::clone(&transport);
            spawn(
                "tensorwire-shm-copy",
                Box::new(move || copier::run(&transport)),
            )?
        };
        Ok(Self {
            transport,
            threads: Mutex::new(vec![driver, copy]),
        })
    }

    /// The desk that answers knocks on the node's port.
    pub(crate) fn desk(&self) -> Arc<KnockDesk> {
        Arc::clone(&self.transport.desk)
    }

    /// Where sends go that shared memory cannot take: the node's remote path.
    pub(crate) fn set_elsewhere(&self, elsewhere: Box<dyn Fn(OutboundRequest) + Send + Sync>) {
        let _ = self.transport.elsewhere.set(elsewhere);
    }

    /// Whether `peer` is reached over shared memory. Never waits: an unknown peer gets a probe
    /// (on a thread of its own) and counts as [`Reach::Probing`] until it ends.
    pub(crate) fn reach(&self, peer: SocketAddr) -> Reach {
        peers::reach(&self.transport, peer)
    }

    /// [`ShmTransport::reach`], waiting up to `timeout` for a probe to end (for `route()`,
    /// which explains rather than sends).
    pub(crate) fn reach_settled(&self, peer: SocketAddr, timeout: Duration) -> Reach {
        let until = Instant::now() + timeout;
        let mut reach = self.reach(peer);
        while reach == Reach::Probing && Instant::now() < until {
            std::thread::sleep(Duration::from_micros(200));
            reach = self.transport.peers.reach_now(peer);
        }
        reach
    }

    /// Sends `request` over shared memory, or (if the peer turns out not to be local and
    /// `insist` is false) where the node would send it otherwise. `here`: the caller waits
    /// anyway, so a copy may run on its thread.
    pub(crate) fn send(&self, request: OutboundRequest, insist: bool, here: bool) {
        peers::send(&self.transport, request, insist, here);
    }

    /// A caller waiting for the answer to a send to `peer` (`done()` once it is there): reads
    /// that connection's queue itself for up to the spin window.
    pub(crate) fn wait_here(&self, peer: SocketAddr, done: &dyn Fn() -> bool) {
        if let Some(conn) = self.transport.peers.connection(peer) {
            caller::wait_here(&self.transport, &conn, done);
        }
    }

    /// Connections open, leases of this node's memory held by peers and their bytes, and the
    /// segments' bytes.
    pub(crate) fn gauges(&self) -> ShmGauges {
        let (leases, lent_bytes) = self.transport.lending.active();
        ShmGauges {
            connections: self.transport.peers.connected(),
            leases,
            lent_bytes,
            segments: self.transport.segments.segment_count(),
            segment_bytes: self.transport.segments.used_bytes(),
        }
    }

    /// Begins a graceful close: no new connections (requests on existing ones are refused
    /// by the node while it closes); what is in flight goes on.
    pub(crate) fn drain(&self) {
        self.transport.draining.store(true, Ordering::Release);
        self.transport.wake.signal();
    }

    /// Whether nothing is owed on any connection: no request outstanding or being served,
    /// nothing queued for a peer.
    pub(crate) fn drained(&self) -> bool {
        let mut conns = lock(&self.transport.conns);
        conns.retain(|c| c.strong_count() > 0);
        conns
            .iter()
            .filter_map(Weak::upgrade)
            .all(|c| c.is_closed() || c.is_idle())
    }

    /// Stops: what is queued goes out in one last turn, then every connection closes and
    /// whatever still waits fails with [`Error::Shutdown`]. Its threads are waited for until
    /// `until` (a close's deadline), at least [`STOP_AT_LEAST`] and at most [`STOP_WITHIN`].
    pub(crate) fn shutdown(&self, until: Option<Instant>) {
        let t = &self.transport;
        if t.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        t.wake.signal();
        t.copier.close();
        let current = std::thread::current().id();
        let threads = std::mem::take(&mut *lock(&self.threads));
        let others = threads.into_iter().filter(|t| t.thread().id() != current);
        // A close whose deadline passed still gives them a moment to end (they end at their
        // next look), and none waits past `STOP_WITHIN`.
        let now = Instant::now();
        let until = until.map_or(now + STOP_WITHIN, |u| {
            u.max(now + STOP_AT_LEAST).min(now + STOP_WITHIN)
        });
        let left = crate::sync::join_until(others, until);
        if left > 0 {
            // They hold the transport alive and end once what they wait on returns.
            tracing::warn!(
                threads = left,
                "shared memory: threads still running at the stop's deadline are left to end"
            );
        }
        for (request, _) in t.peers.shut_down() {
            request.completion.complete(Err(Error::Shutdown));
        }
    }
}

impl Drop for ShmTransport {
    fn drop(&mut self) {
        self.shutdown(None);
    }
}

/// What the shared-memory path holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ShmGauges {
    pub(crate) connections: usize,
    pub(crate) leases: usize,
    pub(crate) lent_bytes: u64,
    pub(crate) segments: usize,
    pub(crate) segment_bytes: u64,
}

impl Transport {
    /// A send shared memory cannot take: to the node's remote path, or (the caller insisted on
    /// shared memory) failed with the reason.
    fn elsewhere(&self, request: OutboundRequest, insist: bool, why: &str) {
        match self.elsewhere.get() {
            Some(remote) if !insist => remote(request),
            _ => {
                let error = Error::RouteUnavailable {
                    route: "shm",
                    reason: why.to_owned(),
                };
                request.completion.complete(Err(error));
            }
        }
    }

    fn is_stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Lists a connection the driver took over.
    fn track(&self, conn: &Arc<Conn>) {
        let mut conns = lock(&self.conns);
        conns.retain(|c| c.strong_count() > 0);
        conns.push(Arc::downgrade(conn));
    }

    /// A connection for the driver to take over.
    fn join(&self, conn: Arc<Conn>) {
        lock(&self.joining).push(conn);
        self.wake.signal();
    }
}

/// A fresh abstract socket name (random: nobody can bind it first).
fn socket_name(uid: u32) -> std::io::Result<String> {
    let token: [u8; 16] = crate::shm::os::random()?;
    let hex: String = token.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("tensorwire/{uid}/{hex}"))
}
