//! `ACCEPT` on the node's listening socket: multishot where the kernel has it (5.19).

use std::os::fd::RawFd;

use io_uring::{opcode, squeue, types};

/// An accept. The listener is owned by the driver and closed only after every core thread has
/// stopped, so the operation holds its number only.
pub(crate) struct Accept {
    listener: RawFd,
    multishot: bool,
}

impl Accept {
    pub(crate) fn new(listener: RawFd, multishot: bool) -> Self {
        Self {
            listener,
            multishot,
        }
    }

    pub(crate) fn entry(&mut self) -> squeue::Entry {
        let fd = types::Fd(self.listener);
        if self.multishot {
            opcode::AcceptMulti::new(fd)
                .flags(libc::SOCK_CLOEXEC)
                .build()
        } else {
            let (addr, len) = (std::ptr::null_mut(), std::ptr::null_mut());
            opcode::Accept::new(fd, addr, len)
                .flags(libc::SOCK_CLOEXEC)
                .build()
        }
    }

    pub(crate) fn is_multishot(&self) -> bool {
        self.multishot
    }
}
