//! PTR1: the raw-TCP frame.
//!
//! ```text
//! offset size field
//!      0    4 magic "PTR1"
//!      4    1 kind (1 Ask, 2 Tell, 3 TensorResponse, 4 Ack, 5 Error, 6 SingleResponse)
//!      5    3 reserved (written as zero, not checked)
//!      8    4 version        u32 LE
//!     12    4 path_len       u32 LE
//!     16    8 metadata_len   u64 LE
//!     24    4 buffer_count   u32 LE
//!     28  8·n buffer lengths u64 LE each
//!      …      path, metadata, buffers (concatenated, no padding)
//! ```
//!
//! A connection carries one request frame, then one reply frame, then the next request.

use bytes::Bytes;

use crate::body::{Body, Parts, ReceiveBuffer};
use crate::encode::{Encoded, head as frame_head};
use crate::error::{Format, Malformed, WireError};
pub use crate::kind::FrameKind;
use crate::len::len_u64;
use crate::limits::Limits;
use crate::message::TensorMessage;
use crate::reader::{FrameReader, split_contiguous};

/// Length of the fixed PTR1 header.
pub const FIXED_HEADER_LEN: usize = 28;

/// One PTR1 frame with its slots given their meaning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// A request that expects a reply message.
    Ask {
        /// Route to the endpoint, e.g. `/actors/echo`.
        path: String,
        /// The request.
        message: TensorMessage,
    },
    /// A request that expects an Ack once it is enqueued.
    Tell {
        /// Route to the endpoint.
        path: String,
        /// The request.
        message: TensorMessage,
    },
    /// The reply message to an Ask (its own version).
    TensorResponse(TensorMessage),
    /// The reply to a Tell; echoes the request's version.
    Ack {
        /// The request's version.
        version: u32,
    },
    /// A failure reply; echoes the request's version.
    Error {
        /// The request's version.
        version: u32,
        /// What went wrong, as text. Invalid UTF-8 on the wire is replaced lossily.
        text: String,
    },
    /// An ordinary (non-tensor) reply to an Ask; echoes the request's version.
    SingleResponse {
        /// The request's version.
        version: u32,
        /// The message type, carried in the path slot (at most 64 KiB).
        msg_type: String,
        /// The message data, carried in the metadata slot.
        data: Bytes,
    },
}

impl Frame {
    /// The frame's kind.
    pub fn kind(&self) -> FrameKind {
        match self {
            Self::Ask { .. } => FrameKind::Ask,
            Self::Tell { .. } => FrameKind::Tell,
            Self::TensorResponse(_) => FrameKind::TensorResponse,
            Self::Ack { .. } => FrameKind::Ack,
            Self::Error { .. } => FrameKind::Error,
            Self::SingleResponse { .. } => FrameKind::SingleResponse,
        }
    }

    /// The version field on the wire.
    pub fn version(&self) -> u32 {
        match self {
            Self::Ask { message, .. }
            | Self::Tell { message, .. }
            | Self::TensorResponse(message) => message.version,
            Self::Ack { version }
            | Self::Error { version, .. }
            | Self::SingleResponse { version, .. } => *version,
        }
    }

    /// Turns a completely received [`Body`] of a PTR1 frame into a frame, without copying.
    ///
    /// # Errors
    ///
    /// [`Malformed::Truncated`] if the body is incomplete; [`Malformed::UnexpectedSlot`] if a
    /// reply kind carries a slot it must leave empty.
    pub fn from_body<B: ReceiveBuffer>(body: Body<B>) -> Result<Self, WireError> {
        Self::from_parts(body.finish()?)
    }

    fn from_parts(parts: Parts) -> Result<Self, WireError> {
        let Parts {
            kind,
            version,
            path,
            metadata,
            buffers,
        } = parts;
        let kind = kind.ok_or(Malformed::UnknownKind(0))?;
        let must_be_empty = |slot: &'static str, len: usize| -> Result<(), WireError> {
            if len == 0 {
                Ok(())
            } else {
                Err(Malformed::UnexpectedSlot {
                    kind: kind.name(),
                    slot,
                    len: len_u64(len),
                }
                .into())
            }
        };
        let message = |metadata, buffers| TensorMessage {
            version,
            metadata,
            buffers,
        };
        Ok(match kind {
            FrameKind::Ask => Self::Ask {
                path,
                message: message(metadata, buffers),
            },
            FrameKind::Tell => Self::Tell {
                path,
                message: message(metadata, buffers),
            },
            FrameKind::TensorResponse => {
                must_be_empty("path", path.len())?;
                Self::TensorResponse(message(metadata, buffers))
            }
            FrameKind::Ack => {
                must_be_empty("path", path.len())?;
                must_be_empty("metadata", metadata.len())?;
                must_be_empty("buffer list", buffers.len())?;
                Self::Ack { version }
            }
            FrameKind::Error => {
                must_be_empty("path", path.len())?;
                must_be_empty("buffer list", buffers.len())?;
                Self::Error {
                    version,
                    text: String::from_utf8_lossy(&metadata).into_owned(),
                }
            }
            FrameKind::SingleResponse => {
                must_be_empty("buffer list", buffers.len())?;
                Self::SingleResponse {
                    version,
                    msg_type: path,
                    data: metadata,
                }
            }
        })
    }
}

