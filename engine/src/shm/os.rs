//! The system calls of shared memory: memfds (create, reserve, seal), file mappings, and who
//! this process is (boot, user namespace, user, random tickets). The Unix sockets that pass
//! descriptors are in `socket.rs`.
//!
//! With `socket.rs` and the slot writes of `segments.rs`, the only unsafe code of the shm
//! module; every block says why it is sound.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

/// `MFD_NOEXEC_SEAL` (Linux 6.3): the memfd can never be executable.
const MFD_NOEXEC_SEAL: libc::c_uint = 0x0008;

/// The seals every region carries: its size can never change under a reader.
pub(crate) const SEALS_SIZE: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
/// The seals a peer's file must carry before it is mapped: its size cannot change, and only
/// mappings its owner made before sealing can write it (no hole can be punched into it later).
pub(crate) const SEALS_LENT: libc::c_int = SEALS_SIZE | SEAL_FUTURE_WRITE;

/// `F_SEAL_FUTURE_WRITE` (Linux 5.1): no new writable mapping and no `write(2)`, while mappings
/// made before stay writable (the owner's).
pub(crate) const SEAL_FUTURE_WRITE: libc::c_int = 0x0010;

/// What a peer's memfd was found to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CheckedFile {
    /// Its size.
    pub(crate) size: u64,
}

/// Checks a memfd a peer sent before it is mapped: on tmpfs, sealed against shrinking and
/// growing (a truncation would fault a reader), at least `len` bytes, and allocated whole (a
/// sparse file would make the reader commit memory the sender never paid for).
///
/// # Errors
///
/// Why the file is refused.
pub(crate) fn check_segment(fd: RawFd, len: u64) -> Result<CheckedFile, String> {
    let seals = seals(fd).unwrap_or(0);
    if seals & SEALS_LENT != SEALS_LENT {
        return Err("it lacks the SHRINK | GROW | FUTURE_WRITE seals".into());
    }
    let stat = fstat(fd).map_err(|e| format!("fstat: {e}"))?;
    let size = u64::try_from(stat.st_size).map_err(|_| "a negative size".to_owned())?;
    if size < len || len == 0 {
        return Err(format!("it has {size} bytes but {len} were announced"));
    }
    if fs_type(fd).map_err(|e| format!("fstatfs: {e}"))? != TMPFS_MAGIC {
        return Err("it is not a memfd on tmpfs".into());
    }
    // The whole file allocated, not only as many bytes as announced somewhere in it: a file
    // twice as long with its second half allocated is as sparse where it is mapped. (SEEK_HOLE
    // cannot tell: tmpfs reports pages reserved by fallocate but never written as holes.)
    let allocated = u64::try_from(stat.st_blocks)
        .unwrap_or(0)
        .saturating_mul(512);
    if allocated < size {
        return Err(format!(
            "only {allocated} of its {size} bytes are allocated (a sparse segment)"
        ));
    }
    Ok(CheckedFile { size })
}

/// `TMPFS_MAGIC`: the file system of a memfd (not `MFD_HUGETLB`).
const TMPFS_MAGIC: libc::__fsword_t = 0x0102_1994;

fn fs_type(fd: RawFd) -> io::Result<libc::__fsword_t> {
    // SAFETY: statfs is plain old data; all-zero is valid.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes into `stat`, a live local of the right type.
    check(unsafe { libc::fstatfs(fd, &raw mut stat) })?;
    Ok(stat.f_type)
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain old data; all-zero is valid.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into `stat`, a live local of the right type.
    check(unsafe { libc::fstat(fd, &raw mut stat) })?;
    Ok(stat)
}

/// A shared-memory error for a failed system call.
pub(crate) fn os_error(op: &'static str, e: &io::Error) -> tensorwire_proto::shm::ShmError {
    tensorwire_proto::shm::ShmError::Os {
        op,
        reason: e.to_string(),
    }
}

fn check(res: libc::c_int) -> io::Result<libc::c_int> {
    if res < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(res)
    }
}

/// A new sealable memfd with `len` bytes reserved (`fallocate`: a full memory limit is an
/// error now, never a SIGBUS later) and its size sealed.
pub(crate) fn memfd(name: &str, len: u64) -> io::Result<OwnedFd> {
    let fd = memfd_unreserved(name, len)?;
    reserve(fd.as_raw_fd(), 0, len)?;
    Ok(fd)
}

/// Reserves `len` bytes of `fd` from `offset` (`fallocate`, within its size): a full memory
/// limit is an error now, never a SIGBUS when the pages are touched.
pub(crate) fn reserve(fd: RawFd, offset: u64, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let offset = libc::off_t::try_from(offset).map_err(|_| io::Error::other("offset too large"))?;
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::other("memfd size too large"))?;
    loop {
        // SAFETY: fallocate takes no pointers.
        match check(unsafe { libc::fallocate(fd, 0, offset, len) }) {
            // A signal came while the kernel zeroed pages (it undid this call's work): again.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            result => return result.map(drop),
        }
    }
}

