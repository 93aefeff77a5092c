//! The PTR1 sessions driven by the fuzzer: the input is a script of driver steps (bytes that
//! arrive in chunks the script sizes, end of stream, read and write errors, write progress,
//! time passing, the node's admit/answer/withdraw decisions, cancellation), in any order a
//! driver could produce them.
//!
//! Checked on every input: no panic; receive memory charged never exceeds its budget and is
//! all given back once the session is dropped; every byte a server writes parses as PTR1
//! frames; a server has at most one request with the node at a time (pipelined ones wait);
//! a client reports exactly one outcome per started request.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::message::TensorMessage;
use crate::session::{
    ClientEvent, ClientRequest, ClientSession, ReadBuf, RequestToken, ServerEvent, ServerSession,
    SessionConfig, Transmit,
};
use crate::transport::{ActorPath, Deadline, HeapMemory, Reply, RequestKind};
use crate::{Limits, ptr1};

/// The budget of frames still arriving: small, so the budget's refusals are reached too.
const BUDGET: u64 = 1 << 18;

/// A server session fed the script in `data`.
pub fn ptr1_server_session(data: &[u8]) {
    let mut script = Script(data);
    let memory = Arc::new(HeapMemory::new(BUDGET));
    let mut now = Instant::now();
    let require_tls = script.byte().is_some_and(|b| b == 0xFF);
    let mut session = ServerSession::new(config(), memory.clone(), require_tls, now);
    let mut written = Vec::new();
    let mut writing: Option<Transmit> = None;
    // Delivered requests waiting for mailbox space or an answer: their number and kind.
    let mut delivered: Vec<(u64, RequestKind)> = Vec::new();
    let mut admitting = false;
    let mut finished = false;
    while let Some(step) = script.byte() {
        if finished || session.is_closed() {
            break;
        }
        match step % 12 {
            0..=3 => {
                if !arrive(&mut script, session.poll_read(), |buf, n| {
                    session.handle_read(buf, Ok(n), now);
                }) {
                    break;
                }
            }
            4 => {
                if let Some(buf) = session.poll_read() {
                    session.handle_read(buf, Ok(0), now);
                }
            }
            5 => {
                if let Some(buf) = session.poll_read() {
                    session.handle_read(buf, Err(std::io::ErrorKind::ConnectionReset.into()), now);
                }
            }
            6 if admitting => {
                admitting = false;
                let refused = script.byte().is_some_and(|b| b & 1 == 1);
                let verdict = if refused {
                    Err("refused".into())
                } else {
                    Ok(())
                };
                session.admit(verdict, now);
            }
            7 if !delivered.is_empty() => {
                let pick = usize::from(script.byte().unwrap_or(0)) % delivered.len();
                let (seq, kind) = delivered.swap_remove(pick);
                session.handle_enqueued(seq, now);
                if kind == RequestKind::Ask {
                    let answer = answer(script.byte().unwrap_or(0));
                    session.handle_answer(seq, answer, now);
                }
            }
            8 => {
                if writing.is_none() {
                    writing = session.poll_transmit(now);
                }
                if let Some(transmit) = &mut writing {
                    let offered: usize = transmit.write_slices().map(<[u8]>::len).sum();
                    let n = script.len(u64::try_from(offered).unwrap_or(u64::MAX));
                    collect(transmit, n, &mut written);
                    if transmit.advance(n) {
                        writing = None;
                    }
                    session.handle_written(n, now);
                }
            }
            9 => session.handle_write_error(std::io::ErrorKind::BrokenPipe.into()),
            _ => {
                now += Duration::from_millis(u64::from(script.byte().unwrap_or(0)) * 40);
                session.handle_timeout(now);
            }
        }
        while let Some(event) = session.poll_event() {
            match event {
                ServerEvent::Admit { .. } => admitting = true,
                ServerEvent::Request { seq, request } => delivered.push((seq, request.kind)),
                ServerEvent::Withdraw { seq } => {
                    let got_in = script.byte().is_some_and(|b| b & 1 == 1);
                    // A tell that got in is acknowledged at once; an ask that got in waits for its answer.
                    delivered.retain(|&(s, k)| s != seq || (got_in && k == RequestKind::Ask));
                    session.handle_withdrawn(seq, !got_in, now);
                }
                ServerEvent::ShutdownWrite => {}
                ServerEvent::HandOff { .. } | ServerEvent::Close(_) => finished = true,
            }
        }
        assert!(memory.charged() <= BUDGET, "over the receive budget");
        // Pipelined requests are read while replies are written, but the node has one at a
        // time: the next is delivered only once this one is answered.
        assert!(delivered.len() <= 1, "two requests with the node at once");
    }
    session.shut_down();
    while session.poll_event().is_some() {}
    drop(session);
    assert_eq!(
        memory.charged(),
        0,
        "charges left after the session was dropped"
    );
    every_frame_parses(&written);
}

