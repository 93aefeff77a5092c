//! The local-mailbox part of `ptr1-bench compare`: both nodes in this process, so every send
//! goes to the receiver's mailbox without a copy (the receiver aliases the sender's buffers).
//! The fixture's handlers run on the sender's thread (`serve_on_core`).

use std::time::Duration;

use anyhow::Result;
use tensorwire_engine::Node;

use crate::compare::human;
use crate::report::say;
use crate::{Handlers, Mode, Options, engine_side, measure};

pub(crate) fn compare(options: &Options, reps: usize, seconds: f64) -> Result<()> {
    let server = Node::builder("127.0.0.1:0".parse()?)
        .shared_memory(false)
        .build()?;
    engine_side::register_fixture(&server, Handlers::Core)?;
    let client = Node::builder("127.0.0.1:0".parse()?)
        .shared_memory(false)
        .build()?;
    let sizes: &[usize] = if options.smoke {
        &[4 << 10, 64 << 10]
    } else if options.quick {
        &[4 << 10, 1 << 20, 64 << 20]
    } else {
        &[4 << 10, 1 << 20, 64 << 20, 256 << 20]
    };
    let mut cases: Vec<(String, Mode, usize)> = sizes
        .iter()
        .map(|&size| (format!("one-way {} × 1", human(size)), Mode::OneWay, size))
        .collect();
    cases.push(("ask RTT 4 KiB (p50)".into(), Mode::Rtt, 4 << 10));
    cases.push((
        format!("asks 4 KiB, {} in flight", options.inflight),
        Mode::InFlight,
        4 << 10,
    ));
    let mut results = vec![Vec::new(); cases.len()];
    let mut progress = crate::progress::Progress::new("local mailbox", reps * cases.len());
    for rep in 0..reps {
        for (c, (label, mode, size)) in cases.iter().enumerate() {
            let run = Options {
                mode: *mode,
                size: *size,
                buffers: 1,
                duration: Duration::from_secs_f64(seconds),
                ..options.clone()
            };
            let message = measure::message(*size, 1);
            let sample = engine_side::measure(&client, server.local_addr(), &run, &message)?;
            results[c].push(match mode {
                Mode::OneWay | Mode::Tell => sample.gb_per_s(),
                Mode::Rtt => sample.latency_us(0.5),
                Mode::InFlight => sample.ops_per_s(),
            });
            progress.step(&format!("rep {}/{reps}: {label}", rep + 1));
        }
    }
    say!("\nLocal mailbox (both nodes in this process: no socket, no copy; medians of {reps}):\n");
    say!("| case | local mailbox |");
    say!("|---|---:|");
    say!(
        "| (no byte is copied: the GB/s figures are message rate × size, so they are left off the throughput plot) | |"
    );
    for ((label, mode, _size), values) in cases.iter().zip(&mut results) {
        values.sort_by(f64::total_cmp);
        let median = values[values.len() / 2];
        match mode {
            Mode::OneWay | Mode::Tell => {
                say!("| {label} | {median:.2} GB/s |");
            }
            Mode::Rtt => {
                crate::report::latency("local mailbox", median);
                say!("| {label} | {median:.2} µs |");
            }
            Mode::InFlight => say!("| {label} | {median:.0} asks/s |"),
        }
    }
    Ok(())
}
