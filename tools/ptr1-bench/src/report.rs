//! What `compare` found, kept as it is printed: the markdown tables (`say!` prints a line and
//! keeps it), and the points the plots are drawn from. `--out DIR` writes them to files.

use std::sync::{Mutex, PoisonError};

/// Everything one run reported.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// The printed text, line by line.
    pub(crate) text: String,
    /// One-way throughput: (series, message size in bytes, GB/s).
    pub(crate) throughput: Vec<(String, usize, f64)>,
    /// Ask round-trip p50: (series, message size in bytes, µs).
    pub(crate) latency: Vec<(String, usize, f64)>,
    /// Horizontal references on the throughput plot: (name, GB/s).
    pub(crate) references: Vec<(String, f64)>,
    /// Series drawn dashed (measured from Python).
    pub(crate) dashed: Vec<String>,
}

static REPORT: Mutex<Report> = Mutex::new(Report {
    text: String::new(),
    throughput: Vec::new(),
    latency: Vec::new(),
    references: Vec::new(),
    dashed: Vec::new(),
});

fn with<T>(f: impl FnOnce(&mut Report) -> T) -> T {
    f(&mut REPORT.lock().unwrap_or_else(PoisonError::into_inner))
}

/// Prints `line` and keeps it for the report file.
pub(crate) fn say_line(line: &str) {
    println!("{line}");
    with(|r| {
        r.text.push_str(line);
        r.text.push('\n');
    });
}

/// `println!` that also keeps the line (see [`say_line`]).
macro_rules! say {
    () => { $crate::report::say_line("") };
    ($($arg:tt)*) => { $crate::report::say_line(&format!($($arg)*)) };
}
pub(crate) use say;

/// Records a one-way throughput point.
pub(crate) fn throughput(series: &str, size: usize, gb_per_s: f64) {
    if gb_per_s.is_finite() && gb_per_s > 0.0 {
        with(|r| r.throughput.push((series.to_owned(), size, gb_per_s)));
    }
}

/// Records an ask round-trip p50.
pub(crate) fn latency(series: &str, size: usize, micros: f64) {
    if micros.is_finite() && micros > 0.0 {
        with(|r| r.latency.push((series.to_owned(), size, micros)));
    }
}

/// Records a reference line (iperf3, memcpy).
pub(crate) fn reference(name: &str, gb_per_s: f64) {
    if gb_per_s.is_finite() && gb_per_s > 0.0 {
        with(|r| r.references.push((name.to_owned(), gb_per_s)));
    }
}

/// Draws `series` dashed on the plots.
pub(crate) fn dashed(series: &str) {
    with(|r| {
        if !r.dashed.iter().any(|d| d == series) {
            r.dashed.push(series.to_owned());
        }
    });
}

/// Writes `table.md`, `throughput.svg` and `latency.svg` into `dir`; returns the paths.
pub(crate) fn write(dir: &std::path::Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let (text, throughput, latency, references, dashed) = with(|r| {
        (
            r.text.clone(),
            r.throughput.clone(),
            r.latency.clone(),
            r.references.clone(),
            r.dashed.clone(),
        )
    });
    let table = dir.join("table.md");
    std::fs::write(&table, text)?;
    let through = dir.join("throughput.svg");
    std::fs::write(
        &through,
        crate::svg::throughput(&throughput, &references, &dashed),
    )?;
    let lat = dir.join("latency.svg");
    std::fs::write(&lat, crate::svg::latency(&latency, &dashed))?;
    Ok(vec![table, through, lat])
}
