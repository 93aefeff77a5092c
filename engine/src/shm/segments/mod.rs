//! The node's shared memory for messages: slots in a few large memfd segments per size class.
//!
//! A segment is one memfd, reserved with `fallocate` (a full memory limit is an error now,
//! never a SIGBUS later), sealed against shrinking and growing, and mapped once by its owner
//! (writable, pre-faulted: [`commit`], a large one on several threads) and once by each peer
//! that reads from it (read-only, through a read-only descriptor). A slot is a fixed-size,
//! page-aligned range of a segment.
//!
//! Credit, not revocation: a slot is written only while its owner holds it exclusively
//! ([`SlotMut`]); once frozen it is shared ([`Slot`]) by every local `Bytes` and every peer's
//! lease, and it goes back to the free list only when the last of them drops. Nothing a holder
//! still references is ever punched out, zeroed or reused. When every slot is held and the
//! quota allows no new segment, [`Segments::take`] says so and the caller waits for credit
//! ([`Segments::take_until`]) or goes elsewhere.
//!
//! Memory goes back by whole segments: one whose slots are all free for a while is retired
//! (beyond a bounded idle cache), and peers are told to unmap it.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_proto::shm::ShmError;

use crate::shm::os::{self, FileMap, os_error};
use crate::shm::quota::{Charge, Quota};

mod commit;
pub(crate) mod loaned;

const PAGE: usize = 4096;
/// The smallest slot (smaller messages travel in the control datagram).
const MIN_SLOT: usize = 64 << 10;
/// Segments of small classes hold this many slots…
const SLOTS_PER_SEGMENT: usize = 16;
/// …but grow no larger than this (larger slots get a segment each).
const MAX_SHARED_SEGMENT: usize = 64 << 20;

/// Settings of a node's segments.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SegmentsConfig {
    /// Bytes of segments at most (lent, filling and idle).
    pub(crate) quota: u64,
    /// Bytes of idle segments kept for reuse.
    pub(crate) idle_keep: u64,
    /// A segment idle this long may be retired (beyond `idle_keep`).
    pub(crate) idle_after: Duration,
}

/// A node's message memory (cheap to clone).
#[derive(Clone)]
pub(crate) struct Segments(Arc<Pool>);

struct Pool {
    quota: Quota,
    config: SegmentsConfig,
    state: Mutex<State>,
    /// Signalled when a slot comes back (credit), if anybody waits.
    credit: Condvar,
    /// Whether `state.retired` may hold anything (checked without the lock).
    any_retired: std::sync::atomic::AtomicBool,
    /// Told (with no lock held) when a segment is retired (peers must unmap it).
    listener: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
}

#[derive(Default)]
struct State {
    segments: HashMap<u64, Held>,
    /// Free slots per class: segment and index, most recently freed last.
    free: HashMap<usize, Vec<(Arc<Segment>, u32)>>,
    next_segment: u64,
    /// Segments retired since the transport last asked.
    retired: Vec<u64>,
    waiting: usize,
}

struct Held {
    segment: Arc<Segment>,
    used: u32,
    idle_since: Instant,
}

impl Segments {
    pub(crate) fn new(config: SegmentsConfig) -> Self {
        Self(Arc::new(Pool {
            quota: Quota::new(config.quota),
            config,
            state: Mutex::new(State {
                next_segment: 1,
                ..State::default()
            }),
            credit: Condvar::new(),
            any_retired: std::sync::atomic::AtomicBool::new(false),
            listener: Mutex::new(None),
        }))
    }

    /// The frozen slot of this pool holding all of `buffer`, and where in its segment `buffer`
    /// starts. A slot of another node's pool in this process is not ours to name: segment ids
    /// are per pool, so a peer would read our segment of that id instead.
    pub(crate) fn loaned(&self, buffer: &[u8]) -> Option<(Arc<Slot>, u64)> {
        loaned::lookup(buffer)
            .filter(|(slot, _)| std::ptr::eq(slot.pool.as_ptr(), Arc::as_ptr(&self.0)))
    }

    /// The quota's limit.
    pub(crate) fn quota(&self) -> u64 {
        self.0.config.quota
    }

    /// Bytes of segments alive.
    pub(crate) fn used_bytes(&self) -> u64 {
        self.0.quota.used()
    }

    /// Bytes of slots held now (lent to peers, filling, or frozen and referenced here).
    pub(crate) fn held_bytes(&self) -> u64 {
        let state = self.0.lock();
        state
            .segments
            .values()
            .map(|h| u64::from(h.used) * h.segment.class as u64)
            .sum()
    }

