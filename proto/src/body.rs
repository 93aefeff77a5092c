//! Placing a frame's path, metadata and buffers straight into their final memory, committing
//! memory only as the bytes for it arrive.

use std::ops::Range;

use bytes::{Bytes, BytesMut};

use crate::error::{Malformed, Misuse, WireError};
use crate::head::Layout;
use crate::kind::FrameKind;
use crate::len::len_u64;

/// Memory a decoder writes one received metadata block or buffer into.
///
/// The decoder asks for it by length only after every limit has been checked, and only once the
/// first byte of that section is about to arrive. It fills the memory in place and finally turns
/// it into [`Bytes`] without copying. A receive pool implements this for its slots.
pub trait ReceiveBuffer: AsMut<[u8]> {
    /// Turns the filled memory into immutable [`Bytes`] without copying.
    fn freeze(self) -> Bytes;

    /// Called once for each range of the buffer before the first bytes are written into it
    /// (ranges come in order and never overlap). A pool pre-faults fresh memory here, so pages
    /// are committed a bounded window ahead of the data, never for what a peer merely declared.
    fn prepare(&mut self, range: Range<usize>) {
        let _ = range;
    }

    /// How many bytes from the start of this buffer are backed by memory already committed (a
    /// pool slot reused warm): exposing them to reads commits nothing new, so a receiver may
    /// expose them before the bytes that pay for a window arrive. The default, 0, claims
    /// nothing.
    fn committed(&self) -> usize {
        0
    }
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
/// Nothing is allocated up front. Memory for a section is requested when the first byte of it
/// is about to arrive: either through [`Body::fill`] (the decoder copies a chunk into place) or
/// through [`Body::expose`] followed by a scatter read of the caller's own into
/// [`Body::unfilled`] and [`Body::advance`]. When [`Body::is_complete`], the memory becomes
/// [`Bytes`] without copying ([`crate::ptr1::Frame::from_body`], [`crate::ptm1::message_from_body`]).
#[derive(Debug)]
pub struct Body<B> {
    layout: Layout,
    /// Path bytes received or exposed so far (never longer than the path, at most 64 KiB).
    path: Vec<u8>,
    /// Metadata, then one entry per buffer; `None` until allocated (always `None` when empty).
    sections: Vec<Option<B>>,
    /// Index of the section being filled: 0 path, 1 metadata, 2 + i buffer i. Never points at an
    /// empty section; equals the section count when the body is complete.
    section: usize,
    /// Bytes already filled in the current section; less than its length.
    offset: usize,
    /// Bytes filled in all sections; at most `layout.body_len()`.
    filled: u64,
    /// Bytes (from the start of the body) for which memory exists and was prepared; at least
    /// `filled`.
    exposed: u64,
}

impl<B: ReceiveBuffer> Body<B> {
    /// A body for `layout`; no memory is requested yet.
    pub fn new(layout: Layout) -> Self {
        let mut sections = Vec::new();
        sections.resize_with(layout.buffer_lens().len() + 1, || None);
        let mut body = Self {
            path: Vec::new(),
            layout,
            sections,
            section: 0,
            offset: 0,
            filled: 0,
            exposed: 0,
        };
        body.skip_empty_sections();
        body
    }

    /// The layout this body was made for.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Body bytes still to arrive.
    pub fn remaining(&self) -> u64 {
        self.layout.body_len() - self.filled
    }

    /// Body bytes that arrived so far.
    pub fn received(&self) -> u64 {
        self.filled
    }

    /// Whether every byte has arrived.
    pub fn is_complete(&self) -> bool {
        self.remaining() == 0
    }

    /// The path slot, once all of it arrived (it is checked to be UTF-8 then); `None` before.
    pub fn path(&self) -> Option<&str> {
        if self.section == 0 {
            return None;
        }
        std::str::from_utf8(&self.path).ok()
    }

    /// Copies the start of `input` into place, requesting memory from `alloc` for each section
    /// the bytes reach; returns how many bytes it took (fewer than `input.len()` only when the
    /// body became complete).
    ///
    /// # Errors
    ///
    /// [`Malformed::InvalidPath`] once the path slot is complete and not UTF-8; whatever `alloc`
    /// returns; [`Misuse::ReceiveBufferLength`] if it returns memory of the wrong length.
    pub fn fill<E: From<WireError>>(
        &mut self,
        input: &[u8],
        alloc: &mut impl FnMut(usize) -> Result<B, E>,
    ) -> Result<usize, E> {
        let wanted = usize::try_from(self.remaining()).map_or(input.len(), |r| r.min(input.len()));
        self.expose(wanted, alloc)?;
        let mut consumed = 0;
        for dest in self.unfilled() {
            let n = dest.len().min(wanted - consumed);
            dest[..n].copy_from_slice(&input[consumed..consumed + n]);
            consumed += n;
            if consumed == wanted {
                break;
            }
        }
        self.advance(consumed)?;
        Ok(consumed)
    }

