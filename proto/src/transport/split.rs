//! One section of receive memory cut into parts that are filled independently: the stripes of
//! a striped request arrive on different connections, possibly on different threads, each
//! straight into its part; the parts are joined into one [`Bytes`] without a copy once every
//! part is done.

use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::{Bytes, BytesMut};

use crate::transport::{Error, RecvBuffer, RecvStorage};

/// A section cut into parts.
pub struct SplitBuffer {
    /// One buffer per range asked for, in order; each is filled on its own and dropped when
    /// done.
    pub parts: Vec<RecvBuffer>,
    /// Gives the whole section once every part was dropped.
    pub joiner: Box<dyn JoinStorage>,
}

impl std::fmt::Debug for SplitBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SplitBuffer")
            .field("parts", &self.parts.len())
            .finish_non_exhaustive()
    }
}

/// The whole of a section cut into parts.
pub trait JoinStorage: Send + 'static {
    /// The whole section as [`Bytes`], once no part is left (each was dropped after it was
    /// filled); gives itself back while a part still exists.
    ///
    /// # Errors
    ///
    /// Itself, unchanged, while a part is alive.
    fn join(self: Box<Self>) -> Result<Bytes, Box<dyn JoinStorage>>;
}

/// Checks that `ranges` cut `0..len` into consecutive, non-empty parts.
///
/// # Errors
///
/// [`Error::Misuse`] otherwise.
pub fn check_ranges(len: usize, ranges: &[Range<usize>]) -> Result<(), Error> {
    let mut at = 0;
    for range in ranges {
        if range.start != at || range.end <= range.start {
            return Err(Error::Misuse(format!(
                "split ranges must cut 0..{len} into consecutive non-empty parts"
            )));
        }
        at = range.end;
    }
    if at != len {
        return Err(Error::Misuse(format!(
            "split ranges must cut 0..{len} into consecutive non-empty parts"
        )));
    }
    Ok(())
}

/// A section of heap memory cut at `ranges` (the default of
/// [`crate::transport::ReceiveMemory::allocate_split`]): the parts are slices of one
/// allocation, handed back when dropped and joined without a copy.
///
/// # Errors
///
/// [`Error::Memory`] if the memory cannot be had; [`Error::Misuse`] for ranges that do not cut
/// `0..len`.
pub fn heap_split(len: usize, ranges: &[Range<usize>]) -> Result<SplitBuffer, Error> {
    check_ranges(len, ranges)?;
    let mut memory = Vec::new();
    memory
        .try_reserve_exact(len)
        .map_err(|e| Error::Memory(format!("cannot allocate {len} bytes: {e}")))?;
    memory.resize(len, 0);
    let mut rest = BytesMut::from(Bytes::from(memory));
    let home = Arc::new(Mutex::new(vec![None; ranges.len()]));
    let parts = ranges
        .iter()
        .enumerate()
        .map(|(index, range)| {
            let bytes = rest.split_to(range.len());
            RecvBuffer::new(HeapPart {
                bytes: Some(bytes),
                home: Arc::clone(&home),
                index,
            })
        })
        .collect();
    Ok(SplitBuffer {
        parts,
        joiner: Box::new(HeapJoin { home }),
    })
}

/// Returned parts, by index.
type Home = Arc<Mutex<Vec<Option<BytesMut>>>>;

struct HeapPart {
    bytes: Option<BytesMut>,
    home: Home,
    index: usize,
}

impl RecvStorage for HeapPart {
    fn as_mut_slice(&mut self) -> &mut [u8] {
        self.bytes.as_deref_mut().unwrap_or_default()
    }

    /// A part is never frozen alone: this hands it back (as dropping does) and gives nothing.
    fn freeze(self: Box<Self>) -> Bytes {
        drop(self);
        Bytes::new()
    }
}

impl Drop for HeapPart {
    fn drop(&mut self) {
        if let Some(bytes) = self.bytes.take() {
            let mut home = self.home.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(slot) = home.get_mut(self.index) {
                *slot = Some(bytes);
            }
        }
    }
}

struct HeapJoin {
    home: Home,
}

impl JoinStorage for HeapJoin {
    fn join(self: Box<Self>) -> Result<Bytes, Box<dyn JoinStorage>> {
        let parts = {
            let mut home = self.home.lock().unwrap_or_else(PoisonError::into_inner);
            if home.iter().any(Option::is_none) {
                None
            } else {
                Some(home.drain(..).flatten().collect::<Vec<_>>())
            }
        };
        let Some(parts) = parts else {
            return Err(self);
        };
        let mut parts = parts.into_iter();
        let mut whole = parts.next().unwrap_or_default();
        for part in parts {
            // Consecutive slices of one allocation: joined without a copy.
            whole.unsplit(part);
        }
        Ok(whole.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_filled_on_their_own_join_into_the_whole_without_a_copy() {
        let split = heap_split(10, &[0..4, 4..10]).unwrap();
        let mut parts = split.parts;
        parts[0].as_mut().copy_from_slice(b"abcd");
        parts[1].as_mut().copy_from_slice(b"efghij");
        let first = parts[0].as_mut().as_ptr();
        let Err(joiner) = split.joiner.join() else {
            panic!("joined while parts are alive");
        };
        drop(parts);
        let Ok(whole) = joiner.join() else {
            panic!("every part was dropped, yet it did not join");
        };
        assert_eq!(&whole[..], b"abcdefghij");
        assert_eq!(whole.as_ptr(), first, "one allocation, not a copy");
    }

    #[test]
    fn the_whole_waits_for_every_part() {
        let split = heap_split(8, &[0..4, 4..8]).unwrap();
        let mut parts = split.parts;
        drop(parts.remove(0));
        assert!(split.joiner.join().is_err(), "one part is still alive");
    }

    #[test]
    fn ranges_that_do_not_cut_the_section_are_refused() {
        let gap = vec![0..4, 5..8];
        let short = vec![Range { start: 0, end: 4 }];
        let empty_part = vec![0..4, 4..4, 4..8];
        for ranges in [gap, short, empty_part, Vec::new()] {
            assert!(heap_split(8, &ranges).is_err(), "{ranges:?}");
        }
    }
}
