//! Moving messages: sending a request (laid out on the calling thread, copied on the copy
//! thread when it needs a slot), and the poll thread that accepts and greets connections,
//! receives (hellos, maps, requests, replies, releases), sends what waited for room, gives
//! leases back, retires idle segments and notices holders that left.

use std::cell::Cell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tensorwire_proto::TensorMessage;
use tensorwire_proto::shm::{Control, MAX_DATAGRAM, WireReply, decode};
use tensorwire_proto::stats;
use tensorwire_proto::transport::{
    ActorPath, Answer, Completion, Deadline, Error, OutboundRequest, Reply, RequestKind,
};

use crate::shm::segments::SlotMut;
use crate::shm::socket::{self, PeerCred};
use crate::shm::transport::conn::{Conn, Sent};
use crate::shm::transport::holding::{map_segment, unmap_segment, unpack};
use crate::shm::transport::packing::{Layout, layout};
use crate::shm::transport::responder;
use crate::shm::transport::{Shared, WhenFull, elsewhere, lock};

/// Accepted connections waiting for their hello at most.
const MAX_GREETING: usize = 256;
/// The poll thread's housekeeping period (idle segments, stalled peers, late hellos).
const TICK: Duration = Duration::from_millis(500);

thread_local! {
    static TRANSPORT_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as one of the transport's own (a copy it would make goes to the
/// copy thread instead, so the poll thread never copies).
pub(crate) fn mark_transport_thread() {
    TRANSPORT_THREAD.with(|t| t.set(true));
}

/// Whether the calling thread is the poll thread.
pub(crate) fn on_poll_thread() -> bool {
    TRANSPORT_THREAD.with(Cell::get)
}

/// A request waiting for its answer.
pub(crate) struct Waiting {
    pub(crate) conn: u64,
    peer: SocketAddr,
    pub(crate) kind: RequestKind,
    completion: Box<dyn Completion>,
    timer: u64,
}

impl Waiting {
    pub(crate) fn fail(self, error: Error) {
        crate::pending::cancel_timer(self.timer);
        self.completion.complete(Err(error));
    }
}

/// A request on its way out.
struct Outgoing {
    id: u64,
    conn: Arc<Conn>,
    peer: SocketAddr,
    path: ActorPath,
    kind: RequestKind,
    message: TensorMessage,
    deadline: Deadline,
    layout: Layout,
}

/// Sends `request` on `conn`. Small messages go out from this thread (a non-blocking
/// `sendmsg`; when the socket is full the poll thread sends it); a copy into a slot runs on
/// the copy thread, or here if `here` (the caller waits anyway).
pub(crate) fn send(shared: &Arc<Shared>, conn: &Arc<Conn>, request: OutboundRequest, here: bool) {
    let OutboundRequest {
        peer,
        path,
        kind,
        message,
        deadline,
        completion,
        ..
    } = request;
    if completion.is_cancelled() {
        return completion.complete(Err(Error::Cancelled));
    }
    let layout = match layout(&message, &shared.limits, path.as_str().len(), conn) {
        Ok(layout) => layout,
        Err(e) => return completion.complete(Err(e)),
    };
    let id = next_id();
    // Cancellation is armed before the request is listed and checked after, so a caller
    // that gave up at any point is never lost.
    let cancelled = Arc::new(AtomicBool::new(false));
    {
        let (shared, cancelled) = (Arc::downgrade(shared), Arc::clone(&cancelled));
        completion.on_cancel(Box::new(move || {
            cancelled.store(true, Ordering::Release);
            if let Some(shared) = shared.upgrade() {
                finish(&shared, id, Err(Error::Cancelled));
            }
        }));
    }
    lock(&shared.pending).insert(
        id,
        Waiting {
            conn: conn.id,
            peer,
            kind,
            completion,
            timer: 0,
        },
    );
    if cancelled.load(Ordering::Acquire) {
        return finish(shared, id, Err(Error::Cancelled));
    }
    // The deadline is armed after the request is listed: one that passed already (a
    // timeout of 0) finds it.
    if let Some(at) = deadline.at() {
        let weak = Arc::downgrade(shared);
        let timer = crate::pending::schedule_timer(
            at,
            Box::new(move || {
                if let Some(shared) = weak.upgrade() {
                    finish(&shared, id, Err(deadline.error(kind.as_str())));
                }
            }),
        );
        match lock(&shared.pending).get_mut(&id) {
            Some(waiting) => waiting.timer = timer,
            None => crate::pending::cancel_timer(timer),
        }
    }
    let outgoing = Outgoing {
        id,
        conn: Arc::clone(conn),
        peer,
        path,
        kind,
        message,
        deadline,
        layout,
    };
    if outgoing.layout.copy == 0 || (here && !on_poll_thread()) {
        return transmit(shared, outgoing);
    }
    let job = Box::new(move |shared: &Arc<Shared>| transmit(shared, outgoing));
    if shared.copier.push(job).is_err() {
        finish(shared, id, Err(Error::Shutdown));
    }
}

/// Copies (if needed) and sends one request that still waits for its answer.
fn transmit(shared: &Arc<Shared>, outgoing: Outgoing) {
    let Outgoing {
        id,
        conn,
        peer,
        path,
        kind,
        message,
        deadline,
        layout,
    } = outgoing;
    if !lock(&shared.pending).contains_key(&id) {
        return; // its deadline passed or its caller gave up while it waited
    }
    let slot = if layout.copy > 0 {
        match credit(shared, layout.copy, deadline) {
            Ok(slot) => Some(slot),
            Err(why) => {
                return full(shared, id, peer, path, kind, message, deadline, &why);
            }
        }
    } else {
        None
    };
    let packed = match layout.fill(
        &message,
        &shared.limits,
        slot,
        &shared.lending,
        conn.peer.pid,
    ) {
        Ok(packed) => packed,
        Err(e) => return finish(shared, id, Err(e)),
    };
    let control = Control::Request {
        id,
        kind,
        path: path.as_str().to_owned(),
        body: packed.body,
    };
    let segments: Vec<_> = packed.segments.iter().collect();
    match conn.transmit(&segments, &control) {
        Ok(sent) => {
            if sent == Sent::Queued {
                crate::sys::eventfd_signal(shared.wake.as_raw_fd());
            }
            stats::global().record_shm_sent(message.total_bytes(), packed.copied, packed.zero_copy);
        }
        Err(e) => {
            for lease in packed.leases {
                shared.lending.release(conn.peer.pid, lease);
            }
            finish(
                shared,
                id,
                Err(Error::ConnectionClosed {
                    peer,
                    detail: Some(e),
                }),
            );
        }
    }
}

/// A slot of `len` bytes, waiting for credit (within the send's deadline and the configured
/// wait) when the quota is used up. `Err` says why there is none.
pub(crate) fn credit(shared: &Shared, len: usize, deadline: Deadline) -> Result<SlotMut, String> {
    match shared.segments.take(len) {
        Ok(slot) => return Ok(slot),
        Err(tensorwire_proto::shm::ShmError::Quota { .. }) => {}
        Err(e) => return Err(e.to_string()),
    }
    stats::global().record_shm_credit_wait();
    let until = Deadline::after(Instant::now(), shared.config.credit_wait).min(deadline);
    let until = until
        .at()
        .unwrap_or_else(|| Instant::now() + shared.config.credit_wait);
    shared.segments.take_until(len, until).map_err(|e| match e {
        tensorwire_proto::shm::ShmError::Quota { .. } => format!(
            "receivers hold this node's shared memory ({} of {} bytes in held slots); no \
             credit came back within {:?}",
            shared.segments.held_bytes(),
            shared.segments.quota(),
            shared.config.credit_wait
        ),
        other => other.to_string(),
    })
}

/// No credit came: the send goes over the remote path or fails, as configured.
#[allow(clippy::too_many_arguments)]
fn full(
    shared: &Arc<Shared>,
    id: u64,
    peer: SocketAddr,
    path: ActorPath,
    kind: RequestKind,
    message: TensorMessage,
    deadline: Deadline,
    why: &str,
) {
    let Some(waiting) = lock(&shared.pending).remove(&id) else {
        return;
    };
    crate::pending::cancel_timer(waiting.timer);
    if shared.config.when_full == WhenFull::FallBack {
        stats::global().record_shm_credit_fallback();
        tracing::debug!(%peer, %why, "shared memory is full: sending over the remote path");
        let request = OutboundRequest::new(peer, path, kind, message, deadline, waiting.completion);
        return elsewhere(shared, request, false, why);
    }
    stats::global().record_shm_credit_refusal();
    waiting.completion.complete(Err(Error::SharedMemoryFull {
        reason: why.to_owned(),
    }));
}

fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Completes request `id` (if it still waits) and forgets its deadline.
pub(crate) fn finish(shared: &Shared, id: u64, outcome: Result<Answer, Error>) {
    let waiting = lock(&shared.pending).remove(&id);
    if let Some(waiting) = waiting {
        crate::pending::cancel_timer(waiting.timer);
        waiting.completion.complete(outcome);
    }
}

/// An accepted connection before its hello.
struct Greeting {
    fd: OwnedFd,
    cred: PeerCred,
    since: Instant,
}

/// The poll thread's state: what it watches, rebuilt only when that changes.
struct Poller {
    conns: HashMap<u64, Arc<Conn>>,
    greeting: Vec<Greeting>,
    fds: Vec<libc::pollfd>,
    /// What each entry of `fds` past the first two is.
    kinds: Vec<Watched>,
    dirty: bool,
    buf: Vec<u8>,
}

#[derive(Clone, Copy)]
enum Watched {
    Greeting(usize),
    Conn(u64),
    Orphan(u32),
}

/// The poll thread.
pub(crate) fn run(shared: &Arc<Shared>, listener: &OwnedFd) {
    mark_transport_thread();
    let mut poller = Poller {
        conns: HashMap::new(),
        greeting: Vec::new(),
        fds: Vec::new(),
        kinds: Vec::new(),
        dirty: true,
        buf: vec![0u8; MAX_DATAGRAM],
    };
    let mut next_tick = Instant::now() + TICK;
    while !shared.stop.load(Ordering::Acquire) {
        for conn in std::mem::take(&mut *lock(&shared.joining)) {
            poller.conns.insert(conn.id, conn);
            poller.dirty = true;
        }
        if poller.dirty {
            poller.rebuild(shared, listener.as_raw_fd());
        }
        for (entry, kind) in poller.fds[2..].iter_mut().zip(&poller.kinds) {
            if let Watched::Conn(id) = kind {
                let queued = poller.conns.get(id).is_some_and(|c| c.has_queued());
                entry.events = libc::POLLIN | if queued { libc::POLLOUT } else { 0 };
            }
        }
        let timeout = next_tick.saturating_duration_since(Instant::now());
        if let Err(e) = crate::sys::poll_many(&mut poller.fds, timeout) {
            tracing::error!(error = %e, "the shared-memory poll thread cannot poll; it stops");
            break;
        }
        if poller.fds[0].revents != 0 {
            crate::sys::eventfd_drain(shared.wake.as_raw_fd());
        }
        send_releases(shared);
        for segment in shared.segments.take_retired() {
            for conn in poller.conns.values() {
                conn.retire(segment);
            }
        }
        if poller.fds[1].revents != 0 {
            poller.accept(shared, listener.as_raw_fd());
        }
        poller.serve_ready(shared);
        let now = Instant::now();
        if now >= next_tick {
            poller.tick(shared, now);
            next_tick = now + TICK;
        }
    }
    send_releases(shared);
    for (_, conn) in poller.conns.drain() {
        closed(shared, &conn);
    }
}

impl Poller {
    fn rebuild(&mut self, shared: &Shared, listener: RawFd) {
        let entry = |fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        self.fds.clear();
        self.kinds.clear();
        self.fds.push(entry(shared.wake.as_raw_fd()));
        self.fds.push(entry(listener));
        for (i, greeting) in self.greeting.iter().enumerate() {
            self.fds.push(entry(greeting.fd.as_raw_fd()));
            self.kinds.push(Watched::Greeting(i));
        }
        for (&id, conn) in &self.conns {
            self.fds.push(entry(conn.raw()));
            self.kinds.push(Watched::Conn(id));
        }
        for (pid, fd) in shared.lending.orphan_fds() {
            self.fds.push(entry(fd));
            self.kinds.push(Watched::Orphan(pid));
        }
        self.dirty = false;
    }

    /// Accepts every waiting connection from this user; others are closed at once.
    fn accept(&mut self, shared: &Shared, listener: RawFd) {
        while let Ok(Some(fd)) = socket::accept(listener) {
            let Ok(cred) = socket::peer_cred(fd.as_raw_fd()) else {
                continue;
            };
            if cred.uid != shared.identity.uid || self.greeting.len() >= MAX_GREETING {
                tracing::debug!(
                    uid = cred.uid,
                    pid = cred.pid,
                    "shared-memory connection refused"
                );
                continue;
            }
            self.greeting.push(Greeting {
                fd,
                cred,
                since: Instant::now(),
            });
            self.dirty = true;
        }
    }

    /// Handles every entry `poll` marked.
    fn serve_ready(&mut self, shared: &Arc<Shared>) {
        let marked: Vec<(Watched, i16)> = self.fds[2..]
            .iter()
            .zip(&self.kinds)
            .filter(|(fd, _)| fd.revents != 0)
            .map(|(fd, kind)| (*kind, fd.revents))
            .collect();
        let mut greeted = Vec::new();
        for (kind, revents) in marked {
            match kind {
                Watched::Greeting(i) => greeted.push(i),
                Watched::Orphan(pid) => {
                    shared.lending.exited(pid);
                    self.dirty = true;
                }
                Watched::Conn(id) => {
                    let Some(conn) = self.conns.get(&id).cloned() else {
                        continue;
                    };
                    let mut keep = true;
                    if revents & libc::POLLOUT != 0 && conn.flush().is_err() {
                        keep = false;
                    }
                    if keep && revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                        // Busy-poll only while one connection is at work (with more, the
                        // thread is busy anyway).
                        let busy = if self.conns.len() == 1 {
                            shared.config.busy_poll
                        } else {
                            Duration::ZERO
                        };
                        keep = receive_all(shared, &conn, &mut self.buf, busy);
                    }
                    if !keep {
                        self.conns.remove(&id);
                        closed(shared, &conn);
                        self.dirty = true;
                    }
                }
            }
        }
        // Highest index first, so the others stay valid while removing.
        greeted.sort_unstable_by(|a, b| b.cmp(a));
        for i in greeted {
            let greeting = self.greeting.swap_remove(i);
            if let Some(conn) = greet(shared, greeting, &mut self.buf) {
                self.conns.insert(conn.id, conn);
            }
            self.dirty = true;
        }
    }

    /// Housekeeping: idle segments retired, stalled peers and late hellos dropped.
    fn tick(&mut self, shared: &Arc<Shared>, now: Instant) {
        shared.segments.trim(now);
        let late = shared.config.hello_timeout;
        let before = self.greeting.len();
        self.greeting
            .retain(|g| now.saturating_duration_since(g.since) < late);
        let stalled: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.is_stalled(now) || c.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in &stalled {
            if let Some(conn) = self.conns.remove(id) {
                tracing::debug!(node = %conn.node, "shared-memory peer stalled or closed");
                closed(shared, &conn);
            }
        }
        if before != self.greeting.len() || !stalled.is_empty() {
            self.dirty = true;
        }
    }
}

