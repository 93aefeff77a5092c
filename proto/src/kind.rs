//! The kind byte of a PTR1 frame (shared by the codec, the head parser and the sessions).

use std::fmt;

/// The kind byte of a PTR1 frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// Request that waits for a TensorResponse, SingleResponse or Error.
    Ask = 1,
    /// Request that waits for an Ack (sent once the message is enqueued) or Error.
    Tell = 2,
    /// Reply to an Ask carrying a TensorMessage.
    TensorResponse = 3,
    /// Reply to a Tell: the message was enqueued.
    Ack = 4,
    /// Reply to an Ask or Tell carrying an error text.
    Error = 5,
    /// Reply to an Ask carrying an ordinary message: `msg_type` and `data`.
    SingleResponse = 6,
}

impl FrameKind {
    /// The kind with this wire value, if any.
    pub const fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            1 => Self::Ask,
            2 => Self::Tell,
            3 => Self::TensorResponse,
            4 => Self::Ack,
            5 => Self::Error,
            6 => Self::SingleResponse,
            _ => return None,
        })
    }

    /// The kind's name, as in the protocol description.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ask => "Ask",
            Self::Tell => "Tell",
            Self::TensorResponse => "TensorResponse",
            Self::Ack => "Ack",
            Self::Error => "Error",
            Self::SingleResponse => "SingleResponse",
        }
    }

    /// Whether a client sends this kind (Ask, Tell) rather than a server.
    pub const fn is_request(self) -> bool {
        matches!(self, Self::Ask | Self::Tell)
    }
}

impl fmt::Display for FrameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
