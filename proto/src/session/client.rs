//! The client side of a PTR1 connection, without I/O.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::config::SessionConfig;
use crate::encode::Encoded;
use crate::kind::FrameKind;
use crate::limits::Limits;
use crate::message::TensorMessage;
use crate::ptr1::{self, Frame};
use crate::session::read_buf::ReadBuf;
use crate::session::receiver::{Received, Receiver, RecvError};
use crate::session::transmit::{RateMeter, Transmit};
use crate::session::{CloseReason, server_closes_after};
use crate::stats;
use crate::stripe::{CAPABILITIES_PATH, EXTENSION_STRIPE, EXTENSION_STRIPED, Framing};
use crate::transport::{ActorPath, Answer, Deadline, Error, ReceiveMemory, Reply, RequestKind};

/// One request for a client session: an encoded Ask or Tell frame and its deadline.
#[derive(Debug)]
pub struct ClientRequest {
    kind: RequestKind,
    encoded: Encoded,
    deadline: Deadline,
    /// A stripe of a striped request (not counted against a peer's busy bytes).
    stripe: bool,
}

impl ClientRequest {
    /// Encodes the request frame (the message's buffers are referenced, not copied).
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] if the message is over `limits`.
    pub fn encode(
        kind: RequestKind,
        path: &ActorPath,
        message: TensorMessage,
        limits: &Limits,
        deadline: Deadline,
    ) -> Result<Self, Error> {
        let path = path.as_str().to_owned();
        let frame = match kind {
            RequestKind::Ask => Frame::Ask { path, message },
            RequestKind::Tell => Frame::Tell { path, message },
        };
        let encoded = ptr1::encode(&frame, limits).map_err(Error::Encode)?;
        Ok(Self {
            kind,
            encoded,
            deadline,
            stripe: false,
        })
    }

    /// Encodes the request as `framing` says ([`crate::stripe`]): whole, as
    /// [`ClientRequest::encode`]; a stripe, as a Tell whose path slot is its descriptor (`kind`
    /// and `path` are not sent); a striped request, as an Ask or Tell marked striped.
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] if the frame is over `limits`.
    pub fn encode_framed(
        kind: RequestKind,
        path: &ActorPath,
        message: TensorMessage,
        framing: &Framing,
        limits: &Limits,
        deadline: Deadline,
    ) -> Result<Self, Error> {
        let (kind, frame, extension) = match framing {
            Framing::Whole => return Self::encode(kind, path, message, limits, deadline),
            Framing::Stripe(descriptor) => (
                RequestKind::Tell,
                Frame::Tell {
                    path: descriptor.to_path(),
                    message,
                },
                EXTENSION_STRIPE,
            ),
            Framing::Capabilities => (
                RequestKind::Ask,
                Frame::Ask {
                    path: CAPABILITIES_PATH.to_owned(),
                    message,
                },
                0,
            ),
            Framing::Striped => {
                let path = path.as_str().to_owned();
                let frame = match kind {
                    RequestKind::Ask => Frame::Ask { path, message },
                    RequestKind::Tell => Frame::Tell { path, message },
                };
                (kind, frame, EXTENSION_STRIPED)
            }
        };
        let encoded = ptr1::encode_extended(&frame, extension, limits).map_err(Error::Encode)?;
        Ok(Self {
            kind,
            encoded,
            deadline,
            stripe: matches!(framing, Framing::Stripe(_)),
        })
    }

    /// The bytes a client pool counts for this request against a peer's busy bytes: its
    /// frame's length, or 0 for a stripe (the stripes of one request go out at once, each on a
    /// connection of its own, however large).
    pub fn pool_bytes(&self) -> u64 {
        if self.stripe { 0 } else { self.wire_len() }
    }

    /// The request frame's length on the wire.
    pub fn wire_len(&self) -> u64 {
        self.encoded.wire_len()
    }

    /// Ask or tell.
    pub fn kind(&self) -> RequestKind {
        self.kind
    }

    /// When it gives up.
    pub fn deadline(&self) -> Deadline {
        self.deadline
    }
}

