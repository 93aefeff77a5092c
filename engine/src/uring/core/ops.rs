//! The core's operations: putting them in the ring, and dispatching each completion to what
//! it completes (the core's accept and wake-up, or a connection's connect, receive or send).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use io_uring::cqueue;

use super::Core;
use crate::uring::op::{Accept, Op, OpEntry, OpKey, Owner, Read};

/// Pause before re-arming an accept that failed (for instance out of file descriptors).
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(100);

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
