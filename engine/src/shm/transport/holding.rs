//! What this node holds of its peers' memory: each peer segment mapped once, read-only, for
//! the connection's life (or until the peer retires it), and received messages whose buffers
//! are views of those mappings. A lease goes back (batched, by the poll thread) when the last
//! view of every part it covers drops — however long that takes: the sender never writes a
//! slot that is leased.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use tensorwire_proto::shm::{Body, Part, Returned, Shared};
use tensorwire_proto::{LimitField, Limits, TensorMessage};

use crate::shm::os::{self, FileMap};
use crate::shm::transport::conn::{Conn, Mapped};
use crate::shm::transport::lending::Lending;
use crate::shm::transport::lock;

/// Segments one peer may have mapped here at once.
const MAX_SEGMENTS: usize = 4096;
/// Bytes of one peer's segments mapped here at most (address space, not memory: the pages
/// are the peer's).
const MAX_MAPPED_BYTES: u64 = 1 << 40;

/// Leases whose views dropped, per connection, waiting for the poll thread to send them.
pub(crate) struct Releases {
    pending: Mutex<Vec<(Weak<Conn>, u64)>>,
    /// Whether `pending` may hold anything (the poll thread checks it on every turn).
    any: AtomicBool,
    wake: Arc<OwnedFd>,
}

impl Releases {
    pub(crate) fn new(wake: Arc<OwnedFd>) -> Self {
        Self {
            pending: Mutex::new(Vec::new()),
            any: AtomicBool::new(false),
            wake,
        }
    }

    pub(crate) fn push(&self, conn: Weak<Conn>, lease: u64) {
        let was_empty = {
            let mut pending = lock(&self.pending);
            pending.push((conn, lease));
            self.any.store(true, Ordering::Release);
            pending.len() == 1
        };
        // The poll thread sends what waits on every turn; only another thread must wake it
        // (a reply sends what waits first, too).
        if was_empty && !crate::shm::transport::service::on_poll_thread() {
            crate::sys::eventfd_signal(self.wake.as_raw_fd());
        }
    }

    /// Everything waiting, grouped by live connection (leases of a closed connection stay
    /// with the peer until this process exits: there is nobody to tell).
    pub(crate) fn take(&self) -> Vec<(Arc<Conn>, Vec<u64>)> {
        if !self.any.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        let pending = std::mem::take(&mut *lock(&self.pending));
        let mut by_conn: Vec<(Arc<Conn>, Vec<u64>)> = Vec::new();
        for (conn, lease) in pending {
            let Some(conn) = conn.upgrade() else { continue };
            match by_conn.iter_mut().find(|(c, _)| c.id == conn.id) {
                Some((_, leases)) => leases.push(lease),
                None => by_conn.push((conn, vec![lease])),
            }
        }
        by_conn
    }
}

/// Maps a segment the peer announced (`Map`), after checking its descriptor: sealed against
/// shrinking and growing (else a truncation could fault a reader) and as large as announced.
///
/// # Errors
///
/// Why the segment was refused (the connection is then closed: the peer broke the protocol).
pub(crate) fn map_segment(
    conn: &Conn,
    segment: u64,
    len: u64,
    fd: Option<OwnedFd>,
) -> Result<(), String> {
    let fd = fd.ok_or("a Map datagram came without its descriptor")?;
    let raw = fd.as_raw_fd();
    let seals = os::seals(raw).unwrap_or(0);
    if seals & os::SEALS_SIZE != os::SEALS_SIZE {
        tensorwire_proto::stats::global().record_shm_fd_failure();
        return Err("a segment lacks the SHRINK | GROW seals (refused)".into());
    }
    let actual = os::size(raw).map_err(|e| format!("fstat of a segment: {e}"))?;
    if actual < len || len == 0 {
        return Err(format!(
            "a segment has {actual} bytes but {len} were announced"
        ));
    }
    let mut mapped = lock(&conn.mapped);
    let total: u64 = mapped.values().map(|m| m.map.len() as u64).sum();
    if mapped.len() >= MAX_SEGMENTS || total.saturating_add(len) > MAX_MAPPED_BYTES {
        return Err(format!(
            "the peer's segments exceed what one connection may map ({MAX_SEGMENTS} segments, \
             {MAX_MAPPED_BYTES} bytes)"
        ));
    }
    if mapped.contains_key(&segment) {
        return Err(format!("segment {segment} was announced twice"));
    }
    let len = usize::try_from(len).map_err(|_| "a segment is too large for this platform")?;
    // Read-only and pre-faulted, once; the descriptor closes when `fd` drops (the mapping
    // keeps the file), so mapping many segments costs no descriptors.
    let map = FileMap::new(raw, 0, len, false, true).map_err(|e| format!("mmap: {e}"))?;
    mapped.insert(segment, Arc::new(Mapped { map }));
    Ok(())
}

