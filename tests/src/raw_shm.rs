//! An independent same-host (TWS4) peer written from `docs/protocol.md`, with no code of the
//! engine: the knock, the hello with a queue beside it, records in the queue, `Map` datagrams
//! with descriptors and `Bell`s on the socket. It does what a buggy or hostile local process of the same
//! user can do — including what a correct peer never would — so tests can check what the node
//! gives it.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use tensorwire_proto::shm::queue::{
    BLOCKED_AT, HEAD_AT, QUEUE_HEADER, QUEUE_MAGIC, QUEUE_VERSION, QueueShape, RECORD_HEADER,
    SLEEPING_AT, Step, TAIL_AT, WRAP, place, read_step, room,
};
use tensorwire_proto::shm::{
    BELL, Control, Hello, KNOCK, KnockReply, MAX_DATAGRAM, Offer, decode, encode,
};

/// `F_SEAL_FUTURE_WRITE` (Linux 5.1; not in every libc crate's list).
pub const F_SEAL_FUTURE_WRITE: libc::c_int = 0x0010;

/// A verified connection to a node's shared-memory socket.
pub struct RawConn {
    /// The Unix socket.
    pub socket: OwnedFd,
    /// What the node said in its hello.
    pub theirs: Hello,
    queue: Mapping,
    peer: Mapping,
    ring: u32,
    peer_ring: u32,
    head: u64,
    tail: u64,
}

/// A shared mapping its value owns (unmapped on drop).
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone, like a `Vec<u8>`.
unsafe impl Send for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: exactly the range this value mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

impl Mapping {
    /// Maps `len` bytes of `fd` shared, writable or read-only.
    ///
    /// # Errors
    ///
    /// What `mmap` says (a sealed file refuses a new writable mapping).
    pub fn map(fd: RawFd, len: usize, writable: bool) -> io::Result<Self> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a new shared mapping without an address hint touches no existing memory.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }

    /// Copies `bytes` in at `at` (a writable mapping). In-process readers of the same pages
    /// (a node's views of a peer's segment) see the new bytes: a test that writes holds no
    /// borrow of them meanwhile.
    pub fn write(&self, at: usize, bytes: &[u8]) {
        assert!(at + bytes.len() <= self.len);
        // SAFETY: inside the live mapping; the caller holds no borrow of these bytes while
        // they are written (see above).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(at), bytes.len()) };
    }

    fn u64_at(&self, at: usize) -> &AtomicU64 {
        assert!(at + 8 <= self.len);
        // SAFETY: an aligned offset inside the live mapping (header offsets are 8-aligned).
        unsafe { &*self.ptr.add(at).cast::<AtomicU64>() }
    }

    fn u32_at(&self, at: usize) -> &AtomicU32 {
        assert!(at + 4 <= self.len);
        // SAFETY: an aligned offset inside the live mapping.
        unsafe { &*self.ptr.add(at).cast::<AtomicU32>() }
    }
}

impl RawConn {
    /// Knocks on `node`, connects to the socket it names and exchanges hellos, with a queue
    /// ring of `ring` bytes.
    ///
    /// # Errors
    ///
    /// What failed; the node refusing the hello shows as the socket closing.
    pub fn open(node: SocketAddr) -> io::Result<Self> {
        Self::open_with(node, QueueShape::DEFAULT.bytes)
    }

