//! The knock: how a client learns, over the TCP connection it addressed, where that node's
//! shared-memory socket is and how to recognise it there.
//!
//! A peer is reached over shared memory only after it proved, on the very port the caller
//! addressed, that it is the node behind that port. The client opens a TCP connection to the
//! node's port and sends the four bytes `TWSK` (the node's acceptor tells them apart from
//! `PTR1`, a TLS ClientHello and an HTTP/2 preface); the node answers on that connection and
//! closes it:
//!
//! ```text
//! reply := "TWSK" version:u8(3) status:u8
//!          status 0 (offered):  pid:u32 uid:u32 boot_id:str8 socket:str8 ticket:u64 secret:[u8;16]
//!          status 1 (refused):  reason:str16
//! str8  := u8 length + UTF-8;  str16 := u16 length (little-endian) + UTF-8
//! ```
//!
//! `socket` is the node's abstract Unix socket name (random per node, so nobody can squat it
//! in advance). The client connects there and checks `SO_PEERCRED` against `pid` and `uid`;
//! it redeems `ticket` in its hello, and the node proves it issued it by sending `secret` back
//! (the client never sends the secret). Tickets are single-use and expire.

/// The four bytes that open a knock.
pub const KNOCK: &[u8; 4] = b"TWSK";
/// The largest reply (the acceptor's answer fits in one small write).
pub const MAX_KNOCK_REPLY: usize = 4 + 2 + 4 + 4 + 256 + 256 + 8 + 16 + 2 + 1024;
const VERSION: u8 = 3;

/// A node's answer to a knock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KnockReply {
    /// Shared memory is offered: where, and how to recognise the node there.
    Offered(Offer),
    /// Shared memory is not offered (off, or TLS required without an opt-in): why.
    Refused(String),
}

/// Where a node's shared-memory socket is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offer {
    /// The node's process id (the socket's `SO_PEERCRED` must match).
    pub pid: u32,
    /// The node's user id.
    pub uid: u32,
    /// Its boot id (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: String,
    /// The abstract socket name (without the leading NUL).
    pub socket: String,
    /// The ticket to redeem in the hello.
    pub ticket: u64,
    /// What the node sends back to prove it issued the ticket.
    pub secret: [u8; 16],
}

/// Why a knock reply could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid knock reply: {0}")]
pub struct KnockError(pub &'static str);

impl KnockReply {
    /// The reply's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(KNOCK);
        out.push(VERSION);
        match self {
            Self::Offered(offer) => {
                out.push(0);
                out.extend_from_slice(&offer.pid.to_le_bytes());
                out.extend_from_slice(&offer.uid.to_le_bytes());
                str8(&mut out, &offer.boot_id);
                str8(&mut out, &offer.socket);
                out.extend_from_slice(&offer.ticket.to_le_bytes());
                out.extend_from_slice(&offer.secret);
            }
            Self::Refused(reason) => {
                out.push(1);
                let mut end = reason.len().min(1024);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                let len = u16::try_from(end).unwrap_or(0);
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&reason.as_bytes()[..usize::from(len)]);
            }
        }
        out
    }

    /// Reads a reply. `Ok(None)`: not complete yet (read more).
    ///
    /// # Errors
    ///
    /// [`KnockError`] for anything that is not a knock reply (a peer that does not speak it
    /// answers with something else, or closes).
    pub fn decode(bytes: &[u8]) -> Result<Option<Self>, KnockError> {
        let mut r = Cursor(bytes);
        let Some(magic) = r.take(4) else {
            return Ok(None);
        };
        if magic != KNOCK {
            return Err(KnockError("not a knock reply"));
        }
        let Some(&[version, status]) = r.take(2) else {
            return Ok(None);
        };
        if version != VERSION {
            return Err(KnockError("unknown knock version"));
        }
        let reply = match status {
            0 => {
                let parsed = (|| {
                    let pid = u32::from_le_bytes(r.array()?);
                    let uid = u32::from_le_bytes(r.array()?);
                    let boot_id = r.str8()?;
                    let socket = r.str8()?;
                    let ticket = u64::from_le_bytes(r.array()?);
                    let secret = r.array()?;
                    Some((pid, uid, boot_id, socket, ticket, secret))
                })();
                let Some((pid, uid, boot_id, socket, ticket, secret)) = parsed else {
                    return Ok(None);
                };
                let (Ok(boot_id), Ok(socket)) =
                    (String::from_utf8(boot_id), String::from_utf8(socket))
                else {
                    return Err(KnockError("a name is not UTF-8"));
                };
                Self::Offered(Offer {
                    pid,
                    uid,
                    boot_id,
                    socket,
                    ticket,
                    secret,
                })
            }
            1 => {
                let Some(len) = r.array().map(u16::from_le_bytes) else {
                    return Ok(None);
                };
                let Some(reason) = r.take(usize::from(len)) else {
                    return Ok(None);
                };
                Self::Refused(String::from_utf8_lossy(reason).into_owned())
            }
            _ => return Err(KnockError("unknown knock status")),
        };
        if !r.0.is_empty() {
            return Err(KnockError("bytes after the reply"));
        }
        Ok(Some(reply))
    }
}

fn str8(out: &mut Vec<u8>, s: &str) {
    let mut end = s.len().min(255);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.push(u8::try_from(end).unwrap_or(0));
    out.extend_from_slice(&s.as_bytes()[..end]);
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Some(out)
    }
    fn str8(&mut self) -> Option<Vec<u8>> {
        let len = self.take(1)?[0];
        self.take(usize::from(len)).map(<[u8]>::to_vec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer() -> KnockReply {
        KnockReply::Offered(Offer {
            pid: 4242,
            uid: 1000,
            boot_id: "0e6d-boot".into(),
            socket: "tensorwire/3f9a".into(),
            ticket: 77,
            secret: [9; 16],
        })
    }

    #[test]
    fn replies_round_trip() {
        for reply in [offer(), KnockReply::Refused("TLS is required".into())] {
            assert_eq!(KnockReply::decode(&reply.encode()), Ok(Some(reply)));
        }
    }

    #[test]
    fn a_partial_reply_asks_for_more_at_every_split() {
        let bytes = offer().encode();
        for cut in 0..bytes.len() {
            assert_eq!(KnockReply::decode(&bytes[..cut]), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn anything_else_is_not_a_knock_reply() {
        assert!(KnockReply::decode(b"PTR1\0\0\0\0\0\0").is_err());
        assert!(
            KnockReply::decode(b"TWSK\x01\x00").is_err(),
            "version 1 (TWS2) is not this protocol"
        );
        assert!(
            KnockReply::decode(b"TWSK\x02\x00").is_err(),
            "version 2 (TWS3, eventfd doorbells) is not this protocol"
        );
        assert!(KnockReply::decode(b"TWSK\x04\x00").is_err());
        let mut trailing = offer().encode();
        trailing.push(0);
        assert!(KnockReply::decode(&trailing).is_err());
    }

    #[test]
    fn a_long_refusal_is_cut_at_a_character_boundary() {
        let reply = KnockReply::Refused("é".repeat(2000));
        let Ok(Some(KnockReply::Refused(text))) = KnockReply::decode(&reply.encode()) else {
            panic!("not decoded");
        };
        assert!(text.len() <= 1024 && text.chars().all(|c| c == 'é'));
    }
}