/// Encodes a frame without copying its metadata or buffers.
///
/// # Errors
///
/// [`WireError::LimitExceeded`] if the path, metadata, buffer count or total size is over
/// `limits` (checked in that order, before anything is built).
pub fn encode(frame: &Frame, limits: &Limits) -> Result<Encoded, WireError> {
    encode_extended(frame, 0, limits)
}

/// Encodes a frame with `extension` in its extension byte (the first reserved byte), for a
/// peer that agreed on that extension ([`crate::stripe`]); `0` is [`encode`].
///
/// # Errors
///
/// As [`encode`].
pub fn encode_extended(
    frame: &Frame,
    extension: u8,
    limits: &Limits,
) -> Result<Encoded, WireError> {
    static EMPTY: Bytes = Bytes::from_static(b"");
    let (path, metadata, buffers): (&[u8], &Bytes, &[Bytes]) = match frame {
        Frame::Ask { path, message } | Frame::Tell { path, message } => {
            (path.as_bytes(), &message.metadata, &message.buffers)
        }
        Frame::TensorResponse(message) => (b"", &message.metadata, &message.buffers),
        Frame::Ack { .. } => (b"", &EMPTY, &[]),
        Frame::Error { text, .. } => {
            let text = Bytes::copy_from_slice(text.as_bytes());
            let head = frame_head(
                Format::Ptr1,
                Some(FrameKind::Error),
                extension,
                frame.version(),
                b"",
                &text,
                &[],
                &limits.for_error_replies(),
            )?;
            return Ok(head.share(&text, &[]));
        }
        Frame::SingleResponse { msg_type, data, .. } => (msg_type.as_bytes(), data, &[]),
    };
    let head = frame_head(
        Format::Ptr1,
        Some(frame.kind()),
        extension,
        frame.version(),
        path,
        metadata,
        buffers,
        limits,
    )?;
    Ok(head.share(metadata, buffers))
}

/// Decodes exactly one frame from contiguous bytes; metadata and buffers are zero-copy slices
/// of `bytes`.
///
/// # Errors
///
/// Any [`Malformed`] or limit error; [`Malformed::Truncated`] if `bytes` ends early and
/// [`Malformed::TrailingBytes`] if more follows the frame.
pub fn decode(bytes: Bytes, limits: &Limits) -> Result<Frame, WireError> {
    Frame::from_parts(split_contiguous(Format::Ptr1, bytes, limits)?)
}

/// Decodes a stream of PTR1 frames fed in chunks of any size.
///
/// The head is parsed and every limit checked first; then metadata and buffers are written
/// straight into memory from the allocator (`Vec<u8>` by default), which is asked for exactly
/// the advertised lengths and never for more than the limits allow.
#[derive(Debug)]
pub struct Decoder<B = Vec<u8>, A = fn(usize) -> Vec<u8>> {
    reader: FrameReader<B>,
    alloc: A,
}

impl Decoder {
    /// A decoder that receives into zero-initialised `Vec<u8>`s.
    pub fn new(limits: Limits) -> Self {
        Self::with_allocator(limits, |len| vec![0; len])
    }
}

impl<B: ReceiveBuffer, A: FnMut(usize) -> B> Decoder<B, A> {
    /// A decoder that receives into memory from `alloc(len)`, which must return exactly `len`
    /// bytes.
    pub fn with_allocator(limits: Limits, alloc: A) -> Self {
        Self {
            reader: FrameReader::new(Format::Ptr1, limits),
            alloc,
        }
    }

    /// Consumes bytes from `input` up to the end of the next frame. Returns how many bytes it
    /// took and the frame if one completed; call again with the rest of `input`.
    ///
    /// # Errors
    ///
    /// Malformed input, limits or allocator misuse. After an error the stream position is
    /// unknown: close the connection. Further calls fail with [`crate::Misuse::DecoderFailed`].
    pub fn decode(&mut self, input: &[u8]) -> Result<(usize, Option<Frame>), WireError> {
        let (consumed, parts) = self.reader.push(input, &mut self.alloc)?;
        Ok((consumed, parts.map(Frame::from_parts).transpose()?))
    }

    /// Call when the stream has ended.
    ///
    /// # Errors
    ///
    /// [`Malformed::Truncated`] if it ended in the middle of a frame.
    pub fn end_of_stream(&self) -> Result<(), WireError> {
        self.reader.truncation(Format::Ptr1).map_or(Ok(()), Err)
    }

    /// Whether no partial frame is held.
    pub fn is_idle(&self) -> bool {
        self.reader.is_idle()
    }
}

#[cfg(test)]
mod tests;
