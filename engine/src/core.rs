//! A core thread: one ring, the connections placed on it for life, and its timers.
//!
//! Other threads talk to a core only through [`CoreHandle`]: a crossbeam queue of commands plus
//! an eventfd wake (written only when the core is about to sleep). Nothing but the core thread
//! touches its ring.
//!
//! Every operation's buffers live in the [`Conn`] that issued it; a connection is freed only
//! when its count of operations in flight is back to zero, so the kernel never sees freed
//! memory, even after a cancellation.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use io_uring::{cqueue, opcode, squeue, types};
use tensorwire_proto::ptr1::Frame;
use tensorwire_proto::stats;

use crate::completion::Completer;
use crate::endpoint::{Incoming, Reply, Request, RequestKind, Responder, TryPush};
use crate::frame_io::{FrameRecv, FrameSend, RecvError, RecvProgress};
use crate::node::Shared;
use crate::remote_reply::{RemoteReply, ReplyProgress, encode_reply};
use crate::ring::Ring;
use crate::{Error, sys};

/// Identifies a connection on a core across slot reuse, and (for replies) the request on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConnToken {
    slot: u32,
    generation: u32,
    /// The server connection's request number (0 where it does not matter).
    seq: u32,
}

/// Work handed to a core from other threads.
pub(crate) enum Command {
    /// Send a request to a peer and deliver the reply.
    Request(Box<ClientRequest>),
    /// A handler answered the ask that arrived on a connection; the core sends the frame,
    /// of which the handler already wrote the first `sent` bytes itself.
    Reply {
        token: ConnToken,
        encoded: tensorwire_proto::Encoded,
        sent: usize,
    },
    /// A handler wrote its whole reply itself after the core started waiting for it (see
    /// `ReplyProgress`): handle what arrived meanwhile.
    ReplySent { token: ConnToken },
    /// A handler could not write its reply (the connection broke): close it.
    ReplyFailed { token: ConnToken },
    /// A mailbox this connection waits on has space again.
    MailboxSpace { token: ConnToken },
    /// Fail everything, close every connection, stop.
    Shutdown,
}

/// A request for a core to send.
pub(crate) struct ClientRequest {
    pub(crate) peer: SocketAddr,
    /// The frame to send; taken (not copied) when the exchange starts.
    pub(crate) encoded: Option<tensorwire_proto::Encoded>,
    pub(crate) deadline: Instant,
    pub(crate) timeout: Duration,
    pub(crate) completer: ClientCompleter,
}

/// Where a client request's result goes.
pub(crate) enum ClientCompleter {
    Ask(Completer<Reply>),
    Tell(Completer<()>),
}

impl ClientCompleter {
    fn fail(self, error: Error) {
        match self {
            Self::Ask(c) => c.complete(Err(error)),
            Self::Tell(c) => c.complete(Err(error)),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Ask(_) => "ask",
            Self::Tell(_) => "tell",
        }
    }

    /// Delivers a reply frame, checking it fits the request.
    fn deliver(self, peer: SocketAddr, frame: Frame) {
        match self {
            Self::Ask(c) => c.complete(ask_reply(peer, frame)),
            Self::Tell(c) => c.complete(tell_reply(peer, frame)),
        }
    }
}

/// What a reply frame means to an ask: a reply, or the error it carries or is.
pub(crate) fn ask_reply(peer: SocketAddr, frame: Frame) -> Result<Reply, Error> {
    match frame {
        Frame::TensorResponse(message) => Ok(Reply::Tensor(message)),
        Frame::SingleResponse { msg_type, data, .. } => Ok(Reply::Single { msg_type, data }),
        Frame::Error { text, .. } => Err(Error::Remote { text }),
        other => Err(Error::UnexpectedReply {
            peer,
            request: "Ask",
            reply: other.kind().name(),
        }),
    }
}

/// What a reply frame means to a tell: acknowledged, or the error it carries or is.
pub(crate) fn tell_reply(peer: SocketAddr, frame: Frame) -> Result<(), Error> {
    match frame {
        Frame::Ack { .. } => Ok(()),
        Frame::Error { text, .. } => Err(Error::Remote { text }),
        other => Err(Error::UnexpectedReply {
            peer,
            request: "Tell",
            reply: other.kind().name(),
        }),
    }
}

/// The way into a core from any thread (cheap to clone).
#[derive(Clone, Debug)]
pub(crate) struct CoreHandle {
    inner: Arc<CoreShared>,
}

#[derive(Debug)]
struct CoreShared {
    tx: Sender<Command>,
    /// Written to wake the core; a blocking eventfd that the core keeps a READ armed on.
    wake: OwnedFd,
    /// Set by the core just before it waits; whoever clears it must write the eventfd.
    sleeping: AtomicBool,
    /// Entries in the core's timer heap (for tests that check it stays bounded).
    timer_entries: AtomicUsize,
}

impl CoreHandle {
    /// A handle and the receiving end of its command queue.
    fn new() -> Result<(Self, Receiver<Command>), Error> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let wake = sys::eventfd_blocking().map_err(|e| Error::io("eventfd", e))?;
        let sleeping = AtomicBool::new(false);
        let timer_entries = AtomicUsize::new(0);
        Ok((
            Self {
                inner: Arc::new(CoreShared {
                    tx,
                    wake,
                    sleeping,
                    timer_entries,
                }),
            },
            rx,
        ))
    }

    /// Queues a command; gives it back if the core has stopped.
    pub(crate) fn send(&self, command: Command) -> Result<(), Command> {
        self.inner.tx.send(command).map_err(|e| e.into_inner())?;
        if self.inner.sleeping.swap(false, Ordering::SeqCst) {
            sys::eventfd_signal(self.inner.wake.as_raw_fd());
        }
        Ok(())
    }

    /// Entries in the core's timer heap.
    pub(crate) fn timer_entries(&self) -> usize {
        self.inner.timer_entries.load(Ordering::Relaxed)
    }
}

/// Starts a core thread. Returns once its ring exists (or failed to).
pub(crate) fn spawn(
    index: usize,
    shared: Arc<Shared>,
    listener: Option<RawFd>,
) -> Result<(CoreHandle, std::thread::JoinHandle<()>), Error> {
    let (handle, rx) = CoreHandle::new()?;
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
    let core_handle = handle.clone();
    let thread = std::thread::Builder::new()
        .name(format!("tensorwire-core-{index}"))
        .spawn(move || match Ring::new(shared.config.ring_entries) {
            Ok(ring) => {
                let _ = ready_tx.send(Ok(()));
                Core::new(ring, shared, core_handle, rx, listener).run();
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e));
            }
        })
        .map_err(|e| Error::io("spawning a core thread", e))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok((handle, thread)),
        Ok(Err(e)) => Err(Error::IoUringUnavailable {
            reason: format!("core ring setup: {e}"),
        }),
        Err(_) => Err(Error::IoUringUnavailable {
            reason: "core thread died at start".into(),
        }),
    }
}

// ---- user_data layout: | generation: 24 bits | slot: 32 bits | tag: 8 bits | ----

