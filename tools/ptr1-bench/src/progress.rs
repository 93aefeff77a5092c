//! Progress of a long measurement on stderr: a bar with the step and an ETA on a terminal,
//! one plain line per step otherwise (CI logs).

use std::io::IsTerminal;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

/// Steps of one part of a run.
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    total: u64,
    done: u64,
    started: Instant,
    title: &'static str,
}

impl Progress {
    pub(crate) fn new(title: &'static str, total: usize) -> Self {
        let total = total as u64;
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} (ETA {eta})")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            bar.set_prefix(title);
            bar
        });
        Self {
            bar,
            total,
            done: 0,
            started: Instant::now(),
            title,
        }
    }

    /// One step (`label`) finished.
    pub(crate) fn step(&mut self, label: &str) {
        self.done += 1;
        match &self.bar {
            Some(bar) => {
                bar.set_message(label.to_owned());
                bar.inc(1);
            }
            None => {
                let elapsed = self.started.elapsed().as_secs_f64();
                let eta =
                    elapsed / self.done as f64 * (self.total - self.done.min(self.total)) as f64;
                eprintln!(
                    "{} {}/{}: {label} (ETA {eta:.0} s)",
                    self.title, self.done, self.total
                );
            }
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
