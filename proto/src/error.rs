//! Errors, grouped by whose fault they are.
//!
//! - [`Malformed`]: the bytes are not a valid frame (the peer or the input is wrong);
//! - [`LimitExceeded`]: a well-formed length is larger than a configured limit;
//! - [`Misuse`]: the caller used the codec API wrongly (a bug on this side);
//! - [`ConfigError`]: an environment variable holds a value we cannot use.
//!
//! `Display` texts name the field, the value and the limit; they are meant for people and are
//! not a stable API.

use std::fmt;

/// Which wire format an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// The raw-TCP frame, magic `PTR1`.
    Ptr1,
    /// The HTTP/2 body, magic `PTM1`.
    Ptm1,
}

impl Format {
    /// The four magic bytes that open this format.
    pub const fn magic(self) -> [u8; 4] {
        match self {
            Self::Ptr1 => *b"PTR1",
            Self::Ptm1 => *b"PTM1",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ptr1 => "PTR1 frame",
            Self::Ptm1 => "PTM1 body",
        })
    }
}

/// Any failure to encode or decode a PTR1 frame or a PTM1 body.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The input is not a valid frame.
    #[error(transparent)]
    Malformed(#[from] Malformed),
    /// A length is above a configured limit.
    #[error(transparent)]
    LimitExceeded(#[from] LimitExceeded),
    /// The codec API was used wrongly.
    #[error(transparent)]
    Misuse(#[from] Misuse),
}

/// The input bytes do not form a valid frame.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Malformed {
    /// The first four bytes are not the format's magic.
    #[error("malformed {format}: magic is {found:?}, expected {:?}", format.magic().escape_ascii().to_string(), found = found.escape_ascii().to_string())]
    BadMagic {
        /// The format that was expected.
        format: Format,
        /// The four bytes that arrived.
        found: [u8; 4],
    },
    /// The PTR1 kind byte is not one of 1..=6.
    #[error("malformed PTR1 frame: unknown frame kind {0} (known kinds are 1 to 6)")]
    UnknownKind(u8),
    /// The path slot is not valid UTF-8.
    #[error("malformed PTR1 frame: the {len}-byte path is not valid UTF-8 ({source})")]
    InvalidPath {
        /// Length of the path slot.
        len: usize,
        /// Where the UTF-8 decoding failed.
        source: std::str::Utf8Error,
    },
    /// Header, length table, path and metadata together are more than 2^64 bytes.
    #[error(
        "malformed {format}: length table overflow: header, {buffer_count}-entry length table, \
         path and metadata add up to more than 2^64 bytes"
    )]
    LengthTableOverflow {
        /// The format being decoded.
        format: Format,
        /// The advertised buffer count.
        buffer_count: u32,
    },
    /// Adding buffer `index`'s length to the running frame size overflows 2^64.
    #[error(
        "malformed {format}: length sum overflow: adding buffer {index} ({len} bytes) makes the \
         frame larger than 2^64 bytes"
    )]
    LengthSumOverflow {
        /// The format being decoded.
        format: Format,
        /// Index of the buffer whose length overflowed the sum.
        index: usize,
        /// That buffer's advertised length.
        len: u64,
    },
    /// A length does not fit this platform's address space (only on 32-bit targets).
    #[error("malformed {format}: {field} of {len} bytes does not fit this platform's memory")]
    TooLargeForPlatform {
        /// The format being decoded.
        format: Format,
        /// Which length.
        field: LimitField,
        /// The advertised length.
        len: u64,
    },
    /// The input ended before the frame did.
    #[error(
        "malformed {format}: truncated: the frame needs {expected} bytes but only {received} arrived"
    )]
    Truncated {
        /// The format being decoded.
        format: Format,
        /// Bytes the frame needs (the fixed header size if the header itself is incomplete).
        expected: u64,
        /// Bytes that arrived.
        received: u64,
    },
    /// More bytes followed the end of a body or of a single frame.
    #[error("malformed {format}: {extra} trailing bytes after the end of a {expected}-byte frame")]
    TrailingBytes {
        /// The format being decoded.
        format: Format,
        /// The frame's size.
        expected: u64,
        /// How many bytes followed it (at least).
        extra: u64,
    },
    /// A reply kind carries a slot that must be empty for it (for example an Ack with buffers).
    #[error(
        "malformed PTR1 frame: a {kind} frame must have an empty {slot}, but it is {len} bytes long"
    )]
    UnexpectedSlot {
        /// The frame kind's name.
        kind: &'static str,
        /// `"path"`, `"metadata"` or `"buffer list"`.
        slot: &'static str,
        /// Its length (entries for the buffer list).
        len: u64,
    },
}

