//! The same-host data path. A TensorMessage travels as one control datagram over an
//! abstract-namespace Unix socket; its bytes stay in the sender's segments (see
//! `shm::segments`), which the receiver maps once per connection, read-only. Buffers already
//! in this node's frozen slots (loans) go where they are; the rest are copied once into one
//! fresh slot; a small message rides in the datagram. The receiver's buffers are views of the
//! sender's memory, and the sender never writes a slot again until every view of it is gone.
//!
//! Locality is proven, never guessed or claimed (`probe.rs`): the peer answers a knock on the
//! TCP port the caller addressed, and proves on the socket that it is that process, under
//! this user, on this boot. Both ends check `SO_PEERCRED`.
//!
//! Threads: one poll thread per node (accepts, receives, sends what waits for room, releases,
//! retires idle segments, watches holders that left), one copy thread (payload copies of
//! sends, so no caller copies a payload or waits for socket room), and short-lived probe
//! threads. A small message is written into its datagram on the calling thread.
//!
//! What it does not do: revoke memory from a live holder, or send to a peer it has not proven
//! to be on this host.

mod conn;
mod copier;
mod holding;
mod knock;
mod lending;
mod packing;
mod poller;
mod probe;
mod responder;
mod service;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tensorwire_proto::Limits;
use tensorwire_proto::session::SessionConfig;
use tensorwire_proto::transport::{Error, Inbound, OutboundRequest};

use crate::shm::segments::Segments;
pub(crate) use crate::sync::lock;
use conn::Conn;
use copier::Copier;
use holding::Releases;
pub(crate) use knock::{KnockDesk, KnockHandOff, Where};
use lending::Lending;
use probe::Identity;

/// How long a peer found not to be on this host is not asked again.
const NOT_LOCAL_FOR: Duration = Duration::from_secs(5);
/// Probes running at once at most (beyond, peers count as not local until one finishes).
const MAX_PROBES: usize = 16;

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
    /// How long the poll thread, and a caller waiting for its reply, poll for the next
    /// datagram before sleeping.
    pub(crate) busy_poll: Duration,
}

/// Whether a peer is reached over shared memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reach {
    /// Yes: it proved it is on this host.
    Local,
    /// Not known yet: a probe runs (sends wait for it, on the transport).
    Probing,
    /// No, and why.
    NotLocal(String),
}

/// A node's same-host transport.
pub(crate) struct ShmTransport {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

pub(crate) struct Shared {
    pub(crate) identity: Identity,
    pub(crate) inbound: Arc<dyn Inbound>,
    pub(crate) limits: Limits,
    pub(crate) session: Arc<SessionConfig>,
    pub(crate) config: ShmConfig,
    pub(crate) segments: Segments,
    pub(crate) lending: Lending,
    pub(crate) releases: Arc<Releases>,
    pub(crate) desk: Arc<KnockDesk>,
    pub(crate) copier: Copier,
    pub(crate) wake: Arc<OwnedFd>,
    /// The poll thread's epoll (connections change what it watches from any thread).
    pub(crate) epoll: Arc<OwnedFd>,
    /// Connections the probes made, for the poll thread to add.
    pub(crate) joining: Mutex<Vec<Arc<Conn>>>,
    /// What is known of each peer this node sends to.
    peers: Mutex<HashMap<SocketAddr, Peer>>,
    probes: AtomicUsize,
    /// Asks and tells waiting for their answer, by request id.
    pub(crate) pending: Mutex<HashMap<u64, service::Waiting>>,
    /// Where a send goes that shared memory cannot take (the node's remote path).
    elsewhere: OnceLock<Box<dyn Fn(OutboundRequest) + Send + Sync>>,
    pub(crate) stop: AtomicBool,
}

enum Peer {
    Local(Arc<Conn>),
    /// A probe runs; these sends wait for its outcome (`true`: the caller insisted on shared
    /// memory and fails without it).
    Probing(Vec<(OutboundRequest, bool)>),
    NotLocal {
        why: String,
        until: Instant,
    },
}

impl ShmTransport {
    /// Listens on a fresh abstract socket and starts the poll and copy threads. The desk it
    /// returns answers knocks for it.
    pub(crate) fn start(
        node: SocketAddr,
        inbound: Arc<dyn Inbound>,
        session: Arc<SessionConfig>,
        config: ShmConfig,
        segments: Segments,
    ) -> Result<Self, Error> {
        let identity = Identity::of_this_process(node);
        let name = socket_name(identity.uid).map_err(|e| Error::io("getrandom", e))?;
        let listener = crate::shm::socket::listen(&name)
            .map_err(|e| Error::io("listen on the shared-memory socket", e))?;
        let wake = Arc::new(crate::sys::eventfd_blocking().map_err(|e| Error::io("eventfd", e))?);
        let epoll = Arc::new(crate::sys::epoll().map_err(|e| Error::io("epoll_create1", e))?);
        let desk = Arc::new(KnockDesk::offering(Where {
            socket: name,
            pid: identity.pid,
            uid: identity.uid,
            boot_id: identity.boot_id.clone(),
        }));
        let shared = Arc::new(Shared {
            identity,
            inbound,
            limits: session.limits,
            session,
            config,
            segments,
            lending: Lending::default(),
            releases: Arc::new(Releases::new(Arc::clone(&wake))),
            desk,
            copier: Copier::default(),
            wake,
            epoll,
            joining: Mutex::new(Vec::new()),
            peers: Mutex::new(HashMap::new()),
            probes: AtomicUsize::new(0),
            pending: Mutex::new(HashMap::new()),
            elsewhere: OnceLock::new(),
            stop: AtomicBool::new(false),
        });
        {
            let wake = Arc::downgrade(&shared.wake);
            shared.segments.set_listener(Arc::new(move || {
                if let Some(wake) = wake.upgrade() {
                    crate::sys::eventfd_signal(wake.as_raw_fd());
                }
            }));
        }
        let spawn = |name: &str, run: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(run)
                .map_err(|e| Error::io("spawn a shared-memory thread", e))
        };
        let poll = {
            let shared = Arc::clone(&shared);
            spawn(
                "tensorwire-shm",
                Box::new(move || poller::run(&shared, &listener)),
            )?
        };
        let copy = {
            let shared = Arc::clone(&shared);
            spawn(
                "tensorwire-shm-copy",
                Box::new(move || copier::run(&shared)),
            )?
        };
        Ok(Self {
            shared,
            threads: Mutex::new(vec![poll, copy]),
        })
    }

