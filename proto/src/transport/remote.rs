//! What a remote error reports: the one place where the error texts a receiver sends back
//! are read.
//!
//! Every path carries a failure as text: a PTR1 Error frame's metadata, an HTTP/2 error
//! body after its status, a shared-memory error reply. A peer of the reference implementation
//! sends only `to_string()`, and its decoder ignores anything else, so a code of our own could
//! reach only our own peers. The texts tensorwire's receivers write have fixed shapes; this
//! module reads them back, anchored at the start of the text (a handler's own text, which
//! Python formats as `"ExceptionType: …"`, never matches).
//!
//! | the text starts with | written by | kind |
//! |---|---|---|
//! | `rejected request: ` + a limit | a PTR1 receiver, the request over its limit | over the peer's limit |
//! | a limit, bare | a shared-memory receiver, the request over its limit | over the peer's limit |
//! | `413 …: ` + a limit | an HTTP/2 receiver, the request over its limit | over the peer's limit |
//! | `reply could not be sent: `, `cannot send the reply: ` (after a status) + a limit | a replier whose reply is over its own limit | over the peer's limit |
//! | `the reply could not be mapped: ` + a limit | this node's shared-memory client, a reply over this node's limit | over this node's limit |
//! | `no endpoint at path ` (after a status) | the receiver has no such endpoint | unknown endpoint |
//! | `the mailbox of … stayed full` (after a status) | the endpoint's mailbox stayed full | overloaded |
//! | anything else | the handler failed (or another implementation's text) | failed |
//!
//! A limit is what [`LimitExceeded`]'s `Display` writes. When the shared-memory transport's
//! error reply carries a kind of its own, it replaces the parse for that path.

use crate::error::LimitExceeded;

/// What kind of failure a remote error reports.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RemoteKind {
    /// The remote handler failed, or the text is not one tensorwire's receivers write.
    Failed,
    /// The peer has no endpoint at the path.
    UnknownEndpoint,
    /// The message was over a size limit.
    OverLimit(OverLimit),
    /// The endpoint's mailbox stayed full; the message was not delivered.
    Overloaded,
}

/// A message over a size limit, and whose limit it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverLimit {
    /// Whose limit refused it.
    pub side: LimitSide,
    /// The field, the value and the limit.
    pub exceeded: LimitExceeded,
}

/// Whose limit refused a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LimitSide {
    /// This node's: it refused to send the message, or to receive the reply.
    Local,
    /// The peer's: it refused to receive the request, or to send its reply.
    Peer,
}

impl LimitSide {
    /// `"local"` or `"peer"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Peer => "peer",
        }
    }
}

/// What the peer says before the limit, and whose limit that makes it.
const LIMIT_PREFIXES: [(&str, LimitSide); 5] = [
    (REJECTED, LimitSide::Peer),
    ("reply could not be sent: ", LimitSide::Peer),
    (
        "cannot send the reply: cannot send the message: ",
        LimitSide::Peer,
    ),
    ("cannot send the reply: ", LimitSide::Peer),
    ("the reply could not be mapped: ", LimitSide::Local),
];

/// How a PTR1 server's Error reply starts when it refused a request whose head it could read
/// but whose body it cannot skip (over a limit, malformed): it drains, then closes.
pub(crate) const REJECTED: &str = "rejected request: ";

/// How a TLS-only PTR1 server's Error reply to plaintext starts; it closes after it too.
pub(crate) const REQUIRES_TLS: &str = "this node requires TLS: ";

/// What [`crate::transport::Error::UnknownEndpoint`] and the node's registry write.
pub const NO_ENDPOINT: &str = "no endpoint at path ";

impl RemoteKind {
    /// The kind a remote error text reports.
    pub fn of_text(text: &str) -> Self {
        let (status, text) = split_status(text);
        let limit = LIMIT_PREFIXES
            .iter()
            .find_map(|(prefix, side)| Some((text.strip_prefix(prefix)?, *side)))
            .or_else(|| {
                (status == Some(413) || status.is_none()).then_some((text, LimitSide::Peer))
            })
            .and_then(|(rest, side)| {
                LimitExceeded::parse(rest).map(|exceeded| OverLimit { side, exceeded })
            });
        if let Some(limit) = limit {
            Self::OverLimit(limit)
        } else if text.starts_with(NO_ENDPOINT) {
            Self::UnknownEndpoint
        } else if text.starts_with("the mailbox of ") && text.contains(" stayed full ") {
            Self::Overloaded
        } else {
            Self::Failed
        }
    }
}