    /// Segments alive.
    pub(crate) fn segment_count(&self) -> usize {
        self.0.lock().segments.len()
    }

    /// Calls `listener` (without locks held) whenever a segment is retired; replaces any
    /// earlier listener.
    pub(crate) fn set_listener(&self, listener: Arc<dyn Fn() + Send + Sync>) {
        *crate::sync::lock(&self.0.listener) = Some(listener);
    }

    /// A slot of at least `len` bytes to fill: a free one (the warmest), or one in a new
    /// segment while the quota allows (idle segments of other sizes are retired to make room).
    ///
    /// # Errors
    ///
    /// [`ShmError::Quota`] when every slot is held and the quota allows no new segment (the
    /// caller waits for credit or goes elsewhere); [`ShmError::Os`] if the system refuses.
    pub(crate) fn take(&self, len: usize) -> Result<SlotMut, ShmError> {
        let class = class(len);
        let (segment, index) = {
            let mut state = self.0.lock();
            match self.0.pop_free(&mut state, class) {
                Some(found) => found,
                None => {
                    drop(state);
                    self.0.grow(class)?
                }
            }
        };
        Ok(self.0.checkout(&segment, index))
    }

    /// [`Segments::take`], waiting for credit (a slot given back) until `until`.
    ///
    /// # Errors
    ///
    /// As [`Segments::take`], once `until` has passed.
    pub(crate) fn take_until(&self, len: usize, until: Instant) -> Result<SlotMut, ShmError> {
        loop {
            match self.take(len) {
                Err(ShmError::Quota { .. }) if Instant::now() < until => {}
                other => return other,
            }
            let mut state = self.0.lock();
            // A slot may have come back between the failed take and this lock.
            if self.0.has_free(&state, class(len)) {
                continue;
            }
            let left = until.saturating_duration_since(Instant::now());
            state.waiting += 1;
            let mut state = crate::sync::wait(
                &self.0.credit,
                state,
                Some(left.min(Duration::from_millis(50))),
            );
            state.waiting -= 1;
        }
    }

    /// Retires segments idle longer than the configured time, beyond the idle cache; returns
    /// how many.
    pub(crate) fn trim(&self, now: Instant) -> usize {
        let retired = {
            let mut state = self.0.lock();
            self.0
                .retire_idle(&mut state, self.0.config.idle_keep, |held| {
                    now.saturating_duration_since(held.idle_since) >= self.0.config.idle_after
                })
        };
        if retired > 0 {
            self.0.notify();
        }
        retired
    }

