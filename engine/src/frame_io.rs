//! Receiving and sending one PTR1 frame with io_uring operations.
//!
//! Each type owns every buffer, `iovec` array and `msghdr` its operations point to; the
//! connection that owns it keeps it alive until the operation's completion (see
//! `core::Conn::inflight`). All kernel-visible memory is on the heap, so moving these values
//! does not move what the kernel points at.

use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, squeue, types};
use tensorwire_proto::ptr1::{self, Frame};
use tensorwire_proto::{Body, FixedHeader, Format, Limits, WireError};

use crate::pool::{PoolBuffer, ReceivePool};

/// `IORING_SEND_ZC_REPORT_USAGE`: the notification says whether the kernel had to copy.
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// `IORING_NOTIF_USAGE_ZC_COPIED`, in a notification's result.
pub(crate) const NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;

/// Most iovecs one `sendmsg`/`recvmsg` takes (`UIO_MAXIOV`).
const MAX_IOVECS: usize = 1024;

/// Bytes of per-connection scratch for heads (and small bodies): one `RECV` usually brings a
/// small frame whole.
const SCRATCH_LEN: usize = 16 << 10;

/// What a completed receive step means.
pub(crate) enum RecvProgress {
    /// Submit [`FrameRecv::next_op`] again.
    More,
    /// The first bytes are in and are not `PTR1` (only when created with
    /// [`FrameRecv::preface`]); carries every byte read so far.
    ForeignPreface(Vec<u8>),
    /// A whole frame arrived.
    Frame { frame: Frame, wire_len: u64 },
    /// The peer closed the connection cleanly between frames.
    Closed,
    /// The stream is unusable. `version` is set when the header was readable, so the peer can
    /// still be told what went wrong.
    Failed {
        error: RecvError,
        version: Option<u32>,
    },
}

/// Why a receive failed.
#[derive(Debug)]
pub(crate) enum RecvError {
    /// The bytes are not a valid frame, or are over a limit.
    Wire(WireError),
    /// The peer closed in the middle of a frame.
    Truncated { received: u64 },
    /// The socket failed.
    Io(io::Error),
    /// No receive memory for the frame: over the receive budget, or allocation failed.
    Memory(String),
}

impl RecvError {
    /// What a client reports when a reply fails this way.
    pub(crate) fn into_client_error(self, peer: std::net::SocketAddr) -> crate::Error {
        use crate::Error;
        match self {
            Self::Wire(source) => Error::Protocol { peer, source },
            Self::Truncated { received } => Error::ConnectionClosed {
                peer,
                detail: Some(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("closed after {received} bytes of the reply"),
                )),
            },
            Self::Io(e) => Error::ConnectionClosed {
                peer,
                detail: Some(e),
            },
            Self::Memory(text) => Error::Io {
                op: "receiving a reply",
                source: io::Error::new(io::ErrorKind::OutOfMemory, text),
            },
        }
    }
}

enum Stage {
    /// Reading into scratch until the fixed header and length table are there.
    Head,
    /// A length table too large for scratch, read into its own memory.
    Table {
        fixed: FixedHeader,
        table: Vec<u8>,
        filled: usize,
    },
    /// Reading the rest of the body straight into its final memory.
    Body { body: Body<PoolBuffer> },
}

