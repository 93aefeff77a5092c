//! Received bodies turned into messages whose buffers are views of the peer's memory (its
//! segments mapped here) or of our own (parts it sent back), and answers turned into what the
//! caller gets. A lease goes back to the peer when the last view of every part it covers
//! drops — however long that takes: the sender never writes a slot that is leased.
//!
//! The session checked every shared part against the segments mapped here; what is left to
//! check is a part that names our own memory, against what the peer holds of ours.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use bytes::Bytes;
use tensorwire_proto::shm::{
    Body, CloseReason, Failure, LeaseBook, Part, PeerBook, Returned, Shared, WireReply,
};
use tensorwire_proto::transport::{Answer, Deadline, Error, Reply, RequestKind};
use tensorwire_proto::{LimitField, Limits, TensorMessage};

use super::lending::{Lending, LentSlot};

use super::releases::Releases;
use crate::shm::os::FileMap;
use crate::shm::segments::Slot;

/// A peer's segment, mapped read-only here.
pub(super) struct Mapped {
    pub(super) map: FileMap,
    /// The bound it counts against, given back when the mapping goes — with the last view of
    /// it, not when the peer retires the segment or the connection closes: a receiver that
    /// keeps the messages keeps the mappings.
    pub(super) _counted: Counted,
}

/// A peer process's mapping as its book counts it.
pub(super) struct Counted {
    pub(super) book: Weak<Mutex<PeerBook>>,
    pub(super) pid: u32,
    pub(super) len: u64,
    /// The fork generation it was counted in (a child made by `fork()` since leaves the
    /// parent's book alone: it may be locked forever there).
    pub(super) born: u64,
}

impl Drop for Counted {
    fn drop(&mut self) {
        if !crate::shm::not_inherited::made_here(self.born) {
            return;
        }
        // Taken after any connection's lock, never inside the book's (the mapping code's
        // order): a mapping is dropped under a connection's state or by a view's last holder.
        if let Some(book) = self.book.upgrade() {
            crate::sync::lock(&book).unmapped(self.pid, self.len);
        }
    }
}

/// What a body is read against: the peer's segments mapped here, what this node lent the
/// peer's process, where releases go, and the limits.
pub(super) struct Source<'a> {
    pub(super) mapped: &'a HashMap<u64, Arc<Mapped>>,
    pub(super) lending: &'a Lending,
    pub(super) holder: u32,
    pub(super) releases: &'a Arc<Releases>,
    pub(super) limits: &'a Limits,
}

/// A received body, as the node gets it.
pub(super) enum Unpacked {
    Message(TensorMessage),
    /// It cannot be read (the text says why); its leases went back already.
    Refused(String),
}

/// Turns a body into a message whose buffers are views (no copy). On any failure every lease
/// the body names goes back at once.
pub(super) fn unpack(from: &Source<'_>, body: &Body) -> Unpacked {
    // Each lease is held by one object that every part of it refers to: dropping the last
    // part (or this function failing) gives it back.
    let held: Vec<Arc<HeldLease>> = body
        .leases()
        .into_iter()
        .map(|lease| {
            Arc::new(HeldLease {
                lease,
                releases: Arc::downgrade(from.releases),
                born: crate::fork::generation(),
            })
        })
        .collect();
    match message(from, body, &held) {
        Ok(message) => Unpacked::Message(message),
        Err(text) => Unpacked::Refused(text),
    }
}

/// The outcome a caller gets for `reply` to its request of `kind`.
pub(super) fn answer(
    from: &Source<'_>,
    kind: RequestKind,
    peer: SocketAddr,
    reply: WireReply,
) -> Result<Answer, Error> {
    match reply {
        WireReply::Ack if kind == RequestKind::Tell => Ok(Answer::Ack),
        WireReply::Ack => Err(Error::UnexpectedReply {
            peer,
            request: "ask",
            reply: "Ack",
        }),
        WireReply::Single { msg_type, data } => Ok(Answer::Reply(Reply::Single { msg_type, data })),
        WireReply::Error(text) => Err(Error::Remote {
            peer: Some(peer),
            text,
        }),
        WireReply::Tensor(body) => match unpack(from, &body) {
            Unpacked::Message(message) => Ok(Answer::Reply(Reply::Tensor(message))),
            Unpacked::Refused(text) => Err(Error::Remote {
                peer: Some(peer),
                text: format!("the reply could not be mapped: {text}"),
            }),
        },
    }
}

/// The error a caller gets for a request that failed without an answer.
pub(super) fn failure(
    why: Failure,
    kind: RequestKind,
    peer: SocketAddr,
    deadline: Deadline,
) -> Error {
    match why {
        Failure::Deadline => deadline.error(kind.as_str()),
        Failure::Closed(CloseReason::Shutdown) => Error::Shutdown,
        Failure::Closed(reason) => Error::ConnectionClosed {
            peer,
            detail: Some(std::io::Error::other(reason.to_string())),
        },
        Failure::Unreadable(text) => Error::Remote {
            peer: Some(peer),
            text: format!("the reply could not be mapped: {text}"),
        },
    }
}

