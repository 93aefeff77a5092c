//! Which `Bytes` of this process live in sealed shared-memory regions: the data path sends
//! such a buffer as (region, offset, length) instead of copying it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::shm::region::Sealed;

/// Regions by start address; entries whose region is gone are skipped and pruned.
static REGIONS: Mutex<BTreeMap<usize, (usize, Weak<Sealed>)>> = Mutex::new(BTreeMap::new());

/// Records `region` so buffers inside it are recognised.
pub(crate) fn register(region: &Arc<Sealed>) {
    let bytes = region.as_slice();
    if bytes.is_empty() {
        return;
    }
    let start = bytes.as_ptr() as usize;
    let mut regions = REGIONS.lock().unwrap_or_else(PoisonError::into_inner);
    regions.retain(|_, (_, weak)| weak.strong_count() > 0);
    regions.insert(start, (start + bytes.len(), Arc::downgrade(region)));
}

/// The sealed region holding all of `buffer`, and where in it `buffer` starts.
pub(crate) fn lookup(buffer: &[u8]) -> Option<(Arc<Sealed>, u64)> {
    if buffer.is_empty() {
        return None;
    }
    let start = buffer.as_ptr() as usize;
    let end = start.checked_add(buffer.len())?;
    let regions = REGIONS.lock().unwrap_or_else(PoisonError::into_inner);
    let (&region_start, (region_end, weak)) = regions.range(..=start).next_back()?;
    if end > *region_end {
        return None;
    }
    let region = weak.upgrade()?;
    Some((region, (start - region_start) as u64))
}
