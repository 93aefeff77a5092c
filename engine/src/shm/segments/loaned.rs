//! Which `Bytes` of this process live in its own shared-memory slots: the data path sends such
//! a buffer as (segment, offset, length) instead of copying it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use super::{Segment, Slot};
use crate::fork::PerProcess;
use crate::sync::lock;

/// Segments by the start address of their owner's mapping; entries whose segment is gone are
/// skipped and pruned. Per process: a child made by `fork()` starts empty (the parent's
/// mappings are not inherited, and its lock may have been held at the fork).
static SEGMENTS: PerProcess<Mutex<ByAddress>> = PerProcess::new();

/// Segment start address → (end address, the segment).
type ByAddress = BTreeMap<usize, (usize, Weak<Segment>)>;

fn segments() -> &'static Mutex<ByAddress> {
    SEGMENTS.get_or_init(|| Mutex::new(BTreeMap::new()))
}

/// Records `segment` so buffers inside its slots are recognised.
pub(crate) fn register(segment: &Arc<Segment>) {
    let bytes = segment.as_slice();
    if bytes.is_empty() {
        return;
    }
    let start = bytes.as_ptr() as usize;
    let mut segments = lock(segments());
    segments.retain(|_, (_, weak)| weak.strong_count() > 0);
    segments.insert(start, (start + bytes.len(), Arc::downgrade(segment)));
}

/// The frozen slot holding all of `buffer`, and where in its segment `buffer` starts — in any
/// node's pool of this process: [`super::Segments::loaned`] keeps a pool's own.
///
/// Only a frozen slot has `Bytes`, and a live `Bytes` keeps its slot, so a buffer that points
/// into a slot always finds that slot here.
pub(super) fn lookup(buffer: &[u8]) -> Option<(Arc<Slot>, u64)> {
    if buffer.is_empty() {
        return None;
    }
    let start = buffer.as_ptr() as usize;
    let end = start.checked_add(buffer.len())?;
    let segment = {
        let segments = lock(segments());
        let (&segment_start, (segment_end, weak)) = segments.range(..=start).next_back()?;
        if end > *segment_end {
            return None;
        }
        (weak.upgrade()?, start - segment_start)
    };
    let (segment, offset) = segment;
    let slot = segment.slot_at(offset, buffer.len())?;
    Some((slot, offset as u64))
}
