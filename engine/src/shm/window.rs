//! A loan's second mapping, for code that hands its address out (Python's buffer protocol).
//!
//! Rust code writes a loan through `&mut` and the borrow checker proves nothing writes it
//! after `freeze`. A Python object that took the loan's address (`numpy.ndarray(buffer=)`,
//! `torch.frombuffer`) may outlive the export it took it through, so freezing cannot prove
//! that. The window gives such code its own mapping of the slot; at freeze it is replaced, in
//! place, by a private copy-on-write mapping of the same bytes: every leftover pointer still
//! reads them, and a write through one changes only a private page of this process, never the
//! frozen slot its receivers see.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use tensorwire_proto::shm::ShmError;

use crate::shm::os::{FileMap, os_error};
use crate::shm::segments::SlotMut;

/// A writable mapping of one loan's bytes at an address of its own.
pub struct Window {
    map: FileMap,
    /// The segment's descriptor and the slot's offset in it (to remap in place).
    source: Option<(Arc<OwnedFd>, usize)>,
    len: usize,
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl Default for Window {
    /// A window of nothing (an empty loan's).
    fn default() -> Self {
        Self {
            map: FileMap::empty(),
            source: None,
            len: 0,
        }
    }
}

impl Window {
    pub(crate) fn of(slot: &SlotMut, len: usize) -> Result<Self, ShmError> {
        let fd = Arc::new(
            slot.segment()
                .fd()
                .try_clone_to_owned()
                .map_err(|e| os_error("dup", &e))?,
        );
        let mapped = len.div_ceil(4096) * 4096;
        // The segment takes no new writable mapping (F_SEAL_FUTURE_WRITE): the window is a
        // second mapping of the owner's own pages.
        let map = slot
            .segment()
            .alias(slot.offset(), mapped)
            .map_err(|e| os_error("mremap", &e))?;
        // The loan is there to be filled: its pages are mapped now, in one call, not faulted
        // in one by one (4 KiB each: shared memory gets no huge pages here).
        map.populate();
        Ok(Self {
            map,
            source: Some((fd, slot.offset())),
            len,
        })
    }

    /// Where the loan's bytes start in this mapping (valid while the window lives).
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr()
    }

    /// The loan's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the loan is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// From now on, writes through this window (and every pointer into it) stay private to
    /// this process: call it before freezing the loan. Idempotent.
    ///
    /// # Errors
    ///
    /// [`ShmError::Os`] if the mapping cannot be replaced (the window is then unchanged, and
    /// the loan must not be frozen).
    pub fn privatize(&mut self) -> Result<(), ShmError> {
        let Some((fd, offset)) = &self.source else {
            return Ok(());
        };
        self.map
            .privatize(fd.as_raw_fd(), *offset)
            .map_err(|e| os_error("mmap(MAP_PRIVATE | MAP_FIXED)", &e))
    }
}
