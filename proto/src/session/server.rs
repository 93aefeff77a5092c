//! The server side of a PTR1 connection, without I/O.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::time::Instant;

use crate::config::SessionConfig;
use crate::kind::FrameKind;
use crate::ptr1::Frame;
use crate::session::read_buf::ReadBuf;
use crate::session::receiver::{Received, Receiver, RecvError};
use crate::session::transmit::{RateMeter, Transmit};
use crate::session::{CloseReason, encode_reply};
use crate::stats;
use crate::transport::StripeStore;
mod deadlines;
mod event;
mod replies;
mod striped;

pub use event::ServerEvent;
use replies::Replies;
#[cfg(test)]
pub(crate) use replies::{PIPELINED_REPLIES, PIPELINED_REPLY_BYTES};

use crate::transport::{
    InboundRequest, REJECTED, REQUIRES_TLS, ReceiveMemory, Reply, RequestKind, format_duration,
};

/// One accepted PTR1 connection: requests in, replies out, in order.
///
/// A request is read (head, path, then payload into final memory), admitted by the node
/// ([`ServerEvent::Admit`]) before any payload memory is committed, delivered
/// ([`ServerEvent::Request`]) and answered: an ask with the handler's reply, a tell with an
/// Ack once it is in the mailbox (a full mailbox delays it: backpressure). One request is
/// with the node at a time: bytes of the next are buffered, not parsed, until it is answered.
/// A client that pipelines (sends requests without waiting for replies) has its next request
/// read while earlier replies are still being written, and the replies that are ready go out
/// together in one transmit. Replies not yet written are bounded (64 of them or 1 MiB: past
/// that no request is read until they are out; a reply that large alone is written before the
/// next request is read, as for a client that does not pipeline), and go out in the order of
/// their requests.
/// Every error the peer can still be told about is sent as an Error frame; after a malformed
/// frame the write side is shut down and input discarded for a bounded time.
///
/// Deadlines: the preface, each request's head, a minimum rate for its body and for the reply
/// being written, the wait for mailbox space, idleness between requests, and the drain.
#[derive(Debug)]
pub struct ServerSession {
    config: Arc<SessionConfig>,
    receiver: Receiver,
    require_tls: bool,
    /// The request being answered.
    request: Option<Outstanding>,
    /// Replies queued and being written, in the order of their requests.
    replies: Replies,
    /// After the replies queued: shut down the write side and drain.
    drain_after_reply: bool,
    /// After the replies queued: close (the peer is gone or the stream unusable, but replies
    /// to requests the node acted on still go out first).
    close_after_replies: Option<CloseReason>,
    /// The node closes gracefully: close once nothing is outstanding ([`ServerSession::finish`]).
    finishing: bool,
    draining_since: Option<Instant>,
    /// A request waiting for `admit`: its version.
    admitting: Option<u32>,
    next_seq: u64,
    events: VecDeque<ServerEvent>,
    preface_until: Option<Instant>,
    head_until: Option<Instant>,
    idle_since: Option<Instant>,
    /// When the peer finished sending while its request was with the handler: the answer is
    /// still written (a half-closed peer reads it), but only for `idle_timeout` more.
    peer_finished_at: Option<Instant>,
    receive_rate: RateMeter,
    send_rate: RateMeter,
    closed: bool,
    /// Where stripes go; `None`: this node does not take them (it answers their frames, and
    /// the capabilities path, as a node that never heard of them).
    stripes: Option<Arc<StripeStore>>,
    /// The peer's host, whose bound a stripe begun here counts against.
    stripes_peer: std::net::IpAddr,
    /// What the frame being received is.
    incoming: Incoming,
}

/// What the frame being received is, as far as striping goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Incoming {
    /// A plain request.
    Plain,
    /// A stripe: its parts go into the stripe store; it is acknowledged, never delivered.
    Stripe,
    /// A striped request: put together from its stripes before it is delivered.
    Striped,
}

#[derive(Debug)]
struct Outstanding {
    seq: u64,
    kind: RequestKind,
    version: u32,
    path: String,
    /// Since when it waits for mailbox space (`None` once it is in the mailbox).
    waiting_since: Option<Instant>,
    /// Its wait was given up; the driver says whether it was withdrawn in time.
    withdrawing: bool,
}

