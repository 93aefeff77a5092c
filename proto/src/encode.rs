//! Building the small head of a frame; the payload is referenced, never copied.

use bytes::Bytes;

use crate::error::{Format, LimitExceeded, LimitField, WireError};
use crate::head::{TABLE_ENTRY_LEN, fixed_len};
use crate::kind::FrameKind;
use crate::len::len_u64;
use crate::limits::Limits;

/// An encoded frame or body: a small `head` followed by `parts` that reference the caller's
/// memory.
///
/// Write [`Encoded::slices`] in order (one vectored write, or one `sendmsg`) to send it. The
/// `head` is the fixed header, the length table and, for PTR1, the path (at most 64 KiB, copied
/// once); `parts` are the metadata and every non-empty buffer, shared with the message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoded {
    head: Bytes,
    parts: Vec<Bytes>,
    wire_len: u64,
}

impl Encoded {
    /// Fixed header, length table and (PTR1) path.
    pub fn head(&self) -> &Bytes {
        &self.head
    }

    /// Metadata and each non-empty buffer, in wire order (empty ones are left out).
    pub fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    /// Every slice to write, in order: the head, then the parts.
    pub fn slices(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(&self.head[..]).chain(self.parts.iter().map(|part| &part[..]))
    }

    /// Total bytes on the wire; what the wire limit and the byte counters count.
    pub fn wire_len(&self) -> u64 {
        self.wire_len
    }

    /// Takes the head and the parts apart.
    pub fn into_parts(self) -> (Bytes, Vec<Bytes>) {
        (self.head, self.parts)
    }

    /// Concatenates everything into one vector. This copies the payload: it is for tests and
    /// for transports that need one contiguous body anyway.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(usize::try_from(self.wire_len).unwrap_or(0));
        self.slices().for_each(|slice| out.extend_from_slice(slice));
        out
    }
}

/// A frame's head (fixed header, length table, path) and its length on the wire, built before
/// its parts are joined to it: a sender that owns the message moves them in
/// ([`Head::join`]) instead of sharing them, and one that copies the message somewhere needs
/// no parts at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    head: Bytes,
    /// Parts the frame has at most (metadata and every buffer).
    parts: usize,
    wire_len: u64,
}

impl Head {
    /// Total bytes on the wire, as [`Encoded::wire_len`].
    pub fn wire_len(&self) -> u64 {
        self.wire_len
    }

    /// The frame: this head and `parts` — the metadata, then every buffer, of the message the
    /// head was built from (empty ones are left out, as on the wire).
    pub fn join(self, parts: impl IntoIterator<Item = Bytes>) -> Encoded {
        // One slot more: a transmit puts the head in front without growing it.
        let mut joined = Vec::with_capacity(self.parts + 1);
        joined.extend(parts.into_iter().filter(|part| !part.is_empty()));
        check_parts(self.head.len(), self.wire_len, &joined);
        Encoded {
            head: self.head,
            parts: joined,
            wire_len: self.wire_len,
        }
    }

    /// The frame with its parts shared with the caller (each `Bytes` cloned): `metadata` and
    /// `buffers` of the message the head was built from.
    pub fn share(self, metadata: &Bytes, buffers: &[Bytes]) -> Encoded {
        self.join(std::iter::once(metadata).chain(buffers).cloned())
    }

    /// [`Head::join`] as one list of slices, the head first (for a writer that takes them in
    /// order).
    pub fn into_slices(self, parts: impl IntoIterator<Item = Bytes>) -> Vec<Bytes> {
        let (head_len, wire_len) = (self.head.len(), self.wire_len);
        let mut slices = Vec::with_capacity(self.parts + 1);
        slices.push(self.head);
        slices.extend(parts.into_iter().filter(|part| !part.is_empty()));
        check_parts(head_len, wire_len, &slices[1..]);
        slices
    }
}

/// Parts that are not the message a head was built from make a corrupt frame: a caller's bug,
/// caught in debug builds.
fn check_parts(head_len: usize, wire_len: u64, parts: &[Bytes]) {
    debug_assert_eq!(
        parts.iter().map(|p| len_u64(p.len())).sum::<u64>() + len_u64(head_len),
        wire_len,
        "the parts joined to a head are not its message's"
    );
}

/// Builds any frame's head, without touching its parts. Checks (PTR1 order) path, metadata,
/// count, then the total; PTM1 checks the count before the metadata, as other PTM1 peers do.
#[allow(clippy::too_many_arguments)] // one private funnel for both formats and every kind
pub(crate) fn head(
    format: Format,
    kind: Option<FrameKind>,
    extension: u8,
    version: u32,
    path: &[u8],
    metadata: &Bytes,
    buffers: &[Bytes],
    limits: &Limits,
) -> Result<Head, WireError> {
    let path_len = len_u64(path.len());
    let metadata_len = len_u64(metadata.len());
    let count = len_u64(buffers.len());
    if format == Format::Ptr1 {
        limits.check(LimitField::PathBytes, path_len)?;
        limits.check(LimitField::MetadataBytes, metadata_len)?;
        limits.check(LimitField::BufferCount, count)?;
    } else {
        limits.check(LimitField::BufferCount, count)?;
        limits.check(LimitField::MetadataBytes, metadata_len)?;
    }
    let too_many = || LimitExceeded {
        field: LimitField::BufferCount,
        value: count,
        limit: u64::from(u32::MAX),
    };
    let count32 = u32::try_from(buffers.len()).map_err(|_| too_many())?;
    let path32 = u32::try_from(path.len()).map_err(|_| LimitExceeded {
        field: LimitField::PathBytes,
        value: path_len,
        limit: Limits::MAX_PATH_BYTES,
    })?;

    let head_len = fixed_len(format) + buffers.len() * TABLE_ENTRY_LEN + path.len();
    let wire_len = buffers
        .iter()
        .try_fold(len_u64(head_len) + metadata_len, |sum, b| {
            sum.checked_add(len_u64(b.len()))
        })
        .unwrap_or(u64::MAX);
    limits.check(LimitField::WireBytes, wire_len)?;

    let mut head = Vec::with_capacity(head_len);
    head.extend_from_slice(&format.magic());
    match kind {
        Some(kind) => {
            head.push(kind as u8);
            head.extend_from_slice(&[extension, 0, 0]); // extension, reserved
            head.extend_from_slice(&version.to_le_bytes());
            head.extend_from_slice(&path32.to_le_bytes());
        }
        None => head.extend_from_slice(&version.to_le_bytes()),
    }
    head.extend_from_slice(&metadata_len.to_le_bytes());
    head.extend_from_slice(&count32.to_le_bytes());
    for buffer in buffers {
        head.extend_from_slice(&len_u64(buffer.len()).to_le_bytes());
    }
    head.extend_from_slice(path);
    Ok(Head {
        head: Bytes::from(head),
        parts: buffers.len() + 1,
        wire_len,
    })
}
