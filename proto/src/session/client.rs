//! The client side of a PTR1 connection, without I/O.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

mod end;
mod in_flight;
mod request;

pub use in_flight::RequestToken;
pub use request::ClientRequest;

use crate::config::SessionConfig;
use crate::kind::FrameKind;
use crate::ptr1::Frame;
use crate::session::read_buf::ReadBuf;
use crate::session::receiver::{Received, Receiver};
use crate::session::transmit::{RateMeter, Transmit};
use crate::session::{CloseReason, server_closes_after};
use crate::stats;
use crate::transport::{Answer, Error, ReceiveMemory, Reply, RequestKind};
use in_flight::InFlight;

/// What a client session asks of its driver.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClientEvent {
    /// The outcome of request `token` (exactly one per [`ClientSession::start`] that took
    /// it, unless the request is handed back instead: [`ClientEvent::Unsent`]). Outcomes come in the order the requests were started, except that a request
    /// given up on (its deadline passed, or it was cancelled) has its outcome at once.
    Done {
        /// The request, as [`ClientSession::start`] returned it.
        token: RequestToken,
        /// Its reply, or why there is none.
        outcome: Result<Answer, Error>,
    },
    /// Request `token` has no outcome yet and is handed back: the connection failed before a
    /// byte of its frame was handed out, so the peer cannot have seen it, and the driver
    /// starts `request` again another way (through its pool, deadline unchanged). A request
    /// is handed back at most once; a second connection that fails before writing it fails it
    /// like the others. Not while the node shuts down, and not when the connection was never
    /// established (another try would meet the same refusal).
    Unsent {
        /// The request, as [`ClientSession::start`] returned it.
        token: RequestToken,
        /// The same request, to start again ([`ClientRequest::was_given_back`] is now true).
        request: ClientRequest,
    },
    /// Close the connection (cancel what is in flight). The session is finished.
    Close(CloseReason),
}

/// One outgoing PTR1 connection: its requests' frames written in order (several at once to a
/// peer that takes pipelined requests, [`ClientRequest::with_pipeline`]; the pool decides how
/// many), their replies read in the same order.
///
/// A request is written while a read is armed, so a server that rejects it mid-stream is heard
/// (its Error frame) rather than a broken pipe. A reply's kind is checked against its request
/// before any payload memory is committed. While idle the session keeps a read armed: if the
/// peer closes (or sends anything), the connection is finished and never reused. A request on
/// a connection that fails is failed, never replayed, once any byte of it was handed out (the
/// peer may have acted on it); one still queued behind others is handed back to go another way
/// ([`ClientEvent::Unsent`]).
///
/// A request whose deadline passes, or that is cancelled, has its outcome at once; if its
/// frame had begun to go out, its reply is still read (and dropped) when it comes, so the
/// requests behind it keep their connection. A connection on which every request left is
/// given up on is closed.
#[derive(Debug)]
pub struct ClientSession {
    config: Arc<SessionConfig>,
    receiver: Receiver,
    peer: SocketAddr,
    connected: bool,
    requests: InFlight,
    /// Bytes of the transmit handed out not yet written.
    writing: Option<u64>,
    /// Writing failed: nothing more is written; the pending read decides (the peer's Error
    /// frame, or the close), and this is what the close is reported with.
    write_error: Option<io::Error>,
    write_failed: bool,
    events: VecDeque<ClientEvent>,
    connect_until: Option<Instant>,
    head_until: Option<Instant>,
    receive_rate: RateMeter,
    send_rate: RateMeter,
    closed: bool,
}

impl ClientSession {
    /// A session for a connection being opened to `peer`; call
    /// [`ClientSession::handle_connected`] once it is.
    pub fn connecting(
        config: Arc<SessionConfig>,
        memory: Arc<dyn ReceiveMemory>,
        peer: SocketAddr,
        now: Instant,
    ) -> Self {
        let mut session = Self::connected(config, memory, peer);
        session.connected = false;
        session.connect_until = now.checked_add(session.config.connect_timeout);
        session
    }

