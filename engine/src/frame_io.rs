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

/// Most iovecs one `sendmsg`/`recvmsg` takes (`UIO_MAXIOV`).
const MAX_IOVECS: usize = 1024;

/// What a completed receive step means.
pub(crate) enum RecvProgress {
    /// Submit [`FrameRecv::next_op`] again.
    More,
    /// The first four bytes are in and are not `PTR1` (only when created with
    /// [`FrameRecv::preface`]).
    ForeignPreface([u8; 4]),
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
}

enum Stage {
    Head,
    Table {
        fixed: FixedHeader,
        table: Vec<u8>,
        filled: usize,
    },
    Body {
        body: Body<PoolBuffer>,
        iov: Vec<libc::iovec>,
        msg: Box<libc::msghdr>,
    },
}

/// Receives one frame: fixed header and length table into scratch, then one `RECVMSG` with
/// `MSG_WAITALL` straight into the final receive-pool memory.
pub(crate) struct FrameRecv {
    /// Fixed header scratch; `filled` bytes are valid.
    head: Box<[u8; ptr1::FIXED_HEADER_LEN]>,
    filled: usize,
    /// Stop after the first 4 bytes to look at the preface (server side, first frame).
    preface: bool,
    stage: Stage,
    /// Bytes of this frame received so far.
    received: u64,
}

impl FrameRecv {
    /// Ready for the next frame on an established PTR1 connection.
    pub(crate) fn new() -> Self {
        Self {
            head: Box::new([0; ptr1::FIXED_HEADER_LEN]),
            filled: 0,
            preface: false,
            stage: Stage::Head,
            received: 0,
        }
    }

    /// For a newly accepted connection: the first step reads only 4 bytes.
    pub(crate) fn preface() -> Self {
        Self {
            preface: true,
            ..Self::new()
        }
    }

    /// The receive operation for the next step.
    pub(crate) fn next_op(&mut self, fd: RawFd) -> squeue::Entry {
        let fd = types::Fd(fd);
        match &mut self.stage {
            Stage::Head => {
                let want = if self.preface {
                    4
                } else {
                    ptr1::FIXED_HEADER_LEN
                };
                let dest = &mut self.head[self.filled..want];
                opcode::Recv::new(fd, dest.as_mut_ptr(), len_u32(dest.len()))
                    .flags(libc::MSG_WAITALL)
                    .build()
            }
            Stage::Table { table, filled, .. } => {
                let dest = &mut table[*filled..];
                opcode::Recv::new(fd, dest.as_mut_ptr(), len_u32(dest.len()))
                    .flags(libc::MSG_WAITALL)
                    .build()
            }
            Stage::Body { body, iov, msg } => {
                iov.clear();
                iov.extend(body.unfilled().take(MAX_IOVECS).map(|slice| libc::iovec {
                    iov_base: slice.as_mut_ptr().cast(),
                    iov_len: slice.len(),
                }));
                msg.msg_iov = iov.as_mut_ptr();
                msg.msg_iovlen = iov.len();
                opcode::RecvMsg::new(fd, &raw mut **msg)
                    .flags(u32::try_from(libc::MSG_WAITALL).unwrap_or(0))
                    .build()
            }
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
            Ok(0) if self.received == 0 => return RecvProgress::Closed,
            Ok(0) => {
                let received = self.received;
                return self.fail(RecvError::Truncated { received });
            }
            Ok(n) => n,
            Err(_) => return self.fail(RecvError::Io(io::Error::from_raw_os_error(-res))),
        };
        self.received += crate::len_u64(n);
        match &mut self.stage {
            Stage::Head => {
                self.filled += n;
                if self.preface {
                    if self.filled < 4 {
                        return RecvProgress::More;
                    }
                    self.preface = false;
                    let magic = [self.head[0], self.head[1], self.head[2], self.head[3]];
                    if &magic != b"PTR1" {
                        return RecvProgress::ForeignPreface(magic);
                    }
                    return RecvProgress::More;
                }
                if self.filled < ptr1::FIXED_HEADER_LEN {
                    return RecvProgress::More;
                }
                let fixed = match FixedHeader::parse(Format::Ptr1, &self.head[..], limits) {
                    Ok(fixed) => fixed,
                    Err(e) => return self.fail(RecvError::Wire(e)),
                };
                let table_len = match fixed.table_len() {
                    Ok(len) => len,
                    Err(e) => return self.fail(RecvError::Wire(e)),
                };
                if table_len == 0 {
                    return self.start_body(fixed, &[], limits, pool);
                }
                // Bounded by 8 × the buffer limit, checked by `FixedHeader::parse`.
                self.stage = Stage::Table {
                    fixed,
                    table: vec![0; table_len],
                    filled: 0,
                };
                RecvProgress::More
            }
            Stage::Table {
                fixed,
                table,
                filled,
            } => {
                *filled += n;
                if *filled < table.len() {
                    return RecvProgress::More;
                }
                let (fixed, table) = (*fixed, std::mem::take(table));
                self.start_body(fixed, &table, limits, pool)
            }
            Stage::Body { body, .. } => {
                if let Err(e) = body.advance(n) {
                    return self.fail(RecvError::Wire(e));
                }
                if body.is_complete() {
                    self.finish()
                } else {
                    RecvProgress::More
                }
            }
        }
    }