/// A new sealable memfd of `len` bytes, its size sealed, none of it reserved yet ([`reserve`]
/// before the pages are touched).
pub(crate) fn memfd_unreserved(name: &str, len: u64) -> io::Result<OwnedFd> {
    let name = CString::new(name).map_err(|_| io::Error::other("memfd name has a NUL byte"))?;
    let base = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
    let fd = match check(unsafe { libc::memfd_create(name.as_ptr(), base | MFD_NOEXEC_SEAL) }) {
        Ok(fd) => fd,
        // Kernels before 6.3 do not know the flag.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            // SAFETY: as above.
            check(unsafe { libc::memfd_create(name.as_ptr(), base) })?
        }
        Err(e) => return Err(e),
    };
    // SAFETY: memfd_create just returned this descriptor; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::other("memfd size too large"))?;
    // SAFETY: ftruncate takes no pointers.
    check(unsafe { libc::ftruncate(fd.as_raw_fd(), len) })?;
    add_seals(fd.as_raw_fd(), SEALS_SIZE)?;
    Ok(fd)
}

/// Adds `seals` to a memfd.
pub(crate) fn add_seals(fd: RawFd, seals: libc::c_int) -> io::Result<()> {
    // SAFETY: fcntl(F_ADD_SEALS) takes an integer argument.
    check(unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) }).map(drop)
}

/// The seals a file carries (`EINVAL` for a file that cannot be sealed).
pub(crate) fn seals(fd: RawFd) -> io::Result<libc::c_int> {
    // SAFETY: fcntl(F_GET_SEALS) takes no argument.
    check(unsafe { libc::fcntl(fd, libc::F_GET_SEALS) })
}

/// A read-only descriptor of the same file (reopened through `/proc/self/fd`): what is sent
/// to peers, so their mappings cannot be writable by accident.
pub(crate) fn read_only(fd: RawFd) -> io::Result<OwnedFd> {
    let file = std::fs::File::open(format!("/proc/self/fd/{fd}"))?;
    Ok(OwnedFd::from(file))
}

/// A mapping of a file.
pub(crate) struct FileMap {
    ptr: NonNull<u8>,
    len: usize,
    /// Turned into a private copy-on-write mapping ([`FileMap::privatize`]).
    private: bool,
    /// The fork generation of the process that mapped it: in a child made by `fork()` since,
    /// the range is not mapped but reserved ([`super::not_inherited`]), and left so.
    generation: u64,
}

// SAFETY: the mapping is owned by this value alone; moving it between threads is like moving
// a `Vec<u8>`. Shared access hands out `&[u8]` and a raw pointer; whoever writes through the
// pointer (a segment's owner filling a slot it holds exclusively, a loan's window) says why
// nothing else reads those bytes meanwhile.
unsafe impl Send for FileMap {}
// SAFETY: as above.
unsafe impl Sync for FileMap {}

impl FileMap {
    /// A mapping of nothing.
    pub(crate) fn empty() -> Self {
        Self {
            ptr: NonNull::dangling(),
            len: 0,
            private: false,
            generation: crate::fork::generation(),
        }
    }

    /// Maps `len` bytes of `fd` from `offset` (page-aligned): shared and writable for the
    /// owner, shared and read-only for a holder. `populate` builds the page tables now (off
    /// the hot path).
    pub(crate) fn new(
        fd: RawFd,
        offset: usize,
        len: usize,
        writable: bool,
        populate: bool,
    ) -> io::Result<Self> {
        if len == 0 {
            return Ok(Self::empty());
        }
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        let flags = libc::MAP_SHARED | if populate { libc::MAP_POPULATE } else { 0 };
        let offset =
            libc::off_t::try_from(offset).map_err(|_| io::Error::other("offset too large"))?;
        // SAFETY: a new mapping with no address hint touches no existing memory; the kernel
        // checks `fd`, `offset`, `len` and the protection against the file.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, offset) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self::not_inherited(ptr, len))
    }

