//! The poll thread: one epoll over the wake eventfd, the listener, connections waiting for
//! their hello, verified connections, and the pidfds of holders that left with memory of ours.
//! It accepts and greets, receives, flushes outboxes when the peer has room, sends batched
//! releases, tells peers about retired segments, and does the housekeeping (idle segments,
//! stalled peers, late hellos).
//!
//! After activity it polls without sleeping for a while — longer when messages come at short,
//! regular intervals (up to ten times `busy_poll`) — so a conversation does not pay a sleeping
//! thread's wake-up per message. A caller receiving its own reply takes the connection out of
//! the epoll meanwhile (`Conn::caller_waits`), so this thread is not woken for datagrams it
//! would only find taken.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tensorwire_proto::shm::{Control, MAX_DATAGRAM, decode};
use tensorwire_proto::transport::Error;

use crate::shm::socket::{self, PeerCred};
use crate::shm::transport::conn::Conn;
use crate::shm::transport::service::{finish, mark_poll_thread, receive_ready, send_releases};
use crate::shm::transport::{Shared, lock};

/// Accepted connections waiting for their hello at most.
const MAX_GREETING: usize = 256;
/// The housekeeping period.
const TICK: Duration = Duration::from_millis(500);
/// Events taken per wait.
const MAX_EVENTS: usize = 64;

/// What an epoll token names (its top byte), and the id in the rest.
const WAKE: u64 = 0;
const LISTENER: u64 = 1;
const GREETING: u64 = 2;
const CONN: u64 = 3;
const ORPHAN: u64 = 4;
const ID_BITS: u32 = 56;

fn token(kind: u64, id: u64) -> u64 {
    (kind << ID_BITS) | (id & ((1 << ID_BITS) - 1))
}

/// An accepted connection before its hello.
struct Greeting {
    fd: OwnedFd,
    cred: PeerCred,
    since: Instant,
}

struct Poller {
    epoll: Arc<OwnedFd>,
    conns: HashMap<u64, Arc<Conn>>,
    greeting: HashMap<u64, Greeting>,
    next_greeting: u64,
    /// Orphaned holders' pidfds registered, by pid (the descriptors belong to the lending),
    /// and the lending's version they were read at.
    orphans: HashMap<u32, RawFd>,
    orphans_version: Option<u64>,
    buf: Vec<u8>,
    /// When the last event came, and the typical gap between events (an average).
    last_event: Instant,
    gap: Duration,
}

