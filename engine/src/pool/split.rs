//! A pool slot cut into parts that are filled on different threads (the stripes of a striped
//! request, each received on its own connection) and frozen whole once every part is done.

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

use bytes::Bytes;
use tensorwire_proto::ReceiveBuffer;
use tensorwire_proto::transport::{
    Error, JoinStorage, RecvBuffer, RecvStorage, SplitBuffer, check_ranges,
};

use super::PoolBuffer;
use super::mapping::populate_range;

/// Cuts `buffer` (a slot, exclusively owned) at `ranges`.
pub(super) fn split(mut buffer: PoolBuffer, ranges: &[Range<usize>]) -> Result<SplitBuffer, Error> {
    let memory = buffer.as_mut();
    check_ranges(memory.len(), ranges)?;
    let base = NonNull::new(memory.as_mut_ptr())
        .ok_or_else(|| Error::Memory("a slot without memory cannot be split".into()))?;
    let committed = ReceiveBuffer::committed(&buffer);
    let whole = Arc::new(Whole(buffer));
    let parts = ranges
        .iter()
        .map(|range| {
            RecvBuffer::new(Part {
                whole: Arc::clone(&whole),
                // SAFETY: `range` lies inside the slot (checked above), so the offset stays
                // inside its mapping.
                ptr: unsafe { base.add(range.start) },
                len: range.len(),
                committed: committed.saturating_sub(range.start).min(range.len()),
            })
        })
        .collect();
    Ok(SplitBuffer {
        parts,
        joiner: Box::new(Joiner(whole)),
    })
}

/// The slot while it is cut: nothing touches it through this value until every part is gone.
struct Whole(PoolBuffer);

/// One part: a range of the slot that only this value writes.
struct Part {
    /// Keeps the slot mapped while the part exists.
    whole: Arc<Whole>,
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes from the part's start whose pages exist for sure.
    committed: usize,
}

// SAFETY: a part is the only writer of its range (the ranges do not overlap, and the slot
// itself is not touched while parts exist); moving it to another thread is like moving a
// `Vec<u8>`. The `Arc` keeps the mapping alive.
unsafe impl Send for Part {}

impl RecvStorage for Part {
    fn as_mut_slice(&mut self) -> &mut [u8] {
        let _ = &self.whole;
        // SAFETY: `ptr..ptr + len` is this part's range of a live mapping (kept by `whole`),
        // which no other value reads or writes while the part exists; `&mut self` makes the
        // slice the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    fn prepare(&mut self, range: Range<usize>) {
        let end = range.end.min(self.len);
        if end <= self.committed {
            return;
        }
        // SAFETY: `committed..end` lies inside this part's range, which only this part writes,
        // and nothing was received there yet (ranges are prepared in order, before use).
        unsafe { populate_range(self.ptr.as_ptr(), self.committed, end) };
        self.committed = end;
    }

    fn committed(&self) -> usize {
        self.committed
    }

    /// A part alone freezes into nothing: it is dropped, and the slot is frozen whole by the
    /// joiner once every part is.
    fn freeze(self: Box<Self>) -> Bytes {
        Bytes::new()
    }
}

struct Joiner(Arc<Whole>);

impl JoinStorage for Joiner {
    fn join(self: Box<Self>) -> Result<Bytes, Box<dyn JoinStorage>> {
        match Arc::try_unwrap(self.0) {
            // Every part is gone: the slot is ours alone again.
            Ok(Whole(buffer)) => Ok(buffer.freeze()),
            Err(whole) => Err(Box::new(Self(whole))),
        }
    }
}
