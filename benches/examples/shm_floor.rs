//! The floor of a same-host round trip on this machine, with no transport around it: two
//! threads on two CPUs pass a message back and forth through memory both can see. Each side
//! copies the message into its own slot and publishes a sequence number; the other spins on
//! that number and copies the message out into private memory (two copies each way, as the
//! shared-memory path makes for small messages, which go through its queues).
//!
//! `cargo run --release -p tensorwire-benches --example shm_floor [BYTES...]` (default 8 and
//! 4096) prints the round trip's p50/p90/p99. `docs/benchmarks.md` ("Shared memory") reads
//! tensorwire's shm round trip against it.

use std::cell::UnsafeCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const CAPACITY: usize = 64 << 10;
const ROUND_TRIPS: u64 = 200_000;

/// One direction's slot: written only by its sender, and only while the receiver is not
/// reading it (the sequence number hands it over).
#[repr(align(128))]
struct Slot {
    seq: AtomicU64,
    data: UnsafeCell<[u8; CAPACITY]>,
}

// SAFETY: `data` is written by one thread only before it publishes `seq` (Release) and read by
// the other only after it saw that `seq` (Acquire), and the writer writes again only after
// the reader answered, so no access overlaps.
unsafe impl Sync for Slot {}

impl Slot {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            seq: AtomicU64::new(0),
            data: UnsafeCell::new([0; CAPACITY]),
        })
    }

    fn put(&self, seq: u64, bytes: &[u8]) {
        // SAFETY: the other thread does not read `data` until it sees `seq` (see `Sync`).
        unsafe { (&mut *self.data.get())[..bytes.len()].copy_from_slice(bytes) };
        self.seq.store(seq, Ordering::Release);
    }

    fn take(&self, seq: u64, out: &mut [u8]) {
        while self.seq.load(Ordering::Acquire) != seq {
            std::hint::spin_loop();
        }
        // SAFETY: `seq` was published after `data` was written, and the writer waits for
        // our answer before it writes again (see `Sync`).
        out.copy_from_slice(unsafe { &(&*self.data.get())[..out.len()] });
    }
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|arg| arg.parse().ok())
        .collect();
    for size in if sizes.is_empty() {
        vec![8, 4096]
    } else {
        sizes
    } {
        let size = size.min(CAPACITY);
        let (there, back) = (Slot::new(), Slot::new());
        let (there2, back2) = (Arc::clone(&there), Arc::clone(&back));
        let echo = std::thread::spawn(move || {
            let mut private = vec![0u8; size];
            for seq in 1..=ROUND_TRIPS {
                there2.take(seq, &mut private);
                back2.put(seq, &private);
            }
        });
        let message = vec![7u8; size];
        let mut answer = vec![0u8; size];
        let mut nanos = Vec::new();
        for seq in 1..=ROUND_TRIPS {
            let start = Instant::now();
            there.put(seq, &message);
            back.take(seq, &mut answer);
            nanos.push(start.elapsed().as_nanos());
        }
        echo.join().expect("the echo thread panicked");
        nanos.sort_unstable();
        let at = |q: usize| nanos[nanos.len() * q / 100] as f64 / 1e3;
        println!(
            "{size} B: round trip p50 {:.2} µs, p90 {:.2} µs, p99 {:.2} µs",
            at(50),
            at(90),
            at(99)
        );
    }
}
