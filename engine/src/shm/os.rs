//! The system calls of shared memory: memfds (create, reserve, seal, punch), file mappings,
//! and `SOCK_SEQPACKET` Unix sockets in the abstract namespace that pass descriptors.
//!
//! The only unsafe code of the shm module; every block says why it is sound.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

/// `MFD_NOEXEC_SEAL` (Linux 6.3): the memfd can never be executable.
const MFD_NOEXEC_SEAL: libc::c_uint = 0x0008;

/// The seals every region carries: its size can never change under a reader.
pub(crate) const SEALS_SIZE: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
/// Added for immutable regions: nobody can write it again.
pub(crate) const SEALS_IMMUTABLE: libc::c_int = SEALS_SIZE | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;

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
    if len > 0 {
        // SAFETY: fallocate takes no pointers.
        let res = unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, len) };
        check(res)?;
    }
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

/// The file's size.
pub(crate) fn size(fd: RawFd) -> io::Result<u64> {
    // SAFETY: fstat writes into `stat`, a live local of the right type.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    check(unsafe { libc::fstat(fd, &raw mut stat) })?;
    u64::try_from(stat.st_size).map_err(|_| io::Error::other("negative file size"))
}

/// Frees the pages of `len` bytes from the start (the size stays): every mapping reads zeros.
pub(crate) fn punch_hole(fd: RawFd, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::other("size too large"))?;
    if len == 0 {
        return Ok(());
    }
    // SAFETY: fallocate takes no pointers.
    let res = unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            len,
        )
    };
    check(res).map(drop)
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
}

// SAFETY: the mapping is owned by this value alone; moving it between threads is like moving
// a `Vec<u8>`; shared access hands out only `&[u8]` (writes go through `&mut self`).
unsafe impl Send for FileMap {}
// SAFETY: as above.
unsafe impl Sync for FileMap {}

impl FileMap {
    /// Maps the first `len` bytes of `fd`: shared and writable for the owner, shared and
    /// read-only for a holder. `populate` builds the page tables now (off the hot path).
    pub(crate) fn new(fd: RawFd, len: usize, writable: bool, populate: bool) -> io::Result<Self> {
        if len == 0 {
            return Ok(Self {
                ptr: NonNull::dangling(),
                len: 0,
            });
        }
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        let flags = libc::MAP_SHARED | if populate { libc::MAP_POPULATE } else { 0 };
        // SAFETY: a new mapping with no address hint touches no existing memory; the kernel
        // checks `fd`, `len` and the protection against the file.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        // A forked child must not keep a peer's slot mapped after this process lets it go.
        // SAFETY: advice on the range just mapped; it changes no contents.
        unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_DONTFORK) };
        Ok(Self { ptr, len })
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the mapping is live and readable for `len` bytes while `self` exists.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable. Only for mappings made `writable` (else the first write faults,
    /// which is why only the owner's slots call it).
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as `as_slice`; `&mut self` gives exclusive access through this value.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: exactly the range this value mapped; no reference to it outlives `self`.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

/// The abstract-namespace socket address `\0{name}` and its length.
fn abstract_addr(name: &str) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain old data; all-zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::sa_family_t::try_from(libc::AF_UNIX).unwrap_or_default();
    let bytes = name.as_bytes();
    if bytes.len() + 1 > addr.sun_path.len() {
        return Err(io::Error::other("socket name too long"));
    }
    // sun_path[0] stays 0: the abstract namespace.
    for (dst, &src) in addr.sun_path[1..].iter_mut().zip(bytes) {
        *dst = libc::c_char::from_ne_bytes([src]);
    }
    let len = size_of::<libc::sa_family_t>() + 1 + bytes.len();
    Ok((
        addr,
        libc::socklen_t::try_from(len).unwrap_or(libc::socklen_t::MAX),
    ))
}

fn seqpacket() -> io::Result<OwnedFd> {
    let kind = libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
    // SAFETY: socket() takes no pointers.
    let fd = check(unsafe { libc::socket(libc::AF_UNIX, kind, 0) })?;
    // SAFETY: socket() just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A listening socket at `\0{name}` (`EADDRINUSE` if a live process holds the name: the
/// name goes away with its holder, so there is nothing stale to remove).
pub(crate) fn listen(name: &str) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    let (addr, len) = abstract_addr(name)?;
    // SAFETY: `addr` is a live sockaddr_un and `len` does not exceed its size.
    check(unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) })?;
    // SAFETY: listen() takes no pointers.
    check(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
    Ok(fd)
}

