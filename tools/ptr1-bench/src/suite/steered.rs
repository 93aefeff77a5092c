//! MPI's ranks in C measured case by case beside the Rust columns they are compared with.
//!
//! The peers' driver (`bench.py --json`) otherwise runs after the whole Rust matrix, minutes
//! after the column it is set beside; on these VMs the host's CPU pair and its wake-ups change
//! within minutes, so a ratio of the two compared the host at two moments as much as the
//! transports. The verdict sets the C peers (the only ones in a compiled language) beside the
//! Rust columns, so they are driven here, one cell at a time, by a second driver started with
//! `--steer` for the whole pass: each case of each repetition is measured on the Rust columns
//! and on these peers seconds apart (the peers first in every other case, so neither side is
//! always the one measured after the other). The main driver leaves them out.
//!
//! This is a benchmark's process plumbing, not a transport: a driver that dies or stays silent
//! past [`CELL_WAIT`] is stopped (its input closed, then killed) and reported as failed (its
//! samples until then kept), never waited on for ever.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::Options;
use crate::report::say;
use crate::suite::{Case, Plan};

/// The `bench.py` keys of the peers steered here (its "(C)" MPI peers).
pub(crate) const KEYS: &str = "mpic,mpitcpc";

/// How long one cell may take, peers made included (mpicc builds the ranks on first use,
/// `mpirun` starts; `bench.py`'s own limit per peer and cell is 300 s).
pub(crate) const CELL_WAIT: Duration = Duration::from_secs(15 * 60);

/// How long a driver whose input ended may take to close its peers and exit.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// The name failures are reported under.
const NAME: &str = "MPI in C (bench.py --steer)";

/// A `bench.py --steer` child for one pass.
pub(crate) struct Steered {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Its stdout, line by line, from a reader thread (so a wait can time out).
    lines: Receiver<String>,
    /// Every record it printed so far, one JSON object per line.
    records: String,
    failed: Option<String>,
    wait: Duration,
}

impl Steered {
    /// The C peers' driver for a pass (`fresh`: new processes per cell), or `None` where the
    /// peers are not measured (the main driver says why).
    pub(crate) fn start(options: &Options, plan: &Plan, fresh: bool) -> Option<Self> {
        let (python, script, mut args) = crate::suite::peers::driver(options, plan, fresh).ok()?;
        args.extend(["--only".into(), KEYS.into(), "--steer".into()]);
        let mut command = Command::new(python);
        command.arg(script).args(args);
        let why = match Self::spawn(command, CELL_WAIT) {
            Ok(steered) => match &steered.failed {
                None => return Some(steered),
                Some(why) => why.clone(), // dropping it stops it
            },
            Err(e) => e.to_string(),
        };
        say!("MPI's C peers: not steered case by case ({why}); measured after the matrix");
        None
    }