fn message(
    from: &Source<'_>,
    body: &Body,
    held: &[Arc<HeldLease>],
) -> Result<TensorMessage, String> {
    let limits = from.limits;
    let mut owners = Owners {
        shared: None,
        ours: None,
        book: None,
    };
    match body {
        Body::Inline(bytes) => {
            tensorwire_proto::ptm1::decode(bytes.clone(), limits).map_err(|e| e.to_string())
        }
        // A sender's form, never decoded from a record: joined, it is an inline body.
        Body::InlineSlices(slices) => {
            tensorwire_proto::ptm1::decode(Bytes::from(slices.concat()), limits)
                .map_err(|e| e.to_string())
        }
        Body::Packed(shared) => {
            let whole = owners.view(from.mapped, held, shared)?;
            tensorwire_proto::ptm1::decode(whole, limits).map_err(|e| e.to_string())
        }
        Body::Parts {
            version,
            metadata,
            buffers,
        } => {
            let mut bytes = |p: &Part| match p {
                Part::Inline(bytes) => Ok(bytes.clone()),
                Part::Shared(shared) => owners.view(from.mapped, held, shared),
                Part::Returned(returned) => owners.ours(from, returned),
            };
            let metadata = bytes(metadata)?;
            let buffers = buffers.iter().map(bytes).collect::<Result<Vec<_>, _>>()?;
            let total: u64 = buffers.iter().map(|b| b.len() as u64).sum();
            limits
                .check(LimitField::WireBytes, total)
                .map_err(|e| e.to_string())?;
            Ok(TensorMessage::new(*version, metadata, buffers))
        }
    }
}

/// The `Bytes` owners made for one message's parts so far: consecutive parts of one lease
/// (a message copied into one slot) or of one slot of ours share one owner, each part a slice
/// of it (no allocation per part).
struct Owners<'a> {
    /// The last peer lease viewed: its segment, its id, and its whole mapping.
    shared: Option<(u64, u64, Bytes)>,
    /// The last slot of ours sent back (its address: `Bytes` of all of it keeps it alive,
    /// so no other slot can be there meanwhile), and all of it.
    ours: Option<(*const Slot, Bytes)>,
    /// What this node lent, locked at the first part sent back and for the rest of them.
    book: Option<MutexGuard<'a, LeaseBook<LentSlot>>>,
}

impl<'a> Owners<'a> {
    /// A zero-copy view of one shared range (the session checked it lies within the
    /// segment), holding its lease and its segment's mapping.
    fn view(
        &mut self,
        mapped: &HashMap<u64, Arc<Mapped>>,
        held: &[Arc<HeldLease>],
        shared: &Shared,
    ) -> Result<Bytes, String> {
        let whole = match &self.shared {
            Some((segment, lease, whole))
                if *segment == shared.segment && *lease == shared.lease =>
            {
                whole
            }
            _ => {
                let mapped = mapped
                    .get(&shared.segment)
                    .cloned()
                    .ok_or_else(|| format!("segment {} is not mapped", shared.segment))?;
                let lease = held
                    .iter()
                    .find(|h| h.lease == shared.lease)
                    .cloned()
                    .ok_or("a part's lease is not listed")?;
                let whole = Bytes::from_owner(View {
                    mapped,
                    _lease: lease,
                });
                &self.shared.insert((shared.segment, shared.lease, whole)).2
            }
        };
        let start = usize::try_from(shared.offset).map_err(|_| "a range is too large")?;
        let end = shared
            .offset
            .checked_add(shared.len)
            .and_then(|end| usize::try_from(end).ok())
            .filter(|&end| end <= whole.len())
            .ok_or("a part runs past its segment")?;
        Ok(whole.slice(start..end))
    }

    /// Bytes of our own slot that the peer sent back (it still holds them under our lease, so
    /// the slot is alive and frozen): a view of our memory, no copy.
    fn ours(&mut self, from: &Source<'a>, returned: &Returned) -> Result<Bytes, String> {
        let Returned {
            segment,
            offset,
            len,
        } = *returned;
        let refused = || "a part names memory of ours that the peer does not hold".to_owned();
        let book = self.book.get_or_insert_with(|| from.lending.book());
        let (LentSlot(slot), at) = book
            .returned(from.holder, segment, offset, len)
            .ok_or_else(refused)?;
        let whole = match &self.ours {
            Some((last, whole)) if std::ptr::eq(*last, Arc::as_ptr(slot)) => whole,
            _ => &self.ours.insert((Arc::as_ptr(slot), slot.whole())).1,
        };
        let range = usize::try_from(at)
            .ok()
            .zip(usize::try_from(len).ok())
            .and_then(|(at, len)| Some(at..at.checked_add(len)?))
            .filter(|range| range.end <= whole.len())
            .ok_or_else(refused)?;
        Ok(whole.slice(range))
    }
}

/// A peer's lease, held by every view of it; released when the last one drops.
struct HeldLease {
    lease: u64,
    releases: Weak<Releases>,
    /// The fork generation it was taken in: a child made by `fork()` since has no lease to
    /// give back (it is its parent's).
    born: u64,
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        if !crate::shm::not_inherited::made_here(self.born) {
            return;
        }
        // A connection that closed has nobody to tell: the peer keeps the lease until this
        // process exits.
        if let Some(releases) = self.releases.upgrade() {
            releases.push(self.lease);
        }
    }
}

/// The owner of one received part's `Bytes`.
struct View {
    mapped: Arc<Mapped>,
    _lease: Arc<HeldLease>,
}

impl AsRef<[u8]> for View {
    fn as_ref(&self) -> &[u8] {
        self.mapped.map.as_slice()
    }
}
