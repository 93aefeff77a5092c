//! `RECVMSG` into the memory a session lent: scratch, or the unfilled final memory of a body.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use io_uring::{opcode, squeue, types};
use tensorwire_proto::session::ReadBuf;

/// Most iovecs one `recvmsg` takes (`UIO_MAXIOV`).
const MAX_IOVECS: usize = 1024;
/// `IORING_RECVSEND_POLL_FIRST`: wait for readiness (which honours `SO_RCVLOWAT`) before the
/// first attempt, instead of taking the few bytes already there.
const RECVSEND_POLL_FIRST: u16 = 1;

/// How the kernel should complete a receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecvMode {
    /// Whatever is there (at least one byte).
    Any,
    /// Every byte of the regions (`MSG_WAITALL`).
    All,
    /// Once the socket's low-water mark is queued (poll first, no `MSG_WAITALL`).
    LowWater,
}

/// A receive. Owns the lent memory, the iovecs describing it and the `msghdr` (boxed: the
/// kernel holds its address while the operation itself may move in the slab).
pub(crate) struct RecvMsg {
    fd: Arc<OwnedFd>,
    buf: ReadBuf,
    iov: Vec<libc::iovec>,
    msg: Box<libc::msghdr>,
    mode: RecvMode,
}

impl RecvMsg {
    pub(crate) fn new(fd: Arc<OwnedFd>, mut buf: ReadBuf, mode: RecvMode) -> Self {
        let iov = buf
            .regions()
            .take(MAX_IOVECS)
            .map(|region| libc::iovec {
                iov_base: region.as_mut_ptr().cast(),
                iov_len: region.len(),
            })
            .collect();
        Self {
            fd,
            buf,
            iov,
            // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
            msg: Box::new(unsafe { std::mem::zeroed::<libc::msghdr>() }),
            mode,
        }
    }

    pub(crate) fn entry(&mut self) -> squeue::Entry {
        self.msg.msg_iov = self.iov.as_mut_ptr();
        self.msg.msg_iovlen = self.iov.len();
        let fd = types::Fd(self.fd.as_raw_fd());
        let entry = opcode::RecvMsg::new(fd, &raw mut *self.msg);
        match self.mode {
            RecvMode::Any => entry.build(),
            RecvMode::All => entry
                .flags(u32::try_from(libc::MSG_WAITALL).unwrap_or(0))
                .build(),
            RecvMode::LowWater => entry.ioprio(RECVSEND_POLL_FIRST).build(),
        }
    }

    /// The lent memory, to give back to the session.
    pub(crate) fn into_buf(self) -> ReadBuf {
        self.buf
    }
}