    /// Segments retired since the last call (peers that mapped them are told to unmap).
    pub(crate) fn take_retired(&self) -> Vec<u64> {
        if !self
            .0
            .any_retired
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            return Vec::new();
        }
        std::mem::take(&mut self.0.lock().retired)
    }
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    fn notify(&self) {
        let listener = crate::sync::lock(&self.listener).clone();
        if let Some(listener) = listener {
            listener();
        }
    }

    fn has_free(&self, state: &State, class: usize) -> bool {
        state.free.get(&class).is_some_and(|v| !v.is_empty())
    }

    fn pop_free(&self, state: &mut State, class: usize) -> Option<(Arc<Segment>, u32)> {
        let (segment, index) = state.free.get_mut(&class)?.pop()?;
        if let Some(held) = state.segments.get_mut(&segment.id) {
            held.used += 1;
        }
        Some((segment, index))
    }

    /// A new segment for `class`, one of whose slots is taken at once. Under quota pressure
    /// idle segments of any size are retired first, then the segment is made smaller (down to
    /// one slot).
    fn grow(&self, class: usize) -> Result<(Arc<Segment>, u32), ShmError> {
        let mut slots = slots_per_segment(class);
        let mut retried = false;
        let charge = loop {
            match self.quota.charge(class as u64 * u64::from(slots)) {
                Ok(charge) => break charge,
                Err(_) if !retried => {
                    retried = true;
                    let retired = {
                        let mut state = self.lock();
                        self.retire_idle(&mut state, 0, |_| true)
                    };
                    if retired > 0 {
                        self.notify();
                    }
                }
                Err(_) if slots > 1 => slots /= 2,
                Err(e) => return Err(e),
            }
        };
        let id = {
            let mut state = self.lock();
            let id = state.next_segment;
            state.next_segment += 1;
            id
        };
        let segment = Arc::new(Segment::create(id, class, slots, charge)?);
        loaned::register(&segment);
        let mut state = self.lock();
        let free = state.free.entry(class).or_default();
        for index in (1..slots).rev() {
            free.push((Arc::clone(&segment), index));
        }
        state.segments.insert(
            id,
            Held {
                segment: Arc::clone(&segment),
                used: 1,
                idle_since: Instant::now(),
            },
        );
        Ok((segment, 0))
    }

    fn checkout(self: &Arc<Self>, segment: &Arc<Segment>, index: u32) -> SlotMut {
        let slot = Arc::new(Slot {
            segment: Arc::clone(segment),
            index,
            pool: Arc::downgrade(self),
            born: crate::fork::generation(),
        });
        SlotMut(slot)
    }

    fn give_back(&self, segment: &Arc<Segment>, index: u32) {
        let wake = {
            let mut state = self.lock();
            let Some(held) = state.segments.get_mut(&segment.id) else {
                return; // retired with the pool, or the pool is gone
            };
            held.used = held.used.saturating_sub(1);
            if held.used == 0 {
                held.idle_since = Instant::now();
            }
            state
                .free
                .entry(segment.class)
                .or_default()
                .push((Arc::clone(segment), index));
            state.waiting > 0
        };
        // Credit reaches whoever waits for it through the condition variable; the listener
        // (the poll thread) has nothing to do for a returned slot.
        if wake {
            self.credit.notify_all();
        }
    }

    /// Retires whole idle segments for which `eligible` holds, least recently used first,
    /// until at most `keep` idle bytes are left.
    fn retire_idle(&self, state: &mut State, keep: u64, eligible: impl Fn(&Held) -> bool) -> usize {
        let mut idle: Vec<(Instant, u64, u64)> = state
            .segments
            .values()
            .filter(|h| h.used == 0)
            .map(|h| (h.idle_since, h.segment.id, h.segment.len() as u64))
            .collect();
        let mut idle_bytes: u64 = idle.iter().map(|&(_, _, len)| len).sum();
        idle.sort_unstable();
        let mut retired = 0;
        for (_, id, len) in idle {
            if idle_bytes <= keep {
                break;
            }
            let Some(held) = state.segments.get(&id) else {
                continue;
            };
            if !eligible(held) {
                continue;
            }
            let class = held.segment.class;
            state.segments.remove(&id);
            if let Some(free) = state.free.get_mut(&class) {
                free.retain(|(segment, _)| segment.id != id);
            }
            state.retired.push(id);
            self.any_retired
                .store(true, std::sync::atomic::Ordering::Release);
            idle_bytes -= len;
            retired += 1;
        }
        retired
    }
}

/// One memfd of slots of one class.
pub(crate) struct Segment {
    pub(crate) id: u64,
    fd: OwnedFd,
    read_only: OwnedFd,
    map: FileMap,
    class: usize,
    /// The frozen slot at each index (to find it from its bytes' address); a slot being
    /// filled is not listed, so its `SlotMut` stays the only reference.
    owners: Mutex<Vec<Weak<Slot>>>,
    _charge: Charge,
}

impl Segment {
    fn create(id: u64, class: usize, slots: u32, charge: Charge) -> Result<Self, ShmError> {
        let len = class * slots as usize;
        let fd = os::memfd_unreserved(&format!("tensorwire-segment-{id}"), len as u64)
            .map_err(|e| os_error("memfd_create", &e))?;
        let map =
            FileMap::new(fd.as_raw_fd(), 0, len, true, false).map_err(|e| os_error("mmap", &e))?;
        // From here on only the mapping above writes the segment: a peer that re-opens its
        // read-only descriptor writable through /proc can neither map it writable nor write
        // or punch it. Sealed before the commit below (which reserves and populates through
        // that mapping, both allowed under the seal), so a process of this user that opens the
        // new memfd through /proc has microseconds, not the commit's 74–190 ms, to map it
        // writable first.
        os::add_seals(fd.as_raw_fd(), os::SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL)
            .map_err(|e| os_error("seal", &e))?;
        commit::commit(fd.as_raw_fd(), &map, len).map_err(|e| os_error("fallocate", &e))?;
        let read_only =
            os::read_only(fd.as_raw_fd()).map_err(|e| os_error("reopen read-only", &e))?;
        Ok(Self {
            id,
            fd,
            read_only,
            map,
            class,
            owners: Mutex::new((0..slots).map(|_| Weak::new()).collect()),
            _charge: charge,
        })
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The descriptor peers get: read-only, so their mappings cannot be made writable.
    pub(crate) fn read_only_fd(&self) -> BorrowedFd<'_> {
        self.read_only.as_fd()
    }

    /// The owner's (writable) descriptor.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A second writable mapping of `len` bytes of the owner's pages from `offset`.
    pub(crate) fn alias(&self, offset: usize, len: usize) -> std::io::Result<FileMap> {
        self.map.alias(offset, len)
    }

