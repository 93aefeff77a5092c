//! The fixed header and length table shared by PTR1 and PTM1, parsed into a validated [`Layout`].
//!
//! Everything here runs before any payload memory is requested: once a [`Layout`] exists, every
//! limit has been checked and every length is known to fit in `usize`.

use crate::error::{Format, LimitField, Malformed, WireError};
use crate::kind::FrameKind;
use crate::len::{le_u32, le_u64, len_u64};
use crate::limits::Limits;

/// Size of one length-table entry (a little-endian u64).
pub(crate) const TABLE_ENTRY_LEN: usize = 8;

/// The validated shape of one frame or body: what the caller must provide memory for.
///
/// Obtained from [`FixedHeader::layout`] or from a decoder. Every limit has been checked and
/// every length fits in `usize`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    format: Format,
    kind: Option<FrameKind>,
    extension: u8,
    version: u32,
    path_len: usize,
    metadata_len: usize,
    buffer_lens: Vec<usize>,
    head_len: usize,
    wire_len: u64,
}

impl Layout {
    /// The wire format this layout was read from.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The PTR1 frame kind; `None` for a PTM1 body.
    pub fn kind(&self) -> Option<FrameKind> {
        self.kind
    }

    /// The version field, unchanged.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The PTR1 extension byte (the first reserved byte; 0 for PTM1 and for every frame of
    /// plain PTR1). Only peers that agreed on an extension send a value other than 0
    /// ([`crate::stripe`]).
    pub fn extension(&self) -> u8 {
        self.extension
    }

    /// Bytes in the PTR1 path slot (0 for PTM1).
    pub fn path_len(&self) -> usize {
        self.path_len
    }

    /// Bytes of metadata.
    pub fn metadata_len(&self) -> usize {
        self.metadata_len
    }

    /// Length of each buffer, in order.
    pub fn buffer_lens(&self) -> &[usize] {
        &self.buffer_lens
    }

    /// Bytes of the fixed header plus the length table.
    pub fn head_len(&self) -> usize {
        self.head_len
    }

    /// Bytes after the head: path, metadata and buffers.
    pub fn body_len(&self) -> u64 {
        self.wire_len - len_u64(self.head_len)
    }

    /// Bytes of the whole frame or body, head included.
    pub fn wire_len(&self) -> u64 {
        self.wire_len
    }

    /// Payload bytes: the sum of the buffer lengths.
    pub fn payload_len(&self) -> u64 {
        self.body_len() - len_u64(self.path_len) - len_u64(self.metadata_len)
    }
}

/// A parsed and checked fixed header (28 bytes for PTR1, 20 for PTM1).
///
/// The magic, kind, path length, metadata length and buffer count have been checked against
/// the limits, and the head plus path plus metadata are within the wire limit. What is left is
/// to read [`FixedHeader::table_len`] more bytes and call [`FixedHeader::layout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedHeader {
    format: Format,
    kind: Option<FrameKind>,
    extension: u8,
    version: u32,
    path_len: u64,
    metadata_len: u64,
    buffer_count: u32,
    /// Fixed header + length table + path + metadata; no overflow, within the wire limit.
    known_len: u64,
}

