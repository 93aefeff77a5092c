//! How far ahead of the bytes that arrived a frame's final memory is exposed (and charged to
//! the receive budget): the receive window.

use std::sync::Arc;

use super::{Received, Receiver, RecvError, Stage};
use crate::len::len_u64;

/// Over cold memory the window is this many times what the frame brought so far.
const COLD_FACTOR: u64 = 4;
/// Over memory committed already (a warm pool slot) the window is this many times the body
/// bytes that arrived.
const WARM_FACTOR: u64 = 64;

impl Receiver {
    /// Exposes the next window of final memory (charging the budget) so a read can go straight
    /// into it. The window is four times what the frame brought so far (at least 64 KiB, at
    /// most `max_window`): a peer is never given more memory than it paid for with data, yet a
    /// real transfer reaches the largest window within a few reads.
    ///
    /// Memory that is committed already (a warm slot of the receive pool) costs nothing new,
    /// so over it the window is wider, up to [`WARM_FACTOR`] times the body bytes that arrived
    /// (the same bounds; the head does not count), within the budget: a 1 MiB frame then
    /// arrives in two reads. A head alone never opens the wide window: charging the shared
    /// budget for memory no body byte paid for would let a peer that sends heads and then
    /// stalls starve the other connections.
    pub(super) fn prepare_window(&mut self) -> Option<Received> {
        if let Some(failed) = self.expose(self.window(self.frame_bytes, COLD_FACTOR)) {
            return Some(failed);
        }
        let Stage::Body(Some(body)) = &self.stage else {
            return None;
        };
        let exposed = body.exposed_unfilled();
        // Body bytes only: a head with a long length table must not open the wide window.
        let room = len_u64(self.window(body.received(), WARM_FACTOR)).saturating_sub(exposed);
        let ahead = body.committed_ahead().min(room);
        if ahead == 0 || !self.memory.charge(ahead) {
            return None;
        }
        self.charged += ahead;
        let wider = usize::try_from(exposed + ahead).unwrap_or(usize::MAX);
        self.expose_charged(wider)
    }

    /// `factor` times `paid` bytes, within the window bounds.
    fn window(&self, paid: u64, factor: u64) -> usize {
        usize::try_from(paid.saturating_mul(factor))
            .unwrap_or(usize::MAX)
            .clamp(self.config.min_window(), self.config.max_window.max(1))
    }

    /// Charges and exposes up to `window` bytes beyond what arrived.
    fn expose(&mut self, window: usize) -> Option<Received> {
        let Stage::Body(Some(body)) = &mut self.stage else {
            return None;
        };
        let exposed_before = body.received() + body.exposed_unfilled();
        let wanted = (body.received() + len_u64(window)).min(body.layout().body_len());
        let grow = wanted.saturating_sub(exposed_before);
        if grow == 0 {
            return None;
        }
        if !self.memory.charge(grow) {
            let text = self.budget_text(grow);
            return Some(self.fail_now(RecvError::Memory(text)));
        }
        self.charged += grow;
        self.expose_charged(window)
    }

    /// Exposes up to `window` bytes beyond what arrived; the caller charged for them.
    fn expose_charged(&mut self, window: usize) -> Option<Received> {
        let memory = Arc::clone(&self.memory);
        let lent = &mut self.lent;
        let Stage::Body(Some(body)) = &mut self.stage else {
            return None;
        };
        match body.expose(window, &mut |len| super::allocate(&*memory, lent, len)) {
            Ok(()) => None,
            Err(e) => Some(self.fail_now(e)),
        }
    }
}
