//! The driver thread: it reads every connection's queue while messages come, and otherwise
//! sleeps in one epoll over the wake eventfd, the listener, connections waiting for their
//! hello, each connection's socket (where the peer's `Bell`s come), and the pidfds of holders that left with
//! memory of ours. It accepts and greets, moves records, sends releases, tells peers about
//! retired segments, runs the sessions' deadlines, and does the housekeeping (idle segments,
//! late hellos). Connections a caller reads itself (waiting for its reply) are left to it.
//!
//! It spins for a fixed window after the last message (`spin.rs`), then marks every queue
//! "may sleep" — from then on a peer's producer rings (a `Bell` on the socket) — looks once more, and
//! sleeps. Accept errors (a full descriptor table) pause the listener instead of spinning on
//! it.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorwire_proto::shm::{CloseReason, Credentials, Greeting as Admission, Role};
use tensorwire_proto::stats;

use super::Transport;
use super::caller::FULL_LOOK_EVERY;
use super::conn::Conn;
use super::greeting::{Greeting, greet};
use super::inbound;
use super::spin::Spin;
use crate::shm::socket;
use crate::sync::lock;

/// The housekeeping period.
const TICK: Duration = Duration::from_millis(500);
/// While spinning, how often the epoll (sockets, new connections) is looked at.
const POLL_EVERY: Duration = Duration::from_micros(50);
/// While spinning, how often deadlines are looked at.
const TIMERS_EVERY: Duration = Duration::from_millis(1);
/// How long the listener pauses after an accept error (a full descriptor table).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Events taken per wait.
const MAX_EVENTS: usize = 64;

/// What an epoll token names (its top byte), and the id in the rest.
const WAKE: u64 = 0;
const LISTENER: u64 = 1;
const GREETING: u64 = 2;
const SOCKET: u64 = 3;
const ORPHAN: u64 = 4;
const ID_BITS: u32 = 56;

fn token(kind: u64, id: u64) -> u64 {
    (kind << ID_BITS) | (id & ((1 << ID_BITS) - 1))
}

struct Driver {
    epoll: OwnedFd,
    listener: RawFd,
    /// When the paused listener is watched again.
    listener_paused_until: Option<Instant>,
    /// Whether new connections are taken (not once the node drains or stops).
    accepting: bool,
    conns: HashMap<u64, Arc<Conn>>,
    /// Accepted connections waiting for their hello, oldest first.
    greetings: BTreeMap<u64, Greeting>,
    next_greeting: u64,
    /// Orphaned holders' pidfds registered, by pid, and the lending's version they were read at.
    orphans: HashMap<u32, RawFd>,
    orphans_version: Option<u64>,
    /// Looks at the connections so far (one in `FULL_LOOK_EVERY` takes each one's lock).
    looks: u32,
    /// The next look is a full one (the first, and the first after a sleep).
    full_next: bool,
    events: Vec<libc::epoll_event>,
}

/// The driver thread.
pub(super) fn run(t: &Arc<Transport>, listener: &OwnedFd) {
    super::wake::mark_driver_thread();
    let mut d = match Driver::new(t, listener.as_raw_fd()) {
        Ok(d) => d,
        Err(e) => {
            tracing::error!(error = %e, "the shared-memory driver cannot set up its epoll; it stops");
            return;
        }
    };
    let mut spin = Spin::new(t.config.spin);
    let now = Instant::now();
    let (mut next_tick, mut next_poll, mut next_timers) = (now + TICK, now, now);
    while !t.is_stopping() {
        // Most looks only look for input; one in `FULL_LOOK_EVERY`, and the first after a
        // sleep, also takes new connections and every connection's lock.
        d.looks = d.looks.wrapping_add(1);
        let full = std::mem::take(&mut d.full_next) || d.looks % FULL_LOOK_EVERY == 0;
        if full {
            d.join_new(t);
            d.sync_orphans(t);
        }
        let mut work = d.pump_all(t, full);
        let now = Instant::now();
        if now >= next_poll {
            work += d.poll(t, Duration::ZERO);
            next_poll = now + POLL_EVERY;
        }
        if now >= next_timers {
            d.timers(t, now);
            next_timers = now + TIMERS_EVERY;
        }
        for segment in t.segments.take_retired() {
            for conn in d.conns.values() {
                conn.retire(t, segment);
            }
        }
        if now >= next_tick {
            d.tick(t, now);
            next_tick = now + TICK;
        }
        if t.is_draining() {
            d.stop_accepting(t);
        }
        if work > 0 {
            record_spin(spin.worked(now));
            continue;
        }
        let (again, spent) = spin.idle(now);
        record_spin(spent);
        if again {
            spin.pause();
            continue;
        }
        // The window starts again after a wake-up only if it brought work (a bell's messages
        // are pumped inside the sleep): an idle node spun a whole window after every tick of
        // its timer when every wake-up counted.
        if d.sleep(t, next_tick) > 0 {
            spin.worked(Instant::now());
        }
        d.full_next = true;
        next_poll = Instant::now();
    }
    d.stop(t);
}

