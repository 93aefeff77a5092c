//! Whether a blocking caller spins before it sleeps in `poll`, and for how long: a pure policy
//! fed the lengths of the connection's recent waits (each stretch with nothing to read or
//! write), so it is tested without sockets.
//!
//! What counts is the wait, not the exchange: a 1 MiB one-way ask takes 200–300 µs on
//! loopback, nearly all of it spent writing, and then its 8-byte answer comes 20–40 µs after
//! the last byte left. A sleeping caller pays a wake-up on top of that (25–40 µs on a virtual
//! machine, measured with `perf trace` on the blocking client); one that spins takes the
//! answer as it lands. Deciding from the whole exchange's duration (as before) never spun for
//! large messages; deciding from the waits does, and stops as soon as waits grow long (a slow
//! handler, a peer far away), so a slow conversation costs no CPU.

use std::time::Duration;

/// The recent waits of one connection and the policy drawn from them.
#[derive(Debug, Clone, Copy)]
pub(super) struct SpinPolicy {
    /// A moving average of recent waits (weight 1/4 for the newest); zero until one is seen,
    /// so a new connection spins first.
    recent: Duration,
}

impl SpinPolicy {
    pub(super) fn new() -> Self {
        Self {
            recent: Duration::ZERO,
        }
    }

    /// How long to spin in a wait that has lasted `waited` so far, with a `budget` per wait:
    /// `true` while the connection's recent waits fitted the budget and this one has not used
    /// it up.
    pub(super) fn keep_spinning(&self, waited: Duration, budget: Duration) -> bool {
        !budget.is_zero() && self.recent <= budget && waited < budget
    }

    /// A wait ended after `waited` (bytes moved, or the exchange finished).
    pub(super) fn waited(&mut self, waited: Duration) {
        self.recent = (self.recent * 3 + waited) / 4;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: Duration = Duration::from_micros(100);

    #[test]
    fn a_new_connection_spins_until_the_budget_is_spent() {
        let sut = SpinPolicy::new();
        assert!(sut.keep_spinning(Duration::ZERO, BUDGET));
        assert!(sut.keep_spinning(Duration::from_micros(99), BUDGET));
        assert!(!sut.keep_spinning(BUDGET, BUDGET));
    }

    #[test]
    fn short_waits_keep_it_spinning_whatever_the_exchange_took() {
        let mut sut = SpinPolicy::new();
        for _ in 0..32 {
            sut.waited(Duration::from_micros(40));
        }
        assert!(sut.keep_spinning(Duration::from_micros(10), BUDGET));
    }

    #[test]
    fn long_waits_stop_the_spinning_and_short_ones_bring_it_back() {
        let mut sut = SpinPolicy::new();
        for _ in 0..4 {
            sut.waited(Duration::from_millis(5));
        }
        assert!(!sut.keep_spinning(Duration::ZERO, BUDGET));
        for _ in 0..32 {
            sut.waited(Duration::from_micros(20));
        }
        assert!(sut.keep_spinning(Duration::ZERO, BUDGET));
    }

    #[test]
    fn a_zero_budget_never_spins() {
        let sut = SpinPolicy::new();
        assert!(!sut.keep_spinning(Duration::ZERO, Duration::ZERO));
    }
}
