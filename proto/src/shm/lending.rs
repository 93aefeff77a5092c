//! What a node lends to its same-host peers, without memory: each lease is one hand-off of one
//! slot to one holder *process*, and keeps the slot from being written or reused until the
//! holder releases it or exits.
//!
//! Leases belong to the holder process, not to the connection they went out on: a release is
//! taken from any connection of that process, and a connection that closes while its process
//! lives leaves its leases in place (the process may still have views of the memory) until the
//! process exits. Nothing is ever revoked from a live holder. What a holder sends back by
//! reference ([`Part::Returned`](crate::shm::Part::Returned)) is checked against what it was
//! lent, never taken on its word.

use std::collections::{BTreeMap, HashMap};

/// A lent slot, as the book sees it.
pub trait Lent {
    /// The segment it is in.
    fn segment(&self) -> u64;
    /// Where it starts in the segment.
    fn offset(&self) -> u64;
    /// Its bytes.
    fn capacity(&self) -> u64;
}

/// The leases of a node's slots held by peer processes.
#[derive(Debug)]
pub struct LeaseBook<S> {
    leases: HashMap<u64, Lease<S>>,
    /// Per holder and segment: the leases by slot start (to check returned ranges).
    by_place: HashMap<(u32, u64), BTreeMap<(u64, u64), ()>>,
    /// Leases and bytes lent per holder process.
    by_holder: HashMap<u32, (usize, u64)>,
    next: u64,
}

#[derive(Debug)]
struct Lease<S> {
    holder: u32,
    slot: S,
}

impl<S> Default for LeaseBook<S> {
    fn default() -> Self {
        Self {
            leases: HashMap::new(),
            by_place: HashMap::new(),
            by_holder: HashMap::new(),
            next: 0,
        }
    }
}

impl<S: Lent> LeaseBook<S> {
    /// Lends `slot` to process `holder`: the lease id (never reused).
    pub fn lend(&mut self, holder: u32, slot: S) -> u64 {
        self.next += 1;
        let id = self.next;
        let held = self.by_holder.entry(holder).or_default();
        held.0 += 1;
        held.1 += slot.capacity();
        self.by_place
            .entry((holder, slot.segment()))
            .or_default()
            .insert((slot.offset(), id), ());
        self.leases.insert(id, Lease { holder, slot });
        id
    }

    /// The slot `holder` holds under some lease that covers `len` bytes at `offset` of
    /// `segment`, and where that range starts in the slot.
    pub fn returned(&self, holder: u32, segment: u64, offset: u64, len: u64) -> Option<(&S, u64)> {
        let end = offset.checked_add(len)?;
        let places = self.by_place.get(&(holder, segment))?;
        let (&(_, lease), ()) = places.range(..=(offset, u64::MAX)).next_back()?;
        let slot = &self.leases.get(&lease)?.slot;
        let start = slot.offset();
        (offset >= start && end <= start.checked_add(slot.capacity())?)
            .then(|| (slot, offset - start))
    }

    /// Process `holder` released `lease`: the slot, unless the lease is unknown or another
    /// process's (then nothing changes).
    pub fn release(&mut self, holder: u32, lease: u64) -> Option<S> {
        if self.leases.get(&lease)?.holder != holder {
            return None;
        }
        let lease_of = self.leases.remove(&lease)?;
        self.forget(holder, lease, &lease_of.slot);
        Some(lease_of.slot)
    }

    /// Process `holder` exited: every slot it held, to give back.
    pub fn exited(&mut self, holder: u32) -> Vec<S> {
        let ids: Vec<u64> = self
            .leases
            .iter()
            .filter(|(_, l)| l.holder == holder)
            .map(|(&id, _)| id)
            .collect();
        let slots: Vec<S> = ids
            .iter()
            .filter_map(|id| self.leases.remove(id))
            .map(|l| l.slot)
            .collect();
        self.by_holder.remove(&holder);
        self.by_place.retain(|(h, _), _| *h != holder);
        slots
    }

    /// Whether `holder` holds anything.
    pub fn holds(&self, holder: u32) -> bool {
        self.by_holder.contains_key(&holder)
    }

    /// Leases outstanding, and the bytes of the slots they hold.
    pub fn active(&self) -> (usize, u64) {
        (
            self.leases.len(),
            self.by_holder.values().map(|h| h.1).sum(),
        )
    }

    fn forget(&mut self, holder: u32, lease: u64, slot: &S) {
        if let Some(places) = self.by_place.get_mut(&(holder, slot.segment())) {
            places.remove(&(slot.offset(), lease));
            if places.is_empty() {
                self.by_place.remove(&(holder, slot.segment()));
            }
        }
        if let Some(held) = self.by_holder.get_mut(&holder) {
            held.0 = held.0.saturating_sub(1);
            held.1 = held.1.saturating_sub(slot.capacity());
            if held.0 == 0 {
                self.by_holder.remove(&holder);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Slot(u64, u64, u64);

    impl Lent for Slot {
        fn segment(&self) -> u64 {
            self.0
        }
        fn offset(&self) -> u64 {
            self.1
        }
        fn capacity(&self) -> u64 {
            self.2
        }
    }

    #[test]
    fn memory_sent_back_is_found_only_if_that_holder_holds_it() {
        let mut sut = LeaseBook::default();
        let slot = Slot(3, 1 << 20, 1 << 20);
        let lease = sut.lend(7, slot);
        sut.lend(7, Slot(3, 0, 1 << 20));
        assert_eq!(sut.returned(7, 3, (1 << 20) + 64, 100), Some((&slot, 64)));
        assert_eq!(sut.returned(8, 3, 1 << 20, 100), None, "another holder");
        assert_eq!(sut.returned(7, 4, 1 << 20, 100), None, "another segment");
        assert_eq!(
            sut.returned(7, 3, (2 << 20) - 10, 100),
            None,
            "past the slot"
        );
        assert_eq!(sut.returned(7, 3, (3 << 20) - 10, 5), None, "no slot there");
        assert_eq!(
            sut.returned(7, 3, u64::MAX, 2),
            None,
            "an overflowing range"
        );
        assert_eq!(sut.release(7, lease), Some(slot));
        assert_eq!(sut.returned(7, 3, 1 << 20, 100), None, "released");
    }

    #[test]
    fn a_release_from_another_process_changes_nothing() {
        let mut sut = LeaseBook::default();
        let lease = sut.lend(7, Slot(1, 0, 4096));
        assert_eq!(sut.release(8, lease), None);
        assert_eq!(sut.release(7, lease + 1), None, "an unknown lease");
        assert_eq!(sut.active(), (1, 4096));
        assert_eq!(sut.release(7, lease), Some(Slot(1, 0, 4096)));
        assert_eq!(sut.release(7, lease), None, "released once");
        assert_eq!(sut.active(), (0, 0));
    }

    #[test]
    fn a_holder_that_exits_gives_back_everything_it_held() {
        let mut sut = LeaseBook::default();
        sut.lend(7, Slot(1, 0, 4096));
        sut.lend(7, Slot(2, 0, 8192));
        sut.lend(9, Slot(2, 8192, 8192));
        let mut back = sut.exited(7);
        back.sort_by_key(|s| s.0);
        assert_eq!(back, vec![Slot(1, 0, 4096), Slot(2, 0, 8192)]);
        assert!(!sut.holds(7));
        assert!(sut.holds(9));
        assert_eq!(sut.active(), (1, 8192));
    }
}