    /// Makes memory available for (at least one and) at most `window` bytes beyond what has
    /// arrived, requesting it from `alloc` section by section and preparing each newly exposed
    /// range ([`ReceiveBuffer::prepare`]). Bytes already exposed stay exposed.
    ///
    /// # Errors
    ///
    /// As [`Body::fill`].
    pub fn expose<E: From<WireError>>(
        &mut self,
        window: usize,
        alloc: &mut impl FnMut(usize) -> Result<B, E>,
    ) -> Result<(), E> {
        let target = self
            .filled
            .saturating_add(len_u64(window.max(1)))
            .min(self.layout.body_len());
        // Walk the sections from the current one, each starting at `start` in body offsets.
        let mut start = self.filled - len_u64(self.offset);
        let mut section = self.section;
        while self.exposed < target && section < self.section_count() {
            let len = self.section_len(section);
            let end = start + len_u64(len);
            if len > 0 && end > self.exposed {
                // Exposed part of this section: [from, to) in section offsets.
                let from = usize::try_from(self.exposed.max(start) - start).unwrap_or(len);
                let to = usize::try_from(end.min(target) - start).unwrap_or(len);
                self.expose_section(section, len, from..to, alloc)?;
                self.exposed = start + len_u64(to);
            }
            start = end;
            section += 1;
        }
        Ok(())
    }

    /// Bytes after the exposed ones, in the section that holds the next unexposed byte, whose
    /// memory exists and is already committed ([`ReceiveBuffer::committed`]): exposing them
    /// costs no new memory. 0 when that section has no memory yet.
    pub fn committed_ahead(&self) -> u64 {
        // Body offset where each section starts, up to the one holding `exposed`.
        let mut start = self.filled - len_u64(self.offset);
        for section in self.section..self.section_count() {
            let len = len_u64(self.section_len(section));
            let end = start + len;
            if self.exposed < end {
                let memory = match section {
                    0 => None,
                    n => self.sections[n - 1].as_ref(),
                };
                let committed = memory.map_or(0, |m| len_u64(m.committed()).min(len));
                return (start + committed).saturating_sub(self.exposed);
            }
            start = end;
        }
        0
    }

    /// The exposed, unfilled memory in wire order, as non-empty slices: read the next bytes of
    /// the stream into them (for example with one `recvmsg` over all of them), then call
    /// [`Body::advance`] with the count. Empty until [`Body::expose`] is called.
    pub fn unfilled(&mut self) -> impl Iterator<Item = &mut [u8]> {
        let (section, offset) = (self.section, self.offset);
        let budget = usize::try_from(self.exposed - self.filled).unwrap_or(usize::MAX);
        let path: &mut [u8] = self.path.as_mut_slice();
        std::iter::once(path)
            .chain(self.sections.iter_mut().map(|memory| match memory {
                Some(memory) => memory.as_mut(),
                None => &mut [],
            }))
            .skip(section)
            .enumerate()
            // Stops after the last exposed byte; empty sections in between yield nothing.
            .scan(budget, move |budget, (i, slice)| {
                if *budget == 0 {
                    return None;
                }
                let slice = if i == 0 {
                    slice.get_mut(offset..).unwrap_or_default()
                } else {
                    slice
                };
                let take = slice.len().min(*budget);
                *budget -= take;
                Some(&mut slice[..take])
            })
            .filter(|slice| !slice.is_empty())
    }

    /// Exposed bytes that have not arrived yet: what [`Body::unfilled`] covers.
    pub fn exposed_unfilled(&self) -> u64 {
        self.exposed - self.filled
    }

    /// Records that the next `n` bytes of [`Body::unfilled`] were written.
    ///
    /// # Errors
    ///
    /// [`Misuse::AdvancePastEnd`] if `n` is more than the exposed unfilled bytes;
    /// [`Malformed::InvalidPath`] once the path slot is complete and not UTF-8.
    pub fn advance(&mut self, n: usize) -> Result<(), WireError> {
        let exposed = self.exposed - self.filled;
        if len_u64(n) > exposed {
            return Err(Misuse::AdvancePastEnd {
                by: n,
                remaining: exposed,
            }
            .into());
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
        let mut sections = self
            .sections
            .into_iter()
            .map(|memory| memory.map_or_else(Bytes::new, ReceiveBuffer::freeze));
        let metadata = sections.next().unwrap_or_default();
        Ok(Parts {
            kind: self.layout.kind(),
            version: self.layout.version(),
            path,
            metadata,
            buffers: sections.collect(),
        })
    }

    /// Allocates section `section` (of `len` bytes) if needed and prepares `range` of it.
    fn expose_section<E: From<WireError>>(
        &mut self,
        section: usize,
        len: usize,
        range: Range<usize>,
        alloc: &mut impl FnMut(usize) -> Result<B, E>,
    ) -> Result<(), E> {
        if section == 0 {
            self.path.resize(range.end, 0);
            return Ok(());
        }
        let slot = &mut self.sections[section - 1];
        let memory = match slot {
            Some(memory) => memory,
            None => {
                let mut memory = alloc(len)?;
                let actual = memory.as_mut().len();
                if actual != len {
                    return Err(WireError::from(Misuse::ReceiveBufferLength {
                        section: section_name(section),
                        expected: len,
                        actual,
                    })
                    .into());
                }
                slot.insert(memory)
            }
        };
        memory.prepare(range);
        Ok(())
    }

    fn section_len(&self, section: usize) -> usize {
        match section {
            0 => self.layout.path_len(),
            1 => self.layout.metadata_len(),
            n => self.layout.buffer_lens().get(n - 2).copied().unwrap_or(0),
        }
    }

    fn section_count(&self) -> usize {
        1 + self.sections.len()
    }

    /// Moves past empty sections (an empty path needs no UTF-8 check).
    fn skip_empty_sections(&mut self) {
        while self.section < self.section_count() && self.section_len(self.section) == 0 {
            self.section += 1;
        }
    }
}

fn section_name(section: usize) -> String {
    match section {
        0 => "path".to_owned(),
        1 => "metadata".to_owned(),
        n => format!("buffer {}", n - 2),
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
