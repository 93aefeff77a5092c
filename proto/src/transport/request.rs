//! What travels through a transport: requests, replies, actor paths and deadlines.

use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::message::TensorMessage;
use crate::transport::Error;

/// Whether a request expects a reply message (ask) or only an acknowledgement (tell).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestKind {
    /// Waits for the handler's reply.
    Ask,
    /// Acknowledged once the message is in the endpoint's mailbox; the handler's result is not
    /// sent back.
    Tell,
}

impl RequestKind {
    /// `"ask"` or `"tell"`, as in error texts and the HTTP `x-message-mode` header.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ask => "ask",
            Self::Tell => "tell",
        }
    }
}

impl fmt::Display for RequestKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A handler's answer to an ask.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// A tensor message (PTR1 TensorResponse).
    Tensor(TensorMessage),
    /// An ordinary message: a type name and opaque data (PTR1 SingleResponse).
    Single {
        /// The message type.
        msg_type: String,
        /// The data.
        data: Bytes,
    },
}

/// What a request got back: a reply (ask) or an acknowledgement (tell).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The reply to an ask.
    Reply(Reply),
    /// A tell was enqueued by the receiver.
    Ack,
}

/// The name of an endpoint: `/actors/{name}` or `/named/{path}`.
///
/// Every API that names an endpoint takes the same strings: a bare name (`echo`, meaning
/// `/actors/echo`) or a full actor path (`/actors/echo`, `/named/ns/echo`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActorPath(String);

impl ActorPath {
    /// Parses a bare name or a full actor path.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPath`] for an empty name, a bare name with `/` in it, or a path that is
    /// neither `/actors/{name}` nor `/named/{path}`.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let invalid = || Error::InvalidPath {
            path: text.to_owned(),
        };
        if !text.starts_with('/') {
            if text.is_empty() || text.contains('/') {
                return Err(invalid());
            }
            return Ok(Self(format!("/actors/{text}")));
        }
        let rest = text
            .strip_prefix("/actors/")
            .filter(|name| !name.contains('/'))
            .or_else(|| text.strip_prefix("/named/"))
            .ok_or_else(invalid)?;
        if rest.is_empty() || rest.split('/').any(str::is_empty) {
            return Err(invalid());
        }
        Ok(Self(text.to_owned()))
    }

    /// The full path, as it travels on the wire.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ActorPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// When a request gives up: an instant, or never (a timeout too large to represent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    at: Option<Instant>,
    timeout: Duration,
}

impl Deadline {
    /// `timeout` from `now`. A timeout so large that the instant overflows (such as
    /// `Duration::MAX`) means no deadline.
    pub fn after(now: Instant, timeout: Duration) -> Self {
        Self {
            at: now.checked_add(timeout),
            timeout,
        }
    }

    /// No deadline at all.
    pub fn never() -> Self {
        Self {
            at: None,
            timeout: Duration::MAX,
        }
    }

    /// The instant, if there is one.
    pub fn at(&self) -> Option<Instant> {
        self.at
    }

    /// The timeout it was made from (for error texts).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether it has passed at `now`.
    pub fn has_passed(&self, now: Instant) -> bool {
        self.at.is_some_and(|at| at <= now)
    }

    /// The earlier of the two.
    pub fn min(self, other: Self) -> Self {
        match (self.at, other.at) {
            (Some(a), Some(b)) if b < a => other,
            (None, Some(_)) => other,
            _ => self,
        }
    }

    /// The timeout error for `what`.
    pub fn error(&self, what: &'static str) -> Error {
        Error::Timeout {
            what,
            after: self.timeout,
        }
    }
}

/// A request a transport received, handed to the node.
#[derive(Debug)]
#[non_exhaustive]
pub struct InboundRequest {
    /// Ask or tell.
    pub kind: RequestKind,
    /// The actor path it was sent to.
    pub path: String,
    /// The message; its buffers are in the node's receive memory.
    pub message: TensorMessage,
    /// Where it came from, when it crossed a socket.
    pub peer: Option<SocketAddr>,
    /// The authenticated identity of the peer (TLS client certificate), if any.
    pub identity: Option<String>,
    /// The peer process on this host, as the kernel reports it (`SO_PEERCRED`), when the
    /// request came over shared memory; its buffers are then read-only views of the peer's
    /// memory.
    pub local_peer: Option<LocalPeer>,
}

/// A process on this host, identified by the kernel (not by what it claims).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LocalPeer {
    /// Its user id.
    pub uid: u32,
    /// Its process id.
    pub pid: u32,
}

impl InboundRequest {
    /// A request without peer information.
    pub fn new(kind: RequestKind, path: String, message: TensorMessage) -> Self {
        Self {
            kind,
            path,
            message,
            peer: None,
            identity: None,
            local_peer: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_name_and_its_actor_path_name_the_same_endpoint() {
        let name = ActorPath::parse("echo").unwrap();
        assert_eq!(name, ActorPath::parse("/actors/echo").unwrap());
        assert_eq!(name.as_str(), "/actors/echo");
        assert_eq!(
            ActorPath::parse("/named/ns/echo").unwrap().as_str(),
            "/named/ns/echo"
        );
    }

    #[test]
    fn malformed_paths_are_rejected() {
        for bad in [
            "",
            "/",
            "/actors/",
            "/actors/a/b",
            "a/b",
            "/other/x",
            "/named/",
            "/named/a//b",
        ] {
            assert!(
                matches!(ActorPath::parse(bad), Err(Error::InvalidPath { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_huge_timeout_means_no_deadline_instead_of_a_panic() {
        let now = Instant::now();
        let sut = Deadline::after(now, Duration::MAX);
        assert_eq!(sut.at(), None);
        assert!(!sut.has_passed(now + Duration::from_secs(1 << 40)));
        let near = Deadline::after(now, Duration::from_secs(1));
        assert_eq!(sut.min(near), near);
        assert_eq!(near.min(sut), near);
    }
}