/// Reads an accepted connection's hello and answers it; the connection, if the peer is who it
/// must be: this boot, user namespace and user, the pid the kernel saw, and holding a ticket
/// this node gave to the TCP address it says it knocked from.
fn greet(shared: &Shared, greeting: Greeting, buf: &mut [u8]) -> Option<Arc<Conn>> {
    let Greeting { fd, cred, .. } = greeting;
    let received = socket::receive(fd.as_raw_fd(), buf, 0).ok()??;
    let Ok(Control::Hello(theirs)) = decode(&buf[..received.len]) else {
        return None;
    };
    if let Some(why) = shared.identity.mismatch(&theirs) {
        tracing::debug!(%why, "shared-memory hello refused");
        return None;
    }
    if theirs.pid != cred.pid {
        tracing::debug!(
            said = theirs.pid,
            is = cred.pid,
            "shared-memory hello with a wrong pid"
        );
        return None;
    }
    let Some(secret) = shared.desk.redeem(theirs.ticket, &theirs.via) else {
        tracing::debug!("shared-memory hello without a valid ticket");
        return None;
    };
    let ours = shared.identity.hello(0, String::new(), secret);
    let datagram = tensorwire_proto::shm::encode(&Control::Hello(ours)).ok()?;
    socket::send(fd.as_raw_fd(), &datagram, &[]).ok()?;
    let pidfd = socket::peer_pidfd(fd.as_raw_fd(), cred.pid).ok();
    Some(Arc::new(Conn::new(fd, cred, pidfd, theirs.node)))
}

