//! Messages, timing loops, CPU and memory readings shared by every transport.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use bytes::Bytes;
use hdrhistogram::Histogram;
use tensorwire_proto::TensorMessage;

use crate::{Mode, Options};

/// A message with `size` payload bytes split over `buffers` buffers (the last takes the rest).
pub(crate) fn message(size: usize, buffers: usize) -> TensorMessage {
    let each = size / buffers;
    let mut parts: Vec<Bytes> = (0..buffers)
        .map(|i| {
            let len = if i + 1 == buffers {
                size - each * (buffers - 1)
            } else {
                each
            };
            Bytes::from(vec![0xA5u8 ^ (i.to_le_bytes()[0]); len])
        })
        .collect();
    parts.shrink_to_fit();
    TensorMessage::new(1, Bytes::from_static(b"{\"dtype\":\"u8\"}"), parts)
}

/// Checks a sink's answer: the payload byte count as decimal ASCII.
pub(crate) fn check_sink_ack(msg_type: &str, data: &[u8], expected: u64) -> Result<()> {
    if msg_type != "ack" || data != expected.to_string().as_bytes() {
        bail!(
            "sink answered {msg_type:?} {:?}, expected ack {expected}",
            String::from_utf8_lossy(data)
        );
    }
    Ok(())
}

/// What one measurement found.
#[derive(Debug)]
pub(crate) struct Sample {
    pub(crate) ops: u64,
    pub(crate) payload_bytes: u64,
    /// Payload bytes moved before the timing started (the warm-up): CPU readings taken around
    /// the whole call count them too.
    pub(crate) untimed_bytes: u64,
    pub(crate) elapsed: Duration,
    /// The untimed sleeps before the operations (`--gap`), left out of `elapsed`.
    pub(crate) slept: Duration,
    /// Per-operation latency in nanoseconds (tensorwire clients in every mode, seed and std in
    /// the sequential ones; in flight, from send to reply): an HDR histogram, 3 significant
    /// digits, 1 ns to 1 hour.
    pub(crate) latencies: Histogram<u64>,
    /// Whether every echoed payload was checked byte for byte.
    pub(crate) verified: bool,
}

impl Default for Sample {
    fn default() -> Self {
        Self {
            ops: 0,
            payload_bytes: 0,
            untimed_bytes: 0,
            elapsed: Duration::ZERO,
            slept: Duration::ZERO,
            latencies: Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
                .unwrap_or_else(|_| Histogram::new(3).unwrap_or_else(|_| unreachable!())),
            verified: false,
        }
    }
}

