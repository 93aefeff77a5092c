//! The server session's part in striping ([`crate::stripe`]): the capabilities Ask answered
//! (also by a node that takes no stripes: it says how many requests it reads ahead),
//! a stripe received straight into its parts of the stripe store, a striped request put back
//! together before it is delivered.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use super::replies::PIPELINED_REPLIES;
use super::{Incoming, ServerSession};
use crate::ptr1::Frame;
use crate::stripe::{
    CAPABILITIES_PATH, CAPABILITIES_TYPE, EXTENSION_STRIPE, EXTENSION_STRIPED, StripeDescriptor,
    StripedHeader, capabilities_reply,
};
use crate::transport::{RequestKind, StripeStore};

impl ServerSession {
    /// Takes striped requests into `stripes` (shared by every connection of the node) and
    /// answers the capabilities path saying so ([`crate::stripe`]). `peer` is the connection's
    /// peer: the stripes it begins count against its host's bounds (one bucket for an unknown
    /// peer).
    #[must_use]
    pub fn with_stripes(
        mut self,
        stripes: Option<Arc<StripeStore>>,
        peer: Option<SocketAddr>,
    ) -> Self {
        self.stripes = stripes;
        if let Some(peer) = peer {
            self.stripes_peer = peer.ip();
        }
        self
    }

    /// A request's head with `extension` is in: whether striping answered it already (the
    /// capabilities Ask, a stripe admitted or refused, an unknown extension refused); a striped
    /// request is marked to be put together when it completes.
    pub(super) fn answered_striping(
        &mut self,
        kind: RequestKind,
        extension: u8,
        path: &str,
        version: u32,
        now: Instant,
    ) -> bool {
        if (extension, kind) == (0, RequestKind::Ask) && path == CAPABILITIES_PATH {
            // Answered by every tensorwire node: what it reads ahead, and stripes if it takes
            // them.
            self.receiver.refuse();
            let stripes = self.stripes.as_ref().map(|s| s.capabilities());
            let pipeline = u16::try_from(PIPELINED_REPLIES).unwrap_or(u16::MAX);
            self.queue_reply(Frame::SingleResponse {
                version,
                msg_type: CAPABILITIES_TYPE.to_owned(),
                data: capabilities_reply(stripes, pipeline),
            });
            return true;
        }
        if let Some(stripes) = self.stripes.clone() {
            match (extension, kind) {
                (EXTENSION_STRIPE, RequestKind::Tell) => {
                    self.admit_stripe(&stripes, path, version, now);
                    return true;
                }
                (EXTENSION_STRIPED, _) => self.incoming = Incoming::Striped,
                _ => {}
            }
        }
        if self.incoming == Incoming::Plain && extension != 0 {
            self.receiver.refuse();
            let text = format!("unknown PTR1 extension {extension} on a {kind} frame");
            self.queue_reply(Frame::Error { version, text });
            return true;
        }
        false
    }

    /// A stripe's head is in: its parts of its request's buffers are claimed and it is
    /// received straight into them, or it is refused with the reason.
    fn admit_stripe(&mut self, stripes: &StripeStore, path: &str, version: u32, now: Instant) {
        let claimed = match self.receiver.layout() {
            Some(layout) if layout.metadata_len() == 0 => {
                StripeDescriptor::parse(path, layout.buffer_lens())
                    .and_then(|descriptor| stripes.claim(&descriptor, self.stripes_peer, now))
            }
            _ => Err("a stripe carries no metadata".to_owned()),
        };
        match claimed {
            Ok(parts) => {
                self.incoming = Incoming::Stripe;
                self.receiver.admit_into(parts);
            }
            Err(text) => {
                self.receiver.refuse();
                self.queue_reply(Frame::Error { version, text });
            }
        }
    }

    /// A striped request with its cut buffers back in place (from the stripe store).
    pub(super) fn put_together(
        &self,
        message: crate::TensorMessage,
        now: Instant,
    ) -> Result<crate::TensorMessage, String> {
        let stripes = self
            .stripes
            .as_ref()
            .ok_or("this node takes no striped requests")?;
        let inline = message.buffers.len().saturating_sub(1);
        let header = message
            .buffers
            .first()
            .ok_or("a striped request without its header")
            .map_err(str::to_owned)
            .and_then(|bytes| StripedHeader::parse(bytes, inline))?;
        let cut = stripes.take(&header, now)?;
        header.rebuild(message, cut)
    }
}
