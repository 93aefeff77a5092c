//! io_uring operations, one file each. An operation owns everything its SQE points to (the
//! descriptor, buffers, iovecs, `msghdr`, address) and lives in the core's [`OpSlab`] until its
//! last completion, whatever happened to the connection that started it.

mod accept;
mod cancel;
mod connect;
mod read;
mod recvmsg;
mod sendmsg;
mod sendmsg_zc;

pub(crate) use accept::Accept;
pub(crate) use cancel::Cancel;
pub(crate) use connect::Connect;
pub(crate) use read::Read;
pub(crate) use recvmsg::{RecvMode, RecvMsg};
pub(crate) use sendmsg::SendMsg;
pub(crate) use sendmsg_zc::Notification;

use io_uring::squeue;

use crate::uring::keys::ConnKey;
pub(crate) use crate::uring::keys::OpKey;

/// Who started an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    /// The core itself (accept, wake-up read, cancels).
    Core,
    /// A connection (which may be gone by the time the operation completes).
    Conn(ConnKey),
}

/// Every kind of operation.
pub(crate) enum Op {
    Accept(Accept),
    Read(Read),
    Connect(Connect),
    Recv(RecvMsg),
    Send(SendMsg),
    Cancel(Cancel),
}

impl Op {
    /// The SQE for this operation (pointing into memory the operation owns).
    pub(crate) fn entry(&mut self) -> squeue::Entry {
        match self {
            Self::Accept(op) => op.entry(),
            Self::Read(op) => op.entry(),
            Self::Connect(op) => op.entry(),
            Self::Recv(op) => op.entry(),
            Self::Send(op) => op.entry(),
            Self::Cancel(op) => op.entry(),
        }
    }
}

pub(crate) struct OpEntry {
    pub(crate) owner: Owner,
    pub(crate) op: Op,
}

/// Operations that may be known to the kernel. An entry leaves only through `remove`, called
/// when the operation's last completion has been seen (or its submission failed); on shutdown
/// with operations still in flight the slab is leaked rather than freed (see `Core`'s `Drop`).
pub(crate) type OpSlab = crate::uring::slab::Slab<OpKey, OpEntry>;
