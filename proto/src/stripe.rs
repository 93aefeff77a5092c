//! Striping: one large request carried over several connections to the same peer, each stripe
//! received straight into its place in the request's final memory.
//!
//! It is an extension of PTR1 that only peers which said they know it ever see:
//!
//! 1. **Capabilities.** Before it stripes to a peer, a client asks it an ordinary PTR1 Ask to
//!    [`CAPABILITIES_PATH`] with an empty message. A tensorwire peer answers a SingleResponse
//!    of type [`CAPABILITIES_TYPE`] whose data is [`capabilities_reply`]'s text: its
//!    [`Capabilities`] if it takes stripes, and always how many requests it reads ahead on a
//!    connection (`pipeline=N`, [`pipeline_depth`]). A peer that takes no stripes, or any other
//!    peer (which answers what it answers an Ask to an endpoint it does not have: an Error
//!    frame), is sent whole frames, as before. Nothing but a plain Ask ever reaches a peer that
//!    has not answered the capability.
//! 2. **Stripes.** Every buffer of the request that is long enough is cut into `count` parts
//!    by [`part`] (page-aligned, the same rule on both sides). Stripe `k` is a Tell frame with
//!    [`EXTENSION_STRIPE`] in its extension byte (the first reserved byte of the PTR1 header),
//!    its [`StripeDescriptor`] as text in the path slot, no metadata, and part `k` of each cut
//!    buffer as its buffers, each on a connection of its own. The receiver answers each with
//!    an Ack once its bytes are in place.
//! 3. **The request.** Once every stripe is acknowledged, the client sends the request itself:
//!    an Ask or Tell frame with [`EXTENSION_STRIPED`], the actor path, the request's metadata,
//!    and as buffers a [`StripedHeader`] followed by the buffers that were not cut. The
//!    receiver puts the message back together from the stripes it holds (no copy: the parts
//!    were received into one allocation per buffer) and delivers it like any request.
//!
//! Because the request goes last, a request whose stripes did not all arrive is never
//! delivered: the client fails the call when a stripe fails (and never sends the request), and
//! a receiver that is missing a stripe answers the request with an Error.

use std::fmt::Write as _;
use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};

use crate::len::len_u64;
use crate::message::TensorMessage;

/// Extension byte of a stripe frame (a Tell carrying parts of a request's buffers).
pub const EXTENSION_STRIPE: u8 = 1;
/// Extension byte of a striped request (an Ask or Tell whose cut buffers came as stripes).
pub const EXTENSION_STRIPED: u8 = 2;

/// The path a client asks for a peer's capabilities.
pub const CAPABILITIES_PATH: &str = "/_tensorwire/capabilities";
/// The message type of the capabilities reply.
pub const CAPABILITIES_TYPE: &str = "tensorwire/capabilities";

/// Most stripes one request is cut into.
pub const MAX_STRIPES: u16 = 64;
/// A buffer is cut only if every stripe gets at least this many of its bytes.
pub const MIN_PART: usize = 64 << 10;
/// Most buffers of one request that are cut (the rest travel in the request frame).
pub const MAX_CUT_BUFFERS: usize = 1024;
/// Parts start at multiples of this (a page: no two stripes write into one page).
pub const PART_ALIGN: usize = 4096;

/// How an outbound request travels ([`crate::transport::OutboundRequest::framing`]); set by
/// the node that plans the stripes, encoded by the driver.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Framing {
    /// A plain Ask or Tell frame.
    #[default]
    Whole,
    /// A stripe: a Tell with [`EXTENSION_STRIPE`], this descriptor as its path, the parts as
    /// its buffers (the request's path is not sent).
    Stripe(StripeDescriptor),
    /// A striped request: an Ask or Tell with [`EXTENSION_STRIPED`] (its message starts with
    /// the [`StripedHeader`]).
    Striped,
    /// The capabilities query: a plain Ask to [`CAPABILITIES_PATH`] (the request's path is
    /// not sent).
    Capabilities,
}

/// What a peer says it supports, as the data of the capabilities reply: `stripes=1
/// max-stripes=N` (space-separated `key=value` pairs; unknown keys are ignored).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Most stripes the peer takes for one request (1: it takes none).
    pub max_stripes: u16,
}

impl Capabilities {
    /// The reply data.
    pub fn encode(&self) -> Bytes {
        Bytes::from(format!("stripes=1 max-stripes={}", self.max_stripes))
    }

