//! Regions, names and leases, without memory or clocks: the rules of the seed's ShmManager
//! (offer, publish/open, map checks, idempotent release, unpublish that drains, TTL reclaim,
//! clear), generic over what a region holds.
//!
//! A region stays while it is published or leased; once neither, it is handed back to the
//! caller (to unmap, punch, or return to a pool). Generations are never reused, so a stale
//! descriptor can never reach a newer region in the same slot.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use crate::shm::ShmError;

/// Names one leased view of a region: what a holder presents to map or release it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Descriptor {
    /// The region.
    pub region_id: u64,
    /// The region's generation when the lease was granted.
    pub generation: u64,
    /// Where the view starts in the region.
    pub offset: u64,
    /// The view's length.
    pub len: u64,
    /// The lease.
    pub lease_id: u64,
}

/// Counts, with the seed's keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShmStats {
    /// Regions alive (published or leased).
    pub regions: usize,
    /// Names published.
    pub published_regions: usize,
    /// Leases not yet released or expired.
    pub active_leases: usize,
    /// Bytes of all regions alive.
    pub bytes: u64,
}

/// The bookkeeping of one manager.
#[derive(Debug)]
pub struct Leases<R> {
    regions: HashMap<u64, Region<R>>,
    names: HashMap<String, u64>,
    leases: HashMap<u64, Lease>,
    deadlines: BTreeSet<(Instant, u64)>,
    next_region: u64,
    next_lease: u64,
    next_generation: u64,
    bytes: u64,
}

#[derive(Debug)]
struct Region<R> {
    generation: u64,
    len: u64,
    payload: R,
    /// Published under this name (new opens allowed).
    name: Option<String>,
    leases: usize,
}

#[derive(Clone, Copy, Debug)]
struct Lease {
    region: u64,
    generation: u64,
    deadline: Option<Instant>,
}

impl<R> Default for Leases<R> {
    fn default() -> Self {
        Self {
            regions: HashMap::new(),
            names: HashMap::new(),
            leases: HashMap::new(),
            deadlines: BTreeSet::new(),
            next_region: 1,
            next_lease: 1,
            next_generation: 1,
            bytes: 0,
        }
    }
}

impl<R> Leases<R> {
    /// Empty bookkeeping.
    pub fn new() -> Self {
        Self::default()
    }

    /// A single-recipient region with one lease of `ttl`: the message-style rendezvous.
    ///
    /// # Errors
    ///
    /// [`ShmError::Exhausted`] after 2^64 regions or leases.
    pub fn offer(
        &mut self,
        payload: R,
        len: u64,
        ttl: Duration,
        now: Instant,
    ) -> Result<Descriptor, ShmError> {
        let region = self.insert(payload, len, None)?;
        self.lease(region, ttl, now)
    }

    /// A named region that any number of [`Leases::open`]s lease, until unpublished.
    ///
    /// # Errors
    ///
    /// [`ShmError::EmptyName`], [`ShmError::Exists`], [`ShmError::Exhausted`].
    pub fn publish(&mut self, name: &str, payload: R, len: u64) -> Result<(), ShmError> {
        if name.is_empty() {
            return Err(ShmError::EmptyName);
        }
        if self.names.contains_key(name) {
            return Err(ShmError::Exists {
                name: name.to_owned(),
            });
        }
        let region = self.insert(payload, len, Some(name.to_owned()))?;
        self.names.insert(name.to_owned(), region);
        Ok(())
    }

    /// A new, independent lease of `ttl` on the region published as `name`.
    ///
    /// # Errors
    ///
    /// [`ShmError::NotFound`] if nothing is published under `name` (also while it drains).
    pub fn open(
        &mut self,
        name: &str,
        ttl: Duration,
        now: Instant,
    ) -> Result<Descriptor, ShmError> {
        let region = *self.names.get(name).ok_or_else(|| ShmError::NotFound {
            name: name.to_owned(),
        })?;
        self.lease(region, ttl, now)
    }

    /// Checks `descriptor` for a map at `now` and returns the region's payload. An expired
    /// lease is removed (and its region, if that was all that held it: returned in `freed`).
    ///
    /// # Errors
    ///
    /// In this order: [`ShmError::RegionGone`], [`ShmError::Stale`],
    /// [`ShmError::LeaseInactive`], [`ShmError::LeaseExpired`], [`ShmError::RangeOverflow`],
    /// [`ShmError::RangeInvalid`].
    pub fn check(
        &mut self,
        descriptor: &Descriptor,
        now: Instant,
        freed: &mut Vec<R>,
    ) -> Result<&R, ShmError> {
        let region = self
            .regions
            .get(&descriptor.region_id)
            .ok_or(ShmError::RegionGone)?;
        if region.generation != descriptor.generation {
            return Err(ShmError::Stale);
        }
        let lease = self.leases.get(&descriptor.lease_id).copied();
        let Some(lease) = lease
            .filter(|l| l.region == descriptor.region_id && l.generation == descriptor.generation)
        else {
            return Err(ShmError::LeaseInactive);
        };
        if lease.deadline.is_some_and(|at| at <= now) {
            self.drop_lease(descriptor.lease_id, freed);
            return Err(ShmError::LeaseExpired);
        }
        let end = descriptor
            .offset
            .checked_add(descriptor.len)
            .ok_or(ShmError::RangeOverflow)?;
        let region = self
            .regions
            .get(&descriptor.region_id)
            .ok_or(ShmError::RegionGone)?;
        if end > region.len {
            return Err(ShmError::RangeInvalid);
        }
        Ok(&region.payload)
    }