/// A client session with one request started, fed the script in `data` as its peer's doing;
/// the script starts more (up to [`PIPELINE`] on their way at once) and gives some up.
pub fn ptr1_client_session(data: &[u8]) {
    let mut script = Script(data);
    let memory = Arc::new(HeapMemory::new(BUDGET));
    let mut now = Instant::now();
    let peer: SocketAddr = ([127, 0, 0, 1], 9).into();
    let mut session = ClientSession::connected(config(), memory.clone(), peer);
    let mut started: Vec<RequestToken> = Vec::new();
    let mut done: HashSet<RequestToken> = HashSet::new();
    let mut writing: Option<Transmit> = None;
    start(&mut session, script.byte().unwrap_or(0), now, &mut started);
    while let Some(step) = script.byte() {
        if session.is_closed() {
            break;
        }
        match step % 10 {
            0..=3 => {
                if !arrive(&mut script, session.poll_read(), |buf, n| {
                    session.handle_read(buf, Ok(n), now);
                }) {
                    break;
                }
            }
            4 => {
                if let Some(buf) = session.poll_read() {
                    session.handle_read(buf, Ok(0), now);
                }
            }
            5 => {
                if writing.is_none() {
                    writing = session.poll_transmit(now);
                }
                if let Some(transmit) = &mut writing {
                    let n = script.len(transmit.remaining());
                    if transmit.advance(n) {
                        writing = None;
                    }
                    session.handle_written(n, now);
                }
            }
            6 => session.handle_write_error(std::io::ErrorKind::BrokenPipe.into(), now),
            7 => {
                let pick = usize::from(script.byte().unwrap_or(0));
                if let Some(&token) = started.get(pick % started.len().max(1)) {
                    session.cancel(token);
                }
            }
            8 if session.is_reusable() => {
                writing = None;
                start(&mut session, script.byte().unwrap_or(0), now, &mut started);
            }
            8 if session.can_take() && session.in_flight() < PIPELINE => {
                // Pipelined behind what is on its way (the transmit being written goes on).
                start(&mut session, script.byte().unwrap_or(0), now, &mut started);
            }
            _ => {
                now += Duration::from_millis(u64::from(script.byte().unwrap_or(0)) * 40);
                session.handle_timeout(now);
            }
        }
        outcomes(&mut session, &started, &mut done);
        assert!(memory.charged() <= BUDGET, "over the receive budget");
    }
    session.shut_down();
    outcomes(&mut session, &started, &mut done);
    assert_eq!(done.len(), started.len(), "one outcome per started request");
    drop(session);
    assert_eq!(
        memory.charged(),
        0,
        "charges left after the session was dropped"
    );
}

/// A reply, a single-value reply or a handler's error, by `choice`.
fn answer(choice: u8) -> Result<Reply, String> {
    match choice % 3 {
        0 => Ok(Reply::Tensor(TensorMessage::new(
            1,
            Bytes::from_static(b"m"),
            vec![Bytes::from(vec![7u8; 300])],
        ))),
        1 => Ok(Reply::Single {
            msg_type: "ack".into(),
            data: Bytes::from_static(b"12"),
        }),
        _ => Err("handler failed".into()),
    }
}

/// Deadlines short enough that the script's time steps reach every one of them.
fn config() -> Arc<SessionConfig> {
    Arc::new(SessionConfig {
        limits: Limits::builder()
            .max_wire_bytes(1 << 20)
            .max_metadata_bytes(1 << 12)
            .max_buffers(64)
            .build(),
        preface_timeout: Duration::from_secs(1),
        head_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(3),
        enqueue_timeout: Duration::from_secs(2),
        drain_timeout: Duration::from_secs(1),
        min_rate: 1024,
        rate_window: Duration::from_secs(1),
        scratch_len: 256,
        max_window: 4096,
        ..SessionConfig::default()
    })
}