/// Sends the releases of views that dropped, batched per connection.
fn send_releases(shared: &Shared) {
    for (conn, leases) in shared.releases.take() {
        for chunk in leases.chunks((MAX_DATAGRAM - 64) / 8) {
            let release = Control::Release {
                leases: chunk.to_vec(),
            };
            let _ = conn.transmit(&[], &release);
        }
    }
}

/// Receives what waits on `conn` on a caller's thread that waits for its own reply anyway:
/// polls the socket for up to `budget` or until `done()`, handling whatever arrives (its reply
/// completes its request). A caller that finds the poll thread receiving leaves it to it. The
/// reply then needs no wake-up of the poll thread or of the caller.
pub(crate) fn receive_while(
    shared: &Arc<Shared>,
    conn: &Arc<Conn>,
    budget: Duration,
    done: &dyn Fn() -> bool,
) {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let start = Instant::now();
    BUF.with(|buf| {
        let mut buf = buf.borrow_mut();
        if buf.len() < MAX_DATAGRAM {
            buf.resize(MAX_DATAGRAM, 0);
        }
        while !done() && start.elapsed() < budget {
            if let Some(_rx) = conn.try_receive_lock() {
                if !drain(shared, conn, &mut buf) {
                    conn.close(); // the poll thread sees the hang-up and cleans up
                    return;
                }
            }
            std::hint::spin_loop();
        }
    });
}