impl ServerSession {
    /// A session for a newly accepted connection. With `require_tls`, PTR1 requests are
    /// answered with an Error frame saying so, then the connection is closed.
    pub fn new(
        config: Arc<SessionConfig>,
        memory: Arc<dyn ReceiveMemory>,
        require_tls: bool,
        now: Instant,
    ) -> Self {
        Self {
            receiver: Receiver::new(Arc::clone(&config), memory, true),
            require_tls,
            request: None,
            replies: Replies::default(),
            drain_after_reply: false,
            close_after_replies: None,
            finishing: false,
            draining_since: None,
            admitting: None,
            next_seq: 0,
            events: VecDeque::new(),
            preface_until: now.checked_add(config.preface_timeout),
            head_until: None,
            idle_since: None,
            peer_finished_at: None,
            receive_rate: RateMeter::new(config.min_rate, config.rate_window),
            send_rate: RateMeter::new(config.min_rate, config.rate_window),
            closed: false,
            stripes: None,
            stripes_peer: std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            incoming: Incoming::Plain,
            config,
        }
    }

    /// Memory for the next read, if one is wanted now.
    pub fn poll_read(&mut self) -> Option<ReadBuf> {
        if self.closed {
            return None;
        }
        self.receiver.poll_read()
    }

    /// A read finished: `Ok(n)` bytes arrived in `buf`'s regions (0 = the peer finished
    /// sending), or it failed.
    pub fn handle_read(&mut self, buf: ReadBuf, result: io::Result<usize>, now: Instant) {
        let n = result.as_ref().map_or(0, |n| *n);
        self.receiver.handle_read(buf, result);
        if self.closed {
            return;
        }
        if self.receiver.peer_gone() && self.request.is_some() {
            if self.waiting_seq().is_some() || self.receiver.read_failed() {
                // Nobody is left to tell whether a request still waiting for mailbox space got
                // in, or to read the answer of a connection that failed; replies to the
                // requests before it (a client that pipelined) still go out.
                return self.close_after_replies(CloseReason::PeerClosed);
            }
            self.peer_finished_at.get_or_insert(now);
        }
        self.drive(now);
        // Counted after the frame's start was seen, so the read that started it counts too.
        self.receive_rate.progress(n);
    }

    /// The node's answer to [`ServerEvent::Admit`]: `Err(text)` refuses the request (the peer
    /// is told `text`; its payload is skipped without committing memory).
    pub fn admit(&mut self, result: Result<(), String>, now: Instant) {
        let Some(version) = self.admitting.take() else {
            return;
        };
        match result {
            Ok(()) => self.receiver.admit(),
            Err(text) => {
                self.receiver.refuse();
                self.queue_reply(Frame::Error { version, text });
            }
        }
        self.drive(now);
    }

    /// Request `seq` is in its endpoint's mailbox: a tell is acknowledged now.
    pub fn handle_enqueued(&mut self, seq: u64, now: Instant) {
        let Some(request) = self.request.as_mut().filter(|r| r.seq == seq) else {
            return;
        };
        request.waiting_since = None;
        request.withdrawing = false;
        if request.kind == RequestKind::Tell {
            let version = request.version;
            self.request = None;
            self.queue_reply(Frame::Ack { version });
        }
        self.drive(now);
    }

    /// Whether the wait of request `seq` was withdrawn (after [`ServerEvent::Withdraw`]):
    /// `true` tells the peer it was not delivered; `false` means it got in meanwhile, and it
    /// goes on as if [`ServerSession::handle_enqueued`] had been called.
    pub fn handle_withdrawn(&mut self, seq: u64, withdrawn: bool, now: Instant) {
        let Some(request) = self
            .request
            .as_mut()
            .filter(|r| r.seq == seq && r.withdrawing)
        else {
            return;
        };
        request.withdrawing = false;
        if !withdrawn {
            return self.handle_enqueued(seq, now);
        }
        let Some(request) = self.request.take() else {
            return;
        };
        let text = format!(
            "the mailbox of {} stayed full for {}; the {} was not delivered",
            request.path,
            format_duration(self.config.enqueue_timeout),
            request.kind
        );
        self.queue_reply(Frame::Error {
            version: request.version,
            text,
        });
        self.drive(now);
    }

    /// The answer to request `seq`: the handler's reply (asks) or a failure (`Err(text)`
    /// reaches the peer as an Error frame). A late answer to an earlier request is ignored.
    pub fn handle_answer(&mut self, seq: u64, answer: Result<Reply, String>, now: Instant) {
        let Some(request) = self.request.take_if(|r| r.seq == seq) else {
            return;
        };
        self.peer_finished_at = None;
        let version = request.version;
        let frame = match (request.kind, answer) {
            (_, Err(text)) => Frame::Error { version, text },
            (RequestKind::Tell, Ok(_)) => Frame::Ack { version },
            (RequestKind::Ask, Ok(Reply::Tensor(message))) => Frame::TensorResponse(message),
            (RequestKind::Ask, Ok(Reply::Single { msg_type, data })) => Frame::SingleResponse {
                version,
                msg_type,
                data,
            },
        };
        self.queue_reply(frame);
        self.drive(now);
    }

