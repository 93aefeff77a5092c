//! The node's shared-memory manager, in the seed's vocabulary: `offer` (message-style
//! rendezvous), `publish` + `open` (serve-style named regions), `map`, `release`,
//! `unpublish` (drains), TTL reclaim, `clear`, `stats`; and loaned slots a producer fills in
//! place.
//!
//! Two backends: `in_process` aliases the same `Bytes` (no copy, this process only), `memfd`
//! keeps each region in a slot of the node's shared-memory segments (copied in once, or filled
//! in place through a loan), which the data path hands to another process by reference.
//! Loans always come from the segments, whatever the backend.
//!
//! A lease bounds when a region may be *mapped*; a view already mapped keeps its bytes, which
//! never change, after the lease ends, the name is unpublished, or the manager is cleared.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_proto::shm::{Descriptor, Leases, ShmError, ShmStats};

use crate::shm::segments::{Segments, SegmentsConfig, SlotMut};
use crate::shm::window::Window;

/// Where regions live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShmBackend {
    /// Aliases of the same `Bytes` in this process.
    InProcess,
    /// Slots of the node's memfd segments: shareable with other processes.
    Memfd,
}

impl ShmBackend {
    /// `"in_process"` or `"memfd"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InProcess => "in_process",
            Self::Memfd => "memfd",
        }
    }
}

/// The manager's counts, with the seed's keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShmManagerStats {
    /// `"in_process"` or `"memfd"`.
    pub backend: &'static str,
    /// Regions alive.
    pub regions: usize,
    /// Names published.
    pub published_regions: usize,
    /// Leases not released or expired.
    pub active_leases: usize,
    /// Bytes of the regions alive.
    pub bytes: u64,
}

/// A node's shared-memory regions and leases (cheap to clone).
#[derive(Clone, Debug)]
pub struct ShmManager {
    inner: Arc<Inner>,
}

struct Inner {
    backend: ShmBackend,
    leases: Mutex<Leases<Bytes>>,
    segments: Segments,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmManager")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl ShmManager {
    /// A manager with `backend` and segments of its own, at most `quota_bytes` of them.
    pub fn new(backend: ShmBackend, quota_bytes: u64) -> Self {
        let segments = Segments::new(SegmentsConfig {
            quota: quota_bytes,
            idle_keep: quota_bytes.min(64 << 20),
            idle_after: Duration::from_secs(2),
        });
        Self::with_segments(backend, segments)
    }

    /// A manager over a node's segments (shared with its same-host data path).
    pub(crate) fn with_segments(backend: ShmBackend, segments: Segments) -> Self {
        Self {
            inner: Arc::new(Inner {
                backend,
                leases: Mutex::new(Leases::new()),
                segments,
            }),
        }
    }

    /// The backend.
    pub fn backend(&self) -> ShmBackend {
        self.inner.backend
    }

    /// A single-recipient region holding `bytes`, leased for `ttl`.
    ///
    /// # Errors
    ///
    /// [`ShmError::Quota`] or [`ShmError::Os`] (memfd backend).
    pub fn offer(&self, bytes: Bytes, ttl: Duration) -> Result<Descriptor, ShmError> {
        let (payload, len) = self.payload(bytes)?;
        let now = Instant::now();
        let mut leases = self.lock();
        Self::reclaim(&mut leases, now);
        leases.offer(payload, len, ttl, now)
    }

    /// A region named `name` holding `bytes`; [`ShmManager::open`] leases it.
    ///
    /// # Errors
    ///
    /// [`ShmError::EmptyName`], [`ShmError::Exists`], quota and OS errors.
    pub fn publish(&self, name: &str, bytes: Bytes) -> Result<(), ShmError> {
        let (payload, len) = self.payload(bytes)?;
        let mut leases = self.lock();
        Self::reclaim(&mut leases, Instant::now());
        leases.publish(name, payload, len)
    }

    /// A new lease of `ttl` on the region published as `name`.
    ///
    /// # Errors
    ///
    /// [`ShmError::NotFound`] (never published, or unpublished: draining).
    pub fn open(&self, name: &str, ttl: Duration) -> Result<Descriptor, ShmError> {
        let now = Instant::now();
        let mut leases = self.lock();
        Self::reclaim(&mut leases, now);
        leases.open(name, ttl, now)
    }

    /// A zero-copy, read-only view of the descriptor's range, valid for as long as it is held
    /// (even after the lease ends: the memory stays until the last view drops).
    ///
    /// # Errors
    ///
    /// The checks of the reference, in its order: region gone, stale generation, lease
    /// inactive, lease expired, range overflow, range past the region.
    pub fn map(&self, descriptor: &Descriptor) -> Result<Bytes, ShmError> {
        let mut freed = Vec::new();
        let mut leases = self.lock();
        let payload = leases.check(descriptor, Instant::now(), &mut freed)?;
        let start = usize::try_from(descriptor.offset).map_err(|_| ShmError::RangeInvalid)?;
        let end = usize::try_from(descriptor.offset + descriptor.len)
            .map_err(|_| ShmError::RangeInvalid)?;
        Ok(payload.slice(start..end))
    }

    /// Ends the descriptor's lease (idempotent). Returns whether a lease ended.
    pub fn release(&self, descriptor: &Descriptor) -> bool {
        let mut freed = Vec::new();
        self.lock().release(descriptor, &mut freed)
    }