    /// A session for an established connection to `peer`.
    pub fn connected(
        config: Arc<SessionConfig>,
        memory: Arc<dyn ReceiveMemory>,
        peer: SocketAddr,
    ) -> Self {
        Self {
            receiver: Receiver::new(Arc::clone(&config), memory, false),
            peer,
            connected: true,
            requests: InFlight::default(),
            writing: None,
            write_error: None,
            write_failed: false,
            events: VecDeque::new(),
            connect_until: None,
            head_until: None,
            receive_rate: RateMeter::new(config.min_rate, config.rate_window),
            send_rate: RateMeter::new(config.min_rate, config.rate_window),
            closed: false,
            config,
        }
    }

    /// The peer.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The connection is established.
    pub fn handle_connected(&mut self) {
        self.connected = true;
        self.connect_until = None;
    }

    /// Connecting failed: every started request fails with the error.
    pub fn handle_connect_error(&mut self, source: io::Error) {
        let peer = self.peer;
        self.fail(Error::Connect { peer, source }, CloseReason::OutOfStep);
    }

    /// Starts a request behind those already started (the caller decides how many its peer
    /// takes at once); given back if the session cannot take one now (closed, writing failed,
    /// or — while no request is started — bytes are buffered that nobody asked for).
    ///
    /// # Errors
    ///
    /// The request itself, unchanged.
    pub fn start(
        &mut self,
        request: ClientRequest,
        now: Instant,
    ) -> Result<RequestToken, ClientRequest> {
        if !self.can_take() {
            return Err(request);
        }
        let token = self.requests.token();
        if request.deadline.has_passed(now) {
            let outcome = Err(request.deadline.error(request.kind.as_str()));
            self.events.push_back(ClientEvent::Done { token, outcome });
            return Ok(token);
        }
        self.requests.push(token, request);
        Ok(token)
    }

    /// The caller gave up on request `token`: its outcome is [`Error::Cancelled`] at once. If
    /// nothing of it was handed out it is taken out; otherwise its reply is read and dropped,
    /// and once nobody waits for anything on the connection it is closed (the peer may have
    /// seen all, part or none of the request).
    pub fn cancel(&mut self, token: RequestToken) {
        if self.closed || self.requests.give_up(token).is_none() {
            return;
        }
        self.events.push_back(ClientEvent::Done {
            token,
            outcome: Err(Error::Cancelled),
        });
        self.close_if_abandoned();
    }

    /// Closes the session (the node is shutting down); every started request fails with
    /// [`Error::Shutdown`].
    pub fn shut_down(&mut self) {
        self.fail(Error::Shutdown, CloseReason::Shutdown);
    }

    /// Memory for the next read, if one is wanted now (also while idle: a completed read
    /// then means the peer closed).
    pub fn poll_read(&mut self) -> Option<ReadBuf> {
        if self.closed || !self.connected {
            return None;
        }
        self.receiver.poll_read()
    }