/// A length the frame declares (or a message has) is above a configured limit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} is {value}, over the limit of {limit}{}", field.variable().map(|v| format!(" ({v})")).unwrap_or_default())]
pub struct LimitExceeded {
    /// Which length.
    pub field: LimitField,
    /// The length that was found.
    pub value: u64,
    /// The limit in force.
    pub limit: u64,
}

impl LimitExceeded {
    /// Reads back a text that starts with what [`LimitExceeded`]'s `Display` writes
    /// (`"buffer count is 100, over the limit of 10 (PULSING_MAX_TENSOR_BUFFERS)"`), as a peer
    /// sends it in an error reply; `None` for any other text.
    pub fn parse(text: &str) -> Option<Self> {
        let (field, rest) = LimitField::ALL.iter().find_map(|field| {
            let rest = text.strip_prefix(field.name())?.strip_prefix(" is ")?;
            Some((*field, rest))
        })?;
        let (value, rest) = rest.split_once(", over the limit of ")?;
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        Some(Self {
            field,
            value: value.parse().ok()?,
            limit: rest[..digits].parse().ok()?,
        })
    }
}

/// The lengths that have limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LimitField {
    /// Bytes in the PTR1 path slot (actor path or SingleResponse message type); fixed 64 KiB.
    PathBytes,
    /// Bytes of metadata.
    MetadataBytes,
    /// Number of buffers.
    BufferCount,
    /// Bytes of one buffer (only used for platform-size errors).
    BufferBytes,
    /// Bytes of the whole frame or body, headers included.
    WireBytes,
}

impl LimitField {
    /// Every field, in the order of the frame's head.
    pub const ALL: [Self; 5] = [
        Self::PathBytes,
        Self::MetadataBytes,
        Self::BufferCount,
        Self::BufferBytes,
        Self::WireBytes,
    ];

    /// What the field is, in words (its `Display`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::PathBytes => "path length in bytes",
            Self::MetadataBytes => "metadata length in bytes",
            Self::BufferCount => "buffer count",
            Self::BufferBytes => "buffer length in bytes",
            Self::WireBytes => "frame size in bytes",
        }
    }

    /// The environment variable that configures this limit, if any.
    pub const fn variable(self) -> Option<&'static str> {
        match self {
            Self::PathBytes | Self::BufferBytes => None,
            Self::MetadataBytes => Some("PULSING_MAX_TENSOR_METADATA_BYTES"),
            Self::BufferCount => Some("PULSING_MAX_TENSOR_BUFFERS"),
            Self::WireBytes => Some("PULSING_MAX_TENSOR_WIRE_BYTES"),
        }
    }
}

impl fmt::Display for LimitField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The codec API was used wrongly; this is a bug in the calling code, not bad input.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Misuse {
    /// A receive buffer handed to the decoder is not the length the layout asked for.
    #[error("receive buffer for {section} is {actual} bytes long, the layout asked for {expected}")]
    ReceiveBufferLength {
        /// `"metadata"` or `"buffer N"`.
        section: String,
        /// Requested length.
        expected: usize,
        /// Length of the buffer that was provided.
        actual: usize,
    },
    /// `advance` was called with more bytes than remain unfilled.
    #[error("advanced by {by} bytes but only {remaining} bytes of the body were unfilled")]
    AdvancePastEnd {
        /// The argument to `advance`.
        by: usize,
        /// Unfilled bytes left.
        remaining: u64,
    },
    /// A decoder was used again after it returned an error.
    #[error("the decoder failed earlier and cannot be used again")]
    DecoderFailed,
}

/// An environment variable holds a value tensorwire cannot use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid value {value:?} for {variable}: expected {expected}")]
pub struct ConfigError {
    /// The variable's name.
    pub variable: &'static str,
    /// The value it holds (lossily decoded if it is not UTF-8).
    pub value: String,
    /// What would have been accepted.
    pub expected: &'static str,
}
