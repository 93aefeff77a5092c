//! The physical references the tables divide by — iperf3 over loopback or across the test bed
//! (what one TCP stream moves here) and single-thread memcpy (what one copy costs) — and the
//! receivers' peak memory for one 1 GiB message.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::suite::columns::{Column, Lanes};
use crate::suite::{Plan, median};
use crate::{Mode, Options, measure};

pub(crate) struct References {
    /// iperf3 single-stream GB/s (loopback, or across the test bed) per repetition, or why
    /// it is missing.
    pub(crate) iperf3: Result<Vec<f64>, String>,
    /// iperf3's version line.
    pub(crate) iperf3_version: Option<String>,
    /// Warm single-thread memcpy GB/s per repetition, for each size ≥ 1 MiB.
    pub(crate) memcpy: Vec<(usize, Vec<f64>)>,
}

impl References {
    pub(crate) fn measure(plan: &Plan) -> Self {
        let seconds = if plan.quick { 1 } else { 3 };
        let iperf3 = if plan.smoke {
            Err("not run in --smoke (a correctness check)".to_owned())
        } else {
            (0..plan.reps)
                .map(|_| iperf3_once(seconds))
                .collect::<Result<Vec<_>>>()
                .map_err(|e| format!("{e:#}"))
        };
        let budget = Duration::from_millis(if plan.quick { 100 } else { 500 });
        let memcpy = plan
            .sizes
            .iter()
            .filter(|&&size| size >= 1 << 20)
            .map(|&size| {
                let runs = (0..plan.reps)
                    .map(|_| crate::memcpy::bandwidth(size, budget))
                    .collect();
                (size, runs)
            })
            .collect();
        Self {
            iperf3,
            iperf3_version: iperf3_version(),
            memcpy,
        }
    }

    pub(crate) fn iperf3_median(&self) -> f64 {
        self.iperf3.as_ref().map_or(f64::NAN, |runs| median(runs))
    }

    pub(crate) fn memcpy_median(&self, size: usize) -> f64 {
        self.memcpy
            .iter()
            .find(|(s, _)| *s == size)
            .map_or(f64::NAN, |(_, runs)| median(runs))
    }
}

/// One iperf3 run: single stream over loopback (or, with `--netns`, from this host to the
/// fixtures' host), GB/s received.
fn iperf3_once(seconds: u32) -> Result<f64> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port()
        .to_string();
    let server_ip = crate::placement::server_ip().to_string();
    let mut server = crate::placement::server_command("iperf3")
        .args(["-s", "-1", "-B", &server_ip, "-p", &port])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("iperf3 is not installed (apt-get install iperf3)")?;
    std::thread::sleep(Duration::from_millis(300));
    let output = Command::new("iperf3")
        .args([
            "-c",
            &server_ip,
            "-p",
            &port,
            "-t",
            &seconds.to_string(),
            "-J",
        ])
        .output();
    // A one-off server (`-1`) whose client failed would wait for ever: it is ended either way.
    let _ = server.kill();
    let _ = server.wait();
    let output = output.context("running the iperf3 client")?;
    let json: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let bits = json["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("iperf3 printed no received rate")?;
    Ok(bits / 8e9)
}

fn iperf3_version() -> Option<String> {
    let out = Command::new("iperf3").arg("--version").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(str::to_owned)
}

/// Each cross-process column's fresh receiver after one 1 GiB one-way message: its peak
/// resident memory (`VmHWM`).
pub(crate) fn peak_rss_for_one_gib(
    exe: &Path,
    options: &Options,
    columns: &[Column],
) -> Vec<(Column, Result<u64, String>)> {
    let message = measure::message(1 << 30, 1);
    let run = Options {
        mode: Mode::OneWay,
        size: 1 << 30,
        buffers: 1,
        duration: Duration::ZERO,
        messages: Some(1),
        ..options.clone()
    };
    columns
        .iter()
        // A column that spins through gaps measures the sporadic row only.
        .filter(|c| c.crosses_processes() && !c.spins_through_gaps())
        .map(|&column| {
            let found = Lanes::single(exe, options, column)
                .and_then(|mut lanes| {
                    let lane = lanes.lanes.first_mut().context("no lane")?;
                    lane.measure(&run, &message)?;
                    lane.server_peak_rss()
                })
                .map_err(|e| format!("{e:#}"));
            (column, found)
        })
        .collect()
}