    /// The owner's mapping.
    pub(crate) fn as_slice(&self) -> &[u8] {
        self.map.as_slice()
    }

    /// The frozen slot whose bytes include `offset..offset + len`, if any.
    pub(crate) fn slot_at(&self, offset: usize, len: usize) -> Option<Arc<Slot>> {
        let index = offset / self.class;
        let end = offset.checked_add(len)?;
        if len == 0 || end > (index + 1) * self.class {
            return None;
        }
        let owners = crate::sync::lock(&self.owners);
        owners.get(index)?.upgrade()
    }

    fn set_owner(&self, index: u32, slot: &Arc<Slot>) {
        let mut owners = crate::sync::lock(&self.owners);
        if let Some(entry) = owners.get_mut(index as usize) {
            *entry = Arc::downgrade(slot);
        }
    }
}

/// A slot shared by its frozen bytes and the peers it is lent to; given back to the free
/// list when the last reference drops.
pub(crate) struct Slot {
    segment: Arc<Segment>,
    index: u32,
    pool: Weak<Pool>,
    /// The fork generation it was taken in: a child made by `fork()` since does not give it
    /// back (the pool is its parent's, and may be locked forever in the child).
    born: u64,
}

impl Slot {
    /// Its segment.
    pub(crate) fn segment(&self) -> &Arc<Segment> {
        &self.segment
    }

    /// Where it starts in its segment.
    pub(crate) fn offset(&self) -> usize {
        self.index as usize * self.segment.class
    }

    /// Its capacity.
    pub(crate) fn capacity(&self) -> usize {
        self.segment.class
    }

    /// Its bytes (never written while this `Arc` is shared).
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.segment.as_slice()[self.offset()..self.offset() + self.capacity()]
    }

    /// A zero-copy `Bytes` of `range` (within the slot) that keeps the slot held.
    pub(crate) fn bytes(self: &Arc<Self>, range: std::ops::Range<usize>) -> Bytes {
        self.whole().slice(range)
    }

    /// A zero-copy `Bytes` of the whole slot that keeps it held.
    pub(crate) fn whole(self: &Arc<Self>) -> Bytes {
        Bytes::from_owner(SlotBytes(Arc::clone(self)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !crate::shm::not_inherited::made_here(self.born) {
            return;
        }
        if let Some(pool) = self.pool.upgrade() {
            pool.give_back(&self.segment, self.index);
        }
    }
}

struct SlotBytes(Arc<Slot>);

impl AsRef<[u8]> for SlotBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// A slot held exclusively, to fill.
pub(crate) struct SlotMut(Arc<Slot>);

impl SlotMut {
    /// Its bytes, writable.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        let slot = &self.0;
        let (offset, len) = (slot.offset(), slot.capacity());
        let base = slot.segment.map.as_ptr();
        // SAFETY: `offset..offset + len` lies inside the segment's writable mapping (the
        // segment is `slots * class` bytes and `index < slots`), which lives as long as the
        // `Arc<Segment>` this slot holds. This `SlotMut` is the only reference to the slot
        // (it is created unique by `checkout` and never cloned), and no other slot overlaps
        // the range, so nothing else reads or writes these bytes while the borrow lasts.
        unsafe { std::slice::from_raw_parts_mut(base.add(offset), len) }
    }

    /// Its capacity.
    pub(crate) fn capacity(&self) -> usize {
        self.0.capacity()
    }

    /// The segment it is in.
    pub(crate) fn segment(&self) -> &Arc<Segment> {
        self.0.segment()
    }

    /// Where it starts in its segment.
    pub(crate) fn offset(&self) -> usize {
        self.0.offset()
    }

    /// Done writing: from now on it is only read (and its bytes' address finds it).
    pub(crate) fn freeze(self) -> Arc<Slot> {
        self.0.segment.set_owner(self.0.index, &self.0);
        self.0
    }
}

/// Slot capacities: at least [`MIN_SLOT`], pages, then four steps per power of two (at most
/// 25 % slack).
pub(crate) fn class(len: usize) -> usize {
    let len = len.max(MIN_SLOT).div_ceil(PAGE) * PAGE;
    let top = usize::BITS - 1 - len.leading_zeros();
    let step = (1usize << (top.saturating_sub(2))).max(PAGE);
    len.div_ceil(step) * step
}

fn slots_per_segment(class: usize) -> u32 {
    let slots = (MAX_SHARED_SEGMENT / class).clamp(1, SLOTS_PER_SEGMENT);
    u32::try_from(slots).unwrap_or(1)
}

#[cfg(test)]
mod tests;