    /// The desk that answers knocks on the node's port.
    pub(crate) fn desk(&self) -> Arc<KnockDesk> {
        Arc::clone(&self.shared.desk)
    }

    /// Where sends go that shared memory cannot take: the node's remote path.
    pub(crate) fn set_elsewhere(&self, elsewhere: Box<dyn Fn(OutboundRequest) + Send + Sync>) {
        let _ = self.shared.elsewhere.set(elsewhere);
    }

    /// Whether `peer` is reached over shared memory. Never waits: an unknown peer gets a probe
    /// (on a thread of its own) and counts as [`Reach::Probing`] until it ends.
    pub(crate) fn reach(&self, peer: SocketAddr) -> Reach {
        let now = Instant::now();
        let mut peers = lock(&self.shared.peers);
        match peers.get(&peer) {
            Some(Peer::Local(conn)) if !conn.is_closed() => return Reach::Local,
            Some(Peer::Probing(_)) => return Reach::Probing,
            Some(Peer::NotLocal { why, until }) if *until > now => {
                return Reach::NotLocal(why.clone());
            }
            _ => {}
        }
        if self.shared.probes.fetch_add(1, Ordering::AcqRel) >= MAX_PROBES {
            self.shared.probes.fetch_sub(1, Ordering::AcqRel);
            return Reach::NotLocal("too many shared-memory probes at once".into());
        }
        peers.insert(peer, Peer::Probing(Vec::new()));
        drop(peers);
        let shared = Arc::downgrade(&self.shared);
        let identity = self.shared.identity.clone();
        let timeout = self.shared.config.hello_timeout;
        let spawned = std::thread::Builder::new()
            .name("tensorwire-shm-probe".into())
            .spawn(move || {
                let outcome = probe::probe(&identity, peer, timeout);
                if let Some(shared) = shared.upgrade() {
                    shared.probes.fetch_sub(1, Ordering::AcqRel);
                    probed(&shared, peer, outcome);
                }
            });
        if spawned.is_err() {
            self.shared.probes.fetch_sub(1, Ordering::AcqRel);
            probed(
                &self.shared,
                peer,
                Err("cannot start a shared-memory probe thread".into()),
            );
        }
        self.reach_now(peer)
    }

    /// [`ShmTransport::reach`], waiting up to `timeout` for a probe to end (for `route()`,
    /// which explains rather than sends).
    pub(crate) fn reach_settled(&self, peer: SocketAddr, timeout: Duration) -> Reach {
        let until = Instant::now() + timeout;
        let mut reach = self.reach(peer);
        while reach == Reach::Probing && Instant::now() < until {
            std::thread::sleep(Duration::from_micros(200));
            reach = self.reach_now(peer);
        }
        reach
    }