    /// Ends `descriptor`'s lease. Idempotent: a released, stale or forged descriptor changes
    /// nothing. Returns whether a lease ended; a region left unheld goes to `freed`.
    pub fn release(&mut self, descriptor: &Descriptor, freed: &mut Vec<R>) -> bool {
        let matches = self.leases.get(&descriptor.lease_id).is_some_and(|l| {
            l.region == descriptor.region_id && l.generation == descriptor.generation
        });
        matches && self.drop_lease(descriptor.lease_id, freed)
    }

    /// Stops new opens of `name`; existing leases stay valid until released or expired (the
    /// region goes to `freed` once the last one ends, or now if there is none).
    ///
    /// # Errors
    ///
    /// [`ShmError::NotFound`] if `name` is not published (also on a second unpublish).
    pub fn unpublish(&mut self, name: &str, freed: &mut Vec<R>) -> Result<(), ShmError> {
        let region = self.names.remove(name).ok_or_else(|| ShmError::NotFound {
            name: name.to_owned(),
        })?;
        if let Some(entry) = self.regions.get_mut(&region) {
            entry.name = None;
            if entry.leases == 0 {
                self.remove_region(region, freed);
            }
        }
        Ok(())
    }

    /// Removes every lease whose deadline passed by `now`; returns how many.
    pub fn reclaim(&mut self, now: Instant, freed: &mut Vec<R>) -> usize {
        let mut expired = 0;
        while let Some(&(at, lease)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.deadlines.pop_first();
            if self.drop_lease(lease, freed) {
                expired += 1;
            }
        }
        expired
    }

    /// Revokes everything: every lease, every name, every region (all go to `freed`).
    pub fn clear(&mut self, freed: &mut Vec<R>) {
        self.names.clear();
        self.leases.clear();
        self.deadlines.clear();
        self.bytes = 0;
        freed.extend(self.regions.drain().map(|(_, region)| region.payload));
    }

    /// The counts now.
    pub fn stats(&self) -> ShmStats {
        ShmStats {
            regions: self.regions.len(),
            published_regions: self.names.len(),
            active_leases: self.leases.len(),
            bytes: self.bytes,
        }
    }

    /// The earliest lease deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(at, _)| at)
    }

    fn insert(&mut self, payload: R, len: u64, name: Option<String>) -> Result<u64, ShmError> {
        let id = take(&mut self.next_region)?;
        let generation = take(&mut self.next_generation)?;
        self.regions.insert(
            id,
            Region {
                generation,
                len,
                payload,
                name,
                leases: 0,
            },
        );
        self.bytes = self.bytes.saturating_add(len);
        Ok(id)
    }

    fn lease(
        &mut self,
        region_id: u64,
        ttl: Duration,
        now: Instant,
    ) -> Result<Descriptor, ShmError> {
        let lease_id = take(&mut self.next_lease)?;
        let region = self
            .regions
            .get_mut(&region_id)
            .ok_or(ShmError::RegionGone)?;
        region.leases += 1;
        // A deadline past what `Instant` can hold never comes.
        let deadline = now.checked_add(ttl);
        let generation = region.generation;
        let len = region.len;
        self.leases.insert(
            lease_id,
            Lease {
                region: region_id,
                generation,
                deadline,
            },
        );
        if let Some(at) = deadline {
            self.deadlines.insert((at, lease_id));
        }
        Ok(Descriptor {
            region_id,
            generation,
            offset: 0,
            len,
            lease_id,
        })
    }

    fn drop_lease(&mut self, lease_id: u64, freed: &mut Vec<R>) -> bool {
        let Some(lease) = self.leases.remove(&lease_id) else {
            return false;
        };
        if let Some(at) = lease.deadline {
            self.deadlines.remove(&(at, lease_id));
        }
        if let Some(region) = self.regions.get_mut(&lease.region) {
            region.leases -= 1;
            if region.leases == 0 && region.name.is_none() {
                self.remove_region(lease.region, freed);
            }
        }
        true
    }

    fn remove_region(&mut self, id: u64, freed: &mut Vec<R>) {
        if let Some(region) = self.regions.remove(&id) {
            self.bytes = self.bytes.saturating_sub(region.len);
            freed.push(region.payload);
        }
    }
}

/// The next identifier from a counter that never wraps.
fn take(counter: &mut u64) -> Result<u64, ShmError> {
    let id = *counter;
    *counter = counter.checked_add(1).ok_or(ShmError::Exhausted)?;
    Ok(id)
}

#[cfg(test)]
#[path = "leases_tests.rs"]
mod tests;
