//! A client session and a server session wired together in memory, with virtual time and a
//! scripted node: whole-protocol tests without sockets.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::message::TensorMessage;
use crate::session::{
    ClientEvent, ClientRequest, ClientSession, CloseReason, ReadBuf, RequestToken, ServerEvent,
    ServerSession, SessionConfig, Transmit,
};
use crate::stripe::Framing;
use crate::transport::{
    ActorPath, Answer, Deadline, Error, HeapMemory, InboundRequest, ReceiveMemory, RecvBuffer,
    RecvStorage, Reply, RequestKind,
};

pub(super) fn peer() -> SocketAddr {
    "127.0.0.1:7000".parse().unwrap()
}

pub(super) fn message(buffers: &[usize]) -> TensorMessage {
    TensorMessage::new(
        9,
        Bytes::from_static(b"meta"),
        buffers
            .iter()
            .enumerate()
            .map(|(i, &len)| Bytes::from(vec![u8::try_from(i % 251).unwrap(); len]))
            .collect(),
    )
}

/// An ask of one buffer of `n` bytes to `/actors/echo`, due in 30 s from `now`.
pub(super) fn ask(n: usize, now: Instant) -> ClientRequest {
    ClientRequest::encode(
        RequestKind::Ask,
        &ActorPath::parse("echo").unwrap(),
        message(&[n]),
        &crate::Limits::default(),
        Deadline::after(now, Duration::from_secs(30)),
    )
    .unwrap()
}

/// Heap memory that counts what it hands out and what is prepared (committed) of it; `warm`
/// memory says all of it is committed already, as a reused pool slot does.
#[derive(Debug)]
pub(super) struct CountingMemory {
    pub(super) heap: HeapMemory,
    pub(super) allocations: AtomicUsize,
    pub(super) allocated: AtomicU64,
    pub(super) prepared: Arc<AtomicU64>,
    pub(super) warm: std::sync::atomic::AtomicBool,
}

struct Counted(Vec<u8>, Arc<AtomicU64>, bool);

impl RecvStorage for Counted {
    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.0
    }
    fn prepare(&mut self, range: std::ops::Range<usize>) {
        self.1.fetch_add(crate::len_u64(range.len()), Relaxed);
    }
    fn committed(&self) -> usize {
        if self.2 { self.0.len() } else { 0 }
    }
    fn freeze(self: Box<Self>) -> Bytes {
        Bytes::from(self.0)
    }
}

impl CountingMemory {
    pub(super) fn new(budget: u64) -> Arc<Self> {
        Arc::new(Self {
            heap: HeapMemory::new(budget),
            allocations: AtomicUsize::new(0),
            allocated: AtomicU64::new(0),
            prepared: Arc::new(AtomicU64::new(0)),
            warm: std::sync::atomic::AtomicBool::new(false),
        })
    }
}

impl ReceiveMemory for CountingMemory {
    fn allocate(&self, len: usize) -> Result<RecvBuffer, Error> {
        self.allocations.fetch_add(1, Relaxed);
        self.allocated.fetch_add(crate::len_u64(len), Relaxed);
        Ok(RecvBuffer::new(Counted(
            vec![0; len],
            Arc::clone(&self.prepared),
            self.warm.load(Relaxed),
        )))
    }
    fn charge(&self, bytes: u64) -> bool {
        self.heap.charge(bytes)
    }
    fn release(&self, bytes: u64) {
        self.heap.release(bytes);
    }
    fn budget(&self) -> u64 {
        self.heap.budget()
    }
}

/// The scripted node's answer to an admission check.
pub(super) type Admission = dyn FnMut(RequestKind, &str) -> Result<(), String>;

/// How the scripted node treats requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum NodeMode {
    /// Enqueue at once; asks are answered with the request message.
    Echo,
    /// Enqueue at once and keep asks unanswered (answer with `Pair::answer`).
    Hold,
    /// The mailbox is full: requests wait until `Pair::enqueue`.
    Full,
}

/// One direction of a connection.
#[derive(Debug, Default)]
pub(super) struct Pipe {
    pub(super) bytes: VecDeque<u8>,
    /// The writer shut down its write side (or closed).
    pub(super) finished: bool,
    /// The reader is gone: writes fail.
    pub(super) reader_gone: bool,
}

