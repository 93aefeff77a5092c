//! The per-peer client connection policy: reuse idle connections (most recent first), cap the
//! connections per peer (fewer for large requests: about `busy_bytes_per_peer` on their way
//! at once), pipeline small requests to a peer that takes them onto its busy connections once
//! it has a few, queue requests beyond the cap in order, trim idle surplus.
//!
//! It holds no sockets: connections are keys of the driver's own (`C`), requests are whatever
//! the driver queues (`R`). Every deadline sits in an ordered set, so nothing is scanned
//! linearly, and a peer with no connections and no waiting requests leaves the map.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Instant;

use crate::config::ConnectionPoolConfig;
use crate::transport::Error;

/// Identifies a request waiting for a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaiterId(u64);

/// What to do with a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Checkout<C, R> {
    /// Send it on this idle connection.
    Reuse(C, R),
    /// Open a new connection for it (already counted as open; tell the pool its key with
    /// [`ConnectionPool::opened`]).
    Connect(R),
    /// Start it on this busy connection behind what it carries (its peer takes pipelined
    /// requests).
    Pipeline(C, R),
    /// Every connection allowed is busy: it waits, in order (its deadline runs).
    Queued(WaiterId),
    /// Every connection allowed is busy and `max_waiting` requests wait already: it is
    /// refused (fail it as overloaded; it was not started).
    Full(R),
}

/// What becomes of a connection that finished a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Checkin<C, R> {
    /// A waiting request takes it.
    Serve(C, R),
    /// It is idle in the pool.
    Idle,
    /// A request handed to it (pipelined onto it meanwhile) is not started yet: it stays
    /// busy, and is checked in again once that one is answered.
    Carrying,
}

/// What expired at a deadline.
#[derive(Debug, PartialEq, Eq)]
pub struct Expired<C, R> {
    /// Requests whose deadline passed while they waited (fail them with a timeout).
    pub requests: Vec<R>,
    /// Idle connections above the cap that stayed idle too long (close them).
    pub trimmed: Vec<C>,
}

impl<C, R> Default for Expired<C, R> {
    fn default() -> Self {
        Self {
            requests: Vec::new(),
            trimmed: Vec::new(),
        }
    }
}

/// Connections to every peer of one driver thread.
#[derive(Debug)]
pub struct ConnectionPool<C, R> {
    config: ConnectionPoolConfig,
    peers: HashMap<SocketAddr, Peer<C>>,
    waiters: HashMap<WaiterId, Waiter<R>>,
    deadlines: BTreeSet<(Instant, WaiterId)>,
    trims: BTreeSet<(Instant, SocketAddr)>,
    next_waiter: u64,
}

/// Requests of at most this many bytes are pipelined (to a peer that takes them): a larger
/// one would wait behind the others' bytes for no gain, one connection already carries it at
/// the wire's speed.
pub const MAX_PIPELINED_BYTES: u64 = 64 << 10;

#[derive(Debug)]
struct Peer<C> {
    /// Idle connections and since when, most recently used last.
    idle: Vec<(C, Instant)>,
    /// Busy connections the pool knows the key of, longest busy first.
    busy: Vec<Busy<C>>,
    /// Connections open (busy, idle or connecting).
    open: usize,
    queue: VecDeque<WaiterId>,
    /// The queued trim check, if any.
    trim_at: Option<Instant>,
}

#[derive(Debug)]
struct Waiter<R> {
    peer: SocketAddr,
    request: R,
    /// Its frame's length, for the byte budget.
    bytes: u64,
    /// How many requests its peer takes on one connection at once.
    depth: u16,
    deadline: Option<Instant>,
}

impl<C: Copy + Eq, R> ConnectionPool<C, R> {
    /// An empty pool.
    pub fn new(config: ConnectionPoolConfig) -> Self {
        Self {
            config,
            peers: HashMap::new(),
            waiters: HashMap::new(),
            deadlines: BTreeSet::new(),
            trims: BTreeSet::new(),
            next_waiter: 0,
        }
    }

    /// Finds a connection for `request` of `bytes` (its frame's length) to `peer`, one request
    /// per connection.
    pub fn checkout(
        &mut self,
        peer: SocketAddr,
        request: R,
        bytes: u64,
        deadline: Option<Instant>,
    ) -> Checkout<C, R> {
        self.checkout_pipelined(peer, request, bytes, deadline, 1)
    }

