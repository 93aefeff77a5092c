//! What this process lends to peers: pooled slots it copies messages into (reused only after
//! the peer released them), sealed regions it sends where they are, and the lease of each,
//! tied to the connection that holds it.
//!
//! A slot is never written while leased. A lease held past the hold limit is revoked: the
//! pooled slot's pages are punched (the holder reads zeros from then on, never another
//! message) and the slot is retired, never reused.

use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tensorwire_proto::shm::ShmError;

use crate::shm::os::{self, FileMap};
use crate::shm::quota::{Charge, Quota};
use crate::shm::region::{Sealed, os_error};

/// A pooled memfd slot: the owner's writable mapping and a read-only descriptor for peers.
pub(crate) struct PooledSlot {
    fd: OwnedFd,
    read_only: OwnedFd,
    map: Mutex<FileMap>,
    capacity: usize,
    _charge: Charge,
}

impl PooledSlot {
    fn create(capacity: usize, quota: &Quota) -> Result<Self, ShmError> {
        let charge = quota.charge(capacity as u64)?;
        let fd = os::memfd("tensorwire-pool", capacity as u64)
            .map_err(|e| os_error("memfd_create/fallocate", &e))?;
        let read_only =
            os::read_only(fd.as_raw_fd()).map_err(|e| os_error("reopen read-only", &e))?;
        let map =
            FileMap::new(fd.as_raw_fd(), capacity, true, true).map_err(|e| os_error("mmap", &e))?;
        Ok(Self {
            fd,
            read_only,
            map: Mutex::new(map),
            capacity,
            _charge: charge,
        })
    }

    /// Writes `parts` back to back from the start; returns the bytes written.
    pub(crate) fn fill<'a>(&self, parts: impl Iterator<Item = &'a [u8]>) -> usize {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        let memory = map.as_mut_slice();
        let mut at = 0;
        for part in parts {
            memory[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        at
    }

    pub(crate) fn read_only_fd(&self) -> &OwnedFd {
        &self.read_only
    }

    fn retire(&self) {
        if let Err(e) = os::punch_hole(self.fd.as_raw_fd(), self.capacity as u64) {
            tracing::warn!(error = %e, "could not punch a revoked shared-memory slot");
        }
    }
}

/// What a lease holds.
pub(crate) enum Lent {
    Pooled(Arc<PooledSlot>),
    /// Kept alive (and its descriptor open) while lent.
    Sealed {
        _region: Arc<Sealed>,
    },
}

struct Lease {
    conn: u64,
    lent: Lent,
    deadline: Instant,
}

/// Slots, free and lent, and the leases.
pub(crate) struct Lending {
    quota: Quota,
    state: Mutex<State>,
    /// Idle slot bytes kept for reuse at most.
    max_idle: usize,
}

#[derive(Default)]
struct State {
    /// Free slots by capacity.
    free: HashMap<usize, Vec<Arc<PooledSlot>>>,
    idle_bytes: usize,
    leases: HashMap<u64, Lease>,
    deadlines: BTreeSet<(Instant, u64)>,
    next_lease: u64,
}

impl Lending {
    pub(crate) fn new(quota: Quota, max_idle: usize) -> Self {
        Self {
            quota,
            state: Mutex::new(State {
                next_lease: 1,
                ..State::default()
            }),
            max_idle,
        }
    }

    /// A free slot of at least `len` bytes (capacity rounded to its class), from the pool or new.
    pub(crate) fn slot(&self, len: usize) -> Result<Arc<PooledSlot>, ShmError> {
        let capacity = class(len);
        {
            let mut state = self.lock();
            if let Some(slot) = state.free.get_mut(&capacity).and_then(Vec::pop) {
                state.idle_bytes -= capacity;
                return Ok(slot);
            }
        }
        Ok(Arc::new(PooledSlot::create(capacity, &self.quota)?))
    }

    /// Lends `lent` to connection `conn` until `deadline`; the lease id.
    pub(crate) fn lend(&self, conn: u64, lent: Lent, deadline: Instant) -> u64 {
        let mut state = self.lock();
        let id = state.next_lease;
        state.next_lease += 1;
        state.leases.insert(
            id,
            Lease {
                conn,
                lent,
                deadline,
            },
        );
        state.deadlines.insert((deadline, id));
        id
    }

    /// Connection `conn` released `lease` (a lease of another connection is left alone).
    pub(crate) fn release(&self, conn: u64, lease: u64) {
        let mut state = self.lock();
        if state.leases.get(&lease).is_some_and(|l| l.conn == conn) {
            self.end(&mut state, lease, false);
        }
    }

    /// Every lease of `conn` ends (it closed: its holder is gone).
    pub(crate) fn release_all(&self, conn: u64) {
        let mut state = self.lock();
        let ids: Vec<u64> = state
            .leases
            .iter()
            .filter(|(_, l)| l.conn == conn)
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.end(&mut state, id, false);
        }
    }

    /// Revokes leases held past their deadline; returns how many, and the next deadline.
    pub(crate) fn revoke_expired(&self, now: Instant) -> (usize, Option<Instant>) {
        let mut state = self.lock();
        let mut revoked = 0;
        while let Some(&(at, id)) = state.deadlines.first() {
            if at > now {
                return (revoked, Some(at));
            }
            state.deadlines.pop_first();
            if state.leases.contains_key(&id) {
                self.end(&mut state, id, true);
                revoked += 1;
            }
        }
        (revoked, None)
    }

    /// Leases outstanding.
    pub(crate) fn active(&self) -> usize {
        self.lock().leases.len()
    }

    fn end(&self, state: &mut State, id: u64, revoked: bool) {
        let Some(lease) = state.leases.remove(&id) else {
            return;
        };
        state.deadlines.remove(&(lease.deadline, id));
        let Lent::Pooled(slot) = lease.lent else {
            return; // a sealed region: its holder's mapping keeps it as long as needed
        };
        if revoked {
            slot.retire(); // never reused: a slow reader sees zeros, never another message
            return;
        }
        if Arc::strong_count(&slot) == 1 && state.idle_bytes + slot.capacity <= self.max_idle {
            state.idle_bytes += slot.capacity;
            state.free.entry(slot.capacity).or_default().push(slot);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Slot capacities: pages, then four steps per power of two (at most 25 % slack).
fn class(len: usize) -> usize {
    const PAGE: usize = 4096;
    let len = len.max(1).div_ceil(PAGE) * PAGE;
    if len <= 4 * PAGE {
        return len;
    }
    let top = usize::BITS - 1 - len.leading_zeros();
    let step = 1usize << (top - 2);
    len.div_ceil(step) * step
}
