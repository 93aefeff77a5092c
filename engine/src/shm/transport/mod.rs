//! The same-host data path: a TensorMessage travels as one control datagram over an
//! abstract-namespace Unix socket, its bytes in memfds passed beside it. Buffers already in
//! sealed loaned slots go as they are (no copy); the rest are copied once into a pooled,
//! pre-faulted slot. The receiver's buffers are read-only views of that memory; the lease goes
//! back when the last view drops.
//!
//! Locality is proven, never guessed: a peer counts as same-host only after it answered on
//! the socket named for its port with this boot id, this user namespace and this user, and
//! said it is the node at that address.
//!
//! One thread per node polls the listener and every connection; sends go out from the
//! caller's thread.

mod conn;
mod holding;
mod lending;
mod packing;
mod service;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tensorwire_proto::Limits;
use tensorwire_proto::session::SessionConfig;
use tensorwire_proto::shm::Hello;
use tensorwire_proto::transport::{Answer, Error, Inbound, OutboundRequest};

use crate::shm::quota::Quota;
use conn::Conn;
use holding::Releases;
use lending::Lending;

/// How long a peer found not to be on this host is not asked again.
const NOT_LOCAL_FOR: Duration = Duration::from_secs(5);
/// The capability exchange must finish within this.
const HELLO_TIMEOUT: Duration = Duration::from_secs(1);

/// Settings of the data path.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShmConfig {
    /// Bytes of slots (lent and idle) at most.
    pub(crate) quota: u64,
    /// Idle slot bytes kept for reuse.
    pub(crate) max_idle: usize,
    /// How long a peer may hold a message's memory before it is revoked.
    pub(crate) max_hold: Duration,
}

/// A node's same-host transport.
pub(crate) struct ShmTransport {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

pub(crate) struct Shared {
    pub(crate) hello: Hello,
    pub(crate) inbound: Arc<dyn Inbound>,
    pub(crate) limits: Limits,
    pub(crate) session: Arc<SessionConfig>,
    pub(crate) config: ShmConfig,
    pub(crate) lending: Lending,
    pub(crate) releases: Arc<Releases>,
    pub(crate) wake: Arc<OwnedFd>,
    /// Connections the poll thread should add.
    pub(crate) joining: Mutex<Vec<(Arc<Conn>, bool)>>,
    /// What is known of each peer.
    peers: Mutex<HashMap<SocketAddr, Peer>>,
    /// Asks and tells waiting for their answer, by request id.
    pub(crate) pending: Mutex<HashMap<u64, service::Waiting>>,
    pub(crate) stop: AtomicBool,
}

enum Peer {
    Local(Arc<Conn>),
    NotLocal { until: Instant },
}

impl ShmTransport {
    /// Listens on the socket named for `node`'s port and starts the poll thread.
    pub(crate) fn start(
        node: SocketAddr,
        inbound: Arc<dyn Inbound>,
        session: Arc<SessionConfig>,
        config: ShmConfig,
    ) -> Result<Self, Error> {
        let listener = crate::shm::os::listen(&conn::socket_name(node.port()))
            .map_err(|e| Error::io("listen on the shared-memory socket", e))?;
        let wake = Arc::new(crate::sys::eventfd_blocking().map_err(|e| Error::io("eventfd", e))?);
        let shared = Arc::new(Shared {
            hello: conn::hello(node),
            inbound,
            limits: session.limits,
            session,
            config,
            lending: Lending::new(Quota::new(config.quota), config.max_idle),
            releases: Arc::new(Releases::new(Arc::clone(&wake))),
            wake,
            joining: Mutex::new(Vec::new()),
            peers: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
        });
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("tensorwire-shm".into())
                .spawn(move || service::run(&shared, &listener))
                .map_err(|e| Error::io("spawn the shared-memory thread", e))?
        };
        Ok(Self {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Whether `peer` is a node on this host that speaks shared memory (asked once, then
    /// remembered; a peer found remote is asked again after a few seconds).
    pub(crate) fn reachable(&self, peer: SocketAddr) -> bool {
        self.connection(peer).is_some()
    }

    /// Sends `request` over shared memory; its outcome goes to its completion.
    pub(crate) fn send(&self, request: OutboundRequest) {
        let Some(conn) = self.connection(request.peer) else {
            let peer = request.peer;
            return request.completion.complete(Err(Error::ConnectionClosed {
                peer,
                detail: Some(std::io::Error::other("the peer is not on this host")),
            }));
        };
        service::send(&self.shared, &conn, request);
    }

    /// Connections open, and leases of this process's memory held by peers.
    pub(crate) fn gauges(&self) -> (usize, usize) {
        let peers = lock(&self.shared.peers);
        let connections = peers
            .values()
            .filter(|p| matches!(p, Peer::Local(c) if !c.is_closed()))
            .count();
        (connections, self.shared.lending.active())
    }

    pub(crate) fn shutdown(&self) {
        if self.shared.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        crate::sys::eventfd_signal(self.shared.wake.as_raw_fd());
        if let Some(thread) = lock(&self.thread).take()
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
        let waiting: Vec<_> = lock(&self.shared.pending).drain().collect();
        for (_, waiting) in waiting {
            waiting.completion.complete(Err(Error::Shutdown));
        }
    }

    fn connection(&self, peer: SocketAddr) -> Option<Arc<Conn>> {
        let now = Instant::now();
        {
            let peers = lock(&self.shared.peers);
            match peers.get(&peer) {
                Some(Peer::Local(conn)) if !conn.is_closed() => return Some(Arc::clone(conn)),
                Some(Peer::NotLocal { until }) if *until > now => return None,
                _ => {}
            }
        }
        let found = conn::connect(
            &conn::socket_name(peer.port()),
            peer,
            &self.shared.hello,
            HELLO_TIMEOUT,
        )
        .ok()
        .flatten()
        .map(Arc::new);
        let mut peers = lock(&self.shared.peers);
        match &found {
            Some(conn) => {
                peers.insert(peer, Peer::Local(Arc::clone(conn)));
                lock(&self.shared.joining).push((Arc::clone(conn), true)); // hello already exchanged
                crate::sys::eventfd_signal(self.shared.wake.as_raw_fd());
            }
            None => {
                peers.insert(
                    peer,
                    Peer::NotLocal {
                        until: now + NOT_LOCAL_FOR,
                    },
                );
            }
        }
        found
    }
}

impl Drop for ShmTransport {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A request waiting for its answer.
pub(crate) fn complete_waiting(shared: &Shared, id: u64, outcome: Result<Answer, Error>) {
    let waiting = lock(&shared.pending).remove(&id);
    if let Some(waiting) = waiting {
        waiting.completion.complete(outcome);
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