    /// Finds a connection for `request` of `bytes` (its frame's length) to `peer`, which takes
    /// up to `depth` requests on one connection before it has answered the first (1: one at a
    /// time). An idle connection comes first; then, for a request of at most
    /// [`MAX_PIPELINED_BYTES`] once the peer has `pipeline_connections` open, the busy one
    /// carrying fewest (if it has room); then a new connection; then the queue.
    pub fn checkout_pipelined(
        &mut self,
        peer: SocketAddr,
        request: R,
        bytes: u64,
        deadline: Option<Instant>,
        depth: u16,
    ) -> Checkout<C, R> {
        let max = self.config.max_per_peer.max(1);
        let busy_max = self.busy_max(bytes);
        let full = self.waiters.len() >= self.config.max_waiting;
        let spread = self.config.pipeline_connections.clamp(1, max);
        let pipelines = depth > 1 && bytes <= MAX_PIPELINED_BYTES;
        let state = self.peers.entry(peer).or_insert_with(|| Peer {
            idle: Vec::new(),
            busy: Vec::new(),
            open: 0,
            queue: VecDeque::new(),
            trim_at: None,
        });
        let may_start = state.open.saturating_sub(state.idle.len()) < busy_max;
        if pipelines && state.busy.len() >= spread {
            // Onto the first `spread` busy connections while they have room, even with idle
            // ones beside them (left from before the peer's depth was known: they are trimmed).
            if let Some(conn) = state.pipeline_onto(depth, spread) {
                return Checkout::Pipeline(conn, request);
            }
        }
        if may_start {
            if let Some((conn, _)) = state.idle.pop() {
                state.set_busy(conn, 1, bytes);
                return Checkout::Reuse(conn, request);
            }
        }
        if pipelines && (state.open >= spread || !may_start || state.open >= max) {
            if let Some(conn) = state.pipeline_onto(depth, state.busy.len()) {
                return Checkout::Pipeline(conn, request);
            }
        }
        if may_start && state.open < max {
            state.open += 1;
            return Checkout::Connect(request);
        }
        if full {
            return Checkout::Full(request);
        }
        let id = WaiterId(self.next_waiter);
        self.next_waiter += 1;
        state.queue.push_back(id);
        if let Some(at) = deadline {
            self.deadlines.insert((at, id));
        }
        self.waiters.insert(
            id,
            Waiter {
                peer,
                request,
                bytes,
                depth,
                deadline,
            },
        );
        Checkout::Queued(id)
    }

    /// The connection opened for a [`Checkout::Connect`] is `conn`; it carries its first
    /// request, of `bytes` (small requests may be pipelined onto it from now on, even while it
    /// connects).
    pub fn opened(&mut self, peer: SocketAddr, conn: C, bytes: u64) {
        if let Some(state) = self.peers.get_mut(&peer) {
            state.set_busy(conn, 1, bytes);
        }
    }

    /// A request handed to `conn` to `peer` has its outcome (or was never started): one
    /// call for each. Returns the first request waiting for `peer`, if it may be pipelined onto
    /// `conn` behind what it still carries (counted). Once the driver has nothing more on the
    /// connection, it [`ConnectionPool::checkin`]s it.
    pub fn answered(&mut self, peer: SocketAddr, conn: C) -> Option<R> {
        let state = self.peers.get_mut(&peer)?;
        let slot = state.busy.iter_mut().find(|b| b.conn == conn)?;
        slot.load = slot.load.saturating_sub(1);
        let (load, small) = (slot.load, slot.small);
        if load == 0 {
            return None; // idle: the checkin serves the next waiter, whatever it is
        }
        let front = state.queue.iter().find_map(|id| self.waiters.get(id))?;
        let fits = small
            && front.depth > 1
            && front.bytes <= MAX_PIPELINED_BYTES
            && load < u32::from(front.depth);
        if !fits {
            return None;
        }
        let request = self.next_waiter_of(peer)?;
        if let Some(slot) = self
            .peers
            .get_mut(&peer)
            .and_then(|state| state.busy.iter_mut().find(|b| b.conn == conn))
        {
            slot.load += 1;
        }
        Some(request)
    }

    /// `conn` to `peer` finished its request and can be reused.
    pub fn checkin(&mut self, peer: SocketAddr, conn: C, now: Instant) -> Checkin<C, R> {
        let carrying = self.peers.get(&peer).is_some_and(|state| {
            state
                .busy
                .iter()
                .any(|busy| busy.conn == conn && busy.load > 0)
        });
        if carrying {
            return Checkin::Carrying;
        }
        if let Some((request, bytes)) = self.next_waiter_with_bytes(peer) {
            if let Some(state) = self.peers.get_mut(&peer) {
                // As if it had been idle: what it carried before does not count.
                state.busy.retain(|b| b.conn != conn);
                state.set_busy(conn, 1, bytes);
            }
            return Checkin::Serve(conn, request);
        }
        let cap = self.config.idle_per_peer;
        let trim_after = self.config.trim_after;
        let Some(state) = self.peers.get_mut(&peer) else {
            return Checkin::Idle;
        };
        state.busy.retain(|b| b.conn != conn);
        state.idle.push((conn, now));
        if state.idle.len() > cap && state.trim_at.is_none() {
            if let Some(at) = now.checked_add(trim_after) {
                state.trim_at = Some(at);
                self.trims.insert((at, peer));
            }
        }
        Checkin::Idle
    }

