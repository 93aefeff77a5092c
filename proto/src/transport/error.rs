//! The one error type of tensorwire's transports and nodes, grouped by whose fault it is.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use super::remote::{LimitSide, OverLimit, RemoteKind};
use crate::error::{ConfigError, LimitExceeded, WireError};

/// Everything that can go wrong sending, receiving or serving a request, on any transport.
///
/// Variants are grouped by fault: the caller's misuse, the peer or the remote endpoint, and
/// local resources. `Display` texts say what failed and where; they are for people. Programs
/// classify with the predicates ([`Error::is_timeout`], [`Error::is_connection`],
/// [`Error::is_remote`], [`Error::is_limit`], …).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- caller misuse ----
    /// An actor path must be `/actors/{name}` or `/named/{path}` with a non-empty name (a
    /// bare name `echo` means `/actors/echo`).
    #[error("invalid actor path {path:?}: expected a name, /actors/{{name}} or /named/{{path}}")]
    InvalidPath {
        /// The path given.
        path: String,
    },
    /// An endpoint with this path is already registered on the node.
    #[error("an endpoint at {path} already exists on this node")]
    EndpointExists {
        /// The endpoint's actor path.
        path: String,
    },
    /// The message cannot be sent: it is over a limit of this node (checked before anything
    /// was sent).
    #[error("cannot send the message: {0}")]
    Encode(WireError),
    /// Invalid configuration (including environment variables).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The API was used in a way it does not support.
    #[error("{0}")]
    Misuse(String),

    // ---- the peer or the remote endpoint ----
    /// The remote side answered with an error (its handler failed, it has no such endpoint,
    /// it refused the request); its text is kept.
    #[error("remote error from {}: {text}", peer.map_or_else(|| "the endpoint".to_owned(), |p| p.to_string()))]
    Remote {
        /// The peer, when the request crossed a socket.
        peer: Option<SocketAddr>,
        /// The error text the peer sent.
        text: String,
    },
    /// The peer sent bytes that are not a valid frame.
    #[error("peer {peer} sent an invalid frame: {source}")]
    Protocol {
        /// The peer.
        peer: SocketAddr,
        /// What was wrong.
        source: WireError,
    },
    /// The peer answered with a frame kind that does not fit the request.
    #[error("peer {peer} answered a {request} with an unexpected {reply} frame")]
    UnexpectedReply {
        /// The peer.
        peer: SocketAddr,
        /// The request kind.
        request: &'static str,
        /// The reply kind received.
        reply: &'static str,
    },
    /// The connection closed (or was reset) before the reply arrived. The request may or may
    /// not have been delivered; it is never replayed.
    #[error("connection to {peer} closed before the reply arrived{}", detail.as_ref().map(|e| format!(" ({e})")).unwrap_or_default())]
    ConnectionClosed {
        /// The peer.
        peer: SocketAddr,
        /// The OS error or what was seen, if anything.
        detail: Option<io::Error>,
    },
    /// Connecting to the peer failed.
    #[error("cannot connect to {peer}: {source}")]
    Connect {
        /// The peer.
        peer: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// The TLS handshake with the peer failed: its certificate is not trusted or not valid
    /// for the name, it did not agree on `h2`, or it refused ours.
    #[error("TLS with {peer} failed: {reason}")]
    Tls {
        /// The peer.
        peer: SocketAddr,
        /// What rustls (or the ALPN check) reported.
        reason: String,
    },
    /// A deadline passed. For a request, it may or may not have been delivered.
    #[error("{what} timed out after {}", format_duration(*after))]
    Timeout {
        /// What timed out (`"ask"`, `"tell"`, `"connect"`, …).
        what: &'static str,
        /// The time that was allowed.
        after: Duration,
    },
    /// No endpoint is registered at this path (sends within the process).
    #[error("no endpoint at path {path:?}")]
    UnknownEndpoint {
        /// The path.
        path: String,
    },

    // ---- local resources ----
    /// No transport can carry the request here: the primary driver cannot start (the reason
    /// says why) and no fallback is plugged in (the hint says how to plug one).
    #[error("the {driver} driver is unavailable ({reason}); {hint}")]
    DriverUnavailable {
        /// The driver that could not start (`"io_uring"`).
        driver: &'static str,
        /// Why it could not start.
        reason: String,
        /// What to do about it.
        hint: &'static str,
    },
    /// The driver carrying the request failed: a core thread's ring failed, or a panic was
    /// caught while it served this request's connection (the reason says which; the node logs
    /// it). The request may or may not have been delivered; it is never replayed.
    #[error(
        "the {driver} driver failed ({reason}); the request may or may not have been delivered"
    )]
    DriverFailed {
        /// The driver (`"io_uring"`).
        driver: &'static str,
        /// What failed.
        reason: String,
    },
    /// The transport carrying the request dropped it without an answer (a defect of that
    /// transport, logged where it is seen). It may or may not have been delivered.
    #[error(
        "the transport carrying the request dropped it without an answer; it may or may not have been delivered"
    )]
    Abandoned,
    /// A system call failed.
    #[error("{op} failed: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// Receive memory could not be had: the budget for frames still arriving is used up, or an
    /// allocation failed.
    #[error("out of receive memory: {0}")]
    Memory(String),
    /// A bounded queue is full; the request was not started and may be retried.
    #[error("{what} is full ({capacity} entries); retry later")]
    Overloaded {
        /// Which queue.
        what: &'static str,
        /// Its capacity.
        capacity: usize,
    },
    /// The caller asked for one path and the router cannot take it for this peer (no silent
    /// fallback to another path): the reason says why.
    #[error("the {route} path is not available: {reason}")]
    RouteUnavailable {
        /// The path asked for (`shm`, `raw`, `http2`, `local`).
        route: &'static str,
        /// Why not.
        reason: String,
    },
    /// Every slot of this node's shared memory is held by receivers and no credit came back
    /// in time (the node is configured to refuse rather than fall back to TCP).
    #[error("shared memory is full: {reason}")]
    SharedMemoryFull {
        /// What is held, and for how long the send waited.
        reason: String,
    },
    /// The node is shutting down or has shut down.
    #[error("the node is shut down")]
    Shutdown,
    /// The node was made by another process: this process is a child made by `fork()`, which
    /// inherited a copy of the node but none of its threads. Every call on it fails at once;
    /// the child makes a node of its own.
    #[error(
        "this node belongs to process {owner} and this is process {current}, a child made by \
         fork(): a child inherits a copy of the node without its threads, so the node cannot \
         be used here; make a new node in the child"
    )]
    Forked {
        /// The process that made the node.
        owner: u32,
        /// This process.
        current: u32,
    },
    /// The endpoint's mailbox is closed (the endpoint was dropped or the node shut down).
    #[error("the endpoint's mailbox is closed")]
    MailboxClosed,
    /// The request was cancelled by its caller.
    #[error("the request was cancelled")]
    Cancelled,
}

