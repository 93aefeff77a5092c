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

use std::collections::HashMap;

use crate::fast_hash::FastHash;
use crate::shm::{OverBound, PeerBounds};

/// A lent slot, as the book sees it. The slots of one segment have one capacity and start at
/// multiples of it (a slot that does not is never found by [`LeaseBook::returned`]).
pub trait Lent: Clone {
    /// The segment it is in.
    fn segment(&self) -> u64;
    /// Where it starts in the segment.
    fn offset(&self) -> u64;
    /// Its bytes.
    fn capacity(&self) -> u64;
}

/// The leases of a node's slots held by peer processes. Every key is this node's own (lease
/// ids it gave out, its segments, holder pids the kernel reported), so the tables hash fast;
/// a peer's numbers are only looked up.
#[derive(Debug)]
pub struct LeaseBook<S> {
    leases: HashMap<u64, Lease<S>, FastHash>,
    /// Per holder, segment and slot start: the slot and how many leases the holder has on
    /// it (to check returned ranges).
    by_slot: HashMap<(u32, u64, u64), Held<S>, FastHash>,
    /// Per holder and segment: the capacity of its slots and how many slots are held there.
    by_segment: HashMap<(u32, u64), (u64, usize), FastHash>,
    /// Leases and bytes lent per holder process.
    by_holder: HashMap<u32, (usize, u64), FastHash>,
    /// Bytes promised per holder process to copies under way ([`LeaseBook::promise`]).
    promised: HashMap<u32, u64, FastHash>,
    next: u64,
}

#[derive(Debug)]
struct Lease<S> {
    holder: u32,
    slot: S,
}

#[derive(Debug)]
struct Held<S> {
    slot: S,
    leases: usize,
}

