//! The receive pool: final memory for received metadata and buffers, lent to every transport
//! of a node through [`ReceiveMemory`].
//!
//! Small sections (below [`PoolConfig::min_pooled_bytes`]) come from the heap. Larger ones get a
//! *slot*: a private anonymous mapping (of 4 KiB pages unless [`PoolConfig::huge_pages`] asks
//! for transparent huge pages). A fresh slot commits nothing when it is made; the sessions
//! expose it to reads a bounded window ahead of the bytes that arrived, and each exposed range
//! is pre-faulted (`MADV_POPULATE_WRITE`) just before the kernel copies into it, so memory is
//! committed for data that arrives, never for what a peer declares.
//!
//! A slot is frozen into [`Bytes`] with `Bytes::from_owner` and goes back to the pool when the
//! last `Bytes` referring to it drops, so a steady receiver reuses warm memory instead of paying
//! first-touch page faults on every message. Only slots that were filled once are kept; a slot
//! of a frame that failed half-way is unmapped. Idle slots are bounded
//! ([`PoolConfig::max_idle_bytes`]) and given back to the system when unused for
//! [`PoolConfig::idle_ttl`] (but for a small cache, [`PoolConfig::idle_keep_bytes`]), so a
//! burst does not pin memory for good.
//!
//! Slots are sized in classes of four steps per power of two (at most 25 % slack).

mod mapping;
mod split;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_proto::transport::{
    Error, ReceiveMemory, RecvBuffer, RecvStorage, SplitBuffer, heap_split,
};
use tensorwire_proto::{ReceiveBuffer, len_u64};

use crate::sync::lock;
use mapping::{Mapping, PAGE};

/// Receive-pool settings.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct PoolConfig {
    /// Sections smaller than this come from the heap (default 64 KiB).
    pub min_pooled_bytes: usize,
    /// Most bytes of idle slots kept for reuse (default 1 GiB); 0 disables reuse.
    pub max_idle_bytes: usize,
    /// Idle slots unused for this long are unmapped (default 2 s), but for the cache kept
    /// while idle.
    pub idle_ttl: Duration,
    /// Bytes of idle slots kept however long they stay unused (default 64 MiB; 0 keeps
    /// none): the most recently used ones, so a receiver that pauses and resumes reuses warm
    /// memory, while a burst's memory goes back to the system after `idle_ttl`.
    pub idle_keep_bytes: u64,
    /// Most bytes that frames still arriving may hold (filled or exposed to reads) at once
    /// (default: half the physical memory). A frame that would go over it is refused.
    pub max_receiving_bytes: u64,
    /// Most address space the slots of frames still arriving may reserve (default: 16 times
    /// the physical memory). A section is mapped whole when its first byte arrives but
    /// committed only as bytes come, so this bounds what declared-but-unsent sizes can take.
    pub max_reserved_bytes: u64,
    /// Ask for transparent huge pages (`MADV_HUGEPAGE`, slots 2 MiB-aligned) on slots of
    /// 2 MiB and more (default `false`: `MADV_NOHUGEPAGE`, 4 KiB pages even where the
    /// kernel's THP setting is `always`). On virtual machines whose guest hands free 2 MiB
    /// blocks back to the hypervisor (virtio-balloon free page reporting), a huge page faulted
    /// in after an idle spell of a few seconds is a hypervisor fault too: measured at
    /// 0.2–0.4 GB/s against 2.5–3.3 GB/s with 4 KiB pages, and a receiver stalled in those
    /// faults held 8 asks of 64 MiB in flight to a third of the rate (`docs/benchmarks.md`,
    /// "Fresh memory on these VMs"). Where huge pages fault in fast (bare metal), they save
    /// page faults on a slot's first fill.
    pub huge_pages: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            min_pooled_bytes: 64 << 10,
            max_idle_bytes: 1 << 30,
            idle_ttl: Duration::from_secs(2),
            idle_keep_bytes: 64 << 20,
            max_receiving_bytes: half_of_physical_memory(),
            max_reserved_bytes: half_of_physical_memory().saturating_mul(32),
            huge_pages: false,
        }
    }
}

/// Counters of a [`ReceivePool`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Slots served from idle memory.
    pub hits: u64,
    /// Slots that had to be mapped anew.
    pub misses: u64,
    /// Sections served from the heap (below the pooled size).
    pub heap: u64,
    /// Bytes held in idle slots now.
    pub idle_bytes: u64,
    /// Bytes charged by frames still arriving now.
    pub receiving_bytes: u64,
    /// Idle slots unmapped because they went unused (or did not fit the idle cap).
    pub released: u64,
}