impl Error {
    /// Whether a deadline passed.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. })
    }

    /// Whether connecting failed (TLS included) or the connection broke before the reply
    /// arrived.
    pub fn is_connection(&self) -> bool {
        matches!(
            self,
            Self::Connect { .. } | Self::ConnectionClosed { .. } | Self::Tls { .. }
        )
    }

    /// Whether the TLS handshake failed.
    pub fn is_tls(&self) -> bool {
        matches!(self, Self::Tls { .. })
    }

    /// Whether the remote side reported the error (its handler failed, it refused the request).
    pub fn is_remote(&self) -> bool {
        matches!(self, Self::Remote { .. })
    }

    /// Whether the peer broke the protocol (an invalid or unexpected frame).
    pub fn is_protocol(&self) -> bool {
        matches!(self, Self::Protocol { .. } | Self::UnexpectedReply { .. })
    }

    /// Whether a size limit (this node's or the peer's) or a memory budget refused the
    /// message.
    pub fn is_limit(&self) -> bool {
        self.over_limit().is_some()
            || matches!(
                self,
                Self::Memory(_) | Self::Overloaded { .. } | Self::SharedMemoryFull { .. }
            )
    }

    /// Whether the node (or the endpoint's mailbox) is shut down, or belongs to the parent of
    /// this forked process.
    pub fn is_shutdown(&self) -> bool {
        matches!(
            self,
            Self::Shutdown | Self::MailboxClosed | Self::Forked { .. }
        )
    }

    /// The text the remote side sent, for [`Error::Remote`].
    pub fn remote_text(&self) -> Option<&str> {
        match self {
            Self::Remote { text, .. } => Some(text),
            _ => None,
        }
    }

    /// The limit that was exceeded, for a message over a local limit.
    pub fn limit(&self) -> Option<&LimitExceeded> {
        match self {
            Self::Encode(WireError::LimitExceeded(limit)) => Some(limit),
            _ => None,
        }
    }

    /// What kind of failure the remote side reported, for [`Error::Remote`] (read from its
    /// text: see [`RemoteKind::of_text`]).
    pub fn remote_kind(&self) -> Option<RemoteKind> {
        self.remote_text().map(RemoteKind::of_text)
    }

    /// The size limit a message was over, and whose, on any path: this node's when it sends
    /// ([`Error::Encode`]) or receives a reply ([`Error::Protocol`] over a limit), the
    /// peer's when it refused the request or could not send its reply ([`Error::Remote`]).
    pub fn over_limit(&self) -> Option<OverLimit> {
        let local = |exceeded: &LimitExceeded| OverLimit {
            side: LimitSide::Local,
            exceeded: exceeded.clone(),
        };
        match self {
            Self::Encode(WireError::LimitExceeded(exceeded))
            | Self::Protocol {
                source: WireError::LimitExceeded(exceeded),
                ..
            } => Some(local(exceeded)),
            Self::Remote { .. } => match self.remote_kind() {
                Some(RemoteKind::OverLimit(over)) => Some(over),
                _ => None,
            },
            _ => None,
        }
    }

    /// An [`Error::Io`].
    pub fn io(op: &'static str, source: io::Error) -> Self {
        Self::Io { op, source }
    }
}

