//! How a client session ends: the outcomes of the requests it still carries, and its close.

use std::io;

use super::in_flight::Taken;
use super::{ClientEvent, ClientSession};
use crate::session::CloseReason;
use crate::session::receiver::RecvError;
use crate::transport::Error;

impl ClientSession {
    /// What a failed read means for the request it was reading the reply of.
    pub(super) fn recv_error(&self, error: RecvError) -> Error {
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

    /// The error of requests behind one that broke the connection.
    pub(super) fn behind_error(&self, why: &str) -> Error {
        Error::ConnectionClosed {
            peer: self.peer,
            detail: Some(io::Error::other(why.to_owned())),
        }
    }

    /// Fails every request whose caller waits — the front one with `error`, the ones behind it
    /// as closed with the same cause — and closes. Requests of an established connection not a
    /// byte of which was handed out are handed back instead ([`ClientEvent::Unsent`]), unless
    /// the node is shutting down.
    pub(super) fn fail(&mut self, error: Error, reason: CloseReason) {
        let give_back = self.connected && !matches!(reason, CloseReason::Shutdown);
        let waiting = self.requests.drain_waiting(give_back);
        let mut first = Some(error);
        // What the ones behind the first are told (its text, once: not nested per request).
        let mut cause: Option<String> = None;
        for taken in waiting {
            let token = match taken {
                Taken::Unwritten(token, request) => {
                    self.events
                        .push_back(ClientEvent::Unsent { token, request });
                    continue;
                }
                Taken::Failing(token) => token,
            };
            let outcome = match first.take() {
                Some(first) => {
                    cause = Some(first.to_string());
                    Err(first)
                }
                None => Err(self.behind_error(cause.as_deref().unwrap_or("the connection failed"))),
            };
            self.events.push_back(ClientEvent::Done { token, outcome });
        }
        self.close(reason);
    }

    /// Nobody waits for what is left on the connection (every request was given up on): it
    /// is closed rather than kept for replies nobody reads.
    pub(super) fn close_if_abandoned(&mut self) {
        if self.requests.only_abandoned() {
            self.fail(Error::Cancelled, CloseReason::OutOfStep);
        }
    }

    pub(super) fn close(&mut self, reason: CloseReason) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.writing = None;
        self.events.push_back(ClientEvent::Close(reason));
    }
}
