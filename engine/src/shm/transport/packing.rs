//! Laying a message out for a same-host peer: in the datagram itself (small bodies), where its
//! buffers already are (this node's frozen slots: loans; or the peer's own memory it sent us:
//! an echo — no copy), and the rest copied once into one fresh slot, each buffer 64-byte
//! aligned.
//!
//! Layout is decided first ([`layout`], cheap, on any thread), so the caller knows whether a
//! copy is needed; the copy and the leases come after ([`Layout::fill`]), on whichever thread
//! may do the copy.

use std::sync::Arc;

use bytes::Bytes;
use tensorwire_proto::shm::{Body, MAX_DATAGRAM, Part, Returned, SHARED_PART_BYTES, Shared};
use tensorwire_proto::transport::Error;
use tensorwire_proto::{Head, Limits, TensorMessage, len_u64};

use super::lending::{Lending, LentSlot, Taken};
use crate::shm::segments::{Segment, Segments, Slot, SlotMut};
use crate::shm::split_copy::{SPLIT_FROM, copy_all};

/// A request's whole PTM1 body travels in the record up to this. Above it, one copy into a
/// slot (which the receiver reads in place, and an echo sends back by reference) costs less
/// than copying the body into the queue and out again, whose two copies cross between the
/// CPUs: measured with fresh pairs, a 4 KiB body is as fast either way (faster in flight in
/// the record), an 8 KiB ask takes 5.6 instead of 7.7 µs in a slot, a 16 KiB one 5.4
/// instead of 10.7.
pub(super) const INLINE_REQUEST: usize = 8 << 10;
/// A reply's whole PTM1 body travels in the record up to this (unless it is a view of the
/// asker's own memory, which goes back by reference). Higher than for requests because it
/// measured faster: with a handler that answers with a fresh copy, replies of 12 and 16 KiB
/// in slots took 12.8 and 14.1 µs a round trip against 10.7 and 12.4 in the record (p90 19–23
/// against 13–17 µs), though 64 in flight at 16 KiB did 184k asks/s against 162k. (A reply
/// in a slot holds this node's memory until the asker releases it; until the asker has read
/// its record it also counts against the session's pause on reading that peer's requests,
/// `read_pause_lent_bytes`.)
pub(super) const INLINE_REPLY: usize = 32 << 10;
/// Metadata travels in the datagram up to this; larger goes into the slot.
const INLINE_METADATA: usize = 16 << 10;
/// Copied buffers start at multiples of this in their slot (numpy and torch views align).
const ALIGN: usize = 64;
/// Room a datagram keeps for its header (tag, id, kind, lengths) besides the path.
const HEADER_ROOM: usize = 64;

/// Finds bytes that lie in one of the peer's segments mapped here.
pub(super) type Locate<'a> = dyn Fn(&[u8]) -> Option<Located> + 'a;

/// Where bytes lie in one of the peer's segments mapped here.
pub(super) struct Located {
    /// The peer's id for the segment.
    pub(super) segment: u64,
    /// Where the bytes start in it.
    pub(super) offset: u64,
    /// The addresses of its whole mapping here.
    pub(super) mapping: std::ops::Range<usize>,
}

/// How a message will travel.
pub(super) struct Layout {
    shape: Shape,
    /// Bytes to copy into a fresh slot (0: none needed).
    pub(super) copy: usize,
}

enum Shape {
    /// The PTM1 body in the datagram: its head here, its parts the message's own, moved in
    /// when it is filled (written straight into the queue with the record).
    Inline(Head),
    /// Part by part.
    Parts {
        version: u32,
        metadata: Plan,
        buffers: Vec<Plan>,
    },
    /// The whole PTM1 body copied into a slot (more parts than a datagram can list).
    Packed,
}

/// Where one part goes.
enum Plan {
    Inline(Bytes),
    /// In a frozen slot of ours already: sent where it is.
    Loaned {
        slot: Arc<Slot>,
        offset: u64,
        len: u64,
    },
    /// In the recipient's own memory (a view of what it sent us): sent back by reference.
    Returned(Returned),
    /// Copied into the fresh slot at `at`.
    Copy {
        at: usize,
        bytes: Bytes,
    },
}

