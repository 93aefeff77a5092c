use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tensorwire_proto::{ConfigError, WireError};

/// Everything that can go wrong in the engine, grouped by fault.
///
/// `Display` texts are for people; match on variants or use the predicates.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- caller misuse ----
    /// An actor path must be `/actors/{name}` or `/named/{path}` with a non-empty name.
    #[error("invalid actor path {path:?}: expected /actors/{{name}} or /named/{{path}}")]
    InvalidPath {
        /// The path given.
        path: String,
    },
    /// An endpoint with this name is already registered on the node.
    #[error("an endpoint named {name:?} already exists on this node")]
    EndpointExists {
        /// The name.
        name: String,
    },
    /// A message could not be encoded (over a limit).
    #[error("cannot send: {0}")]
    Encode(WireError),
    /// Invalid configuration (including environment variables).
    #[error(transparent)]
    Config(#[from] ConfigError),

    // ---- the peer or the remote endpoint ----
    /// The remote side answered with an Error frame; its text is kept.
    #[error("remote error: {text}")]
    Remote {
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
        /// The OS error, if there was one.
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
    /// No reply within the deadline. The request may or may not have been delivered.
    #[error("{what} timed out after {after:?}")]
    Timeout {
        /// What timed out.
        what: &'static str,
        /// The deadline that passed.
        after: Duration,
    },
    /// No endpoint is registered at this path (local sends).
    #[error("no endpoint at path {path:?}")]
    UnknownEndpoint {
        /// The path.
        path: String,
    },

    // ---- local resources ----
    /// io_uring cannot be used here (kernel, seccomp, sysctl or forced off), and no fallback
    /// transport is available in this build.
    #[error(
        "io_uring is unavailable ({reason}); the tokio fallback transport (tensorwire-compat) \
         is not available in this build"
    )]
    IoUringUnavailable {
        /// Why io_uring could not be set up.
        reason: String,
    },
    /// A system call failed.
    #[error("{op} failed: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The node is shutting down or has shut down.
    #[error("the node is shut down")]
    Shutdown,
    /// The endpoint's mailbox is closed (the endpoint was dropped).
    #[error("the endpoint's mailbox is closed")]
    MailboxClosed,
}

impl Error {
    /// Whether a deadline passed.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. })
    }

    /// Whether the remote side reported the error (its handler failed, unknown endpoint, …).
    pub fn is_remote(&self) -> bool {
        matches!(self, Self::Remote { .. })
    }

    pub(crate) fn io(op: &'static str, source: io::Error) -> Self {
        Self::Io { op, source }
    }
}