impl FixedHeader {
    /// Parses and checks a fixed header; `bytes` must hold at least `format`'s fixed length.
    ///
    /// Checks, in order: magic, kind (PTR1), path length (PTR1), metadata length and buffer
    /// count (PTR1 order; PTM1 checks the count first), then that head, path and metadata fit
    /// the wire limit.
    ///
    /// # Errors
    ///
    /// [`Malformed::Truncated`] if `bytes` is shorter than the fixed header, and the malformed or
    /// limit errors above.
    pub fn parse(format: Format, bytes: &[u8], limits: &Limits) -> Result<Self, WireError> {
        let fixed_len = fixed_len(format);
        let Some(bytes) = bytes.get(..fixed_len) else {
            return Err(Malformed::Truncated {
                format,
                expected: len_u64(fixed_len),
                received: len_u64(bytes.len()),
            }
            .into());
        };
        let found = [bytes[0], bytes[1], bytes[2], bytes[3]];
        if found != format.magic() {
            return Err(Malformed::BadMagic { format, found }.into());
        }
        let header = match format {
            Format::Ptr1 => {
                let kind = FrameKind::from_u8(bytes[4]).ok_or(Malformed::UnknownKind(bytes[4]))?;
                // bytes[5..8] are reserved: written as zeros, never checked (as other peers do).
                // The first is read as the extension byte, which only peers that negotiated an
                // extension set; whoever receives it decides what it means.
                let limits = &limits_for(Some(kind), limits);
                let path_len = u64::from(le_u32(&bytes[12..16]));
                let metadata_len = le_u64(&bytes[16..24]);
                let buffer_count = le_u32(&bytes[24..28]);
                limits.check(LimitField::PathBytes, path_len)?;
                limits.check(LimitField::MetadataBytes, metadata_len)?;
                limits.check(LimitField::BufferCount, u64::from(buffer_count))?;
                Self {
                    format,
                    kind: Some(kind),
                    extension: bytes[5],
                    version: le_u32(&bytes[8..12]),
                    path_len,
                    metadata_len,
                    buffer_count,
                    known_len: 0,
                }
            }
            Format::Ptm1 => {
                let metadata_len = le_u64(&bytes[8..16]);
                let buffer_count = le_u32(&bytes[16..20]);
                limits.check(LimitField::BufferCount, u64::from(buffer_count))?;
                limits.check(LimitField::MetadataBytes, metadata_len)?;
                Self {
                    format,
                    kind: None,
                    extension: 0,
                    version: le_u32(&bytes[4..8]),
                    path_len: 0,
                    metadata_len,
                    buffer_count,
                    known_len: 0,
                }
            }
        };
        let overflow = Malformed::LengthTableOverflow {
            format,
            buffer_count: header.buffer_count,
        };
        let known_len = u64::from(header.buffer_count)
            .checked_mul(len_u64(TABLE_ENTRY_LEN))
            .and_then(|table| table.checked_add(len_u64(fixed_len)))
            .and_then(|head| head.checked_add(header.path_len))
            .and_then(|head| head.checked_add(header.metadata_len))
            .ok_or(overflow)?;
        limits_for(header.kind, limits).check(LimitField::WireBytes, known_len)?;
        Ok(Self {
            known_len,
            ..header
        })
    }

    /// The frame kind (PTR1) or `None` (PTM1).
    pub fn kind(&self) -> Option<FrameKind> {
        self.kind
    }

    /// The PTR1 extension byte (see [`Layout::extension`]).
    pub fn extension(&self) -> u8 {
        self.extension
    }

    /// Number of buffers the length table describes.
    pub fn buffer_count(&self) -> u32 {
        self.buffer_count
    }

    /// Bytes of the length table that follow the fixed header (8 per buffer). At most
    /// 8 × the buffer limit.
    ///
    /// # Errors
    ///
    /// [`Malformed::LengthTableOverflow`] on a target whose `usize` cannot hold it.
    pub fn table_len(&self) -> Result<usize, WireError> {
        usize::try_from(self.buffer_count)
            .ok()
            .and_then(|n| n.checked_mul(TABLE_ENTRY_LEN))
            .ok_or_else(|| {
                Malformed::LengthTableOverflow {
                    format: self.format,
                    buffer_count: self.buffer_count,
                }
                .into()
            })
    }