/// The poll thread.
pub(crate) fn run(shared: &Arc<Shared>, listener: &OwnedFd) {
    mark_poll_thread();
    let epoll = Arc::clone(&shared.epoll);
    let readable = libc::EPOLLIN as u32;
    let registered = crate::sys::epoll_ctl(
        epoll.as_raw_fd(),
        libc::EPOLL_CTL_ADD,
        shared.wake.as_raw_fd(),
        readable,
        token(WAKE, 0),
    )
    .and_then(|()| {
        crate::sys::epoll_ctl(
            epoll.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            listener.as_raw_fd(),
            readable,
            token(LISTENER, 0),
        )
    });
    if let Err(e) = registered {
        tracing::error!(error = %e, "the shared-memory poll thread cannot set up its epoll; it stops");
        return;
    }
    let mut poller = Poller {
        epoll,
        conns: HashMap::new(),
        greeting: HashMap::new(),
        next_greeting: 1,
        orphans: HashMap::new(),
        orphans_version: None,
        buf: vec![0u8; MAX_DATAGRAM],
        last_event: Instant::now(),
        gap: Duration::from_secs(1),
    };
    // SAFETY: epoll_event is plain old data; all-zero is a valid value.
    let mut events = vec![unsafe { std::mem::zeroed::<libc::epoll_event>() }; MAX_EVENTS];
    let mut next_tick = Instant::now() + TICK;
    while !shared.stop.load(Ordering::Acquire) {
        for conn in std::mem::take(&mut *lock(&shared.joining)) {
            poller.join(shared, conn);
        }
        poller.sync_orphans(shared);
        let now = Instant::now();
        let timeout = if now.saturating_duration_since(poller.last_event) < poller.spin(shared) {
            Duration::ZERO
        } else {
            next_tick.saturating_duration_since(now)
        };
        let ready = match crate::sys::epoll_wait(poller.epoll.as_raw_fd(), &mut events, timeout) {
            Ok(ready) => ready,
            Err(e) => {
                tracing::error!(error = %e, "the shared-memory poll thread cannot wait; it stops");
                break;
            }
        };
        if ready > 0 {
            poller.note_event();
        }
        for event in &events[..ready] {
            let (kind, id) = (event.u64 >> ID_BITS, event.u64 & ((1 << ID_BITS) - 1));
            let flags = event.events;
            match kind {
                WAKE => crate::sys::eventfd_drain(shared.wake.as_raw_fd()),
                LISTENER => poller.accept(shared, listener.as_raw_fd()),
                GREETING => poller.greet(shared, id),
                CONN => poller.serve(shared, id, flags),
                ORPHAN => {
                    let pid = u32::try_from(id).unwrap_or(0);
                    poller.forget_orphan(pid);
                    shared.lending.exited(pid);
                }
                _ => {}
            }
        }
        send_releases(shared);
        for segment in shared.segments.take_retired() {
            for conn in poller.conns.values() {
                conn.retire(segment);
            }
        }
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
    /// How long to keep polling after the last event: `busy_poll`, stretched towards ten
    /// times that while events keep coming at short gaps.
    fn spin(&self, shared: &Shared) -> Duration {
        let budget = shared.config.busy_poll;
        if budget.is_zero() {
            return Duration::ZERO;
        }
        let max = budget * 10;
        if self.gap <= max {
            (self.gap * 3 / 2).clamp(budget, max)
        } else {
            budget
        }
    }

    fn note_event(&mut self) {
        let now = Instant::now();
        let gap = now.saturating_duration_since(self.last_event);
        // A moving average over the last few gaps (weight 1/4 for the newest).
        self.gap = (self.gap * 3 + gap) / 4;
        self.last_event = now;
    }

    fn join(&mut self, shared: &Shared, conn: Arc<Conn>) {
        match conn.join(&self.epoll, token(CONN, conn.id)) {
            Ok(()) => {
                self.conns.insert(conn.id, conn);
            }
            Err(e) => {
                tracing::warn!(error = %e, "a shared-memory connection could not be watched");
                closed(shared, &conn);
            }
        }
    }

    /// Watches the pidfds of holders that left with memory of ours, as the lending lists them.
    fn sync_orphans(&mut self, shared: &Shared) {
        let version = shared.lending.orphans_version();
        if self.orphans_version == Some(version) {
            return;
        }
        self.orphans_version = Some(version);
        let now: HashMap<u32, RawFd> = shared.lending.orphan_fds().into_iter().collect();
        if now.len() == self.orphans.len()
            && now.iter().all(|(p, fd)| self.orphans.get(p) == Some(fd))
        {
            return;
        }
        for (pid, fd) in std::mem::take(&mut self.orphans) {
            if now.get(&pid) != Some(&fd) {
                let _ =
                    crate::sys::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, 0, 0);
            } else {
                self.orphans.insert(pid, fd);
            }
        }
        for (pid, fd) in now {
            if self.orphans.contains_key(&pid) {
                continue;
            }
            let added = crate::sys::epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd,
                libc::EPOLLIN as u32,
                token(ORPHAN, u64::from(pid)),
            );
            if added.is_ok() {
                self.orphans.insert(pid, fd);
            }
        }
    }

    fn forget_orphan(&mut self, pid: u32) {
        if let Some(fd) = self.orphans.remove(&pid) {
            let _ = crate::sys::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, 0, 0);
        }
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
            let id = self.next_greeting;
            self.next_greeting += 1;
            let added = crate::sys::epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd.as_raw_fd(),
                libc::EPOLLIN as u32,
                token(GREETING, id),
            );
            if added.is_ok() {
                self.greeting.insert(
                    id,
                    Greeting {
                        fd,
                        cred,
                        since: Instant::now(),
                    },
                );
            }
        }
    }

    fn greet(&mut self, shared: &Shared, id: u64) {
        let Some(greeting) = self.greeting.remove(&id) else {
            return;
        };
        let _ = crate::sys::epoll_ctl(
            self.epoll.as_raw_fd(),
            libc::EPOLL_CTL_DEL,
            greeting.fd.as_raw_fd(),
            0,
            0,
        );
        if let Some(conn) = greet(shared, greeting, &mut self.buf) {
            self.join(shared, conn);
        }
    }

    /// A verified connection has events.
    fn serve(&mut self, shared: &Arc<Shared>, id: u64, flags: u32) {
        let Some(conn) = self.conns.get(&id).cloned() else {
            return;
        };
        let mut keep = true;
        if flags & libc::EPOLLOUT as u32 != 0 && conn.flush().is_err() {
            keep = false;
        }
        let incoming = (libc::EPOLLIN | libc::EPOLLHUP | libc::EPOLLERR | libc::EPOLLRDHUP) as u32;
        if keep && flags & incoming != 0 {
            keep = receive_ready(shared, &conn, &mut self.buf);
        }
        if !keep {
            self.conns.remove(&id);
            closed(shared, &conn);
        }
    }

    /// Housekeeping: idle segments retired, stalled peers and late hellos dropped.
    fn tick(&mut self, shared: &Arc<Shared>, now: Instant) {
        shared.segments.trim(now);
        let late = shared.config.hello_timeout;
        let expired: Vec<u64> = self
            .greeting
            .iter()
            .filter(|(_, g)| now.saturating_duration_since(g.since) >= late)
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            if let Some(greeting) = self.greeting.remove(&id) {
                let fd = greeting.fd.as_raw_fd();
                let _ =
                    crate::sys::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, 0, 0);
            }
        }
        let stalled: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.is_stalled(now) || c.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in stalled {
            if let Some(conn) = self.conns.remove(&id) {
                tracing::debug!(node = %conn.node, "shared-memory peer stalled or closed");
                closed(shared, &conn);
            }
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

/// A connection closed: what waited on it fails; what its peer holds of ours stays until that
/// process exits (it may still have views), unless it is gone already.
pub(crate) fn closed(shared: &Shared, conn: &Conn) {
    conn.leave();
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
