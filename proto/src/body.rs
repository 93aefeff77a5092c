//! Placing a frame's path, metadata and buffers straight into their final memory.

use bytes::{Bytes, BytesMut};

use crate::error::{Malformed, Misuse, WireError};
use crate::head::{HeadDecoder, Layout, len_u64};
use crate::limits::Limits;
use crate::ptr1::FrameKind;

/// Memory a decoder writes one received metadata block or buffer into.
///
/// The decoder asks for it by length (an allocator closure `FnMut(usize) -> B`) only after every
/// limit has been checked, fills it in place, and finally turns it into [`Bytes`] without
/// copying. A receive pool implements this for its slots.
pub trait ReceiveBuffer: AsMut<[u8]> {
    /// Turns the filled memory into immutable [`Bytes`] without copying.
    fn freeze(self) -> Bytes;
}

impl ReceiveBuffer for Vec<u8> {
    fn freeze(self) -> Bytes {
        Bytes::from(self)
    }
}

impl ReceiveBuffer for BytesMut {
    fn freeze(self) -> Bytes {
        Self::freeze(self)
    }
}

/// The body of one frame (path, metadata, buffers) being received into final memory.
///
/// Bytes arrive either through [`Body::fill`] (the decoder copies a chunk into place) or by a
/// scatter read of the caller's own into [`Body::unfilled`] followed by [`Body::advance`]. When
/// [`Body::is_complete`], [`Body::finish`] turns the memory into [`Bytes`] without copying.
#[derive(Debug)]
pub struct Body<B> {
    layout: Layout,
    /// Path slot bytes (at most 64 KiB).
    path: Vec<u8>,
    /// `None` when the metadata is empty.
    metadata: Option<B>,
    /// One entry per buffer; `None` for an empty buffer.
    buffers: Vec<Option<B>>,
    /// Index of the section being filled: 0 path, 1 metadata, 2 + i buffer i. Never points at an
    /// empty section; equals the section count when the body is complete.
    section: usize,
    /// Bytes already filled in the current section; less than its length.
    offset: usize,
    /// Bytes filled in all sections; at most `layout.body_len()`.
    filled: u64,
}

impl<B: ReceiveBuffer> Body<B> {
    /// Requests memory for every non-empty section of `layout` from `alloc`, in order
    /// (metadata, then each buffer). Empty sections ask for nothing.
    ///
    /// # Errors
    ///
    /// [`Misuse::ReceiveBufferLength`] if `alloc` returns memory of the wrong length.
    pub fn new(layout: Layout, mut alloc: impl FnMut(usize) -> B) -> Result<Self, WireError> {
        let mut take = |section: &dyn Fn() -> String, len: usize| -> Result<Option<B>, WireError> {
            if len == 0 {
                return Ok(None);
            }
            let mut memory = alloc(len);
            let actual = memory.as_mut().len();
            if actual != len {
                return Err(Misuse::ReceiveBufferLength {
                    section: section(),
                    expected: len,
                    actual,
                }
                .into());
            }
            Ok(Some(memory))
        };
        let metadata = take(&|| "metadata".to_owned(), layout.metadata_len())?;
        let buffers = layout
            .buffer_lens()
            .iter()
            .enumerate()
            .map(|(i, &len)| take(&|| format!("buffer {i}"), len))
            .collect::<Result<Vec<_>, _>>()?;
        let mut body = Self {
            path: vec![0; layout.path_len()],
            layout,
            metadata,
            buffers,
            section: 0,
            offset: 0,
            filled: 0,
        };
        body.skip_empty_sections();
        Ok(body)
    }

    /// The layout this body was made for.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Body bytes still to arrive.
    pub fn remaining(&self) -> u64 {
        self.layout.body_len() - self.filled
    }

    /// Whether every byte has arrived.
    pub fn is_complete(&self) -> bool {
        self.remaining() == 0
    }

    /// Copies the start of `input` into place; returns how many bytes it took (fewer than
    /// `input.len()` only when the body became complete).
    ///
    /// # Errors
    ///
    /// [`Malformed::InvalidPath`] once the path slot is complete and not UTF-8.
    pub fn fill(&mut self, input: &[u8]) -> Result<usize, WireError> {
        let mut consumed = 0;
        while consumed < input.len() {
            let Some(dest) = self.unfilled().next() else {
                break;
            };
            let n = dest.len().min(input.len() - consumed);
            dest[..n].copy_from_slice(&input[consumed..consumed + n]);
            consumed += n;
            self.advance(n)?;
        }
        Ok(consumed)
    }

    /// The unfilled memory, in wire order, as non-empty slices: read the next bytes of the
    /// stream into them (for example with one `recvmsg` over all of them), then call
    /// [`Body::advance`] with the count.
    pub fn unfilled(&mut self) -> impl Iterator<Item = &mut [u8]> {
        let (section, offset) = (self.section, self.offset);
        let metadata: &mut [u8] = match &mut self.metadata {
            Some(memory) => memory.as_mut(),
            None => &mut [],
        };
        std::iter::once(self.path.as_mut_slice())
            .chain(std::iter::once(metadata))
            .chain(self.buffers.iter_mut().map(|buffer| match buffer {
                Some(memory) => memory.as_mut(),
                None => &mut [],
            }))
            .skip(section)
            .enumerate()
            .map(move |(i, slice)| if i == 0 { &mut slice[offset..] } else { slice })
            .filter(|slice| !slice.is_empty())
    }