    /// Reads a capabilities reply; `None` if it does not say the peer takes stripes.
    pub fn parse(data: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(data).ok()?;
        let mut stripes = false;
        let mut max_stripes = None;
        for pair in text.split_ascii_whitespace() {
            match pair.split_once('=') {
                Some(("stripes", "1")) => stripes = true,
                Some(("max-stripes", n)) => max_stripes = n.parse::<u16>().ok(),
                _ => {}
            }
        }
        let max_stripes = max_stripes?.min(MAX_STRIPES);
        (stripes && max_stripes >= 2).then_some(Self { max_stripes })
    }
}

/// The capabilities reply's data: `stripes` as [`Capabilities::encode`] says (when the peer
/// takes stripes), then `pipeline=N` — how many requests it reads ahead of its replies on one
/// connection (a client may keep that many in flight on it; more only wait in the socket).
pub fn capabilities_reply(stripes: Option<Capabilities>, pipeline: u16) -> Bytes {
    match stripes {
        Some(stripes) => {
            let mut text = String::from_utf8_lossy(&stripes.encode()).into_owned();
            let _ = write!(text, " pipeline={pipeline}");
            Bytes::from(text)
        }
        None => Bytes::from(format!("pipeline={pipeline}")),
    }
}

/// How many requests a peer's capabilities reply says it reads ahead on one connection
/// (`pipeline=N`, N ≥ 2); `None` if it says nothing of it (then one request at a time).
pub fn pipeline_depth(data: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(data).ok()?;
    text.split_ascii_whitespace()
        .find_map(|pair| match pair.split_once('=') {
            Some(("pipeline", n)) => n.parse::<u16>().ok(),
            _ => None,
        })
        .filter(|depth| *depth >= 2)
}

/// Identifies one striped request among everything a receiver holds: 128 random bits chosen
/// by the sender, so no other client can guess it and write into its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Token(pub [u8; 16]);

impl Token {
    fn to_hex(self) -> String {
        self.0.iter().fold(String::with_capacity(32), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
    }

    fn from_hex(text: &str) -> Option<Self> {
        if text.len() != 32 || !text.is_ascii() {
            return None;
        }
        let mut token = [0; 16];
        for (i, byte) in token.iter_mut().enumerate() {
            *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Self(token))
    }
}

/// Part `index` of a buffer of `len` bytes cut into `count` stripes: each part but the last
/// is `len / count` rounded up to [`PART_ALIGN`]; a part past the end is empty.
pub fn part(len: usize, count: u16, index: u16) -> Range<usize> {
    let count = usize::from(count.max(1));
    let size = len
        .div_ceil(count)
        .div_ceil(PART_ALIGN)
        .saturating_mul(PART_ALIGN)
        .max(PART_ALIGN);
    let start = size.saturating_mul(usize::from(index)).min(len);
    start..start.saturating_add(size).min(len)
}

/// Whether a buffer of `len` bytes is cut into `count` stripes.
pub fn is_cut(len: usize, count: u16) -> bool {
    count >= 2 && len >= MIN_PART.saturating_mul(usize::from(count))
}

/// One buffer part in a stripe: which buffer of the request, and that buffer's whole length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The buffer's index in the request.
    pub buffer: u32,
    /// The buffer's whole length (the part's range follows from it by [`part`]).
    pub buffer_len: u64,
}

/// What a stripe frame carries, in its path slot as text:
/// `tw-stripe/1 TOKEN INDEX COUNT BUFFER:LEN …` (token as 32 hex digits; one `BUFFER:LEN` per
/// non-empty part, in the order of the frame's buffers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripeDescriptor {
    /// The request the stripe belongs to.
    pub token: Token,
    /// This stripe's number, below `count`.
    pub index: u16,
    /// Stripes of the request.
    pub count: u16,
    /// The parts in this stripe, in the frame's buffer order.
    pub pieces: Vec<Piece>,
}

const STRIPE_TAG: &str = "tw-stripe/1";

impl StripeDescriptor {
    /// The path slot text.
    pub fn to_path(&self) -> String {
        let mut out = format!(
            "{STRIPE_TAG} {} {} {}",
            self.token.to_hex(),
            self.index,
            self.count
        );
        for piece in &self.pieces {
            let _ = write!(out, " {}:{}", piece.buffer, piece.buffer_len);
        }
        out
    }