/// The memory the next receive step fills.
enum Destination<'a> {
    Scratch(&'a mut [u8]),
    Table(&'a mut [u8]),
    /// A `msghdr` whose iovecs are the body's unfilled final memory (owned by the `FrameRecv`).
    Body(*mut libc::msghdr),
}

/// Receives frames: a plain `RECV` into scratch brings the head (and often a small body); the
/// rest of a larger body arrives by one `RECVMSG` with `MSG_WAITALL` straight into final
/// receive-pool memory.
pub(crate) struct FrameRecv {
    /// Bytes `start..end` are received and not yet consumed.
    scratch: Box<[u8]>,
    start: usize,
    end: usize,
    /// The connection's first bytes have not been checked for `PTR1` yet.
    preface: bool,
    stage: Stage,
    /// Bytes of the current frame consumed so far.
    frame_bytes: u64,
    /// Version field of the current frame, once its header parsed.
    version: Option<u32>,
    /// The receive budget this frame's body holds while it arrives.
    reservation: Option<crate::pool::Reservation>,
    /// The socket's `SO_RCVLOWAT` as last set (1, the kernel's default, until a large body).
    low_water: i32,
    /// The body receive's iovecs and `msghdr`, kept for the connection's life so a frame costs
    /// no allocation for them (the header is boxed: the kernel holds its address while the
    /// connection itself may move).
    iov: Vec<libc::iovec>,
    msg: Box<libc::msghdr>,
}

impl FrameRecv {
    /// Ready for frames on an established PTR1 connection.
    pub(crate) fn new() -> Self {
        Self {
            scratch: vec![0; SCRATCH_LEN].into_boxed_slice(),
            start: 0,
            end: 0,
            preface: false,
            stage: Stage::Head,
            frame_bytes: 0,
            version: None,
            reservation: None,
            low_water: 1,
            iov: Vec::new(),
            // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
            msg: Box::new(unsafe { std::mem::zeroed::<libc::msghdr>() }),
        }
    }

    /// For a newly accepted connection: the first bytes are checked for `PTR1`.
    pub(crate) fn preface() -> Self {
        Self {
            preface: true,
            ..Self::new()
        }
    }

    /// Whether the connection's first bytes have not yet been confirmed as `PTR1`.
    pub(crate) fn awaiting_preface(&self) -> bool {
        self.preface
    }

    /// The receive operation for the next step.
    /// `poll_first`: the kernel has `IORING_RECVSEND_POLL_FIRST` (Linux 5.19), which the
    /// stepwise receive of large bodies needs; without it they use one `MSG_WAITALL` receive.
    pub(crate) fn next_op(&mut self, fd: RawFd, poll_first: bool) -> squeue::Entry {
        self.set_low_water(fd, poll_first);
        let low_water = self.low_water;
        let fd = types::Fd(fd);
        match self.destination() {
            Destination::Scratch(dest) => {
                opcode::Recv::new(fd, dest.as_mut_ptr(), len_u32(dest.len())).build()
            }
            Destination::Table(dest) => {
                opcode::Recv::new(fd, dest.as_mut_ptr(), len_u32(dest.len()))
                    .flags(libc::MSG_WAITALL)
                    .build()
            }
            // A low-water mark and MSG_WAITALL do not mix: the kernel retries a WAITALL receive
            // on each wake-up, and a mark above what is still to come would never wake it.
            Destination::Body(msg) if low_water > 1 => opcode::RecvMsg::new(fd, msg)
                .ioprio(RECVSEND_POLL_FIRST)
                .build(),
            Destination::Body(msg) => opcode::RecvMsg::new(fd, msg)
                .flags(u32::try_from(libc::MSG_WAITALL).unwrap_or(0))
                .build(),
        }
    }

    /// Performs the next step with one non-blocking system call (for blocking calls on the
    /// caller's thread); the result is what a completion would carry: bytes, or `-errno`.
    pub(crate) fn step_nonblocking(&mut self, fd: RawFd) -> i32 {
        self.set_low_water(fd, true);
        let result = match self.destination() {
            Destination::Scratch(dest) | Destination::Table(dest) => {
                crate::sys::recv_nonblocking(fd, dest)
            }
            // SAFETY: the msghdr's iovecs are the unfilled final memory of `self.stage`'s body,
            // valid and not otherwise borrowed for the duration of this synchronous call.
            Destination::Body(msg) => unsafe { crate::sys::recvmsg_nonblocking(fd, msg) },
        };
        match result {
            Ok(n) => i32::try_from(n).unwrap_or(i32::MAX),
            Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    /// A large body is received in a few big steps instead of one wake-up per arriving
    /// segment: each step waits until half of what is still to come (at most
    /// [`LOW_WATER_MAX`]) is queued. Halving keeps the receiver copying while the sender sends,
    /// and leaves only a small last step once the final byte is in. Everything else uses the
    /// default of one byte. Failing to set it costs speed only.
    ///
    /// Measured on the fixture server (1 MiB one-way from a `std::net` sender): 10–30 % less
    /// server CPU per message, half the context switches, 5–20 % more messages per second; at
    /// 64 MiB 10–30 % less CPU and no loss (docs/benchmarks.md names the commands).
    fn set_low_water(&mut self, fd: RawFd, stepwise: bool) {
        let wanted = match &self.stage {
            Stage::Body { body, .. } if stepwise && body.remaining() >= LOW_WATER_MIN => {
                i32::try_from((body.remaining() / 2).min(LOW_WATER_MAX)).unwrap_or(1)
            }
            _ => 1,
        };
        if wanted != self.low_water && crate::sys::set_receive_low_water(fd, wanted).is_ok() {
            self.low_water = wanted;
        }
    }

    /// Where the next received bytes go (compacting scratch first).
    fn destination(&mut self) -> Destination<'_> {
        match &mut self.stage {
            Stage::Head => {
                if self.start > 0 {
                    self.scratch.copy_within(self.start..self.end, 0);
                    self.end -= self.start;
                    self.start = 0;
                }
                Destination::Scratch(&mut self.scratch[self.end..])
            }
            Stage::Table { table, filled, .. } => Destination::Table(&mut table[*filled..]),
            Stage::Body { body } => {
                let (iov, msg) = (&mut self.iov, &mut self.msg);
                iov.clear();
                iov.extend(body.unfilled().take(MAX_IOVECS).map(|slice| libc::iovec {
                    iov_base: slice.as_mut_ptr().cast(),
                    iov_len: slice.len(),
                }));
                msg.msg_iov = iov.as_mut_ptr();
                msg.msg_iovlen = iov.len();
                Destination::Body(&raw mut **msg)
            }
        }
    }

    /// A frame (or failure) that bytes already in scratch complete, without reading more.
    /// `None` means a receive is needed.
    pub(crate) fn buffered(&mut self, limits: &Limits, pool: &ReceivePool) -> Option<RecvProgress> {
        if !matches!(self.stage, Stage::Head) || self.start == self.end {
            return None;
        }
        match self.parse_scratch(limits, pool) {
            RecvProgress::More => None,
            progress => Some(progress),
        }
    }

    /// Applies the result of the operation from [`FrameRecv::next_op`].
    pub(crate) fn complete(
        &mut self,
        res: i32,
        limits: &Limits,
        pool: &ReceivePool,
    ) -> RecvProgress {
        let n = match usize::try_from(res) {
            Ok(0) => {
                let mid_frame = self.frame_bytes > 0
                    || self.start < self.end
                    || !matches!(self.stage, Stage::Head);
                if !mid_frame {
                    return RecvProgress::Closed;
                }
                let received = self.frame_bytes + crate::len_u64(self.end - self.start);
                return self.fail(RecvError::Truncated { received });
            }
            Ok(n) => n,
            Err(_) => return self.fail(RecvError::Io(io::Error::from_raw_os_error(-res))),
        };
        match &mut self.stage {
            Stage::Head => {
                self.end += n;
                self.parse_scratch(limits, pool)
            }
            Stage::Table {
                fixed,
                table,
                filled,
            } => {
                *filled += n;
                self.frame_bytes += crate::len_u64(n);
                if *filled < table.len() {
                    return RecvProgress::More;
                }
                let (fixed, table) = (*fixed, std::mem::take(table));
                match fixed.layout(&table, limits) {
                    Ok(layout) => self.start_body(layout, pool),
                    Err(e) => self.fail(RecvError::Wire(e)),
                }
            }
            Stage::Body { body } => {
                self.frame_bytes += crate::len_u64(n);
                if let Err(e) = body.advance(n) {
                    return self.fail(RecvError::Wire(e));
                }
                if !body.is_complete() {
                    return RecvProgress::More;
                }
                let Stage::Body { body } = std::mem::replace(&mut self.stage, Stage::Head) else {
                    let error = io::Error::other("frame finished outside the body stage");
                    return self.fail(RecvError::Io(error));
                };
                self.finish(body)
            }
        }
    }

    /// Parses what scratch holds: preface, fixed header, length table, then as much body as
    /// is there.
    fn parse_scratch(&mut self, limits: &Limits, pool: &ReceivePool) -> RecvProgress {
        let available = &self.scratch[self.start..self.end];
        if self.preface {
            if available.len() < 4 {
                return RecvProgress::More;
            }
            if &available[..4] != b"PTR1" {
                return RecvProgress::ForeignPreface(available.to_vec());
            }
            self.preface = false;
        }
        if available.len() < ptr1::FIXED_HEADER_LEN {
            return RecvProgress::More;
        }
        let header = &available[..ptr1::FIXED_HEADER_LEN];
        if &header[..4] == b"PTR1" {
            self.version = Some(u32::from_le_bytes([
                header[8], header[9], header[10], header[11],
            ]));
        }
        let fixed = match FixedHeader::parse(Format::Ptr1, header, limits) {
            Ok(fixed) => fixed,
            Err(e) => return self.fail(RecvError::Wire(e)),
        };
        let table_len = match fixed.table_len() {
            Ok(len) => len,
            Err(e) => return self.fail(RecvError::Wire(e)),
        };
        let head_len = ptr1::FIXED_HEADER_LEN + table_len;
        if available.len() >= head_len {
            let layout = fixed.layout(&available[ptr1::FIXED_HEADER_LEN..head_len], limits);
            self.start += head_len;
            self.frame_bytes = crate::len_u64(head_len);
            return match layout {
                Ok(layout) => self.start_body(layout, pool),
                Err(e) => self.fail(RecvError::Wire(e)),
            };
        }
        if head_len <= self.scratch.len() {
            return RecvProgress::More; // the rest of the table fits scratch: read on
        }
        // A table larger than scratch (thousands of buffers): bounded by 8 × the buffer limit,
        // which `FixedHeader::parse` checked, and charged to the receive budget like a body.
        let Some(reservation) = pool.reserve(crate::len_u64(table_len)) else {
            let text = format!(
                "cannot receive a {table_len}-byte length table now (PoolConfig::max_receiving_bytes)"
            );
            return self.fail(RecvError::Memory(text));
        };
        self.reservation = Some(reservation);
        let mut table = Vec::new();
        if table.try_reserve_exact(table_len).is_err() {
            let text = format!("cannot allocate {table_len} bytes for a length table");
            return self.fail(RecvError::Memory(text));
        }
        table.resize(table_len, 0);
        let have = available.len() - ptr1::FIXED_HEADER_LEN;
        table[..have].copy_from_slice(&available[ptr1::FIXED_HEADER_LEN..]);
        self.frame_bytes = crate::len_u64(available.len());
        self.start = self.end;
        self.stage = Stage::Table {
            fixed,
            table,
            filled: have,
        };
        RecvProgress::More
    }

    fn start_body(&mut self, layout: tensorwire_proto::Layout, pool: &ReceivePool) -> RecvProgress {
        // Nothing is allocated for a body the receive budget has no room for.
        let bytes = layout.body_len();
        let Some(reservation) = pool.reserve(bytes) else {
            let budget = pool.max_receiving_bytes();
            let text = format!(
                "cannot receive a {bytes}-byte frame body now: frames still arriving may hold at \
                 most {budget} bytes (PoolConfig::max_receiving_bytes)"
            );
            return self.fail(RecvError::Memory(text));
        };
        self.reservation = Some(reservation);
        let mut body = Body::new(layout);
        let mut alloc = |len| {
            let mut buffer = pool.take(len);
            // The pool answers an allocation failure with an empty buffer.
            if buffer.as_mut().len() == len {
                Ok(buffer)
            } else {
                Err(RecvError::Memory(format!(
                    "cannot allocate {len} bytes of receive memory"
                )))
            }
        };
        if let Err(e) = body.expose(usize::MAX, &mut alloc) {
            return self.fail(e);
        }
        // Body bytes that came with the head are copied into place (at most the scratch size).
        match body.fill(&self.scratch[self.start..self.end], &mut alloc) {
            Ok(used) => {
                self.start += used;
                self.frame_bytes += crate::len_u64(used);
            }
            Err(e) => return self.fail(e),
        }
        if body.is_complete() {
            self.stage = Stage::Head;
            return self.finish(body);
        }
        self.stage = Stage::Body { body };
        RecvProgress::More
    }

    fn finish(&mut self, body: Body<PoolBuffer>) -> RecvProgress {
        self.reservation = None;
        let wire_len = self.frame_bytes;
        let version = self.version.take();
        self.frame_bytes = 0;
        match Frame::from_body(body) {
            Ok(frame) => RecvProgress::Frame { frame, wire_len },
            Err(e) => RecvProgress::Failed {
                error: RecvError::Wire(e),
                version,
            },
        }
    }

    fn fail(&mut self, error: RecvError) -> RecvProgress {
        self.reservation = None;
        RecvProgress::Failed {
            error,
            version: self.version,
        }
    }
}

/// Sends one encoded frame: header, path, metadata and every buffer as the iovecs of one
/// `SENDMSG` with `MSG_WAITALL | MSG_NOSIGNAL` (more than one past 1024 slices).
pub(crate) struct FrameSend {
    /// Keeps the head and the payload alive while the kernel reads them.
    _encoded: tensorwire_proto::Encoded,
    iov: Vec<libc::iovec>,
    /// First iovec not completely sent.
    next: usize,
    msg: Box<libc::msghdr>,
    wire_len: u64,
    /// Send with `SENDMSG_ZC`: the memory must outlive the kernel's notification, not just the
    /// send's completion (the connection keeps it, see `Conn::zero_copy_kept`).
    pub(crate) zero_copy: bool,
}

impl FrameSend {
    pub(crate) fn new(encoded: tensorwire_proto::Encoded) -> Self {
        let iov = encoded
            .slices()
            .map(|slice| libc::iovec {
                iov_base: slice.as_ptr().cast_mut().cast(),
                iov_len: slice.len(),
            })
            .collect();
        Self {
            wire_len: encoded.wire_len(),
            _encoded: encoded,
            iov,
            next: 0,
            // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
            msg: Box::new(unsafe { std::mem::zeroed::<libc::msghdr>() }),
            zero_copy: false,
        }
    }

    pub(crate) fn wire_len(&self) -> u64 {
        self.wire_len
    }

    /// The send operation for the rest of the frame.
    pub(crate) fn next_op(&mut self, fd: RawFd) -> squeue::Entry {
        let rest = &mut self.iov[self.next..];
        let count = rest.len().min(MAX_IOVECS);
        self.msg.msg_iov = rest.as_mut_ptr();
        self.msg.msg_iovlen = count;
        let flags = u32::try_from(libc::MSG_WAITALL | libc::MSG_NOSIGNAL).unwrap_or(0);
        if self.zero_copy {
            crate::stats::record_zero_copy_request();
            return opcode::SendMsgZc::new(types::Fd(fd), &raw const *self.msg)
                .ioprio(SEND_ZC_REPORT_USAGE)
                .flags(flags)
                .build();
        }
        opcode::SendMsg::new(types::Fd(fd), &raw const *self.msg)
            .flags(flags)
            .build()
    }

    /// Sends as much as the socket takes now with one non-blocking `sendmsg`; `Ok(true)` once
    /// everything is sent (for blocking calls on the caller's thread).
    pub(crate) fn send_nonblocking(&mut self, fd: RawFd) -> io::Result<bool> {
        let rest = &mut self.iov[self.next..];
        self.msg.msg_iov = rest.as_mut_ptr();
        self.msg.msg_iovlen = rest.len().min(MAX_IOVECS);
        // SAFETY: the iovecs point into `_encoded`'s memory (alive as long as `self`) and into
        // `self.iov`; the call is synchronous.
        let sent = unsafe { crate::sys::sendmsg_nonblocking(fd, &raw const *self.msg) }?;
        Ok(self.advance(sent))
    }

    /// Marks the first `n` bytes as already sent (by someone else).
    pub(crate) fn skip(&mut self, n: usize) {
        let _ = self.advance(n);
    }

    /// Applies a send result; `Ok(true)` once everything is sent.
    pub(crate) fn complete(&mut self, res: i32) -> io::Result<bool> {
        match usize::try_from(res) {
            Ok(0) => Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => Ok(self.advance(n)),
            Err(_) => Err(io::Error::from_raw_os_error(-res)),
        }
    }

    /// Moves past `sent` bytes; `true` once everything is sent.
    fn advance(&mut self, mut sent: usize) -> bool {
        while sent > 0 && self.next < self.iov.len() {
            let iov = &mut self.iov[self.next];
            if sent >= iov.iov_len {
                sent -= iov.iov_len;
                self.next += 1;
            } else {
                // SAFETY: `sent < iov_len`, so the new base stays inside the same slice.
                iov.iov_base = unsafe { iov.iov_base.cast::<u8>().add(sent).cast() };
                iov.iov_len -= sent;
                sent = 0;
            }
        }
        self.next == self.iov.len()
    }
}

/// A receive length for one `RECV`. Head reads are at most 28 bytes; a length table above
/// 4 GiB (only with a huge configured buffer limit) is read in several steps.
/// `IORING_RECVSEND_POLL_FIRST`: wait for readiness (which honours the low-water mark) before
/// the first receive attempt, instead of taking the few bytes already there.
const RECVSEND_POLL_FIRST: u16 = 1;
/// Bodies with less than this left are received in one `MSG_WAITALL` step, without a mark.
const LOW_WATER_MIN: u64 = 128 << 10;
/// The largest low-water mark: bounds how much arrives between two wake-ups.
const LOW_WATER_MAX: u64 = 1 << 20;

fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

impl From<WireError> for RecvError {
    fn from(error: WireError) -> Self {
        Self::Wire(error)
    }
}
