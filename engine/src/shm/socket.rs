//! `SOCK_SEQPACKET` Unix sockets in the abstract namespace that pass descriptors, the peer's
//! credentials behind one, and process descriptors (pidfds) that tell when a peer exits.
//!
//! Every unsafe block says why it is sound.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd for the socket's peer, without a pid-reuse race.
const SO_PEERPIDFD: libc::c_int = 77;

fn check(res: libc::c_int) -> io::Result<libc::c_int> {
    if res < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(res)
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

/// Sends one datagram with `fds` (at most [`MAX_FDS`]) beside it. `WouldBlock` if the
/// socket's buffer is full.
pub(crate) fn send(fd: RawFd, datagram: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many descriptors for one datagram",
        ));
    }
    let mut iov = libc::iovec {
        iov_base: datagram.as_ptr().cast_mut().cast(),
        iov_len: datagram.len(),
    };
    let space = cmsg_space(fds.len());
    let mut control = Control::default();
    // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer has room for one header with `fds.len()` descriptors
        // (`cmsg_space`, at most `MAX_FDS`: checked above), so the first header and its data
        // lie inside it.
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

/// Receives one datagram into `buf` with up to `max_fds` descriptors (at most [`MAX_FDS`]:
/// more are dropped and reported as `truncated`); `None` if none is waiting, `Some` with
/// `len == 0` at end of stream.
pub(crate) fn receive(fd: RawFd, buf: &mut [u8], max_fds: usize) -> io::Result<Option<Received>> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let space = cmsg_space(max_fds.min(MAX_FDS));
    let mut control = Control::default();
    // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: `msg` points to `buf` (writable, unborrowed) and `control` (`space` bytes of it
    // at most: `cmsg_space(MAX_FDS)` fits), alive for the call.
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

/// Descriptors one datagram carries at most here (a hello's: the queue; a `Map`'s: a segment).
const MAX_FDS: usize = 4;

/// Room for one control header with [`MAX_FDS`] descriptors, aligned for `cmsghdr`, on the
/// stack: a bell sent or received allocates nothing.
#[repr(C, align(8))]
struct Control([u8; 64]);

impl Default for Control {
    fn default() -> Self {
        Self([0; 64])
    }
}

const _: () =
    assert!(size_of::<libc::cmsghdr>() + MAX_FDS * size_of::<RawFd>() <= size_of::<Control>());

fn cmsg_space(fds: usize) -> usize {
    let bytes = u32::try_from(fds.max(1) * size_of::<RawFd>()).unwrap_or(u32::MAX);
    // SAFETY: CMSG_SPACE only computes a size.
    unsafe { libc::CMSG_SPACE(bytes) as usize }
}

/// Who is on the other end of a Unix socket, as the kernel recorded it (`SO_PEERCRED`: at
/// `connect` for the client's view of the listener, at `connect` for the listener's view of
/// the client).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PeerCred {
    pub(crate) pid: u32,
    pub(crate) uid: u32,
}

/// Bytes this end sent that the peer has not received yet (`SIOCOUTQ`: for a Unix socket,
/// what its unread datagrams take).
pub(crate) fn unread_sent(fd: RawFd) -> io::Result<usize> {
    let mut bytes: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (= TIOCOUTQ) writes one int into `bytes`, a live local.
    check(unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &raw mut bytes) })?;
    Ok(usize::try_from(bytes).unwrap_or(0))
}

/// The peer's credentials.
pub(crate) fn peer_cred(fd: RawFd) -> io::Result<PeerCred> {
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
    Ok(PeerCred {
        pid: u32::try_from(cred.pid).unwrap_or(0),
        uid: cred.uid,
    })
}

/// A pidfd of the socket's peer process: `SO_PEERPIDFD` where the kernel has it, else
/// `pidfd_open(pid)` (which a pid reused in between could fool; the caller re-checks the
/// credentials after opening it).
pub(crate) fn peer_pidfd(fd: RawFd, pid: u32) -> io::Result<OwnedFd> {
    let mut pidfd: libc::c_int = -1;
    let mut len = libc::socklen_t::try_from(size_of::<libc::c_int>()).unwrap_or(0);
    // SAFETY: `pidfd` and `len` are live locals; `len` holds `pidfd`'s size.
    let res = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&raw mut pidfd).cast(),
            &raw mut len,
        )
    };
    if res == 0 && pidfd >= 0 {
        // SAFETY: the kernel just installed this descriptor for us.
        return Ok(unsafe { OwnedFd::from_raw_fd(pidfd) });
    }
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
    // SAFETY: pidfd_open takes a pid and flags, no pointers.
    let res = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if res < 0 {
        return Err(io::Error::last_os_error());
    }
    let raw = RawFd::try_from(res).map_err(|_| io::Error::other("pidfd out of range"))?;
    // SAFETY: pidfd_open just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}