    /// Reads and checks a stripe frame's path slot against the frame's buffer lengths: the
    /// stripe's number fits its count, the count is 2..=[`MAX_STRIPES`], buffers ascend, and
    /// every buffer length is what [`part`] gives for that buffer's part.
    ///
    /// # Errors
    ///
    /// A text saying what is wrong (sent to the peer as an Error frame).
    pub fn parse(path: &str, buffer_lens: &[usize]) -> Result<Self, String> {
        let bad = |what: &str| format!("invalid stripe descriptor: {what}");
        let mut words = path.split(' ');
        if words.next() != Some(STRIPE_TAG) {
            return Err(bad("unknown tag"));
        }
        let token = words
            .next()
            .and_then(Token::from_hex)
            .ok_or_else(|| bad("token"))?;
        let mut number = |what| {
            words
                .next()
                .and_then(|w| w.parse::<u16>().ok())
                .ok_or_else(|| bad(what))
        };
        let index = number("stripe number")?;
        let count = number("stripe count")?;
        if !(2..=MAX_STRIPES).contains(&count) || index >= count {
            return Err(bad("stripe number or count out of range"));
        }
        let mut pieces = Vec::with_capacity(buffer_lens.len());
        for word in words {
            let (buffer, len) = word.split_once(':').ok_or_else(|| bad("piece"))?;
            let buffer = buffer.parse::<u32>().map_err(|_| bad("buffer index"))?;
            let buffer_len = len.parse::<u64>().map_err(|_| bad("buffer length"))?;
            if pieces.last().is_some_and(|p: &Piece| p.buffer >= buffer) {
                return Err(bad("buffers out of order"));
            }
            pieces.push(Piece { buffer, buffer_len });
            if pieces.len() > buffer_lens.len() {
                return Err(bad("more pieces than buffers"));
            }
        }
        if pieces.len() != buffer_lens.len() || pieces.is_empty() {
            return Err(bad("pieces and buffers differ"));
        }
        for (piece, &len) in pieces.iter().zip(buffer_lens) {
            let whole = usize::try_from(piece.buffer_len).map_err(|_| bad("buffer length"))?;
            if !is_cut(whole, count) || part(whole, count, index).len() != len || len == 0 {
                return Err(bad("a part's length does not match its buffer"));
            }
        }
        Ok(Self {
            token,
            index,
            count,
            pieces,
        })
    }
}

/// How each buffer of a striped request travels: in the request frame, or cut into stripes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferPlace {
    /// The next buffer of the request frame (after the header).
    Inline,
    /// Cut into the stripes; its whole length.
    Cut(u64),
}

/// The first buffer of a striped request: its token, stripe count and where each of the
/// request's buffers is. Binary: `"TWSH"`, version `1`, token (16 bytes), count (u16 LE),
/// buffer count (u32 LE), then per buffer a place byte (0 inline, 1 cut) and, for a cut one,
/// its length (u64 LE).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripedHeader {
    /// The request's stripes' token.
    pub token: Token,
    /// Its stripe count.
    pub count: u16,
    /// Every buffer of the request, in order.
    pub buffers: Vec<BufferPlace>,
}

const HEADER_MAGIC: &[u8; 4] = b"TWSH";

