//! Large copies into shared memory: written around the CPU caches and split over this
//! process's CPUs.
//!
//! One thread copying far more than the caches hold with `memcpy` reads every destination line
//! into the cache before it overwrites it and is bound by how many lines one core keeps in
//! flight, not by the memory bus. A copy of at least [`SPLIT_FROM`] bytes in all is made with
//! non-temporal stores ([`stream_copy`]) and cut into parts of about the same size — one per
//! CPU, at most [`MAX_THREADS`], each at least [`PART_MIN`] — every part but the first copied
//! on a scoped thread while the calling thread copies the first (Ray's object store copies
//! large objects over several threads too). On the development VM (2 vCPUs, 32 MiB of L3):
//! 1.3–2.1× `memcpy` from 16 to 256 MiB (`benches/examples/split_copy.rs`). Smaller copies,
//! whose bytes may still be in the caches when the receiver reads them, are `memcpy`s on the
//! calling thread.
//!
//! The threads are scoped to the call: nothing outlives the borrowed memory, and the call
//! returns only once every part is copied and fenced.

use std::sync::{Mutex, OnceLock, PoisonError};

use super::stream_copy::stream_copy;

/// Copies of fewer bytes in all are made on the calling thread.
pub const SPLIT_FROM: usize = 16 << 20;
/// Each thread copies at least this much.
pub const PART_MIN: usize = 8 << 20;
/// Threads one copy uses at most (the calling one included).
pub const MAX_THREADS: usize = 4;

/// Copies every `source` into its `destination` (of the same length), splitting a large
/// copy over this process's CPUs.
///
/// # Panics
///
/// If a destination and its source differ in length (a caller's bug, as for
/// `copy_from_slice`).
pub fn copy_all(pairs: Vec<(&mut [u8], &[u8])>) {
    let total: usize = pairs.iter().map(|(_, source)| source.len()).sum();
    if total < SPLIT_FROM {
        for (destination, source) in pairs {
            destination.copy_from_slice(source);
        }
        return;
    }
    let parts: Vec<Mutex<Option<Group<'_>>>> = split(pairs, total, threads_for(total, cpus()))
        .into_iter()
        .map(|group| Mutex::new(Some(group)))
        .collect();
    let Some((first, others)) = parts.split_first() else {
        return;
    };
    std::thread::scope(|scope| {
        for part in others {
            let spawned = std::thread::Builder::new()
                .name("tw-copy".into())
                .spawn_scoped(scope, move || stream_part(part));
            if let Err(e) = spawned {
                // No thread to be had: the part is still there, copied here.
                tracing::debug!(error = %e, "a copy thread could not start; copying in line");
                stream_part(part);
            }
        }
        stream_part(first);
    });
}

/// Copies the part, unless another thread took it already.
fn stream_part(part: &Mutex<Option<Group<'_>>>) {
    let group = part.lock().unwrap_or_else(PoisonError::into_inner).take();
    for (destination, source) in group.into_iter().flatten() {
        stream_copy(destination, source);
    }
}

/// How many threads copy `total` bytes (at least [`SPLIT_FROM`]) on a machine with `cpus`
/// CPUs.
fn threads_for(total: usize, cpus: usize) -> usize {
    (total / PART_MIN).min(cpus).clamp(1, MAX_THREADS)
}

fn cpus() -> usize {
    static CPUS: OnceLock<usize> = OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

type Group<'a> = Vec<(&'a mut [u8], &'a [u8])>;

/// Cuts `pairs` (`total` bytes) into `threads` groups of about `total / threads` bytes each,
/// in order, cutting a pair where a group ends.
fn split(pairs: Group<'_>, total: usize, threads: usize) -> Vec<Group<'_>> {
    // Whole cache lines per part, so that two threads never write the same line.
    let share = total.div_ceil(threads.max(1)).next_multiple_of(64);
    let mut groups: Vec<Group<'_>> = Vec::with_capacity(threads);
    let mut group: Group<'_> = Vec::new();
    let mut room = share;
    for (mut destination, mut source) in pairs {
        assert_eq!(
            destination.len(),
            source.len(),
            "a copy into a destination of another length"
        );
        while !source.is_empty() {
            let take = source.len().min(room);
            let (head, rest) = std::mem::take(&mut destination).split_at_mut(take);
            let (from, left) = source.split_at(take);
            group.push((head, from));
            (destination, source) = (rest, left);
            room -= take;
            if room == 0 {
                groups.push(std::mem::take(&mut group));
                room = share;
            }
        }
    }
    if !group.is_empty() {
        groups.push(group);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_copies_use_every_cpu_up_to_four_with_parts_of_at_least_the_minimum() {
        assert_eq!(threads_for(SPLIT_FROM, 8), 2, "two parts of the minimum");
        assert_eq!(threads_for(SPLIT_FROM + PART_MIN - 1, 8), 2);
        assert_eq!(threads_for(256 << 20, 2), 2);
        assert_eq!(threads_for(256 << 20, 64), MAX_THREADS);
        assert_eq!(threads_for(256 << 20, 1), 1);
    }

    #[test]
    fn parts_cut_across_buffers_cover_every_byte_once_in_order() {
        let sources: Vec<Vec<u8>> = [100usize, 700, 0, 480]
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|b| (i * 16 + b).to_le_bytes()[0]).collect())
            .collect();
        let mut destinations: Vec<Vec<u8>> = sources.iter().map(|s| vec![0; s.len()]).collect();
        let pairs: Vec<(&mut [u8], &[u8])> = destinations
            .iter_mut()
            .zip(&sources)
            .map(|(d, s)| (d.as_mut_slice(), s.as_slice()))
            .collect();
        let groups = split(pairs, 1280, 3);
        let sizes: Vec<usize> = groups
            .iter()
            .map(|g| g.iter().map(|(_, s)| s.len()).sum())
            .collect();
        assert_eq!(sizes, vec![448, 448, 384], "whole cache lines per part");
        for group in groups {
            stream_part(&Mutex::new(Some(group)));
        }
        assert_eq!(destinations, sources);
    }

    #[test]
    fn a_large_copy_over_several_threads_equals_a_plain_one() {
        let sources: Vec<Vec<u8>> = [19 << 20, 1, 5 << 20]
            .iter()
            .enumerate()
            .map(|(i, &n): (usize, &usize)| (0..n).map(|b| (b * 7 + i).to_le_bytes()[0]).collect())
            .collect();
        let mut destinations: Vec<Vec<u8>> = sources.iter().map(|s| vec![0; s.len()]).collect();
        copy_all(
            destinations
                .iter_mut()
                .zip(&sources)
                .map(|(d, s)| (d.as_mut_slice(), s.as_slice()))
                .collect(),
        );
        assert_eq!(destinations, sources);
    }
}