    /// Starts `command` (a driver that speaks `--steer`) and waits until it is ready (a failure
    /// to get ready is in `failed`); then at most `wait` per cell.
    pub(crate) fn spawn(mut command: Command, wait: Duration) -> std::io::Result<Self> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("the driver's stdout was not piped"))?;
        let (send, lines) = mpsc::channel();
        std::thread::Builder::new()
            .name("steered-peers".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if send.send(line).is_err() {
                        break;
                    }
                }
            })?;
        let mut steered = Self {
            stdin: child.stdin.take(),
            child,
            lines,
            records: String::new(),
            failed: None,
            wait,
        };
        // Its peers are made before the first cell, not while a Rust column is measured.
        steered.collect_until("ready", "setting up");
        Ok(steered)
    }

    /// Measures `case` (repetition `rep`) on the steered peers; returns when they are done,
    /// or when the driver failed (then every later cell is skipped).
    pub(crate) fn measure(&mut self, rep: usize, case: &Case) {
        if self.failed.is_some() {
            return;
        }
        let asked = serde_json::json!({
            "rep": rep,
            "mode": case.mode_key(),
            "size": case.size,
            "buffers": case.buffers,
        });
        let Some(stdin) = self.stdin.as_mut() else {
            return self.fail(format!("{}: its input is closed", case.label()));
        };
        if let Err(e) = writeln!(stdin, "{asked}").and_then(|()| stdin.flush()) {
            return self.fail(format!("{}: could not ask for the cell: {e}", case.label()));
        }
        self.collect_until("cell_done", &case.label());
    }

    /// Takes the driver's records until one of `kind` (not kept), within `wait`, or fails.
    fn collect_until(&mut self, kind: &str, what: &str) {
        let deadline = Instant::now() + self.wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if is_kind(&line, kind) => return,
                Ok(line) => self.keep(&line),
                Err(RecvTimeoutError::Timeout) => {
                    return self.fail(format!(
                        "{what}: no answer within {} s",
                        self.wait.as_secs()
                    ));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return self.fail(format!("{what}: the driver exited"));
                }
            }
        }
    }

    /// Ends the driver and returns every record it printed (a failure as a `failed` record).
    pub(crate) fn finish(mut self) -> String {
        drop(self.stdin.take()); // end of input: it closes its peers and exits
        if self.failed.is_none() {
            loop {
                match self.lines.recv_timeout(self.wait) {
                    Ok(line) => self.keep(&line),
                    Err(RecvTimeoutError::Disconnected) => break,
                    Err(RecvTimeoutError::Timeout) => {
                        self.failed = Some("it did not exit after its input ended".into());
                        break;
                    }
                }
            }
        }
        if self.failed.is_some() {
            self.stop();
        }
        let status = self.child.wait();
        if self.failed.is_none() && !status.as_ref().is_ok_and(|s| s.success()) {
            self.failed = Some(match status {
                Ok(status) => format!("exited with {status} (its stderr is above)"),
                Err(e) => format!("could not be waited for: {e}"),
            });
        }
        if let Some(why) = self.failed.take() {
            let record = serde_json::json!({"kind": "failed", "peer": NAME, "reason": why});
            self.keep(&record.to_string());
        }
        std::mem::take(&mut self.records)
    }

    /// Keeps one record of the driver's.
    fn keep(&mut self, line: &str) {
        self.records.push_str(line);
        self.records.push('\n');
    }

    fn fail(&mut self, why: String) {
        say!("{NAME} failed, left out from here on: {why}");
        self.stop();
        self.failed = Some(why);
    }

    /// Ends the driver: its input closed, so it closes its peers (mpirun and its ranks) and
    /// removes its files; killed after [`STOP_WAIT`] (or the cell wait, if shorter) if it
    /// does not.
    fn stop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + STOP_WAIT.min(self.wait);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `columns` (the Rust columns' cells of case `c` in repetition `rep`) with the steered
/// peers measured on the same case right before them in every other case and right after
/// them in the rest, so neither side is always measured second.
pub(crate) fn around<T>(
    steered: Option<&mut Steered>,
    rep: usize,
    c: usize,
    case: &Case,
    columns: impl FnOnce() -> T,
) -> T {
    let Some(steered) = steered else {
        return columns();
    };
    let peers_first = (rep + c) % 2 == 0;
    if peers_first {
        steered.measure(rep, case);
    }
    let measured = columns();
    if !peers_first {
        steered.measure(rep, case);
    }
    measured
}

impl Drop for Steered {
    fn drop(&mut self) {
        // A pass that ended early (an error) leaves no driver or mpirun behind.
        self.stop();
    }
}

fn is_kind(line: &str, kind: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(line).is_ok_and(|record| record["kind"] == kind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::cases;
    use crate::suite::peers::Peers;

    /// A stand-in driver speaking `--steer`: `script` is Python run on each asked line `a`
    /// (a dict) after `ready`.
    fn driver(per_cell: &str, wait: Duration) -> Steered {
        let program = format!(
            "import json, sys\n\
             print(json.dumps({{'kind': 'ready'}}), flush=True)\n\
             for line in sys.stdin:\n    a = json.loads(line)\n{per_cell}"
        );
        let mut command = Command::new("python3");
        command.args(["-c", &program]);
        Steered::spawn(command, wait).expect("python3 starts")
    }

    const ANSWER: &str = "    print(json.dumps({'kind': 'sample', 'peer': 'MPI one host (C)', \
        'mode': a['mode'], 'size': a['size'], 'buffers': a['buffers'], 'value': 1 + a['rep'], \
        'cpu_s': 0.1, 'seconds': 0.2, 'transfer': 'one_copy'}), flush=True)\n    \
        print(json.dumps({'kind': 'cell_done'}), flush=True)\n";

    #[test]
    fn each_asked_case_comes_back_as_the_drivers_samples_of_that_case() {
        let cases = cases::matrix(cases::sizes(false, true), 64);
        let mut steered = driver(ANSWER, CELL_WAIT);
        for rep in 0..2 {
            for case in &cases {
                steered.measure(rep, case);
            }
        }
        let records = steered.finish();
        assert!(!records.contains("cell_done") && !records.contains("ready"));
        let peers = Peers::parse(&records);
        assert!(peers.failed.is_empty(), "{:?}", peers.failed);
        for case in &cases {
            assert_eq!(
                peers.samples("MPI one host (C)", case),
                [1.0, 2.0],
                "{}: one sample per repetition, in order",
                case.label()
            );
        }
    }

    #[test]
    fn a_driver_that_exits_mid_cell_fails_the_peers_and_is_not_asked_again() {
        let cases = cases::matrix(cases::sizes(false, true), 64);
        let mut steered = driver(&format!("{ANSWER}    sys.exit(3)\n"), CELL_WAIT);
        steered.measure(0, &cases[0]);
        steered.measure(0, &cases[1]); // it exited after the first cell
        steered.measure(0, &cases[2]);
        let peers = Peers::parse(&steered.finish());
        assert_eq!(peers.samples("MPI one host (C)", &cases[0]), [1.0]);
        assert!(peers.samples("MPI one host (C)", &cases[1]).is_empty());
        assert_eq!(peers.failed.len(), 1, "{:?}", peers.failed);
        // Its exit is seen when the next cell is asked for (the write or the wait for it).
        let why = &peers.failed[0].1;
        assert!(why.starts_with(&cases[1].label()), "{why}");
        assert!(
            why.contains("the driver exited") || why.contains("could not ask"),
            "{why}"
        );
    }

    #[test]
    fn a_driver_that_never_gets_ready_is_known_failed_before_any_cell() {
        let mut command = Command::new("python3");
        command.args(["-c", "import sys; sys.exit(2)"]);
        let steered = Steered::spawn(command, CELL_WAIT).expect("python3 starts");
        // `start` then leaves the C peers to the main driver instead.
        let why = steered.failed.clone().unwrap_or_default();
        assert!(why.starts_with("setting up: the driver exited"), "{why}");
    }

    #[test]
    fn a_silent_driver_is_given_up_on_after_the_wait_and_killed() {
        let cases = cases::matrix(cases::sizes(false, true), 64);
        let mut steered = driver(
            "    import time; time.sleep(60)\n",
            Duration::from_millis(300),
        );
        let began = Instant::now();
        steered.measure(0, &cases[0]);
        steered.measure(0, &cases[1]);
        let peers = Peers::parse(&steered.finish());
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "waited {:?} for a driver that never answers",
            began.elapsed()
        );
        assert_eq!(peers.failed.len(), 1, "{:?}", peers.failed);
        assert!(
            peers.failed[0].1.contains("no answer within"),
            "{:?}",
            peers.failed
        );
    }
}
