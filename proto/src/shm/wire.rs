//! The same-host control protocol: one `SOCK_SEQPACKET` datagram per message, file descriptors
//! beside it (`SCM_RIGHTS`). Payload travels in the memfds, and a datagram only says where
//! (which descriptor, which lease, which range) — except bodies of at most 32 KiB (`Inline`), cheaper
//! to copy through the socket than to map.
//!
//! ```text
//! datagram := "TWS1" tag:u8 fields…          little-endian; strings and byte strings are
//!                                            u32 length + bytes; lists are u32 count + items
//! Hello   (1) boot_id:str user_ns:u64 uid:u32 pid:u32 node:str
//! Request (2) id:u64 kind:u8(0 ask,1 tell) path:str body:BodyRef
//! Reply   (3) id:u64 reply:WireReply
//! Release (4) leases:[u64]
//! BodyRef := 0 Packed  fd:u8 lease:u64 len:u64           a PTM1 body at offset 0 of that fd
//!          | 1 Direct  version:u32 metadata:bytes segments:[fd:u8 lease:u64 offset:u64 len:u64]
//!          | 2 Inline  body:bytes                          a small PTM1 body in the datagram
//! WireReply := 0 Tensor BodyRef | 1 Single msg_type:str data:bytes | 2 Ack | 3 Error text:str
//! ```
//!
//! Decoding takes untrusted bytes: every length is checked against what is left before
//! anything is allocated, and nothing panics.

use bytes::Bytes;

use crate::transport::RequestKind;

/// The largest datagram either side sends or accepts.
pub const MAX_DATAGRAM: usize = 64 << 10;
/// Descriptors one datagram may carry (the kernel's `SCM_MAX_FD` is 253).
pub const MAX_FDS: usize = 250;
const MAGIC: &[u8; 4] = b"TWS1";

/// One control message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Control {
    /// Who is on this end: the capability exchange that proves locality.
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
        body: BodyRef,
    },
    /// The answer to request `id`.
    Reply {
        /// The request's id.
        id: u64,
        /// The answer.
        reply: WireReply,
    },
    /// The holder no longer maps these leases.
    Release {
        /// The leases.
        leases: Vec<u64>,
    },
}

/// The capability exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// `/proc/sys/kernel/random/boot_id`: same host, same boot.
    pub boot_id: String,
    /// The user namespace's inode (`/proc/self/ns/user`).
    pub user_ns: u64,
    /// The sender's user id.
    pub uid: u32,
    /// The sender's process id.
    pub pid: u32,
    /// The node's TCP address, as text: it must be the node the peer meant.
    pub node: String,
}

/// Where a message's bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BodyRef {
    /// A whole PTM1 body at offset 0 of descriptor `fd` (copied in by the sender).
    Packed {
        /// Index of the descriptor in the datagram.
        fd: u8,
        /// The lease to release when done.
        lease: u64,
        /// The body's length.
        len: u64,
    },
    /// A small PTM1 body carried in the datagram itself (below a few pages, mapping memory
    /// costs more than copying it through the socket).
    Inline(Bytes),
    /// Buffers that stayed where they were (loaned slots): no copy.
    Direct {
        /// The message's version.
        version: u32,
        /// The metadata, inline.
        metadata: Bytes,
        /// Each buffer, in order.
        segments: Vec<Segment>,
    },
}

/// One buffer of a [`BodyRef::Direct`] message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Index of the descriptor in the datagram.
    pub fd: u8,
    /// The lease to release when done.
    pub lease: u64,
    /// Where the buffer starts in the file.
    pub offset: u64,
    /// Its length.
    pub len: u64,
}

/// An answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireReply {
    /// A tensor message.
    Tensor(BodyRef),
    /// A single message, inline.
    Single {
        /// Its type.
        msg_type: String,
        /// Its data.
        data: Bytes,
    },
    /// A tell got into the mailbox.
    Ack,
    /// The request failed; the text says why.
    Error(String),
}

/// Why a datagram could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid shared-memory control datagram: {0}")]
pub struct DecodeError(pub &'static str);

/// Encodes a message.
pub fn encode(control: &Control) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(128));
    w.0.extend_from_slice(MAGIC);
    match control {
        Control::Hello(h) => {
            w.u8(1);
            w.str(&h.boot_id);
            w.u64(h.user_ns);
            w.u32(h.uid);
            w.u32(h.pid);
            w.str(&h.node);
        }
        Control::Request {
            id,
            kind,
            path,
            body,
        } => {
            w.u8(2);
            w.u64(*id);
            w.u8(match kind {
                RequestKind::Ask => 0,
                RequestKind::Tell => 1,
            });
            w.str(path);
            w.body(body);
        }
        Control::Reply { id, reply } => {
            w.u8(3);
            w.u64(*id);
            match reply {
                WireReply::Tensor(body) => {
                    w.u8(0);
                    w.body(body);
                }
                WireReply::Single { msg_type, data } => {
                    w.u8(1);
                    w.str(msg_type);
                    w.bytes(data);
                }
                WireReply::Ack => w.u8(2),
                WireReply::Error(text) => {
                    w.u8(3);
                    w.str(text);
                }
            }
        }
        Control::Release { leases } => {
            w.u8(4);
            w.len(leases.len());
            for lease in leases {
                w.u64(*lease);
            }
        }
    }
    w.0
}