    /// Records that the next `n` bytes of [`Body::unfilled`] were written.
    ///
    /// # Errors
    ///
    /// [`Misuse::AdvancePastEnd`] if `n` is more than [`Body::remaining`];
    /// [`Malformed::InvalidPath`] once the path slot is complete and not UTF-8.
    pub fn advance(&mut self, n: usize) -> Result<(), WireError> {
        let remaining = self.remaining();
        if len_u64(n) > remaining {
            return Err(Misuse::AdvancePastEnd { by: n, remaining }.into());
        }
        self.filled += len_u64(n);
        let mut n = n;
        while n > 0 {
            let left = self.section_len(self.section) - self.offset;
            if n < left {
                self.offset += n;
                break;
            }
            n -= left;
            if self.section == 0 {
                std::str::from_utf8(&self.path).map_err(|e| invalid_path(e, self.path.len()))?;
            }
            self.section += 1;
            self.offset = 0;
            self.skip_empty_sections();
        }
        Ok(())
    }

    /// Hands out the received parts without copying.
    ///
    /// # Errors
    ///
    /// [`Malformed::Truncated`] if bytes are still missing.
    pub(crate) fn finish(self) -> Result<Parts, WireError> {
        if !self.is_complete() {
            return Err(Malformed::Truncated {
                format: self.layout.format(),
                expected: self.layout.wire_len(),
                received: len_u64(self.layout.head_len()) + self.filled,
            }
            .into());
        }
        // The path was checked when its section completed; a second check is cheap (<= 64 KiB)
        // and keeps this conversion free of any `unwrap`.
        let path = String::from_utf8(self.path).map_err(|e| invalid_path(e.utf8_error(), 0))?;
        Ok(Parts {
            kind: self.layout.kind(),
            version: self.layout.version(),
            path,
            metadata: self.metadata.map_or_else(Bytes::new, ReceiveBuffer::freeze),
            buffers: self
                .buffers
                .into_iter()
                .map(|buffer| buffer.map_or_else(Bytes::new, ReceiveBuffer::freeze))
                .collect(),
        })
    }

    fn section_len(&self, section: usize) -> usize {
        match section {
            0 => self.layout.path_len(),
            1 => self.layout.metadata_len(),
            n => self.layout.buffer_lens().get(n - 2).copied().unwrap_or(0),
        }
    }

    fn section_count(&self) -> usize {
        2 + self.buffers.len()
    }

    /// Moves past empty sections (an empty path needs no UTF-8 check).
    fn skip_empty_sections(&mut self) {
        while self.section < self.section_count() && self.section_len(self.section) == 0 {
            self.section += 1;
        }
    }
}

fn invalid_path(source: std::str::Utf8Error, len: usize) -> WireError {
    Malformed::InvalidPath { len, source }.into()
}

/// A complete frame's parts, before they are given their PTR1 or PTM1 meaning.
#[derive(Debug)]
pub(crate) struct Parts {
    pub(crate) kind: Option<FrameKind>,
    pub(crate) version: u32,
    pub(crate) path: String,
    pub(crate) metadata: Bytes,
    pub(crate) buffers: Vec<Bytes>,
}

/// Reads frames from arbitrarily split input: head first, then the body into memory from an
/// allocator. Shared by the PTR1 stream decoder and the PTM1 body decoder.
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
    pub(crate) fn new(format: crate::Format, limits: Limits) -> Self {
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
        let mut consumed = 0;
        loop {
            // The state stays `Failed` if anything below returns an error.
            self.state = match std::mem::replace(&mut self.state, ReaderState::Failed) {
                ReaderState::Failed => return Err(Misuse::DecoderFailed.into()),
                ReaderState::Head(mut head) => {
                    let (n, layout) = head.push(&input[consumed..], &self.limits)?;
                    consumed += n;
                    match layout {
                        Some(layout) => ReaderState::Body(Body::new(layout, &mut *alloc)?),
                        None => {
                            self.state = ReaderState::Head(head);
                            return Ok((consumed, None));
                        }
                    }
                }
                ReaderState::Body(mut body) => {
                    consumed += body.fill(&input[consumed..])?;
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
    pub(crate) fn truncation(&self, format: crate::Format) -> Option<WireError> {
        let (expected, received) = match &self.state {
            ReaderState::Head(head) if head.buffered() == 0 => return None,
            ReaderState::Head(head) => (head.expected_len(), len_u64(head.buffered())),
            ReaderState::Body(body) => (
                body.layout().wire_len(),
                body.layout().wire_len() - body.remaining(),
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
    format: crate::Format,
    bytes: Bytes,
    limits: &Limits,
) -> Result<Parts, WireError> {
    let fixed = crate::FixedHeader::parse(format, &bytes, limits)?;
    let fixed_len = crate::head::fixed_len(format);
    let layout = fixed.layout(&bytes[fixed_len..], limits)?;
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
        .map_err(|e| invalid_path(e, path.len()))?
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
