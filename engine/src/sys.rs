//! The one place that calls libc directly (besides the ring and the receive-pool mappings).
//!
//! Every function returns `io::Result` with the OS error; none of them panics.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use tensorwire_proto::session::Keepalive;

/// `MADV_POPULATE_WRITE` (Linux 5.14; not in every libc crate version): older kernels answer
/// `EINVAL`, and pages fault in as they are touched.
pub(crate) const MADV_POPULATE_WRITE: libc::c_int = 23;

/// Calls a libc function and turns `-1` into the thread's `errno`.
macro_rules! syscall {
    ($fn:ident ( $($arg:expr),* $(,)? )) => {{
        // SAFETY: each call site passes arguments that satisfy the function's contract; the
        // site's own SAFETY comment says why.
        #[allow(unused_unsafe)]
        let res = unsafe { libc::$fn($($arg),*) };
        if res == -1 { Err(std::io::Error::last_os_error()) } else { Ok(res) }
    }};
}

/// A socket address in the C layout, for `bind`, `connect` and `getsockname`.
#[derive(Clone, Copy)]
pub(crate) struct RawAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

impl RawAddr {
    pub(crate) fn new(addr: SocketAddr) -> Self {
        // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
        let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
        let len = match addr {
            SocketAddr::V4(v4) => {
                let sin = libc::sockaddr_in {
                    sin_family: family(libc::AF_INET),
                    sin_port: v4.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(v4.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
                unsafe { std::ptr::write((&raw mut storage).cast(), sin) };
                size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(v6) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: family(libc::AF_INET6),
                    sin6_port: v6.port().to_be(),
                    sin6_flowinfo: v6.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: v6.ip().octets(),
                    },
                    sin6_scope_id: v6.scope_id(),
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
                unsafe { std::ptr::write((&raw mut storage).cast(), sin6) };
                size_of::<libc::sockaddr_in6>()
            }
        };
        Self {
            storage,
            len: socklen(len),
        }
    }

    pub(crate) fn as_ptr(&self) -> *const libc::sockaddr {
        (&raw const self.storage).cast()
    }

    pub(crate) fn len(&self) -> libc::socklen_t {
        self.len
    }

    fn to_socket_addr(self) -> io::Result<SocketAddr> {
        match i32::from(self.storage.ss_family) {
            libc::AF_INET => {
                // SAFETY: the family says the storage holds a sockaddr_in.
                let sin: libc::sockaddr_in =
                    unsafe { std::ptr::read((&raw const self.storage).cast()) };
                let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
                Ok(SocketAddr::V4(SocketAddrV4::new(
                    ip,
                    u16::from_be(sin.sin_port),
                )))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says the storage holds a sockaddr_in6.
                let sin6: libc::sockaddr_in6 =
                    unsafe { std::ptr::read((&raw const self.storage).cast()) };
                Ok(SocketAddr::V6(SocketAddrV6::new(
                    sin6.sin6_addr.s6_addr.into(),
                    u16::from_be(sin6.sin6_port),
                    sin6.sin6_flowinfo,
                    sin6.sin6_scope_id,
                )))
            }
            family => Err(io::Error::other(format!(
                "unexpected address family {family}"
            ))),
        }
    }
}

/// A new TCP socket (blocking; io_uring drives it without blocking a thread) with
/// `CLOEXEC`.
pub(crate) fn tcp_socket(addr: &SocketAddr) -> io::Result<OwnedFd> {
    let domain = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: socket() takes no pointers.
    let fd = syscall!(socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0))?;
    // SAFETY: socket() just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The address of a connected socket's peer.
pub(crate) fn peer_addr(fd: RawFd) -> io::Result<SocketAddr> {
    socket_address(fd, true)
}

/// The local address of a bound or connected socket.
pub(crate) fn local_addr(fd: RawFd) -> io::Result<SocketAddr> {
    socket_address(fd, false)
}

fn socket_address(fd: RawFd, peer: bool) -> io::Result<SocketAddr> {
    let mut raw = RawAddr::new(SocketAddr::from(([0, 0, 0, 0], 0)));
    raw.len = socklen(size_of::<libc::sockaddr_storage>());
    let (storage, len) = ((&raw mut raw.storage).cast(), &raw mut raw.len);
    // SAFETY: `storage` and `len` point into `raw`, a live local; `len` holds the storage's
    // full size, so the kernel writes at most that much.
    if peer {
        syscall!(getpeername(fd, storage, len))?;
    } else {
        syscall!(getsockname(fd, storage, len))?;
    }
    raw.to_socket_addr()
}

/// Waits up to `timeout` for `events` on one descriptor; returns the events that happened
/// (empty on timeout).
pub(crate) fn poll_one(fd: RawFd, events: i16, timeout: std::time::Duration) -> io::Result<i16> {
    let mut pollfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis().min(i32::MAX as u128)).unwrap_or(i32::MAX);
    // Round up so a sub-millisecond remainder still waits instead of spinning.
    let ms = if ms == 0 && !timeout.is_zero() { 1 } else { ms };
    loop {
        // SAFETY: one live `pollfd`, and a count of one.
        match syscall!(poll(&raw mut pollfd, 1, ms)) {
            Ok(0) => return Ok(0),
            Ok(_) => return Ok(pollfd.revents),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// A new epoll instance (close-on-exec).
pub(crate) fn epoll() -> io::Result<OwnedFd> {
    // SAFETY: epoll_create1 takes no pointers.
    let fd = syscall!(epoll_create1(libc::EPOLL_CLOEXEC))?;
    // SAFETY: epoll_create1 just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds, changes or removes (`op` = `EPOLL_CTL_*`) the interest of `epoll` in `fd`: `events`,
/// reported with `token`. Safe to call from any thread while another waits on `epoll`.
pub(crate) fn epoll_ctl(
    epoll: RawFd,
    op: i32,
    fd: RawFd,
    events: u32,
    token: u64,
) -> io::Result<()> {
    let mut event = libc::epoll_event { events, u64: token };
    // SAFETY: `event` is a live local for the call (ignored by EPOLL_CTL_DEL).
    syscall!(epoll_ctl(epoll, op, fd, &raw mut event))?;
    Ok(())
}

/// Waits up to `timeout` for events on `epoll`, filling `events`; how many (0 on timeout and
/// on a signal).
pub(crate) fn epoll_wait(
    epoll: RawFd,
    events: &mut [libc::epoll_event],
    timeout: std::time::Duration,
) -> io::Result<usize> {
    let ms = i32::try_from(timeout.as_millis().min(i32::MAX as u128)).unwrap_or(i32::MAX);
    let ms = if ms == 0 && !timeout.is_zero() { 1 } else { ms };
    let max = i32::try_from(events.len()).unwrap_or(i32::MAX);
    // SAFETY: `events` is a live, writable array of at least `max` entries for the call.
    match syscall!(epoll_wait(epoll, events.as_mut_ptr(), max, ms)) {
        Ok(n) => Ok(usize::try_from(n).unwrap_or(0)),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}

/// Whether a process with `pid` exists (a reused pid reads as existing).
pub(crate) fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 sends nothing; it only checks that the process exists.
    match syscall!(kill(pid, 0)) {
        Ok(_) => true,
        Err(e) => e.raw_os_error() == Some(libc::EPERM),
    }
}

/// Turns TCP keepalive on with `keepalive`'s timing (or leaves it off for `None`).
pub(crate) fn set_keepalive(fd: RawFd, keepalive: Option<Keepalive>) -> io::Result<()> {
    let Some(keepalive) = keepalive else {
        return Ok(());
    };
    let (idle, interval, probes) = keepalive.socket_values();
    let int = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
    set_int_option(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set_int_option(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, int(idle))?;
    set_int_option(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, int(interval))?;
    set_int_option(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, int(probes))
}

/// Sets `TCP_NODELAY`: frames end in partial segments that must not wait for an ACK.
pub(crate) fn set_nodelay(fd: RawFd) -> io::Result<()> {
    set_int_option(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)
}

/// Sets `TCP_CONGESTION`: the congestion control this TCP socket uses from now on.
pub(crate) fn set_congestion(fd: RawFd, name: &str) -> io::Result<()> {
    // SAFETY: `name` is live for the call and the length passed is its length; the kernel
    // copies at most that many bytes.
    syscall!(setsockopt(
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_CONGESTION,
        name.as_ptr().cast(),
        socklen(name.len())
    ))?;
    Ok(())
}

/// The congestion control this TCP socket uses.
#[cfg(test)]
pub(crate) fn congestion(fd: RawFd) -> io::Result<String> {
    let mut name = [0u8; 16];
    let mut len = socklen(name.len());
    // SAFETY: `name` and `len` are live locals; `len` holds `name`'s size, so the kernel
    // writes at most that much.
    syscall!(getsockopt(
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_CONGESTION,
        name.as_mut_ptr().cast(),
        &raw mut len
    ))?;
    let name = &name[..usize::try_from(len).unwrap_or(0).min(name.len())];
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// Sets `SO_RCVLOWAT`: the socket reports readable (and wakes a waiting receive) only once this
/// many bytes are queued (or the receive window is nearly closed, or the peer finished).
pub(crate) fn set_receive_low_water(fd: RawFd, bytes: usize) -> io::Result<()> {
    let bytes = i32::try_from(bytes).unwrap_or(i32::MAX);
    set_int_option(fd, libc::SOL_SOCKET, libc::SO_RCVLOWAT, bytes)
}

fn set_int_option(fd: RawFd, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: `value` is a live `i32` and the length passed is its size.
    syscall!(setsockopt(
        fd,
        level,
        name,
        (&raw const value).cast(),
        socklen(size_of::<i32>())
    ))?;
    Ok(())
}

/// How many segments arrived out of order on this TCP socket so far (`tcpi_rcv_ooopack`:
/// each is a sign of a loss upstream; 0 on a kernel older than 5.4, which does not count).
pub(crate) fn received_out_of_order(fd: RawFd) -> io::Result<u32> {
    // SAFETY: `tcp_info` is plain old data; all-zero is a valid value.
    let mut info: libc::tcp_info = unsafe { zeroed() };
    let mut len = socklen(size_of::<libc::tcp_info>());
    // SAFETY: `info` is a live `tcp_info` of `len` bytes, and `len` a live length the kernel
    // updates to what it filled (a shorter struct leaves the rest zero).
    syscall!(getsockopt(
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_INFO,
        (&raw mut info).cast(),
        &raw mut len
    ))?;
    Ok(info.tcpi_rcv_ooopack)
}

/// Resets a TCP connection while the descriptor stays open (`connect` to `AF_UNSPEC`: the
/// kernel sends an RST and drops the data still queued, which also completes the
/// notifications of zero-copy sends waiting for it).
pub(crate) fn reset(fd: RawFd) -> io::Result<()> {
    let unspecified = libc::sockaddr {
        sa_family: libc::sa_family_t::try_from(libc::AF_UNSPEC).unwrap_or(0),
        sa_data: [0; 14],
    };
    // SAFETY: `unspecified` is a live `sockaddr` and the length passed is its size.
    syscall!(connect(
        fd,
        &raw const unspecified,
        socklen(size_of::<libc::sockaddr>())
    ))?;
    Ok(())
}

/// Bytes a TCP socket was given that its peer has not acknowledged yet, sent or not
/// (`SIOCOUTQ`, the same request as `TIOCOUTQ`).
pub(crate) fn unacknowledged(fd: RawFd) -> io::Result<u64> {
    let mut bytes: libc::c_int = 0;
    // SAFETY: `bytes` is a live `c_int`, which is what this request writes.
    syscall!(ioctl(fd, libc::TIOCOUTQ, &raw mut bytes))?;
    Ok(u64::try_from(bytes).unwrap_or(0))
}

/// `shutdown(fd, how)`; wakes any operation still waiting on the socket.
pub(crate) fn shutdown(fd: RawFd, how: i32) -> io::Result<()> {
    // SAFETY: shutdown() takes no pointers.
    syscall!(shutdown(fd, how))?;
    Ok(())
}

/// A close-on-exec eventfd used to wake a core thread. It is blocking on purpose: io_uring
/// answers a READ on a non-blocking file with `EAGAIN` instead of waiting.
pub(crate) fn eventfd_blocking() -> io::Result<OwnedFd> {
    // SAFETY: eventfd() takes no pointers.
    let fd = syscall!(eventfd(0, libc::EFD_CLOEXEC))?;
    // SAFETY: eventfd() just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A close-on-exec, non-blocking eventfd (the shared-memory driver's wake-up, waited on
/// through epoll).
pub(crate) fn eventfd_nonblocking() -> io::Result<OwnedFd> {
    // SAFETY: eventfd() takes no pointers.
    let fd = syscall!(eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK))?;
    // SAFETY: eventfd() just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// This process's soft limit on open descriptors (`RLIMIT_NOFILE`).
pub(crate) fn open_files_limit() -> Option<u64> {
    // SAFETY: rlimit is plain old data; all-zero is valid.
    let mut limit: libc::rlimit = unsafe { zeroed() };
    // SAFETY: getrlimit writes into `limit`, a live local of the right type.
    syscall!(getrlimit(libc::RLIMIT_NOFILE, &raw mut limit)).ok()?;
    Some(limit.rlim_cur)
}

/// Adds one to an eventfd counter (wakes its reader).
pub(crate) fn eventfd_signal(fd: RawFd) {
    let one: u64 = 1;
    // A failed write means the counter is saturated (the reader is already woken) or the fd is
    // closing; both are fine to ignore.
    // SAFETY: writes the 8 bytes of `one`, a live local.
    let _ = syscall!(write(fd, (&raw const one).cast(), size_of::<u64>()));
}

/// Resets an eventfd counter its poll reported readable (the file is this process's own,
/// made non-blocking: nothing else can make this read wait).
pub(crate) fn eventfd_drain(fd: RawFd) {
    let mut value = 0u64;
    // SAFETY: reads 8 bytes into `value`, a live local of 8 bytes.
    let _ = syscall!(read(fd, (&raw mut value).cast(), size_of::<u64>()));
}

/// An address family constant in the width `sockaddr` stores it (they are small numbers).
fn family(af: i32) -> libc::sa_family_t {
    libc::sa_family_t::try_from(af).unwrap_or_default()
}

/// `size_of` of a C struct as `socklen_t`. Struct sizes are small constants.
pub(crate) fn socklen(len: usize) -> libc::socklen_t {
    libc::socklen_t::try_from(len).unwrap_or(libc::socklen_t::MAX)
}

/// 16 random bytes from the kernel (`getrandom`): a stripe token no other client can guess.
pub(crate) fn random_16() -> io::Result<[u8; 16]> {
    let mut out = [0u8; 16];
    let mut filled = 0;
    while filled < out.len() {
        let rest = &mut out[filled..];
        // SAFETY: writes at most `rest.len()` bytes into `rest`, a live local array slice.
        let res = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
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
