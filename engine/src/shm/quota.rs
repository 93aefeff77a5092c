//! A byte quota for shared memory: a memfd is not bounded by `/dev/shm`'s size, so without
//! one an oversized reservation would take the host's memory (measured: a 1 PiB `fallocate`
//! ran until the OOM killer struck). Every region is charged before it is created.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tensorwire_proto::shm::ShmError;

/// Bytes that may be in shared-memory regions at once.
#[derive(Clone, Debug)]
pub(crate) struct Quota(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    limit: u64,
    used: AtomicU64,
}

impl Quota {
    pub(crate) fn new(limit: u64) -> Self {
        Self(Arc::new(Inner {
            limit,
            used: AtomicU64::new(0),
        }))
    }

    /// Charges `bytes`, or says how much is left.
    pub(crate) fn charge(&self, bytes: u64) -> Result<Charge, ShmError> {
        let mut used = self.0.used.load(Ordering::Relaxed);
        loop {
            let available = self.0.limit.saturating_sub(used);
            if bytes > available {
                return Err(ShmError::Quota {
                    requested: bytes,
                    available,
                    quota: self.0.limit,
                });
            }
            match self.0.used.compare_exchange_weak(
                used,
                used + bytes,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Ok(Charge {
                        quota: self.clone(),
                        bytes,
                    });
                }
                Err(now) => used = now,
            }
        }
    }

    pub(crate) fn used(&self) -> u64 {
        self.0.used.load(Ordering::Relaxed)
    }
}

/// Bytes charged to a quota until dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    quota: Quota,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.quota.0.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}
