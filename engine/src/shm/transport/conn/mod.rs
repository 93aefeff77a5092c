//! One connection after its hello: the socket (`Map` datagrams with descriptors, `Bell`s,
//! hang-up), the two queues, and behind one lock its session, the requests waiting for
//! their answers, the peer's segments mapped here and ours waiting to be announced.
//!
//! Whoever touches the session — the driver reading the queue, a caller sending or waiting
//! for its reply, a handler answering — does it through [`Conn::with`] or [`Conn::pump`]:
//! under the lock the session's events are turned into work and its transmits moved into the
//! queue; outside it the peer is rung, requests delivered and callers completed, so no user
//! code ever runs under the lock.

mod events;
mod io;

pub(super) use io::take_rang;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tensorwire_proto::TensorMessage;
use tensorwire_proto::fast_hash::FastHash;

use tensorwire_proto::shm::{CloseReason, ConnectionConfig, Credentials, Role, ShmConnection};
use tensorwire_proto::transport::{Answer, Completion, Deadline, Error, RequestKind};

use super::Transport;
use super::packing::{Located, within};
use super::releases::Releases;
use super::views::Mapped;
use crate::shm::queue::{OwnQueue, PeerQueue};
use crate::shm::segments::Segment;
use crate::sync::lock;

/// What a probe or a greeting hands over once both hellos are checked.
pub(super) struct Setup {
    pub(super) socket: OwnedFd,
    pub(super) peer: Credentials,
    /// The peer node's TCP address, as it said.
    pub(super) node: String,
    pub(super) role: Role,
    pub(super) queue: OwnQueue,
    pub(super) peer_queue: PeerQueue,
}

/// A connection (either direction), after its hello.
pub(super) struct Conn {
    pub(super) id: u64,
    socket: OwnedFd,
    /// The peer process, as the kernel recorded it.
    pub(super) peer: Credentials,
    /// The peer node's TCP address, as it said.
    pub(super) node: String,
    /// The same, parsed once (requests carry it as their peer).
    pub(super) node_addr: Option<SocketAddr>,
    role: Role,
    peer_queue: PeerQueue,
    state: Mutex<State>,
    /// Leases of the peer's whose last view dropped here, to release.
    releases: Arc<Releases>,
    /// Requests unpacked while sending (the next reader delivers them).
    backlog: Mutex<Vec<Delivered>>,
    /// Whether `backlog` may hold any (a pump looks without its lock).
    backlogged: AtomicBool,
    /// Whether any of the peer's segments is mapped here (the look for bytes of the peer's
    /// own memory in a reply needs no lock when none is).
    any_mapped: AtomicBool,
    /// Callers reading this connection's queue themselves now (the driver leaves it alone).
    callers: AtomicUsize,
    /// How far the last pump read the peer's ring: what a look without the lock compares the
    /// peer's published head with ([`Conn::input_published`]).
    read_to: AtomicU64,
    closed: AtomicBool,
    /// A descriptor of the peer process (its exit is how held memory comes back).
    pidfd: Mutex<Option<OwnedFd>>,
}

/// What the lock guards.
pub(super) struct State {
    pub(super) session: ShmConnection,
    queue: OwnQueue,
    /// Requests sent here, by id, and who waits for each.
    waiters: HashMap<u64, Waiter, FastHash>,
    /// The peer's segments mapped here, by its id for them.
    pub(super) mapped: HashMap<u64, Arc<Mapped>>,
    /// Our segments a send may announce, kept open until its `Map` is sent; emptied whenever
    /// nothing waits to be sent (`Conn::flush`).
    attach: HashMap<u64, Arc<Segment>, FastHash>,
    /// Whether our producer told the peer it waits for room.
    blocked: bool,
    /// Whether we told the peer to ring once it consumes: reading its requests is paused
    /// until it reads its replies (this side's `blocked` word serves both).
    awaits_reading: bool,
}

/// A request the session let through, unpacked, for the node.
pub(super) struct Delivered {
    pub(super) id: u64,
    pub(super) kind: RequestKind,
    pub(super) path: String,
    pub(super) message: TensorMessage,
}

/// Who waits for the answer to one request.
pub(super) struct Waiter {
    pub(super) completion: Box<dyn Completion>,
    pub(super) peer: SocketAddr,
    pub(super) kind: RequestKind,
    pub(super) deadline: Deadline,
}

/// Work found under the lock, done after it.
#[derive(Default)]
struct After {
    ring_peer: bool,
    deliver: Vec<Delivered>,
    complete: Vec<(Waiter, Result<Answer, Error>)>,
    released: Vec<u64>,
    closed: bool,
}