const TAG_RECV: u8 = 1;
const TAG_SEND: u8 = 2;
const TAG_CONNECT: u8 = 3;

const TAG_CANCEL: u8 = 5;
const TAG_WAKE: u8 = 6;
const TAG_ACCEPT: u8 = 7;
/// Slot number of the core's own operations (wake, accept).
const CORE_SLOT: u32 = u32::MAX;
const GENERATION_MASK: u32 = (1 << 24) - 1;
/// Pause before re-arming an accept that failed (for instance out of file descriptors).
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(100);
/// How long a pooled connection above the idle cap may stay idle before it is closed.
const IDLE_TRIM_DELAY: Duration = Duration::from_secs(1);
/// Bytes read per step while discarding input after an error reply.
const DRAIN_CHUNK: usize = 64 << 10;

fn user_data(slot: u32, generation: u32, tag: u8) -> u64 {
    (u64::from(generation & GENERATION_MASK) << 40) | (u64::from(slot) << 8) | u64::from(tag)
}

fn split_user_data(ud: u64) -> (u32, u32, u8) {
    let tag = (ud & 0xFF) as u8;
    let slot = ((ud >> 8) & 0xFFFF_FFFF) as u32;
    let generation = ((ud >> 40) & u64::from(GENERATION_MASK)) as u32;
    (slot, generation, tag)
}

/// One TCP connection and everything its operations point to.
struct Conn {
    generation: u32,
    /// Shared with the replier of a dispatched ask (see `RemoteReply`), so the descriptor can
    /// never be closed and reused while a handler writes to it.
    fd: Option<Arc<OwnedFd>>,
    /// Operations submitted and not yet completed. The connection (and so every buffer those
    /// operations use) is freed only when this is zero and `closing` is set.
    inflight: u32,
    closing: bool,
    deadline: Option<Instant>,
    /// The earliest timer entry queued for this connection, if any. A deadline at or after it
    /// queues nothing (that entry re-checks when it fires), so the timer heap holds about one
    /// entry per connection however many requests come and go.
    timer_at: Option<Instant>,
    role: Role,
    /// Frames to this peer may go out with `SENDMSG_ZC`.
    zero_copy: bool,
    /// `SENDMSG_ZC` notifications still to come (each is also counted in `inflight`).
    zero_copy_notifs: u32,
    /// Sent frames whose memory the kernel may still read: released when no notification is
    /// outstanding.
    zero_copy_kept: Vec<FrameSend>,
}

impl Conn {
    fn new(fd: OwnedFd, deadline: Option<Instant>, zero_copy: bool, role: Role) -> Self {
        Self {
            generation: 0,
            fd: Some(Arc::new(fd)),
            inflight: 0,
            closing: false,
            deadline,
            timer_at: None,
            role,
            zero_copy,
            zero_copy_notifs: 0,
            zero_copy_kept: Vec::new(),
        }
    }

    /// Drops the finished send, or keeps its memory while zero-copy notifications are due.
    fn retire_send(&mut self) {
        let send = match &mut self.role {
            Role::Server(server) => server.send.take(),
            Role::Client(client) => client.send.take(),
        };
        if let Some(send) = send.filter(|s| s.zero_copy && self.zero_copy_notifs > 0) {
            self.zero_copy_kept.push(send);
        }
    }
}

enum Role {
    Server(Server),
    Client(Client),
}

struct Server {
    state: ServerState,
    recv: FrameRecv,
    send: Option<FrameSend>,
    /// Whether the connection has shown the PTR1 preface.
    raw: bool,
    /// Whether bytes of the current request frame have arrived (its deadline is running).
    frame_started: bool,
    /// Requests dispatched so far; a handler reply must carry the current one.
    seq: u32,
    /// A receive is in flight (see `Client::recv_armed`).
    recv_armed: bool,
    /// How far the handler got with the reply to the dispatched ask.
    reply: Option<Arc<ReplyProgress>>,
    /// What the receive armed during a reply brought (the next request, a close, a malformed
    /// frame): handled once the reply is out, so replies never interleave.
    parked: Option<RecvProgress>,
    /// Scratch for discarding input after an error reply (see `close_gracefully`).
    drain: Option<Box<[u8]>>,
}

enum ServerState {
    /// Waiting for (the rest of) a request frame.
    Reading,
    /// A handler has the ask and writes the reply itself (`ReplyProgress` tells when it is
    /// done) or hands it over as a command; the receive for the next request is armed.
    Dispatched,
    /// The endpoint's mailbox was full; retry when it says it has space.
    WaitingForMailbox {
        incoming: Incoming,
        mailbox: Arc<crate::endpoint::Mailbox>,
        version: u32,
        tell: bool,
    },
    /// Writing a reply; then read the next request, or close if `close_after`.
    Replying { close_after: bool },
    /// Error reply sent and writing shut down: discarding input until the peer closes.
    Draining,
}

struct Client {
    peer: SocketAddr,
    state: ClientState,
    recv: FrameRecv,
    send: Option<FrameSend>,
    request: Option<ClientRequest>,
    /// A receive is in flight (its memory is `recv`'s scratch or body: never replace `recv`
    /// while this is set).
    recv_armed: bool,
    /// Destination for CONNECT; must stay put until it completes.
    addr: Box<sys::RawAddr>,
}

enum ClientState {
    Connecting,
    Busy {
        send_done: bool,
        send_error: Option<std::io::Error>,
        reply: Option<Frame>,
    },
    /// In the idle pool with a POLL_ADD armed to notice the peer closing.
    Idle,
}

struct Core {
    ring: Ring,
    shared: Arc<Shared>,
    handle: CoreHandle,
    rx: Receiver<Command>,
    conns: Vec<Option<Conn>>,
    free: Vec<u32>,
    next_generation: u32,
    /// Idle client connections by peer, most recently used last.
    idle: HashMap<SocketAddr, Vec<u32>>,
    /// Client connections (busy, idle or connecting) by peer; at most
    /// `Config::max_connections_per_peer`.
    open: HashMap<SocketAddr, usize>,
    /// Requests waiting for a connection to the peer to become free, oldest first.
    waiting: HashMap<SocketAddr, VecDeque<ClientRequest>>,
    timers: BinaryHeap<Reverse<(Instant, u32, u32)>>,
    listener: Option<RawFd>,
    accept_armed: bool,
    /// When to re-arm an accept that ended on an error.
    accept_retry_at: Option<Instant>,
    /// Multishot accept works here (until the kernel says `EINVAL`).
    accept_multishot: bool,
    /// The eventfd READ target; must not move while the READ is in flight.
    wake_buf: Box<u64>,
    wake_armed: bool,
    stopping: bool,
    completions: Vec<(u64, i32, u32)>,
}

