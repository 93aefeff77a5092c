//! Why a request failed, why a connection closed, why a send was refused.

use std::time::Duration;

use crate::shm::bounds::OverBound;
use crate::shm::queue::QueueError;
use crate::shm::wire::MAX_DATAGRAM;

use super::Role;

/// Why a request failed without an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Its deadline passed.
    Deadline,
    /// The connection closed first.
    Closed(CloseReason),
    /// The answer came but names memory this side cannot read (the text says why).
    Unreadable(String),
}

/// Why a connection closed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CloseReason {
    /// The peer hung up (or its process exited).
    #[error("the shared-memory peer closed the connection")]
    PeerClosed,
    /// This node shut the connection down.
    #[error("the connection was shut down")]
    Shutdown,
    /// The peer broke the protocol.
    #[error("the shared-memory peer broke the protocol: {0}")]
    Protocol(String),
    /// The peer broke the queue format.
    #[error("the shared-memory peer broke the queue format: {0}")]
    Queue(QueueError),
    /// The peer ran into one of its bounds.
    #[error("the shared-memory peer passed a bound: {0}")]
    OverBound(OverBound),
    /// Messages for the peer waited this long without progress (it stopped reading).
    #[error("the shared-memory peer made no progress reading for {after:?} (stalled)")]
    Stalled {
        /// How long.
        after: Duration,
    },
    /// The peer stopped reading its replies while this node kept answering.
    #[error("the shared-memory peer does not read its replies ({queued} bytes queued)")]
    NotReading {
        /// Bytes queued when it closed.
        queued: u64,
    },
    /// A local resource failed (the text says which).
    #[error("{0}")]
    Local(String),
}

/// Why a send was refused (nothing was sent).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The connection is closed.
    #[error("the shared-memory connection is closed ({0})")]
    Closed(CloseReason),
    /// The deadline passed already.
    #[error("the deadline passed before the request was sent")]
    Deadline,
    /// Too many requests are outstanding on this connection.
    #[error("{0} requests are already outstanding on this shared-memory connection")]
    TooManyInFlight(usize),
    /// The peer does not read what is queued for it.
    #[error("the shared-memory peer is not reading ({0} bytes queued for it)")]
    PeerNotReading(u64),
    /// The message does not fit in one control message (the driver lays it out in shared
    /// memory instead).
    #[error("a control message of {0} bytes is larger than {MAX_DATAGRAM}")]
    TooLarge(usize),
    /// This end's role does not send that (a server sends no requests).
    #[error("a {0:?} connection does not send that")]
    WrongRole(Role),
}