impl Driver {
    fn new(t: &Transport, listener: RawFd) -> std::io::Result<Self> {
        let epoll = crate::sys::epoll()?;
        let readable = libc::EPOLLIN as u32;
        crate::sys::epoll_ctl(
            epoll.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            t.wake.raw(),
            readable,
            token(WAKE, 0),
        )?;
        crate::sys::epoll_ctl(
            epoll.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            listener,
            readable,
            token(LISTENER, 0),
        )?;
        Ok(Self {
            epoll,
            listener,
            listener_paused_until: None,
            accepting: true,
            conns: HashMap::new(),
            greetings: BTreeMap::new(),
            next_greeting: 1,
            orphans: HashMap::new(),
            orphans_version: None,
            looks: 0,
            full_next: true,
            // SAFETY: epoll_event is plain old data; all-zero is a valid value.
            events: vec![unsafe { std::mem::zeroed::<libc::epoll_event>() }; MAX_EVENTS],
        })
    }

    /// Reads and flushes every connection that has something, except those a caller reads:
    /// how many messages were read.
    fn pump_all(&mut self, t: &Arc<Transport>, full: bool) -> usize {
        let mut read = 0;
        let mut closed = Vec::new();
        for conn in self.conns.values() {
            // The lock is taken to look only when input came, or now and then.
            if !conn.has_callers() && (full || conn.input_published()) && conn.has_work() {
                read += pump(t, conn).max(1);
            }
            if conn.is_closed() {
                closed.push(conn.id);
            }
        }
        for id in closed {
            self.remove(t, id);
        }
        read
    }

    /// Waits up to `timeout` for events and handles them: how many.
    fn poll(&mut self, t: &Arc<Transport>, timeout: Duration) -> usize {
        let ready = match crate::sys::epoll_wait(self.epoll.as_raw_fd(), &mut self.events, timeout)
        {
            Ok(ready) => ready,
            Err(e) => {
                tracing::warn!(error = %e, "the shared-memory driver's epoll_wait failed");
                return 0;
            }
        };
        let tokens: Vec<(u64, u32)> = self.events[..ready]
            .iter()
            .map(|e| (e.u64, e.events))
            .collect();
        let mut handled = 0;
        for (token, _flags) in tokens {
            let (kind, id) = (token >> ID_BITS, token & ((1 << ID_BITS) - 1));
            match kind {
                WAKE => {}
                LISTENER => self.accept(t),
                GREETING => self.greet(t, id),
                SOCKET => {
                    if let Some(conn) = self.conns.get(&id).cloned() {
                        // A `Bell` (or a `Map`): the queue first, so what rang is served before
                        // the bell is read (a record naming a segment whose `Map` waits on the
                        // socket has the session read it first). A caller reading the
                        // connection takes the records itself.
                        if !conn.has_callers() {
                            handled += pump(t, &conn);
                        }
                        for delivered in conn.drain_socket(t) {
                            inbound::deliver(t, &conn, delivered);
                        }
                        handled += 1;
                    }
                }
                ORPHAN => {
                    let pid = u32::try_from(id).unwrap_or(0);
                    self.forget_orphan(pid);
                    t.lending.exited(pid);
                }
                _ => {}
            }
        }
        handled
    }

    /// Marks every queue "may sleep", looks once more, and sleeps until an event or the next
    /// deadline; how many events it handled on waking (0: a timer, or nothing to do).
    fn sleep(&mut self, t: &Arc<Transport>, next_tick: Instant) -> usize {
        t.wake.sleeping();
        let mut input = !lock(&t.joining).is_empty();
        let mut wake_at = next_tick;
        for conn in self.conns.values() {
            if let Some(at) = conn.next_timeout() {
                wake_at = wake_at.min(at);
            }
            if !conn.has_callers() {
                input |= conn.may_sleep() || conn.has_work();
            }
        }
        if let Some(at) = self.listener_paused_until {
            wake_at = wake_at.min(at);
        }
        let mut handled = 0;
        if !input && !t.is_stopping() {
            t.wake.plan(Some(wake_at));
            let timeout = wake_at.saturating_duration_since(Instant::now());
            handled = self.poll(t, timeout);
        }
        t.wake.plan(None);
        t.wake.awake();
        for conn in self.conns.values() {
            if !conn.has_callers() {
                conn.awake();
            }
        }
        handled
    }

