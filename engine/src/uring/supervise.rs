//! A core thread's life: it runs its core, and when the core fails (its ring failed, or
//! recovering from a panic panicked) it starts a new core on a new ring in its place, at most
//! [`UringConfig::core_restarts`] times a minute. A core that fails more often than that, or
//! whose new ring cannot be set up, stays out of the driver: the other cores carry the node,
//! and once none is left every request fails with the first core's reason.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::uring::commands::{CoreHandle, Inbox};
use crate::uring::core::{Core, Ended};
use crate::uring::ring::Ring;
use crate::uring::{Context, UringConfig};

/// The window [`UringConfig::core_restarts`] counts restarts in.
const RESTART_WINDOW: Duration = Duration::from_secs(60);

/// Runs core `index` on `ring` until it stops, restarting it after failures within the budget.
pub(crate) fn run_core_thread(
    index: usize,
    ring: Ring,
    ctx: Arc<Context>,
    handle: CoreHandle,
    inbox: Inbox,
    listener: RawFd,
    config: UringConfig,
) {
    let mut budget = RestartBudget::new(config.core_restarts, RESTART_WINDOW);
    let mut ring = ring;
    let mut remains = None;
    loop {
        let core = Core::new(
            ring,
            Arc::clone(&ctx),
            handle.clone(),
            inbox.clone(),
            Some(listener),
            remains,
        );
        let Ended::Failed(left) = core.run() else {
            return;
        };
        if !budget.take(Instant::now()) {
            tracing::error!(
                core = index,
                restarts = config.core_restarts,
                "a core thread failed again within a minute of its last restarts; it stays out of the driver"
            );
            return;
        }
        ring = match Ring::new(config.ring_entries) {
            Ok(ring) => ring,
            Err(e) => {
                tracing::error!(core = index, error = %e, "a failed core thread cannot set up a new ring; it stays out of the driver");
                return;
            }
        };
        remains = Some(left);
        handle.shared.revive();
        tracing::warn!(
            core = index,
            restarts = handle.shared.restarts.load(Ordering::Relaxed),
            "a failed core thread was restarted on a new ring and is back in the driver"
        );
    }
}

/// At most `max` restarts within any `window`.
struct RestartBudget {
    max: u32,
    window: Duration,
    recent: VecDeque<Instant>,
}

impl RestartBudget {
    fn new(max: u32, window: Duration) -> Self {
        Self {
            max,
            window,
            recent: VecDeque::new(),
        }
    }

    /// Whether a restart at `now` is within the budget (and counts it if so).
    fn take(&mut self, now: Instant) -> bool {
        while self
            .recent
            .front()
            .is_some_and(|at| now.saturating_duration_since(*at) >= self.window)
        {
            self.recent.pop_front();
        }
        if self.recent.len() >= self.max as usize {
            return false;
        }
        self.recent.push_back(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_are_allowed_up_to_the_budget_within_a_window_and_again_after_it() {
        let start = Instant::now();
        let mut budget = RestartBudget::new(2, Duration::from_secs(60));
        assert!(budget.take(start));
        assert!(budget.take(start + Duration::from_secs(1)));
        assert!(
            !budget.take(start + Duration::from_secs(2)),
            "a third within the minute"
        );
        assert!(
            budget.take(start + Duration::from_secs(60)),
            "the first one left the window"
        );
        assert!(!budget.take(start + Duration::from_secs(60)));
    }

    #[test]
    fn a_budget_of_zero_allows_no_restart() {
        assert!(!RestartBudget::new(0, Duration::from_secs(60)).take(Instant::now()));
    }
}
