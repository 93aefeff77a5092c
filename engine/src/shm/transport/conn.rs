//! One control connection: a `SOCK_SEQPACKET` socket whose peer's credentials were checked,
//! the segments of ours it has mapped, the segments of its own we map, and an outbox so that
//! no sender ever waits for room in the peer's socket buffer.

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tensorwire_proto::shm::{Control, encode};

use crate::shm::os::FileMap;
use crate::shm::segments::Segment;
use crate::shm::socket::{self, PeerCred};
use crate::shm::transport::lock;

/// Datagrams queued for a peer at most; past that (or after [`STALL_LIMIT`] without progress)
/// the peer counts as stalled and the connection is closed.
const MAX_QUEUED: usize = 8192;
/// How long a queued datagram may wait for room before the peer counts as stalled.
pub(crate) const STALL_LIMIT: Duration = Duration::from_secs(5);

/// A control connection (either direction), after its hello.
pub(crate) struct Conn {
    pub(crate) id: u64,
    fd: OwnedFd,
    /// The peer process, as the kernel recorded it.
    pub(crate) peer: PeerCred,
    /// A descriptor of the peer process (its exit is how held memory comes back).
    pub(crate) pidfd: Mutex<Option<OwnedFd>>,
    /// The peer node's TCP address, as it said.
    pub(crate) node: String,
    out: Mutex<Out>,
    /// The peer's segments mapped here, by the peer's id for them.
    pub(crate) mapped: Mutex<HashMap<u64, Arc<Mapped>>>,
    /// The peer's segments whose descriptor was lost (this process at its descriptor limit).
    pub(crate) lost: Mutex<HashSet<u64>>,
    closed: AtomicBool,
    /// Held by whoever receives (the poll thread, or a caller waiting for its reply), so
    /// datagrams are handled in the order they came.
    rx: Mutex<()>,
    /// Whether the outbox holds anything (mirrors `out`, read without its lock).
    queued: AtomicBool,
    /// The poll thread's epoll and this connection's token in it, once it joined.
    epoll: OnceLock<(Arc<OwnedFd>, u64)>,
    /// What the poll thread is told to watch, kept in step with the outbox and the callers.
    interest: Mutex<Interest>,
}

#[derive(Default)]
struct Interest {
    /// Callers receiving their own replies on it now: the poll thread is not woken for its
    /// datagrams meanwhile (they would only find them taken).
    callers: usize,
    /// The events the epoll watches now.
    armed: u32,
}

#[derive(Default)]
struct Out {
    queue: VecDeque<Outgoing>,
    /// Our segments the peer has been told to map.
    announced: HashSet<u64>,
    /// When the oldest queued datagram was queued.
    since: Option<Instant>,
}

/// One datagram to send, and the segment whose descriptor goes beside it (kept open until
/// `sendmsg` has returned).
struct Outgoing {
    datagram: Vec<u8>,
    fd: Option<Arc<Segment>>,
}

/// A peer's segment, mapped read-only here.
pub(crate) struct Mapped {
    pub(crate) map: FileMap,
}

/// What a send did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sent {
    /// Handed to the kernel.
    Now,
    /// Queued behind others, or for room in the peer's buffer: the poll thread sends it.
    Queued,
}