impl StripedHeader {
    /// The header's bytes.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(27 + self.buffers.len() * 9);
        out.put_slice(HEADER_MAGIC);
        out.put_u8(1);
        out.put_slice(&self.token.0);
        out.put_u16_le(self.count);
        out.put_u32_le(u32::try_from(self.buffers.len()).unwrap_or(u32::MAX));
        for place in &self.buffers {
            match place {
                BufferPlace::Inline => out.put_u8(0),
                BufferPlace::Cut(len) => {
                    out.put_u8(1);
                    out.put_u64_le(*len);
                }
            }
        }
        out.freeze()
    }

    /// Reads a header; checks that it is exactly as long as it says, that the count is in
    /// range, that `inline` buffers follow it in the frame, and that every cut buffer is long
    /// enough to be cut.
    ///
    /// # Errors
    ///
    /// A text saying what is wrong.
    pub fn parse(bytes: &[u8], inline: usize) -> Result<Self, String> {
        let bad = |what: &str| format!("invalid striped request header: {what}");
        let rest = bytes
            .strip_prefix(HEADER_MAGIC.as_slice())
            .and_then(|rest| rest.strip_prefix(&[1]))
            .ok_or_else(|| bad("magic or version"))?;
        let (token, rest) = rest.split_at_checked(16).ok_or_else(|| bad("truncated"))?;
        let (count, rest) = rest.split_at_checked(2).ok_or_else(|| bad("truncated"))?;
        let (n, mut rest) = rest.split_at_checked(4).ok_or_else(|| bad("truncated"))?;
        let count = u16::from_le_bytes([count[0], count[1]]);
        let n = u32::from_le_bytes([n[0], n[1], n[2], n[3]]);
        if !(2..=MAX_STRIPES).contains(&count) {
            return Err(bad("stripe count out of range"));
        }
        // Each entry takes at least one byte: the count is bounded by what arrived.
        if usize::try_from(n).map_or(true, |n| n > rest.len()) {
            return Err(bad("buffer count"));
        }
        let mut buffers = Vec::new();
        let mut cut = 0;
        for _ in 0..n {
            let (&place, tail) = rest.split_first().ok_or_else(|| bad("truncated"))?;
            rest = tail;
            match place {
                0 => buffers.push(BufferPlace::Inline),
                1 => {
                    let (len, tail) = rest.split_at_checked(8).ok_or_else(|| bad("truncated"))?;
                    rest = tail;
                    let mut le = [0; 8];
                    le.copy_from_slice(len);
                    let len = u64::from_le_bytes(le);
                    if usize::try_from(len).map_or(true, |len| !is_cut(len, count)) {
                        return Err(bad("a cut buffer is too short to be cut"));
                    }
                    cut += 1;
                    buffers.push(BufferPlace::Cut(len));
                }
                _ => return Err(bad("unknown buffer place")),
            }
        }
        if !rest.is_empty() {
            return Err(bad("trailing bytes"));
        }
        if cut == 0 || cut > MAX_CUT_BUFFERS {
            return Err(bad("cut buffer count"));
        }
        if buffers.len() - cut != inline {
            return Err(bad("inline buffers do not match the frame"));
        }
        let mut array = [0; 16];
        array.copy_from_slice(token);
        Ok(Self {
            token: Token(array),
            count,
            buffers,
        })
    }

    /// The request with its cut buffers back in place: `main` is the striped request's message
    /// (header first, then the inline buffers), `cut` the cut buffers in order.
    ///
    /// # Errors
    ///
    /// A text if the counts or lengths do not match.
    pub fn rebuild(&self, main: TensorMessage, cut: Vec<Bytes>) -> Result<TensorMessage, String> {
        let mut inline = main.buffers.into_iter().skip(1);
        let mut cut = cut.into_iter();
        let mut buffers = Vec::with_capacity(self.buffers.len());
        for place in &self.buffers {
            let buffer = match place {
                BufferPlace::Inline => inline.next(),
                BufferPlace::Cut(len) => cut.next().filter(|b| len_u64(b.len()) == *len),
            };
            buffers.push(buffer.ok_or("a striped request's buffers do not match its stripes")?);
        }
        Ok(TensorMessage::new(main.version, main.metadata, buffers))
    }
}

/// A striped request, ready to send: `stripes[k]` is the descriptor and the parts of stripe
/// `k` (send each as a Tell with [`EXTENSION_STRIPE`], the descriptor's text as its path),
/// then `request` (with [`EXTENSION_STRIPED`]) once every stripe was acknowledged.
#[derive(Debug)]
pub struct Plan {
    /// Each stripe's descriptor and message (no metadata; the parts as buffers).
    pub stripes: Vec<(StripeDescriptor, TensorMessage)>,
    /// The request frame's message: the header, then the buffers not cut.
    pub request: TensorMessage,
}

/// Cuts `message` into `count` stripes under `token`; `None` if no buffer is long enough
/// (send it whole). The parts are slices of the message's buffers: nothing is copied.
pub fn plan(message: &TensorMessage, count: u16, token: Token) -> Option<Plan> {
    let count = count.min(MAX_STRIPES);
    let mut places = Vec::with_capacity(message.buffers.len());
    let mut inline = Vec::new();
    let mut cut = Vec::new();
    for (index, buffer) in message.buffers.iter().enumerate() {
        if cut.len() < MAX_CUT_BUFFERS && is_cut(buffer.len(), count) {
            places.push(BufferPlace::Cut(len_u64(buffer.len())));
            cut.push((u32::try_from(index).ok()?, buffer));
        } else {
            places.push(BufferPlace::Inline);
            inline.push(buffer.clone());
        }
    }
    if cut.is_empty() {
        return None;
    }
    let stripes = (0..count)
        .map(|index| {
            let (pieces, parts): (Vec<Piece>, Vec<Bytes>) = cut
                .iter()
                .filter_map(|(buffer, bytes)| {
                    let range = part(bytes.len(), count, index);
                    (!range.is_empty()).then(|| {
                        let piece = Piece {
                            buffer: *buffer,
                            buffer_len: len_u64(bytes.len()),
                        };
                        (piece, bytes.slice(range))
                    })
                })
                .unzip();
            let descriptor = StripeDescriptor {
                token,
                index,
                count,
                pieces,
            };
            (descriptor, TensorMessage::new(0, Bytes::new(), parts))
        })
        .filter(|(descriptor, _)| !descriptor.pieces.is_empty())
        .collect();
    let header = StripedHeader {
        token,
        count,
        buffers: places,
    };
    let buffers = std::iter::once(header.encode()).chain(inline).collect();
    Some(Plan {
        stripes,
        request: TensorMessage::new(message.version, message.metadata.clone(), buffers),
    })
}

#[cfg(test)]
mod tests;