/// `1.5s`, `250ms`, `40µs`: the unit that fits, not nanoseconds.
pub(crate) fn format_duration(duration: Duration) -> String {
    if duration >= Duration::from_secs(1) {
        let seconds = format!("{:.3}", duration.as_secs_f64());
        format!("{}s", seconds.trim_end_matches('0').trim_end_matches('.'))
    } else if duration >= Duration::from_millis(1) {
        format!("{}ms", duration.as_millis())
    } else {
        format!("{}µs", duration.as_micros())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_shown_in_a_unit_that_fits() {
        let text = |after| Error::Timeout { what: "ask", after }.to_string();
        assert_eq!(text(Duration::from_secs(5)), "ask timed out after 5s");
        assert_eq!(
            text(Duration::from_millis(1500)),
            "ask timed out after 1.5s"
        );
        assert_eq!(
            text(Duration::from_millis(250)),
            "ask timed out after 250ms"
        );
        assert_eq!(text(Duration::from_micros(40)), "ask timed out after 40µs");
    }

    #[test]
    fn errors_classify_by_fault() {
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let closed = Error::ConnectionClosed { peer, detail: None };
        assert!(closed.is_connection() && !closed.is_timeout() && !closed.is_remote());
        let remote = Error::Remote {
            peer: Some(peer),
            text: "boom".into(),
        };
        assert_eq!(remote.remote_text(), Some("boom"));
        assert_eq!(remote.to_string(), "remote error from 127.0.0.1:9: boom");
        let limit = Error::Encode(WireError::LimitExceeded(LimitExceeded {
            field: crate::LimitField::BufferCount,
            value: 9,
            limit: 8,
        }));
        assert!(limit.is_limit() && limit.limit().is_some());
    }
}
