//! `READ` of the core's wake-up eventfd.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use io_uring::{opcode, squeue, types};

/// A read of one eventfd counter into a boxed `u64`.
pub(crate) struct Read {
    fd: Arc<OwnedFd>,
    buf: Box<u64>,
}

impl Read {
    pub(crate) fn new(fd: Arc<OwnedFd>) -> Self {
        Self {
            fd,
            buf: Box::new(0),
        }
    }

    pub(crate) fn entry(&mut self) -> squeue::Entry {
        opcode::Read::new(
            types::Fd(self.fd.as_raw_fd()),
            (&raw mut *self.buf).cast(),
            8,
        )
        .build()
    }
}
