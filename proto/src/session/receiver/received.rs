//! What a receiver reports: the meaning of the bytes received so far, and why a receive failed.

use std::io;

#[cfg(doc)]
use super::Receiver;
use crate::error::WireError;
use crate::kind::FrameKind;
use crate::ptr1::Frame;

/// What the bytes received so far mean.
#[derive(Debug)]
pub(crate) enum Received {
    /// The first four bytes of the connection are not `PTR1`; every byte read so far.
    ForeignPreface(Vec<u8>),
    /// The first bytes of a frame arrived.
    Started,
    /// The frame's head and path are in; call [`Receiver::admit`] (or
    /// [`Receiver::admit_into`]) or [`Receiver::refuse`] before anything else is received.
    /// `extension`: the frame's extension byte (0 for plain PTR1).
    Routed {
        kind: FrameKind,
        version: u32,
        extension: u8,
    },
    /// A whole frame arrived.
    Frame { frame: Frame, wire_len: u64 },
    /// A refused frame's body has been skipped.
    Skipped,
    /// The peer closed cleanly between frames.
    Closed,
    /// The stream is unusable. `version` is set once the frame's header was readable, so the
    /// peer can still be told what went wrong.
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
    /// No receive memory: the budget is used up, or an allocation failed.
    Memory(String),
}

impl From<WireError> for RecvError {
    fn from(error: WireError) -> Self {
        Self::Wire(error)
    }
}

impl From<crate::transport::Error> for RecvError {
    fn from(error: crate::transport::Error) -> Self {
        Self::Memory(error.to_string())
    }
}