    /// Sends `request` over shared memory, or (if the peer turns out not to be local and
    /// `insist` is false) where the node would send it otherwise. `here`: the caller waits
    /// anyway, so a copy may run on its thread.
    pub(crate) fn send(&self, request: OutboundRequest, insist: bool, here: bool) {
        let conn = {
            let mut peers = lock(&self.shared.peers);
            match peers.get_mut(&request.peer) {
                Some(Peer::Local(conn)) if !conn.is_closed() => Arc::clone(conn),
                Some(Peer::Probing(queued)) => {
                    queued.push((request, insist));
                    return;
                }
                Some(Peer::NotLocal { why, .. }) => {
                    let why = why.clone();
                    drop(peers);
                    return elsewhere(&self.shared, request, insist, &why);
                }
                _ => {
                    drop(peers);
                    let Reach::NotLocal(reason) = self.reach(request.peer) else {
                        return self.send(request, insist, here);
                    };
                    return elsewhere(&self.shared, request, insist, &reason);
                }
            }
        };
        service::send(&self.shared, &conn, request, here);
    }

    /// A caller waiting for the answer to a send to `peer` (`done()` once it is there):
    /// receives on that connection itself for up to the busy-poll budget.
    pub(crate) fn wait_here(&self, peer: SocketAddr, done: &dyn Fn() -> bool) {
        let conn = match lock(&self.shared.peers).get(&peer) {
            Some(Peer::Local(conn)) if !conn.is_closed() => Arc::clone(conn),
            _ => return,
        };
        service::receive_while(&self.shared, &conn, self.shared.config.busy_poll, done);
    }

    /// Connections open, leases of this node's memory held by peers and their bytes, and the
    /// segments' bytes.
    pub(crate) fn gauges(&self) -> ShmGauges {
        let connections = lock(&self.shared.peers)
            .values()
            .filter(|p| matches!(p, Peer::Local(c) if !c.is_closed()))
            .count();
        let (leases, lent_bytes) = self.shared.lending.active();
        ShmGauges {
            connections,
            leases,
            lent_bytes,
            segments: self.shared.segments.segment_count(),
            segment_bytes: self.shared.segments.used_bytes(),
        }
    }

    pub(crate) fn shutdown(&self) {
        if self.shared.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        crate::sys::eventfd_signal(self.shared.wake.as_raw_fd());
        self.shared.copier.close();
        let current = std::thread::current().id();
        for thread in std::mem::take(&mut *lock(&self.threads)) {
            if thread.thread().id() != current {
                let _ = thread.join();
            }
        }
        let waiting: Vec<_> = lock(&self.shared.pending).drain().collect();
        for (_, waiting) in waiting {
            waiting.fail(Error::Shutdown);
        }
        let queued: Vec<_> = lock(&self.shared.peers)
            .drain()
            .flat_map(|(_, peer)| match peer {
                Peer::Probing(queued) => queued,
                _ => Vec::new(),
            })
            .collect();
        for (request, _) in queued {
            request.completion.complete(Err(Error::Shutdown));
        }
    }

    fn reach_now(&self, peer: SocketAddr) -> Reach {
        match lock(&self.shared.peers).get(&peer) {
            Some(Peer::Local(conn)) if !conn.is_closed() => Reach::Local,
            Some(Peer::Probing(_)) => Reach::Probing,
            Some(Peer::NotLocal { why, .. }) => Reach::NotLocal(why.clone()),
            _ => Reach::NotLocal("the shared-memory connection closed".into()),
        }
    }
}

impl Drop for ShmTransport {
    fn drop(&mut self) {
        self.shutdown();
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

/// A probe ended: the peer is local (its connection joins the poll thread) or not; the sends
/// that waited for it go on.
fn probed(shared: &Arc<Shared>, peer: SocketAddr, outcome: Result<Conn, String>) {
    let (state, conn) = match outcome {
        Ok(conn) => {
            let conn = Arc::new(conn);
            lock(&shared.joining).push(Arc::clone(&conn));
            crate::sys::eventfd_signal(shared.wake.as_raw_fd());
            (Peer::Local(Arc::clone(&conn)), Ok(conn))
        }
        Err(why) => {
            tracing::debug!(%peer, %why, "shared memory not used");
            (
                Peer::NotLocal {
                    why: why.clone(),
                    until: Instant::now() + NOT_LOCAL_FOR,
                },
                Err(why),
            )
        }
    };
    let queued = match lock(&shared.peers).insert(peer, state) {
        Some(Peer::Probing(queued)) => queued,
        _ => Vec::new(),
    };
    for (request, insist) in queued {
        match &conn {
            Ok(conn) => service::send(shared, conn, request, false),
            Err(why) => elsewhere(shared, request, insist, why),
        }
    }
}

/// A send shared memory cannot take: to the node's remote path, or (the caller insisted on
/// shared memory) failed with the reason.
pub(crate) fn elsewhere(shared: &Shared, request: OutboundRequest, insist: bool, why: &str) {
    match shared.elsewhere.get() {
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

/// A fresh abstract socket name (random: nobody can bind it first).
fn socket_name(uid: u32) -> std::io::Result<String> {
    let token: [u8; 16] = crate::shm::os::random()?;
    let hex: String = token.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("tensorwire/{uid}/{hex}"))
}
