//! What this node knows of each peer it sends to: reached over shared memory (its
//! connection), being probed (sends wait for the outcome), or not on this host (and why, for
//! a while, so a remote peer costs one knock, not one per send).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tensorwire_proto::fast_hash::FastHash;
use tensorwire_proto::transport::OutboundRequest;

use super::Transport;
use super::conn::Conn;
use crate::sync::lock;

/// How long a peer found not to be on this host is not asked again.
const NOT_LOCAL_FOR: Duration = Duration::from_secs(5);
/// Probes running at once at most (beyond, peers count as not local until one finishes).
const MAX_PROBES: usize = 16;

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

/// The peers, by the address they were reached at (addresses this node's users send to: a
/// peer never picks a key, so the fast hash serves; every send looks here).
#[derive(Default)]
pub(super) struct Peers {
    by_addr: Mutex<HashMap<SocketAddr, Peer, FastHash>>,
    probes: AtomicUsize,
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

/// Whether `peer` is reached over shared memory; starts a probe for an unknown one.
pub(super) fn reach(t: &Arc<Transport>, peer: SocketAddr) -> Reach {
    let mut peers = lock(&t.peers.by_addr);
    match peers.get(&peer) {
        Some(Peer::Local(conn)) if !conn.is_closed() => return Reach::Local,
        Some(Peer::Probing(_)) => return Reach::Probing,
        Some(Peer::NotLocal { why, until }) if *until > Instant::now() => {
            return Reach::NotLocal(why.clone());
        }
        _ => {}
    }
    if t.peers.probes.fetch_add(1, Ordering::AcqRel) >= MAX_PROBES {
        t.peers.probes.fetch_sub(1, Ordering::AcqRel);
        return Reach::NotLocal("too many shared-memory probes at once".into());
    }
    peers.insert(peer, Peer::Probing(Vec::new()));
    drop(peers);
    let weak = Arc::downgrade(t);
    let spawned = std::thread::Builder::new()
        .name("tensorwire-shm-probe".into())
        .spawn(move || {
            let Some(t) = weak.upgrade() else { return };
            let outcome = super::probe::probe(&t, peer);
            t.peers.probes.fetch_sub(1, Ordering::AcqRel);
            probed(&t, peer, outcome);
        });
    if spawned.is_err() {
        t.peers.probes.fetch_sub(1, Ordering::AcqRel);
        probed(
            t,
            peer,
            Err("cannot start a shared-memory probe thread".into()),
        );
    }
    t.peers.reach_now(peer)
}

/// Sends `request` over shared memory, or elsewhere if its peer is not local.
pub(super) fn send(t: &Arc<Transport>, request: OutboundRequest, insist: bool, here: bool) {
    let conn = {
        let mut peers = lock(&t.peers.by_addr);
        match peers.get_mut(&request.peer) {
            Some(Peer::Local(conn)) if !conn.is_closed() => Arc::clone(conn),
            Some(Peer::Probing(queued)) => {
                queued.push((request, insist));
                return;
            }
            Some(Peer::NotLocal { why, until }) if *until > Instant::now() => {
                let why = why.clone();
                drop(peers);
                return t.elsewhere(request, insist, &why);
            }
            _ => {
                drop(peers);
                let Reach::NotLocal(reason) = reach(t, request.peer) else {
                    return send(t, request, insist, here);
                };
                return t.elsewhere(request, insist, &reason);
            }
        }
    };
    super::outbound::send(t, &conn, request, here);
}

impl Peers {
    /// What is known of `peer` now, without starting anything.
    pub(super) fn reach_now(&self, peer: SocketAddr) -> Reach {
        match lock(&self.by_addr).get(&peer) {
            Some(Peer::Local(conn)) if !conn.is_closed() => Reach::Local,
            Some(Peer::Probing(_)) => Reach::Probing,
            Some(Peer::NotLocal { why, .. }) => Reach::NotLocal(why.clone()),
            _ => Reach::NotLocal("the shared-memory connection closed".into()),
        }
    }

    /// The open connection to `peer`, if any.
    pub(super) fn connection(&self, peer: SocketAddr) -> Option<Arc<Conn>> {
        match lock(&self.by_addr).get(&peer) {
            Some(Peer::Local(conn)) if !conn.is_closed() => Some(Arc::clone(conn)),
            _ => None,
        }
    }

    /// Open connections this node made.
    pub(super) fn connected(&self) -> usize {
        lock(&self.by_addr)
            .values()
            .filter(|p| matches!(p, Peer::Local(c) if !c.is_closed()))
            .count()
    }

    /// Forgets a connection that closed (the next send to its peer probes again).
    pub(super) fn forget(&self, conn: &Arc<Conn>) {
        lock(&self.by_addr)
            .retain(|_, peer| !matches!(peer, Peer::Local(c) if Arc::ptr_eq(c, conn)));
    }

    /// Forgets every peer; the sends that waited for a probe, to fail.
    pub(super) fn shut_down(&self) -> Vec<(OutboundRequest, bool)> {
        lock(&self.by_addr)
            .drain()
            .flat_map(|(_, peer)| match peer {
                Peer::Probing(queued) => queued,
                _ => Vec::new(),
            })
            .collect()
    }
}

/// A probe ended: the peer is local (its connection joins the driver) or not; the sends that
/// waited for it go on.
fn probed(t: &Arc<Transport>, peer: SocketAddr, outcome: Result<Arc<Conn>, String>) {
    let state = match &outcome {
        Ok(conn) => {
            t.join(Arc::clone(conn));
            Peer::Local(Arc::clone(conn))
        }
        Err(why) => {
            tracing::debug!(%peer, %why, "shared memory not used");
            Peer::NotLocal {
                why: why.clone(),
                until: Instant::now() + NOT_LOCAL_FOR,
            }
        }
    };
    let queued = {
        let mut peers = lock(&t.peers.by_addr);
        if t.is_stopping() {
            Vec::new()
        } else {
            match peers.insert(peer, state) {
                Some(Peer::Probing(queued)) => queued,
                _ => Vec::new(),
            }
        }
    };
    for (request, insist) in queued {
        match &outcome {
            Ok(conn) => super::outbound::send(t, conn, request, false),
            Err(why) => t.elsewhere(request, insist, why),
        }
    }
}
