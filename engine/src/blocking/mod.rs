//! Blocking calls: one exchange on the calling thread with plain system calls, driving the same
//! client session as the cores.
//!
//! A thread that blocks for its reply anyway gains nothing from a ring: io_uring's receive path
//! (arm a poll, run task work, retry the receive) costs more than one blocking wait for a
//! single sequential exchange. So `Node::ask_blocking` writes with non-blocking `sendmsg` and
//! waits with `poll`, and a large body still lands straight in final receive memory.
//!
//! Connections are pooled per peer by the node (not per thread), so a node that shuts down
//! closes them at once. A pooled connection is reused only if its session is in step with
//! nothing buffered and the socket shows nothing new (a peer close, stray bytes); a close that
//! arrives after that check fails the request, which is never replayed.

mod idle;
mod spin;

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use socket2::{Domain, Socket, Type};
use tensorwire_proto::Limits;
use tensorwire_proto::TensorMessage;
use tensorwire_proto::session::{ClientEvent, ClientRequest, ClientSession, SessionConfig};
use tensorwire_proto::transport::{ActorPath, Answer, Deadline, Error, ReceiveMemory, RequestKind};

use crate::pause::Pause;
use crate::sync::lock;
use crate::sys;
use crate::tcp_options;
use idle::IdleConns;
use spin::SpinPolicy;

/// How often a waiting exchange asks its interrupt whether to give up.
const INTERRUPT_SLICE: Duration = Duration::from_millis(100);

/// Bodies with at least this left wait for a low-water mark instead of waking per segment.
const LOW_WATER_MIN: u64 = 128 << 10;
const LOW_WATER_MAX: u64 = 1 << 20;

/// A node's connections for blocking calls, shared by every calling thread.
pub(crate) struct BlockingPool {
    session: Arc<SessionConfig>,
    memory: Arc<dyn ReceiveMemory>,
    limits: Limits,
    /// How long a caller polls before sleeping in a wait, when the connection's recent waits
    /// were that short.
    busy_poll: Duration,
    idle: Mutex<IdleConns<Conn>>,
    closed: AtomicBool,
}

struct Conn {
    stream: TcpStream,
    session: ClientSession,
    low_water: usize,
    /// Whether to spin in a wait, from this connection's recent waits.
    spin: SpinPolicy,
}

impl BlockingPool {
    pub(crate) fn new(
        session: Arc<SessionConfig>,
        memory: Arc<dyn ReceiveMemory>,
        limits: Limits,
        idle_per_peer: usize,
        busy_poll: Duration,
    ) -> Self {
        let idle_timeout = session.idle_timeout;
        Self {
            session,
            memory,
            limits,
            busy_poll,
            // A connection idle longer than the idle timeout is one its server closes.
            idle: Mutex::new(IdleConns::new(idle_per_peer, idle_timeout)),
            closed: AtomicBool::new(false),
        }
    }

    /// Sends one request to `peer` and waits for its answer on the calling thread.
    /// `interrupt` is asked every [`INTERRUPT_SLICE`] while waiting: `true` gives up (the
    /// connection, mid-exchange, is closed, never reused).
    pub(crate) fn exchange(
        &self,
        peer: SocketAddr,
        kind: RequestKind,
        path: &ActorPath,
        message: TensorMessage,
        deadline: Deadline,
        interrupt: Option<&dyn Fn() -> bool>,
    ) -> Result<Answer, Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Shutdown);
        }
        let request = ClientRequest::encode(kind, path, message, &self.limits, deadline)?;
        let mut conn = self.take(peer, deadline)?;
        let outcome = conn.exchange(request, self.busy_poll, interrupt);
        if conn.session.is_reusable() && !self.closed.load(Ordering::Acquire) {
            let over = lock(&self.idle).put(peer, conn, Instant::now());
            drop(over); // outside the lock
        }
        outcome
    }

    /// Closes every pooled connection; later calls fail with [`Error::Shutdown`].
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let idle = lock(&self.idle).drain();
        drop(idle);
    }

    /// A pooled connection that is still in step, or a new one.
    fn take(&self, peer: SocketAddr, deadline: Deadline) -> Result<Conn, Error> {
        loop {
            let pooled = lock(&self.idle).take(peer);
            let Some(conn) = pooled else { break };
            // Readable while idle means the peer closed, or sent bytes nobody asked for.
            let events = libc::POLLIN | libc::POLLRDHUP;
            let quiet = matches!(
                sys::poll_one(conn.stream.as_raw_fd(), events, Duration::ZERO),
                Ok(0)
            );
            if quiet && conn.session.is_reusable() {
                return Ok(conn);
            }
        }
        let connect_timeout = self.session.connect_timeout;
        let left = deadline
            .at()
            .map(|at| at.saturating_duration_since(Instant::now()));
        if left.is_some_and(|left| left.is_zero()) {
            return Err(deadline.error("connect"));
        }
        let (limit, what) = match left {
            Some(left) if left < connect_timeout => (left, deadline.error("connect")),
            _ => (
                connect_timeout,
                Error::Timeout {
                    what: "connect",
                    after: connect_timeout,
                },
            ),
        };
        let setup = |source| Error::Connect { peer, source };
        let socket = Socket::new(Domain::for_address(peer), Type::STREAM, None).map_err(setup)?;
        tcp_options::tune_connecting(socket.as_raw_fd(), peer, &self.session);
        let stream = match socket.connect_timeout(&peer.into(), limit) {
            Ok(()) => TcpStream::from(socket),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return Err(what),
            Err(source) => return Err(Error::Connect { peer, source }),
        };
        stream.set_nonblocking(true).map_err(setup)?;
        tcp_options::connected(stream.as_raw_fd(), &self.session);
        let session =
            ClientSession::connected(Arc::clone(&self.session), Arc::clone(&self.memory), peer);
        Ok(Conn {
            stream,
            session,
            low_water: 1,
            spin: SpinPolicy::new(),
        })
    }
}