    /// `conn` to `peer` is gone (closed busy or idle, or its connect failed). Returns a
    /// waiting request that may now open a connection (already counted as open).
    pub fn closed(&mut self, peer: SocketAddr, conn: C) -> Option<R> {
        let state = self.peers.get_mut(&peer)?;
        state.idle.retain(|(c, _)| *c != conn);
        state.busy.retain(|b| b.conn != conn);
        self.not_opened(peer)
    }

    /// `conn` to `peer` cannot take another request (it finishes those it carries, then
    /// closes): it is offered no more. Call [`ConnectionPool::closed`] once it is closed.
    pub fn retire(&mut self, peer: SocketAddr, conn: C) {
        if let Some(state) = self.peers.get_mut(&peer) {
            state.idle.retain(|(c, _)| *c != conn);
            state.busy.retain(|b| b.conn != conn);
        }
    }

    /// A connection counted by [`Checkout::Connect`] could not even be created. Returns a
    /// waiting request that may now try (already counted as open), if the byte budget leaves
    /// room for it; otherwise it goes on waiting for a busy connection (there is one, or it
    /// would not wait).
    pub fn not_opened(&mut self, peer: SocketAddr) -> Option<R> {
        let state = self.peers.get_mut(&peer)?;
        state.open = state.open.saturating_sub(1);
        let next = if self.front_fits(peer) {
            self.next_waiter_of(peer)
        } else {
            None
        };
        match next {
            Some(request) => {
                if let Some(state) = self.peers.get_mut(&peer) {
                    state.open += 1;
                }
                Some(request)
            }
            None => {
                self.forget_if_unused(peer);
                None
            }
        }
    }

    /// The request `id` is no longer wanted (its caller gave up); it is handed back.
    pub fn cancel(&mut self, id: WaiterId) -> Option<R> {
        let waiter = self.waiters.remove(&id)?;
        if let Some(at) = waiter.deadline {
            self.deadlines.remove(&(at, id));
        }
        if let Some(state) = self.peers.get_mut(&waiter.peer) {
            state.queue.retain(|&queued| queued != id);
        }
        self.forget_if_unused(waiter.peer);
        Some(waiter.request)
    }

    /// The request waiting under `id`, if it still waits.
    pub fn waiter(&self, id: WaiterId) -> Option<&R> {
        self.waiters.get(&id).map(|waiter| &waiter.request)
    }