/// Both sessions, the pipes between them and everything they reported.
pub(super) struct Pair {
    pub(super) now: Instant,
    pub(super) memory: Arc<CountingMemory>,
    pub(super) server: ServerSession,
    pub(super) client: ClientSession,
    pub(super) to_server: Pipe,
    pub(super) to_client: Pipe,
    /// Bytes each read takes at most (to exercise every split).
    pub(super) read_chunk: usize,
    /// Bytes a pipe holds at most (a peer that stops reading fills it).
    pub(super) pipe_capacity: usize,
    /// The client stops reading (its pipe fills up).
    pub(super) client_reads: bool,
    pub(super) node: NodeMode,
    /// Whether a withdrawn request was still waiting (`false`: it got in meanwhile).
    pub(super) withdraw_succeeds: bool,
    pub(super) admit: Box<Admission>,
    pub(super) server_read: Option<ReadBuf>,
    pub(super) client_read: Option<ReadBuf>,
    server_tx: Option<Transmit>,
    client_tx: Option<Transmit>,
    pub(super) requests: Vec<(u64, InboundRequest)>,
    pub(super) withdrawn: Vec<u64>,
    pub(super) done: Vec<Result<Answer, Error>>,
    /// The requests started, in order, and the ones whose outcome came, in that order.
    pub(super) started: Vec<RequestToken>,
    pub(super) done_tokens: Vec<RequestToken>,
    /// Requests the client handed back unwritten ([`ClientEvent::Unsent`]).
    pub(super) unsent: Vec<(RequestToken, ClientRequest)>,
    pub(super) server_closed: Option<CloseReason>,
    pub(super) client_closed: Option<CloseReason>,
    pub(super) client_transmits: usize,
    pub(super) server_transmits: usize,
    /// Reads the server finished, and the largest scratch one of them was given.
    pub(super) server_reads: usize,
    pub(super) server_scratch_max: usize,
}

impl Pair {
    pub(super) fn new() -> Self {
        Self::with(SessionConfig::default())
    }

    pub(super) fn with(config: SessionConfig) -> Self {
        Self::with_configs(config.clone(), config)
    }

    /// A pair whose client and server are configured apart (their limits, say).
    pub(super) fn with_configs(client: SessionConfig, server: SessionConfig) -> Self {
        let (config, server_config) = (Arc::new(client), Arc::new(server));
        let now = Instant::now();
        let memory = CountingMemory::new(1 << 30);
        let shared: Arc<dyn ReceiveMemory> = memory.clone();
        let client_memory: Arc<dyn ReceiveMemory> = Arc::new(HeapMemory::new(1 << 30));
        let mut client = ClientSession::connecting(Arc::clone(&config), client_memory, peer(), now);
        client.handle_connected();
        Self {
            now,
            server: ServerSession::new(server_config, shared, false, now),
            client,
            memory,
            to_server: Pipe::default(),
            to_client: Pipe::default(),
            read_chunk: usize::MAX,
            pipe_capacity: usize::MAX,
            client_reads: true,
            node: NodeMode::Echo,
            withdraw_succeeds: true,
            admit: Box::new(|_, path| {
                if path.starts_with("/actors/") {
                    Ok(())
                } else {
                    Err(format!("no endpoint at path {path:?}"))
                }
            }),
            server_read: None,
            client_read: None,
            server_tx: None,
            client_tx: None,
            requests: Vec::new(),
            withdrawn: Vec::new(),
            done: Vec::new(),
            started: Vec::new(),
            done_tokens: Vec::new(),
            unsent: Vec::new(),
            server_closed: None,
            client_closed: None,
            client_transmits: 0,
            server_transmits: 0,
            server_reads: 0,
            server_scratch_max: 0,
        }
    }

    /// Starts `request` as it is (one handed back by another session, say).
    pub(super) fn start_request(&mut self, request: ClientRequest) -> RequestToken {
        let token = self
            .client
            .start(request, self.now)
            .expect("the session takes a request");
        self.started.push(token);
        token
    }

    /// Starts an ask or tell of `message` to `/actors/echo` with a deadline of `timeout`.
    pub(super) fn start(
        &mut self,
        kind: RequestKind,
        message: TensorMessage,
        timeout: Duration,
    ) -> RequestToken {
        self.start_framed(kind, message, &Framing::Whole, timeout)
    }

    /// The request started last.
    pub(super) fn last(&self) -> RequestToken {
        *self.started.last().expect("a request was started")
    }

    /// As [`Pair::start`], travelling as `framing`.
    pub(super) fn start_framed(
        &mut self,
        kind: RequestKind,
        message: TensorMessage,
        framing: &Framing,
        timeout: Duration,
    ) -> RequestToken {
        let path = ActorPath::parse("echo").unwrap();
        let request = ClientRequest::encode_framed(
            kind,
            &path,
            message,
            framing,
            &crate::Limits::default(),
            Deadline::after(self.now, timeout),
        )
        .unwrap();
        self.start_request(request)
    }