impl Sample {
    pub(crate) fn gb_per_s(&self) -> f64 {
        self.payload_bytes as f64 / 1e9 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub(crate) fn ops_per_s(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// What each `--gap` sleep took on average, in µs (0 without a gap).
    pub(crate) fn gap_us(&self) -> f64 {
        self.slept.as_secs_f64() * 1e6 / self.ops.max(1) as f64
    }

    /// The latency at `quantile` in µs; NaN when nothing was timed.
    pub(crate) fn latency_us(&self, quantile: f64) -> f64 {
        if self.latencies.is_empty() {
            return f64::NAN;
        }
        self.latencies.value_at_quantile(quantile) as f64 / 1e3
    }

    /// Records one operation's latency.
    pub(crate) fn record(&mut self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.latencies.saturating_record(ns.max(1));
    }

    pub(crate) fn to_json(&self, options: &Options) -> serde_json::Value {
        let max = if self.latencies.is_empty() {
            f64::NAN
        } else {
            self.latencies.max() as f64 / 1e3
        };
        serde_json::json!({
            "transport": options.transport.name(),
            "mode": format!("{:?}", options.mode),
            "size": options.size,
            "buffers": options.buffers,
            "inflight": if options.mode == Mode::InFlight { options.inflight } else { 1 },
            "ops": self.ops,
            "payload_bytes": self.payload_bytes,
            "seconds": self.elapsed.as_secs_f64(),
            "gb_per_s": self.gb_per_s(),
            "ops_per_s": self.ops_per_s(),
            "latency_p50_us": self.latency_us(0.5),
            "latency_p90_us": self.latency_us(0.9),
            "latency_p99_us": self.latency_us(0.99),
            "latency_p999_us": self.latency_us(0.999),
            "latency_max_us": max,
            // A sleep overshoots by the timer slack: this says by how much.
            "gap_us": self.gap_us(),
            "verified": self.verified,
        })
    }
}

/// Runs `op` back to back — exactly `options.messages` times, or for about `options.duration`
/// (at least `min_ops` times) — and times each call. With `options.gap`, each call follows an
/// untimed sleep of that long, left out of the elapsed time the rates are computed over.
pub(crate) fn sequential(
    options: &Options,
    min_ops: u64,
    bytes_per_op: u64,
    mut op: impl FnMut() -> Result<()>,
) -> Result<Sample> {
    op()?; // warm-up: connection set-up and first-touch memory are not measured
    let started = Instant::now();
    let mut sample = Sample {
        untimed_bytes: bytes_per_op,
        ..Sample::default()
    };
    while options.more(started, sample.ops, min_ops) {
        if !options.gap.is_zero() {
            let before = Instant::now();
            std::thread::sleep(options.gap);
            sample.slept += before.elapsed();
        }
        let t = Instant::now();
        op()?;
        sample.record(t.elapsed());
        sample.ops += 1;
        sample.payload_bytes += bytes_per_op;
    }
    sample.elapsed = started.elapsed().saturating_sub(sample.slept);
    Ok(sample)
}

impl Options {
    /// Whether a measurement that started at `started` and did `ops` goes on.
    pub(crate) fn more(&self, started: Instant, ops: u64, min_ops: u64) -> bool {
        match self.messages {
            Some(n) => ops < n,
            None => ops < min_ops || started.elapsed() < self.duration,
        }
    }
}

/// The fewest round trips a timed sequential or in-flight run makes: enough for percentiles
/// when messages are small, three when each takes milliseconds.
pub(crate) fn min_round_trips(bytes_per_op: u64) -> u64 {
    if bytes_per_op <= 1 << 20 { 100 } else { 3 }
}

/// Checks an echo's reply: every byte with `options.verify`, else its length.
pub(crate) fn check_echo(
    options: &Options,
    sent: &TensorMessage,
    got: &TensorMessage,
) -> Result<()> {
    if options.verify {
        return verify_echo(sent, got);
    }
    if got.total_bytes() != sent.total_bytes() {
        bail!(
            "echo answered {} bytes, {} were sent",
            got.total_bytes(),
            sent.total_bytes()
        );
    }
    Ok(())
}

/// Checks an echoed message against what was sent (`--verify`): every byte of every buffer.
pub(crate) fn verify_echo(sent: &TensorMessage, got: &TensorMessage) -> Result<()> {
    if got.buffers.len() != sent.buffers.len() {
        bail!(
            "verify: {} buffers came back, {} were sent",
            got.buffers.len(),
            sent.buffers.len()
        );
    }
    for (i, (a, b)) in sent.buffers.iter().zip(&got.buffers).enumerate() {
        if a != b {
            let at = a.iter().zip(b.iter()).position(|(x, y)| x != y);
            bail!(
                "verify: buffer {i} differs ({} bytes sent, {} back, first difference at {at:?})",
                a.len(),
                b.len()
            );
        }
    }
    if got.metadata != sent.metadata || got.version != sent.version {
        bail!("verify: the metadata or version came back changed");
    }
    Ok(())
}

/// CPU time (user + system) of a process so far: `None` is this process.
pub(crate) fn cpu_time(pid: Option<u32>) -> Result<Duration> {
    let path = pid.map_or_else(
        || "/proc/self/stat".to_owned(),
        |p| format!("/proc/{p}/stat"),
    );
    let stat = std::fs::read_to_string(&path)?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat
        .rsplit_once(')')
        .map_or(stat.as_str(), |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11).and_then(|f| f.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|f| f.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
    Ok(Duration::from_secs_f64(
        ticks as f64 / per_second.max(1) as f64,
    ))
}

/// Peak resident memory (VmHWM) of a process, in bytes.
/// Resident memory of process `pid` now (`VmRSS`).
pub(crate) fn rss(pid: u32) -> Result<u64> {
    status_kib(pid, "VmRSS:").map(|kib| kib * 1024)
}

fn status_kib(pid: u32, key: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok(status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0))
}

pub(crate) fn peak_rss(pid: u32) -> Result<u64> {
    status_kib(pid, "VmHWM:").map(|kib| kib * 1024)
}

/// Where a frame's vectored write stands when writes may be short (the baselines' sender).
pub(crate) struct WriteCursor<'a> {
    slices: Vec<&'a [u8]>,
    /// First slice not completely written.
    index: usize,
    /// Bytes of `slices[index]` already written.
    offset: usize,
}

impl<'a> WriteCursor<'a> {
    pub(crate) fn new(encoded: &'a tensorwire_proto::Encoded) -> Self {
        Self {
            slices: encoded.slices().collect(),
            index: 0,
            offset: 0,
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.index == self.slices.len()
    }

    /// The next at most `max` slices to hand to `write_vectored`.
    pub(crate) fn batch(&self, max: usize) -> Vec<std::io::IoSlice<'_>> {
        self.slices[self.index..]
            .iter()
            .take(max)
            .enumerate()
            .map(|(k, s)| std::io::IoSlice::new(if k == 0 { &s[self.offset..] } else { s }))
            .collect()
    }

    /// Records a write of `written` bytes.
    pub(crate) fn advance(&mut self, mut written: usize) -> Result<()> {
        if written == 0 {
            bail!("connection closed while writing");
        }
        while written > 0 && !self.is_done() {
            let left = self.slices[self.index].len() - self.offset;
            if written >= left {
                written -= left;
                self.index += 1;
                self.offset = 0;
            } else {
                self.offset += written;
                written = 0;
            }
        }
        Ok(())
    }
}
