//! Memfd regions: a writable slot being filled by its owner, and a sealed region nobody can
//! write again, whose read-only mapping becomes `Bytes` without a copy.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use tensorwire_proto::shm::ShmError;

use crate::shm::os::{self, FileMap};
use crate::shm::quota::Charge;

/// A memfd its owner fills through a writable mapping (pre-faulted, so filling runs at
/// memory speed, not at first-touch speed).
pub(crate) struct Slot {
    fd: OwnedFd,
    map: FileMap,
    charge: Charge,
}

impl Slot {
    /// A slot of `len` bytes, charged to `charge`.
    pub(crate) fn create(len: usize, charge: Charge) -> Result<Self, ShmError> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let name = format!("tensorwire-slot-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let fd =
            os::memfd(&name, len as u64).map_err(|e| os_error("memfd_create/fallocate", &e))?;
        let map =
            FileMap::new(fd.as_raw_fd(), len, true, true).map_err(|e| os_error("mmap", &e))?;
        Ok(Self { fd, map, charge })
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        self.map.as_mut_slice()
    }

    pub(crate) fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Seals it immutable: the writable mapping goes first (the kernel refuses `F_SEAL_WRITE`
    /// while one exists), then nobody — owner, holder, a `/proc` reopen — can write it again.
    pub(crate) fn seal(self) -> Result<Sealed, ShmError> {
        let Self { fd, map, charge } = self;
        let len = map.len();
        drop(map);
        os::add_seals(fd.as_raw_fd(), os::SEALS_IMMUTABLE)
            .map_err(|e| os_error("F_ADD_SEALS", &e))?;
        let view =
            FileMap::new(fd.as_raw_fd(), len, false, true).map_err(|e| os_error("mmap", &e))?;
        Ok(Sealed {
            fd,
            view,
            _charge: charge,
        })
    }
}

/// An immutable region: sealed `WRITE | SHRINK | GROW | SEAL`, mapped read-only.
pub(crate) struct Sealed {
    fd: OwnedFd,
    view: FileMap,
    _charge: Charge,
}

impl Sealed {
    /// Its bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        self.view.as_slice()
    }

    /// The memfd (sealed: sending it lets a peer read, never write).
    pub(crate) fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A zero-copy `Bytes` of `range` that keeps the region alive.
    pub(crate) fn bytes(self: &Arc<Self>, range: std::ops::Range<usize>) -> Bytes {
        Bytes::from_owner(View(Arc::clone(self))).slice(range)
    }
}

impl std::fmt::Debug for Sealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealed")
            .field("len", &self.view.len())
            .finish_non_exhaustive()
    }
}

/// The owner of `Bytes` made from a sealed region.
struct View(Arc<Sealed>);

impl AsRef<[u8]> for View {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

pub(crate) fn os_error(op: &'static str, e: &std::io::Error) -> ShmError {
    ShmError::Os {
        op,
        reason: e.to_string(),
    }
}