    /// The server takes stripes into `store`.
    pub(super) fn with_stripes(mut self, store: Arc<crate::session::StripeStore>) -> Self {
        let config = Arc::new(SessionConfig::default());
        let shared: Arc<dyn ReceiveMemory> = self.memory.clone();
        self.server =
            ServerSession::new(config, shared, false, self.now).with_stripes(Some(store), None);
        self
    }

    /// One ask through the whole exchange; its outcome.
    pub(super) fn ask(&mut self, message: TensorMessage) -> Result<Answer, Error> {
        self.start(RequestKind::Ask, message, Duration::from_secs(30));
        self.drive();
        self.done.pop().expect("the ask completed")
    }

    /// Moves bytes and handles events until nothing changes.
    pub(super) fn drive(&mut self) {
        for _ in 0..100_000 {
            if !self.step() {
                return;
            }
        }
        panic!("the sessions did not settle");
    }

    /// Lets `duration` pass, applies deadlines, and drives.
    pub(super) fn advance(&mut self, duration: Duration) {
        self.now += duration;
        if self.server.poll_timeout().is_some_and(|at| at <= self.now) {
            self.server.handle_timeout(self.now);
        }
        if self.client.poll_timeout().is_some_and(|at| at <= self.now) {
            self.client.handle_timeout(self.now);
        }
        self.drive();
    }

    /// Lets time pass in steps of `step` until `until` has passed.
    pub(super) fn run_for(&mut self, until: Duration, step: Duration) {
        let mut passed = Duration::ZERO;
        while passed < until {
            self.advance(step);
            passed += step;
        }
    }

    /// The held request `seq` gets into the mailbox (mode `Full`).
    pub(super) fn enqueue(&mut self, seq: u64) {
        self.server.handle_enqueued(seq, self.now);
        self.drive();
    }

    /// The handler answers request `seq`.
    pub(super) fn answer(&mut self, seq: u64, answer: Result<Reply, String>) {
        self.server.handle_answer(seq, answer, self.now);
        self.drive();
    }

    /// Writes raw bytes towards the server as a misbehaving client would (the client session
    /// stops reading, so what the server answers stays in the pipe).
    pub(super) fn raw_to_server(&mut self, bytes: &[u8]) {
        self.client_reads = false;
        self.to_server.bytes.extend(bytes);
        self.drive();
    }

    /// Everything the server wrote, taken out of the pipe.
    pub(super) fn take_from_server(&mut self) -> Vec<u8> {
        self.to_client.bytes.drain(..).collect()
    }

    pub(super) fn step(&mut self) -> bool {
        let mut progress = false;
        progress |= self.server_events();
        progress |= self.client_events();
        if self.client_tx.is_none() && self.client_closed.is_none() {
            if let Some(tx) = self.client.poll_transmit(self.now) {
                self.client_tx = Some(tx);
                self.client_transmits += 1;
                progress = true;
            }
        }
        if self.server_tx.is_none() && self.server_closed.is_none() {
            if let Some(tx) = self.server.poll_transmit(self.now) {
                self.server_tx = Some(tx);
                self.server_transmits += 1;
                progress = true;
            }
        }
        progress |= self.write_client();
        progress |= self.write_server();
        progress |= self.read_server();
        if self.client_reads {
            progress |= self.read_client();
        }
        progress
    }

    fn write_client(&mut self) -> bool {
        let Some(tx) = &mut self.client_tx else {
            return false;
        };
        if self.to_server.reader_gone {
            self.client_tx = None;
            let error = io::Error::from(io::ErrorKind::BrokenPipe);
            self.client.handle_write_error(error, self.now);
            return true;
        }
        let n = write_into(tx, &mut self.to_server, self.pipe_capacity);
        if n == 0 {
            return false;
        }
        let done = tx.advance(n);
        if done {
            self.client_tx = None;
        }
        self.client.handle_written(n, self.now);
        true
    }

    fn write_server(&mut self) -> bool {
        let Some(tx) = &mut self.server_tx else {
            return false;
        };
        if self.to_client.reader_gone {
            self.server_tx = None;
            let error = io::Error::from(io::ErrorKind::BrokenPipe);
            self.server.handle_write_error(error);
            return true;
        }
        let n = write_into(tx, &mut self.to_client, self.pipe_capacity);
        if n == 0 {
            return false;
        }
        if tx.advance(n) {
            self.server_tx = None;
        }
        self.server.handle_written(n, self.now);
        true
    }

    fn read_server(&mut self) -> bool {
        if self.server_closed.is_some() {
            return false;
        }
        if self.server_read.is_none() {
            self.server_read = self.server.poll_read();
        }
        let Some(buf) = &mut self.server_read else {
            return false;
        };
        let Some(result) = read_from(buf, &mut self.to_server, self.read_chunk) else {
            return false;
        };
        let buf = self.server_read.take().unwrap();
        self.server_reads += 1;
        if !buf.is_payload() {
            self.server_scratch_max = self.server_scratch_max.max(buf.capacity());
        }
        self.server.handle_read(buf, result, self.now);
        true
    }