    /// Deadlines and stalls of every connection.
    fn timers(&mut self, t: &Arc<Transport>, now: Instant) {
        for conn in self.conns.values() {
            if conn.next_timeout().is_some_and(|at| at <= now) {
                conn.tick(t, now);
            }
        }
        if self.accepting && self.listener_paused_until.is_some_and(|at| at <= now) {
            self.listener_paused_until = None;
            let _ = crate::sys::epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                self.listener,
                libc::EPOLLIN as u32,
                token(LISTENER, 0),
            );
        }
    }

    /// Housekeeping: idle segments retired, late hellos dropped.
    fn tick(&mut self, t: &Arc<Transport>, now: Instant) {
        t.segments.trim(now);
        let late = t.config.hello_timeout;
        let expired: Vec<u64> = self
            .greetings
            .iter()
            .filter(|(_, g)| now.saturating_duration_since(g.since) >= late)
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            self.drop_greeting(t, id);
        }
    }

    /// Takes over the connections the probes made.
    fn join_new(&mut self, t: &Arc<Transport>) {
        let joining = std::mem::take(&mut *lock(&t.joining));
        for conn in joining {
            self.add(t, conn);
        }
    }

    fn add(&mut self, t: &Arc<Transport>, conn: Arc<Conn>) {
        let epoll = self.epoll.as_raw_fd();
        let watch = libc::EPOLLIN as u32 | libc::EPOLLRDHUP as u32;
        let added = crate::sys::epoll_ctl(
            epoll,
            libc::EPOLL_CTL_ADD,
            conn.socket(),
            watch,
            token(SOCKET, conn.id),
        );
        let id = conn.id;
        t.track(&conn);
        self.conns.insert(id, conn);
        if let Err(e) = added {
            tracing::warn!(error = %e, "a shared-memory connection could not be watched");
            if let Some(conn) = self.conns.get(&id).cloned() {
                conn.close(t, CloseReason::Local(format!("epoll: {e}")));
            }
            self.remove(t, id);
        }
    }

    /// Forgets a closed connection: what waited on it failed already; what its peer holds of
    /// ours stays until that process exits (it may still have views), unless it is gone.
    fn remove(&mut self, t: &Arc<Transport>, id: u64) {
        let Some(conn) = self.conns.remove(&id) else {
            return;
        };
        if !conn.is_closed() {
            conn.close(t, CloseReason::Shutdown);
        }
        let epoll = self.epoll.as_raw_fd();
        let _ = crate::sys::epoll_ctl(epoll, libc::EPOLL_CTL_DEL, conn.socket(), 0, 0);
        if conn.role() == Role::Client {
            t.peers.forget(&conn);
        }
        let pid = conn.peer.pid;
        // The connection's lock is taken before the book's, never inside it (the order the
        // mapping code uses); each mapping gives its bound back with its last view.
        conn.unmap_all();
        if conn.role() == Role::Server {
            lock(&t.book).connection_closed(pid);
        }
        let pidfd = conn.take_pidfd();
        let alive = pidfd.as_ref().is_some_and(|fd| {
            matches!(
                crate::sys::poll_one(fd.as_raw_fd(), libc::POLLIN, Duration::ZERO),
                Ok(0)
            )
        });
        // Without a pidfd, a reused pid reads as alive: memory is kept rather than risk
        // changing what a live reader sees.
        let alive = alive || (pidfd.is_none() && crate::sys::process_exists(pid));
        t.lending.disconnected(pid, pidfd, alive);
    }

    /// Accepts every waiting connection from this user, within the hello bounds; an accept
    /// error (no descriptors left) pauses the listener for a while.
    fn accept(&mut self, t: &Arc<Transport>) {
        loop {
            let fd = match socket::accept(self.listener) {
                Ok(Some(fd)) => fd,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "shared-memory accept failed; pausing the listener");
                    self.pause_listener();
                    return;
                }
            };
            let Ok(cred) = socket::peer_cred(fd.as_raw_fd()) else {
                continue;
            };
            if cred.uid != t.identity.uid {
                tracing::debug!(
                    uid = cred.uid,
                    pid = cred.pid,
                    "shared-memory connection of another user refused"
                );
                continue;
            }
            let admission = lock(&t.book).greeting(cred.pid);
            match admission {
                Admission::Refused(why) => {
                    stats::global().record_shm_peer_refused();
                    tracing::debug!(%why, "shared-memory connection refused");
                    continue;
                }
                Admission::AdmittedDropOldest => {
                    stats::global().record_shm_peer_refused();
                    if let Some(&oldest) = self.greetings.keys().next() {
                        self.drop_greeting(t, oldest);
                    }
                }
                Admission::Admitted => {}
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
            let cred = Credentials {
                pid: cred.pid,
                uid: cred.uid,
            };
            if added.is_ok() {
                let since = Instant::now();
                self.greetings.insert(id, Greeting { fd, cred, since });
            } else {
                lock(&t.book).greeting_ended(cred.pid);
            }
        }
    }

    fn pause_listener(&mut self) {
        let _ = crate::sys::epoll_ctl(
            self.epoll.as_raw_fd(),
            libc::EPOLL_CTL_DEL,
            self.listener,
            0,
            0,
        );
        self.listener_paused_until = Some(Instant::now() + ACCEPT_BACKOFF);
    }

    fn greet(&mut self, t: &Arc<Transport>, id: u64) {
        let Some(greeting) = self.take_greeting(t, id) else {
            return;
        };
        let pid = greeting.cred.pid;
        match greet(t, greeting) {
            Ok(conn) => self.add(t, conn),
            Err(why) => tracing::debug!(pid, %why, "shared-memory hello refused"),
        }
    }

    fn drop_greeting(&mut self, t: &Transport, id: u64) {
        drop(self.take_greeting(t, id));
    }

    fn take_greeting(&mut self, t: &Transport, id: u64) -> Option<Greeting> {
        let greeting = self.greetings.remove(&id)?;
        let _ = crate::sys::epoll_ctl(
            self.epoll.as_raw_fd(),
            libc::EPOLL_CTL_DEL,
            greeting.fd.as_raw_fd(),
            0,
            0,
        );
        lock(&t.book).greeting_ended(greeting.cred.pid);
        Some(greeting)
    }

    /// Watches the pidfds of holders that left with memory of ours, as the lending lists them.
    fn sync_orphans(&mut self, t: &Transport) {
        let version = t.lending.orphans_version();
        if self.orphans_version == Some(version) {
            return;
        }
        self.orphans_version = Some(version);
        let now: HashMap<u32, RawFd> = t.lending.orphan_fds().into_iter().collect();
        for (pid, fd) in std::mem::take(&mut self.orphans) {
            if now.get(&pid) == Some(&fd) {
                self.orphans.insert(pid, fd);
            } else {
                let epoll = self.epoll.as_raw_fd();
                let _ = crate::sys::epoll_ctl(epoll, libc::EPOLL_CTL_DEL, fd, 0, 0);
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

    /// The node stops: no new connections; what is already queued goes out (one last turn),
    /// then every connection closes and whatever still waits on one fails with
    /// [`Error::Shutdown`](tensorwire_proto::transport::Error::Shutdown). A graceful close
    /// finishes what is in flight before this (`ShmTransport::drain` / `drained`).
    fn stop(&mut self, t: &Arc<Transport>) {
        self.stop_accepting(t);
        self.pump_all(t, true);
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            self.remove(t, id);
        }
    }

    /// No new connections: the listener leaves the epoll and waiting hellos are dropped.
    fn stop_accepting(&mut self, t: &Arc<Transport>) {
        if self.accepting {
            self.accepting = false;
            let epoll = self.epoll.as_raw_fd();
            let _ = crate::sys::epoll_ctl(epoll, libc::EPOLL_CTL_DEL, self.listener, 0, 0);
            self.listener_paused_until = None;
        }
        let ids: Vec<u64> = self.greetings.keys().copied().collect();
        for id in ids {
            self.drop_greeting(t, id);
        }
    }
}

/// Reads one connection and delivers the requests found: how many messages it read.
fn pump(t: &Arc<Transport>, conn: &Arc<Conn>) -> usize {
    let (read, deliver) = conn.pump(t);
    for delivered in deliver {
        inbound::deliver(t, conn, delivered);
    }
    read
}

fn record_spin(spent: Duration) {
    if !spent.is_zero() {
        stats::global().record_shm_spin(u64::try_from(spent.as_micros()).unwrap_or(u64::MAX));
    }
}
