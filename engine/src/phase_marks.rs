//! Timestamps at fixed points of the shared-memory path, to see where a small ask's
//! microseconds go (`scripts/shm-phases`: an ask's phases on both sides, from the two
//! processes' files).
//!
//! Built only with the `phase-marks` feature; without it every [`mark`] is an empty inline
//! function. With it, a process whose environment has `TENSORWIRE_PHASE_MARKS=N` keeps the
//! first `N` (at most 2^20) times of each [`Phase`] it passes, and writes them all to
//! `phase-marks.<pid>` in the temporary directory once it has passed [`Phase::Published`] `N`
//! times: one line per phase, its number, then its times in nanoseconds since the boot clock's
//! origin (`CLOCK_MONOTONIC`, the same in every process, so marks of two processes compare).
//! A mark costs one clock read (about 20 ns on these VMs), which the phase after it includes.
//!
//! It does not pair marks with asks: the script does, by their order, which holds for one
//! ask at a time on one connection.

/// A point on the path of a request or its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// A blocking ask starts (`Node::ask_blocking_to`).
    AskStart = 0,
    /// The shared-memory transport takes a request (`outbound::send`).
    ShmSend,
    /// The request's layout and copy are done; the connection's session is next.
    SessionEnter,
    /// The session gave the request its id and queued its record.
    RequestQueued,
    /// A record's bytes start to go into this side's queue.
    RecordWrite,
    /// This side's queue head moved past what it wrote.
    Published,
    /// A record of the peer's queue was copied out.
    Popped,
    /// The session decoded it.
    Decoded,
    /// A request's message was made from its body.
    Unpacked,
    /// A pump that read records is done.
    PumpEnd,
    /// A request is handed to the node.
    Delivered,
    /// Its handler answered.
    Responded,
    /// The answer goes to the session.
    Answer,
    /// A blocking ask returns.
    AskEnd,
}

/// Notes that this thread passed `phase` now.
#[inline(always)]
pub(crate) fn mark(phase: Phase) {
    #[cfg(feature = "phase-marks")]
    enabled::mark(phase);
    #[cfg(not(feature = "phase-marks"))]
    let _ = phase;
}

#[cfg(feature = "phase-marks")]
mod enabled {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

    use super::Phase;

    /// Phases there are.
    const PHASES: usize = Phase::AskEnd as usize + 1;
    /// Times kept per phase at most.
    const MAX_MARKS: usize = 1 << 20;

    struct Marks {
        keep: usize,
        counts: [AtomicUsize; PHASES],
        times: Vec<AtomicU64>,
        written: AtomicBool,
    }

    static MARKS: OnceLock<Option<Marks>> = OnceLock::new();

    pub(super) fn mark(phase: Phase) {
        let Some(marks) = MARKS.get_or_init(from_env) else {
            return;
        };
        let p = phase as usize;
        let i = marks.counts[p].fetch_add(1, Ordering::Relaxed);
        if i < marks.keep {
            marks.times[p * marks.keep + i].store(now_nanos(), Ordering::Relaxed);
        }
        if phase == Phase::Published
            && i + 1 == marks.keep
            && !marks.written.swap(true, Ordering::AcqRel)
        {
            write(marks);
        }
    }

    fn from_env() -> Option<Marks> {
        let keep = std::env::var("TENSORWIRE_PHASE_MARKS")
            .ok()?
            .parse::<usize>()
            .ok()?;
        let keep = keep.clamp(1, MAX_MARKS);
        Some(Marks {
            keep,
            counts: std::array::from_fn(|_| AtomicUsize::new(0)),
            times: (0..keep * PHASES).map(|_| AtomicU64::new(0)).collect(),
            written: AtomicBool::new(false),
        })
    }

    fn now_nanos() -> u64 {
        let now = monotonic();
        u64::try_from(now.as_nanos()).unwrap_or(u64::MAX)
    }

    /// `CLOCK_MONOTONIC` as a duration since its origin (what `Instant` reads, exposed).
    fn monotonic() -> std::time::Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the call's duration.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
        std::time::Duration::new(
            u64::try_from(ts.tv_sec).unwrap_or(0),
            u32::try_from(ts.tv_nsec).unwrap_or(0),
        )
    }

    fn write(marks: &Marks) {
        let mut out = String::new();
        for p in 0..PHASES {
            let n = marks.counts[p].load(Ordering::Relaxed).min(marks.keep);
            out.push_str(&p.to_string());
            for i in 0..n {
                out.push(' ');
                out.push_str(
                    &marks.times[p * marks.keep + i]
                        .load(Ordering::Relaxed)
                        .to_string(),
                );
            }
            out.push('\n');
        }
        let path = std::env::temp_dir().join(format!("phase-marks.{}", std::process::id()));
        if let Err(e) = std::fs::write(&path, out) {
            tracing::warn!(path = %path.display(), error = %e, "could not write the phase marks");
        }
    }
}
