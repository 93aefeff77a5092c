//! The events a server session gives its driver: hand-off, admission, delivery, withdrawal,
//! close.

#[cfg(doc)]
use super::ServerSession;
use crate::session::CloseReason;
use crate::transport::{InboundRequest, RequestKind};

/// What a server session asks of its driver and node.
#[derive(Debug)]
#[non_exhaustive]
pub enum ServerEvent {
    /// The connection's first bytes are not `PTR1`: give the socket and these bytes to the
    /// hand-off (TLS, HTTP/2). The session is finished.
    HandOff {
        /// Every byte read so far.
        preface: Vec<u8>,
    },
    /// A request's head and path arrived: ask the node whether it takes `kind` requests for
    /// `path` and answer with [`ServerSession::admit`]. Nothing more is received until then.
    Admit {
        /// Ask or tell.
        kind: RequestKind,
        /// The actor path.
        path: String,
    },
    /// A whole request arrived: deliver it; answer with [`ServerSession::handle_enqueued`]
    /// and (asks) [`ServerSession::handle_answer`], both carrying `seq`.
    Request {
        /// This request's number on the connection.
        seq: u64,
        /// The request (the driver may fill in the peer).
        request: InboundRequest,
    },
    /// Request `seq` still waits for mailbox space and is given up (its deadline passed, or
    /// the peer left): withdraw it from the mailbox and, unless the session is closing, say
    /// whether that worked with [`ServerSession::handle_withdrawn`] (a request that got in
    /// meanwhile is delivered after all).
    Withdraw {
        /// The request's number.
        seq: u64,
    },
    /// An error reply is written: shut down the write side; reading goes on (discarded) until
    /// the peer closes or the drain deadline passes.
    ShutdownWrite,
    /// Close the connection (cancel what is in flight). The session is finished.
    Close(CloseReason),
}
