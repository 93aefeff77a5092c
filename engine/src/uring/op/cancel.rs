//! `ASYNC_CANCEL`: every operation on a descriptor, or one operation by its key.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use io_uring::{opcode, squeue, types};

use crate::uring::op::OpKey;

/// A cancellation. A cancel by descriptor holds the descriptor, so its number cannot be
/// reused (and another connection's operations cancelled) before the kernel has seen it.
pub(crate) enum Cancel {
    Fd(Arc<OwnedFd>),
    Op(OpKey),
}

impl Cancel {
    pub(crate) fn entry(&mut self) -> squeue::Entry {
        match self {
            Self::Fd(fd) => {
                let cancel = types::CancelBuilder::fd(types::Fd(fd.as_raw_fd())).all();
                opcode::AsyncCancel2::new(cancel).build()
            }
            Self::Op(key) => opcode::AsyncCancel::new(key.user_data()).build(),
        }
    }
}
