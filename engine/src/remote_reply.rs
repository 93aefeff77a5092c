//! Answering an ask that arrived over the network, from the handler's thread.
//!
//! The handler thread encodes the reply and, if it is small, writes it to the socket itself
//! with one non-blocking `sendmsg`: the asker gets it without waiting for a core thread to wake
//! up, and the core is not woken at all when that write completes the reply. The core keeps a
//! receive armed for the next request meanwhile; [`ReplyProgress`] is how the two agree on
//! whether the reply is finished when that next request (or the peer's close) arrives.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tensorwire_proto::ptr1::{self, Frame};
use tensorwire_proto::{Limits, stats};

use crate::core::{Command, ConnToken, CoreHandle};
use crate::endpoint::Reply;
use crate::sys;

/// Largest reply a handler writes itself (bigger ones go through the core, with `SENDMSG_ZC`
/// where it applies and without tying up the handler).
const DIRECT_REPLY_MAX: u64 = 64 << 10;

/// Answers one ask that arrived on a server connection; held by the handler's `Replier`.
///
/// Whatever the handler could not write (a large reply, a full socket buffer) is handed to
/// the core as a command, as is a failed write. The descriptor is shared (`Arc<OwnedFd>`), so
/// the core closing the connection cannot close it (and let it be reused) under the write.
#[derive(Debug)]
pub(crate) struct RemoteReply {
    pub(crate) core: CoreHandle,
    pub(crate) token: ConnToken,
    pub(crate) fd: Arc<OwnedFd>,
    pub(crate) version: u32,
    pub(crate) limits: Limits,
    pub(crate) progress: Arc<ReplyProgress>,
}

impl RemoteReply {
    pub(crate) fn send(self, result: Result<Reply, String>) {
        let version = self.version;
        let frame = match result {
            Ok(Reply::Tensor(message)) => Frame::TensorResponse(message),
            Ok(Reply::Single { msg_type, data }) => Frame::SingleResponse {
                version,
                msg_type,
                data,
            },
            Err(text) => Frame::Error { version, text },
        };
        let token = self.token;
        let Some(encoded) = encode_reply(&frame, &self.limits) else {
            let _ = self.core.send(Command::ReplyFailed { token });
            return;
        };
        let command = if encoded.wire_len() > DIRECT_REPLY_MAX {
            Command::Reply {
                token,
                encoded,
                sent: 0,
            }
        } else {
            match sys::send_nonblocking(self.fd.as_raw_fd(), encoded.slices()) {
                Ok(sent) if crate::len_u64(sent) == encoded.wire_len() => {
                    stats::global().record_raw_frame_sent(encoded.wire_len());
                    if !self.progress.finish() {
                        return; // the core is not waiting for this: no need to wake it
                    }
                    Command::ReplySent { token }
                }
                Ok(sent) => Command::Reply {
                    token,
                    encoded,
                    sent,
                },
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Command::Reply {
                    token,
                    encoded,
                    sent: 0,
                },
                Err(_) => Command::ReplyFailed { token },
            }
        };
        let _ = self.core.send(command);
    }
}

/// Whether the handler has finished writing a reply, shared by the handler and the core.
///
/// The handler marks the reply finished after writing it all; the core, when it needs to know
/// (the next request arrived, the peer closed, a timer fired), asks and, if the reply is still
/// being written, registers that it waits. Exactly one of them sees the other's mark, so the
/// core is woken (with `Command::ReplySent`) only if it actually waits, and never missed.
/// A reply handed to the core (`Command::Reply`) or failed (`Command::ReplyFailed`) is never
/// marked finished here: those commands always reach the core.
#[derive(Debug, Default)]
pub(crate) struct ReplyProgress {
    state: AtomicU8,
    /// When the reply was finished, in nanoseconds since [`epoch`].
    finished_at: AtomicU64,
}

const WRITING: u8 = 0;
const FINISHED: u8 = 1;
const CORE_WAITS: u8 = 2;

impl ReplyProgress {
    /// Handler side: the whole reply is written. Returns whether the core waits to be told.
    fn finish(&self) -> bool {
        let nanos = u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.finished_at.store(nanos, Ordering::Relaxed);
        self.state.swap(FINISHED, Ordering::AcqRel) == CORE_WAITS
    }

    /// Core side: `true` if the reply is not finished yet, in which case a command about it
    /// (`ReplySent`, `Reply` or `ReplyFailed`) is sure to follow.
    pub(crate) fn wait_unless_finished(&self) -> bool {
        match self
            .state
            .compare_exchange(WRITING, CORE_WAITS, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(state) => state != FINISHED,
        }
    }

    /// Core side: when the handler finished writing the reply, if it did.
    pub(crate) fn finished_at(&self) -> Option<Instant> {
        (self.state.load(Ordering::Acquire) == FINISHED)
            .then(|| epoch() + Duration::from_nanos(self.finished_at.load(Ordering::Relaxed)))
    }
}

/// A fixed instant that finish times are counted from (an `Instant` does not fit an atomic).
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Encodes a reply; one over the limits becomes an Error frame saying so. `None` if not even
/// that fits the configured limits.
pub(crate) fn encode_reply(frame: &Frame, limits: &Limits) -> Option<tensorwire_proto::Encoded> {
    let version = frame.version();
    ptr1::encode(frame, limits)
        .or_else(|e| {
            let text = truncate(format!("reply could not be sent: {e}"), limits);
            ptr1::encode(&Frame::Error { version, text }, limits)
        })
        .ok()
}

/// Shortens an error text so it fits the metadata limit (at a character boundary).
fn truncate(mut text: String, limits: &Limits) -> String {
    let max = usize::try_from(limits.max_metadata_bytes())
        .unwrap_or(usize::MAX)
        .min(4096);
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_core_waits_only_for_a_reply_still_being_written() {
        let progress = ReplyProgress::default();
        assert!(progress.finished_at().is_none());
        assert!(progress.wait_unless_finished(), "nothing written yet");
        assert!(progress.wait_unless_finished(), "asking twice still waits");
        assert!(progress.finish(), "the handler must wake the waiting core");
        assert!(!progress.wait_unless_finished());
        assert!(
            progress
                .finished_at()
                .is_some_and(|at| at <= Instant::now())
        );
    }

    #[test]
    fn a_reply_finished_first_needs_no_wake_up() {
        let progress = ReplyProgress::default();
        let before = Instant::now();
        assert!(!progress.finish(), "nobody waits: no command");
        assert!(!progress.wait_unless_finished());
        let at = progress.finished_at().expect("finished");
        assert!(at + Duration::from_millis(1) >= before && at <= Instant::now());
    }

    #[test]
    fn exactly_one_side_sees_the_other_under_contention() {
        for _ in 0..2_000 {
            let progress = Arc::new(ReplyProgress::default());
            let handler = {
                let progress = Arc::clone(&progress);
                std::thread::spawn(move || progress.finish())
            };
            let core_waits = progress.wait_unless_finished();
            let handler_wakes = handler.join().expect("handler thread");
            // The core waits exactly when the handler will wake it.
            assert_eq!(core_waits, handler_wakes);
        }
    }
}