/// What a client session asks of its driver.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClientEvent {
    /// The outcome of the started request (exactly one per [`ClientSession::start`]).
    Done(Result<Answer, Error>),
    /// Close the connection (cancel what is in flight). The session is finished.
    Close(CloseReason),
}

/// One outgoing PTR1 connection: one request at a time, its one reply, then the next.
///
/// The request is written while a read is armed, so a server that rejects it mid-stream is
/// heard (its Error frame) rather than a broken pipe. A reply's kind is checked against the
/// request before any payload memory is committed. While idle the session keeps a read armed:
/// if the peer closes (or sends anything), the connection is finished and never reused. A
/// request on a connection that fails is failed, never replayed: the peer may have acted on it.
#[derive(Debug)]
pub struct ClientSession {
    config: Arc<SessionConfig>,
    receiver: Receiver,
    peer: SocketAddr,
    connected: bool,
    request: Option<Busy>,
    /// The request frame, queued for `poll_transmit` or being written.
    transmit: Option<Outgoing>,
    events: VecDeque<ClientEvent>,
    connect_until: Option<Instant>,
    head_until: Option<Instant>,
    receive_rate: RateMeter,
    send_rate: RateMeter,
    closed: bool,
}

#[derive(Debug)]
struct Busy {
    kind: RequestKind,
    deadline: Deadline,
    /// The whole request was written.
    sent: bool,
    /// Writing failed; the pending read decides (the peer's Error frame, or the close).
    write_error: Option<io::Error>,
}

#[derive(Debug)]
enum Outgoing {
    Queued(Transmit),
    Writing { remaining: u64, wire_len: u64 },
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
            request: None,
            transmit: None,
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

    /// Connecting failed: the started request (if any) fails with the error.
    pub fn handle_connect_error(&mut self, source: io::Error) {
        let peer = self.peer;
        self.fail(Error::Connect { peer, source }, CloseReason::OutOfStep);
    }

    /// Starts a request; given back if the session cannot take one now (busy, closed, or
    /// bytes are buffered that nobody asked for).
    ///
    /// # Errors
    ///
    /// The request itself, unchanged.
    pub fn start(&mut self, request: ClientRequest, now: Instant) -> Result<(), ClientRequest> {
        if self.closed || self.request.is_some() || !self.receiver.is_between_frames() {
            return Err(request);
        }
        if request.deadline.has_passed(now) {
            self.events.push_back(ClientEvent::Done(Err(request
                .deadline
                .error(request.kind.as_str()))));
            return Ok(());
        }
        self.request = Some(Busy {
            kind: request.kind,
            deadline: request.deadline,
            sent: false,
            write_error: None,
        });
        self.transmit = Some(Outgoing::Queued(Transmit::new(request.encoded)));
        Ok(())
    }

    /// The caller gave up on the started request: the connection is closed (the peer may have
    /// seen all, part or none of the request).
    pub fn cancel(&mut self) {
        if self.request.is_some() {
            self.fail(Error::Cancelled, CloseReason::OutOfStep);
        }
    }

    /// Closes the session (the node is shutting down); a started request fails with
    /// [`Error::Shutdown`].
    pub fn shut_down(&mut self) {
        self.fail(Error::Shutdown, CloseReason::Shutdown);
        self.close(CloseReason::Shutdown);
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
        if self.request.is_none() {
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

    /// The request frame to write, if it has not been handed out yet.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        if !self.connected {
            return None;
        }
        let Some(Outgoing::Queued(_)) = &self.transmit else {
            return None;
        };
        let Some(Outgoing::Queued(transmit)) = self.transmit.take() else {
            return None;
        };
        self.transmit = Some(Outgoing::Writing {
            remaining: transmit.remaining(),
            wire_len: transmit.wire_len(),
        });
        self.send_rate.start(now);
        Some(transmit)
    }

    /// `n` more bytes of the request were written.
    pub fn handle_written(&mut self, n: usize, now: Instant) {
        let Some(Outgoing::Writing {
            remaining,
            wire_len,
        }) = &mut self.transmit
        else {
            return;
        };
        self.send_rate.progress(n);
        *remaining = remaining.saturating_sub(crate::len::len_u64(n));
        if *remaining > 0 {
            return;
        }
        stats::global().record_raw_frame_sent(*wire_len);
        self.transmit = None;
        self.send_rate.stop();
        if let Some(request) = &mut self.request {
            request.sent = true;
        }
        self.drive(now);
    }