/// A message laid out in shared memory, ready to send.
pub(super) struct Packed {
    pub(super) body: Body,
    /// Segments the body refers to (the peer must have mapped them first).
    pub(super) segments: Vec<Arc<Segment>>,
    /// The leases it went out under (released here if the send fails).
    pub(super) leases: Vec<u64>,
    /// Bytes of our slots it lends (their capacity; consecutive views of one slot count it
    /// once).
    pub(super) lent: u64,
    pub(super) copied: u64,
    pub(super) zero_copy: u64,
    /// The message itself, for a body that names (some of) its parts where they are: kept
    /// until the send is done with `Packed`, so a part that is a view of the peer's memory
    /// releases its lease after the record that names it, never before (`None` for an inline
    /// body, which owns the parts).
    pub(super) named: Option<TensorMessage>,
}

impl Packed {
    /// The body, taken to go into the record (the rest stays for the send's bookkeeping).
    pub(super) fn take_body(&mut self) -> Body {
        std::mem::replace(&mut self.body, Body::Inline(Bytes::new()))
    }
}

/// Decides how `message` travels to the peer, with a control message whose path takes
/// `path_len` bytes and a whole body of at most `inline_up_to` bytes inside the record;
/// `ours` finds bytes in this node's own frozen slots (named, not copied), `locate` bytes that
/// are a view of the peer's own memory (sent back by reference). Cheap: no copy, no slot.
///
/// # Errors
///
/// [`Error::Encode`] when the message breaks a limit; [`Error::Misuse`] for a path too long to
/// fit in a control datagram.
pub(super) fn layout(
    message: &TensorMessage,
    limits: &Limits,
    path_len: usize,
    inline_up_to: usize,
    ours: &Segments,
    locate: &Locate<'_>,
) -> Result<Layout, Error> {
    let room = MAX_DATAGRAM
        .checked_sub(HEADER_ROOM + path_len)
        .filter(|room| *room >= 1024)
        .ok_or_else(|| {
            Error::Misuse(format!(
                "a path of {path_len} bytes is too long for the shared-memory path"
            ))
        })?;
    let head = tensorwire_proto::ptm1::encode_head(message, limits).map_err(Error::Encode)?;
    let wire_len =
        usize::try_from(head.wire_len()).map_err(|_| Error::Misuse("message too large".into()))?;
    // A small message goes in the record unless it is (partly) a view of the recipient's own
    // memory, which goes back by reference (an echo: no copy at all).
    let returns = || {
        message
            .buffers
            .iter()
            .any(|b| !b.is_empty() && locate(b).is_some())
    };
    if wire_len <= inline_up_to.min(room.saturating_sub(8)) && !returns() {
        return Ok(Layout {
            shape: Shape::Inline(head),
            copy: 0,
        });
    }
    let mut copy = 0usize;
    // The slot or peer segment the last part was found in: the next part of one loan or of
    // one received message is usually there too, found without another lookup.
    let mut recent = Recent::default();
    let mut plan = |bytes: &Bytes, inline_up_to: usize| -> Plan {
        if bytes.len() <= inline_up_to {
            return Plan::Inline(bytes.clone());
        }
        let len = len_u64(bytes.len());
        // Our slots and the peer's mappings never share an address, so the order of the
        // looks changes nothing but their cost.
        if let Some((slot, offset)) = recent.loaned(bytes) {
            return Plan::Loaned { slot, offset, len };
        }
        if let Some(part) = recent.returned(bytes) {
            return Plan::Returned(part);
        }
        if let Some((slot, offset)) = ours.loaned(bytes) {
            recent.slot = Some(Arc::clone(&slot));
            return Plan::Loaned { slot, offset, len };
        }
        if let Some(located) = locate(bytes) {
            let part = located.part(len);
            recent.peer = Some(located);
            return Plan::Returned(part);
        }
        let at = copy.next_multiple_of(ALIGN);
        copy = at + bytes.len();
        Plan::Copy {
            at,
            bytes: bytes.clone(),
        }
    };
    let metadata = plan(&message.metadata, INLINE_METADATA);
    let buffers: Vec<Plan> = message.buffers.iter().map(|b| plan(b, 0)).collect();
    let listed = std::iter::once(&metadata)
        .chain(&buffers)
        .map(|p| match p {
            Plan::Inline(bytes) => 5 + bytes.len(),
            _ => SHARED_PART_BYTES,
        })
        .sum::<usize>();
    if listed + 16 > room {
        return Ok(Layout {
            shape: Shape::Packed,
            copy: wire_len,
        });
    }
    Ok(Layout {
        shape: Shape::Parts {
            version: message.version,
            metadata,
            buffers,
        },
        copy,
    })
}