impl Conn {
    /// The connection a finished hello made: its session, and a pidfd of the peer to learn
    /// when it exits (none on kernels without pidfds).
    pub(super) fn new(setup: Setup, t: &Transport) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let role = setup.role;
        let pidfd = crate::shm::socket::peer_pidfd(setup.socket.as_raw_fd(), setup.peer.pid).ok();
        let session = ShmConnection::new(ConnectionConfig::new(role, t.limits));
        Self {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            socket: setup.socket,
            peer: setup.peer,
            node_addr: setup.node.parse().ok(),
            node: setup.node,
            role,
            peer_queue: setup.peer_queue,
            state: Mutex::new(State {
                session,
                queue: setup.queue,
                waiters: HashMap::default(),
                mapped: HashMap::new(),
                attach: HashMap::default(),
                blocked: false,
                awaits_reading: false,
            }),
            releases: Arc::new(Releases::new(Arc::clone(&t.wake))),
            backlog: Mutex::new(Vec::new()),
            backlogged: AtomicBool::new(false),
            any_mapped: AtomicBool::new(false),
            callers: AtomicUsize::new(0),
            read_to: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            pidfd: Mutex::new(pidfd),
        }
    }

    /// Runs `f` on the session (to send, answer or cancel), then moves what it queued.
    pub(super) fn with<R>(
        self: &Arc<Self>,
        t: &Arc<Transport>,
        f: impl FnOnce(&mut State) -> R,
    ) -> R {
        let mut after = After::default();
        let result = {
            let mut st = lock(&self.state);
            self.take_releases(&mut st);
            let result = f(&mut st);
            self.settle(t, &mut st, &mut after);
            result
        };
        let deliver = self.finish(t, after);
        if !deliver.is_empty() {
            lock(&self.backlog).extend(deliver);
            self.backlogged.store(true, Ordering::Release);
        }
        result
    }

    /// Reads what the peer queued and sends what waits, if nobody else is at it: how many
    /// messages it read, and the requests to deliver (the caller hands them to the node).
    pub(super) fn pump(self: &Arc<Self>, t: &Arc<Transport>) -> (usize, Vec<Delivered>) {
        let mut st = match self.state.try_lock() {
            Ok(st) => st,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return (0, Vec::new()),
        };
        let mut after = After::default();
        self.take_releases(&mut st);
        let mut read = 0;
        for _ in 0..2 {
            self.look_at_reading(&mut st);
            while st.session.wants_records() {
                let State { queue, session, .. } = &mut *st;
                // Each record in memory of its own: what it carries inline is sliced, not
                // copied.
                let mut record = Vec::new();
                match queue.pop(&self.peer_queue, &mut record) {
                    Ok(Some(_)) => {
                        session.handle_record(bytes::Bytes::from(record));
                        crate::phase_marks::mark(crate::phase_marks::Phase::Decoded);
                        read += 1;
                    }
                    Ok(None) => break,
                    Err(e) => session.close(CloseReason::Queue(e)),
                }
                self.settle(t, &mut st, &mut after);
            }
            if !self.await_reading(&mut st) {
                break;
            }
        }
        if st.queue.commit(&self.peer_queue) {
            after.ring_peer = true;
        }
        self.read_to.store(st.queue.tail(), Ordering::Release);
        self.settle(t, &mut st, &mut after);
        drop(st);
        let mut deliver = if self.backlogged.swap(false, Ordering::AcqRel) {
            std::mem::take(&mut *lock(&self.backlog))
        } else {
            Vec::new()
        };
        deliver.extend(self.finish(t, after));
        if read > 0 {
            crate::phase_marks::mark(crate::phase_marks::Phase::PumpEnd);
        }
        (read, deliver)
    }

    /// Without the lock, cheap enough for every look of a spin: whether the peer published
    /// records past what the last pump read, or releases wait to be sent. `false` does not
    /// mean there is nothing to do (a send may wait for room): a spinning thread still makes a
    /// full look ([`Conn::has_work`] or a pump) now and then.
    pub(super) fn input_published(&self) -> bool {
        self.releases.any() || self.peer_queue.published() != self.read_to.load(Ordering::Acquire)
    }

    /// Whether releases wait, the peer queued something to read (not while reading is paused
    /// for its unread replies, unless it read some since), or something waits to go into our
    /// queue (cheap: no lock unless the queue must be looked at).
    pub(super) fn has_work(&self) -> bool {
        self.releases.any()
            || self.state.try_lock().is_ok_and(|st| {
                let input = st.queue.has_input(&self.peer_queue);
                self.readable(&st, input) || st.session.poll_transmit().is_some()
            })
    }

    /// Whether there are records to read, given whether the peer queued input: not while
    /// reading is paused for its unread replies and it has read none since (the side then
    /// waits for the peer's `Bell` instead of spinning).
    fn readable(&self, st: &State, input: bool) -> bool {
        if st.session.paused_for_unread() {
            st.session.read_by(st.queue.consumed(&self.peer_queue))
        } else {
            input
        }
    }

    /// Counts the replies the peer read since the last look (by its tail), when there are
    /// some or reading is paused for them.
    fn look_at_reading(&self, st: &mut State) {
        if !st.session.reads_pending() {
            return;
        }
        let tail = st.queue.consumed(&self.peer_queue);
        if st.session.read_by(tail) || st.session.paused_for_unread() {
            st.session.handle_consumed(tail, Instant::now());
        }
    }

    /// If reading is paused for the peer's unread replies, asks the peer to ring once it
    /// consumes and looks once more (`true`: it read meanwhile, read again); if not, stops
    /// asking.
    fn await_reading(&self, st: &mut State) -> bool {
        if !st.session.paused_for_unread() {
            if std::mem::take(&mut st.awaits_reading) && !st.blocked {
                st.queue.unblocked();
            }
            return false;
        }
        if st.awaits_reading {
            return false;
        }
        st.awaits_reading = true;
        let tail = st.queue.await_consumption(&self.peer_queue);
        if !st.session.read_by(tail) {
            return false;
        }
        st.session.handle_consumed(tail, Instant::now());
        st.session.wants_records()
    }

    /// Receives the datagrams waiting on the socket up to the first `Bell` (the driver saw it
    /// readable; what is left keeps it readable): the requests to deliver.
    pub(super) fn drain_socket(self: &Arc<Self>, t: &Arc<Transport>) -> Vec<Delivered> {
        let mut after = After::default();
        {
            let mut st = lock(&self.state);
            self.drain(t, &mut st, &mut after, true);
            self.settle(t, &mut st, &mut after);
        }
        self.finish(t, after)
    }

    /// A caller starts reading this connection itself (the driver leaves it alone, and the
    /// peer need not ring).
    pub(super) fn caller_reads(&self) {
        self.callers.fetch_add(1, Ordering::SeqCst);
        lock(&self.state).queue.awake();
    }

    /// The caller stopped reading it. If the driver went to sleep meanwhile it left this
    /// connection to the caller: it is handed back (`true`: something arrived, wake the
    /// driver) — the peer is told to ring again, unless nothing it may still send is waited
    /// for: no request of ours in flight on it, no lease of ours held by its process
    /// (`holds`), nothing queued. The peer then is not told: a blocking ask after a blocking
    /// ask leaves the flag alone, which spares both sides a line across the CPUs per round
    /// trip (the peer reads the flag at every publish). What the peer may still send then (a
    /// `Retire`) waits for the next look; a send whose reply the driver reads tells the peer
    /// to ring first ([`Conn::ring_for_driver`]).
    pub(super) fn caller_done(
        &self,
        driver_asleep: impl FnOnce() -> bool,
        holds: impl FnOnce(u32) -> bool,
    ) -> bool {
        self.callers.fetch_sub(1, Ordering::SeqCst);
        if !driver_asleep() {
            return false;
        }
        let st = lock(&self.state);
        let quiet = st.session.in_flight() == 0
            && st.session.poll_transmit().is_none()
            && !st.queue.has_input(&self.peer_queue)
            && !holds(self.peer.pid);
        !quiet && st.queue.may_sleep(&self.peer_queue)
    }

    /// A send whose reply the driver reads (not the sending thread): if the driver sleeps and
    /// no caller reads this connection, the peer must ring for it — a caller that stopped
    /// reading may have left the peer untold ([`Conn::caller_done`]). `true`: input arrived
    /// meanwhile, wake the driver.
    pub(super) fn ring_for_driver(&self, st: &State, driver_asleep: bool) -> bool {
        driver_asleep
            && !self.has_callers()
            && !st.queue.may_ring()
            && st.queue.may_sleep(&self.peer_queue)
    }

    /// Whether a caller reads this connection now.
    pub(super) fn has_callers(&self) -> bool {
        self.callers.load(Ordering::SeqCst) > 0
    }

    /// The driver is about to sleep: the peer must ring from now on. `true` if something
    /// arrived meanwhile (the driver must not sleep).
    pub(super) fn may_sleep(&self) -> bool {
        let mut st = lock(&self.state);
        let input = st.queue.may_sleep(&self.peer_queue);
        if st.session.paused_for_unread() && !st.awaits_reading {
            // Paused by a reply sent since the last pump: the peer must ring once it reads.
            st.awaits_reading = true;
            st.queue.await_consumption(&self.peer_queue);
        }
        self.readable(&st, input) || st.session.poll_transmit().is_some() && !st.blocked
    }

    /// The driver woke up: the peer need not ring.
    pub(super) fn awake(&self) {
        lock(&self.state).queue.awake();
    }

    /// Deadlines and stalls by `now`; when next to look.
    pub(super) fn tick(self: &Arc<Self>, t: &Arc<Transport>, now: Instant) -> Option<Instant> {
        self.with(t, |st| {
            // What the peer read since the last pump counts before its stall is judged.
            self.look_at_reading(st);
            st.session.handle_timeout(now);
        });
        lock(&self.state).session.poll_timeout()
    }

    /// When this connection next needs [`Conn::tick`].
    pub(super) fn next_timeout(&self) -> Option<Instant> {
        lock(&self.state).session.poll_timeout()
    }

    /// The caller of request `id` gave up: it is forgotten (a late reply gives its leases
    /// back) and fails with [`Error::Cancelled`].
    pub(super) fn cancel(self: &Arc<Self>, t: &Arc<Transport>, id: u64) {
        let waiter = self.with(t, |st| {
            st.session.cancel(id);
            st.waiters.remove(&id)
        });
        if let Some(waiter) = waiter {
            waiter.completion.complete(Err(Error::Cancelled));
        }
    }

    /// Tells the peer to unmap our retired segment.
    pub(super) fn retire(self: &Arc<Self>, t: &Arc<Transport>, segment: u64) {
        self.with(t, |st| st.session.retire(segment));
    }

    /// Closes it (the driver then forgets it).
    pub(super) fn close(self: &Arc<Self>, t: &Arc<Transport>, reason: CloseReason) {
        self.with(t, |st| st.session.close(reason));
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(super) fn is_idle(&self) -> bool {
        lock(&self.state).session.is_idle()
    }

    pub(super) fn role(&self) -> Role {
        self.role
    }

    pub(super) fn socket(&self) -> RawFd {
        self.socket.as_raw_fd()
    }

    /// The peer's pidfd, taken (on close).
    pub(super) fn take_pidfd(&self) -> Option<OwnedFd> {
        lock(&self.pidfd).take()
    }

    /// Our segments the next transmits announce, kept open until their `Map` is sent.
    pub(super) fn attach(st: &mut State, segments: &[Arc<Segment>]) {
        for segment in segments {
            st.attach
                .entry(segment.id)
                .or_insert_with(|| Arc::clone(segment));
        }
    }

    /// The sending thread reads the reply itself: the peer need not ring this side for it.
    pub(super) fn reading(st: &State) {
        st.queue.awake();
    }

    /// Registers who waits for request `id`.
    pub(super) fn wait_for(st: &mut State, id: u64, waiter: Waiter) {
        st.waiters.insert(id, waiter);
    }

    /// Where `bytes` lie in one of the peer's segments mapped here, if they do: such bytes
    /// (a view of a message the peer sent) go back to it by reference.
    pub(super) fn locate(&self, bytes: &[u8]) -> Option<Located> {
        if !self.any_mapped.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.state).mapped.iter().find_map(|(&id, mapped)| {
            let base = mapped.map.as_slice().as_ptr() as usize;
            let mapping = base..base + mapped.map.len();
            let offset = within(bytes, mapping.clone())?;
            Some(Located {
                segment: id,
                offset: offset as u64,
                mapping,
            })
        })
    }

    /// Every mapping of the peer's segments, removed (on close: views keep their own).
    pub(super) fn unmap_all(&self) {
        let mut st = lock(&self.state);
        st.mapped.clear();
        self.any_mapped.store(false, Ordering::Release);
    }

    /// The peer's segments mapped here changed: whether any is, for [`Conn::locate`].
    pub(super) fn mapped_changed(&self, st: &State) {
        self.any_mapped
            .store(!st.mapped.is_empty(), Ordering::Release);
    }

    fn take_releases(&self, st: &mut State) {
        let releases = self.releases.take();
        if !releases.is_empty() {
            st.session.send_releases(&releases);
        }
    }
}