impl Conn {
    pub(crate) fn new(fd: OwnedFd, peer: PeerCred, pidfd: Option<OwnedFd>, node: String) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            fd,
            peer,
            pidfd: Mutex::new(pidfd),
            node,
            out: Mutex::new(Out::default()),
            mapped: Mutex::new(HashMap::new()),
            lost: Mutex::new(HashSet::new()),
            closed: AtomicBool::new(false),
            rx: Mutex::new(()),
            queued: AtomicBool::new(false),
            epoll: OnceLock::new(),
            interest: Mutex::new(Interest::default()),
        }
    }

    /// Registers it with the poll thread's `epoll` under `token`.
    pub(crate) fn join(&self, epoll: &Arc<OwnedFd>, token: u64) -> std::io::Result<()> {
        let mut interest = lock(&self.interest);
        let events = Self::events(&interest, self.has_queued());
        crate::sys::epoll_ctl(
            epoll.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            self.raw(),
            events,
            token,
        )?;
        interest.armed = events;
        let _ = self.epoll.set((Arc::clone(epoll), token));
        Ok(())
    }

    /// Unregisters it from the poll thread's epoll.
    pub(crate) fn leave(&self) {
        if let Some((epoll, _)) = self.epoll.get() {
            let _ = crate::sys::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_DEL, self.raw(), 0, 0);
        }
    }

    /// A caller starts receiving its own reply on this connection: until [`Conn::caller_done`]
    /// the poll thread is not woken for incoming datagrams.
    pub(crate) fn caller_waits(&self) {
        let mut interest = lock(&self.interest);
        interest.callers += 1;
        self.rearm(&mut interest);
    }

    /// The caller that [`Conn::caller_waits`] stopped receiving (whatever it left is the poll
    /// thread's again).
    pub(crate) fn caller_done(&self) {
        let mut interest = lock(&self.interest);
        interest.callers = interest.callers.saturating_sub(1);
        self.rearm(&mut interest);
    }

    /// Tells the epoll what to watch now: datagrams unless callers take them, room in the
    /// socket while the outbox holds something.
    fn update_interest(&self) {
        let mut interest = lock(&self.interest);
        self.rearm(&mut interest);
    }

    fn rearm(&self, interest: &mut Interest) {
        let events = Self::events(interest, self.has_queued());
        if events == interest.armed {
            return;
        }
        if let Some((epoll, token)) = self.epoll.get()
            && crate::sys::epoll_ctl(
                epoll.as_raw_fd(),
                libc::EPOLL_CTL_MOD,
                self.raw(),
                events,
                *token,
            )
            .is_ok()
        {
            interest.armed = events;
        }
    }

    fn events(interest: &Interest, queued: bool) -> u32 {
        let read = if interest.callers == 0 {
            libc::EPOLLIN as u32
        } else {
            0
        };
        let write = if queued { libc::EPOLLOUT as u32 } else { 0 };
        read | write | libc::EPOLLRDHUP as u32
    }

    /// Where `bytes` lie in one of the peer's segments mapped here, if they do: such bytes
    /// (a view of a message the peer sent) go back to it by reference.
    pub(crate) fn locate(&self, bytes: &[u8]) -> Option<(u64, u64)> {
        let start = bytes.as_ptr() as usize;
        let end = start.checked_add(bytes.len())?;
        lock(&self.mapped).iter().find_map(|(&id, mapped)| {
            let base = mapped.map.as_slice().as_ptr() as usize;
            (start >= base && end <= base + mapped.map.len()).then(|| (id, (start - base) as u64))
        })
    }

    /// The right to receive on it (waits for the other receiver).
    pub(crate) fn receive_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        lock(&self.rx)
    }

    /// The right to receive on it, if nobody receives now.
    pub(crate) fn try_receive_lock(&self) -> Option<std::sync::MutexGuard<'_, ()>> {
        self.rx.try_lock().ok()
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Sends `control`, first telling the peer to map any of `segments` it has not mapped
    /// yet; in order with every other send on this connection, never waiting for room.
    ///
    /// # Errors
    ///
    /// The connection is closed, broken, stalled, or the message does not fit a datagram
    /// (`InvalidInput`).
    pub(crate) fn transmit(
        &self,
        segments: &[&Arc<Segment>],
        control: &Control,
    ) -> std::io::Result<Sent> {
        let datagram = encode(control)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let mut out = lock(&self.out);
        if self.is_closed() {
            return Err(closed());
        }
        let mut batch = Vec::with_capacity(segments.len() + 1);
        for segment in segments {
            if out.announced.insert(segment.id) {
                let map = Control::Map {
                    segment: segment.id,
                    len: segment.len() as u64,
                };
                let datagram = encode(&map).map_err(std::io::Error::other)?;
                batch.push(Outgoing {
                    datagram,
                    fd: Some(Arc::clone(segment)),
                });
            }
        }
        batch.push(Outgoing { datagram, fd: None });
        self.push(&mut out, batch)
    }

    /// Tells the peer to unmap `segment` if it was told to map it.
    pub(crate) fn retire(&self, segment: u64) {
        let mut out = lock(&self.out);
        if self.is_closed() || !out.announced.remove(&segment) {
            return;
        }
        if let Ok(datagram) = encode(&Control::Retire { segment }) {
            let _ = self.push(&mut out, vec![Outgoing { datagram, fd: None }]);
        }
    }

    /// The peer could not map `segment` (it was at its descriptor limit): announce it again
    /// the next time a message uses it.
    pub(crate) fn forget(&self, segment: u64) {
        lock(&self.out).announced.remove(&segment);
    }

    /// Sends what is queued, as far as the peer's buffer allows (the poll thread calls this
    /// when the socket is writable). `Err` once the peer stalled or the socket broke.
    pub(crate) fn flush(&self) -> std::io::Result<()> {
        let result = {
            let mut out = lock(&self.out);
            let result = self.drain(&mut out);
            self.queued.store(!out.queue.is_empty(), Ordering::Release);
            result
        };
        if result.is_err() {
            self.close();
        }
        self.update_interest();
        result
    }

    /// Whether datagrams wait for room (the poll thread then watches for `POLLOUT`).
    pub(crate) fn has_queued(&self) -> bool {
        self.queued.load(Ordering::Acquire)
    }

    /// Whether queued datagrams have waited past [`STALL_LIMIT`].
    pub(crate) fn is_stalled(&self, now: Instant) -> bool {
        lock(&self.out)
            .since
            .is_some_and(|since| now.saturating_duration_since(since) > STALL_LIMIT)
    }

    /// Marks it closed and shuts the socket down (the poll thread sees the hang-up).
    pub(crate) fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            let _ = crate::sys::shutdown(self.raw(), libc::SHUT_RDWR);
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn push(&self, out: &mut Out, batch: Vec<Outgoing>) -> std::io::Result<Sent> {
        let sent = self.push_inner(out, batch);
        if matches!(sent, Ok(Sent::Queued)) {
            // The poll thread must now watch for room (it flushes the outbox then).
            let mut interest = lock(&self.interest);
            let events = Self::events(&interest, true);
            if events != interest.armed
                && let Some((epoll, token)) = self.epoll.get()
                && crate::sys::epoll_ctl(
                    epoll.as_raw_fd(),
                    libc::EPOLL_CTL_MOD,
                    self.raw(),
                    events,
                    *token,
                )
                .is_ok()
            {
                interest.armed = events;
            }
        }
        sent
    }

    fn push_inner(&self, out: &mut Out, batch: Vec<Outgoing>) -> std::io::Result<Sent> {
        let sent = self.push_queue(out, batch);
        self.queued.store(!out.queue.is_empty(), Ordering::Release);
        sent
    }

    fn push_queue(&self, out: &mut Out, batch: Vec<Outgoing>) -> std::io::Result<Sent> {
        if out.queue.len() + batch.len() > MAX_QUEUED {
            self.close();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the shared-memory peer stopped reading (its queue is full)",
            ));
        }
        let was_empty = out.queue.is_empty();
        out.queue.extend(batch);
        if !was_empty {
            return Ok(Sent::Queued);
        }
        match self.drain(out) {
            Ok(()) if out.queue.is_empty() => Ok(Sent::Now),
            Ok(()) => Ok(Sent::Queued),
            Err(e) => {
                self.close();
                Err(e)
            }
        }
    }

    /// Sends queued datagrams until the socket is full or the queue is empty.
    fn drain(&self, out: &mut Out) -> std::io::Result<()> {
        while let Some(next) = out.queue.front() {
            let fd = next.fd.as_ref().map(|s| s.read_only_fd());
            let fds: Vec<RawFd> = fd.iter().map(|fd| fd.as_fd().as_raw_fd()).collect();
            match socket::send(self.raw(), &next.datagram, &fds) {
                Ok(()) => {
                    out.queue.pop_front();
                    out.since = (!out.queue.is_empty()).then(Instant::now);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    out.since.get_or_insert_with(Instant::now);
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

fn closed() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::BrokenPipe, "connection closed")
}
