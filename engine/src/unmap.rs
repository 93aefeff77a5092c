//! Unmapping large mappings off the calling thread.
//!
//! Tearing down 256 MiB of 4 KiB pages — and freeing them, when the mapping is the memory's
//! last reference — takes 50–60 ms on the test machines. On a driver thread that stalls every
//! connection it carries: 4 KiB asks over shared memory waited 23 and 34 ms while the
//! shared-memory thread unmapped a retired 256 MiB segment. Mappings of at least
//! [`ELSEWHERE_FROM`] go to one thread per process that unmaps them in turn; smaller ones, and
//! any when that thread cannot be had, are unmapped at once. The range stays mapped (so its
//! addresses are not reused) until that thread unmaps it.
//!
//! What this does not do: it does not wait for the memory to be gone. A byte quota released
//! when its owner drops may be charged again before the kernel has the pages back, by at most
//! [`MAX_WAITING`] bytes: beyond that a range is unmapped at once, on the caller's thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Mutex, TryLockError};

/// Mappings at least this large are unmapped on the unmapping thread.
pub(crate) const ELSEWHERE_FROM: usize = 16 << 20;
/// Bytes given to the unmapping thread and not unmapped yet, at most.
const MAX_WAITING: usize = 1 << 30;

/// Bytes given to the unmapping thread and not unmapped yet.
static WAITING: AtomicUsize = AtomicUsize::new(0);

static UNMAPPER: Mutex<Option<Unmapper>> = Mutex::new(None);

/// Unmaps `len` bytes from `ptr`: at once, or on the unmapping thread if large.
///
/// # Safety
///
/// `ptr..ptr + len` is a whole mapping (or page-aligned part of one) the caller owns and gives
/// up: nothing refers to it any more, and nobody unmaps it again.
pub(crate) unsafe fn unmap(ptr: *mut u8, len: usize) {
    if len == 0 {
        return;
    }
    if len >= ELSEWHERE_FROM && give(ptr, len) {
        return;
    }
    // SAFETY: as the caller promised.
    unsafe { libc::munmap(ptr.cast(), len) };
}

/// Hands the range to the unmapping thread; `false` if it stays with the caller (too much
/// waits already, or no thread).
fn give(ptr: *mut u8, len: usize) -> bool {
    if WAITING.fetch_add(len, Ordering::AcqRel) + len <= MAX_WAITING
        && let Some(queue) = unmapper()
        && queue
            .send(Given {
                at: ptr as usize,
                len,
            })
            .is_ok()
    {
        return true;
    }
    WAITING.fetch_sub(len, Ordering::AcqRel);
    false
}

/// A range given up (an address, not a pointer: it crosses to the unmapping thread).
struct Given {
    at: usize,
    len: usize,
}

struct Unmapper {
    /// The process it runs in (a forked child has the parent's value but not its thread).
    pid: u32,
    queue: Sender<Given>,
}

/// The queue of this process's unmapping thread, started on first use; `None` if it cannot be
/// started, or if another thread is starting it right now (never waited for).
fn unmapper() -> Option<Sender<Given>> {
    let pid = std::process::id();
    let mut slot = match UNMAPPER.try_lock() {
        Ok(slot) => slot,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => return None,
    };
    if let Some(unmapper) = slot.as_ref().filter(|u| u.pid == pid) {
        return Some(unmapper.queue.clone());
    }
    // A forked child's copy of the parent's: its thread did not come along, and dropping the
    // queue's last sender could wait on a lock that thread held at the fork. Forgotten.
    if let Some(stale) = slot.take() {
        std::mem::forget(stale);
    }
    let (queue, given) = channel::<Given>();
    std::thread::Builder::new()
        .name("tensorwire-unmap".into())
        .spawn(move || {
            for Given { at, len } in given {
                // SAFETY: each range was given up by its owner through `unmap`, whose caller
                // promised nothing refers to it any more; it is unmapped exactly once, here.
                unsafe { libc::munmap(at as *mut libc::c_void, len) };
                WAITING.fetch_sub(len, Ordering::AcqRel);
            }
        })
        .ok()?;
    *slot = Some(Unmapper {
        pid,
        queue: queue.clone(),
    });
    Some(queue)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// Whether `/proc/self/maps` lists exactly the mapping `at..at + len` (another test's new
    /// mapping at the same address would rarely have the same length too).
    fn mapped(at: usize, len: usize) -> bool {
        let range = format!("{at:x}-{:x} ", at + len);
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .any(|line| line.starts_with(&range))
    }

    fn unmapping_thread_runs() -> bool {
        std::fs::read_dir("/proc/self/task").unwrap().any(|task| {
            task.ok()
                .and_then(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                // comm is cut at 15 bytes
                .is_some_and(|name| name.trim() == "tensorwire-unma")
        })
    }

    /// A new mapping of its own line in `/proc/self/maps` (shared anonymous mappings are
    /// never merged with their neighbours).
    fn anonymous(len: usize) -> *mut u8 {
        // SAFETY: a new anonymous mapping touches no existing memory.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        ptr.cast()
    }

    #[test]
    fn a_small_mapping_is_gone_at_once_and_a_large_one_soon_on_the_unmapping_thread() {
        let small_len = (1 << 20) + 4096;
        let small = anonymous(small_len);
        assert!(mapped(small as usize, small_len));
        // SAFETY: this test owns the mapping and gives it up.
        unsafe { unmap(small, small_len) };
        assert!(
            !mapped(small as usize, small_len),
            "unmapped before unmap returned"
        );

        let large_len = ELSEWHERE_FROM + 4096;
        let large = anonymous(large_len);
        assert!(mapped(large as usize, large_len));
        // SAFETY: as above.
        unsafe { unmap(large, large_len) };
        let until = Instant::now() + Duration::from_secs(10);
        while mapped(large as usize, large_len) || !unmapping_thread_runs() {
            assert!(
                Instant::now() < until,
                "the large mapping was never unmapped, or not on the unmapping thread"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
