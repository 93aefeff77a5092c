//! What splitting a large copy over this machine's CPUs gains: the same copy into warm
//! memory, by one thread (`copy_from_slice`) and by `tensorwire_engine::shm::split_copy`
//! (what the shared-memory path uses to copy a message into a slot), alternated, medians of
//! 9.
//!
//! `cargo run --release -p tensorwire-benches --example split_copy [MiB...]` (default 16, 64
//! and 256) prints GB/s for both and their ratio. `docs/benchmarks.md` ("Copies split over
//! the CPUs") quotes it.

use std::time::Instant;

use tensorwire_engine::shm::split_copy::copy_all;

const RUNS: usize = 9;

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>().expect("sizes in MiB"))
        .collect();
    let sizes = if sizes.is_empty() {
        vec![16, 64, 256]
    } else {
        sizes
    };
    for mib in sizes {
        let len = mib << 20;
        let source: Vec<u8> = (0..len).map(|i| i.to_le_bytes()[0]).collect();
        let mut target = vec![0u8; len];
        target.copy_from_slice(&source); // both warm
        let (mut one, mut split) = (Vec::new(), Vec::new());
        for _ in 0..RUNS {
            let start = Instant::now();
            target.copy_from_slice(&source);
            one.push(start.elapsed().as_secs_f64());
            let start = Instant::now();
            copy_all(vec![(target.as_mut_slice(), source.as_slice())]);
            split.push(start.elapsed().as_secs_f64());
        }
        assert_eq!(target, source);
        let gbps = |times: &mut Vec<f64>| {
            times.sort_by(f64::total_cmp);
            len as f64 / times[RUNS / 2] / 1e9
        };
        let (one, split) = (gbps(&mut one), gbps(&mut split));
        println!(
            "{mib} MiB: one thread {one:.2} GB/s, split {split:.2} GB/s ({:.2}x)",
            split / one
        );
    }
}