    /// The replies to write next (every one ready, up to a bound), if any and none is being
    /// written; report progress with [`ServerSession::handle_written`].
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        let transmit = self.replies.transmit()?;
        self.send_rate.start(now);
        Some(transmit)
    }

    /// `n` more bytes of the transmit were written.
    pub fn handle_written(&mut self, n: usize, now: Instant) {
        if !self.replies.is_writing() {
            return;
        }
        self.send_rate.progress(n);
        if !self.replies.written(crate::len::len_u64(n)) {
            return;
        }
        self.send_rate.stop();
        if !self.replies.is_empty() {
            return self.drive(now);
        }
        if let Some(reason) = self.close_after_replies.take() {
            return self.close(reason);
        }
        if self.drain_after_reply {
            self.events.push_back(ServerEvent::ShutdownWrite);
            self.receiver.drain();
            self.draining_since = Some(now);
            self.drive(now);
            return;
        }
        self.drive(now);
    }

    /// Writing failed: the connection is closed.
    pub fn handle_write_error(&mut self, error: io::Error) {
        self.close(CloseReason::Io(error));
    }

    /// The next event for the driver.
    pub fn poll_event(&mut self) -> Option<ServerEvent> {
        self.events.pop_front()
    }

    /// Closes the session (the node is shutting down); a request still waiting for mailbox
    /// space is withdrawn.
    pub fn shut_down(&mut self) {
        self.close(CloseReason::Shutdown);
    }

    /// The node closes gracefully: the request in progress (one being received, one with the
    /// handler, or one whose reply is being written) is finished, then the session closes
    /// ([`ServerEvent::Close`] with [`CloseReason::Shutdown`]); an idle session closes now.
    /// Requests that start afterwards are for the node to refuse at [`ServerEvent::Admit`].
    pub fn finish(&mut self, now: Instant) {
        self.finishing = true;
        self.drive(now);
    }

    /// Whether [`ServerSession::finish`] was called.
    pub fn is_finishing(&self) -> bool {
        self.finishing
    }

    /// Whether the session is finished (closed or handed off).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Runs the receiver until it needs more bytes or a decision.
    fn drive(&mut self, now: Instant) {
        while !self.closed {
            // A peer that finished sending still gets the replies it asked for before its
            // close is acted on.
            let gone = self.receiver.peer_gone() && !self.replies.is_empty();
            self.receiver.hold(
                self.request.is_some()
                    || self.drain_after_reply
                    || self.close_after_replies.is_some()
                    || gone
                    || self.replies.full(),
            );
            let Some(received) = self.receiver.next() else {
                break;
            };
            match received {
                Received::ForeignPreface(preface) => {
                    self.closed = true;
                    self.events.push_back(ServerEvent::HandOff { preface });
                }
                Received::Started => {
                    if self.preface_until.take().is_some() {
                        stats::global().record_raw_connection_accepted();
                    }
                    self.idle_since = None;
                    self.head_until = now.checked_add(self.config.head_timeout);
                    self.receive_rate.start(now);
                }
                Received::Routed {
                    kind,
                    version,
                    extension,
                } => self.routed(kind, version, extension, now),
                Received::Frame { frame, wire_len } => {
                    stats::global().record_raw_frame_received(wire_len);
                    self.receive_rate.stop();
                    self.dispatch(frame, now);
                }
                Received::Skipped => self.receive_rate.stop(),
                Received::Closed => self.close(CloseReason::PeerClosed),
                Received::Failed { error, version } => self.failed(error, version),
            }
        }
        let idle = !self.closed
            && self.request.is_none()
            && self.replies.is_empty()
            && self.admitting.is_none()
            && self.draining_since.is_none()
            && self.preface_until.is_none()
            && self.receiver.is_between_frames();
        if !idle {
            self.idle_since = None;
        } else if self.idle_since.is_none() {
            self.idle_since = Some(now);
        }
        let nothing_outstanding = self.request.is_none()
            && self.replies.is_empty()
            && self.admitting.is_none()
            && self.draining_since.is_none()
            && self.receiver.has_nothing_started();
        if self.finishing && nothing_outstanding {
            // Every reply is with the kernel: closing now sends them, then FIN.
            self.close(CloseReason::Shutdown);
        }
    }

    fn routed(&mut self, kind: FrameKind, version: u32, extension: u8, now: Instant) {
        self.head_until = None;
        self.incoming = Incoming::Plain;
        let kind = match kind {
            _ if self.require_tls => {
                self.receiver.refuse();
                self.drain_after_reply = true;
                let text = format!("{REQUIRES_TLS}plaintext PTR1 is refused; connect with TLS");
                return self.queue_reply(Frame::Error { version, text });
            }
            FrameKind::Ask => RequestKind::Ask,
            FrameKind::Tell => RequestKind::Tell,
            other => {
                self.receiver.refuse();
                let text = format!("unexpected request frame: {other} (requests are Ask or Tell)");
                return self.queue_reply(Frame::Error { version, text });
            }
        };
        let path = self.receiver.path().unwrap_or_default().to_owned();
        if self.answered_striping(kind, extension, &path, version, now) {
            return;
        }
        self.admitting = Some(version);
        self.events.push_back(ServerEvent::Admit { kind, path });
    }

    fn dispatch(&mut self, frame: Frame, now: Instant) {
        let (kind, path, mut message) = match frame {
            Frame::Ask { path, message } => (RequestKind::Ask, path, message),
            Frame::Tell { path, message } => (RequestKind::Tell, path, message),
            // Other kinds were refused when their head arrived.
            _ => return,
        };
        let version = message.version;
        match std::mem::replace(&mut self.incoming, Incoming::Plain) {
            Incoming::Plain => {}
            Incoming::Stripe => {
                // Its parts are in place (done as the frame completed): acknowledged here,
                // never delivered.
                stats::global().record_stripe_received();
                return self.queue_reply(Frame::Ack { version });
            }
            Incoming::Striped => match self.put_together(message, now) {
                Ok(whole) => {
                    stats::global().record_striped_request_received();
                    message = whole;
                }
                Err(text) => return self.queue_reply(Frame::Error { version, text }),
            },
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.request = Some(Outstanding {
            seq,
            kind,
            version: message.version,
            path: path.clone(),
            waiting_since: Some(now),
            withdrawing: false,
        });
        self.receiver.hold(true);
        if self.receiver.peer_gone() {
            // Read from what was buffered before the peer finished (it pipelined): its answer
            // is written only for `idle_timeout` more, as for the request the end found.
            self.peer_finished_at.get_or_insert(now);
        }
        let request = InboundRequest::new(kind, path, message);
        self.events.push_back(ServerEvent::Request { seq, request });
    }

    fn failed(&mut self, error: RecvError, version: Option<u32>) {
        self.receive_rate.stop();
        self.head_until = None;
        let text = match &error {
            RecvError::Wire(e) => format!("{REJECTED}{e}"),
            RecvError::Memory(text) => format!("{REJECTED}{text}"),
            RecvError::Truncated { .. } | RecvError::Io(_) => {
                return self.close_after_replies(CloseReason::from_recv(error));
            }
        };
        match version {
            Some(version) => {
                // The header was readable: tell the peer before closing.
                self.request = None;
                self.drain_after_reply = true;
                self.queue_reply(Frame::Error { version, text });
            }
            // Nothing to tell the peer with; replies to earlier requests still go out, then
            // the write side is shut and input drained, so they are not lost to a reset.
            None if !self.replies.is_empty() => self.drain_after_reply = true,
            None => self.close(CloseReason::from_recv(error)),
        }
    }

    /// Closes once the replies queued are written (at once if there are none): the request
    /// with the node (if any) is given up — withdrawn if it waits for mailbox space — and no
    /// more input is read.
    fn close_after_replies(&mut self, reason: CloseReason) {
        if self.replies.is_empty() {
            return self.close(reason);
        }
        if let Some(seq) = self.waiting_seq() {
            self.events.push_back(ServerEvent::Withdraw { seq });
        }
        self.request = None;
        self.close_after_replies = Some(reason);
    }

    fn queue_reply(&mut self, frame: Frame) {
        match encode_reply(&frame, &self.config.limits) {
            Some(encoded) => self.replies.push(encoded),
            // Not even a short error text fits the configured limits.
            None => self.close(CloseReason::ReplyTooLarge),
        }
    }

    fn waiting_since(&self) -> Option<Instant> {
        self.request.as_ref().and_then(|r| r.waiting_since)
    }

    fn waiting_seq(&self) -> Option<u64> {
        self.request
            .as_ref()
            .filter(|r| r.waiting_since.is_some() || r.withdrawing)
            .map(|r| r.seq)
    }

    fn close(&mut self, reason: CloseReason) {
        if self.closed {
            return;
        }
        if let Some(seq) = self.waiting_seq() {
            self.events.push_back(ServerEvent::Withdraw { seq });
        }
        self.closed = true;
        self.events.push_back(ServerEvent::Close(reason));
    }
}