/// A shared pool of receive memory (cheap to clone).
#[derive(Clone, Debug)]
pub struct ReceivePool {
    inner: Arc<PoolInner>,
}

#[derive(Debug)]
struct PoolInner {
    config: PoolConfig,
    /// Idle slots by class size, with when they became idle (oldest first).
    idle: Mutex<HashMap<usize, Vec<(Mapping, Instant)>>>,
    idle_bytes: AtomicU64,
    receiving: AtomicU64,
    /// Bytes of slots held by frames still arriving (not frozen yet).
    reserved: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    heap: AtomicU64,
    released: AtomicU64,
    /// The fork generation the pool was made in: a child made by `fork()` since drops an
    /// inherited buffer's memory (its own copy) without giving it back to the parent's pool,
    /// whose lock a parent thread may have held at the fork.
    born: u64,
}

impl ReceivePool {
    /// An empty pool.
    pub fn new(config: PoolConfig) -> Self {
        Self {
            inner: Arc::new(PoolInner {
                born: crate::fork::generation(),
                config,
                idle: Mutex::new(HashMap::new()),
                idle_bytes: AtomicU64::new(0),
                receiving: AtomicU64::new(0),
                reserved: AtomicU64::new(0),
                hits: AtomicU64::new(0),
                misses: AtomicU64::new(0),
                heap: AtomicU64::new(0),
                released: AtomicU64::new(0),
            }),
        }
    }

    /// Memory for `len` received bytes.
    ///
    /// # Errors
    ///
    /// [`Error::Memory`] if neither a mapping nor heap memory can be had.
    pub fn take(&self, len: usize) -> Result<PoolBuffer, Error> {
        let inner = &self.inner;
        if len < inner.config.min_pooled_bytes || len == 0 {
            inner.heap.fetch_add(1, Relaxed);
            let mut vec = Vec::new();
            vec.try_reserve_exact(len)
                .map_err(|e| Error::Memory(format!("cannot allocate {len} bytes: {e}")))?;
            vec.resize(len, 0);
            return Ok(PoolBuffer {
                storage: Storage::Heap(vec),
            });
        }
        let class = class_size(len);
        let size = len_u64(class);
        let max = inner.config.max_reserved_bytes;
        inner
            .reserved
            .fetch_update(Relaxed, Relaxed, |now| {
                now.checked_add(size).filter(|&n| n <= max)
            })
            .map_err(|now| {
                Error::Memory(format!(
                    "cannot reserve {size} bytes of address space for a section: frames still \
                     arriving hold {now} of at most {max} bytes"
                ))
            })?;
        let reused = lock(&inner.idle)
            .get_mut(&class)
            .and_then(Vec::pop)
            .map(|(mapping, _)| mapping);
        let mapping = match reused {
            Some(mapping) => {
                inner.idle_bytes.fetch_sub(len_u64(class), Relaxed);
                inner.hits.fetch_add(1, Relaxed);
                mapping
            }
            None => {
                inner.misses.fetch_add(1, Relaxed);
                match Mapping::new(class, inner.config.huge_pages) {
                    Ok(mapping) => mapping,
                    Err(e) => {
                        inner.reserved.fetch_sub(size, Relaxed);
                        return Err(Error::Memory(format!(
                            "cannot map {class} bytes of receive memory: {e}"
                        )));
                    }
                }
            }
        };
        Ok(PoolBuffer {
            storage: Storage::Slot {
                mapping: Some(mapping),
                len,
                pool: Arc::clone(inner),
                reserved: true,
            },
        })
    }

    /// An allocator closure for the proto decoders (a failed allocation gives an empty
    /// buffer, which the decoders report as the wrong length).
    pub fn allocator(&self) -> impl FnMut(usize) -> PoolBuffer + use<> {
        let pool = self.clone();
        move |len| {
            pool.take(len).unwrap_or(PoolBuffer {
                storage: Storage::Heap(Vec::new()),
            })
        }
    }

