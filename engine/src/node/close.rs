//! Closing a node gracefully: nothing new is taken, what is in flight is finished (replies and
//! acknowledgements written, sends completed), then the node shuts down.

use std::time::{Duration, Instant};

use super::Node;

/// How long the close sleeps between looks at what is still in flight, at most.
const POLL_AT_MOST: Duration = Duration::from_millis(5);

impl Node {
    /// Closes the node gracefully, within `timeout`: it admits no new request (senders are
    /// told the node is closing) and accepts no new connection; requests it has are finished —
    /// each ask's reply and each tell's acknowledgement is written in full, requests waiting in
    /// a mailbox are taken and answered — and so are the sends it started; then it shuts down
    /// ([`Node::shutdown`]), which fails whatever is left when `timeout` has passed.
    ///
    /// Requests must still be taken meanwhile: by handler threads, or by whoever receives from
    /// an endpoint (a mailbox nobody empties holds the close up until `timeout`). Shared
    /// memory takes no new connection and waits until every reply and release it owes a peer
    /// is in that peer's queue (and every answer this node waits for came). HTTP/2 finishes
    /// its streams with GOAWAY at shutdown. Idempotent; in a child made by `fork()` it does
    /// nothing.
    pub fn close(&self, timeout: Duration) {
        let inner = &self.inner;
        if inner.birth.is_inherited() || inner.is_shut_down() {
            return;
        }
        let start = Instant::now();
        inner.registry.start_closing();
        inner.driver.drain();
        if let Some(shm) = &inner.shm {
            shm.drain();
        }
        let mut pause = Duration::from_micros(50);
        loop {
            let done = inner.registry.in_flight() == 0
                && inner.outbound.get() == 0
                && inner.driver.drained()
                && inner.shm.as_ref().is_none_or(|shm| shm.drained());
            if done || start.elapsed() >= timeout {
                if !done {
                    tracing::warn!(
                        serving = inner.registry.in_flight(),
                        sending = inner.outbound.get(),
                        "closing a node: requests still in flight after the close timeout fail"
                    );
                }
                break;
            }
            std::thread::sleep(pause.min(timeout.saturating_sub(start.elapsed())));
            pause = (pause * 2).min(POLL_AT_MOST);
        }
        inner.shutdown_joining_until(start.checked_add(timeout));
    }
}
