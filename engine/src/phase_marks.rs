//! Timestamps at fixed points of the shared-memory path, to see where a small ask's
//! microseconds go (`scripts/shm-phases`: an ask's phases on both sides, from the two
//! processes' files).
//!
//! Built only with the `phase-marks` feature; without it every [`mark`] is an empty inline
//! function. With it, a process whose environment has `TENSORWIRE_PHASE_MARKS=N` (1 to 2^20;
//! anything else leaves marking off, with a warning) keeps the first `N`
//! times of each [`Phase`] it passes — up to 14 × 8 × `N` bytes, allocated at the first mark —
//! and, on the thread that passes [`Phase::Published`] for the `N`-th time, writes them to
//! `phase-marks.<pid>` in the temporary directory (through a `.tmp` file renamed when
//! complete): one line per phase, its number, how many times it was passed in all, then the
//! times kept, in nanoseconds of `CLOCK_MONOTONIC` (one clock for every process of the host
//! outside time namespaces, so two processes' marks compare). A mark costs one clock read
//! (about 20–30 ns on these VMs), which the phase after it includes; the write stalls the
//! writing thread for tens of milliseconds, after the `N`-th ask.
//!
//! What it does not do: it does not tell connections, threads or requests apart (every mark
//! of the process counts; only blocking asks pass `AskStart`/`AskEnd`), and it does not pair
//! marks with asks — the script does, by their order, which holds for one blocking ask at a
//! time on one connection with inline bodies (a message of up to 8 KiB). A child forked after
//! the first mark inherits the parent's marks so far and writes them as its own; measure
//! processes that do not fork.

/// A point on the path of a request or its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// A blocking ask starts (`Node::ask_blocking_to`).
    AskStart = 0,
    /// The shared-memory transport takes a request (`outbound::send`).
    ShmSend,
    /// The request is laid out (copied into a slot where it needs one); the connection's
    /// session is next.
    SessionEnter,
    /// The session gave the request its id and queued its record.
    RequestQueued,
    /// A record found room in this side's queue; its bytes go in next.
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
    /// The answer, built (a tensor reply laid out and copied where it must be), goes to the
    /// session.
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
    use std::io::Write;
    use std::path::Path;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    use super::Phase;

    /// Phases there are.
    const PHASES: usize = Phase::AskEnd as usize + 1;
    /// Times kept per phase at most.
    const MAX_MARKS: usize = 1 << 20;

    static MARKS: OnceLock<Option<Marks>> = OnceLock::new();

    pub(super) fn mark(phase: Phase) {
        let Some(marks) = MARKS.get_or_init(from_env) else {
            return;
        };
        if marks.note(phase, now_nanos()) {
            let name = format!("phase-marks.{}", std::process::id());
            marks.write(&std::env::temp_dir(), &name);
        }
    }

    fn from_env() -> Option<Marks> {
        let value = std::env::var("TENSORWIRE_PHASE_MARKS").ok()?;
        let marks = Marks::new(&value);
        if marks.is_none() {
            tracing::warn!(%value, "TENSORWIRE_PHASE_MARKS is not 1 to 2^20: no phase marks");
        }
        marks
    }

    /// One process's marks.
    pub(super) struct Marks {
        keep: usize,
        counts: [AtomicUsize; PHASES],
        times: Vec<AtomicU64>,
    }

    impl Marks {
        /// Marks that keep `keep` times a phase (`None` unless it is 1 to 2^20).
        pub(super) fn new(keep: &str) -> Option<Self> {
            let keep = keep.parse::<usize>().ok()?;
            (1..=MAX_MARKS).contains(&keep).then(|| Self {
                keep,
                counts: std::array::from_fn(|_| AtomicUsize::new(0)),
                times: (0..keep * PHASES).map(|_| AtomicU64::new(0)).collect(),
            })
        }

        /// Counts `phase`, keeping `at` if it is among its first; whether this was the last
        /// publish kept (the caller writes the marks out then: one thread only gets it).
        pub(super) fn note(&self, phase: Phase, at: u64) -> bool {
            let p = phase as usize;
            let i = self.counts[p].fetch_add(1, Ordering::Relaxed);
            if i < self.keep {
                self.times[p * self.keep + i].store(at, Ordering::Release);
            }
            phase == Phase::Published && i + 1 == self.keep
        }

        /// Writes every phase's count and kept times to `dir/name`, through `name.tmp`
        /// renamed once complete (a time another thread counted but has not stored yet
        /// reads as 0: the script skips it).
        pub(super) fn write(&self, dir: &Path, name: &str) {
            let (tmp, path) = (dir.join(format!("{name}.tmp")), dir.join(name));
            let written = std::fs::File::create(&tmp).and_then(|file| {
                let mut out = std::io::BufWriter::new(file);
                for p in 0..PHASES {
                    let count = self.counts[p].load(Ordering::Relaxed);
                    write!(out, "{p} {count}")?;
                    for i in 0..count.min(self.keep) {
                        let at = self.times[p * self.keep + i].load(Ordering::Acquire);
                        write!(out, " {at}")?;
                    }
                    writeln!(out)?;
                }
                out.flush()?;
                std::fs::rename(&tmp, &path)
            });
            if let Err(e) = written {
                tracing::warn!(path = %path.display(), error = %e, "could not write the phase marks");
            }
        }
    }

    /// Nanoseconds of `CLOCK_MONOTONIC` (0 if it cannot be read).
    fn now_nanos() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the call's duration.
        if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) } != 0 {
            return 0;
        }
        let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
        let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
        secs.saturating_mul(1_000_000_000).saturating_add(nanos)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn only_a_whole_number_from_one_to_two_to_the_twenty_turns_marking_on() {
            for bad in ["", "0", "-1", "x", "1048577"] {
                assert!(Marks::new(bad).is_none(), "{bad:?}");
            }
            assert!(Marks::new("1").is_some());
            assert!(Marks::new("1048576").is_some());
        }

        #[test]
        fn the_file_has_each_phase_its_full_count_and_its_first_times() {
            let marks = Marks::new("2").unwrap();
            assert!(!marks.note(Phase::AskStart, 10));
            assert!(!marks.note(Phase::AskStart, 20));
            assert!(!marks.note(Phase::AskStart, 30), "counted, not kept");
            assert!(!marks.note(Phase::Published, 15));
            assert!(
                marks.note(Phase::Published, 25),
                "the second publish of two kept"
            );
            assert!(!marks.note(Phase::Published, 35), "only once");
            let dir = std::env::temp_dir().join(format!("phase-marks-test.{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            marks.write(&dir, "out");
            let text = std::fs::read_to_string(dir.join("out")).unwrap();
            assert!(!dir.join("out.tmp").exists(), "renamed, not left aside");
            std::fs::remove_dir_all(&dir).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), PHASES);
            assert_eq!(lines[Phase::AskStart as usize], "0 3 10 20");
            assert_eq!(lines[Phase::Published as usize], "5 3 15 25");
            assert_eq!(lines[Phase::AskEnd as usize], "13 0");
        }
    }
}
