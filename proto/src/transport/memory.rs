//! Where received payload goes: the memory a node lends its transports.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use bytes::Bytes;

use crate::body::ReceiveBuffer;
use crate::transport::Error;
use crate::transport::split::{SplitBuffer, heap_split};

/// The final memory received metadata and buffers are written into, and the budget that bounds
/// how much of it frames still arriving may hold.
///
/// A node implements it with its receive pool and lends it to every transport, so a payload
/// lands in pool memory whichever transport carried it. Sessions charge the budget before they
/// expose memory to a read, a bounded window ahead of the bytes that arrived, and release it
/// when the frame is complete or fails.
pub trait ReceiveMemory: Send + Sync + 'static {
    /// Memory for one section of exactly `len` bytes (`len > 0`).
    ///
    /// # Errors
    ///
    /// [`Error::Memory`] if it cannot be had.
    fn allocate(&self, len: usize) -> Result<RecvBuffer, Error>;

    /// Charges `bytes` to the budget of frames still arriving; `false` (and nothing charged) if
    /// the budget has no room.
    fn charge(&self, bytes: u64) -> bool;

    /// Gives back bytes charged earlier.
    fn release(&self, bytes: u64);

    /// The budget in bytes, for error texts.
    fn budget(&self) -> u64;

    /// Memory for one section of `len` bytes cut at `ranges` (consecutive, covering `0..len`),
    /// whose parts are filled independently and joined without a copy: the stripes of a
    /// striped request ([`crate::stripe`]). The default cuts one heap allocation; a receive
    /// pool cuts one of its slots.
    ///
    /// # Errors
    ///
    /// [`Error::Memory`] if it cannot be had; [`Error::Misuse`] if `ranges` do not cut
    /// `0..len`.
    fn allocate_split(&self, len: usize, ranges: &[Range<usize>]) -> Result<SplitBuffer, Error> {
        heap_split(len, ranges)
    }
}

/// One section of receive memory: a pool slot, a heap vector, or anything else that can become
/// [`Bytes`] without a copy.
pub struct RecvBuffer {
    storage: Box<dyn RecvStorage>,
}

/// What a [`RecvBuffer`] is made of; implement it for a pool's slot type.
pub trait RecvStorage: Send + 'static {
    /// The whole section.
    fn as_mut_slice(&mut self) -> &mut [u8];

    /// See [`ReceiveBuffer::prepare`]; the default does nothing.
    fn prepare(&mut self, range: Range<usize>) {
        let _ = range;
    }

    /// See [`ReceiveBuffer::committed`]; the default claims nothing.
    fn committed(&self) -> usize {
        0
    }

    /// Turns the filled memory into [`Bytes`] without copying.
    fn freeze(self: Box<Self>) -> Bytes;
}

impl RecvStorage for Vec<u8> {
    fn as_mut_slice(&mut self) -> &mut [u8] {
        self
    }

    fn freeze(self: Box<Self>) -> Bytes {
        Bytes::from(*self)
    }
}

impl RecvBuffer {
    /// Wraps any storage.
    pub fn new(storage: impl RecvStorage) -> Self {
        Self {
            storage: Box::new(storage),
        }
    }
}

impl fmt::Debug for RecvBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvBuffer").finish_non_exhaustive()
    }
}

impl AsMut<[u8]> for RecvBuffer {
    fn as_mut(&mut self) -> &mut [u8] {
        self.storage.as_mut_slice()
    }
}

impl ReceiveBuffer for RecvBuffer {
    fn freeze(self) -> Bytes {
        self.storage.freeze()
    }

    fn prepare(&mut self, range: Range<usize>) {
        self.storage.prepare(range);
    }

    fn committed(&self) -> usize {
        self.storage.committed()
    }
}

/// Receive memory from the heap with a budget: for tests and for transports used without a
/// node's receive pool.
#[derive(Debug)]
pub struct HeapMemory {
    budget: u64,
    charged: AtomicU64,
}

impl HeapMemory {
    /// Heap memory whose frames still arriving may hold at most `budget` bytes.
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            charged: AtomicU64::new(0),
        }
    }

    /// Bytes charged now.
    pub fn charged(&self) -> u64 {
        self.charged.load(Relaxed)
    }
}

impl ReceiveMemory for HeapMemory {
    fn allocate(&self, len: usize) -> Result<RecvBuffer, Error> {
        let mut memory = Vec::new();
        memory
            .try_reserve_exact(len)
            .map_err(|e| Error::Memory(format!("cannot allocate {len} bytes: {e}")))?;
        memory.resize(len, 0);
        Ok(RecvBuffer::new(memory))
    }

    fn charge(&self, bytes: u64) -> bool {
        self.charged
            .fetch_update(Relaxed, Relaxed, |now| {
                now.checked_add(bytes).filter(|&n| n <= self.budget)
            })
            .is_ok()
    }

    fn release(&self, bytes: u64) {
        self.charged.fetch_sub(bytes, Relaxed);
    }

    fn budget(&self) -> u64 {
        self.budget
    }
}
