//! `SENDMSG` of a frame: head, path, metadata and every buffer as iovecs (`MSG_NOSIGNAL`, up to
//! `UIO_MAXIOV` of them). Without `MSG_WAITALL`: each submission completes with what the socket
//! took, at once if it took anything, otherwise once it could take some, and the same operation
//! is submitted again for the rest. Every completion is progress the session's minimum-rate
//! meter sees, so a slow peer is told from a stalled one without cutting the frame into
//! quantum-sized submissions.
//!
//! The sockets are blocking (io_uring first tries every send without waiting and then polls):
//! on a kernel that hands a send failing again after its poll to a worker thread instead,
//! that thread's `sendmsg` blocks until the whole rest of the frame is queued, reporting no
//! progress meanwhile (before, at most one quantum). Kernels since the poll-retry rework
//! (this one runs 6.18) retry from the poll instead; a close still cancels it either way.
//!
//! Cutting it was slower on loopback: one `MSG_WAITALL` submission per progress quantum
//! (480 KiB by default) took a 1 MiB reply in three, and the io_uring fixture answered 1 MiB
//! echoes at 3,100–3,500 a second against 4,000–4,400 without the cut (docs/benchmarks.md,
//! "RTT 1 MiB: the server's send, cut into quanta").
//!
//! Unlike the blocking and tokio drivers, a large frame's first write is not cut to
//! `FIRST_WRITE` here: on this driver the cut itself made loopback segments arrive out of
//! order (42–57 `TcpExtTCPOFOQueue` per 2 s of 1 MiB asks one at a time, against 0–5 whole) and
//! cost 1 MiB asks 24–31 % (one and 64 in flight; docs/benchmarks.md, "The first write of a
//! large frame"). Measured under BBR, before same-host connections asked for reno; under reno
//! the cut changed nothing measurable at RTT 1 MiB.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use io_uring::{opcode, squeue, types};
use tensorwire_proto::session::Transmit;

use crate::uring::op::sendmsg_zc;

/// Most iovecs one `sendmsg` takes (`UIO_MAXIOV`).
const MAX_IOVECS: usize = 1024;

/// A send. Owns the frame (keeping head and payload alive), the iovecs and the `msghdr`.
pub(crate) struct SendMsg {
    fd: Arc<OwnedFd>,
    transmit: Transmit,
    iov: Vec<libc::iovec>,
    msg: Box<libc::msghdr>,
    /// Send with `SENDMSG_ZC`: the memory must outlive the notifications, not only the send.
    pub(crate) zero_copy: bool,
    /// Notifications still to come for submissions made so far.
    pub(crate) notifications: u32,
    /// The whole frame was written (or writing failed); only notifications may follow.
    pub(crate) finished: bool,
}

impl SendMsg {
    pub(crate) fn new(fd: Arc<OwnedFd>, transmit: Transmit, zero_copy: bool) -> Self {
        Self {
            fd,
            transmit,
            iov: Vec::new(),
            // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
            msg: Box::new(unsafe { std::mem::zeroed::<libc::msghdr>() }),
            zero_copy,
            notifications: 0,
            finished: false,
        }
    }

    /// The SQE for what is left (its first `MAX_IOVECS` slices).
    pub(crate) fn entry(&mut self) -> squeue::Entry {
        self.iov.clear();
        for slice in self.transmit.slices().take(MAX_IOVECS) {
            self.iov.push(libc::iovec {
                iov_base: slice.as_ptr().cast_mut().cast(),
                iov_len: slice.len(),
            });
        }
        self.msg.msg_iov = self.iov.as_mut_ptr();
        self.msg.msg_iovlen = self.iov.len();
        let flags = u32::try_from(libc::MSG_NOSIGNAL).unwrap_or(0);
        let fd = types::Fd(self.fd.as_raw_fd());
        if self.zero_copy {
            crate::stats::record_zero_copy_request();
            return opcode::SendMsgZc::new(fd, &raw const *self.msg)
                .ioprio(sendmsg_zc::REPORT_USAGE)
                .flags(flags)
                .build();
        }
        opcode::SendMsg::new(fd, &raw const *self.msg)
            .flags(flags)
            .build()
    }

    /// Applies `n` written bytes; `true` once the frame is completely written.
    pub(crate) fn advance(&mut self, n: usize) -> bool {
        self.transmit.advance(n)
    }

    /// Whether nothing more will complete for this operation.
    pub(crate) fn is_done(&self) -> bool {
        self.finished && self.notifications == 0
    }
}