    /// A read finished: `Ok(n)` bytes arrived (0 = the peer finished sending), or it failed.
    pub fn handle_read(&mut self, buf: ReadBuf, result: io::Result<usize>, now: Instant) {
        if self.closed {
            return;
        }
        if self.requests.is_empty() {
            // Idle: whatever happened, this connection is done.
            let reason = match result {
                Ok(0) => CloseReason::PeerClosed,
                Ok(_) => CloseReason::UnexpectedData,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.receiver.handle_read(buf, Err(e));
                    return;
                }
                Err(e) => CloseReason::Io(e),
            };
            self.receiver.handle_read(buf, Ok(0));
            return self.close(reason);
        }
        let n = result.as_ref().map_or(0, |n| *n);
        self.receiver.handle_read(buf, result);
        self.drive(now);
        self.receive_rate.progress(n);
    }

    /// The request frames not handed out yet (several together, in order), if any.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        if !self.connected || self.closed || self.write_failed || self.writing.is_some() {
            return None;
        }
        let transmit = self.requests.take_transmit()?;
        self.writing = Some(transmit.remaining());
        self.send_rate.start(now);
        Some(transmit)
    }

    /// `n` more bytes of the transmit were written.
    pub fn handle_written(&mut self, n: usize, now: Instant) {
        let Some(remaining) = &mut self.writing else {
            return;
        };
        self.send_rate.progress(n);
        *remaining = remaining.saturating_sub(crate::len::len_u64(n));
        let done = *remaining == 0;
        let (frames, bytes) = self.requests.written(n);
        if frames > 0 {
            stats::global().record_raw_frames_sent(frames, bytes);
        }
        if done {
            self.writing = None;
            self.send_rate.stop();
        }
        self.drive(now);
    }

    /// Writing failed. The read decides: the peer may have answered (an Error frame saying
    /// why it stopped reading) before it closed.
    pub fn handle_write_error(&mut self, error: io::Error, now: Instant) {
        self.writing = None;
        self.write_failed = true;
        self.send_rate.stop();
        self.write_error = Some(error);
        if self.requests.all_queued() {
            return self.end_after_write_error();
        }
        self.drive(now);
    }

    /// The next event for the driver.
    pub fn poll_event(&mut self) -> Option<ClientEvent> {
        self.events.pop_front()
    }

    /// The earliest deadline; call [`ClientSession::handle_timeout`] when it passes.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.closed {
            return None;
        }
        [
            self.connect_until,
            self.requests.earliest_deadline(),
            self.head_until,
            self.receive_rate.deadline(),
            self.send_rate_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Applies every deadline that passed by `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.closed {
            return;
        }
        let config = Arc::clone(&self.config);
        if self.connect_until.is_some_and(|at| at <= now) {
            // Given up even if no request waits for this connection.
            let error = Error::Timeout {
                what: "connect",
                after: config.connect_timeout,
            };
            let reason = CloseReason::Timeout {
                phase: "connect",
                after: config.connect_timeout,
            };
            return self.fail(error, reason);
        }
        if self.requests.is_empty() {
            return;
        }
        for (token, kind, deadline) in self.requests.expired(now) {
            self.requests.give_up(token);
            let outcome = Err(deadline.error(kind.as_str()));
            self.events.push_back(ClientEvent::Done { token, outcome });
        }
        let error = if self.head_until.is_some_and(|at| at <= now) {
            Error::Timeout {
                what: "the reply's head",
                after: config.head_timeout,
            }
        } else if !self.receive_rate.check(now) {
            Error::Timeout {
                what: "the reply (below the minimum rate)",
                after: config.rate_window,
            }
        } else if self.send_rate_deadline().is_some() && !self.send_rate.check(now) {
            Error::Timeout {
                what: "writing the request (the peer is not reading)",
                after: config.rate_window,
            }
        } else {
            return self.close_if_abandoned();
        };
        self.fail(error, CloseReason::OutOfStep);
    }

    /// When writing falls below the minimum rate — checked only while the frame being
    /// written is the front request's: behind an unanswered one, a peer that stops reading is
    /// busy with it (it reads on once it answers), not slow.
    fn send_rate_deadline(&self) -> Option<Instant> {
        if self.requests.front_is_writing() {
            self.send_rate.deadline()
        } else {
            None
        }
    }

    /// Whether the session is finished.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Whether the connection is idle and can be pooled: no request started, in step,
    /// nothing buffered.
    pub fn is_reusable(&self) -> bool {
        !self.closed
            && self.connected
            && !self.write_failed
            && self.writing.is_none()
            && self.requests.is_empty()
            && self.receiver.is_between_frames()
    }

    /// Whether [`ClientSession::start`] would take a request now (also while connecting, or
    /// while others are on their way).
    pub fn can_take(&self) -> bool {
        !self.closed
            && !self.write_failed
            && (!self.requests.is_empty() || self.receiver.is_between_frames())
    }

    /// Requests started and not answered yet (given-up ones whose reply is still owed
    /// included).
    pub fn in_flight(&self) -> usize {
        self.requests.len()
    }

    fn drive(&mut self, now: Instant) {
        while !self.closed && !self.requests.is_empty() {
            let Some(received) = self.receiver.next() else {
                break;
            };
            match received {
                Received::Started => {
                    self.head_until = now.checked_add(self.config.head_timeout);
                    self.receive_rate.start(now);
                }
                Received::Routed { kind, .. } => self.routed(kind),
                Received::Frame { frame, wire_len } => {
                    stats::global().record_raw_frame_received(wire_len);
                    self.finish(frame);
                    if self.writing.is_some() && self.requests.front_is_writing() {
                        // The write now measured is the front's: its window starts now, not
                        // while the peer was busy with the request answered.
                        self.send_rate.stop();
                        self.send_rate.start(now);
                    }
                }
                Received::Closed => {
                    let detail = self.write_error.take();
                    let peer = self.peer;
                    self.fail(
                        Error::ConnectionClosed { peer, detail },
                        CloseReason::PeerClosed,
                    );
                }
                Received::Failed { error, .. } => {
                    let error = self.recv_error(error);
                    self.fail(error, CloseReason::OutOfStep);
                }
                // A client session never refuses a frame and has no preface.
                Received::Skipped | Received::ForeignPreface(_) => {
                    self.fail(
                        Error::Misuse("unexpected receiver state".into()),
                        CloseReason::OutOfStep,
                    );
                }
            }
        }
    }

    /// A reply's head is in: its kind must fit the request it answers before payload memory is
    /// committed.
    fn routed(&mut self, kind: FrameKind) {
        self.head_until = None;
        if self.answered_unsent() {
            return;
        }
        let Some(request) = self.requests.front() else {
            return;
        };
        let fits = match request.kind {
            RequestKind::Ask => matches!(
                kind,
                FrameKind::TensorResponse | FrameKind::SingleResponse | FrameKind::Error
            ),
            RequestKind::Tell => matches!(kind, FrameKind::Ack | FrameKind::Error),
        };
        if !fits {
            let error = Error::UnexpectedReply {
                peer: self.peer,
                request: match request.kind {
                    RequestKind::Ask => "Ask",
                    RequestKind::Tell => "Tell",
                },
                reply: kind.name(),
            };
            return self.fail(error, CloseReason::OutOfStep);
        }
        self.receiver.admit();
    }

    /// A reply is in: it answers the front request.
    fn finish(&mut self, frame: Frame) {
        self.receive_rate.stop();
        self.head_until = None;
        if self.answered_unsent() {
            return;
        }
        let Some(request) = self.requests.pop_front() else {
            return;
        };
        let peer = Some(self.peer);
        let outcome = match frame {
            Frame::TensorResponse(message) => Ok(Answer::Reply(Reply::Tensor(message))),
            Frame::SingleResponse { msg_type, data, .. } => {
                Ok(Answer::Reply(Reply::Single { msg_type, data }))
            }
            Frame::Ack { .. } => Ok(Answer::Ack),
            Frame::Error { text, .. } => Err(Error::Remote { peer, text }),
            // Other kinds were refused when their head arrived.
            Frame::Ask { .. } | Frame::Tell { .. } => Err(Error::UnexpectedReply {
                peer: self.peer,
                request: "request",
                reply: "request",
            }),
        };
        let closing =
            matches!(&outcome, Err(Error::Remote { text, .. }) if server_closes_after(text));
        if !request.abandoned {
            let token = request.token;
            self.events.push_back(ClientEvent::Done { token, outcome });
        }
        if closing {
            // The server refused the request at its head (over a limit, malformed, TLS
            // required): it drains and closes the connection after this reply, so a reused
            // connection would fail the next request, and the requests behind it are not read.
            let error = self.behind_error("the peer refused an earlier request and closes");
            self.fail(error, CloseReason::ErrorReply);
        } else if self.write_failed && self.requests.all_queued() {
            self.end_after_write_error();
        } else {
            self.close_if_abandoned();
        }
    }

    /// The reply coming is for a request not a byte of which was handed out: the peer is out
    /// of step (or forges replies). Nothing is delivered; that request and those behind it not
    /// sent either are handed back. (One being written may be answered before the driver
    /// hears the write finish: a coalesced transmit's last bytes may still be on their way.)
    fn answered_unsent(&mut self) -> bool {
        if !self.requests.front_is_queued() {
            return false;
        }
        let error = self.behind_error("the peer answered a request it had not been sent");
        self.fail(error, CloseReason::OutOfStep);
        true
    }

    /// Writing failed and every request written was answered: nothing more can go out, so the
    /// connection ends now; what was never written is handed back.
    fn end_after_write_error(&mut self) {
        let error = self
            .write_error
            .take()
            .unwrap_or_else(|| io::Error::other("writing failed"));
        let detail = io::Error::new(error.kind(), error.to_string());
        let failed = Error::ConnectionClosed {
            peer: self.peer,
            detail: Some(detail),
        };
        self.fail(failed, CloseReason::Io(error));
    }
}
