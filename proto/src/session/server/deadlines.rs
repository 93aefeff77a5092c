//! The server session's deadlines: the preface, a request's head, the minimum rates of a
//! body and of a reply, the wait for mailbox space, idleness, a finished peer, the drain.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ServerSession;
use crate::session::CloseReason;
use crate::session::server::ServerEvent;

impl ServerSession {
    /// The earliest deadline; call [`ServerSession::handle_timeout`] when it passes.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.closed {
            return None;
        }
        let config = &self.config;
        [
            self.preface_until,
            self.head_until,
            self.receive_rate.deadline(),
            self.send_rate.deadline(),
            self.waiting_since()
                .and_then(|since| since.checked_add(config.enqueue_timeout)),
            self.idle_since
                .and_then(|since| since.checked_add(config.idle_timeout)),
            self.peer_finished_at
                .and_then(|since| since.checked_add(config.idle_timeout)),
            self.draining_since
                .and_then(|since| since.checked_add(config.drain_timeout)),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Applies every deadline that passed by `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.closed {
            return;
        }
        let config = Arc::clone(&self.config);
        let passed = |at: Option<Instant>, after: Duration| {
            at.and_then(|at| at.checked_add(after))
                .is_some_and(|at| at <= now)
        };
        let timeout = |phase, after| CloseReason::Timeout { phase, after };
        if self.preface_until.is_some_and(|at| at <= now) {
            return self.close(timeout("preface", config.preface_timeout));
        }
        if self.head_until.is_some_and(|at| at <= now) {
            return self.close(timeout("request head", config.head_timeout));
        }
        if !self.receive_rate.check(now) {
            return self.close(CloseReason::TooSlow {
                what: "request body",
            });
        }
        if !self.send_rate.check(now) {
            return self.close(CloseReason::TooSlow { what: "reply" });
        }
        if passed(self.draining_since, config.drain_timeout) {
            return self.close(CloseReason::Drained);
        }
        if passed(self.idle_since, config.idle_timeout) {
            return self.close(timeout("idle connection", config.idle_timeout));
        }
        if passed(self.peer_finished_at, config.idle_timeout) {
            return self.close(timeout(
                "answer for a peer that finished sending",
                config.idle_timeout,
            ));
        }
        if passed(self.waiting_since(), config.enqueue_timeout) {
            if let Some(request) = self.request.as_mut() {
                request.waiting_since = None;
                request.withdrawing = true;
                let seq = request.seq;
                self.events.push_back(ServerEvent::Withdraw { seq });
            }
        }
    }
}