/// Receives every datagram waiting on `conn`, then (with a `busy` budget) keeps polling it
/// that long for more before the poll thread sleeps again; `false` once it is closed or
/// broken.
fn receive_all(shared: &Arc<Shared>, conn: &Arc<Conn>, buf: &mut [u8], busy: Duration) -> bool {
    let _rx = conn.receive_lock();
    if !drain(shared, conn, buf) {
        return false;
    }
    let mut last = Instant::now();
    while !busy.is_zero() && last.elapsed() < busy {
        match socket::receive(conn.raw(), buf, 1) {
            Ok(Some(received)) => {
                if !take(shared, conn, buf, received) || !drain(shared, conn, buf) {
                    return false;
                }
                last = Instant::now();
            }
            Ok(None) => std::hint::spin_loop(),
            Err(_) => return false,
        }
    }
    true
}

/// Receives and handles every datagram waiting now; `false` once closed or broken.
fn drain(shared: &Arc<Shared>, conn: &Arc<Conn>, buf: &mut [u8]) -> bool {
    loop {
        match socket::receive(conn.raw(), buf, 1) {
            Ok(Some(received)) => {
                if !take(shared, conn, buf, received) {
                    return false;
                }
            }
            Ok(None) => return !conn.is_closed(),
            Err(_) => return false,
        }
    }
}