    /// [`RawConn::open`] with a ring of `ring` bytes.
    ///
    /// # Errors
    ///
    /// What failed.
    pub fn open_with(node: SocketAddr, ring: u32) -> io::Result<Self> {
        let (offer, via) = knock(node)?;
        let socket = connect(&offer.socket)?;
        let queue_fd = sealed_memfd(QueueShape::file_len(ring), true, false)?;
        let queue = Mapping::map(queue_fd.as_raw_fd(), file_len(ring), true)?;
        // SAFETY: the header lies inside the writable mapping just made.
        unsafe {
            std::ptr::copy_nonoverlapping(QUEUE_MAGIC.as_ptr(), queue.ptr, 4);
            std::ptr::copy_nonoverlapping(
                QUEUE_VERSION.to_le_bytes().as_ptr(),
                queue.ptr.add(4),
                4,
            );
            std::ptr::copy_nonoverlapping(ring.to_le_bytes().as_ptr(), queue.ptr.add(8), 4);
        }
        seal(queue_fd.as_raw_fd(), F_SEAL_FUTURE_WRITE)?;
        let shared = reopen_read_only(queue_fd.as_raw_fd())?;
        let hello = Hello {
            boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?
                .trim()
                .to_owned(),
            user_ns: {
                use std::os::unix::fs::MetadataExt;
                std::fs::metadata("/proc/self/ns/user")?.ino()
            },
            // SAFETY: getuid has no preconditions.
            uid: unsafe { libc::getuid() },
            pid: std::process::id(),
            node: "127.0.0.1:1".into(),
            ticket: offer.ticket,
            via,
            proof: [0; 16],
            queue: ring,
        };
        let datagram = encode(&Control::Hello(hello)).map_err(io::Error::other)?;
        send(socket.as_raw_fd(), &datagram, &[shared.as_raw_fd()])?;
        let (control, mut fds) = receive_until(socket.as_raw_fd(), Duration::from_secs(3))?
            .ok_or_else(|| io::Error::other("the node closed the socket instead of a hello"))?;
        let Control::Hello(theirs) = control else {
            return Err(io::Error::other("the node answered with something else"));
        };
        if fds.len() != 1 {
            return Err(io::Error::other(
                "the node's hello came without its queue alone",
            ));
        }
        let peer_fd = fds.pop().ok_or_else(|| io::Error::other("no queue"))?;
        let peer = Mapping::map(peer_fd.as_raw_fd(), file_len(theirs.queue), false)?;
        let peer_ring = theirs.queue;
        Ok(Self {
            socket,
            theirs,
            queue,
            peer,
            ring,
            peer_ring,
            head: 0,
            tail: 0,
        })
    }

    /// Writes one control message into this side's queue; `false` when there is no room.
    pub fn push(&mut self, control: &Control) -> bool {
        let bytes = encode(control).expect("a message that fits");
        self.push_bytes(&bytes)
    }

