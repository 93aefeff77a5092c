//! The same-host control protocol: one control message per request, reply, release or segment
//! change. Messages travel as records in the sender's queue in shared memory (`queue.rs` in the
//! engine), except what goes over the `SOCK_SEQPACKET` socket: the two that carry descriptors —
//! `Hello` (the sender's queue) and `Map` (a segment) — and `Bell`, which wakes a peer that
//! said it may sleep. Payload lives in the
//! sender's shared-memory segments, which the receiver maps once per connection; a message only
//! names where its bytes are — `(segment, offset, length, lease)` — except small parts, which
//! travel in the message.
//!
//! ```text
//! message := "TWS4" tag:u8 fields…           little-endian; strings and byte strings are
//!                                            u32 length + bytes; lists are u32 count + items
//! Hello   (1) boot_id:str user_ns:u64 uid:u32 pid:u32 node:str ticket:u64 via:str proof:[u8;16]
//!             queue:u32                      socket only; the sender's queue (a memfd)
//!                                            beside it
//! Request (2) id:u64 kind:u8(0 ask,1 tell) path:str body:Body
//! Reply   (3) id:u64 reply:WireReply
//! Release (4) leases:[u64]                   the holder dropped its last view of each
//! Map     (5) segment:u64 len:u64            socket only; one descriptor beside it: map it
//!                                            once, read-only
//! Retire  (6) segment:u64                    no message will name it again: unmap it
//! Unmapped(7) segment:u64                    (holder to owner) its descriptor was lost (the
//!                                            holder is at its descriptor limit): announce it again
//! Bell    (8)                                socket only, no descriptor: look at the queues
//!
//! Body    := 0 Inline  body:bytes            a whole PTM1 body in the datagram
//!          | 1 Packed  Shared                a whole PTM1 body in shared memory
//!          | 2 Parts   version:u32 metadata:Part buffers:[Part]
//! Part    := 0 bytes                         in the datagram
//!          | 1 Shared
//!          | 2 Returned segment:u64 offset:u64 len:u64
//!                                            bytes of the *recipient's* own segment that it
//!                                            lent to the sender (an echo): no copy either way
//! Shared  := segment:u64 offset:u64 len:u64 lease:u64
//! WireReply := 0 Tensor Body | 1 Single msg_type:str data:bytes | 2 Ack | 3 Error text:str
//! ```
//!
//! A lease is one hand-off of one slot to one holder; several parts may share it (a copied-in
//! message puts all its buffers in one slot). The holder sends `Release` once it drops the last
//! view of every part of that lease; until then the sender never writes the slot again.
//!
//! Decoding takes untrusted bytes: every length is checked against what is left before
//! anything is allocated, and nothing panics. Encoding never produces a datagram over
//! [`MAX_DATAGRAM`]: error texts are cut to [`MAX_ERROR_TEXT`], anything else too large is an
//! [`EncodeError`] the sender handles (by putting the bytes in shared memory instead).

use bytes::Bytes;

use crate::transport::RequestKind;

mod reader;
mod writer;

use reader::Reader;
pub use writer::{Record, encode};

/// The largest datagram either side sends or accepts.
pub const MAX_DATAGRAM: usize = 64 << 10;
/// Error texts are cut to this many bytes (a handler's 70 KiB message must not break the
/// connection every other request shares).
pub const MAX_ERROR_TEXT: usize = 4 << 10;
/// Bytes a [`Shared`] part takes on the wire (tag included).
pub const SHARED_PART_BYTES: usize = 33;
const MAGIC: &[u8; 4] = b"TWS4";
/// The `Bell` datagram, ready to send (the most frequent datagram: no encoding per ring).
pub const BELL: &[u8; 5] = b"TWS4\x08";
/// After the hello only `Map` (21 bytes) and `Bell` (5) travel over the socket: a receiver
/// needs no more room than this (a longer datagram, cut to it, never decodes as either:
/// decoding refuses bytes left over, and neither is this long).
pub const MAX_SOCKET_DATAGRAM: usize = 64;