    /// A second mapping of `len` bytes of the same pages from `offset` (page-aligned), with
    /// the same protection: a writable view of a range of a file that no longer accepts new
    /// writable mappings (`F_SEAL_FUTURE_WRITE`), for its owner.
    pub(crate) fn alias(&self, offset: usize, len: usize) -> io::Result<Self> {
        let end = offset.checked_add(len).filter(|&end| end <= self.len);
        if end.is_none() || offset % 4096 != 0 || len == 0 || self.private {
            return Err(io::Error::other("an alias outside a shared mapping"));
        }
        // SAFETY: with `old_size` 0, mremap creates a new mapping of the same pages of a shared
        // mapping and leaves the old one in place; the source range lies inside this mapping,
        // which is live.
        let ptr = unsafe {
            libc::mremap(
                self.ptr.as_ptr().add(offset).cast(),
                0,
                len,
                libc::MREMAP_MAYMOVE,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| io::Error::other("mremap returned null"))?;
        Ok(Self::not_inherited(ptr, len))
    }

    /// A mapping just made, kept from any child made by `fork()` (a child must not keep a
    /// peer's slot mapped after this process lets it go, nor write this process's segments):
    /// marked `MADV_DONTFORK` and listed, so a child reserves its range instead.
    fn not_inherited(ptr: NonNull<u8>, len: usize) -> Self {
        dont_fork(ptr, len);
        super::not_inherited::add(ptr.as_ptr(), len);
        Self {
            ptr,
            len,
            private: false,
            generation: crate::fork::generation(),
        }
    }

    /// Maps every page of a writable mapping in one call (`MADV_POPULATE_WRITE`, Linux 5.14),
    /// rather than one fault per 4 KiB page as it is filled: a loan of a reused slot is then
    /// written at memory speed. Older kernels refuse the advice and pages fault in as before.
    pub(crate) fn populate(&self) {
        self.populate_range(0, self.len);
    }

    /// [`FileMap::populate`] for `len` bytes from `offset` (page-aligned; clamped to the
    /// mapping).
    pub(crate) fn populate_range(&self, offset: usize, len: usize) {
        let len = len.min(self.len.saturating_sub(offset));
        if len == 0 || self.private || offset % 4096 != 0 {
            return;
        }
        // SAFETY: advice on a range inside this mapping (`offset + len <= self.len`);
        // populating for writing changes no contents (the pages are the file's, or
        // zero-filled if it never had them).
        unsafe {
            libc::madvise(
                self.ptr.as_ptr().add(offset).cast(),
                len,
                crate::sys::MADV_POPULATE_WRITE,
            )
        };
    }

    /// Replaces the mapping, in place, with a private copy-on-write mapping of the same file
    /// range: every pointer into it still reads the same bytes, but a write through one now
    /// lands in a page of this process only and never reaches the file (or its other readers).
    /// Idempotent.
    pub(crate) fn privatize(&mut self, fd: RawFd, offset: usize) -> io::Result<()> {
        if self.len == 0 || self.private {
            return Ok(());
        }
        let offset =
            libc::off_t::try_from(offset).map_err(|_| io::Error::other("offset too large"))?;
        // SAFETY: MAP_FIXED replaces exactly the range this value mapped (and owns) with a
        // new mapping of the same length; the pages keep their contents (the same file
        // range), so no pointer into the range sees different bytes, only that writes now
        // copy instead of reaching the file. On failure the old mapping is left as it was.
        let ptr = unsafe {
            libc::mmap(
                self.ptr.as_ptr().cast(),
                self.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_FIXED,
                fd,
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // The new mapping does not carry the old one's advice.
        dont_fork(self.ptr, self.len);
        self.private = true;
        Ok(())
    }

    /// Where it starts.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the mapping is live and readable for `len` bytes while `self` exists.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// Marks `len` bytes from `ptr` (a mapping of this process's) as not inherited by a child.
fn dont_fork(ptr: NonNull<u8>, len: usize) {
    // SAFETY: advice on a range this process mapped; it changes no contents.
    unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_DONTFORK) };
}

impl Drop for FileMap {
    fn drop(&mut self) {
        if !super::not_inherited::made_here(self.generation) {
            // Inherited from a parent: nothing is mapped here but the child's reservation,
            // which stays (a stale pointer into it faults rather than reads new memory).
            return;
        }
        if self.len > 0 {
            super::not_inherited::remove(self.ptr.as_ptr());
            // SAFETY: exactly the range this value mapped; no reference to it outlives `self`,
            // and it is given up once, here (a large one on the unmapping thread).
            unsafe { crate::unmap::unmap(self.ptr.as_ptr(), self.len) };
        }
    }
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`).
pub(crate) fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// The user namespace's inode number.
pub(crate) fn user_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/user").map_or(0, |m| m.ino())
}

/// This process's user id.
pub(crate) fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// `N` random bytes from the kernel (`getrandom`).
pub(crate) fn random<const N: usize>() -> io::Result<[u8; N]> {
    let mut out = [0u8; N];
    let mut filled = 0;
    while filled < N {
        // SAFETY: writes at most `N - filled` bytes into the live local array from `filled`.
        let res = unsafe { libc::getrandom(out[filled..].as_mut_ptr().cast(), N - filled, 0) };
        if res < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += usize::try_from(res).unwrap_or(0);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEN: u64 = 1 << 20;

    #[test]
    fn a_segment_allocated_beyond_its_announced_length_but_not_within_it_is_refused() {
        // Twice as long, its second half allocated: as many blocks as announced, all of them
        // past the mapped range.
        let fd = memfd_unreserved("sparse-head", 2 * LEN).unwrap();
        reserve(fd.as_raw_fd(), LEN, LEN).unwrap();
        add_seals(fd.as_raw_fd(), SEAL_FUTURE_WRITE).unwrap();
        let refused = check_segment(fd.as_raw_fd(), LEN).unwrap_err();
        assert!(refused.contains("a sparse segment"), "{refused}");

        let whole = memfd("whole", LEN).unwrap();
        add_seals(whole.as_raw_fd(), SEAL_FUTURE_WRITE).unwrap();
        assert_eq!(
            check_segment(whole.as_raw_fd(), LEN),
            Ok(CheckedFile { size: LEN })
        );
    }
}