    /// No new opens of `name`; existing leases drain.
    ///
    /// # Errors
    ///
    /// [`ShmError::NotFound`] if `name` is not published.
    pub fn unpublish(&self, name: &str) -> Result<(), ShmError> {
        let mut freed = Vec::new();
        self.lock().unpublish(name, &mut freed)
    }

    /// Removes every lease past its deadline; returns how many.
    pub fn reclaim_expired(&self) -> usize {
        let mut freed = Vec::new();
        self.lock().reclaim(Instant::now(), &mut freed)
    }

    /// Revokes everything. Views already mapped stay valid (they keep their memory).
    pub fn clear(&self) {
        let mut freed = Vec::new();
        self.lock().clear(&mut freed);
    }

    /// The counts (after reclaiming expired leases).
    pub fn stats(&self) -> ShmManagerStats {
        let mut leases = self.lock();
        Self::reclaim(&mut leases, Instant::now());
        let ShmStats {
            regions,
            published_regions,
            active_leases,
            bytes,
            ..
        } = leases.stats();
        ShmManagerStats {
            backend: self.inner.backend.as_str(),
            regions,
            published_regions,
            active_leases,
            bytes,
        }
    }

    /// Bytes of shared-memory segments alive (slots lent, held, filling and idle).
    pub fn quota_used(&self) -> u64 {
        self.inner.segments.used_bytes()
    }

    /// Bytes of slots held now: loans, frozen buffers and regions still referenced here or by
    /// a peer.
    pub fn held_bytes(&self) -> u64 {
        self.inner.segments.held_bytes()
    }

    /// A writable slot of `len` bytes to fill in place (no copy), then to offer, publish or
    /// send as `Bytes`; nothing writes it once it is handed on. It comes from the node's
    /// segments whatever the backend (`len` 0 is a valid, empty loan).
    ///
    /// # Errors
    ///
    /// [`ShmError::Quota`] or [`ShmError::Os`].
    pub fn loan(&self, len: usize) -> Result<Loan, ShmError> {
        let slot = if len == 0 {
            None
        } else {
            Some(self.inner.segments.take(len)?)
        };
        Ok(Loan {
            slot,
            len,
            manager: self.clone(),
        })
    }

    fn payload(&self, bytes: Bytes) -> Result<(Bytes, u64), ShmError> {
        let len = bytes.len() as u64;
        match self.inner.backend {
            ShmBackend::InProcess => Ok((bytes, len)),
            ShmBackend::Memfd if bytes.is_empty() => Ok((bytes, 0)),
            ShmBackend::Memfd => {
                let mut slot = self.inner.segments.take(bytes.len())?;
                let into = &mut slot.as_mut_slice()[..bytes.len()];
                crate::shm::split_copy::copy_all(vec![(into, &bytes[..])]);
                Ok((slot.freeze().bytes(0..bytes.len()), len))
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Leases<Bytes>> {
        crate::sync::lock(&self.inner.leases)
    }

    fn reclaim(leases: &mut Leases<Bytes>, now: Instant) {
        let mut freed = Vec::new();
        leases.reclaim(now, &mut freed);
    }
}

/// A writable slot on loan from a manager.
pub struct Loan {
    slot: Option<SlotMut>,
    len: usize,
    manager: ShmManager,
}

impl std::fmt::Debug for Loan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loan")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl Loan {
    /// The slot's bytes, to fill in place.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.slot {
            Some(slot) => &mut slot.as_mut_slice()[..self.len],
            None => &mut [],
        }
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A second, writable mapping of the loan's bytes at an address of its own, for code that
    /// hands raw pointers out (a Python buffer export) and so cannot be sure none is left when
    /// the loan is frozen: [`Window::privatize`] turns whatever still points into it into a
    /// private copy-on-write view, so no write through it can reach the frozen bytes.
    ///
    /// # Errors
    ///
    /// [`ShmError::Os`] if the mapping cannot be made.
    pub fn window(&self) -> Result<Window, ShmError> {
        match &self.slot {
            Some(slot) => Window::of(slot, self.len),
            None => Ok(Window::default()),
        }
    }

    /// Offers it to one recipient for `ttl` (no copy).
    ///
    /// # Errors
    ///
    /// As [`ShmManager::offer`].
    pub fn offer(self, ttl: Duration) -> Result<Descriptor, ShmError> {
        let manager = self.manager.clone();
        let bytes = self.freeze();
        let len = bytes.len() as u64;
        let now = Instant::now();
        let mut leases = manager.lock();
        ShmManager::reclaim(&mut leases, now);
        leases.offer(bytes, len, ttl, now)
    }

    /// Publishes it as `name` (no copy).
    ///
    /// # Errors
    ///
    /// As [`ShmManager::publish`].
    pub fn publish(self, name: &str) -> Result<(), ShmError> {
        let manager = self.manager.clone();
        let bytes = self.freeze();
        let len = bytes.len() as u64;
        manager.lock().publish(name, bytes, len)
    }

    /// Its bytes, from now on only read: a buffer for a `TensorMessage` that the same-host
    /// data path sends without copying. The slot is held as long as any view of the bytes
    /// (here or at a peer) lives.
    pub fn freeze(self) -> Bytes {
        match self.slot {
            Some(slot) => slot.freeze().bytes(0..self.len),
            None => Bytes::new(),
        }
    }
}
