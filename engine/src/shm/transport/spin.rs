//! When a thread that waits for shared-memory messages spins instead of sleeping: for a fixed
//! window after the last message it handled, every time. A conversation whose messages come
//! closer together than the window never pays a wake-up; one whose gaps are longer always
//! sleeps. There is no mode to fall into: the same gap gets the same treatment on every run.
//! The time spent spinning without finding anything is counted, so its CPU cost is visible
//! (`shm_spin_micros` in the statistics).

use std::time::{Duration, Instant};

use crate::pause::Pause;

/// One waiting thread's spin window.
#[derive(Debug)]
pub(super) struct Spin {
    window: Duration,
    last_work: Option<Instant>,
    /// Since when it has spun without finding work (for the accounting).
    idle_since: Option<Instant>,
    /// How long it had idled at its last look.
    idled: Duration,
    pause: Pause,
}

impl Spin {
    /// Spins for `window` after each piece of work (zero: never spins).
    pub(super) fn new(window: Duration) -> Self {
        Self {
            window,
            last_work: None,
            idle_since: None,
            idled: Duration::ZERO,
            pause: Pause::default(),
        }
    }

    /// It found work at `now`: the window starts again. The idle spin that ended, if any.
    pub(super) fn worked(&mut self, now: Instant) -> Duration {
        self.last_work = Some(now);
        self.end_idle(now)
    }

    /// It found nothing at `now`: whether to look again at once (`true`) or sleep. The idle
    /// spin that ended, if it sleeps.
    pub(super) fn idle(&mut self, now: Instant) -> (bool, Duration) {
        let within = self
            .last_work
            .is_some_and(|at| now.saturating_duration_since(at) < self.window);
        if within {
            let since = *self.idle_since.get_or_insert(now);
            self.idled = now.saturating_duration_since(since);
            (true, Duration::ZERO)
        } else {
            (false, self.end_idle(now))
        }
    }

    /// Between two idle looks: a spin-loop hint, and once it has idled for a few microseconds,
    /// now and then a yield of the CPU ([`Pause`]).
    pub(super) fn pause(&mut self) {
        self.pause.pause(self.idled);
    }

    fn end_idle(&mut self, now: Instant) -> Duration {
        self.idled = Duration::ZERO;
        self.idle_since
            .take()
            .map_or(Duration::ZERO, |since| now.saturating_duration_since(since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_spins_for_the_window_after_each_piece_of_work_then_sleeps() {
        let start = Instant::now();
        let mut sut = Spin::new(Duration::from_micros(100));
        assert!(!sut.idle(start).0, "no work yet: sleep");
        sut.worked(start);
        assert!(sut.idle(start + Duration::from_micros(10)).0);
        assert!(sut.idle(start + Duration::from_micros(99)).0);
        let (spin, spent) = sut.idle(start + Duration::from_micros(100));
        assert!(!spin);
        assert_eq!(spent, Duration::from_micros(90), "the idle spin is counted");
    }

    #[test]
    fn the_idle_time_its_pauses_see_starts_again_with_each_piece_of_work() {
        let start = Instant::now();
        let mut sut = Spin::new(Duration::from_micros(100));
        sut.worked(start);
        sut.idle(start + Duration::from_micros(1));
        sut.idle(start + Duration::from_micros(6));
        assert_eq!(
            sut.idled,
            Duration::from_micros(5),
            "idle since its first idle look"
        );
        sut.worked(start + Duration::from_micros(7));
        assert_eq!(sut.idled, Duration::ZERO);
        sut.idle(start + Duration::from_micros(8));
        assert_eq!(sut.idled, Duration::ZERO, "a new idle spell");
    }

    #[test]
    fn the_same_gap_always_gets_the_same_answer() {
        let start = Instant::now();
        let mut sut = Spin::new(Duration::from_micros(50));
        for round in 0..100u32 {
            let at = start + Duration::from_millis(u64::from(round));
            sut.worked(at);
            assert!(sut.idle(at + Duration::from_micros(40)).0, "round {round}");
            assert!(!sut.idle(at + Duration::from_micros(60)).0, "round {round}");
        }
    }

    #[test]
    fn work_found_while_spinning_ends_the_idle_spin_and_counts_it() {
        let start = Instant::now();
        let mut sut = Spin::new(Duration::from_micros(100));
        sut.worked(start);
        sut.idle(start + Duration::from_micros(5));
        assert_eq!(
            sut.worked(start + Duration::from_micros(25)),
            Duration::from_micros(20)
        );
    }

    #[test]
    fn a_zero_window_never_spins() {
        let start = Instant::now();
        let mut sut = Spin::new(Duration::ZERO);
        sut.worked(start);
        assert!(!sut.idle(start).0);
    }
}