/// An HTTP/2 error text (`"413 Payload Too Large: …"`) as its status and the rest.
fn split_status(text: &str) -> (Option<u16>, &str) {
    let bytes = text.as_bytes();
    let is_status =
        bytes.len() > 4 && bytes[..3].iter().all(u8::is_ascii_digit) && bytes[3] == b' ';
    if !is_status {
        return (None, text);
    }
    let status = text[..3].parse().ok();
    match text.split_once(": ") {
        Some((_, rest)) => (status, rest),
        None => (status, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::LimitField;

    fn limit(field: LimitField, value: u64, limit: u64) -> LimitExceeded {
        LimitExceeded {
            field,
            value,
            limit,
        }
    }

    fn over(side: LimitSide, exceeded: &LimitExceeded) -> RemoteKind {
        RemoteKind::OverLimit(OverLimit {
            side,
            exceeded: exceeded.clone(),
        })
    }

    #[test]
    fn a_limit_reads_back_as_it_was_written() {
        for field in LimitField::ALL {
            let sut = limit(field, 2_097_152, 1_048_576);
            assert_eq!(LimitExceeded::parse(&sut.to_string()), Some(sut));
        }
        assert_eq!(LimitExceeded::parse("buffer count is many"), None);
        assert_eq!(LimitExceeded::parse("ValueError: buffer count is 3"), None);
    }

    #[test]
    fn a_request_over_the_receivers_limit_is_the_peers_limit_on_every_path() {
        let exceeded = limit(LimitField::MetadataBytes, 2_097_152, 1_048_576);
        let peer = over(LimitSide::Peer, &exceeded);
        for text in [
            format!("rejected request: {exceeded}"),
            format!("{exceeded}"),
            format!("413 Payload Too Large: {exceeded}"),
            format!("reply could not be sent: {exceeded}"),
            format!("500 Internal Server Error: cannot send the reply: {exceeded}"),
            format!("cannot send the reply: cannot send the message: {exceeded}"),
        ] {
            assert_eq!(RemoteKind::of_text(&text), peer, "{text}");
        }
    }

    #[test]
    fn a_reply_this_node_could_not_map_is_over_this_nodes_limit() {
        let exceeded = limit(LimitField::WireBytes, 9, 8);
        let text = format!("the reply could not be mapped: {exceeded}");
        assert_eq!(
            RemoteKind::of_text(&text),
            over(LimitSide::Local, &exceeded)
        );
    }

    #[test]
    fn unknown_endpoints_and_full_mailboxes_are_recognised() {
        let unknown = crate::transport::Error::UnknownEndpoint {
            path: "/actors/x".into(),
        };
        assert_eq!(
            RemoteKind::of_text(&unknown.to_string()),
            RemoteKind::UnknownEndpoint
        );
        assert_eq!(
            RemoteKind::of_text("404 Not Found: no endpoint at path \"/actors/x\""),
            RemoteKind::UnknownEndpoint
        );
        assert_eq!(
            RemoteKind::of_text(
                "the mailbox of /actors/x stayed full for 5s; the tell was not delivered"
            ),
            RemoteKind::Overloaded
        );
    }

    #[test]
    fn a_handlers_own_text_is_a_failure_even_when_it_quotes_a_limit() {
        let exceeded = limit(LimitField::BufferCount, 3, 2);
        for text in [
            format!("ValueError: {exceeded}"),
            "RuntimeError: no endpoint at path \"/actors/x\"".to_owned(),
            "500 Internal Server Error: KeyError: 'w'".to_owned(),
            String::new(),
        ] {
            assert_eq!(RemoteKind::of_text(&text), RemoteKind::Failed, "{text}");
        }
    }
}
