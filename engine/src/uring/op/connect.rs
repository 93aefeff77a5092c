//! `CONNECT` of a new client socket.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use io_uring::{opcode, squeue, types};

use crate::sys::RawAddr;

/// A connect; the address must stay put until it completes, so it is boxed here.
pub(crate) struct Connect {
    fd: Arc<OwnedFd>,
    addr: Box<RawAddr>,
}

impl Connect {
    pub(crate) fn new(fd: Arc<OwnedFd>, peer: SocketAddr) -> Self {
        Self {
            fd,
            addr: Box::new(RawAddr::new(peer)),
        }
    }

    pub(crate) fn entry(&mut self) -> squeue::Entry {
        opcode::Connect::new(
            types::Fd(self.fd.as_raw_fd()),
            self.addr.as_ptr(),
            self.addr.len(),
        )
        .build()
    }
}
