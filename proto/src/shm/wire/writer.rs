//! Writing a control message: measured first (nothing copied), then written once, straight
//! where it goes — a queue's ring ([`Record::write_to`]) or a datagram's vector.

use super::{Body, Control, EncodeError, MAGIC, MAX_DATAGRAM, MAX_ERROR_TEXT, Part, WireReply};
use crate::transport::RequestKind;

/// A control message ready to be written: its length known and checked against
/// [`MAX_DATAGRAM`], its bytes written only where the driver places them, so a small body goes
/// from the caller's buffers into the queue in one copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    control: Control,
    len: usize,
}

impl Record {
    /// Measures `control`.
    ///
    /// # Errors
    ///
    /// [`EncodeError`] if its encoding would exceed [`MAX_DATAGRAM`].
    pub fn new(control: Control) -> Result<Self, EncodeError> {
        let mut count = Count(0);
        write(&mut count, &control);
        if count.0 > MAX_DATAGRAM {
            return Err(EncodeError { len: count.0 });
        }
        Ok(Self {
            control,
            len: count.0,
        })
    }

    /// Bytes it takes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never: a record holds at least its magic and tag.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The message.
    pub fn control(&self) -> &Control {
        &self.control
    }

    /// Writes its bytes into `out`, which must be [`Record::len`] bytes long: a shorter one
    /// gets what fits, a longer one keeps its tail.
    pub fn write_to(&self, out: &mut [u8]) {
        write(&mut Slice { out, at: 0 }, &self.control);
    }

    /// Its bytes in a vector of their own.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        write(&mut out, &self.control);
        out
    }
}

/// Encodes a message.
///
/// # Errors
///
/// [`EncodeError`] if the datagram would exceed [`MAX_DATAGRAM`] (a long path, many parts or
/// large inline bytes): the sender then moves bytes into shared memory or refuses.
pub fn encode(control: &Control) -> Result<Vec<u8>, EncodeError> {
    let mut count = Count(0);
    write(&mut count, control);
    if count.0 > MAX_DATAGRAM {
        return Err(EncodeError { len: count.0 });
    }
    let mut out = Vec::with_capacity(count.0);
    write(&mut out, control);
    Ok(out)
}

/// Where encoded bytes go.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

/// Counts them.
struct Count(usize);

impl Sink for Count {
    fn put(&mut self, bytes: &[u8]) {
        self.0 = self.0.saturating_add(bytes.len());
    }
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Writes them into a slice, as far as it goes.
struct Slice<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl Sink for Slice<'_> {
    fn put(&mut self, bytes: &[u8]) {
        let end = self.at.saturating_add(bytes.len()).min(self.out.len());
        if let Some(room) = self.out.get_mut(self.at..end) {
            room.copy_from_slice(&bytes[..room.len()]);
        }
        self.at = end;
    }
}

fn write(w: &mut impl Sink, control: &Control) {
    w.put(MAGIC);
    match control {
        Control::Hello(h) => {
            w.put(&[1]);
            str(w, &h.boot_id);
            w.put(&h.user_ns.to_le_bytes());
            w.put(&h.uid.to_le_bytes());
            w.put(&h.pid.to_le_bytes());
            str(w, &h.node);
            w.put(&h.ticket.to_le_bytes());
            str(w, &h.via);
            w.put(&h.proof);
            w.put(&h.queue.to_le_bytes());
        }
        Control::Request {
            id,
            kind,
            path,
            body: b,
        } => {
            w.put(&[2]);
            w.put(&id.to_le_bytes());
            w.put(&[match kind {
                RequestKind::Ask => 0,
                RequestKind::Tell => 1,
            }]);
            str(w, path);
            body(w, b);
        }
        Control::Reply { id, reply } => {
            w.put(&[3]);
            w.put(&id.to_le_bytes());
            match reply {
                WireReply::Tensor(b) => {
                    w.put(&[0]);
                    body(w, b);
                }
                WireReply::Single { msg_type, data } => {
                    w.put(&[1]);
                    str(w, msg_type);
                    bytes(w, data);
                }
                WireReply::Ack => w.put(&[2]),
                WireReply::Error(text) => {
                    w.put(&[3]);
                    str(w, super::truncated(text, MAX_ERROR_TEXT));
                }
            }
        }
        Control::Release { leases } => {
            w.put(&[4]);
            len(w, leases.len());
            for lease in leases {
                w.put(&lease.to_le_bytes());
            }
        }
        Control::Map { segment, len } => {
            w.put(&[5]);
            w.put(&segment.to_le_bytes());
            w.put(&len.to_le_bytes());
        }
        Control::Retire { segment } => {
            w.put(&[6]);
            w.put(&segment.to_le_bytes());
        }
        Control::Unmapped { segment } => {
            w.put(&[7]);
            w.put(&segment.to_le_bytes());
        }
        Control::Bell => w.put(&[8]),
    }
}

fn len(w: &mut impl Sink, n: usize) {
    w.put(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

fn bytes(w: &mut impl Sink, b: &[u8]) {
    len(w, b.len());
    w.put(b);
}

fn str(w: &mut impl Sink, s: &str) {
    bytes(w, s.as_bytes());
}

fn body(w: &mut impl Sink, body: &Body) {
    match body {
        Body::Inline(b) => {
            w.put(&[0]);
            bytes(w, b);
        }
        Body::InlineSlices(slices) => {
            w.put(&[0]);
            len(
                w,
                slices
                    .iter()
                    .map(|s| s.len())
                    .fold(0, usize::saturating_add),
            );
            for slice in slices {
                w.put(slice);
            }
        }
        Body::Packed(shared) => {
            w.put(&[1]);
            self::shared(w, shared);
        }
        Body::Parts {
            version,
            metadata,
            buffers,
        } => {
            w.put(&[2]);
            w.put(&version.to_le_bytes());
            part(w, metadata);
            len(w, buffers.len());
            for p in buffers {
                part(w, p);
            }
        }
    }
}

fn shared(w: &mut impl Sink, s: &super::Shared) {
    for v in [s.segment, s.offset, s.len, s.lease] {
        w.put(&v.to_le_bytes());
    }
}

fn part(w: &mut impl Sink, part: &Part) {
    match part {
        Part::Inline(b) => {
            w.put(&[0]);
            bytes(w, b);
        }
        Part::Shared(s) => {
            w.put(&[1]);
            shared(w, s);
        }
        Part::Returned(r) => {
            w.put(&[2]);
            for v in [r.segment, r.offset, r.len] {
                w.put(&v.to_le_bytes());
            }
        }
    }
}
