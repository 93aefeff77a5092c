//! What this node lends to peers: proto's [`LeaseBook`] over this node's slots, and the
//! pidfds of holder processes that hold leases but no connection any more (their exit is how
//! that memory comes back). Nothing is ever revoked from a live holder.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tensorwire_proto::shm::{LeaseBook, Lent, OverBound, PeerBounds};

use crate::shm::segments::{Slot, SlotMut};
use crate::sync::lock;

/// Leases of this node's slots held by peers.
#[derive(Default)]
pub(super) struct Lending {
    book: Mutex<LeaseBook<LentSlot>>,
    /// Holders with leases and no connection: their pidfds, watched for their exit.
    orphans: Mutex<HashMap<u32, OwnedFd>>,
    /// Bumped whenever the orphans change (the driver re-reads them only then).
    orphans_changed: AtomicU64,
}

/// Bytes promised to one holder for a copy under way ([`Lending::promise`]): withdrawn under
/// the lock that lends its slot ([`Promise::kept`]), or when dropped (no slot was lent).
pub(super) struct Promise<'a> {
    lending: &'a Lending,
    holder: u32,
    bytes: u64,
}

impl Promise<'_> {
    /// The promised slot is being lent under `book` (this lending's book, locked): the promise
    /// ends in the same lock, so the holder's bytes are never counted short.
    pub(super) fn kept(self, book: &mut LeaseBook<LentSlot>) {
        book.withdraw(self.holder, self.bytes);
        std::mem::forget(self); // withdrawn: nothing left for `Drop`
    }
}

impl Drop for Promise<'_> {
    fn drop(&mut self) {
        lock(&self.lending.book).withdraw(self.holder, self.bytes);
    }
}

/// A slot taken for a copy for one process, with its bytes promised to that process until the
/// slot is lent ([`Layout::fill`](super::packing::Layout::fill)): copies under way for a
/// process count against its bound
/// ([`PeerBounds::held_bytes_per_process`](tensorwire_proto::shm::PeerBounds)) as what it
/// holds does. A copy made at once on the sending thread (at most
/// [`COPY_AT_ONCE`](super::outbound::COPY_AT_ONCE) bytes) is only checked, not promised.
pub(super) struct Taken<'a> {
    slot: SlotMut,
    promise: Option<Promise<'a>>,
}

impl<'a> Taken<'a> {
    pub(super) fn new(slot: SlotMut, promise: Option<Promise<'a>>) -> Self {
        Self { slot, promise }
    }

    /// The slot to copy into, and the promise to keep when it is lent.
    pub(super) fn split(taken: Option<Self>) -> (Option<SlotMut>, Option<Promise<'a>>) {
        match taken {
            Some(Taken { slot, promise }) => (Some(slot), promise),
            None => (None, None),
        }
    }
}

/// A slot as the lease book sees it.
#[derive(Clone)]
pub(super) struct LentSlot(pub(super) Arc<Slot>);

impl Lent for LentSlot {
    fn segment(&self) -> u64 {
        self.0.segment().id
    }
    fn offset(&self) -> u64 {
        self.0.offset() as u64
    }
    fn capacity(&self) -> u64 {
        self.0.capacity() as u64
    }
}

impl Lending {
    /// The book, locked: to lend every slot of a message, or check every part a peer sent
    /// back by reference (`LeaseBook::returned`: checked, never taken on its word), under
    /// one lock.
    pub(super) fn book(&self) -> MutexGuard<'_, LeaseBook<LentSlot>> {
        lock(&self.book)
    }

    /// Process `holder` released these leases (others' leases are left alone).
    pub(super) fn release(&self, holder: u32, leases: &[u64]) {
        let freed: Vec<LentSlot> = {
            let mut book = lock(&self.book);
            leases
                .iter()
                .filter_map(|&lease| book.release(holder, lease))
                .collect()
        };
        let emptied = !lock(&self.book).holds(holder);
        if emptied && lock(&self.orphans).remove(&holder).is_some() {
            self.orphans_changed.fetch_add(1, Ordering::AcqRel);
        }
        drop(freed); // the slots go back outside the lock
    }

    /// The last connection of `holder` closed. If the process is gone (`alive` false) its
    /// leases end now; else they stay until its `pidfd` reports its exit.
    pub(super) fn disconnected(&self, holder: u32, pidfd: Option<OwnedFd>, alive: bool) {
        if !alive {
            return self.exited(holder);
        }
        if !lock(&self.book).holds(holder) {
            return;
        }
        match pidfd {
            Some(pidfd) => {
                lock(&self.orphans).insert(holder, pidfd);
                self.orphans_changed.fetch_add(1, Ordering::AcqRel);
            }
            None => {
                // Without a pidfd its exit cannot be seen: keep the memory for good rather
                // than risk changing bytes a live process still reads.
                tracing::warn!(
                    pid = holder,
                    "a shared-memory holder left without a pidfd; its leases stay until this node shuts down"
                );
            }
        }
    }

    /// Process `holder` exited: everything it held comes back.
    pub(super) fn exited(&self, holder: u32) {
        let freed = lock(&self.book).exited(holder);
        if lock(&self.orphans).remove(&holder).is_some() {
            self.orphans_changed.fetch_add(1, Ordering::AcqRel);
        }
        drop(freed);
    }

    /// A number that changes whenever [`Lending::orphan_fds`] would answer differently.
    pub(super) fn orphans_version(&self) -> u64 {
        self.orphans_changed.load(Ordering::Acquire)
    }

    /// The pidfds of holders without a connection, to poll for their exit.
    pub(super) fn orphan_fds(&self) -> Vec<(u32, RawFd)> {
        lock(&self.orphans)
            .iter()
            .map(|(&pid, fd)| (pid, fd.as_raw_fd()))
            .collect()
    }

    /// Whether a slot of `bytes` may be lent to `holder` now ([`LeaseBook::may_promise`]),
    /// without promising it.
    pub(super) fn may_promise(
        &self,
        bounds: &PeerBounds,
        holder: u32,
        bytes: u64,
    ) -> Result<(), OverBound> {
        lock(&self.book).may_promise(bounds, holder, bytes)
    }

    /// A slot of `bytes` promised to process `holder` for a copy about to be made for it, if
    /// `bounds` let it hold that ([`LeaseBook::promise`]); it ends when its slot is lent
    /// ([`Promise::kept`]) or, if none is, when it is dropped.
    pub(super) fn promise(
        &self,
        bounds: &PeerBounds,
        holder: u32,
        bytes: u64,
    ) -> Result<Promise<'_>, OverBound> {
        lock(&self.book).promise(bounds, holder, bytes)?;
        Ok(Promise {
            lending: self,
            holder,
            bytes,
        })
    }

    /// Leases outstanding, and the bytes of the slots they hold.
    pub(super) fn active(&self) -> (usize, u64) {
        lock(&self.book).active()
    }
}