    /// The earliest deadline of a waiting request or an idle trim.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let waiter = self.deadlines.first().map(|&(at, _)| at);
        let trim = self.trims.first().map(|&(at, _)| at);
        waiter.into_iter().chain(trim).min()
    }

    /// Takes out what expired by `now`.
    pub fn handle_timeout(&mut self, now: Instant) -> Expired<C, R> {
        let mut expired = Expired::default();
        while let Some(&(at, id)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some(request) = self.cancel(id) {
                expired.requests.push(request);
            }
        }
        while let Some(&(at, peer)) = self.trims.first() {
            if at > now {
                break;
            }
            self.trims.pop_first();
            self.trim(peer, now, &mut expired.trimmed);
        }
        expired
    }

    /// Empties the pool (shutdown): every waiting request and every idle connection.
    pub fn drain(&mut self) -> (Vec<R>, Vec<C>) {
        let requests = self.waiters.drain().map(|(_, w)| w.request).collect();
        let idle = self
            .peers
            .drain()
            .flat_map(|(_, state)| state.idle.into_iter().map(|(conn, _)| conn))
            .collect();
        self.deadlines.clear();
        self.trims.clear();
        (requests, idle)
    }

    /// Peers with any connection or waiting request.
    pub fn peers(&self) -> usize {
        self.peers.len()
    }

    /// Idle connections to all peers.
    pub fn idle(&self) -> usize {
        self.peers.values().map(|p| p.idle.len()).sum()
    }

    /// Requests waiting for a connection.
    pub fn waiting(&self) -> usize {
        self.waiters.len()
    }

    /// The error for a request refused with [`Checkout::Full`].
    pub fn full_error(&self) -> Error {
        Error::Overloaded {
            what: "the list of requests waiting for a connection",
            capacity: self.config.max_waiting,
        }
    }

    /// Whether the first request waiting for `peer` may start on a new connection now.
    fn front_fits(&self, peer: SocketAddr) -> bool {
        let Some(state) = self.peers.get(&peer) else {
            return false;
        };
        let busy = state.open.saturating_sub(state.idle.len());
        state
            .queue
            .iter()
            .find_map(|id| self.waiters.get(id))
            .is_some_and(|waiter| busy < self.busy_max(waiter.bytes))
    }

    /// How many connections to one peer may be busy when a request of `bytes` starts.
    fn busy_max(&self, bytes: u64) -> usize {
        let fit = self.config.busy_bytes_per_peer / bytes.max(1);
        usize::try_from(fit)
            .unwrap_or(usize::MAX)
            .clamp(1, self.config.max_per_peer.max(1))
    }

    fn next_waiter_of(&mut self, peer: SocketAddr) -> Option<R> {
        self.next_waiter_with_bytes(peer)
            .map(|(request, _)| request)
    }

    /// The first request waiting for `peer`, taken out, and its bytes.
    fn next_waiter_with_bytes(&mut self, peer: SocketAddr) -> Option<(R, u64)> {
        loop {
            let id = self.peers.get_mut(&peer)?.queue.pop_front()?;
            if let Some(waiter) = self.waiters.remove(&id) {
                if let Some(at) = waiter.deadline {
                    self.deadlines.remove(&(at, id));
                }
                return Some((waiter.request, waiter.bytes));
            }
        }
    }

    /// Closes idle connections above the cap that have been idle since `trim_after` ago.
    fn trim(&mut self, peer: SocketAddr, now: Instant, out: &mut Vec<C>) {
        let (cap, trim_after) = (self.config.idle_per_peer, self.config.trim_after);
        let Some(state) = self.peers.get_mut(&peer) else {
            return;
        };
        state.trim_at = None;
        // Oldest first: the front of the list was used least recently.
        while state.idle.len() > cap {
            let (conn, since) = state.idle[0];
            if since.checked_add(trim_after).is_some_and(|at| at > now) {
                break;
            }
            state.idle.remove(0);
            out.push(conn);
        }
        if state.idle.len() > cap {
            let (_, since) = state.idle[0];
            if let Some(at) = since.checked_add(trim_after) {
                state.trim_at = Some(at);
                self.trims.insert((at, peer));
            }
        }
    }

    /// Requests carried by busy connections to `peer` the pool knows of (pipelined ones
    /// included).
    pub fn carried(&self, peer: SocketAddr) -> usize {
        self.peers
            .get(&peer)
            .map_or(0, |state| state.busy.iter().map(|b| b.load as usize).sum())
    }

    fn forget_if_unused(&mut self, peer: SocketAddr) {
        let unused = self
            .peers
            .get(&peer)
            .is_some_and(|s| s.open == 0 && s.queue.is_empty() && s.idle.is_empty());
        if unused {
            if let Some(state) = self.peers.remove(&peer) {
                if let Some(at) = state.trim_at {
                    self.trims.remove(&(at, peer));
                }
            }
        }
    }
}

/// A busy connection.
#[derive(Debug)]
struct Busy<C> {
    conn: C,
    /// Requests handed to it and not answered yet.
    load: u32,
    /// Every request it carried since it was last idle was small enough to pipeline behind:
    /// a small request never waits behind a large one's bytes.
    small: bool,
}

impl<C: Copy + Eq> Peer<C> {
    /// Of the first `first` busy connections (the longest busy), the one carrying fewest, if it
    /// carries only small requests and fewer than `depth`: it carries one more.
    fn pipeline_onto(&mut self, depth: u16, first: usize) -> Option<C> {
        let slot = self
            .busy
            .iter_mut()
            .take(first)
            .filter(|b| b.small && b.load < u32::from(depth))
            .min_by_key(|b| b.load)?;
        slot.load += 1;
        Some(slot.conn)
    }

    /// `conn` carries `load` requests, the last of `bytes`.
    fn set_busy(&mut self, conn: C, load: u32, bytes: u64) {
        let small = bytes <= MAX_PIPELINED_BYTES;
        match self.busy.iter_mut().find(|b| b.conn == conn) {
            Some(slot) => {
                slot.load = load;
                slot.small &= small;
            }
            None => self.busy.push(Busy { conn, load, small }),
        }
    }
}