impl Conn {
    /// Runs one exchange to its outcome. Each time it has nothing to read or write it polls
    /// for up to `spin` before it sleeps, if this connection's recent waits were that short
    /// ([`SpinPolicy`]): an answer or bytes that come within microseconds are then taken
    /// without a wake-up; a slower one costs at most that much polling, and long waits stop
    /// the polling.
    fn exchange(
        &mut self,
        request: ClientRequest,
        spin: Duration,
        interrupt: Option<&dyn Fn() -> bool>,
    ) -> Result<Answer, Error> {
        let Ok(token) = self.session.start(request, Instant::now()) else {
            return Err(Error::Misuse("a pooled connection was not idle".into()));
        };
        let mut transmit = None;
        let mut read = None;
        // Since when nothing could be read or written (the current wait).
        let mut waiting_since: Option<Instant> = None;
        let mut pause = Pause::default();
        loop {
            let now = Instant::now();
            while let Some(event) = self.session.poll_event() {
                // One request at a time: its outcome is the only one. (It is handed out as soon
                // as it starts, so it is never handed back unwritten; were it to be, it fails
                // with its connection.)
                let outcome = match event {
                    ClientEvent::Done { outcome, .. } => Some(outcome),
                    ClientEvent::Unsent { .. } => Some(Err(Error::ConnectionClosed {
                        peer: self.session.peer(),
                        detail: Some(std::io::Error::other(
                            "the connection failed before the request was written",
                        )),
                    })),
                    _ => None,
                };
                if let Some(outcome) = outcome {
                    if let Some(since) = waiting_since {
                        self.spin.waited(now.saturating_duration_since(since));
                    }
                    if let Some(buf) = read.take() {
                        // Memory lent for a read that did not happen goes back to the session.
                        let nothing = Err(std::io::ErrorKind::WouldBlock.into());
                        self.session.handle_read(buf, nothing, now);
                    }
                    return outcome;
                }
            }
            if self.session.is_closed() {
                return Err(Error::Misuse(
                    "the session closed without an outcome".into(),
                ));
            }
            let mut progress = false;
            if transmit.is_none() {
                transmit = self.session.poll_transmit(now);
            }
            let mut want_write = false;
            if let Some(tx) = &mut transmit {
                let slices: Vec<IoSlice<'_>> =
                    tx.write_slices().take(1024).map(IoSlice::new).collect();
                match self.stream.write_vectored(&slices) {
                    Ok(n) => {
                        progress = true;
                        let done = tx.advance(n);
                        self.session.handle_written(n, now);
                        if done {
                            transmit = None;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => want_write = true,
                    Err(e) => {
                        progress = true;
                        transmit = None;
                        self.session.handle_write_error(e, now);
                    }
                }
            }
            if read.is_none() {
                read = self.session.poll_read();
                if let Some(buf) = &read {
                    self.set_low_water(buf);
                }
            }
            if let Some(mut buf) = read.take() {
                let result = {
                    let mut regions: Vec<IoSliceMut<'_>> =
                        buf.regions().take(1024).map(IoSliceMut::new).collect();
                    self.stream.read_vectored(&mut regions)
                };
                match result {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => read = Some(buf),
                    result => {
                        progress = true;
                        self.session.handle_read(buf, result, now);
                    }
                }
            }
            if progress {
                if let Some(since) = waiting_since.take() {
                    self.spin.waited(now.saturating_duration_since(since));
                }
                continue;
            }
            let waited = now.saturating_duration_since(*waiting_since.get_or_insert(now));
            if (want_write || read.is_some()) && self.spin.keep_spinning(waited, spin) {
                pause.pause(waited);
                continue;
            }
            let mut events = 0;
            if read.is_some() {
                events |= libc::POLLIN;
            }
            if want_write {
                events |= libc::POLLOUT;
            }
            let until_timeout = self
                .session
                .poll_timeout()
                .map_or(Duration::from_secs(3600), |at| {
                    at.saturating_duration_since(now)
                });
            let wait = match interrupt {
                Some(_) => until_timeout.min(INTERRUPT_SLICE),
                None => until_timeout,
            };
            let ready = sys::poll_one(self.stream.as_raw_fd(), events, wait);
            match ready {
                Ok(0) => {
                    // Asked after every wait that ended with nothing, the session's own timers
                    // included, so no schedule of timers can keep Ctrl+C from being seen.
                    if interrupt.is_some_and(|stop| stop()) {
                        if let Some(buf) = read.take() {
                            let nothing = Err(std::io::ErrorKind::WouldBlock.into());
                            self.session.handle_read(buf, nothing, Instant::now());
                        }
                        self.session.cancel(token);
                        return Err(Error::Cancelled);
                    }
                    if wait >= until_timeout {
                        self.session.handle_timeout(Instant::now());
                    }
                }
                Ok(_) => {}
                Err(e) => self.session.handle_write_error(e, Instant::now()),
            }
        }
    }

    /// Lets a large body arrive in a few big steps (see the io_uring driver's receive).
    fn set_low_water(&mut self, buf: &tensorwire_proto::session::ReadBuf) {
        let mark = if buf.is_payload() && buf.frame_remaining() >= LOW_WATER_MIN {
            usize::try_from((buf.frame_remaining() / 2).min(LOW_WATER_MAX))
                .unwrap_or(1)
                .min(buf.progress_quantum())
                .min(buf.capacity())
                .max(1)
        } else {
            1
        };
        if mark != self.low_water
            && sys::set_receive_low_water(self.stream.as_raw_fd(), mark).is_ok()
        {
            self.low_water = mark;
        }
    }
}
