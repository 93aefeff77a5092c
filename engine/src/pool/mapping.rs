//! Anonymous memory mappings for receive-pool slots: the only unsafe code of the pool.

use std::ptr::NonNull;

use crate::sys::MADV_POPULATE_WRITE;

const HUGE_PAGE: usize = 2 << 20;
pub(super) const PAGE: usize = 4096;

/// A private anonymous read-write mapping, owned exclusively. Nothing is committed when it is
/// made: pages are faulted in by [`Mapping::populate`] (a bounded window ahead of arriving
/// data) or by the writes themselves.
#[derive(Debug)]
pub(super) struct Mapping {
    /// Start of the mapping; valid for `len` bytes until drop.
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes from the start that have been populated (or written) for sure.
    populated: usize,
}

// SAFETY: the mapping is private memory owned by this value alone; moving it between threads
// is like moving a `Vec<u8>`.
unsafe impl Send for Mapping {}
// SAFETY: shared access only hands out `&[u8]`, like `Vec<u8>`.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes (a multiple of the page size); from 2 MiB, with `huge_pages`
    /// 2 MiB-aligned with `MADV_HUGEPAGE`, without it `MADV_NOHUGEPAGE` (4 KiB pages whatever
    /// the kernel's THP setting).
    pub(super) fn new(len: usize, huge_pages: bool) -> std::io::Result<Self> {
        let huge = huge_pages && len >= HUGE_PAGE;
        let reserve = if huge { len + HUGE_PAGE } else { len };
        // SAFETY: an anonymous private mapping with no address hint touches no existing memory.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = base.cast::<u8>();
        let start = if huge {
            let misalign = (base as usize) % HUGE_PAGE;
            let head = if misalign == 0 {
                0
            } else {
                HUGE_PAGE - misalign
            };
            let tail = reserve - head - len;
            // SAFETY: both trimmed ranges lie inside the mapping just created and are not used.
            unsafe {
                if head > 0 {
                    libc::munmap(base.cast(), head);
                }
                if tail > 0 {
                    libc::munmap(base.add(head + len).cast(), tail);
                }
                base.add(head)
            }
        } else {
            base
        };
        let ptr = NonNull::new(start).ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        if len >= HUGE_PAGE {
            // Asked for or refused either way, so a kernel whose THP setting is `always` does not
            // choose for the pool.
            let advice = if huge {
                libc::MADV_HUGEPAGE
            } else {
                libc::MADV_NOHUGEPAGE
            };
            // SAFETY: advice on a range this value owns; it changes no contents.
            unsafe { libc::madvise(ptr.as_ptr().cast(), len, advice) };
        }
        Ok(Self {
            ptr,
            len,
            populated: 0,
        })
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Bytes from the start whose pages exist for sure.
    pub(super) fn populated(&self) -> usize {
        self.populated
    }

    /// Whether every page has been populated (a slot that was filled once).
    pub(super) fn is_warm(&self) -> bool {
        self.populated >= self.len
    }

    /// Faults in the pages of `..end` that may not be yet, so the kernel's copy into them does
    /// not stop at every first touch.
    pub(super) fn populate(&mut self, end: usize) {
        let end = end.min(self.len);
        if end <= self.populated {
            return;
        }
        let from = self.populated / PAGE * PAGE;
        let to = end.div_ceil(PAGE).saturating_mul(PAGE).min(self.len);
        // SAFETY: `from..to` lies inside the mapping this value owns; populating writes no data
        // (fresh pages are zero), and on older kernels one byte per page is overwritten with
        // zero, which is what a fresh page already holds.
        unsafe {
            let start = self.ptr.as_ptr().add(from);
            if libc::madvise(start.cast(), to - from, MADV_POPULATE_WRITE) != 0 {
                for offset in (0..to - from).step_by(PAGE) {
                    if self.populated <= from + offset {
                        start.add(offset).write_volatile(0);
                    }
                }
            }
        }
        self.populated = to;
    }

    /// Records that `..end` has been written (the pages exist now).
    pub(super) fn mark_written(&mut self, end: usize) {
        self.populated = self.populated.max(end.min(self.len));
    }

    pub(super) fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is live, readable and `len` bytes long while `self` exists.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub(super) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// Faults in the pages of `base + from .. base + to` (rounded out to pages), as
/// [`Mapping::populate`] does for a slot's prefix, for a part of a slot cut into stripes.
///
/// # Safety
///
/// The range must lie inside a live mapping, be written by nobody else, and hold no data yet
/// (on kernels without `MADV_POPULATE_WRITE` one byte per page is overwritten with zero); page
/// rounding stays within the caller's part when parts start on page boundaries, and the
/// first page of `from` holds no data when `from` is where the part's data ends.
pub(super) unsafe fn populate_range(base: *mut u8, from: usize, to: usize) {
    if to <= from {
        return;
    }
    let from_page = from.div_ceil(PAGE) * PAGE;
    let to_page = to.div_ceil(PAGE) * PAGE;
    if to_page <= from_page {
        return; // inside a page populated already
    }
    // SAFETY: the caller guarantees the range; advice changes no contents (fresh pages are
    // zero), and the fallback writes zeros into bytes that hold no data yet.
    unsafe {
        let start = base.add(from_page);
        if libc::madvise(start.cast(), to_page - from_page, MADV_POPULATE_WRITE) != 0 {
            for offset in (0..to_page - from_page).step_by(PAGE) {
                start.add(offset).write_volatile(0);
            }
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the range is exactly the mapping this value owns; nothing refers to it now,
        // and it is given up once, here (a large one on the unmapping thread).
        unsafe { crate::unmap::unmap(self.ptr.as_ptr(), self.len) };
    }
}