/// Decodes one datagram.
///
/// # Errors
///
/// [`DecodeError`] naming what is wrong: bad magic, unknown tag, a length past the end, bad
/// UTF-8, bytes left over.
pub fn decode(datagram: &[u8]) -> Result<Control, DecodeError> {
    if datagram.len() > MAX_DATAGRAM {
        return Err(DecodeError("longer than the largest datagram"));
    }
    let mut r = Reader(datagram);
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
                    data: Bytes::copy_from_slice(r.bytes()?),
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
        _ => return Err(DecodeError("unknown message tag")),
    };
    if !r.0.is_empty() {
        return Err(DecodeError("bytes after the message"));
    }
    Ok(control)
}

impl BodyRef {
    /// The descriptor indexes it refers to.
    pub fn fds(&self) -> Vec<u8> {
        match self {
            Self::Inline(_) => Vec::new(),
            Self::Packed { fd, .. } => vec![*fd],
            Self::Direct { segments, .. } => segments.iter().map(|s| s.fd).collect(),
        }
    }

    /// The leases it holds.
    pub fn leases(&self) -> Vec<u64> {
        match self {
            Self::Inline(_) => Vec::new(),
            Self::Packed { lease, .. } => vec![*lease],
            Self::Direct { segments, .. } => segments.iter().map(|s| s.lease).collect(),
        }
    }
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn len(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }
    fn bytes(&mut self, b: &[u8]) {
        self.len(b.len());
        self.0.extend_from_slice(b);
    }
    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    fn body(&mut self, body: &BodyRef) {
        match body {
            BodyRef::Packed { fd, lease, len } => {
                self.u8(0);
                self.u8(*fd);
                self.u64(*lease);
                self.u64(*len);
            }
            BodyRef::Inline(body) => {
                self.u8(2);
                self.bytes(body);
            }
            BodyRef::Direct {
                version,
                metadata,
                segments,
            } => {
                self.u8(1);
                self.u32(*version);
                self.bytes(metadata);
                self.len(segments.len());
                for s in segments {
                    self.u8(s.fd);
                    self.u64(s.lease);
                    self.u64(s.offset);
                    self.u64(s.len);
                }
            }
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.0.len() {
            return Err(DecodeError("a field runs past the end"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }
    /// A list count whose items take at least `item` bytes each: checked against what is left
    /// before anything is allocated.
    fn count(&mut self, item: usize) -> Result<usize, DecodeError> {
        let count = usize::try_from(self.u32()?).map_err(|_| DecodeError("count too large"))?;
        if count.saturating_mul(item) > self.0.len() {
            return Err(DecodeError("a list runs past the end"));
        }
        Ok(count)
    }
    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = usize::try_from(self.u32()?).map_err(|_| DecodeError("length too large"))?;
        self.take(len)
    }
    fn str(&mut self) -> Result<String, DecodeError> {
        std::str::from_utf8(self.bytes()?)
            .map(str::to_owned)
            .map_err(|_| DecodeError("a string is not UTF-8"))
    }
    fn body(&mut self) -> Result<BodyRef, DecodeError> {
        match self.u8()? {
            0 => Ok(BodyRef::Packed {
                fd: self.u8()?,
                lease: self.u64()?,
                len: self.u64()?,
            }),
            1 => {
                let version = self.u32()?;
                let metadata = Bytes::copy_from_slice(self.bytes()?);
                let count = self.count(25)?;
                let segments = (0..count)
                    .map(|_| {
                        Ok(Segment {
                            fd: self.u8()?,
                            lease: self.u64()?,
                            offset: self.u64()?,
                            len: self.u64()?,
                        })
                    })
                    .collect::<Result<_, DecodeError>>()?;
                Ok(BodyRef::Direct {
                    version,
                    metadata,
                    segments,
                })
            }
            2 => Ok(BodyRef::Inline(Bytes::copy_from_slice(self.bytes()?))),
            _ => Err(DecodeError("unknown body kind")),
        }
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