    /// Parses the length table and checks the complete frame size against the wire limit.
    ///
    /// # Errors
    ///
    /// [`Malformed::Truncated`] if `table` is shorter than [`FixedHeader::table_len`];
    /// [`Malformed::LengthSumOverflow`], [`Malformed::TooLargeForPlatform`] and the wire limit.
    pub fn layout(&self, table: &[u8], limits: &Limits) -> Result<Layout, WireError> {
        let format = self.format;
        let table_len = self.table_len()?;
        let fixed = fixed_len(format);
        let Some(table) = table.get(..table_len) else {
            return Err(Malformed::Truncated {
                format,
                expected: len_u64(fixed + table_len),
                received: len_u64(fixed + table.len()),
            }
            .into());
        };
        let mut wire_len = self.known_len;
        let mut buffer_lens = Vec::with_capacity(table_len / TABLE_ENTRY_LEN);
        for (index, entry) in table.chunks_exact(TABLE_ENTRY_LEN).enumerate() {
            let len = le_u64(entry);
            wire_len = wire_len
                .checked_add(len)
                .ok_or(Malformed::LengthSumOverflow { format, index, len })?;
            buffer_lens.push(to_usize(format, LimitField::BufferBytes, len)?);
        }
        limits_for(self.kind, limits).check(LimitField::WireBytes, wire_len)?;
        Ok(Layout {
            format,
            kind: self.kind,
            extension: self.extension,
            version: self.version,
            path_len: to_usize(format, LimitField::PathBytes, self.path_len)?,
            metadata_len: to_usize(format, LimitField::MetadataBytes, self.metadata_len)?,
            buffer_lens,
            head_len: fixed + table_len,
            wire_len,
        })
    }
}

/// The limits a frame of `kind` is checked against: an Error reply may always carry a short
/// text ([`Limits::for_error_replies`]).
fn limits_for(kind: Option<FrameKind>, limits: &Limits) -> Limits {
    if kind == Some(FrameKind::Error) {
        limits.for_error_replies()
    } else {
        *limits
    }
}

/// Fixed header length of a format.
pub(crate) const fn fixed_len(format: Format) -> usize {
    match format {
        Format::Ptr1 => 28,
        Format::Ptm1 => 20,
    }
}

/// Accumulates a head (fixed header, then length table) from arbitrarily split input.
///
/// Its own memory is bounded: the fixed header plus 8 × the buffer limit.
#[derive(Debug)]
pub(crate) struct HeadDecoder {
    format: Format,
    /// Bytes of the head received so far; `len() <= fixed + table_len`.
    buf: Vec<u8>,
    fixed: Option<FixedHeader>,
}

impl HeadDecoder {
    pub(crate) fn new(format: Format) -> Self {
        Self {
            format,
            buf: Vec::with_capacity(fixed_len(format)),
            fixed: None,
        }
    }

    /// Takes bytes from `input` up to the end of the head. Returns how many it took and, once
    /// the head is complete, the layout (after which the decoder is empty again).
    pub(crate) fn push(
        &mut self,
        input: &[u8],
        limits: &Limits,
    ) -> Result<(usize, Option<Layout>), WireError> {
        let fixed_len = fixed_len(self.format);
        let mut consumed = 0;
        loop {
            let target = match &self.fixed {
                None => fixed_len,
                Some(fixed) => fixed_len + fixed.table_len()?,
            };
            let take = (target - self.buf.len()).min(input.len() - consumed);
            self.buf
                .extend_from_slice(&input[consumed..consumed + take]);
            consumed += take;
            if self.buf.len() < target {
                return Ok((consumed, None));
            }
            match self.fixed {
                None => {
                    // The table's memory grows as its bytes arrive (no reservation up front).
                    self.fixed = Some(FixedHeader::parse(self.format, &self.buf, limits)?);
                }
                Some(fixed) => {
                    let layout = fixed.layout(&self.buf[fixed_len..], limits)?;
                    self.buf.clear();
                    self.buf.shrink_to(fixed_len);
                    self.fixed = None;
                    return Ok((consumed, Some(layout)));
                }
            }
        }
    }

    /// Head bytes held so far (0 between frames).
    pub(crate) fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// How long the frame is known to be so far: the fixed header size, or more once the
    /// fixed header has been parsed.
    pub(crate) fn expected_len(&self) -> u64 {
        self.fixed
            .map_or_else(|| len_u64(fixed_len(self.format)), |fixed| fixed.known_len)
    }
}

fn to_usize(format: Format, field: LimitField, len: u64) -> Result<usize, WireError> {
    usize::try_from(len).map_err(|_| Malformed::TooLargeForPlatform { format, field, len }.into())
}