/// The peer retired `segment`: forget the mapping (views still using it keep it).
pub(crate) fn unmap_segment(conn: &Conn, segment: u64) {
    let gone = lock(&conn.mapped).remove(&segment);
    drop(gone);
}

/// Turns a received body into a message whose buffers are views of the peer's memory. On any
/// failure every lease the body names goes back at once.
///
/// # Errors
///
/// What is wrong with the body (for the error reply).
pub(crate) fn unpack(
    conn: &Arc<Conn>,
    releases: &Arc<Releases>,
    lending: &Lending,
    body: &Body,
    limits: &Limits,
) -> Result<TensorMessage, String> {
    // Each lease is held by one object that every part of it refers to: dropping the last
    // part (or this function failing) gives it back.
    let held: Vec<Arc<HeldLease>> = body
        .leases()
        .into_iter()
        .map(|lease| {
            Arc::new(HeldLease {
                lease,
                conn: Arc::downgrade(conn),
                releases: Arc::clone(releases),
            })
        })
        .collect();
    let part = |shared: &Shared| view(conn, &held, shared);
    match body {
        Body::Inline(bytes) => {
            tensorwire_proto::ptm1::decode(bytes.clone(), limits).map_err(|e| e.to_string())
        }
        Body::Packed(shared) => {
            tensorwire_proto::ptm1::decode(part(shared)?, limits).map_err(|e| e.to_string())
        }
        Body::Parts {
            version,
            metadata,
            buffers,
        } => {
            limits
                .check(LimitField::BufferCount, buffers.len() as u64)
                .map_err(|e| e.to_string())?;
            let bytes = |p: &Part| match p {
                Part::Inline(bytes) => Ok(bytes.clone()),
                Part::Shared(shared) => part(shared),
                Part::Returned(returned) => ours(conn, lending, returned),
            };
            let metadata = bytes(metadata)?;
            limits
                .check(LimitField::MetadataBytes, metadata.len() as u64)
                .map_err(|e| e.to_string())?;
            let buffers = buffers.iter().map(bytes).collect::<Result<Vec<_>, _>>()?;
            let total: u64 = buffers.iter().map(|b| b.len() as u64).sum();
            limits
                .check(LimitField::WireBytes, total)
                .map_err(|e| e.to_string())?;
            Ok(TensorMessage::new(*version, metadata, buffers))
        }
    }
}

/// Bytes of our own slot that the peer sent back (it still holds them under our lease, so the
/// slot is alive and frozen): a view of our memory, no copy.
fn ours(conn: &Conn, lending: &Lending, returned: &Returned) -> Result<Bytes, String> {
    let Returned {
        segment,
        offset,
        len,
    } = *returned;
    let (slot, at) = lending
        .returned(conn.peer.pid, segment, offset, len)
        .ok_or("a part names memory of ours that the peer does not hold")?;
    let len = usize::try_from(len).map_err(|_| "a range is too large")?;
    Ok(slot.bytes(at..at + len))
}

/// A zero-copy view of one shared range, holding its lease and its segment's mapping.
fn view(conn: &Conn, held: &[Arc<HeldLease>], shared: &Shared) -> Result<Bytes, String> {
    let mapped = lock(&conn.mapped).get(&shared.segment).cloned();
    let Some(mapped) = mapped else {
        if lock(&conn.lost).contains(&shared.segment) {
            return Err("the receiver is at its descriptor limit: the shared memory holding                         the message could not be received"
                .into());
        }
        return Err(format!("segment {} was never announced", shared.segment));
    };
    let end = shared
        .offset
        .checked_add(shared.len)
        .ok_or("a part's range overflows")?;
    if end > mapped.map.len() as u64 {
        return Err(format!(
            "a part ends at byte {end} of a {}-byte segment",
            mapped.map.len()
        ));
    }
    let lease = held
        .iter()
        .find(|h| h.lease == shared.lease)
        .cloned()
        .ok_or("a part's lease is not listed")?;
    let (start, end) = (
        usize::try_from(shared.offset).map_err(|_| "a range is too large")?,
        usize::try_from(end).map_err(|_| "a range is too large")?,
    );
    Ok(Bytes::from_owner(View {
        mapped,
        _lease: lease,
    })
    .slice(start..end))
}

/// A peer's lease, held by every view of it; released when the last one drops.
struct HeldLease {
    lease: u64,
    conn: Weak<Conn>,
    releases: Arc<Releases>,
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        self.releases
            .push(std::mem::take(&mut self.conn), self.lease);
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