/// Handles one received datagram; `false` at end of stream or when the peer broke the
/// protocol.
fn take(shared: &Arc<Shared>, conn: &Arc<Conn>, buf: &[u8], received: socket::Received) -> bool {
    {
        if received.len == 0 {
            return false;
        }
        let Ok(control) = decode(&buf[..received.len]) else {
            tracing::debug!("invalid shared-memory datagram: closing the connection");
            return false;
        };
        if received.truncated {
            stats::global().record_shm_fd_failure();
        }
        handle(shared, conn, control, received.fds, received.truncated)
    }
}

/// Handles one datagram; `false` if the peer broke the protocol (the connection closes).
fn handle(
    shared: &Arc<Shared>,
    conn: &Arc<Conn>,
    control: Control,
    mut fds: Vec<OwnedFd>,
    truncated: bool,
) -> bool {
    match control {
        Control::Map { segment, len } => {
            if truncated || fds.is_empty() {
                // At the descriptor limit: the segment never arrived. The peer announces it
                // again the next time it uses it; what refers to it now fails cleanly.
                lock(&conn.lost).insert(segment);
                let _ = conn.transmit(&[], &Control::Unmapped { segment });
                return true;
            }
            lock(&conn.lost).remove(&segment);
            match map_segment(conn, segment, len, fds.pop()) {
                Ok(()) => true,
                Err(why) => {
                    tracing::warn!(node = %conn.node, %why, "a shared-memory segment was refused");
                    false
                }
            }
        }
        Control::Unmapped { segment } => {
            conn.forget(segment);
            true
        }
        Control::Retire { segment } => {
            unmap_segment(conn, segment);
            true
        }
        Control::Release { leases } => {
            for lease in leases {
                shared.lending.release(conn.peer.pid, lease);
            }
            true
        }
        Control::Request {
            id,
            kind,
            path,
            body,
        } => {
            let refuse = |text: String| {
                for lease in body.leases() {
                    shared.releases.push(Arc::downgrade(conn), lease);
                }
                responder::answer(shared, conn, id, WireReply::Error(text));
            };
            if let Err(text) = shared.inbound.admit(kind, &path) {
                refuse(text);
                return true;
            }
            match unpack(
                conn,
                &shared.releases,
                &shared.lending,
                &body,
                &shared.limits,
            ) {
                Ok(message) => responder::deliver(shared, conn, id, kind, path, message),
                Err(text) => responder::answer(shared, conn, id, WireReply::Error(text)),
            }
            true
        }
        Control::Reply { id, reply } => {
            let waiting = lock(&shared.pending).get(&id).map(|w| (w.kind, w.peer));
            let Some((kind, peer)) = waiting else {
                // Nobody waits any more (deadline, cancel): what it lent goes straight back.
                if let WireReply::Tensor(body) = &reply {
                    for lease in body.leases() {
                        shared.releases.push(Arc::downgrade(conn), lease);
                    }
                }
                return true;
            };
            let outcome = match reply {
                WireReply::Ack if kind == RequestKind::Tell => Ok(Answer::Ack),
                WireReply::Ack => Err(Error::UnexpectedReply {
                    peer,
                    request: "ask",
                    reply: "Ack",
                }),
                WireReply::Single { msg_type, data } => {
                    Ok(Answer::Reply(Reply::Single { msg_type, data }))
                }
                WireReply::Error(text) => Err(Error::Remote {
                    peer: Some(peer),
                    text,
                }),
                WireReply::Tensor(body) => unpack(
                    conn,
                    &shared.releases,
                    &shared.lending,
                    &body,
                    &shared.limits,
                )
                .map(|m| Answer::Reply(Reply::Tensor(m)))
                .map_err(|text| Error::Remote {
                    peer: Some(peer),
                    text: format!("the reply could not be mapped: {text}"),
                }),
            };
            finish(shared, id, outcome);
            true
        }
        Control::Hello(_) => false,
    }
}

