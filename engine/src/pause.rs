//! How a thread that polls for an answer instead of sleeping waits between two looks: a
//! spin-loop hint, and once it has found nothing for a few microseconds, now and then a yield
//! of its CPU.
//!
//! The yield is for the thread it waits for. On two CPUs the scheduler often wakes a thread
//! onto the CPU of the thread that woke it (a synchronous wake-up, cheaper than waking an idle
//! virtual CPU): a client that sends its ask and polls for the answer may have just woken the
//! server onto its own CPU. A poller that never yields keeps that server waiting until the
//! poll's budget runs out, and the answer it polls for comes after the budget instead of
//! microseconds after the ask (asks of 4 KiB 0.2–10 ms apart over loopback: p90 310–430 µs
//! with a 250 µs poll that never yielded, `docs/benchmarks.md`, "Asks that come now and
//! then"). On an otherwise idle CPU a yield returns at once.
//!
//! A poll that shares its CPU with a thread that runs for long (a compute thread) gives it
//! the CPU at its yields, and the scheduler may let that thread run a whole slice before the
//! poller looks again; the poll's own budget, counted in wall time, then ends the poll, so it
//! costs one slice at most. Not measured. (`Pending::spin`, a 20 µs poll, does not yield:
//! yielding there cost asks in flight from Python a fifth to a third of their rate.)

use std::time::Duration;

/// Idle looks between two yields.
const LOOKS_PER_YIELD: u32 = 8;

/// How long a poll goes without finding anything before its first yield. A peer that is
/// running answers within a few microseconds, and a yield is a system call (about a
/// microsecond on these VMs) that the answer would wait behind; a peer that is not running
/// needs the CPU given up, soon.
const YIELD_AFTER: Duration = Duration::from_micros(3);

/// One poll's pauses between its looks. Each look should be cheap (a few loads, a clock
/// read), so that every eighth of them comes a few hundred nanoseconds apart.
#[derive(Debug, Default)]
pub(crate) struct Pause {
    looks: u32,
}

impl Pause {
    /// Between two looks that found nothing, `idled` into the wait: a spin-loop hint, or once
    /// it has idled for [`YIELD_AFTER`], every [`LOOKS_PER_YIELD`]th time a yield of the CPU;
    /// whether it yielded.
    pub(crate) fn pause(&mut self, idled: Duration) -> bool {
        self.looks = self.looks.wrapping_add(1);
        let yielded = yields(idled, self.looks);
        if yielded {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
        yielded
    }
}

fn yields(idled: Duration, looks: u32) -> bool {
    idled >= YIELD_AFTER && looks % LOOKS_PER_YIELD == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_idle_for_a_while_it_yields_one_look_in_eight() {
        let yielding: Vec<u32> = (1..=24).filter(|&look| yields(YIELD_AFTER, look)).collect();
        assert_eq!(yielding, [8, 16, 24]);
        assert!((1..=64).all(|look| !yields(YIELD_AFTER - Duration::from_nanos(1), look)));
    }

    #[test]
    fn a_pause_decides_from_the_idle_time_it_is_given() {
        let mut sut = Pause::default();
        for _ in 0..16 {
            assert!(
                !sut.pause(Duration::from_micros(1)),
                "not idle long enough to yield"
            );
        }
        let yielded: Vec<bool> = (0..8).map(|_| sut.pause(YIELD_AFTER)).collect();
        assert_eq!(
            yielded,
            [false, false, false, false, false, false, false, true]
        );
    }
}