    fn read_client(&mut self) -> bool {
        if self.client_closed.is_some() {
            return false;
        }
        if self.client_read.is_none() {
            self.client_read = self.client.poll_read();
        }
        let Some(buf) = &mut self.client_read else {
            return false;
        };
        let Some(result) = read_from(buf, &mut self.to_client, self.read_chunk) else {
            return false;
        };
        let buf = self.client_read.take().unwrap();
        self.client.handle_read(buf, result, self.now);
        true
    }

    fn server_events(&mut self) -> bool {
        let mut any = false;
        while let Some(event) = self.server.poll_event() {
            any = true;
            match event {
                ServerEvent::Admit { kind, path } => {
                    let result = (self.admit)(kind, &path);
                    self.server.admit(result, self.now);
                }
                ServerEvent::Request { seq, request } => self.deliver(seq, request),
                ServerEvent::Withdraw { seq } => {
                    self.withdrawn.push(seq);
                    let withdrawn = self.withdraw_succeeds;
                    self.server.handle_withdrawn(seq, withdrawn, self.now);
                }
                ServerEvent::ShutdownWrite => self.to_client.finished = true,
                ServerEvent::Close(reason) => {
                    self.server_closed = Some(reason);
                    self.server_tx = None;
                    self.to_client.finished = true;
                    self.to_server.reader_gone = true;
                }
                ServerEvent::HandOff { .. } => {
                    self.server_closed = Some(CloseReason::Shutdown);
                }
            }
        }
        any
    }

    fn deliver(&mut self, seq: u64, request: InboundRequest) {
        match self.node {
            NodeMode::Echo => {
                self.server.handle_enqueued(seq, self.now);
                if request.kind == RequestKind::Ask {
                    let reply = Reply::Tensor(request.message.clone());
                    self.server.handle_answer(seq, Ok(reply), self.now);
                }
            }
            NodeMode::Hold => self.server.handle_enqueued(seq, self.now),
            NodeMode::Full => {}
        }
        self.requests.push((seq, request));
    }

    fn client_events(&mut self) -> bool {
        let mut any = false;
        while let Some(event) = self.client.poll_event() {
            any = true;
            match event {
                ClientEvent::Done { token, outcome } => {
                    self.done_tokens.push(token);
                    self.done.push(outcome);
                }
                ClientEvent::Unsent { token, request } => self.unsent.push((token, request)),
                ClientEvent::Close(reason) => {
                    self.client_closed = Some(reason);
                    self.client_tx = None;
                    self.to_server.finished = true;
                    self.to_client.reader_gone = true;
                }
            }
        }
        any
    }
}

/// Feeds `bytes` to `client` as the peer's, through the reads it asks for (until it closes).
pub(super) fn feed(client: &mut ClientSession, mut bytes: &[u8], now: Instant) {
    while !bytes.is_empty() {
        let Some(mut buf) = client.poll_read() else {
            return;
        };
        let mut n = 0;
        for region in buf.regions() {
            let take = region.len().min(bytes.len() - n);
            region[..take].copy_from_slice(&bytes[n..n + take]);
            n += take;
            if n == bytes.len() {
                break;
            }
        }
        client.handle_read(buf, Ok(n), now);
        bytes = &bytes[n..];
    }
}

/// Copies as much of `tx` as fits into `pipe`; returns the count.
fn write_into(tx: &Transmit, pipe: &mut Pipe, capacity: usize) -> usize {
    let mut room = capacity.saturating_sub(pipe.bytes.len());
    let mut n = 0;
    for slice in tx.write_slices() {
        let take = slice.len().min(room);
        pipe.bytes.extend(&slice[..take]);
        n += take;
        room -= take;
        if room == 0 {
            break;
        }
    }
    n
}

/// Completes a read from `pipe` into `buf` if bytes (or the end) are there.
fn read_from(buf: &mut ReadBuf, pipe: &mut Pipe, chunk: usize) -> Option<io::Result<usize>> {
    if pipe.bytes.is_empty() {
        return pipe.finished.then_some(Ok(0));
    }
    let mut budget = chunk.min(pipe.bytes.len());
    let mut n = 0;
    for region in buf.regions() {
        let take = region.len().min(budget);
        for (slot, byte) in region[..take].iter_mut().zip(pipe.bytes.drain(..take)) {
            *slot = byte;
        }
        n += take;
        budget -= take;
        if budget == 0 {
            break;
        }
    }
    Some(Ok(n))
}