/// Connects to `\0{name}` (blocking connect on a Unix socket returns at once).
pub(crate) fn connect(name: &str) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    let (addr, len) = abstract_addr(name)?;
    // SAFETY: `addr` is a live sockaddr_un and `len` does not exceed its size.
    check(unsafe { libc::connect(fd.as_raw_fd(), (&raw const addr).cast(), len) })?;
    Ok(fd)
}

/// Accepts one connection (non-blocking, close-on-exec); `None` if none is waiting.
pub(crate) fn accept(listener: RawFd) -> io::Result<Option<OwnedFd>> {
    let flags = libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
    // SAFETY: no address is asked for (null pointers are allowed).
    let res = unsafe { libc::accept4(listener, std::ptr::null_mut(), std::ptr::null_mut(), flags) };
    match check(res) {
        // SAFETY: accept4 just returned this descriptor; nothing else owns it.
        Ok(fd) => Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) })),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

/// The peer's user id (`SO_PEERCRED`).
pub(crate) fn peer_uid(fd: RawFd) -> io::Result<u32> {
    // SAFETY: ucred is plain old data.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(size_of::<libc::ucred>()).unwrap_or(0);
    // SAFETY: `cred` and `len` are live locals; `len` holds `cred`'s size.
    check(unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &raw mut len,
        )
    })?;
    Ok(cred.uid)
}

/// Sends one datagram with `fds` beside it. `WouldBlock` if the socket's buffer is full.
pub(crate) fn send(fd: RawFd, datagram: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: datagram.as_ptr().cast_mut().cast(),
        iov_len: datagram.len(),
    };
    let space = cmsg_space(fds.len());
    let mut control = vec![0u8; space];
    // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer has room for one header with `fds.len()` descriptors
        // (`cmsg_space`), so the first header and its data lie inside it.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&raw const msg);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len =
                libc::CMSG_LEN(u32::try_from(size_of_val(fds)).unwrap_or(0)) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(header).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
    // SAFETY: `msg` points to `iov` (the live datagram) and `control`, both alive for the call.
    let res = unsafe { libc::sendmsg(fd, &raw const msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if res < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One received datagram.
pub(crate) struct Received {
    pub(crate) len: usize,
    pub(crate) fds: Vec<OwnedFd>,
    /// The kernel dropped descriptors (this process is at its descriptor limit).
    pub(crate) truncated: bool,
}

/// Receives one datagram into `buf` with up to `max_fds` descriptors; `None` if none is
/// waiting, `Some` with `len == 0` at end of stream.
pub(crate) fn receive(fd: RawFd, buf: &mut [u8], max_fds: usize) -> io::Result<Option<Received>> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let space = cmsg_space(max_fds);
    let mut control = vec![0u8; space];
    // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: `msg` points to `buf` (writable, unborrowed) and `control`, alive for the call.
    let res = unsafe {
        libc::recvmsg(
            fd,
            &raw mut msg,
            libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT,
        )
    };
    if res < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock {
            Ok(None)
        } else {
            Err(e)
        };
    }
    let len = usize::try_from(res).unwrap_or(0);
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `msg.msg_control` with `msg.msg_controllen` bytes of control
    // headers; CMSG_FIRSTHDR/CMSG_NXTHDR walk only within them.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&raw const msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(header).cast::<RawFd>();
                let header_len = libc::CMSG_LEN(0) as usize;
                let count =
                    ((*header).cmsg_len as usize).saturating_sub(header_len) / size_of::<RawFd>();
                for i in 0..count {
                    // Each descriptor the kernel installed belongs to this process now.
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            header = libc::CMSG_NXTHDR(&raw const msg, header);
        }
    }
    Ok(Some(Received {
        len,
        fds,
        truncated: msg.msg_flags & libc::MSG_CTRUNC != 0,
    }))
}

fn cmsg_space(fds: usize) -> usize {
    let bytes = u32::try_from(fds.max(1) * size_of::<RawFd>()).unwrap_or(u32::MAX);
    // SAFETY: CMSG_SPACE only computes a size.
    unsafe { libc::CMSG_SPACE(bytes) as usize }
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