    /// Writes raw record bytes (anything at all) into this side's queue.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> bool {
        let placement = place(self.head, self.ring, bytes.len()).expect("a record that fits");
        let tail = self.peer.u64_at(TAIL_AT).load(Ordering::Acquire);
        let free = room(self.head, tail, self.ring).expect("the node's tail is sane");
        if placement.taken(self.head) > free {
            return false;
        }
        // SAFETY: `place` put the record inside the ring of the writable mapping.
        unsafe {
            let ring = self.queue.ptr.add(QUEUE_HEADER);
            if let Some(at) = placement.wrap_at {
                let at = usize::try_from(at % u64::from(self.ring)).unwrap();
                std::ptr::copy_nonoverlapping(WRAP.to_le_bytes().as_ptr(), ring.add(at), 4);
            }
            let at = ring.add(placement.start);
            let len = u32::try_from(bytes.len()).unwrap();
            std::ptr::copy_nonoverlapping(len.to_le_bytes().as_ptr(), at, 4);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), at.add(RECORD_HEADER), bytes.len());
        }
        self.head = placement.next_head;
        true
    }

    /// Publishes what was pushed and rings the node if it said it may sleep.
    pub fn publish(&mut self) {
        self.queue
            .u64_at(HEAD_AT)
            .store(self.head, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.peer.u32_at(SLEEPING_AT).load(Ordering::Relaxed) != 0 {
            self.ring();
        }
    }

    /// Says this side sleeps: the node rings it at every message it queues.
    pub fn say_asleep(&mut self) {
        self.queue.u32_at(SLEEPING_AT).store(1, Ordering::Release);
    }

    /// How many `Bell`s wait on the socket now, read; it stops at the first other datagram,
    /// which it reads too (and drops).
    pub fn bells_waiting(&self) -> usize {
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let mut bells = 0;
        while let Ok(Some((n, _))) = recv(self.socket.as_raw_fd(), &mut buf, 1) {
            if &buf[..n] != BELL {
                break;
            }
            bells += 1;
        }
        bells
    }

    fn ring(&self) {
        // A full socket wakes the node already.
        let _ = send_bell(self.socket.as_raw_fd());
    }

    /// Reads the next message the node queued, if any (and tells the node it was consumed).
    pub fn pop(&mut self) -> Option<Control> {
        loop {
            let head = self.peer.u64_at(HEAD_AT).load(Ordering::Acquire);
            let ring = self.peer.ptr.wrapping_add(QUEUE_HEADER);
            let step = read_step(self.tail, head, self.peer_ring, |at| {
                // SAFETY: an aligned offset inside the ring of the read-only mapping.
                unsafe { (*ring.add(at).cast::<AtomicU32>()).load(Ordering::Relaxed) }
            })
            .expect("the node's queue is sane");
            match step {
                Step::Empty => return None,
                Step::Wrap { next_tail } => self.tail = next_tail,
                Step::Record {
                    start,
                    len,
                    next_tail,
                } => {
                    let mut bytes = vec![0u8; len];
                    // SAFETY: `read_step` checked the record lies inside the ring.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            ring.add(start + RECORD_HEADER),
                            bytes.as_mut_ptr(),
                            len,
                        );
                    }
                    self.tail = next_tail;
                    self.queue
                        .u64_at(TAIL_AT)
                        .store(self.tail, Ordering::Release);
                    fence(Ordering::SeqCst);
                    if self.peer.u32_at(BLOCKED_AT).load(Ordering::Relaxed) != 0 {
                        self.ring();
                    }
                    return Some(decode(&bytes).expect("the node sends valid messages"));
                }
            }
        }
    }

    /// Waits up to `timeout` for the next message the node queues.
    pub fn pop_within(&mut self, timeout: Duration) -> Option<Control> {
        let until = Instant::now() + timeout;
        loop {
            if let Some(control) = self.pop() {
                return Some(control);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Announces a segment: a `Map` datagram with `fd` beside it.
    ///
    /// # Errors
    ///
    /// The socket refused it (the node closed it, or it is full).
    pub fn announce(&self, segment: u64, len: u64, fd: RawFd) -> io::Result<()> {
        let map = encode(&Control::Map { segment, len }).map_err(io::Error::other)?;
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            match send(self.socket.as_raw_fd(), &map, &[fd]) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                other => return other,
            }
        }
    }

    /// The next datagram but `Bell`s the node sent on the socket (a `Map` with its
    /// descriptor), waiting up to `timeout`; `None` when there is none or the node closed the
    /// socket.
    pub fn datagram(&self, timeout: Duration) -> Option<(Control, Vec<OwnedFd>)> {
        let until = Instant::now() + timeout;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match receive_until(self.socket.as_raw_fd(), left).ok().flatten() {
                Some((Control::Bell, _)) => {}
                other => return other,
            }
        }
    }

    /// Whether the node closed this connection (its end of the socket), waiting up to
    /// `timeout` for it.
    pub fn closed_by_node(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        loop {
            let mut buf = vec![0u8; MAX_DATAGRAM];
            match recv(self.socket.as_raw_fd(), &mut buf, 1) {
                Ok(Some((0, _))) => return true,
                Ok(Some(_)) => {}
                Ok(None) => {}
                Err(_) => return true,
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Sends one `Bell` on `socket` (a [`RawConn::socket`]), without waiting: `WouldBlock` when
/// it is full.
///
/// # Errors
///
/// What the socket refused.
pub fn send_bell(socket: RawFd) -> io::Result<()> {
    send(socket, BELL, &[])
}

/// Knocks on `node` and connects to its socket without saying hello.
///
/// # Errors
///
/// What failed.
pub fn connect_without_hello(node: SocketAddr) -> io::Result<OwnedFd> {
    connect(&socket_name(node)?)
}

/// Knocks on `node`: the name of its shared-memory socket.
///
/// # Errors
///
/// What failed.
pub fn socket_name(node: SocketAddr) -> io::Result<String> {
    Ok(knock(node)?.0.socket)
}

/// Connects to the shared-memory socket `name` (without a knock or a hello).
///
/// # Errors
///
/// What failed.
pub fn connect_socket(name: &str) -> io::Result<OwnedFd> {
    connect(name)
}

/// A memfd of `len` bytes sealed against resizing (and, if `future_write`, against new
/// writable mappings), allocated if `allocate` — else only `ftruncate`d (sparse).
///
/// # Errors
///
/// What the kernel refused.
pub fn sealed_memfd(len: u64, allocate: bool, future_write: bool) -> io::Result<OwnedFd> {
    let name = c"raw-peer";
    // SAFETY: a valid NUL-terminated name.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create just returned it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = libc::off_t::try_from(len).map_err(io::Error::other)?;
    let res = if allocate {
        // SAFETY: no pointers.
        unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, len) }
    } else {
        // SAFETY: no pointers.
        unsafe { libc::ftruncate(fd.as_raw_fd(), len) }
    };
    if res < 0 {
        return Err(io::Error::last_os_error());
    }
    seal(fd.as_raw_fd(), libc::F_SEAL_SHRINK | libc::F_SEAL_GROW)?;
    if future_write {
        seal(fd.as_raw_fd(), F_SEAL_FUTURE_WRITE)?;
    }
    Ok(fd)
}

fn file_len(ring: u32) -> usize {
    usize::try_from(QueueShape::file_len(ring)).unwrap()
}

fn seal(fd: RawFd, seals: libc::c_int) -> io::Result<()> {
    // SAFETY: an integer argument.
    if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn reopen_read_only(fd: RawFd) -> io::Result<OwnedFd> {
    Ok(std::fs::File::open(format!("/proc/self/fd/{fd}"))?.into())
}

fn knock(node: SocketAddr) -> io::Result<(Offer, String)> {
    let mut stream = TcpStream::connect_timeout(&node, Duration::from_secs(2))?;
    let via = stream.local_addr()?.to_string();
    stream.write_all(KNOCK)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply)?;
    match KnockReply::decode(&reply).map_err(io::Error::other)? {
        Some(KnockReply::Offered(offer)) => Ok((offer, via)),
        other => Err(io::Error::other(format!("no offer: {other:?}"))),
    }
}

fn connect(name: &str) -> io::Result<OwnedFd> {
    // SAFETY: no pointers.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socket just returned it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_un is plain old data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::sa_family_t::try_from(libc::AF_UNIX).unwrap();
    for (dst, &src) in addr.sun_path[1..].iter_mut().zip(name.as_bytes()) {
        *dst = libc::c_char::from_ne_bytes([src]);
    }
    let len = libc::socklen_t::try_from(size_of::<libc::sa_family_t>() + 1 + name.len()).unwrap();
    // SAFETY: a live sockaddr_un and its length.
    if unsafe { libc::connect(fd.as_raw_fd(), (&raw const addr).cast(), len) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

fn send(fd: RawFd, datagram: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: datagram.as_ptr().cast_mut().cast(),
        iov_len: datagram.len(),
    };
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(u32::try_from(size_of_val(fds)).unwrap()) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: msghdr is plain old data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer has room for one header with these descriptors.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&raw const msg);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(u32::try_from(size_of_val(fds)).unwrap()) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(header).cast(), fds.len());
        }
    }
    // SAFETY: `msg` points to live buffers for the call.
    if unsafe { libc::sendmsg(fd, &raw const msg, libc::MSG_NOSIGNAL) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One datagram (its length and descriptors), `None` if none waits.
fn recv(fd: RawFd, buf: &mut [u8], max_fds: usize) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: CMSG_SPACE only computes a size.
    let space =
        unsafe { libc::CMSG_SPACE(u32::try_from(max_fds * size_of::<RawFd>()).unwrap()) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: msghdr is plain old data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: `msg` points to live buffers for the call.
    let n = unsafe {
        libc::recvmsg(
            fd,
            &raw mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock {
            Ok(None)
        } else {
            Err(e)
        };
    }
    let mut fds = Vec::new();
    // SAFETY: walks only the control headers the kernel filled in.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&raw const msg);
        while !header.is_null() {
            if (*header).cmsg_type == libc::SCM_RIGHTS {
                let count =
                    ((*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / size_of::<RawFd>();
                let data = libc::CMSG_DATA(header).cast::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            header = libc::CMSG_NXTHDR(&raw const msg, header);
        }
    }
    Ok(Some((usize::try_from(n).unwrap(), fds)))
}

fn receive_until(fd: RawFd, timeout: Duration) -> io::Result<Option<(Control, Vec<OwnedFd>)>> {
    let until = Instant::now() + timeout;
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        match recv(fd, &mut buf, 2)? {
            Some((0, _)) => return Ok(None),
            Some((n, fds)) => {
                let control = decode(&buf[..n]).map_err(io::Error::other)?;
                return Ok(Some((control, fds)));
            }
            None if Instant::now() >= until => return Ok(None),
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}
