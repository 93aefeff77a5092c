//! The node's shared-memory manager, in the seed's vocabulary: `offer` (message-style
//! rendezvous), `publish` + `open` (serve-style named regions), `map`, `release`,
//! `unpublish` (drains), TTL reclaim, `clear`, `stats`; and loaned slots a producer fills in
//! place.
//!
//! Two backends: `in_process` aliases the same `Bytes` (no copy, this process only), `memfd`
//! keeps each region in a sealed memfd (copied in once, or filled in place through a loan),
//! which the data path can hand to another process.

use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tensorwire_proto::shm::{Descriptor, Leases, ShmError, ShmStats};

use crate::shm::loaned;
use crate::shm::quota::Quota;
use crate::shm::region::{Sealed, Slot};

/// Where regions live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShmBackend {
    /// Aliases of the same `Bytes` in this process.
    InProcess,
    /// One sealed memfd per region: shareable with other processes.
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

#[derive(Debug)]
struct Inner {
    backend: ShmBackend,
    leases: Mutex<Leases<Payload>>,
    quota: Quota,
}

/// What a region holds.
#[derive(Debug)]
enum Payload {
    Bytes(Bytes),
    Sealed(Arc<Sealed>),
}

impl ShmManager {
    /// A manager with `backend` and a quota of `quota_bytes` for memfd regions.
    pub fn new(backend: ShmBackend, quota_bytes: u64) -> Self {
        Self {
            inner: Arc::new(Inner {
                backend,
                leases: Mutex::new(Leases::new()),
                quota: Quota::new(quota_bytes),
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
        Ok(match payload {
            Payload::Bytes(bytes) => bytes.slice(start..end),
            Payload::Sealed(region) => region.bytes(start..end),
        })
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

    /// Bytes of memfd regions alive (including loans and views still mapped).
    pub fn quota_used(&self) -> u64 {
        self.inner.quota.used()
    }

    /// A writable slot of `len` bytes to fill in place (no copy), then to offer, publish or
    /// send as `Bytes` — sealed from then on.
    ///
    /// # Errors
    ///
    /// [`ShmError::Quota`] or [`ShmError::Os`].
    pub fn loan(&self, len: usize) -> Result<Loan, ShmError> {
        let memory = match self.inner.backend {
            ShmBackend::InProcess => LoanMemory::Heap(BytesMut::zeroed(len)),
            ShmBackend::Memfd => {
                let charge = self.inner.quota.charge(len as u64)?;
                LoanMemory::Slot(Slot::create(len, charge)?)
            }
        };
        Ok(Loan {
            memory,
            manager: self.clone(),
        })
    }

    fn payload(&self, bytes: Bytes) -> Result<(Payload, u64), ShmError> {
        let len = bytes.len() as u64;
        match self.inner.backend {
            ShmBackend::InProcess => Ok((Payload::Bytes(bytes), len)),
            ShmBackend::Memfd => {
                let mut slot = Slot::create(bytes.len(), self.inner.quota.charge(len)?)?;
                slot.as_mut_slice().copy_from_slice(&bytes);
                Ok((Payload::Sealed(Arc::new(slot.seal()?)), len))
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Leases<Payload>> {
        self.inner
            .leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn reclaim(leases: &mut Leases<Payload>, now: Instant) {
        let mut freed = Vec::new();
        leases.reclaim(now, &mut freed);
    }
}

/// A writable slot on loan from a manager.
#[derive(Debug)]
pub struct Loan {
    memory: LoanMemory,
    manager: ShmManager,
}

#[derive(Debug)]
enum LoanMemory {
    Heap(BytesMut),
    Slot(Slot),
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

impl Loan {
    /// The slot's bytes, to fill in place.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.memory {
            LoanMemory::Heap(bytes) => bytes,
            LoanMemory::Slot(slot) => slot.as_mut_slice(),
        }
    }

    /// Its length.
    pub fn len(&self) -> usize {
        match &self.memory {
            LoanMemory::Heap(bytes) => bytes.len(),
            LoanMemory::Slot(slot) => slot.len(),
        }
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The memfd behind it (memfd backend), for handing to other code. Once the loan is
    /// offered, published or frozen, the kernel refuses every write through it.
    pub fn as_fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.memory {
            LoanMemory::Heap(_) => None,
            LoanMemory::Slot(slot) => Some(slot.as_fd()),
        }
    }

    /// Seals it and offers it to one recipient for `ttl` (no copy).
    ///
    /// # Errors
    ///
    /// [`ShmError::Os`] if it cannot be sealed.
    pub fn offer(self, ttl: Duration) -> Result<Descriptor, ShmError> {
        let manager = self.manager.clone();
        let (payload, len) = self.into_payload()?;
        let now = Instant::now();
        let mut leases = manager.lock();
        ShmManager::reclaim(&mut leases, now);
        leases.offer(payload, len, ttl, now)
    }

    /// Seals it and publishes it as `name` (no copy).
    ///
    /// # Errors
    ///
    /// As [`ShmManager::publish`].
    pub fn publish(self, name: &str) -> Result<(), ShmError> {
        let manager = self.manager.clone();
        let (payload, len) = self.into_payload()?;
        manager.lock().publish(name, payload, len)
    }

    /// Seals it and returns its bytes: a buffer for a `TensorMessage` that the same-host
    /// data path sends without copying.
    ///
    /// # Errors
    ///
    /// [`ShmError::Os`] if it cannot be sealed.
    pub fn freeze(self) -> Result<Bytes, ShmError> {
        match self.into_payload()?.0 {
            Payload::Bytes(bytes) => Ok(bytes),
            Payload::Sealed(region) => {
                let len = region.as_slice().len();
                Ok(region.bytes(0..len))
            }
        }
    }

    fn into_payload(self) -> Result<(Payload, u64), ShmError> {
        match self.memory {
            LoanMemory::Heap(bytes) => {
                let len = bytes.len() as u64;
                Ok((Payload::Bytes(bytes.freeze()), len))
            }
            LoanMemory::Slot(slot) => {
                let len = slot.len() as u64;
                let region = Arc::new(slot.seal()?);
                loaned::register(&region);
                Ok((Payload::Sealed(region), len))
            }
        }
    }
}
