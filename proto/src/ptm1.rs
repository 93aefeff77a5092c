//! PTM1: the HTTP/2 tensor body.
//!
//! ```text
//! offset size field
//!      0    4 magic "PTM1"
//!      4    4 version        u32 LE
//!      8    8 metadata_len   u64 LE
//!     16    4 buffer_count   u32 LE
//!     20  8·n buffer lengths u64 LE each
//!      …      metadata, buffers (concatenated, no padding)
//! ```
//!
//! There is no kind and no path: the route and the ask/tell mode travel in HTTP/2 headers. A
//! body is exactly one message; bytes after it are an error.

use bytes::Bytes;

use crate::body::{Body, Parts, ReceiveBuffer};
use crate::encode::{Encoded, Head, head as frame_head};
use crate::error::{Format, LimitField, Malformed, WireError};
use crate::len::len_u64;
use crate::limits::Limits;
use crate::message::TensorMessage;
use crate::reader::{FrameReader, split_contiguous};

mod receiver;

pub use receiver::{BodyReceiver, Pushed};

/// Length of the fixed PTM1 header.
pub const FIXED_HEADER_LEN: usize = 20;

/// Encodes a message as a PTM1 body: a small head plus references to the metadata and buffers,
/// to be streamed as separate chunks (never concatenated).
///
/// # Errors
///
/// [`WireError::LimitExceeded`] if the buffer count, metadata or total size is over `limits`.
pub fn encode(message: &TensorMessage, limits: &Limits) -> Result<Encoded, WireError> {
    Ok(encode_head(message, limits)?.share(&message.metadata, &message.buffers))
}

/// The head of `message`'s PTM1 body alone, checked against `limits` as [`encode`] does: for
/// a sender that joins the parts it owns to it ([`Head::join`], no reference count touched) or
/// copies the body somewhere and needs no parts.
///
/// # Errors
///
/// As [`encode`].
pub fn encode_head(message: &TensorMessage, limits: &Limits) -> Result<Head, WireError> {
    frame_head(
        Format::Ptm1,
        None,
        0,
        message.version,
        b"",
        &message.metadata,
        &message.buffers,
        limits,
    )
}

/// Decodes a complete body held in contiguous memory; metadata and buffers are zero-copy
/// slices of `body`.
///
/// # Errors
///
/// Any [`Malformed`] or limit error, including [`Malformed::Truncated`] and
/// [`Malformed::TrailingBytes`] when `body` is not exactly one message long.
pub fn decode(body: Bytes, limits: &Limits) -> Result<TensorMessage, WireError> {
    limits.check(LimitField::WireBytes, len_u64(body.len()))?;
    Ok(into_message(split_contiguous(Format::Ptm1, body, limits)?))
}

/// Decodes one PTM1 body from chunks as they arrive, writing each payload straight into memory
/// from the allocator.
///
/// Feed every chunk to [`Decoder::push`], then call [`Decoder::finish`] at the end of the body.
#[derive(Debug)]
pub struct Decoder<B = Vec<u8>, A = fn(usize) -> Vec<u8>> {
    reader: FrameReader<B>,
    alloc: A,
    /// The message, once the last byte arrived.
    done: Option<TensorMessage>,
    /// Body bytes received, for error reports.
    received: u64,
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
            reader: FrameReader::new(Format::Ptm1, limits),
            alloc,
            done: None,
            received: 0,
        }
    }

    /// Takes the next chunk of the body.
    ///
    /// # Errors
    ///
    /// Malformed input or limits as soon as they can be seen; [`Malformed::TrailingBytes`] if
    /// the chunk goes past the end of the message. Further calls then fail.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), WireError> {
        let mut rest = chunk;
        while !rest.is_empty() {
            if self.done.is_some() {
                return Err(Malformed::TrailingBytes {
                    format: Format::Ptm1,
                    expected: self.received,
                    extra: len_u64(rest.len()),
                }
                .into());
            }
            let (consumed, parts) = self.reader.push(rest, &mut self.alloc)?;
            self.received += len_u64(consumed);
            rest = &rest[consumed..];
            self.done = parts.map(into_message);
        }
        Ok(())
    }

    /// Whether the whole message has arrived.
    pub fn is_complete(&self) -> bool {
        self.done.is_some()
    }

    /// Ends the body and returns the message.
    ///
    /// # Errors
    ///
    /// [`Malformed::Truncated`] if the body ended before the message did.
    pub fn finish(self) -> Result<TensorMessage, WireError> {
        if let Some(message) = self.done {
            return Ok(message);
        }
        Err(self.reader.truncation(Format::Ptm1).unwrap_or_else(|| {
            Malformed::Truncated {
                format: Format::Ptm1,
                expected: len_u64(FIXED_HEADER_LEN),
                received: 0,
            }
            .into()
        }))
    }
}

/// Turns a completely received [`Body`] of a PTM1 body into a message, without copying.
///
/// # Errors
///
/// [`Malformed::Truncated`] if the body is incomplete.
pub fn message_from_body<B: ReceiveBuffer>(body: Body<B>) -> Result<TensorMessage, WireError> {
    Ok(into_message(body.finish()?))
}

fn into_message(parts: Parts) -> TensorMessage {
    TensorMessage {
        version: parts.version,
        metadata: parts.metadata,
        buffers: parts.buffers,
    }
}

#[cfg(test)]
mod tests;