impl Core {
    fn new(
        ring: Ring,
        shared: Arc<Shared>,
        handle: CoreHandle,
        rx: Receiver<Command>,
        listener: Option<RawFd>,
    ) -> Self {
        Self {
            ring,
            shared,
            handle,
            rx,
            conns: Vec::new(),
            free: Vec::new(),
            next_generation: 1,
            idle: HashMap::new(),
            open: HashMap::new(),
            waiting: HashMap::new(),
            timers: BinaryHeap::new(),
            listener,
            accept_armed: false,
            accept_retry_at: None,
            accept_multishot: true,
            wake_buf: Box::new(0),
            wake_armed: false,
            stopping: false,
            completions: Vec::with_capacity(256),
        }
    }

    fn run(mut self) {
        self.arm_wake();
        self.arm_accept();
        loop {
            // Sleep only when no command is queued; the flag tells senders to write the eventfd.
            self.handle.inner.sleeping.store(true, Ordering::SeqCst);
            let timeout = if self.rx.is_empty() {
                self.next_timeout()
            } else {
                Some(Duration::ZERO)
            };
            if let Err(e) = self.turn(timeout) {
                // The ring itself failed: nothing more can be done on this core.
                eprintln!("tensorwire: core ring failed: {e}; closing its connections");
                self.drain();
                break;
            }
            if self.stopping && self.conns.iter().all(Option::is_none) && !self.accept_armed {
                break;
            }
        }
        // Anything still queued fails instead of hanging.
        while let Ok(command) = self.rx.try_recv() {
            self.handle_command(command);
        }
    }

    /// One round: submit and wait (at most `timeout`), then completions, timers and commands.
    fn turn(&mut self, timeout: Option<Duration>) -> std::io::Result<()> {
        let waited = self.ring.submit_and_wait(timeout);
        self.handle.inner.sleeping.store(false, Ordering::SeqCst);
        waited?;
        // Completions first: an idle peer's close is seen before a command could reuse the
        // connection.
        let mut completions = std::mem::take(&mut self.completions);
        self.ring.drain(&mut completions);
        for (ud, res, flags) in completions.drain(..) {
            self.on_completion(ud, res, flags);
        }
        self.completions = completions;
        self.fire_timers();
        while let Ok(command) = self.rx.try_recv() {
            self.handle_command(command);
        }
        Ok(())
    }

    /// Fails every request, closes every connection and waits (bounded) until no operation is
    /// in flight. Connections whose operations never completed are leaked rather than freed:
    /// the kernel may still write into their memory.
    fn drain(&mut self) {
        self.stop_all();
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.conns.iter().any(Option::is_some) && Instant::now() < deadline {
            if self.turn(Some(Duration::from_millis(10))).is_err() {
                break;
            }
        }
        if self.conns.iter().any(Option::is_some) {
            eprintln!("tensorwire: operations still in flight at shutdown; leaking their memory");
            std::mem::forget(std::mem::take(&mut self.conns));
        }
    }

