//! A reply's buffers that the handler may change once `reply()` returned (its own writable
//! arrays) must not be read by the transport after that: the rule of `docs/python.md` ("a
//! handler may rewrite the array it replied from for the next request") on every path. The
//! in-process path copies them; shared memory copies them into a slot (a large reply on the
//! node's copy thread), PTR1 and HTTP/2 write them, after `reply()` handed them over. So for those paths a buffer below 1 MiB
//! is copied at once, and a larger one is handed to the transport through a tracked owner, and
//! `reply()` waits until the transport dropped every such owner (the bytes are written, or the
//! connection is gone). `reply_nowait()` (what coroutine handlers use) copies them all.
//!
//! What this does not do: it does not wait for immutable buffers (`bytes`, read-only arrays,
//! frozen loans), for `lend=True` messages (the sender promised to leave them unchanged), or
//! for a received message replied with as it is before anyone looked at its buffers (sealed
//! read-only: nothing can write them).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_engine::{Replier, Reply};

use crate::sync::lock;

/// Buffers smaller than this are copied rather than waited for: the copy (with the GIL
/// released) lets the handler go on at once, where a wait lasts the whole write and a
/// wake-up. A coroutine handler never waits ([`usize::MAX`]): its event loop must not block.
pub(crate) const WAIT_FROM: usize = 1 << 20;

/// How long `reply()` waits for the transport at most; past it, it returns and says so.
const WAIT_AT_MOST: Duration = Duration::from_secs(60);

/// Hands `result` to the transport, then waits until it is done with the reply's tracked
/// buffers, if any (see the module's docs). Call without the GIL.
pub(crate) fn reply_then_wait(
    replier: Replier,
    result: Result<Reply, String>,
    settled: Option<Arc<Settled>>,
) {
    replier.reply(result);
    if let Some(settled) = settled {
        settled.wait();
    }
}

/// Counts the tracked owners the transport still holds.
#[derive(Default)]
pub(crate) struct Settled {
    held: Mutex<usize>,
    released: Condvar,
}

impl Settled {
    /// `bytes` as the transport gets it: the same memory, through an owner counted here.
    pub(crate) fn track(self: &Arc<Self>, bytes: Bytes) -> Bytes {
        *lock(&self.held) += 1;
        Bytes::from_owner(Tracked {
            bytes,
            settled: Arc::clone(self),
        })
    }

    /// Waits until the transport dropped every tracked owner (at most [`WAIT_AT_MOST`]).
    /// Call without the GIL.
    pub(crate) fn wait(&self) {
        let until = Instant::now() + WAIT_AT_MOST;
        let mut held = lock(&self.held);
        while *held > 0 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    buffers = *held,
                    "a reply's buffers were still being sent after 60 s; reply() returns: \
                     changing them now may change what the peer receives"
                );
                return;
            }
            held = self
                .released
                .wait_timeout(held, left)
                .map_or_else(|e| e.into_inner().0, |(guard, _)| guard);
        }
    }
}

/// The owner of a tracked buffer's `Bytes`.
struct Tracked {
    bytes: Bytes,
    settled: Arc<Settled>,
}

impl AsRef<[u8]> for Tracked {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut held = lock(&self.settled.held);
        *held = held.saturating_sub(1);
        if *held == 0 {
            self.settled.released.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_ends_when_the_last_tracked_owner_drops() {
        let settled = Arc::new(Settled::default());
        let memory = Bytes::from(vec![7u8; 100]);
        let sent = settled.track(memory.clone());
        let clone = sent.slice(10..20);
        assert_eq!(
            sent.as_ptr(),
            memory.as_ptr(),
            "the same memory, not a copy"
        );
        drop(sent);
        assert_eq!(*lock(&settled.held), 1, "a slice still holds it");
        let waiter = {
            let settled = Arc::clone(&settled);
            std::thread::spawn(move || settled.wait())
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(!waiter.is_finished(), "waits while the transport holds it");
        drop(clone);
        waiter.join().unwrap();
    }
}
