//! Shared-memory mappings and `fork()`. Every mapping of a segment or queue is marked
//! `MADV_DONTFORK`: a child must not keep a peer's slot mapped after this process lets it go,
//! nor write into this process's own segments. But a child inherits the *objects* that point
//! into those ranges (a Python view of a received buffer, a loan's window), and the ranges are
//! free address space there: the child's next `mmap` may land on one, and a stale pointer
//! would then read (or write) unrelated memory, and dropping the object would unmap it.
//!
//! So every such range is listed here, and in the child (a `pthread_atfork` handler) each one
//! is reserved at once with an inaccessible mapping: a stale pointer faults instead of aliasing
//! anything, and nothing else can be placed there. A mapping made before the fork is never
//! unmapped in the child ([`made_here`]): its reservation stays for the child's life.
//! [`inherited`] tells whether an address lies in such a reserved range, so a binding can
//! refuse to hand it out.
//!
//! What this does not do: it does not give the child the bytes (they are not its to hold), and
//! it does not stop a child from touching a pointer it kept: that faults.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::Once;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::fork;

/// Registers `len` bytes from `at`, mapped `MADV_DONTFORK` by this process.
pub(crate) fn add(at: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    WATCHING.call_once(watch);
    let generation = fork::generation();
    RANGES.lock().push(Range {
        start: at as usize,
        len,
        generation,
    });
}

/// Forgets the range registered from `at` by this process (it is being unmapped).
pub(crate) fn remove(at: *const u8) {
    let generation = fork::generation();
    let mut ranges = RANGES.lock();
    if let Some(index) = ranges
        .iter()
        .position(|r| r.start == at as usize && r.generation == generation)
    {
        ranges.swap_remove(index);
    }
}

/// Whether something made in fork generation `generation` belongs to this process (not to a
/// parent this process was forked from).
pub(crate) fn made_here(generation: u64) -> bool {
    generation == fork::generation()
}

/// Whether `at` lies in a shared-memory range this process inherited from a parent, where
/// nothing is mapped but an inaccessible reservation (always `false` in a process never
/// forked from one that had shared memory mapped).
pub fn inherited(at: *const u8) -> bool {
    if RESERVED.load(Ordering::Acquire) == 0 {
        return false;
    }
    let generation = fork::generation();
    let at = at as usize;
    RANGES
        .lock()
        .iter()
        .any(|r| r.generation != generation && at >= r.start && at - r.start < r.len)
}

/// One mapping: where, how long, and the fork generation of the process that made it.
#[derive(Clone, Copy)]
struct Range {
    start: usize,
    len: usize,
    generation: u64,
}

static WATCHING: Once = Once::new();

/// How many ranges the last fork reserved in this process (0 in a process not forked from one
/// that had shared memory mapped): [`inherited`] looks no further when it is 0.
static RESERVED: AtomicUsize = AtomicUsize::new(0);

/// Installs the fork handlers (once per program).
fn watch() {
    // Fork generations are counted too (registered first, its child handler runs first).
    fork::watch();
    // SAFETY: the three handlers are `extern "C"` functions without arguments. `prepare`
    // takes the ranges' lock in the forking thread, `in_parent` gives it back, and `in_child`
    // (in the child, where only the forking thread exists and holds the lock) only makes
    // `mmap` calls over the listed ranges and gives the lock back: no allocation, no other
    // lock.
    let res = unsafe { libc::pthread_atfork(Some(prepare), Some(in_parent), Some(in_child)) };
    if res != 0 {
        tracing::error!(
            error = %std::io::Error::from_raw_os_error(res),
            "pthread_atfork failed: a child made by fork() may reuse the addresses of shared \
             memory its inherited objects point to"
        );
    }
}

extern "C" fn prepare() {
    RANGES.acquire();
}

extern "C" fn in_parent() {
    RANGES.release();
}

extern "C" fn in_child() {
    // SAFETY: the forking thread holds the lock (taken in `prepare`) and is the only thread;
    // the list is read, not changed.
    let ranges = unsafe { &*RANGES.ranges.get() };
    for range in ranges {
        // SAFETY: the range was a mapping of the parent marked MADV_DONTFORK (or one this
        // child's parent had reserved so), so nothing of the child's is there; MAP_FIXED over
        // it places an inaccessible private mapping of exactly that range (nothing committed:
        // PROT_NONE, MAP_NORESERVE).
        unsafe {
            libc::mmap(
                range.start as *mut libc::c_void,
                range.len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            );
        }
    }
    RESERVED.store(ranges.len(), Ordering::Release);
    RANGES.release();
}

/// The ranges, behind a pthread mutex: the fork handlers hold it across the fork, which a
/// `std` lock cannot be made to do.
struct Ranges {
    lock: UnsafeCell<libc::pthread_mutex_t>,
    ranges: UnsafeCell<Vec<Range>>,
}

// SAFETY: `ranges` is only touched with `lock` held (or, in `in_child`, by the only thread,
// which holds it); the mutex itself is made to be shared between threads.
unsafe impl Sync for Ranges {}

static RANGES: Ranges = Ranges {
    lock: UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER),
    ranges: UnsafeCell::new(Vec::new()),
};

impl Ranges {
    fn acquire(&self) {
        // SAFETY: a statically initialized mutex that is never moved or destroyed.
        unsafe { libc::pthread_mutex_lock(self.lock.get()) };
    }

    fn release(&self) {
        // SAFETY: as in `acquire`; only the thread that holds it calls this.
        unsafe { libc::pthread_mutex_unlock(self.lock.get()) };
    }

    fn lock(&'static self) -> Locked {
        self.acquire();
        Locked(self)
    }
}

/// The ranges, locked.
struct Locked(&'static Ranges);

impl Deref for Locked {
    type Target = Vec<Range>;

    fn deref(&self) -> &Vec<Range> {
        // SAFETY: the lock is held for this value's life.
        unsafe { &*self.0.ranges.get() }
    }
}

impl DerefMut for Locked {
    fn deref_mut(&mut self) -> &mut Vec<Range> {
        // SAFETY: the lock is held for this value's life, and this is the only reference.
        unsafe { &mut *self.0.ranges.get() }
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        self.0.release();
    }
}