/// The last slot of ours and segment of the peer's that a part of the message lay in.
#[derive(Default)]
struct Recent {
    slot: Option<Arc<Slot>>,
    peer: Option<Located>,
}

impl Recent {
    /// `bytes` within the slot of ours the last loaned part lay in (held by this `Arc`, so
    /// still frozen there): that slot, and where `bytes` start in its segment.
    fn loaned(&self, bytes: &[u8]) -> Option<(Arc<Slot>, u64)> {
        let slot = self.slot.as_ref()?;
        let base = slot.as_slice().as_ptr() as usize;
        let at = within(bytes, base..base + slot.capacity())?;
        Some((Arc::clone(slot), len_u64(slot.offset() + at)))
    }

    /// `bytes` within the peer's segment the last returned part lay in, as a part.
    fn returned(&self, bytes: &[u8]) -> Option<Returned> {
        let peer = self.peer.as_ref()?;
        let at = within(bytes, peer.mapping.clone())?;
        Some(Returned {
            segment: peer.segment,
            offset: len_u64(at),
            len: len_u64(bytes.len()),
        })
    }
}

impl Located {
    /// The part of `len` bytes from here.
    fn part(&self, len: u64) -> Returned {
        Returned {
            segment: self.segment,
            offset: self.offset,
            len,
        }
    }
}

/// Where `bytes` start within the addresses `range`, if they lie wholly inside it.
pub(super) fn within(bytes: &[u8], range: std::ops::Range<usize>) -> Option<usize> {
    let start = bytes.as_ptr() as usize;
    let end = start.checked_add(bytes.len())?;
    (start >= range.start && end <= range.end).then(|| start - range.start)
}

impl Layout {
    /// Copies what needs copying into `slot` (given iff `self.copy > 0`) and lends every slot
    /// the body refers to to process `holder`. The message is consumed: an inline body takes
    /// its parts as they are (no reference count touched); other shapes keep it in
    /// [`Packed::named`].
    pub(super) fn fill(
        self,
        message: TensorMessage,
        limits: &Limits,
        taken: Option<Taken<'_>>,
        lending: &Lending,
        holder: u32,
    ) -> Result<Packed, Error> {
        let (slot, mut promise) = Taken::split(taken);
        let mut packed = Packed {
            body: Body::Inline(Bytes::new()),
            segments: Vec::new(),
            leases: Vec::new(),
            lent: 0,
            copied: 0,
            zero_copy: 0,
            named: None,
        };
        let fresh = match (slot, self.copy) {
            (Some(mut slot), copy) if copy > 0 && slot.capacity() >= copy => {
                self.copy_into(&mut slot, &message, limits)?;
                Some(slot.freeze())
            }
            (None, 0) => None,
            _ => {
                return Err(Error::Misuse(
                    "a slot of the wrong size for the layout".into(),
                ));
            }
        };
        // Every lease of the message under one lock of the book (a message of many loans).
        let mut book = None;
        let mut lend = |slot: Arc<Slot>| {
            let book = book.get_or_insert_with(|| lending.book());
            if let Some(promise) = promise.take() {
                promise.kept(book); // the fresh slot, lent first, was promised
            }
            book.lend(holder, LentSlot(slot))
        };
        // The fresh slot (given only when something is copied into it) goes out under one
        // lease, whichever parts it holds.
        let fresh = fresh.map(|slot| {
            let lease = lend(Arc::clone(&slot));
            packed.leases.push(lease);
            packed.lent += len_u64(slot.capacity());
            packed.segments.push(Arc::clone(slot.segment()));
            (lease, slot)
        });
        packed.body = match self.shape {
            Shape::Inline(head) => {
                packed.copied = message.total_bytes();
                let parts = std::iter::once(message.metadata).chain(message.buffers);
                packed.body = Body::InlineSlices(head.into_slices(parts));
                return Ok(packed);
            }
            Shape::Packed => {
                let (lease, slot) = fresh.as_ref().ok_or_else(no_slot)?;
                packed.copied = message.total_bytes();
                Body::Packed(Shared {
                    segment: slot.segment().id,
                    offset: len_u64(slot.offset()),
                    len: len_u64(self.copy),
                    lease: *lease,
                })
            }
            Shape::Parts {
                version,
                metadata,
                buffers,
            } => {
                // The loaned slot lent last, and its lease: consecutive views of one slot (a
                // loan holding several buffers) go out under one lease and lend its memory
                // once (`Packed::lent`).
                let mut last_loaned: Option<(*const Slot, u64)> = None;
                let mut part = |plan: Plan, packed: &mut Packed| -> Result<Part, Error> {
                    Ok(match plan {
                        Plan::Inline(bytes) => Part::Inline(bytes),
                        Plan::Returned(returned) => {
                            packed.zero_copy += 1;
                            Part::Returned(returned)
                        }
                        Plan::Loaned { slot, offset, len } => {
                            packed.zero_copy += 1;
                            let segment = slot.segment().id;
                            let lease = match last_loaned {
                                Some((last, lease)) if std::ptr::eq(last, Arc::as_ptr(&slot)) => {
                                    lease
                                }
                                _ => {
                                    packed.segments.push(Arc::clone(slot.segment()));
                                    packed.lent += len_u64(slot.capacity());
                                    let at = Arc::as_ptr(&slot);
                                    let lease = lend(slot);
                                    packed.leases.push(lease);
                                    last_loaned = Some((at, lease));
                                    lease
                                }
                            };
                            Part::Shared(Shared {
                                segment,
                                offset,
                                len,
                                lease,
                            })
                        }
                        Plan::Copy { at, bytes } => {
                            let (lease, slot) = fresh.as_ref().ok_or_else(no_slot)?;
                            packed.copied += len_u64(bytes.len());
                            Part::Shared(Shared {
                                segment: slot.segment().id,
                                offset: len_u64(slot.offset() + at),
                                len: len_u64(bytes.len()),
                                lease: *lease,
                            })
                        }
                    })
                };
                let metadata = part(metadata, &mut packed)?;
                let buffers = buffers
                    .into_iter()
                    .map(|p| part(p, &mut packed))
                    .collect::<Result<Vec<_>, _>>()?;
                Body::Parts {
                    version,
                    metadata,
                    buffers,
                }
            }
        };
        packed.segments.sort_unstable_by_key(|s| s.id);
        packed.segments.dedup_by_key(|s| s.id);
        packed.named = Some(message);
        Ok(packed)
    }

