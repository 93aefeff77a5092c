//! Committing a new segment's memory before its first slot is filled: every page reserved
//! (`fallocate`) and mapped for writing (`MADV_POPULATE_WRITE`), a large segment in chunks on
//! several threads at once.
//!
//! Shared memory gets 4 KiB pages here (no huge pages for shmem by default), and each costs
//! the kernel about a microsecond to allocate and zero and another to map: a 256 MiB segment
//! took 160–190 ms on one thread (`fallocate` + `MAP_POPULATE`), most of a message's first
//! send. Chunks on four threads took 74–79 ms for the same work on the 2-vCPU test machine.
//! The kernel reserves one file's chunks one at a time (`strace -T`: the four `fallocate`s of
//! a segment end 16, 47, 63 and 90 ms in), so the gain is the mapping, which runs on every
//! thread at once and alongside the next chunk's reservation.

use std::io;
use std::os::fd::RawFd;

use tensorwire_proto::len_u64;

use crate::shm::os::{self, FileMap};

/// A segment at least this large is committed on several threads.
const PARALLEL_FROM: usize = 32 << 20;
/// Each thread commits at least this much.
const MIN_CHUNK: usize = 16 << 20;
/// Threads at most (the measured gain stops growing at about this many on two CPUs).
const MAX_THREADS: usize = 4;

/// Reserves and maps every page of `map`, the whole of `fd`'s `len` bytes.
///
/// # Errors
///
/// The first `fallocate` error in chunk order (the memory limit is full): the segment must not
/// be used. A kernel without `MADV_POPULATE_WRITE` (before 5.14) leaves pages to fault in as
/// they are written.
pub(super) fn commit(fd: RawFd, map: &FileMap, len: usize) -> io::Result<()> {
    let chunks = chunks(len);
    let Some((&(offset, first), rest)) = chunks.split_first() else {
        return Ok(());
    };
    std::thread::scope(|scope| {
        let helpers: Vec<_> = rest
            .iter()
            .map(|&(offset, len)| {
                let spawned = std::thread::Builder::new()
                    .name("tensorwire-commit".into())
                    .spawn_scoped(scope, move || commit_chunk(fd, map, offset, len));
                (spawned, offset, len)
            })
            .collect();
        let mut result = commit_chunk(fd, map, offset, first);
        for (spawned, offset, len) in helpers {
            let outcome = match spawned {
                Ok(handle) => handle
                    .join()
                    .unwrap_or_else(|_| Err(io::Error::other("a commit thread panicked"))),
                // No thread to be had: this one commits that chunk too.
                Err(_) => commit_chunk(fd, map, offset, len),
            };
            result = result.and(outcome);
        }
        result
    })
}

/// The chunks of a segment of `len` bytes: page-aligned `(offset, len)` ranges that cover it.
fn chunks(len: usize) -> Vec<(usize, usize)> {
    if len < PARALLEL_FROM {
        return vec![(0, len)];
    }
    let threads = (len / MIN_CHUNK).clamp(1, MAX_THREADS);
    let each = len.div_ceil(threads).next_multiple_of(4096);
    (0..len)
        .step_by(each)
        .map(|offset| (offset, each.min(len - offset)))
        .collect()
}

fn commit_chunk(fd: RawFd, map: &FileMap, offset: usize, len: usize) -> io::Result<()> {
    os::reserve(fd, len_u64(offset), len_u64(len))?;
    map.populate_range(offset, len);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    fn allocated_bytes(fd: RawFd) -> u64 {
        let file = std::fs::File::open(format!("/proc/self/fd/{fd}")).unwrap();
        std::os::unix::fs::MetadataExt::blocks(&file.metadata().unwrap()) * 512
    }

    #[test]
    fn chunks_cover_a_segment_exactly_page_aligned_and_only_large_ones_are_split() {
        for (len, expected) in [(64 << 10, 1), (31 << 20, 1), (40 << 20, 2), (256 << 20, 4)] {
            let chunks = chunks(len);
            assert_eq!(chunks.len(), expected, "{len} bytes");
            let mut at = 0;
            for &(offset, len) in &chunks {
                assert_eq!(offset, at);
                assert_eq!(offset % 4096, 0);
                at += len;
            }
            assert_eq!(at, len);
        }
    }

    #[test]
    fn a_large_segment_is_reserved_and_mapped_in_full() {
        let len = 48 << 20;
        let fd = os::memfd_unreserved("commit-test", len as u64).unwrap();
        let map = FileMap::new(fd.as_raw_fd(), 0, len, true, false).unwrap();
        assert_eq!(
            allocated_bytes(fd.as_raw_fd()),
            0,
            "nothing reserved before"
        );
        commit(fd.as_raw_fd(), &map, len).unwrap();
        assert_eq!(allocated_bytes(fd.as_raw_fd()), len as u64);
        let bytes = map.as_slice();
        assert!(bytes.iter().step_by(4096).all(|&b| b == 0));
    }

    #[test]
    fn a_reservation_that_fails_in_a_later_chunk_alone_fails_the_commit() {
        let len = 64 << 20;
        // The file is half as long as the mapping and sealed against growing: the first two
        // chunks are reserved, the last two are refused (EPERM).
        let fd = os::memfd_unreserved("commit-test", (len / 2) as u64).unwrap();
        let map = FileMap::new(fd.as_raw_fd(), 0, len, true, false).unwrap();
        let error = commit(fd.as_raw_fd(), &map, len).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EPERM), "{error}");
        assert_eq!(allocated_bytes(fd.as_raw_fd()), (len / 2) as u64);
    }

    #[test]
    fn a_reservation_that_fails_in_any_chunk_fails_the_commit() {
        let len = 48 << 20;
        let fd = os::memfd_unreserved("commit-test", len as u64).unwrap();
        let map = FileMap::new(fd.as_raw_fd(), 0, len, true, false).unwrap();
        // A read-only descriptor of the same file cannot reserve (EBADF) in any chunk.
        let read_only = os::read_only(fd.as_raw_fd()).unwrap();
        let error = commit(read_only.as_raw_fd(), &map, len).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EBADF), "{error}");
    }
}