impl<S> Default for LeaseBook<S> {
    fn default() -> Self {
        Self {
            leases: HashMap::default(),
            by_slot: HashMap::default(),
            by_segment: HashMap::default(),
            by_holder: HashMap::default(),
            promised: HashMap::default(),
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
        let place = (holder, slot.segment(), slot.offset());
        match self.by_slot.get_mut(&place) {
            Some(held) => held.leases += 1,
            None => {
                held.1 += slot.capacity();
                let segment = self
                    .by_segment
                    .entry((holder, slot.segment()))
                    .or_insert_with(|| (slot.capacity(), 0));
                segment.1 += 1;
                let held = Held {
                    slot: slot.clone(),
                    leases: 1,
                };
                self.by_slot.insert(place, held);
            }
        }
        self.leases.insert(id, Lease { holder, slot });
        id
    }

    /// The slot `holder` holds under some lease that covers `len` bytes at `offset` of
    /// `segment`, and where that range starts in the slot.
    pub fn returned(&self, holder: u32, segment: u64, offset: u64, len: u64) -> Option<(&S, u64)> {
        let end = offset.checked_add(len)?;
        let &(capacity, _) = self.by_segment.get(&(holder, segment))?;
        let start = offset - offset.checked_rem(capacity)?;
        let slot = &self.by_slot.get(&(holder, segment, start))?.slot;
        (slot.offset() == start && end <= start.checked_add(slot.capacity())?)
            .then(|| (slot, offset - start))
    }

    /// Process `holder` released `lease`: the slot, unless the lease is unknown or another
    /// process's (then nothing changes).
    pub fn release(&mut self, holder: u32, lease: u64) -> Option<S> {
        if self.leases.get(&lease)?.holder != holder {
            return None;
        }
        let lease_of = self.leases.remove(&lease)?;
        self.forget(holder, &lease_of.slot);
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
        self.by_slot.retain(|(h, _, _), _| *h != holder);
        self.by_segment.retain(|(h, _), _| *h != holder);
        slots
    }

    /// Whether `holder` holds anything.
    pub fn holds(&self, holder: u32) -> bool {
        self.by_holder.contains_key(&holder)
    }

    /// Bytes of the slots `holder` holds (a slot counted once, however many leases it has on
    /// it).
    pub fn held_by(&self, holder: u32) -> u64 {
        self.by_holder.get(&holder).map_or(0, |h| h.1)
    }

    /// Promises a slot of `bytes` to process `holder` for a copy about to be made for it, if
    /// `bounds` let it hold that on top of what it holds and what copies under way were
    /// promised already. The promise is [withdrawn](LeaseBook::withdraw) when the copy's slot
    /// is lent ([`LeaseBook::lend`], in the same lock), so copies made at the same moment for
    /// one process (its asks served by several threads) cannot pass its bound together.
    ///
    /// # Errors
    ///
    /// [`OverBound::HeldOfProcess`] (nothing is promised) if that would pass
    /// [`PeerBounds::held_bytes_per_process`].
    pub fn promise(
        &mut self,
        bounds: &PeerBounds,
        holder: u32,
        bytes: u64,
    ) -> Result<(), OverBound> {
        self.may_promise(bounds, holder, bytes)?;
        let promised = self.promised.entry(holder).or_default();
        *promised = promised.saturating_add(bytes);
        Ok(())
    }

    /// Whether [`LeaseBook::promise`] would promise `bytes` to `holder` now (nothing is
    /// recorded: for a copy short enough that others made at the same moment may pass the
    /// bound by its slot).
    ///
    /// # Errors
    ///
    /// As [`LeaseBook::promise`].
    pub fn may_promise(
        &self,
        bounds: &PeerBounds,
        holder: u32,
        bytes: u64,
    ) -> Result<(), OverBound> {
        let promised = self.promised.get(&holder).copied().unwrap_or(0);
        let held = self.held_by(holder).saturating_add(promised);
        bounds.may_hold(holder, held, bytes)
    }

    /// A promise of `bytes` to `holder` ([`LeaseBook::promise`]) is over: its slot was lent,
    /// or the copy was not made.
    pub fn withdraw(&mut self, holder: u32, bytes: u64) {
        if let Some(promised) = self.promised.get_mut(&holder) {
            *promised = promised.saturating_sub(bytes);
            if *promised == 0 {
                self.promised.remove(&holder);
            }
        }
    }

    /// Leases outstanding, and the bytes of the slots they hold.
    pub fn active(&self) -> (usize, u64) {
        (
            self.leases.len(),
            self.by_holder.values().map(|h| h.1).sum(),
        )
    }

    fn forget(&mut self, holder: u32, slot: &S) {
        let place = (holder, slot.segment(), slot.offset());
        let mut last = false;
        if let Some(held) = self.by_slot.get_mut(&place) {
            held.leases -= 1;
            if held.leases == 0 {
                last = true;
                self.by_slot.remove(&place);
                let segment = (holder, slot.segment());
                if let Some(count) = self.by_segment.get_mut(&segment) {
                    count.1 -= 1;
                    if count.1 == 0 {
                        self.by_segment.remove(&segment);
                    }
                }
            }
        }
        if let Some(held) = self.by_holder.get_mut(&holder) {
            held.0 = held.0.saturating_sub(1);
            if last {
                held.1 = held.1.saturating_sub(slot.capacity());
            }
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
    fn a_slot_lent_twice_to_one_holder_is_found_until_both_leases_are_released() {
        let mut sut = LeaseBook::default();
        let slot = Slot(3, 1 << 16, 1 << 16);
        let first = sut.lend(7, slot);
        let second = sut.lend(7, slot);
        let other = sut.lend(7, Slot(3, 0, 1 << 16));
        assert_eq!(sut.held_by(7), 2 << 16, "a slot lent twice counts once");
        assert_eq!(sut.active(), (3, 2 << 16));
        assert_eq!(sut.release(7, first), Some(slot));
        assert_eq!(sut.held_by(7), 2 << 16, "still held under the second lease");
        assert_eq!(sut.returned(7, 3, (1 << 16) + 8, 8), Some((&slot, 8)));
        assert_eq!(sut.release(7, second), Some(slot));
        assert_eq!(sut.held_by(7), 1 << 16);
        assert_eq!(sut.returned(7, 3, (1 << 16) + 8, 8), None, "both released");
        assert!(
            sut.returned(7, 3, 8, 8).is_some(),
            "the other slot still held"
        );
        assert_eq!(sut.release(7, other), Some(Slot(3, 0, 1 << 16)));
        assert_eq!(sut.returned(7, 3, 8, 8), None);
        assert_eq!(sut.active(), (0, 0));
        assert!(!sut.holds(7));
    }

    #[test]
    fn copies_under_way_for_one_process_cannot_pass_its_bound_together() {
        let bounds = PeerBounds {
            held_bytes_per_process: 100,
            ..PeerBounds::default()
        };
        let mut sut = LeaseBook::default();
        assert_eq!(sut.promise(&bounds, 7, 60), Ok(()), "holds nothing");
        let over = sut.promise(&bounds, 7, 60).unwrap_err();
        assert_eq!(
            over,
            OverBound::HeldOfProcess {
                pid: 7,
                held: 60,
                len: 60,
                max: 100
            },
            "the first copy is under way"
        );
        assert_eq!(sut.promise(&bounds, 9, 60), Ok(()), "another process");
        assert_eq!(sut.promise(&bounds, 7, 40), Ok(()), "up to the bound");
        sut.lend(7, Slot(1, 0, 60));
        sut.withdraw(7, 60);
        assert!(
            sut.promise(&bounds, 7, 1).is_err(),
            "60 held and 40 promised"
        );
        sut.withdraw(7, 40);
        assert_eq!(
            sut.promise(&bounds, 7, 40),
            Ok(()),
            "the second copy was not made"
        );
        sut.withdraw(7, 40);
        sut.withdraw(7, 40);
        assert_eq!(
            sut.held_by(7),
            60,
            "a promise withdrawn twice takes nothing else away"
        );
        assert!(sut.promise(&bounds, 7, 41).is_err());
        assert!(sut.may_promise(&bounds, 7, 41).is_err());
        assert_eq!(sut.may_promise(&bounds, 7, 40), Ok(()));
        assert_eq!(
            sut.may_promise(&bounds, 7, 40),
            Ok(()),
            "nothing was recorded"
        );
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
        assert_eq!((sut.held_by(7), sut.held_by(9)), (0, 8192));
    }
}
