//! The shared-memory part of `ptr1-bench compare`: one engine fixture, reached over PTR1 and
//! over shared memory (buffers copied into a slot, and buffers in loaned slots that travel as
//! they are), interleaved; with warm single-thread memcpy at the same size as the reference.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use tensorwire_engine::{Node, TensorMessage};

use crate::compare::{Measurement, Server, human, measured, pick};
use crate::report::say;
use crate::{Handlers, Mode, Options, Transport, engine_side, measure};

/// The columns.
#[derive(Clone, Copy)]
enum Wire {
    Ptr1,
    Shm,
    Loaned,
}

const WIRES: [Wire; 3] = [Wire::Ptr1, Wire::Shm, Wire::Loaned];

struct Case {
    label: String,
    mode: Mode,
    size: usize,
}

pub(crate) fn compare(exe: &Path, options: &Options, reps: usize, seconds: f64) -> Result<()> {
    let server = Server::start_with(exe, Transport::Engine, Handlers::Core, &[])?;
    let ptr1 = engine_side::client(Transport::Engine, options)?;
    let shm = engine_side::client(Transport::Shm, options)?;
    let sizes: &[usize] = if options.smoke {
        &[4 << 10, 64 << 10]
    } else {
        &[4 << 10, 1 << 20, 64 << 20, 256 << 20]
    };
    let mut cases: Vec<Case> = sizes
        .iter()
        .copied()
        .filter(|&size| !options.quick || size <= 64 << 20)
        .map(|size| Case {
            label: format!("one-way {} × 1", human(size)),
            mode: Mode::OneWay,
            size,
        })
        .collect();
    cases.push(Case {
        label: "ask RTT 4 KiB (p50)".into(),
        mode: Mode::Rtt,
        size: 4 << 10,
    });
    cases.push(Case {
        label: format!("asks 4 KiB, {} in flight", options.inflight),
        mode: Mode::InFlight,
        size: 4 << 10,
    });
    let rss_start = measure::rss(server.pid())?;
    let mut results = vec![vec![Vec::<Measurement>::new(); WIRES.len()]; cases.len()];
    let mut progress = crate::progress::Progress::new("shared memory", reps * cases.len());
    for rep in 0..reps {
        for (c, case) in cases.iter().enumerate() {
            let copied = measure::message(case.size, 1);
            let loaned = loaned_message(&shm, case.size)?;
            let run = Options {
                mode: case.mode,
                size: case.size,
                buffers: 1,
                duration: Duration::from_secs_f64(seconds),
                ..options.clone()
            };
            for k in 0..WIRES.len() {
                let w = (k + rep + c) % WIRES.len();
                let (node, message) = match WIRES[w] {
                    Wire::Ptr1 => (&ptr1, &copied),
                    Wire::Shm => (&shm, &copied),
                    Wire::Loaned => (&shm, &loaned),
                };
                let m = measured(&server, || {
                    engine_side::measure(node, server.addr, &run, message)
                })?;
                results[c][w].push(m);
            }
            progress.step(&format!(
                "rep {}/{reps}: shared memory {}",
                rep + 1,
                case.label
            ));
        }
    }
    let rss_end = measure::rss(server.pid())?;
    drop(server);
    print(&cases, &results, reps, options.quick);
    say!(
        "\nfixture (receiver) RSS: {:.0} MiB after start, {:.0} MiB after every case above",
        rss_start as f64 / f64::from(1u32 << 20),
        rss_end as f64 / f64::from(1u32 << 20)
    );
    Ok(())
}

/// A message whose one buffer lives in a sealed loaned slot of `node`'s.
fn loaned_message(node: &Node, size: usize) -> Result<TensorMessage> {
    let mut loan = node.shm().loan(size)?;
    loan.as_mut_slice().fill(0x5a);
    Ok(TensorMessage::new(
        1,
        bytes::Bytes::new(),
        vec![loan.freeze()?],
    ))
}

fn print(cases: &[Case], results: &[Vec<Vec<Measurement>>], reps: usize, quick: bool) {
    say!(
        "\nShared memory next to PTR1 (one engine fixture, another process; medians of {reps}; \
         loaned = buffers in sealed loaned slots, sent without a copy):\n"
    );
    say!(
        "| case | PTR1 (io_uring) | shm (copied in) | shm (loaned) | shm ÷ PTR1 | loaned ÷ PTR1 | warm memcpy | shm ÷ memcpy |"
    );
    say!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (case, per_wire) in cases.iter().zip(results) {
        let figure = |m: &Measurement| match case.mode {
            Mode::OneWay | Mode::Tell => m.gb_per_s,
            Mode::Rtt => m.latency_p50_us,
            Mode::InFlight => m.ops_per_s,
        };
        let v: Vec<f64> = per_wire.iter().map(|r| pick(r, figure)).collect();
        let (unit, better) = match case.mode {
            Mode::OneWay | Mode::Tell => ("GB/s", [v[1] / v[0], v[2] / v[0]]),
            Mode::Rtt => ("µs", [v[0] / v[1], v[0] / v[2]]),
            Mode::InFlight => ("asks/s", [v[1] / v[0], v[2] / v[0]]),
        };
        let memcpy = (case.mode == Mode::OneWay && case.size >= 1 << 20).then(|| {
            crate::memcpy::bandwidth(
                case.size,
                Duration::from_millis(if quick { 100 } else { 500 }),
            )
        });
        let (memcpy_text, ratio_text) = match memcpy {
            Some(gb) => (format!("{gb:.2} GB/s"), format!("{:.2}×", v[1] / gb)),
            None => ("".into(), "".into()),
        };
        match case.mode {
            Mode::OneWay => {
                crate::report::throughput("shm (copied in)", case.size, v[1]);
                crate::report::throughput("shm (loaned)", case.size, v[2]);
            }
            Mode::Rtt => {
                crate::report::latency("shm (copied in)", v[1]);
                crate::report::latency("shm (loaned)", v[2]);
            }
            Mode::InFlight | Mode::Tell => {}
        }
        let digits = if case.mode == Mode::InFlight { 0 } else { 2 };
        say!(
            "| {} | {:.digits$} {unit} | {:.digits$} {unit} | {:.digits$} {unit} | {:.2}× | {:.2}× | {memcpy_text} | {ratio_text} |",
            case.label,
            v[0],
            v[1],
            v[2],
            better[0],
            better[1]
        );
    }
}
