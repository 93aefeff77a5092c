//! A server connection's replies on their way out: queued in the order of their requests,
//! handed to the driver together when several are ready, and bounded, so a client that
//! pipelines and does not read holds little.

use std::collections::VecDeque;

use crate::encode::Encoded;
use crate::len::len_u64;
use crate::session::transmit::Transmit;
use crate::stats;

/// Past this many replies not yet written, a pipelining client's next request is not read
/// until they are out.
pub(crate) const PIPELINED_REPLIES: usize = 64;
/// Past this many bytes of replies not yet written, likewise (a reply this large alone is
/// written before the next request is read, as for a client that does not pipeline).
pub(crate) const PIPELINED_REPLY_BYTES: u64 = 1 << 20;
/// Ready replies are handed out together up to this many bytes (one at least).
const COALESCED_BYTES: u64 = 256 << 10;

/// Replies queued and being written.
#[derive(Debug, Default)]
pub(super) struct Replies {
    /// Ready for the next transmit, in the order of their requests.
    queued: VecDeque<Encoded>,
    /// Their bytes.
    queued_bytes: u64,
    /// Handed to the driver in one transmit and being written.
    writing: Option<Writing>,
}

#[derive(Debug)]
struct Writing {
    remaining: u64,
    /// Replies in it and their bytes (counted as sent once all are written).
    frames: usize,
    bytes: u64,
}

impl Replies {
    /// Queues a reply after those before it.
    pub(super) fn push(&mut self, reply: Encoded) {
        self.queued_bytes += reply.wire_len();
        self.queued.push_back(reply);
    }

    /// The replies to write next — every one ready, up to [`COALESCED_BYTES`] together (one
    /// at least) — unless none is ready or some are still being written.
    pub(super) fn transmit(&mut self) -> Option<Transmit> {
        if self.writing.is_some() || self.queued.is_empty() {
            return None;
        }
        let mut count = 0;
        let mut bytes = 0;
        for reply in &self.queued {
            let len = reply.wire_len();
            if count > 0 && bytes + len > COALESCED_BYTES {
                break;
            }
            bytes += len;
            count += 1;
        }
        let mut replies = self.queued.drain(..count);
        let first = replies.next()?;
        let transmit = Transmit::frames(first, replies);
        self.queued_bytes -= bytes;
        self.writing = Some(Writing {
            remaining: bytes,
            frames: count,
            bytes,
        });
        Some(transmit)
    }

    /// `n` more bytes of the transmit were written; `true` once all of it is (each reply is
    /// then counted as sent).
    pub(super) fn written(&mut self, n: u64) -> bool {
        let Some(writing) = &mut self.writing else {
            return false;
        };
        writing.remaining = writing.remaining.saturating_sub(n);
        if writing.remaining > 0 {
            return false;
        }
        stats::global().record_raw_frames_sent(len_u64(writing.frames), writing.bytes);
        self.writing = None;
        true
    }

    /// Whether no reply is queued or being written.
    pub(super) fn is_empty(&self) -> bool {
        self.queued.is_empty() && self.writing.is_none()
    }

    /// Whether a transmit is being written.
    pub(super) fn is_writing(&self) -> bool {
        self.writing.is_some()
    }

    /// Whether the replies not yet written reach a pipelining bound: no request is read until
    /// they are out.
    pub(super) fn full(&self) -> bool {
        let (count, bytes) = self
            .writing
            .as_ref()
            .map_or((0, 0), |w| (w.frames, w.remaining));
        count + self.queued.len() >= PIPELINED_REPLIES
            || bytes + self.queued_bytes >= PIPELINED_REPLY_BYTES
    }
}