    /// Unmaps idle slots unused for [`PoolConfig::idle_ttl`], except the most recently used
    /// ones up to [`PoolConfig::idle_keep_bytes`] of idle memory in all; returns how many.
    pub fn release_unused(&self, now: Instant) -> usize {
        let inner = &self.inner;
        let ttl = inner.config.idle_ttl;
        let expired = |since: Instant| since.checked_add(ttl).is_some_and(|at| at <= now);
        let mut released = Vec::new();
        {
            let mut idle = lock(&inner.idle);
            let mut old: Vec<(Instant, usize, Mapping)> = Vec::new();
            let mut kept = 0u64;
            for (&class, slots) in idle.iter_mut() {
                // Oldest first: the expired ones are a prefix.
                let cut = slots.iter().position(|(_, since)| !expired(*since));
                let cut = cut.unwrap_or(slots.len());
                old.extend(
                    slots
                        .drain(..cut)
                        .map(|(mapping, since)| (since, class, mapping)),
                );
                kept += len_u64(class) * len_u64(slots.len());
            }
            // The most recently used expired slots stay while the cache has room.
            old.sort_by_key(|(since, ..)| std::cmp::Reverse(*since));
            for (since, class, mapping) in old {
                let size = len_u64(class);
                if kept + size <= inner.config.idle_keep_bytes {
                    kept += size;
                    idle.entry(class).or_default().insert(0, (mapping, since));
                } else {
                    released.push(mapping);
                }
            }
            idle.retain(|_, slots| !slots.is_empty());
        }
        let bytes: u64 = released.iter().map(|m| len_u64(m.len())).sum();
        inner.idle_bytes.fetch_sub(bytes, Relaxed);
        inner.released.fetch_add(len_u64(released.len()), Relaxed);
        released.len() // the mappings are unmapped here, outside the lock
    }

    /// Current counters.
    pub fn stats(&self) -> PoolStats {
        let inner = &self.inner;
        PoolStats {
            hits: inner.hits.load(Relaxed),
            misses: inner.misses.load(Relaxed),
            heap: inner.heap.load(Relaxed),
            idle_bytes: inner.idle_bytes.load(Relaxed),
            receiving_bytes: inner.receiving.load(Relaxed),
            released: inner.released.load(Relaxed),
        }
    }
}

impl ReceiveMemory for ReceivePool {
    fn allocate(&self, len: usize) -> Result<RecvBuffer, Error> {
        Ok(RecvBuffer::new(self.take(len)?))
    }

    /// A slot cut into parts (a small section: heap memory cut the same way).
    fn allocate_split(&self, len: usize, ranges: &[Range<usize>]) -> Result<SplitBuffer, Error> {
        let buffer = self.take(len)?;
        if !buffer.is_pooled() {
            return heap_split(len, ranges);
        }
        split::split(buffer, ranges)
    }

    fn charge(&self, bytes: u64) -> bool {
        let max = self.inner.config.max_receiving_bytes;
        self.inner
            .receiving
            .fetch_update(Relaxed, Relaxed, |now| {
                now.checked_add(bytes).filter(|&n| n <= max)
            })
            .is_ok()
    }

    fn release(&self, bytes: u64) {
        self.inner.receiving.fetch_sub(bytes, Relaxed);
    }

    fn budget(&self) -> u64 {
        self.inner.config.max_receiving_bytes
    }
}

impl PoolInner {
    fn give_back(&self, mapping: Mapping) {
        if !mapping.is_warm() {
            return; // a frame that failed half-way: its pages go back to the system
        }
        let size = len_u64(mapping.len());
        let max = len_u64(self.config.max_idle_bytes);
        // Reserve the budget first so concurrent returns cannot overshoot it.
        let reserved = self.idle_bytes.fetch_update(Relaxed, Relaxed, |idle| {
            idle.checked_add(size).filter(|&n| n <= max)
        });
        if reserved.is_ok() {
            lock(&self.idle)
                .entry(mapping.len())
                .or_default()
                .push((mapping, Instant::now()));
        } else {
            self.released.fetch_add(1, Relaxed);
        }
        // Otherwise `mapping` drops here and is unmapped.
    }
}

/// Half of the physical memory (the default receive budget), or 4 GiB if unknown.
fn half_of_physical_memory() -> u64 {
    physical_memory() / 2
}

/// The physical memory, or 8 GiB if unknown.
pub(crate) fn physical_memory() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    match (u64::try_from(pages), u64::try_from(page)) {
        (Ok(pages), Ok(page)) if pages > 0 && page > 0 => pages.saturating_mul(page),
        _ => 8 << 30,
    }
}