/// Requests a fuzzed client session has on its way at most.
const PIPELINE: usize = 4;

/// Starts an ask or a tell (by `kind`'s low bit) on `session`; notes its token if it started.
fn start(session: &mut ClientSession, kind: u8, now: Instant, started: &mut Vec<RequestToken>) {
    let kind = if kind & 1 == 0 {
        RequestKind::Ask
    } else {
        RequestKind::Tell
    };
    if let Ok(token) = session.start(request(kind, now), now) {
        started.push(token);
    }
}

/// Takes the session's outcomes (a request handed back unwritten counts as its outcome
/// here): each for a request started, and only one per request.
fn outcomes(
    session: &mut ClientSession,
    started: &[RequestToken],
    done: &mut HashSet<RequestToken>,
) {
    while let Some(event) = session.poll_event() {
        if let ClientEvent::Done { token, .. } | ClientEvent::Unsent { token, .. } = event {
            assert!(
                started.contains(&token),
                "an outcome for a request never started"
            );
            assert!(done.insert(token), "two outcomes for one request");
        }
    }
}

fn request(kind: RequestKind, now: Instant) -> ClientRequest {
    let message = TensorMessage::new(
        3,
        Bytes::from_static(b"meta"),
        vec![Bytes::from(vec![1u8; 200])],
    );
    let path = ActorPath::parse("echo").expect("a valid path");
    ClientRequest::encode(
        kind,
        &path,
        message,
        &config().limits,
        Deadline::after(now, Duration::from_secs(5)),
    )
    .expect("a small request encodes")
}

/// Copies the script's next chunk into `buf` (if the session wants a read) and reports it;
/// `false` once the script has no bytes left to send.
fn arrive(
    script: &mut Script<'_>,
    buf: Option<ReadBuf>,
    done: impl FnOnce(ReadBuf, usize),
) -> bool {
    let Some(mut buf) = buf else {
        return true;
    };
    let want = script.len(u64::try_from(buf.capacity()).unwrap_or(u64::MAX));
    let bytes = script.take(want);
    if bytes.is_empty() {
        return false; // a read that never completes: the script ends here
    }
    let mut copied = 0;
    for region in buf.regions() {
        let n = region.len().min(bytes.len() - copied);
        region[..n].copy_from_slice(&bytes[copied..copied + n]);
        copied += n;
        if copied == bytes.len() {
            break;
        }
    }
    done(buf, copied);
    true
}

/// Appends the next `n` bytes of `transmit` to `out`, from what one write would cover.
fn collect(transmit: &Transmit, n: usize, out: &mut Vec<u8>) {
    let mut left = n;
    for slice in transmit.write_slices() {
        let take = slice.len().min(left);
        out.extend_from_slice(&slice[..take]);
        left -= take;
        if left == 0 {
            break;
        }
    }
}

/// Every complete frame in `bytes` parses (a cut-off last frame is a write that stopped).
fn every_frame_parses(bytes: &[u8]) {
    let limits = Limits::default();
    let mut decoder = ptr1::Decoder::new(limits);
    let mut rest = bytes;
    while !rest.is_empty() {
        match decoder.decode(rest) {
            Ok((consumed, _)) => rest = &rest[consumed..],
            Err(e) => panic!("the server wrote an invalid frame: {e}"),
        }
    }
}

/// The fuzzer's input, read front to back.
struct Script<'a>(&'a [u8]);

impl<'a> Script<'a> {
    fn byte(&mut self) -> Option<u8> {
        let (&first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(first)
    }

    /// A length of 1..=`max` chosen by the next byte (small or, now and then, all of it).
    fn len(&mut self, max: u64) -> usize {
        let max = usize::try_from(max).unwrap_or(usize::MAX).max(1);
        match self.byte() {
            Some(0xFF) | None => max,
            Some(b) => (usize::from(b) + 1).min(max),
        }
    }

    fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
}
