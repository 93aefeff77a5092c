//! PTR1 connections as state machines: what a connection means, written once, without I/O.
//!
//! A driver (io_uring, tokio, blocking system calls) owns the socket and moves bytes; a
//! session decides everything else. The contract, as in quinn-proto:
//!
//! - inputs are `handle_*` calls with the time passed in (`handle_read`, `handle_written`,
//!   `handle_answer`, `handle_timeout`, …);
//! - outputs are drained with `poll_*`: [`ServerSession::poll_read`] lends memory for the next
//!   read ([`ReadBuf`]: per-connection scratch, or the unfilled part of final receive memory),
//!   `poll_transmit` hands out the next frame to write ([`Transmit`]), `poll_event` says what
//!   the node or the driver must do, `poll_timeout` when to call back.
//!
//! [`ServerSession`] serves one accepted connection, [`ClientSession`] carries requests over
//! one outgoing connection, and [`ConnectionPool`] is the per-peer policy for reusing them.
//! Sessions read no clock, start no threads and never block; they are tested against each
//! other in memory with virtual time.

mod client;
mod driven;
mod pool;
mod read_buf;
mod receiver;
mod server;
mod transmit;

#[cfg(test)]
mod tests;

use std::fmt;
use std::io;
use std::time::Duration;

pub use crate::config::{ConnectionPoolConfig, Keepalive, SessionConfig};
pub use crate::transport::{
    ASSEMBLY_TTL, DEFAULT_MAX_STRIPES, MAX_ASSEMBLIES, MAX_ASSEMBLIES_PER_PEER, MIN_ASSEMBLY_RATE,
    StripeStore,
};
pub use client::{ClientEvent, ClientRequest, ClientSession, RequestToken};
pub use driven::DrivenSession;
pub use pool::{Checkin, Checkout, ConnectionPool, Expired, MAX_PIPELINED_BYTES, WaiterId};
pub use read_buf::ReadBuf;
pub use server::{ServerEvent, ServerSession};
pub use transmit::{RateMeter, Transmit};

use crate::encode::Encoded;
use crate::error::WireError;
use crate::limits::Limits;
use crate::ptr1::{self, Frame};
use crate::transport::{self, format_duration};
use receiver::RecvError;

/// Why a session closed its connection (for logs and statistics).
#[derive(Debug)]
#[non_exhaustive]
pub enum CloseReason {
    /// The peer closed the connection.
    PeerClosed,
    /// A deadline passed.
    Timeout {
        /// What took too long.
        phase: &'static str,
        /// The time allowed.
        after: Duration,
    },
    /// A transfer fell below the minimum rate.
    TooSlow {
        /// What was too slow.
        what: &'static str,
    },
    /// The drain after an error reply ended.
    Drained,
    /// The peer sent bytes that are not a valid frame (and could not be told).
    Protocol(WireError),
    /// The peer closed in the middle of a frame.
    Truncated {
        /// Bytes of the frame that arrived.
        received: u64,
    },
    /// The socket failed.
    Io(io::Error),
    /// Receive memory could not be had.
    Memory(String),
    /// Not even a short error reply fits the configured limits.
    ReplyTooLarge,
    /// Bytes arrived on an idle client connection that nobody asked for.
    UnexpectedData,
    /// A request on the connection failed or was cancelled mid-exchange: the stream is out
    /// of step.
    OutOfStep,
    /// The peer refused the request at its head and closes the connection after its Error
    /// reply (see [`server_closes_after`]), so it is not reused.
    ErrorReply,
    /// The node is shutting down.
    Shutdown,
}

impl CloseReason {
    fn from_recv(error: RecvError) -> Self {
        match error {
            RecvError::Wire(e) => Self::Protocol(e),
            RecvError::Truncated { received } => Self::Truncated { received },
            RecvError::Io(e) => Self::Io(e),
            RecvError::Memory(text) => Self::Memory(text),
        }
    }
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PeerClosed => f.write_str("the peer closed the connection"),
            Self::Timeout { phase, after } => {
                write!(f, "{phase} deadline of {} passed", format_duration(*after))
            }
            Self::TooSlow { what } => write!(f, "{what} fell below the minimum rate"),
            Self::Drained => f.write_str("drain after an error reply ended"),
            Self::Protocol(e) => write!(f, "invalid frame: {e}"),
            Self::Truncated { received } => {
                write!(f, "the peer closed after {received} bytes of a frame")
            }
            Self::Io(e) => write!(f, "socket error: {e}"),
            Self::Memory(text) => write!(f, "out of receive memory: {text}"),
            Self::ReplyTooLarge => f.write_str("not even an error reply fits the limits"),
            Self::UnexpectedData => f.write_str("unexpected bytes on an idle connection"),
            Self::OutOfStep => f.write_str("the exchange was cut short"),
            Self::ErrorReply => f.write_str("the peer refused the request and closes"),
            Self::Shutdown => f.write_str("the node is shutting down"),
        }
    }
}

/// Whether a server that sent this Error text closes the connection after it.
pub(crate) fn server_closes_after(text: &str) -> bool {
    text.starts_with(transport::REJECTED) || text.starts_with(transport::REQUIRES_TLS)
}

/// Encodes a reply; one over the limits becomes an Error frame saying so, and an error text
/// longer than [`Limits::MAX_ERROR_TEXT_BYTES`] is cut. `None` if not even that fits (it
/// always does: Error replies are encoded with [`Limits::for_error_replies`]).
pub(crate) fn encode_reply(frame: &Frame, limits: &Limits) -> Option<Encoded> {
    let version = frame.version();
    let error = |text: String| {
        let text = truncate(text);
        ptr1::encode(&Frame::Error { version, text }, limits)
    };
    match frame {
        Frame::Error { text, .. } => error(text.clone()),
        _ => {
            ptr1::encode(frame, limits).or_else(|e| error(format!("reply could not be sent: {e}")))
        }
    }
    .ok()
}

/// Shortens an error text to what an Error reply carries (at a character boundary).
fn truncate(mut text: String) -> String {
    let max = usize::try_from(Limits::MAX_ERROR_TEXT_BYTES).unwrap_or(usize::MAX);
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}