/// Memory for one received section: a pool slot or a heap vector.
#[derive(Debug)]
pub struct PoolBuffer {
    storage: Storage,
}

#[derive(Debug)]
enum Storage {
    Heap(Vec<u8>),
    Slot {
        /// Always `Some` until drop hands it back.
        mapping: Option<Mapping>,
        /// Bytes in use; at most the mapping's length.
        len: usize,
        pool: Arc<PoolInner>,
        /// Counted in the pool's reserved address space (until frozen or dropped).
        reserved: bool,
    },
}

impl PoolBuffer {
    /// Whether this buffer is a pool slot (not heap memory).
    pub fn is_pooled(&self) -> bool {
        matches!(self.storage, Storage::Slot { .. })
    }
}

impl AsRef<[u8]> for PoolBuffer {
    fn as_ref(&self) -> &[u8] {
        match &self.storage {
            Storage::Heap(vec) => vec,
            Storage::Slot {
                mapping: Some(mapping),
                len,
                ..
            } => &mapping.as_slice()[..*len],
            Storage::Slot { mapping: None, .. } => &[],
        }
    }
}

impl AsMut<[u8]> for PoolBuffer {
    fn as_mut(&mut self) -> &mut [u8] {
        match &mut self.storage {
            Storage::Heap(vec) => vec,
            Storage::Slot {
                mapping: Some(mapping),
                len,
                ..
            } => &mut mapping.as_mut_slice()[..*len],
            Storage::Slot { mapping: None, .. } => &mut [],
        }
    }
}

impl ReceiveBuffer for PoolBuffer {
    fn freeze(mut self) -> Bytes {
        match std::mem::replace(&mut self.storage, Storage::Heap(Vec::new())) {
            Storage::Heap(vec) => Bytes::from(vec),
            Storage::Slot {
                mut mapping,
                len,
                pool,
                reserved,
            } => {
                // Frozen means every byte was written: the whole slot counts as warm, and it is
                // the receiver's memory now, no longer a frame's reservation.
                if let Some(mapping) = &mut mapping {
                    mapping.mark_written(mapping.len());
                    if reserved {
                        pool.reserved.fetch_sub(len_u64(mapping.len()), Relaxed);
                    }
                }
                let slot = Storage::Slot {
                    mapping,
                    len,
                    pool,
                    reserved: false,
                };
                Bytes::from_owner(Self { storage: slot })
            }
        }
    }

    fn prepare(&mut self, range: Range<usize>) {
        if let Storage::Slot {
            mapping: Some(mapping),
            ..
        } = &mut self.storage
        {
            mapping.populate(range.end);
        }
    }

    /// A reused slot's pages exist already (a slot is kept only once filled); a fresh one's
    /// only as far as they were populated. Heap sections claim nothing.
    fn committed(&self) -> usize {
        match &self.storage {
            Storage::Slot {
                mapping: Some(mapping),
                len,
                ..
            } => mapping.populated().min(*len),
            _ => 0,
        }
    }
}

impl RecvStorage for PoolBuffer {
    fn as_mut_slice(&mut self) -> &mut [u8] {
        self.as_mut()
    }

    fn prepare(&mut self, range: Range<usize>) {
        ReceiveBuffer::prepare(self, range);
    }

    fn committed(&self) -> usize {
        ReceiveBuffer::committed(self)
    }

    fn freeze(self: Box<Self>) -> Bytes {
        ReceiveBuffer::freeze(*self)
    }
}

impl Drop for PoolBuffer {
    fn drop(&mut self) {
        if let Storage::Slot {
            mapping,
            pool,
            reserved,
            ..
        } = &mut self.storage
        {
            if pool.born != crate::fork::generation() {
                return;
            }
            if let Some(mapping) = mapping.take() {
                if *reserved {
                    pool.reserved.fetch_sub(len_u64(mapping.len()), Relaxed);
                }
                pool.give_back(mapping);
            }
        }
    }
}

/// The slot size for `len` bytes: rounded up to a quarter of its power of two, and to pages.
fn class_size(len: usize) -> usize {
    let base = 1usize << (usize::BITS - 1 - len.leading_zeros());
    let step = (base / 4).max(PAGE);
    let size = len.div_ceil(step).saturating_mul(step);
    size.div_ceil(PAGE).saturating_mul(PAGE)
}

#[cfg(test)]
mod tests;