/// A connection closed: what waited on it fails; what its peer holds of ours stays until that
/// process exits (it may still have views), unless it is gone already.
fn closed(shared: &Shared, conn: &Conn) {
    conn.close();
    let ids: Vec<(u64, SocketAddr)> = lock(&shared.pending)
        .iter()
        .filter(|(_, w)| w.conn == conn.id)
        .map(|(&id, w)| (id, w.peer))
        .collect();
    for (id, peer) in ids {
        let detail = std::io::Error::other("the shared-memory peer closed its connection");
        finish(
            shared,
            id,
            Err(Error::ConnectionClosed {
                peer,
                detail: Some(detail),
            }),
        );
    }
    let pidfd = lock(&conn.pidfd).take();
    let alive = pidfd.as_ref().is_some_and(|fd| {
        matches!(
            crate::sys::poll_one(fd.as_raw_fd(), libc::POLLIN, Duration::ZERO),
            Ok(0)
        )
    });
    // Without a pidfd, a reused pid reads as alive: memory is kept rather than risk changing
    // what a live reader sees.
    let alive = alive || (pidfd.is_none() && crate::sys::process_exists(conn.peer.pid));
    shared.lending.disconnected(conn.peer.pid, pidfd, alive);
    lock(&conn.mapped).clear();
}
