//! An HTTP body made of shared chunks: a PTM1 body is its head, the metadata and each buffer,
//! handed to h2 one by one (never concatenated, never copied), with an exact length so the
//! peer sees `content-length` and can refuse an oversize body before it is sent.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tensorwire_proto::{Encoded, len_u64};

/// Chunks sent in order.
#[derive(Debug, Default)]
pub(crate) struct ChunkBody {
    chunks: VecDeque<Bytes>,
    remaining: u64,
}

impl ChunkBody {
    /// An encoded PTM1 body: head, metadata, buffers (empty ones skipped).
    pub(crate) fn encoded(encoded: Encoded) -> Self {
        let (head, parts) = encoded.into_parts();
        Self::from_chunks(std::iter::once(head).chain(parts))
    }

    /// These chunks, in order (empty ones skipped).
    pub(crate) fn from_chunks(chunks: impl Iterator<Item = Bytes>) -> Self {
        let chunks: VecDeque<Bytes> = chunks.filter(|chunk| !chunk.is_empty()).collect();
        let remaining = chunks.iter().map(|chunk| len_u64(chunk.len())).sum();
        Self { chunks, remaining }
    }

    /// One chunk (a single reply's data, an error text).
    pub(crate) fn one(data: impl Into<Bytes>) -> Self {
        Self::from_chunks(std::iter::once(data.into()))
    }

    /// Nothing.
    pub(crate) fn empty() -> Self {
        Self::default()
    }
}

impl Body for ChunkBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let Some(chunk) = self.chunks.pop_front() else {
            return Poll::Ready(None);
        };
        self.remaining -= len_u64(chunk.len());
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}
