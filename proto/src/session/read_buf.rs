//! The memory a session lends its driver for one read.

use crate::body::Body;
use crate::transport::RecvBuffer;

/// Memory lent to the driver for one read: scratch for heads and small bodies, or the unfilled
/// final memory of a body. The driver reads into [`ReadBuf::regions`] (one `recvmsg` over all
/// of them) and gives it back with the session's `handle_read`.
///
/// The buffer owns its memory: a driver whose kernel may still write into it (an io_uring
/// receive) keeps it until the operation's last completion, even if the connection is gone.
#[derive(Debug)]
pub struct ReadBuf {
    pub(crate) inner: Lent,
    pub(crate) quantum: usize,
}

#[derive(Debug)]
pub(crate) enum Lent {
    Scratch { buf: Box<[u8]>, from: usize },
    Body(Body<RecvBuffer>),
}

impl ReadBuf {
    /// Where the next bytes of the stream go, in order; each region is non-empty.
    pub fn regions(&mut self) -> impl Iterator<Item = &mut [u8]> {
        let (scratch, body) = match &mut self.inner {
            Lent::Scratch { buf, from } => (buf.get_mut(*from..), None),
            Lent::Body(body) => (None, Some(body)),
        };
        scratch
            .into_iter()
            .chain(body.into_iter().flat_map(|body| body.unfilled()))
    }

    /// Bytes the regions hold together.
    pub fn capacity(&self) -> usize {
        match &self.inner {
            Lent::Scratch { buf, from } => buf.len() - from,
            Lent::Body(body) => usize::try_from(body.exposed_unfilled()).unwrap_or(usize::MAX),
        }
    }

    /// Whether the regions are final payload memory (rather than scratch).
    pub fn is_payload(&self) -> bool {
        matches!(self.inner, Lent::Body(_))
    }

    /// Bytes of the frame being received that are still to come (0 for a scratch read). A
    /// driver that makes the kernel wait for several bytes (`SO_RCVLOWAT`) must not wait for
    /// more than this, or for more than [`ReadBuf::progress_quantum`].
    pub fn frame_remaining(&self) -> u64 {
        match &self.inner {
            Lent::Scratch { .. } => 0,
            Lent::Body(body) => body.remaining(),
        }
    }

    /// See [`SessionConfig::progress_quantum`].
    pub fn progress_quantum(&self) -> usize {
        self.quantum
    }
}