    fn copy_into(
        &self,
        slot: &mut SlotMut,
        message: &TensorMessage,
        limits: &Limits,
    ) -> Result<(), Error> {
        let memory = slot.as_mut_slice();
        match &self.shape {
            Shape::Inline(_) => Ok(()),
            Shape::Packed => {
                let encoded =
                    tensorwire_proto::ptm1::encode(message, limits).map_err(Error::Encode)?;
                let places = encoded.slices().scan(0, |at, part| {
                    let place = (*at, part);
                    *at += part.len();
                    Some(place)
                });
                copy_at(memory, places, self.copy)
            }
            Shape::Parts {
                metadata, buffers, ..
            } => {
                let places =
                    std::iter::once(metadata)
                        .chain(buffers)
                        .filter_map(|plan| match plan {
                            Plan::Copy { at, bytes } => Some((*at, bytes.as_ref())),
                            _ => None,
                        });
                copy_at(memory, places, self.copy)
            }
        }
    }
}

/// Copies each `(at, bytes)` to `at` in `memory`, `total` bytes in all; the places are in
/// order and do not overlap. A large copy is split over the CPUs ([`copy_all`]); a smaller one
/// is made here, without gathering the places first.
fn copy_at<'a>(
    memory: &mut [u8],
    places: impl Iterator<Item = (usize, &'a [u8])>,
    total: usize,
) -> Result<(), Error> {
    if total < SPLIT_FROM {
        for (at, bytes) in places {
            let end = at.checked_add(bytes.len()).ok_or_else(misplaced)?;
            memory
                .get_mut(at..end)
                .ok_or_else(misplaced)?
                .copy_from_slice(bytes);
        }
        return Ok(());
    }
    let mut pairs = Vec::new();
    let (mut rest, mut start) = (memory, 0);
    for (at, bytes) in places {
        let skip = at.checked_sub(start).ok_or_else(misplaced)?;
        if rest.len() < skip.saturating_add(bytes.len()) {
            return Err(misplaced());
        }
        let (place, after) = rest[skip..].split_at_mut(bytes.len());
        pairs.push((place, bytes));
        (rest, start) = (after, at + bytes.len());
    }
    copy_all(pairs);
    Ok(())
}

fn misplaced() -> Error {
    Error::Misuse("a layout whose copies overlap or pass the slot".into())
}

fn no_slot() -> Error {
    Error::Misuse("a layout that copies was filled without a slot".into())
}

#[cfg(test)]
#[path = "packing_tests.rs"]
mod tests;
