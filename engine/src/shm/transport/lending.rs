//! What this node lends to peers: each lease is one hand-off of one slot to one holder
//! process, and keeps the slot from being written or reused until the holder releases it.
//!
//! Leases belong to the holder *process*, not to the connection they went out on: a release
//! is taken from any connection of that process, and a connection that closes while its
//! process lives leaves its leases in place (the process may still have views of the memory)
//! until the process exits, which its pidfd reports. Nothing is ever revoked from a live
//! holder.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::shm::segments::Slot;
use crate::shm::transport::lock;

/// Leases of this node's slots held by peers.
#[derive(Default)]
pub(crate) struct Lending {
    state: Mutex<State>,
    /// Bumped whenever the orphans change (the poll thread re-reads them only then).
    orphans_changed: AtomicU64,
}

#[derive(Default)]
struct State {
    leases: HashMap<u64, Lease>,
    /// Leases and bytes lent per holder process.
    by_holder: HashMap<u32, (usize, u64)>,
    /// Holders that hold leases but have no connection any more: their pidfds, watched for
    /// their exit.
    orphans: HashMap<u32, OwnedFd>,
    next: u64,
}

struct Lease {
    holder: u32,
    slot: Arc<Slot>,
}

impl Lending {
    /// Lends `slot` to process `holder`; the lease id (never reused).
    pub(crate) fn lend(&self, holder: u32, slot: Arc<Slot>) -> u64 {
        let mut state = lock(&self.state);
        state.next += 1;
        let id = state.next;
        let held = state.by_holder.entry(holder).or_default();
        held.0 += 1;
        held.1 += slot.capacity() as u64;
        state.leases.insert(id, Lease { holder, slot });
        id
    }

    /// The slot of ours that `holder` holds under a lease and that covers `len` bytes at
    /// `offset` of `segment`: what it sends back by reference ([`Part::Returned`]) is checked
    /// against what it was lent, never taken on its word.
    ///
    /// [`Part::Returned`]: tensorwire_proto::shm::Part::Returned
    pub(crate) fn returned(
        &self,
        holder: u32,
        segment: u64,
        offset: u64,
        len: u64,
    ) -> Option<(Arc<Slot>, usize)> {
        let end = offset.checked_add(len)?;
        let state = lock(&self.state);
        state.leases.values().find_map(|lease| {
            let slot = &lease.slot;
            let (start, cap) = (slot.offset() as u64, slot.capacity() as u64);
            (lease.holder == holder
                && slot.segment().id == segment
                && offset >= start
                && end <= start + cap)
                .then(|| {
                    (
                        Arc::clone(slot),
                        usize::try_from(offset - start).unwrap_or(0),
                    )
                })
        })
    }

    /// Process `holder` released `lease` (a lease of another process is left alone).
    pub(crate) fn release(&self, holder: u32, lease: u64) {
        let released = {
            let mut state = lock(&self.state);
            if state.leases.get(&lease).is_none_or(|l| l.holder != holder) {
                return;
            }
            let released = state.leases.remove(&lease);
            if let Some(lease) = &released {
                self.uncount(&mut state, holder, lease.slot.capacity() as u64);
            }
            released
        };
        drop(released); // the slot goes back outside the lock
    }

    /// The last connection of `holder` closed. If the process is gone (`alive` false) its
    /// leases end now; else they stay until its `pidfd` reports its exit.
    pub(crate) fn disconnected(&self, holder: u32, pidfd: Option<OwnedFd>, alive: bool) {
        if !alive {
            return self.exited(holder);
        }
        let mut state = lock(&self.state);
        if state.by_holder.contains_key(&holder) {
            match pidfd {
                Some(pidfd) => {
                    state.orphans.insert(holder, pidfd);
                    self.orphans_changed.fetch_add(1, Ordering::AcqRel);
                }
                None => {
                    drop(state);
                    // Without a pidfd its exit cannot be seen: keep the memory for good
                    // rather than risk changing bytes a live process still reads.
                    tracing::warn!(
                        pid = holder,
                        "a shared-memory holder left without a pidfd; its leases stay until this node shuts down"
                    );
                }
            }
        }
    }

    /// Process `holder` exited: everything it held comes back.
    pub(crate) fn exited(&self, holder: u32) {
        let released: Vec<Lease> = {
            let mut state = lock(&self.state);
            if state.orphans.remove(&holder).is_some() {
                self.orphans_changed.fetch_add(1, Ordering::AcqRel);
            }
            state.by_holder.remove(&holder);
            let ids: Vec<u64> = state
                .leases
                .iter()
                .filter(|(_, l)| l.holder == holder)
                .map(|(&id, _)| id)
                .collect();
            ids.iter()
                .filter_map(|id| state.leases.remove(id))
                .collect()
        };
        drop(released);
    }

    /// A number that changes whenever [`Lending::orphan_fds`] would answer differently.
    pub(crate) fn orphans_version(&self) -> u64 {
        self.orphans_changed.load(Ordering::Acquire)
    }

    /// The pidfds of holders without a connection, to poll for their exit.
    pub(crate) fn orphan_fds(&self) -> Vec<(u32, RawFd)> {
        lock(&self.state)
            .orphans
            .iter()
            .map(|(&pid, fd)| (pid, fd.as_raw_fd()))
            .collect()
    }

    /// Leases outstanding, and the bytes of the slots they hold.
    pub(crate) fn active(&self) -> (usize, u64) {
        let state = lock(&self.state);
        (
            state.leases.len(),
            state.by_holder.values().map(|h| h.1).sum(),
        )
    }

    fn uncount(&self, state: &mut State, holder: u32, bytes: u64) {
        if let Some(held) = state.by_holder.get_mut(&holder) {
            held.0 = held.0.saturating_sub(1);
            held.1 = held.1.saturating_sub(bytes);
            if held.0 == 0 {
                state.by_holder.remove(&holder);
                if state.orphans.remove(&holder).is_some() {
                    self.orphans_changed.fetch_add(1, Ordering::AcqRel);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::shm::{Segments, SegmentsConfig};

    #[test]
    fn memory_sent_back_is_found_only_if_that_holder_holds_it() {
        let segments = Segments::new(SegmentsConfig {
            quota: 64 << 20,
            idle_keep: 0,
            idle_after: Duration::ZERO,
        });
        let slot = segments.take(1 << 20).unwrap().freeze();
        let (segment, start) = (slot.segment().id, slot.offset() as u64);
        let sut = Lending::default();
        let lease = sut.lend(7, Arc::clone(&slot));
        let found = sut.returned(7, segment, start + 64, 100);
        assert!(
            matches!(found, Some((_, 64))),
            "a range inside the lent slot"
        );
        assert!(
            sut.returned(8, segment, start, 100).is_none(),
            "another holder"
        );
        assert!(
            sut.returned(7, segment + 1, start, 100).is_none(),
            "another segment"
        );
        let past = start + slot.capacity() as u64;
        assert!(
            sut.returned(7, segment, past - 10, 100).is_none(),
            "past the slot"
        );
        assert!(
            sut.returned(7, segment, u64::MAX, 2).is_none(),
            "an overflowing range"
        );
        sut.release(7, lease);
        assert!(sut.returned(7, segment, start, 100).is_none(), "released");
    }
}
