//! How a thread that polls for an answer instead of sleeping waits between two looks: a
//! spin-loop hint, and once it has found nothing for a few microseconds, now and then a yield
//! of its CPU.
//!
//! The yield is for the thread it waits for. On two CPUs the scheduler often wakes a thread
//! onto the CPU of the thread that woke it (a synchronous wake-up, cheaper than waking an idle
//! virtual CPU): a client that sends its ask and polls for the answer may have just woken the
//! server onto its own CPU. A poller that never yields keeps that server waiting until the
//! poll's budget runs out, and the answer it polls for comes after the budget instead of
//! microseconds after the ask (asks of 4 KiB 10 ms apart over loopback: p90 370 µs with a
//! 250 µs poll that never yielded, `docs/benchmarks.md`, "Asks that come now and then"). On an
//! otherwise idle CPU a yield returns at once.

use std::time::Duration;

/// Idle looks between two yields.
const LOOKS_PER_YIELD: u32 = 8;

/// How long a poll goes without finding anything before its first yield. A peer that is
/// running answers within a few microseconds, and a yield is a system call (about a
/// microsecond on these VMs) that the answer would wait behind; a peer that is not running
/// needs the CPU given up, soon.
const YIELD_AFTER: Duration = Duration::from_micros(3);

/// One poll's pauses between its looks.
#[derive(Debug, Default)]
pub(crate) struct Pause {
    looks: u32,
}

impl Pause {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Between two looks that found nothing, `idled` into the wait: a spin-loop hint, or once
    /// it has idled for [`YIELD_AFTER`], every [`LOOKS_PER_YIELD`]th time a yield of the CPU.
    pub(crate) fn pause(&mut self, idled: Duration) {
        self.looks = self.looks.wrapping_add(1);
        if yields(idled, self.looks) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

fn yields(idled: Duration, looks: u32) -> bool {
    idled >= YIELD_AFTER && looks % LOOKS_PER_YIELD == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_yields_only_after_idling_for_a_while_and_then_one_look_in_eight() {
        assert!(
            !yields(Duration::from_micros(1), LOOKS_PER_YIELD),
            "a fresh poll spins"
        );
        assert!(yields(YIELD_AFTER, LOOKS_PER_YIELD));
        assert!(!yields(YIELD_AFTER, LOOKS_PER_YIELD + 1));
        assert!(yields(YIELD_AFTER * 100, LOOKS_PER_YIELD * 3));
    }

    #[test]
    fn the_looks_are_counted_from_one_pause_to_the_next() {
        let mut sut = Pause::new();
        for _ in 0..LOOKS_PER_YIELD {
            sut.pause(Duration::ZERO);
        }
        assert_eq!(sut.looks, LOOKS_PER_YIELD);
        assert!(
            yields(YIELD_AFTER, sut.looks),
            "the next idle look at this count yields"
        );
    }
}