    fn next_timeout(&mut self) -> Option<Duration> {
        let conn = self.timers.peek().map(|Reverse((at, _, _))| *at);
        let conn = match (conn, self.accept_retry_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let queued = self
            .waiting
            .values()
            .flatten()
            .map(|request| request.deadline)
            .min();
        let next = match (conn, queued) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        next.map(|at| at.saturating_duration_since(Instant::now()))
    }

    // ---- commands -----------------------------------------------------------------------------

    fn handle_command(&mut self, command: Command) {
        match command {
            Command::Request(request) => self.start_request(*request),
            Command::Reply {
                token,
                encoded,
                sent,
            } => self.on_handler_reply(token, encoded, sent),
            Command::ReplySent { token } => self.on_reply_written(token),
            Command::ReplyFailed { token } => {
                if self.conn_mut(token).is_some() {
                    self.close(token.slot);
                }
            }
            Command::MailboxSpace { token } => self.retry_mailbox(token),
            Command::Shutdown => self.stop_all(),
        }
    }

    fn stop_all(&mut self) {
        self.stopping = true;
        if self.accept_armed {
            let entry = opcode::AsyncCancel::new(user_data(CORE_SLOT, 0, TAG_ACCEPT)).build();
            self.push_core(entry, TAG_CANCEL);
        }
        for slot in 0..self.conns.len() {
            let slot = u32::try_from(slot).unwrap_or(u32::MAX);
            if let Some(conn) = self.conn_mut_by_slot(slot) {
                if let Role::Client(client) = &mut conn.role {
                    if let Some(request) = client.request.take() {
                        request.completer.fail(Error::Shutdown);
                    }
                }
            }
            self.close(slot);
        }
        self.idle.clear();
        for request in std::mem::take(&mut self.waiting).into_values().flatten() {
            request.completer.fail(Error::Shutdown);
        }
    }

    // ---- completions --------------------------------------------------------------------------

    fn on_completion(&mut self, ud: u64, res: i32, flags: u32) {
        let (slot, generation, tag) = split_user_data(ud);
        if slot == CORE_SLOT {
            match tag {
                TAG_WAKE => {
                    self.wake_armed = false;
                    self.arm_wake();
                }
                TAG_ACCEPT => self.on_accept(res, flags),
                _ => {} // cancel of the accept
            }
            return;
        }
        let auto_zero_copy = self.shared.config.zero_copy == crate::node::ZeroCopy::Auto;
        let Some(conn) = self.conn_mut_by_generation(slot, generation) else {
            return; // cannot happen: a slot is freed only with no operation in flight
        };
        conn.inflight -= 1;
        if cqueue::notif(flags) {
            // A SENDMSG_ZC notification: the kernel is done with the pages of an earlier send.
            let copied =
                u32::from_ne_bytes(res.to_ne_bytes()) & crate::frame_io::NOTIF_USAGE_ZC_COPIED != 0;
            crate::stats::record_zero_copy_notification(copied);
            conn.zero_copy_notifs = conn.zero_copy_notifs.saturating_sub(1);
            if conn.zero_copy_notifs == 0 {
                conn.zero_copy_kept.clear();
            }
            if copied && auto_zero_copy {
                conn.zero_copy = false; // the kernel copies anyway: plain sends are cheaper
            }
            self.reap(slot);
            return;
        }
        if tag == TAG_SEND && cqueue::more(flags) {
            // A notification follows this completion: keep the connection (and memory) for it.
            conn.inflight += 1;
            conn.zero_copy_notifs += 1;
        }
        if !conn.closing {
            match tag {
                TAG_RECV => self.on_recv(slot, res),
                TAG_SEND => self.on_send(slot, res),
                TAG_CONNECT => self.on_connect(slot, res),

                _ => {}
            }
        }
        self.reap(slot);
    }

    fn on_accept(&mut self, res: i32, flags: u32) {
        if !cqueue::more(flags) {
            self.accept_armed = false;
            if res == -libc::EINVAL && self.accept_multishot {
                // A kernel before 5.19 has no multishot accept: accept one at a time.
                self.accept_multishot = false;
                self.arm_accept();
            } else if res < 0 {
                // The accept ended on an error (e.g. EMFILE): retry after a pause instead of
                // spinning on an error that persists.
                self.accept_retry_at = Some(Instant::now() + ACCEPT_RETRY_DELAY);
            } else {
                self.arm_accept();
            }
        }
        if res < 0 {
            return; // e.g. ECONNABORTED: the next connection is accepted as usual
        }
        // SAFETY: a successful accept returns a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(res) };
        if self.stopping {
            return;
        }
        let _ = sys::set_nodelay(fd.as_raw_fd());
        let deadline = Instant::now() + self.shared.config.preface_timeout;
        let zero_copy = match self.shared.config.zero_copy {
            crate::node::ZeroCopy::Auto => zero_copy_allowed(
                crate::node::ZeroCopy::Auto,
                sys::peer_addr(fd.as_raw_fd()).ok(),
            ),
            mode => zero_copy_allowed(mode, None),
        };
        let server = Server {
            state: ServerState::Reading,
            recv: FrameRecv::preface(),
            send: None,
            raw: false,
            frame_started: false,
            seq: 0,
            recv_armed: false,
            reply: None,
            parked: None,
            drain: None,
        };
        let slot = self.insert(Conn::new(
            fd,
            Some(deadline),
            zero_copy,
            Role::Server(server),
        ));
        self.arm_timer(slot);
        self.submit_recv(slot);
    }

    // ---- server side --------------------------------------------------------------------------

    fn on_recv(&mut self, slot: u32, res: i32) {
        let shared = Arc::clone(&self.shared);
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        if let Role::Server(server) = &mut conn.role {
            server.recv_armed = false;
        }
        if let Role::Server(Server {
            state: ServerState::Draining,
            ..
        }) = conn.role
        {
            if res > 0 {
                self.submit_drain(slot)
            } else {
                self.close(slot)
            }
            return;
        }
        let progress = match &mut conn.role {
            Role::Server(server) => server.recv.complete(res, &shared.limits, &shared.pool),
            Role::Client(client) => {
                client.recv_armed = false;
                if matches!(client.state, ClientState::Idle) {
                    self.on_idle_recv(slot);
                    return;
                }
                client.recv.complete(res, &shared.limits, &shared.pool)
            }
        };
        self.on_recv_progress(slot, progress);
    }

    fn on_recv_progress(&mut self, slot: u32, progress: RecvProgress) {
        let require_tls = self.shared.config.require_tls;
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        match &mut conn.role {
            Role::Server(server) => {
                if !server.raw && !server.recv.awaiting_preface() {
                    // The PTR1 preface arrived.
                    server.raw = true;
                    if require_tls {
                        self.close(slot);
                        return;
                    }
                    stats::global().record_raw_connection_accepted();
                }
                self.server_progress(slot, progress);
            }
            Role::Client(_) => self.client_progress(slot, progress),
        }
    }

    fn server_progress(&mut self, slot: u32, progress: RecvProgress) {
        if let RecvProgress::Frame { wire_len, .. } = &progress {
            stats::global().record_raw_frame_received(*wire_len);
        }
        if let Some(progress) = self.park_while_replying(slot, progress) {
            self.handle_server_progress(slot, progress);
        }
    }

    /// Keeps what a receive brought while this connection's reply is still going out (the
    /// receive is armed as soon as an ask is dispatched); gives it back if nothing is going out.
    fn park_while_replying(&mut self, slot: u32, progress: RecvProgress) -> Option<RecvProgress> {
        if matches!(progress, RecvProgress::More) {
            return Some(progress);
        }
        let Some(Conn {
            role: Role::Server(server),
            deadline,
            ..
        }) = self.conn_mut_by_slot(slot)
        else {
            return Some(progress);
        };
        let outstanding = match server.state {
            ServerState::Dispatched => server
                .reply
                .as_ref()
                .is_some_and(|reply| reply.wait_unless_finished()),
            ServerState::Replying { .. } => true,
            _ => false,
        };
        if !outstanding {
            if matches!(server.state, ServerState::Dispatched) {
                server.state = ServerState::Reading;
                server.reply = None;
            }
            return Some(progress);
        }
        server.frame_started = false;
        server.parked = Some(progress);
        *deadline = None; // the reply is written (or sent by the core) as fast as it goes
        None
    }

    /// The reply to the last request is out: handle what arrived meanwhile, or wait for the
    /// next request.
    fn reply_finished(&mut self, slot: u32) {
        let Some(Conn {
            role: Role::Server(server),
            ..
        }) = self.conn_mut_by_slot(slot)
        else {
            return;
        };
        server.reply = None;
        match server.parked.take() {
            Some(progress) => {
                server.state = ServerState::Reading;
                self.handle_server_progress(slot, progress);
            }
            None => self.await_request(slot, ServerState::Reading),
        }
    }

    fn handle_server_progress(&mut self, slot: u32, progress: RecvProgress) {
        let frame_timeout = self.shared.config.frame_timeout;
        match progress {
            RecvProgress::More => {
                let Some(conn) = self.conn_mut_by_slot(slot) else {
                    return;
                };
                let Role::Server(server) = &mut conn.role else {
                    return;
                };
                if server.raw && !server.frame_started {
                    // A request started: from now on the frame deadline runs, not the idle one.
                    server.frame_started = true;
                    conn.deadline = Some(Instant::now() + frame_timeout);
                    self.arm_timer(slot);
                }
                self.submit_recv(slot);
            }
            RecvProgress::ForeignPreface(preface) => self.hand_off(slot, preface),
            RecvProgress::Closed => self.close(slot),
            RecvProgress::Failed { error, version } => {
                let text = match &error {
                    RecvError::Wire(e) => format!("rejected request: {e}"),
                    RecvError::Memory(text) => format!("rejected request: {text}"),
                    RecvError::Truncated { .. } | RecvError::Io(_) => {
                        self.close(slot);
                        return;
                    }
                };
                match version {
                    // The header was readable: tell the client before closing.
                    Some(version) => self.send_reply(slot, Frame::Error { version, text }, true),
                    None => self.close(slot),
                }
            }
            RecvProgress::Frame { frame, .. } => {
                if let Some(Conn {
                    role: Role::Server(server),
                    deadline,
                    ..
                }) = self.conn_mut_by_slot(slot)
                {
                    server.frame_started = false;
                    server.seq = server.seq.wrapping_add(1);
                    *deadline = None; // the handler takes as long as it takes
                }
                self.dispatch(slot, frame);
            }
        }
    }

    fn dispatch(&mut self, slot: u32, frame: Frame) {
        let version = frame.version();
        let (path, message, kind) = match frame {
            Frame::Ask { path, message } => (path, message, RequestKind::Ask),
            Frame::Tell { path, message } => (path, message, RequestKind::Tell),
            other => {
                let text = format!("unexpected request frame: {}", other.kind());
                self.send_reply(slot, Frame::Error { version, text }, false);
                return;
            }
        };
        let mailbox = match self.shared.registry.lookup(&path) {
            Ok(mailbox) => mailbox,
            Err(e) => {
                self.send_reply(
                    slot,
                    Frame::Error {
                        version,
                        text: e.to_string(),
                    },
                    false,
                );
                return;
            }
        };
        let Some(token) = self.token(slot) else {
            return;
        };
        let tell = kind == RequestKind::Tell;
        let (core, limits) = (self.handle.clone(), self.shared.limits);
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        let responder = match (tell, conn.fd.clone(), &mut conn.role) {
            (false, Some(fd), Role::Server(server)) => {
                let progress = Arc::new(ReplyProgress::default());
                server.reply = Some(Arc::clone(&progress));
                Some(Responder::Remote(RemoteReply {
                    core,
                    token,
                    fd,
                    version,
                    limits,
                    progress,
                }))
            }
            _ => None,
        };
        let incoming = Incoming::new(
            Request {
                path,
                kind,
                message,
            },
            responder,
        );
        self.push_to_mailbox(slot, incoming, mailbox, version, tell);
    }

    fn push_to_mailbox(
        &mut self,
        slot: u32,
        incoming: Incoming,
        mailbox: Arc<crate::endpoint::Mailbox>,
        version: u32,
        tell: bool,
    ) {
        let Some(token) = self.token(slot) else {
            return;
        };
        let core = self.handle.clone();
        let on_space = move || {
            let _ = core.send(Command::MailboxSpace { token });
        };
        match mailbox.try_push(incoming, on_space) {
            TryPush::Pushed if tell => self.send_reply(slot, Frame::Ack { version }, false),
            TryPush::Pushed => self.await_reply(slot),
            TryPush::Full(incoming) => self.set_server_state(
                slot,
                ServerState::WaitingForMailbox {
                    incoming,
                    mailbox,
                    version,
                    tell,
                },
            ),
            TryPush::Closed(incoming) if tell => {
                drop(incoming);
                let text = Error::MailboxClosed.to_string();
                self.send_reply(slot, Frame::Error { version, text }, false);
            }
            TryPush::Closed(incoming) => {
                // Answered through the normal reply path, like any handler error.
                self.await_reply(slot);
                incoming.reply(Err(Error::MailboxClosed.to_string()));
            }
        }
    }

    /// A handler has the ask. The next request is read as soon as it comes (a peer that
    /// closes is noticed too), while the handler replies directly on the socket; the idle
    /// deadline is checked against the time the reply was finished (see `fire_timers`).
    fn await_reply(&mut self, slot: u32) {
        self.await_request(slot, ServerState::Dispatched);
    }

    /// Enters `state` with the idle deadline running and a receive armed for the next request.
    fn await_request(&mut self, slot: u32, state: ServerState) {
        let idle_timeout = self.shared.config.idle_timeout;
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        let Role::Server(server) = &mut conn.role else {
            return;
        };
        server.state = state;
        let armed = server.recv_armed;
        conn.deadline = Some(Instant::now() + idle_timeout);
        self.arm_timer(slot);
        if !armed {
            self.submit_recv(slot);
        }
    }

    fn retry_mailbox(&mut self, token: ConnToken) {
        let Some(conn) = self.conn_mut(token) else {
            return;
        };
        let Role::Server(server) = &mut conn.role else {
            return;
        };
        if !matches!(server.state, ServerState::WaitingForMailbox { .. }) || server.seq != token.seq
        {
            return;
        }
        let state = std::mem::replace(&mut server.state, ServerState::Reading);
        if let ServerState::WaitingForMailbox {
            incoming,
            mailbox,
            version,
            tell,
        } = state
        {
            self.push_to_mailbox(token.slot, incoming, mailbox, version, tell);
        }
    }

    /// The connection of `token` if it still waits for the handler's answer to that request.
    fn dispatched(&mut self, token: ConnToken) -> Option<&mut Conn> {
        let conn = self.conn_mut(token)?;
        let Role::Server(server) = &conn.role else {
            return None;
        };
        // A late answer to an earlier request on this connection does not count.
        (matches!(server.state, ServerState::Dispatched) && server.seq == token.seq).then_some(conn)
    }

    /// The handler wrote `sent` bytes of its reply; the core sends the rest.
    fn on_handler_reply(
        &mut self,
        token: ConnToken,
        encoded: tensorwire_proto::Encoded,
        sent: usize,
    ) {
        let zero_copy_min = self.zero_copy_min();
        let Some(conn) = self.dispatched(token) else {
            return;
        };
        let mut send = new_send(encoded, conn.zero_copy && sent == 0, zero_copy_min);
        send.skip(sent);
        conn.deadline = None; // as long as the peer keeps reading
        if let Role::Server(server) = &mut conn.role {
            server.state = ServerState::Replying { close_after: false };
            server.send = Some(send);
        }
        self.submit_send(token.slot);
    }

    /// The handler wrote the whole reply after the core started waiting for it.
    fn on_reply_written(&mut self, token: ConnToken) {
        if self.dispatched(token).is_some() {
            self.reply_finished(token.slot);
        }
    }

    /// Encodes and sends a reply. A reply over the limits becomes an Error frame saying so.
    fn send_reply(&mut self, slot: u32, frame: Frame, close_after: bool) {
        let zero_copy_min = self.zero_copy_min();
        let Some(encoded) = encode_reply(&frame, &self.shared.limits) else {
            self.close(slot); // not even a short error text fits the configured limits
            return;
        };
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        let Role::Server(server) = &mut conn.role else {
            return;
        };
        server.state = ServerState::Replying { close_after };
        server.send = Some(new_send(encoded, conn.zero_copy, zero_copy_min));
        self.submit_send(slot);
    }

    fn on_send(&mut self, slot: u32, res: i32) {
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        let (done, wire_len) = match &mut conn.role {
            Role::Server(Server {
                send: Some(send), ..
            })
            | Role::Client(Client {
                send: Some(send), ..
            }) => (send.complete(res), send.wire_len()),
            _ => return,
        };
        match (&mut conn.role, done) {
            (_, Ok(false)) => self.submit_send(slot),
            (Role::Server(server), Ok(true)) => {
                stats::global().record_raw_frame_sent(wire_len);
                let close_after =
                    matches!(server.state, ServerState::Replying { close_after: true });
                server.state = ServerState::Reading;
                conn.retire_send();
                if close_after {
                    self.close_gracefully(slot);
                } else {
                    self.reply_finished(slot);
                }
            }
            (Role::Server(_), Err(_)) => self.close(slot),
            (Role::Client(_), result) => {
                conn.retire_send();
                let Role::Client(client) = &mut conn.role else {
                    return;
                };
                if let ClientState::Busy {
                    send_done,
                    send_error,
                    ..
                } = &mut client.state
                {
                    match result {
                        Ok(_) => {
                            stats::global().record_raw_frame_sent(wire_len);
                            *send_done = true;
                        }
                        // Wait for the receive: the peer may have answered with an Error frame.
                        Err(e) => *send_error = Some(e),
                    }
                }
                self.client_maybe_finish(slot);
            }
        }
    }

    fn hand_off(&mut self, slot: u32, already_read: Vec<u8>) {
        let handoff = self.shared.handoff.clone();
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        match (handoff, conn.fd.take().map(Arc::try_unwrap)) {
            (Some(handoff), Some(Ok(fd))) if conn.inflight == 0 => {
                conn.closing = true;
                handoff.hand_off(fd, already_read);
            }
            (_, fd) => {
                conn.fd = fd.map(|fd| fd.map_or_else(|shared| shared, Arc::new));
                self.close(slot);
            }
        }
    }

    // ---- client side --------------------------------------------------------------------------

    fn start_request(&mut self, request: ClientRequest) {
        if self.stopping {
            request.completer.fail(Error::Shutdown);
            return;
        }
        if let Some(slot) = self.idle.get_mut(&request.peer).and_then(Vec::pop) {
            // Its receive is still armed (it watched for the peer closing): the reply lands there.
            self.start_exchange(slot, request);
            return;
        }
        let peer = request.peer;
        let open = self.open.get(&peer).copied().unwrap_or(0);
        if open >= self.shared.config.max_connections_per_peer {
            self.waiting.entry(peer).or_default().push_back(request);
            return;
        }
        let fd = match sys::tcp_socket(&peer) {
            Ok(fd) => fd,
            Err(e) => {
                request.completer.fail(Error::Connect { peer, source: e });
                return;
            }
        };
        let _ = sys::set_nodelay(fd.as_raw_fd());
        *self.open.entry(peer).or_default() += 1;
        let connect_deadline = Instant::now() + self.shared.config.connect_timeout;
        let client_deadline = request.deadline;
        let zero_copy = zero_copy_allowed(self.shared.config.zero_copy, Some(peer));
        let client = Client {
            peer,
            state: ClientState::Connecting,
            recv: FrameRecv::new(),
            send: None,
            request: Some(request),
            recv_armed: false,
            addr: Box::new(sys::RawAddr::new(peer)),
        };
        let deadline = Some(connect_deadline.min(client_deadline));
        let slot = self.insert(Conn::new(fd, deadline, zero_copy, Role::Client(client)));
        self.arm_timer(slot);
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        let (Some(fd), Role::Client(client)) = (&conn.fd, &conn.role) else {
            return;
        };
        let entry = opcode::Connect::new(
            types::Fd(fd.as_raw_fd()),
            client.addr.as_ptr(),
            client.addr.len(),
        )
        .build();
        self.push(slot, TAG_CONNECT, entry);
    }

    fn on_connect(&mut self, slot: u32, res: i32) {
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        let Role::Client(client) = &mut conn.role else {
            return;
        };
        if res < 0 {
            if let Some(request) = client.request.take() {
                let source = std::io::Error::from_raw_os_error(-res);
                request.completer.fail(Error::Connect {
                    peer: client.peer,
                    source,
                });
            }
            self.close(slot);
            return;
        }
        if let Some(request) = client.request.take() {
            self.start_exchange(slot, request);
        }
    }

    fn start_exchange(&mut self, slot: u32, mut request: ClientRequest) {
        let zero_copy_min = self.zero_copy_min();
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        let Role::Client(client) = &mut conn.role else {
            return;
        };
        conn.deadline = Some(request.deadline);
        client.state = ClientState::Busy {
            send_done: false,
            send_error: None,
            reply: None,
        };
        let Some(encoded) = request.encoded.take() else {
            return; // cannot happen: a request starts once
        };
        client.send = Some(new_send(encoded, conn.zero_copy, zero_copy_min));
        client.request = Some(request);
        let recv_armed = client.recv_armed;
        self.arm_timer(slot);
        // Send and receive at once: a server that rejects the request answers while we send.
        self.submit_send(slot);
        if !recv_armed {
            self.submit_recv(slot);
        }
    }

    fn client_progress(&mut self, slot: u32, progress: RecvProgress) {
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        let Role::Client(client) = &mut conn.role else {
            return;
        };
        if matches!(client.state, ClientState::Idle) {
            // Bytes nobody asked for (left over in scratch): the stream is not trustworthy.
            self.on_idle_recv(slot);
            return;
        }
        let peer = client.peer;
        match progress {
            RecvProgress::More => self.submit_recv(slot),
            RecvProgress::Frame { frame, wire_len } => {
                stats::global().record_raw_frame_received(wire_len);
                if let ClientState::Busy { reply, .. } = &mut client.state {
                    *reply = Some(frame);
                }
                self.client_maybe_finish(slot);
            }
            RecvProgress::ForeignPreface(_) => self.client_fail(slot, None),
            RecvProgress::Closed => self.client_fail(slot, None),
            RecvProgress::Failed { error, .. } => {
                let error = error.into_client_error(peer);
                self.client_fail(slot, Some(error));
            }
        }
    }

    /// Fails the connection's request (with the send error if there was one) and closes it.
    fn client_fail(&mut self, slot: u32, error: Option<Error>) {
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        let Role::Client(client) = &mut conn.role else {
            return;
        };
        let send_error = match &mut client.state {
            ClientState::Busy { send_error, .. } => send_error.take(),
            _ => None,
        };
        let peer = client.peer;
        let error = error.unwrap_or(Error::ConnectionClosed {
            peer,
            detail: send_error,
        });
        if let Some(request) = client.request.take() {
            request.completer.fail(error);
        }
        self.close(slot);
    }

    fn client_maybe_finish(&mut self, slot: u32) {
        let idle_cap = self.shared.config.idle_connections_per_peer;
        let stopping = self.stopping;
        let over_cap = match self.conns.get(slot as usize) {
            Some(Some(Conn {
                role: Role::Client(client),
                ..
            })) => self.idle.get(&client.peer).map_or(0, Vec::len) >= idle_cap,
            _ => return,
        };
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        let Role::Client(client) = &mut conn.role else {
            return;
        };
        let ClientState::Busy {
            send_done, reply, ..
        } = &mut client.state
        else {
            return;
        };
        // Without a reply yet there is nothing to do: after a failed send, the pending receive
        // decides (the peer's Error frame, or the close).
        let Some(frame) = reply.take() else { return };
        let in_sync = *send_done;
        let peer = client.peer;
        if let Some(request) = client.request.take() {
            request.completer.deliver(peer, frame);
        }
        if !in_sync {
            // The peer answered before taking the whole request: the stream is out of step.
            self.close(slot);
            return;
        }
        if let Some(next) = self.waiting.get_mut(&peer).and_then(VecDeque::pop_front) {
            // A request is waiting for a connection to this peer: it takes this one.
            self.start_exchange(slot, next);
            return;
        }
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        let Role::Client(client) = &mut conn.role else {
            return;
        };
        if stopping {
            self.close(slot);
            return;
        }
        client.state = ClientState::Idle;
        // Beyond the idle cap a connection is trimmed only if it stays idle for a while, so a
        // burst of replies does not close connections the next burst would reopen.
        conn.deadline = over_cap.then(|| Instant::now() + IDLE_TRIM_DELAY);
        self.arm_timer(slot);
        self.idle.entry(peer).or_default().push(slot);
        // Keep a receive armed while idle: it completes if the peer closes (or misbehaves), and
        // it is the receive that takes the next reply when the connection is reused.
        self.submit_recv(slot);
    }

    /// The idle connection's receive completed: the peer closed, or sent bytes nobody asked
    /// for. Either way the connection leaves the pool.
    fn on_idle_recv(&mut self, slot: u32) {
        let Some(Conn {
            role: Role::Client(client),
            ..
        }) = self.conn_mut_by_slot(slot)
        else {
            return;
        };
        let peer = client.peer;
        if let Some(list) = self.idle.get_mut(&peer) {
            list.retain(|&s| s != slot);
        }
        self.close(slot);
    }

    // ---- timers -------------------------------------------------------------------------------

    fn arm_timer(&mut self, slot: u32) {
        if let Some(conn) = self.conn_mut_by_slot(slot) {
            if let Some(at) = conn.deadline {
                if conn.timer_at.is_some_and(|queued| queued <= at) {
                    return;
                }
                conn.timer_at = Some(at);
                let generation = conn.generation;
                self.timers.push(Reverse((at, slot, generation)));
                self.count_timers();
            }
        }
    }

    fn count_timers(&self) {
        let entries = self.timers.len();
        self.handle
            .inner
            .timer_entries
            .store(entries, Ordering::Relaxed);
    }

    fn fire_timers(&mut self) {
        let now = Instant::now();
        let idle_timeout = self.shared.config.idle_timeout;
        if self.accept_retry_at.is_some_and(|at| at <= now) {
            self.accept_retry_at = None;
            self.arm_accept();
        }
        for queue in self.waiting.values_mut() {
            if queue.iter().any(|request| request.deadline <= now) {
                let (expired, kept): (VecDeque<_>, VecDeque<_>) = std::mem::take(queue)
                    .into_iter()
                    .partition(|r| r.deadline <= now);
                *queue = kept;
                for request in expired {
                    let (what, after) = (request.completer.name(), request.timeout);
                    request.completer.fail(Error::Timeout { what, after });
                }
            }
        }
        while let Some(&Reverse((at, slot, generation))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            self.count_timers();
            let Some(conn) = self.conn_mut_by_generation(slot, generation) else {
                continue;
            };
            if conn.timer_at == Some(at) {
                conn.timer_at = None;
            }
            if conn.closing || conn.deadline.is_none_or(|d| d > now) {
                // Finished since, or moved later: queue the current deadline.
                if !conn.closing {
                    self.arm_timer(slot);
                }
                continue;
            }
            conn.deadline = None;
            match &mut conn.role {
                Role::Client(client) if matches!(client.state, ClientState::Idle) => {
                    self.on_idle_recv(slot); // idle past the trim delay, above the cap
                }
                Role::Client(client) => {
                    let what = match client.state {
                        ClientState::Connecting => "connect",
                        _ => client
                            .request
                            .as_ref()
                            .map_or("request", |r| r.completer.name()),
                    };
                    let after = client
                        .request
                        .as_ref()
                        .map_or(Duration::ZERO, |r| r.timeout);
                    self.client_fail(slot, Some(Error::Timeout { what, after }));
                }
                Role::Server(server) => match waiting_for_reply_since(server) {
                    // The handler is still at it: check again later.
                    Some(None) => {
                        conn.deadline = Some(now + idle_timeout);
                        self.arm_timer(slot);
                    }
                    // Idle since the handler's reply went out.
                    Some(Some(finished)) if finished + idle_timeout > now => {
                        conn.deadline = Some(finished + idle_timeout);
                        self.arm_timer(slot);
                    }
                    // A silent, idle or too slow client is closed at its deadline.
                    _ => self.close(slot),
                },
            }
        }
    }

    /// The smallest frame sent with `SENDMSG_ZC`, or `None` if this ring cannot.
    fn zero_copy_min(&self) -> Option<u64> {
        self.ring
            .send_zc
            .then_some(self.shared.config.zero_copy_min_bytes)
    }

    // ---- connection table and submission -------------------------------------------------------

    fn insert(&mut self, mut conn: Conn) -> u32 {
        self.next_generation = (self.next_generation + 1) & GENERATION_MASK;
        conn.generation = self.next_generation;
        match self.free.pop() {
            Some(slot) => {
                self.conns[slot as usize] = Some(conn);
                slot
            }
            None => {
                self.conns.push(Some(conn));
                u32::try_from(self.conns.len() - 1).unwrap_or(u32::MAX - 1)
            }
        }
    }

    fn token(&self, slot: u32) -> Option<ConnToken> {
        let conn = self.conns.get(slot as usize)?.as_ref()?;
        let seq = match &conn.role {
            Role::Server(server) => server.seq,
            Role::Client(_) => 0,
        };
        Some(ConnToken {
            slot,
            generation: conn.generation,
            seq,
        })
    }

    fn conn_mut(&mut self, token: ConnToken) -> Option<&mut Conn> {
        self.conns
            .get_mut(token.slot as usize)?
            .as_mut()
            .filter(|c| c.generation == token.generation)
    }

    fn conn_mut_by_generation(&mut self, slot: u32, generation: u32) -> Option<&mut Conn> {
        self.conns
            .get_mut(slot as usize)?
            .as_mut()
            .filter(|c| c.generation == generation)
    }

    fn conn_mut_by_slot(&mut self, slot: u32) -> Option<&mut Conn> {
        self.conns.get_mut(slot as usize)?.as_mut()
    }

    fn set_server_state(&mut self, slot: u32, state: ServerState) {
        if let Some(Conn {
            role: Role::Server(server),
            ..
        }) = self.conn_mut_by_slot(slot)
        {
            server.state = state;
        }
    }

    fn submit_recv(&mut self, slot: u32) {
        let shared = Arc::clone(&self.shared);
        let poll_first = self.ring.recv_poll_first;
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        // Bytes already received may complete a frame without another receive.
        let buffered = match &mut conn.role {
            Role::Server(server) => server.recv.buffered(&shared.limits, &shared.pool),
            Role::Client(client) => client.recv.buffered(&shared.limits, &shared.pool),
        };
        if let Some(progress) = buffered {
            self.on_recv_progress(slot, progress);
            return;
        }
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        let Some(fd) = conn.fd.as_ref().map(AsRawFd::as_raw_fd) else {
            return;
        };
        let entry = match &mut conn.role {
            Role::Server(server) => {
                server.recv_armed = true;
                server.recv.next_op(fd, poll_first)
            }
            Role::Client(client) => {
                client.recv_armed = true;
                client.recv.next_op(fd, poll_first)
            }
        };
        self.push(slot, TAG_RECV, entry);
    }

    fn submit_send(&mut self, slot: u32) {
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        let Some(fd) = conn.fd.as_ref().map(AsRawFd::as_raw_fd) else {
            return;
        };
        let entry = match &mut conn.role {
            Role::Server(Server {
                send: Some(send), ..
            })
            | Role::Client(Client {
                send: Some(send), ..
            }) => send.next_op(fd),
            _ => return,
        };
        self.push(slot, TAG_SEND, entry);
    }

    /// Queues an operation of connection `slot`.
    fn push(&mut self, slot: u32, tag: u8, entry: squeue::Entry) {
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        let entry = entry.user_data(user_data(slot, conn.generation, tag));
        conn.inflight += 1;
        // SAFETY: every pointer in `entry` refers to heap memory owned by this connection
        // (FrameRecv/FrameSend/Client::addr/its fd), and the connection is only freed by `reap`
        // once `inflight` is back to zero, i.e. after this entry's completion.
        if let Err(e) = unsafe { self.ring.push(&entry) } {
            eprintln!("tensorwire: cannot submit to the ring: {e}");
            if let Some(conn) = self.conn_mut_by_slot(slot) {
                conn.inflight -= 1;
            }
            self.close(slot);
        }
    }

    /// Queues one of the core's own operations (wake read, accept, their cancels).
    fn push_core(&mut self, entry: squeue::Entry, tag: u8) {
        let entry = entry.user_data(user_data(CORE_SLOT, 0, tag));
        // SAFETY: the only memory core operations use is `wake_buf` (a Box owned by the core,
        // which outlives the ring's use of it: the core thread exits only after the loop) and
        // the listener fd (owned by the node, closed only after every core thread joined).
        if let Err(e) = unsafe { self.ring.push(&entry) } {
            eprintln!("tensorwire: cannot submit to the ring: {e}");
        }
    }

    fn arm_wake(&mut self) {
        if self.wake_armed {
            return;
        }
        let fd = self.handle.inner.wake.as_raw_fd();
        let entry = opcode::Read::new(types::Fd(fd), (&raw mut *self.wake_buf).cast(), 8).build();
        self.push_core(entry, TAG_WAKE);
        self.wake_armed = true;
    }

    fn arm_accept(&mut self) {
        let Some(listener) = self.listener else {
            return;
        };
        if self.accept_armed || self.stopping {
            return;
        }
        let entry = if self.accept_multishot {
            opcode::AcceptMulti::new(types::Fd(listener))
                .flags(libc::SOCK_CLOEXEC)
                .build()
        } else {
            let (addr, len) = (std::ptr::null_mut(), std::ptr::null_mut());
            opcode::Accept::new(types::Fd(listener), addr, len)
                .flags(libc::SOCK_CLOEXEC)
                .build()
        };
        self.push_core(entry, TAG_ACCEPT);
        self.accept_armed = true;
    }

    /// Closes a connection: cancels its operations; it is freed when they have completed.
    fn close(&mut self, slot: u32) {
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        if !conn.closing {
            conn.closing = true;
            conn.deadline = None;
            if conn.inflight > 0 {
                if let Some(fd) = conn.fd.as_ref().map(AsRawFd::as_raw_fd) {
                    let _ = sys::shutdown(fd, libc::SHUT_RDWR);
                    let cancel = types::CancelBuilder::fd(types::Fd(fd)).all();
                    self.push(slot, TAG_CANCEL, opcode::AsyncCancel2::new(cancel).build());
                }
            }
        }
        self.reap(slot);
    }

    /// After an error reply: stop writing, let the peer read the reply, then close.
    fn close_gracefully(&mut self, slot: u32) {
        if let Some(fd) = self
            .conn_mut_by_slot(slot)
            .and_then(|c| c.fd.as_ref().map(AsRawFd::as_raw_fd))
        {
            let _ = sys::shutdown(fd, libc::SHUT_WR);
        }
        // Discard what the client is still sending, for a bounded time, so the kernel does not
        // answer with a reset that could destroy our reply in the client's receive queue.
        let drain_timeout = self.shared.config.drain_timeout;
        if let Some(conn) = self.conn_mut_by_slot(slot) {
            if let Role::Server(server) = &mut conn.role {
                server.state = ServerState::Draining;
                server.drain = Some(vec![0; DRAIN_CHUNK].into_boxed_slice());
                conn.deadline = Some(Instant::now() + drain_timeout);
            }
        }
        self.arm_timer(slot);
        self.submit_drain(slot);
    }

    fn submit_drain(&mut self, slot: u32) {
        let Some(conn) = self.conn_mut_by_slot(slot) else {
            return;
        };
        let Some(fd) = conn.fd.as_ref().map(AsRawFd::as_raw_fd) else {
            return;
        };
        let Role::Server(Server {
            drain: Some(buf),
            recv_armed,
            ..
        }) = &mut conn.role
        else {
            return;
        };
        if *recv_armed {
            return; // whatever the armed receive brings is discarded the same way
        }
        *recv_armed = true;
        let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        let entry = opcode::Recv::new(types::Fd(fd), buf.as_mut_ptr(), len).build();
        self.push(slot, TAG_RECV, entry);
    }

    /// Frees the connection if it is closing and nothing is in flight.
    fn reap(&mut self, slot: u32) {
        let Some(entry) = self.conns.get_mut(slot as usize) else {
            return;
        };
        if !entry.as_ref().is_some_and(|c| c.closing && c.inflight == 0) {
            return;
        }
        // Drops the fd (close) and every buffer its operations used.
        let Some(conn) = entry.take() else { return };
        self.free.push(slot);
        if let Role::Client(client) = conn.role {
            let peer = client.peer;
            if let Some(open) = self.open.get_mut(&peer) {
                *open = open.saturating_sub(1);
            }
            if let Some(list) = self.idle.get_mut(&peer) {
                list.retain(|&s| s != slot);
            }
            if let Some(next) = self.waiting.get_mut(&peer).and_then(VecDeque::pop_front) {
                self.start_request(next);
            }
        }
    }
}

/// A send of `encoded`, zero-copy if the connection allows it and the frame is large enough.
/// `zero_copy_min` is `None` where the ring has no `SENDMSG_ZC`.
fn new_send(
    encoded: tensorwire_proto::Encoded,
    zero_copy: bool,
    zero_copy_min: Option<u64>,
) -> FrameSend {
    let mut send = FrameSend::new(encoded);
    send.zero_copy = zero_copy && zero_copy_min.is_some_and(|min| send.wire_len() >= min);
    send
}

/// Whether frames to `peer` may use `SENDMSG_ZC` under `mode`.
fn zero_copy_allowed(mode: crate::node::ZeroCopy, peer: Option<SocketAddr>) -> bool {
    match mode {
        crate::node::ZeroCopy::Always => true,
        crate::node::ZeroCopy::Never => false,
        // On loopback the kernel copies every zero-copy skb anyway (deferred copy).
        crate::node::ZeroCopy::Auto => peer.is_some_and(|peer| !peer.ip().is_loopback()),
    }
}

/// For a server connection whose ask is with a handler and no next request has started:
/// `Some(None)` while the reply is being written, `Some(Some(when))` once it was finished.
fn waiting_for_reply_since(server: &Server) -> Option<Option<Instant>> {
    if !matches!(server.state, ServerState::Dispatched) || server.frame_started {
        return None;
    }
    Some(server.reply.as_ref().and_then(|reply| reply.finished_at()))
}
