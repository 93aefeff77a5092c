//! Reading whole frames from arbitrarily split input (shared by the PTR1 stream decoder and the
//! PTM1 body decoder), and splitting a contiguous frame into zero-copy slices.

use bytes::Bytes;

use crate::body::{Body, Parts, ReceiveBuffer};
use crate::error::{Format, Malformed, Misuse, WireError};
use crate::head::{FixedHeader, HeadDecoder, Layout, fixed_len};
use crate::len::len_u64;
use crate::limits::Limits;

/// Reads frames: head first, then the body into memory from an allocator, which is asked for
/// a section only when its first byte arrives.
#[derive(Debug)]
pub(crate) struct FrameReader<B> {
    limits: Limits,
    state: ReaderState<B>,
}

#[derive(Debug)]
enum ReaderState<B> {
    Head(HeadDecoder),
    Body(Body<B>),
    /// An error was returned; the stream position is unknown.
    Failed,
}

impl<B: ReceiveBuffer> FrameReader<B> {
    pub(crate) fn new(format: Format, limits: Limits) -> Self {
        Self {
            limits,
            state: ReaderState::Head(HeadDecoder::new(format)),
        }
    }

    /// Consumes input up to the end of one frame. Returns bytes consumed and, when a frame
    /// completed, its parts. After an error every call fails with [`Misuse::DecoderFailed`].
    pub(crate) fn push(
        &mut self,
        input: &[u8],
        alloc: &mut impl FnMut(usize) -> B,
    ) -> Result<(usize, Option<Parts>), WireError> {
        let mut alloc = |len| Ok::<B, WireError>(alloc(len));
        let mut consumed = 0;
        loop {
            // The state stays `Failed` if anything below returns an error.
            self.state = match std::mem::replace(&mut self.state, ReaderState::Failed) {
                ReaderState::Failed => return Err(Misuse::DecoderFailed.into()),
                ReaderState::Head(mut head) => {
                    let (n, layout) = head.push(&input[consumed..], &self.limits)?;
                    consumed += n;
                    match layout {
                        Some(layout) => ReaderState::Body(Body::new(layout)),
                        None => {
                            self.state = ReaderState::Head(head);
                            return Ok((consumed, None));
                        }
                    }
                }
                ReaderState::Body(mut body) => {
                    consumed += body.fill(&input[consumed..], &mut alloc)?;
                    if !body.is_complete() {
                        self.state = ReaderState::Body(body);
                        return Ok((consumed, None));
                    }
                    self.state = ReaderState::Head(HeadDecoder::new(body.layout().format()));
                    return Ok((consumed, Some(body.finish()?)));
                }
            };
        }
    }

    /// Whether the reader is between frames (no partial frame held).
    pub(crate) fn is_idle(&self) -> bool {
        matches!(&self.state, ReaderState::Head(head) if head.buffered() == 0)
    }

    /// The error to report when the input ends now, if a frame is incomplete.
    pub(crate) fn truncation(&self, format: Format) -> Option<WireError> {
        let (expected, received) = match &self.state {
            ReaderState::Head(head) if head.buffered() == 0 => return None,
            ReaderState::Head(head) => (head.expected_len(), len_u64(head.buffered())),
            ReaderState::Body(body) => (
                body.layout().wire_len(),
                len_u64(body.layout().head_len()) + body.received(),
            ),
            ReaderState::Failed => return Some(Misuse::DecoderFailed.into()),
        };
        Some(
            Malformed::Truncated {
                format,
                expected,
                received,
            }
            .into(),
        )
    }
}

/// Splits one complete frame held in contiguous memory into zero-copy slices.
pub(crate) fn split_contiguous(
    format: Format,
    bytes: Bytes,
    limits: &Limits,
) -> Result<Parts, WireError> {
    let fixed = FixedHeader::parse(format, &bytes, limits)?;
    let layout: Layout = fixed.layout(&bytes[fixed_len(format)..], limits)?;
    let received = len_u64(bytes.len());
    if received < layout.wire_len() {
        return Err(Malformed::Truncated {
            format,
            expected: layout.wire_len(),
            received,
        }
        .into());
    }
    if received > layout.wire_len() {
        let extra = received - layout.wire_len();
        return Err(Malformed::TrailingBytes {
            format,
            expected: layout.wire_len(),
            extra,
        }
        .into());
    }
    // From here every offset is within `bytes`: the layout's lengths add up to its length.
    let mut at = layout.head_len();
    let mut next = |len: usize| {
        let slice = bytes.slice(at..at + len);
        at += len;
        slice
    };
    let path = next(layout.path_len());
    let path = std::str::from_utf8(&path)
        .map_err(|e| Malformed::InvalidPath {
            len: path.len(),
            source: e,
        })?
        .to_owned();
    let metadata = next(layout.metadata_len());
    let buffers = layout.buffer_lens().iter().map(|&len| next(len)).collect();
    Ok(Parts {
        kind: layout.kind(),
        version: layout.version(),
        path,
        metadata,
        buffers,
    })
}