/// One control message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Control {
    /// Who is on this end: the exchange that proves locality and identity.
    Hello(Hello),
    /// An ask or tell.
    Request {
        /// Matches the reply.
        id: u64,
        /// Ask or tell.
        kind: RequestKind,
        /// The actor path.
        path: String,
        /// Where the message is.
        body: Body,
    },
    /// The answer to request `id`.
    Reply {
        /// The request's id.
        id: u64,
        /// The answer.
        reply: WireReply,
    },
    /// The holder no longer has any view of these leases.
    Release {
        /// The leases.
        leases: Vec<u64>,
    },
    /// A segment of the sender's, its descriptor beside this datagram: map it (read-only) and
    /// keep it for the connection's life or until `Retire`.
    Map {
        /// The sender's id for it.
        segment: u64,
        /// Its length in bytes.
        len: u64,
    },
    /// The sender dropped a segment: no message names it again.
    Retire {
        /// The segment.
        segment: u64,
    },
    /// The holder could not map a segment (its descriptor was lost at the holder's descriptor
    /// limit): the owner announces it again when it next uses it.
    Unmapped {
        /// The segment.
        segment: u64,
    },
    /// Wakes a peer whose `sleeping` (or `blocked`) word asked for it: look at the queues.
    /// Sent on the socket without waiting (`MSG_DONTWAIT`), and only while nothing the sender
    /// sent before is unread there: an unread datagram wakes the peer's reader already.
    Bell,
}

/// The capability exchange on a new connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// `/proc/sys/kernel/random/boot_id`: same host, same boot.
    pub boot_id: String,
    /// The user namespace's inode (`/proc/self/ns/user`).
    pub user_ns: u64,
    /// The sender's user id (checked against `SO_PEERCRED`, never trusted alone).
    pub uid: u32,
    /// The sender's process id (checked against `SO_PEERCRED`).
    pub pid: u32,
    /// The sender node's TCP address, as text.
    pub node: String,
    /// The knock ticket this connection redeems (client to server; 0 from the server).
    pub ticket: u64,
    /// The TCP address the client knocked from (client to server): a ticket is redeemed only
    /// by whoever it was issued to.
    pub via: String,
    /// The ticket's secret, from the server: proof that it is the node the client knocked on
    /// over TCP (zeros from the client, which never reveals it).
    pub proof: [u8; 16],
    /// The bytes of the sender's queue ring (its memfd, beside the hello, holds a header page
    /// and then the ring).
    pub queue: u32,
}

/// Where a message's bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// A small PTM1 body carried in the datagram itself.
    Inline(Bytes),
    /// A small PTM1 body given as the slices of its encoding, as a sender builds it: written
    /// one after another they are an `Inline` body on the wire, with no copy into one buffer
    /// first. Decoding never gives it.
    InlineSlices(Vec<Bytes>),
    /// A whole PTM1 body in shared memory (messages with more parts than a datagram lists).
    Packed(Shared),
    /// The message part by part: each buffer in the datagram or in shared memory.
    Parts {
        /// The message's version.
        version: u32,
        /// Its metadata.
        metadata: Part,
        /// Its buffers, in order.
        buffers: Vec<Part>,
    },
}

/// One part of a [`Body::Parts`] message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// The bytes, in the datagram.
    Inline(Bytes),
    /// The bytes, in a segment of the sender's.
    Shared(Shared),
    /// The bytes, in a slot of the recipient's own that it lent to the sender and the sender
    /// still holds (a message sent back where it came from): the recipient checks that and
    /// uses its own memory.
    Returned(Returned),
}

/// A range of the recipient's own segment (see [`Part::Returned`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Returned {
    /// The recipient's segment.
    pub segment: u64,
    /// Where the bytes start in it.
    pub offset: u64,
    /// How many.
    pub len: u64,
}

/// A range of a sender's segment, held under a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shared {
    /// The segment (announced earlier on this connection with `Map`).
    pub segment: u64,
    /// Where the bytes start in it.
    pub offset: u64,
    /// How many.
    pub len: u64,
    /// The hand-off it belongs to: released as a whole.
    pub lease: u64,
}

/// An answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireReply {
    /// A tensor message.
    Tensor(Body),
    /// A single message, inline.
    Single {
        /// Its type.
        msg_type: String,
        /// Its data.
        data: Bytes,
    },
    /// A tell got into the mailbox.
    Ack,
    /// The request failed; the text says why (at most [`MAX_ERROR_TEXT`] bytes).
    Error(String),
}

