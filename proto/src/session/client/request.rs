//! One request for a client session: its encoded frame, its deadline, and how deep its peer
//! lets requests be pipelined.

use crate::encode::Encoded;
use crate::limits::Limits;
use crate::message::TensorMessage;
use crate::ptr1::{self, Frame};
use crate::stripe::{CAPABILITIES_PATH, EXTENSION_STRIPE, EXTENSION_STRIPED, Framing};
use crate::transport::{ActorPath, Deadline, Error, RequestKind};

/// One request for a client session: an encoded Ask or Tell frame and its deadline.
#[derive(Debug)]
pub struct ClientRequest {
    pub(super) kind: RequestKind,
    pub(super) encoded: Encoded,
    pub(super) deadline: Deadline,
    pub(super) routing: Routing,
}

/// How a request is carried, kept while it waits on a connection so that one given back
/// ([`super::ClientEvent::Unsent`]) is the same request again.
#[derive(Clone, Copy, Debug)]
pub(super) struct Routing {
    /// A stripe of a striped request (not counted against a peer's busy bytes).
    stripe: bool,
    /// How many requests its peer takes on one connection before it has answered the first
    /// (1: one at a time; [`ClientRequest::with_pipeline`]).
    pipeline: u16,
    /// It was given back once already, by a connection that failed before writing it: the
    /// next such failure fails it.
    given_back: bool,
}

impl Routing {
    /// The same, for a request being given back.
    pub(super) fn given_back(self) -> Self {
        Self {
            given_back: true,
            ..self
        }
    }

    /// Whether it was given back before.
    pub(super) fn was_given_back(self) -> bool {
        self.given_back
    }
}

impl ClientRequest {
    /// Encodes the request frame (the message's buffers are referenced, not copied).
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] if the message is over `limits`.
    pub fn encode(
        kind: RequestKind,
        path: &ActorPath,
        message: TensorMessage,
        limits: &Limits,
        deadline: Deadline,
    ) -> Result<Self, Error> {
        let path = path.as_str().to_owned();
        let frame = match kind {
            RequestKind::Ask => Frame::Ask { path, message },
            RequestKind::Tell => Frame::Tell { path, message },
        };
        let encoded = ptr1::encode(&frame, limits).map_err(Error::Encode)?;
        Ok(Self {
            kind,
            encoded,
            deadline,
            routing: Routing {
                stripe: false,
                pipeline: 1,
                given_back: false,
            },
        })
    }

    /// Encodes the request as `framing` says ([`crate::stripe`]): whole, as
    /// [`ClientRequest::encode`]; a stripe, as a Tell whose path slot is its descriptor (`kind`
    /// and `path` are not sent); a striped request, as an Ask or Tell marked striped.
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] if the frame is over `limits`.
    pub fn encode_framed(
        kind: RequestKind,
        path: &ActorPath,
        message: TensorMessage,
        framing: &Framing,
        limits: &Limits,
        deadline: Deadline,
    ) -> Result<Self, Error> {
        let (kind, frame, extension) = match framing {
            Framing::Whole => return Self::encode(kind, path, message, limits, deadline),
            Framing::Stripe(descriptor) => (
                RequestKind::Tell,
                Frame::Tell {
                    path: descriptor.to_path(),
                    message,
                },
                EXTENSION_STRIPE,
            ),
            Framing::Capabilities => (
                RequestKind::Ask,
                Frame::Ask {
                    path: CAPABILITIES_PATH.to_owned(),
                    message,
                },
                0,
            ),
            Framing::Striped => {
                let path = path.as_str().to_owned();
                let frame = match kind {
                    RequestKind::Ask => Frame::Ask { path, message },
                    RequestKind::Tell => Frame::Tell { path, message },
                };
                (kind, frame, EXTENSION_STRIPED)
            }
        };
        let encoded = ptr1::encode_extended(&frame, extension, limits).map_err(Error::Encode)?;
        Ok(Self {
            kind,
            encoded,
            deadline,
            routing: Routing {
                stripe: matches!(framing, Framing::Stripe(_)),
                pipeline: 1,
                given_back: false,
            },
        })
    }

    /// The same request, to a peer that takes up to `depth` requests on one connection before
    /// it has answered the first (it said so in its capabilities; 0 counts as 1). A stripe is
    /// never pipelined: the stripes of one request go out at once, each on a connection of its
    /// own.
    #[must_use]
    pub fn with_pipeline(mut self, depth: u16) -> Self {
        self.routing.pipeline = if self.routing.stripe { 1 } else { depth.max(1) };
        self
    }

    /// How many requests its peer takes on one connection at once (1: one at a time).
    pub fn pipeline(&self) -> u16 {
        self.routing.pipeline
    }

    /// The bytes a client pool counts for this request against a peer's busy bytes: its
    /// frame's length, or 0 for a stripe (the stripes of one request go out at once, each on a
    /// connection of its own, however large).
    pub fn pool_bytes(&self) -> u64 {
        if self.routing.stripe {
            0
        } else {
            self.wire_len()
        }
    }

    /// The request frame's length on the wire.
    pub fn wire_len(&self) -> u64 {
        self.encoded.wire_len()
    }

    /// Ask or tell.
    pub fn kind(&self) -> RequestKind {
        self.kind
    }

    /// When it gives up.
    pub fn deadline(&self) -> Deadline {
        self.deadline
    }

    /// Whether a connection already gave it back unwritten once
    /// ([`super::ClientEvent::Unsent`]); it is not given back again.
    pub fn was_given_back(&self) -> bool {
        self.routing.given_back
    }
}