    fn start_body(
        &mut self,
        fixed: FixedHeader,
        table: &[u8],
        limits: &Limits,
        pool: &ReceivePool,
    ) -> RecvProgress {
        let body = fixed
            .layout(table, limits)
            .and_then(|layout| Body::new(layout, pool.allocator()));
        let body = match body {
            Ok(body) => body,
            Err(e) => return self.fail(RecvError::Wire(e)),
        };
        // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
        let msg = Box::new(unsafe { std::mem::zeroed::<libc::msghdr>() });
        self.stage = Stage::Body {
            body,
            iov: Vec::new(),
            msg,
        };
        match &self.stage {
            Stage::Body { body, .. } if body.is_complete() => self.finish(),
            _ => RecvProgress::More,
        }
    }

    fn finish(&mut self) -> RecvProgress {
        let wire_len = self.received;
        let version = self.header_version();
        let stage = std::mem::replace(&mut self.stage, Stage::Head);
        self.filled = 0;
        self.received = 0;
        let Stage::Body { body, .. } = stage else {
            return RecvProgress::Failed {
                error: RecvError::Io(io::Error::other("frame finished outside the body stage")),
                version,
            };
        };
        match Frame::from_body(body) {
            Ok(frame) => RecvProgress::Frame { frame, wire_len },
            Err(e) => RecvProgress::Failed {
                error: RecvError::Wire(e),
                version,
            },
        }
    }

    fn fail(&mut self, error: RecvError) -> RecvProgress {
        RecvProgress::Failed {
            error,
            version: self.header_version(),
        }
    }

    /// The version field, once the header is in and its magic is right.
    fn header_version(&self) -> Option<u32> {
        (self.filled >= 12 && &self.head[..4] == b"PTR1")
            .then(|| u32::from_le_bytes([self.head[8], self.head[9], self.head[10], self.head[11]]))
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
        opcode::SendMsg::new(types::Fd(fd), &raw const *self.msg)
            .flags(u32::try_from(libc::MSG_WAITALL | libc::MSG_NOSIGNAL).unwrap_or(0))
            .build()
    }

    /// Applies a send result; `Ok(true)` once everything is sent.
    pub(crate) fn complete(&mut self, res: i32) -> io::Result<bool> {
        let mut sent = match usize::try_from(res) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => n,
            Err(_) => return Err(io::Error::from_raw_os_error(-res)),
        };
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
        Ok(self.next == self.iov.len())
    }
}

/// A receive length for one `RECV`. Head reads are at most 28 bytes; a length table above
/// 4 GiB (only with a huge configured buffer limit) is read in several steps.
fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}