/// Why a datagram could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid shared-memory control datagram: {0}")]
pub struct DecodeError(pub &'static str);

/// Why a message does not fit in one datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a shared-memory control datagram of {len} bytes exceeds the limit of {MAX_DATAGRAM}")]
pub struct EncodeError {
    /// The size it would have had.
    pub len: usize,
}

/// Decodes one datagram.
///
/// # Errors
///
/// [`DecodeError`] naming what is wrong: bad magic, unknown tag, a length past the end, bad
/// UTF-8, bytes left over.
pub fn decode(datagram: &[u8]) -> Result<Control, DecodeError> {
    decode_in(datagram, None)
}

/// Decodes one message that is already in memory of its own: bytes it carries (inline bodies
/// and parts, a single reply's data) are slices of `message`, not copies.
///
/// # Errors
///
/// As [`decode`].
pub fn decode_shared(message: &Bytes) -> Result<Control, DecodeError> {
    decode_in(message, Some(message))
}

fn decode_in(datagram: &[u8], owner: Option<&Bytes>) -> Result<Control, DecodeError> {
    if datagram.len() > MAX_DATAGRAM {
        return Err(DecodeError("longer than the largest datagram"));
    }
    let mut r = Reader {
        rest: datagram,
        whole: datagram,
        owner,
    };
    if r.take(4)? != MAGIC {
        return Err(DecodeError("bad magic"));
    }
    let control = match r.u8()? {
        1 => Control::Hello(Hello {
            boot_id: r.str()?,
            user_ns: r.u64()?,
            uid: r.u32()?,
            pid: r.u32()?,
            node: r.str()?,
            ticket: r.u64()?,
            via: r.str()?,
            proof: r.array()?,
            queue: r.u32()?,
        }),
        2 => Control::Request {
            id: r.u64()?,
            kind: match r.u8()? {
                0 => RequestKind::Ask,
                1 => RequestKind::Tell,
                _ => return Err(DecodeError("unknown request kind")),
            },
            path: r.str()?,
            body: r.body()?,
        },
        3 => {
            let id = r.u64()?;
            let reply = match r.u8()? {
                0 => WireReply::Tensor(r.body()?),
                1 => WireReply::Single {
                    msg_type: r.str()?,
                    data: r.owned_bytes()?,
                },
                2 => WireReply::Ack,
                3 => WireReply::Error(r.str()?),
                _ => return Err(DecodeError("unknown reply kind")),
            };
            Control::Reply { id, reply }
        }
        4 => {
            let count = r.count(8)?;
            let leases = (0..count).map(|_| r.u64()).collect::<Result<_, _>>()?;
            Control::Release { leases }
        }
        5 => Control::Map {
            segment: r.u64()?,
            len: r.u64()?,
        },
        6 => Control::Retire { segment: r.u64()? },
        7 => Control::Unmapped { segment: r.u64()? },
        8 => Control::Bell,
        _ => return Err(DecodeError("unknown message tag")),
    };
    if !r.rest.is_empty() {
        return Err(DecodeError("bytes after the message"));
    }
    Ok(control)
}

impl Body {
    /// The shared ranges it refers to, in order.
    pub fn shared(&self) -> Vec<Shared> {
        match self {
            Self::Inline(_) | Self::InlineSlices(_) => Vec::new(),
            Self::Packed(shared) => vec![*shared],
            Self::Parts {
                metadata, buffers, ..
            } => std::iter::once(metadata)
                .chain(buffers)
                .filter_map(|part| match part {
                    Part::Shared(shared) => Some(*shared),
                    Part::Inline(_) | Part::Returned(_) => None,
                })
                .collect(),
        }
    }

    /// The leases it holds, each once.
    pub fn leases(&self) -> Vec<u64> {
        let mut leases: Vec<u64> = self.shared().iter().map(|s| s.lease).collect();
        leases.sort_unstable();
        leases.dedup();
        leases
    }
}

/// `text` cut to at most `max` bytes at a character boundary, marked when cut.
fn truncated(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
