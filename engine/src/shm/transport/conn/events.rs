//! Under the lock: the session's events turned into work (requests unpacked for the node,
//! answers unpacked for their callers, releases, maps); after it: what that work needs outside
//! the lock (the peer rung, callers completed).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tensorwire_proto::shm::{CloseReason, ConnEvent};
use tensorwire_proto::stats;

use super::{After, Conn, Delivered, State};
use crate::shm::transport::Transport;
use crate::shm::transport::views::{self, Source, Unpacked};

impl Conn {
    /// Turns the session's events into work and moves its transmits, until both are done.
    pub(super) fn settle(self: &Arc<Self>, t: &Arc<Transport>, st: &mut State, after: &mut After) {
        loop {
            let mut any = false;
            while let Some(event) = st.session.poll_event() {
                any = true;
                self.on_event(t, st, event, after);
            }
            self.flush(st, after);
            if !any && st.session.poll_event().is_none() {
                return;
            }
        }
    }

    pub(super) fn on_event(
        self: &Arc<Self>,
        t: &Arc<Transport>,
        st: &mut State,
        event: ConnEvent,
        after: &mut After,
    ) {
        match event {
            ConnEvent::Map { segment, .. } => {
                // Only a datagram carries a descriptor; `drain` maps it there.
                let reason =
                    CloseReason::Local(format!("segment {segment} came without its descriptor"));
                st.session.handle_mapped(segment, Err(reason));
            }
            ConnEvent::Unmap { segment } => {
                // Its bound is given back with the last view of it (`Counted`).
                if st.mapped.remove(&segment).is_some() {
                    self.mapped_changed(st);
                }
            }
            ConnEvent::DrainSocket => {
                self.drain(t, st, after, false);
                st.session.resume();
            }
            ConnEvent::Request {
                id,
                kind,
                path,
                body,
            } => {
                if let Err(text) = t.inbound.admit(kind, &path) {
                    st.session.send_releases(&body.leases());
                    st.session.send_reply(
                        id,
                        tensorwire_proto::shm::WireReply::Error(text),
                        &[],
                        0,
                    );
                    return;
                }
                match views::unpack(&self.source(t, st), &body) {
                    Unpacked::Message(message) => {
                        crate::phase_marks::mark(crate::phase_marks::Phase::Unpacked);
                        after.deliver.push(Delivered {
                            id,
                            kind,
                            path,
                            message,
                        });
                    }
                    Unpacked::Refused(text) => {
                        st.session.send_reply(
                            id,
                            tensorwire_proto::shm::WireReply::Error(text),
                            &[],
                            0,
                        );
                    }
                }
            }
            ConnEvent::Reply { id, kind, reply } => {
                if let Some(waiter) = st.waiters.remove(&id) {
                    let outcome = views::answer(&self.source(t, st), kind, waiter.peer, reply);
                    after.complete.push((waiter, outcome));
                }
            }
            ConnEvent::Failed { id, why, .. } => {
                if let Some(waiter) = st.waiters.remove(&id) {
                    let error = views::failure(why, waiter.kind, waiter.peer, waiter.deadline);
                    after.complete.push((waiter, Err(error)));
                }
            }
            ConnEvent::Released { leases } => after.released.extend(leases),
            ConnEvent::Closed(reason) => {
                tracing::debug!(node = %self.node, %reason, "shared-memory connection closed");
                if matches!(reason, CloseReason::OverBound(_)) {
                    stats::global().record_shm_peer_refused();
                }
                self.closed.store(true, Ordering::Release);
                let _ = crate::sys::shutdown(self.socket(), libc::SHUT_RDWR);
                after.closed = true;
            }
        }
    }

    /// What a body is read against here.
    pub(super) fn source<'a>(&'a self, t: &'a Transport, st: &'a State) -> Source<'a> {
        Source {
            mapped: &st.mapped,
            lending: &t.lending,
            holder: self.peer.pid,
            releases: &self.releases,
            limits: &t.limits,
        }
    }

    /// Does what was found under the lock, but for the deliveries, which it returns.
    pub(super) fn finish(self: &Arc<Self>, t: &Arc<Transport>, after: After) -> Vec<Delivered> {
        if after.ring_peer && self.ring() {
            stats::global().record_shm_doorbell();
        }
        if !after.released.is_empty() {
            t.lending.release(self.peer.pid, &after.released);
        }
        for (waiter, outcome) in after.complete {
            waiter.completion.complete(outcome);
        }
        if after.closed {
            t.wake.signal();
        }
        after.deliver
    }
}
