//! The core's operations: putting them in the ring, and dispatching each completion to what
//! it completes (the core's accept and wake-up, or a connection's connect, receive or send).

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::cqueue;

use super::Core;
use crate::uring::op::{Accept, Op, OpEntry, OpKey, Owner, Read};

/// Pause before re-arming an accept that failed (for instance out of file descriptors).
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(100);

/// How long a failed core waits for the kernel to end its accept ([`Core::release_accept`]).
const ACCEPT_RELEASE_WAIT: Duration = Duration::from_millis(200);

impl Core {
    /// Dispatches one completion to what it completes: a connection's operation to the
    /// connection, the core's own (its accept, its wake-up read, cancels) here.
    pub(super) fn on_completion(&mut self, key: OpKey, res: i32, flags: u32) {
        let Some(entry) = self.ops.get_mut(key) else {
            return; // cannot happen: an operation leaves the slab only after its last completion
        };
        let Owner::Conn(conn) = entry.owner else {
            return self.on_own_completion(key, res, flags);
        };
        match self.ops.get_mut(key).map(|entry| &entry.op) {
            Some(Op::Connect(_)) => {
                self.ops.remove(key);
                self.on_connected(conn, res);
            }
            Some(Op::Recv(_)) => {
                if let Some(Op::Recv(op)) = self.ops.remove(key).map(|entry| entry.op) {
                    self.on_received(conn, op.into_buf(), res);
                }
            }
            Some(Op::Send(_)) => self.on_sent(key, conn, res, flags),
            _ => {
                self.ops.remove(key); // not reached: connections own no other operation
            }
        }
    }

    /// A completion of one of the core's own operations.
    fn on_own_completion(&mut self, key: OpKey, res: i32, flags: u32) {
        match self.ops.get_mut(key).map(|entry| &entry.op) {
            Some(Op::Accept(accept)) => {
                let multishot = accept.is_multishot();
                if !cqueue::more(flags) {
                    self.ops.remove(key);
                    self.accept = None;
                    self.accept_ended(res, multishot);
                }
                self.on_accept(res);
            }
            Some(Op::Read(_)) => {
                self.ops.remove(key);
                self.wake = None;
                if !self.stopping {
                    self.arm_wake();
                }
            }
            _ => {
                self.ops.remove(key); // a cancel
            }
        }
    }

    fn accept_ended(&mut self, res: i32, multishot: bool) {
        if self.stopping || self.draining {
            return;
        }
        if res == -libc::EINVAL && multishot {
            // A kernel before 5.19 has no multishot accept: accept one at a time.
            self.accept_multishot = false;
            self.arm_accept();
        } else if res < 0 && res != -libc::ECANCELED {
            // The accept ended on an error (e.g. EMFILE): retry after a pause instead of
            // spinning on an error that persists.
            tracing::warn!(error = %io::Error::from_raw_os_error(-res), "accept failed; retrying in 100 ms");
            self.accept_retry_at = Some(self.now + ACCEPT_RETRY_DELAY);
        } else {
            self.arm_accept();
        }
    }

    /// Ends the accept of a core that failed before its ring goes: the kernel tears a closed
    /// ring down later, and until then an accept left armed on it goes on taking connections
    /// that nobody reads, whose clients hang. The cancel that `stop_all` queued is submitted
    /// and the accept's completions read (at most [`ACCEPT_RELEASE_WAIT`]); a connection it
    /// took meanwhile goes to a live core ([`Core::on_accept`]). Other completions are left
    /// unread: their operations stay with the failed ring, as when it fails. A ring that cannot
    /// submit any more ends the wait at once.
    pub(super) fn release_accept(&mut self) {
        let Some(accept) = self.accept else {
            return;
        };
        let until = Instant::now() + ACCEPT_RELEASE_WAIT;
        while self.accept.is_some() {
            let left = until.saturating_duration_since(Instant::now());
            let waited = self
                .ring
                .submit_and_wait(Some(left.min(Duration::from_millis(10))));
            if left.is_zero() || waited.is_err() {
                tracing::warn!(
                    "a failed core's accept did not end; connections it takes may hang until the \
                     kernel tears its ring down"
                );
                return;
            }
            self.ring.drain(&mut self.completions);
            while let Some((user_data, res, flags)) = self.completions.pop_front() {
                let key = OpKey::from_user_data(user_data);
                if key == accept {
                    self.on_own_completion(key, res, flags);
                }
            }
        }
    }

    pub(super) fn arm_wake(&mut self) {
        let fd = Arc::clone(&self.handle.shared.wake);
        self.wake = self.submit(Owner::Core, Op::Read(Read::new(fd)));
    }

    pub(super) fn arm_accept(&mut self) {
        let Some(listener) = self.listener else {
            return;
        };
        if self.accept.is_some() || self.stopping || self.draining {
            return;
        }
        let op = Op::Accept(Accept::new(listener, self.accept_multishot));
        self.accept = self.submit(Owner::Core, op);
    }

    /// Puts an operation in the slab and its SQE in the ring. `None` (and nothing armed) if
    /// the ring refused it.
    pub(super) fn submit(&mut self, owner: Owner, op: Op) -> Option<OpKey> {
        let key = self.ops.insert(OpEntry { owner, op });
        let entry = self.ops.get_mut(key)?.op.entry().user_data(key.user_data());
        // SAFETY: every pointer in `entry` refers to memory the operation owns (heap memory that
        // does not move when the operation moves); the operation stays in `self.ops` until its
        // last completion, and is leaked rather than freed if the core stops before that.
        match unsafe { self.ring.push(&entry) } {
            Ok(()) => Some(key),
            Err(e) => {
                tracing::error!(error = %e, "cannot submit to the ring");
                self.ops.remove(key);
                None
            }
        }
    }

    /// Submits an operation that is still in the slab again (the rest of a send).
    pub(super) fn resubmit(&mut self, key: OpKey) -> bool {
        let Some(entry) = self.ops.get_mut(key) else {
            return false;
        };
        let entry = entry.op.entry().user_data(key.user_data());
        // SAFETY: as in `submit`: the operation owns what the entry points to and stays in the
        // slab until its last completion.
        match unsafe { self.ring.push(&entry) } {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(error = %e, "cannot submit to the ring");
                false
            }
        }
    }
}