    /// Writing the request failed. The read decides: the peer may have answered (an Error
    /// frame saying why it stopped reading) before it closed.
    pub fn handle_write_error(&mut self, error: io::Error, now: Instant) {
        self.transmit = None;
        self.send_rate.stop();
        match &mut self.request {
            Some(request) => request.write_error = Some(error),
            None => return self.close(CloseReason::Io(error)),
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
            self.request.as_ref().and_then(|r| r.deadline.at()),
            self.head_until,
            self.receive_rate.deadline(),
            self.send_rate.deadline(),
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
        let connect_timeout = Error::Timeout {
            what: "connect",
            after: config.connect_timeout,
        };
        let connect_passed = self.connect_until.is_some_and(|at| at <= now);
        let Some(request) = &self.request else {
            // No request waits for this connection, but a connect that takes too long is
            // given up all the same.
            if connect_passed {
                self.close(CloseReason::Timeout {
                    phase: "connect",
                    after: config.connect_timeout,
                });
            }
            return;
        };
        let (kind, deadline) = (request.kind, request.deadline);
        let error = if connect_passed {
            connect_timeout
        } else if deadline.has_passed(now) {
            deadline.error(kind.as_str())
        } else if self.head_until.is_some_and(|at| at <= now) {
            Error::Timeout {
                what: "the reply's head",
                after: config.head_timeout,
            }
        } else if !self.receive_rate.check(now) {
            Error::Timeout {
                what: "the reply (below the minimum rate)",
                after: config.rate_window,
            }
        } else if !self.send_rate.check(now) {
            Error::Timeout {
                what: "writing the request (the peer is not reading)",
                after: config.rate_window,
            }
        } else {
            return;
        };
        self.fail(error, CloseReason::OutOfStep);
    }

    /// Whether the session is finished.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Whether a request can be started now: idle, in step, nothing buffered.
    pub fn is_reusable(&self) -> bool {
        !self.closed
            && self.connected
            && self.request.is_none()
            && self.receiver.is_between_frames()
    }

    fn drive(&mut self, now: Instant) {
        while !self.closed && self.request.is_some() {
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
                }
                Received::Closed => {
                    let detail = self.request.as_mut().and_then(|r| r.write_error.take());
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

    /// A reply's head is in: its kind must fit the request before payload memory is committed.
    fn routed(&mut self, kind: FrameKind) {
        self.head_until = None;
        let Some(request) = &self.request else {
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

    fn finish(&mut self, frame: Frame) {
        self.receive_rate.stop();
        self.head_until = None;
        let Some(request) = self.request.take() else {
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
        self.events.push_back(ClientEvent::Done(outcome));
        if !request.sent {
            // The peer answered before taking the whole request: the stream is out of step.
            self.transmit = None;
            self.close(CloseReason::OutOfStep);
        } else if closing {
            // The server refused the request at its head (over a limit, malformed, TLS
            // required): it drains and closes the connection after this reply, so a reused
            // connection would fail the next request.
            self.close(CloseReason::ErrorReply);
        }
    }

    fn recv_error(&self, error: RecvError) -> Error {
        let peer = self.peer;
        match error {
            RecvError::Wire(source) => Error::Protocol { peer, source },
            RecvError::Truncated { received } => Error::ConnectionClosed {
                peer,
                detail: Some(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("closed after {received} bytes of the reply"),
                )),
            },
            RecvError::Io(e) => Error::ConnectionClosed {
                peer,
                detail: Some(e),
            },
            RecvError::Memory(text) => Error::Memory(text),
        }
    }

    /// Fails the started request (if any) with `error` and closes.
    fn fail(&mut self, error: Error, reason: CloseReason) {
        if self.request.take().is_some() {
            self.events.push_back(ClientEvent::Done(Err(error)));
        }
        self.close(reason);
    }

    fn close(&mut self, reason: CloseReason) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.transmit = None;
        self.events.push_back(ClientEvent::Close(reason));
    }
}
