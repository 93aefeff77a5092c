//! The HTTP/2 part of `ptr1-bench compare`: one engine fixture serving PTR1, h2c and TLS on
//! one port (a throwaway CA), measured one way with each, interleaved; and the receiver's peak
//! RSS for one 1 GiB message over each HTTP/2 wire.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;

use crate::compare::{Measurement, Server, human, measured, pick};
use crate::report::say;
use crate::{Handlers, Mode, Options, Transport, engine_side, measure};

/// The columns: the same server, three ways in.
const WIRES: [Transport; 3] = [Transport::Engine, Transport::H2c, Transport::Tls];

pub(crate) fn compare(exe: &Path, options: &Options, reps: usize, seconds: f64) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("ptr1-bench-tls-{}", std::process::id()));
    let dir_text = dir.display().to_string();
    let server = Server::start_with(
        exe,
        Transport::Engine,
        options.handlers,
        &["--tls-self-signed", &dir_text],
    )?;
    let client_options = Options {
        ca: Some(dir.join("ca.pem").display().to_string()),
        ..options.clone()
    };
    let clients = WIRES
        .iter()
        .map(|&wire| engine_side::client(wire, &client_options))
        .collect::<Result<Vec<_>>>()?;
    let sizes: &[usize] = if options.smoke {
        &[64 << 10]
    } else if options.quick {
        &[1 << 20, 64 << 20]
    } else {
        &[1 << 20, 64 << 20, 256 << 20]
    };
    let mut results = vec![vec![Vec::<Measurement>::new(); WIRES.len()]; sizes.len()];
    let mut progress = crate::progress::Progress::new("HTTP/2", reps * sizes.len());
    for rep in 0..reps {
        for (s, &size) in sizes.iter().enumerate() {
            let message = measure::message(size, 1);
            let run = Options {
                mode: Mode::OneWay,
                size,
                buffers: 1,
                duration: Duration::from_secs_f64(seconds),
                ..client_options.clone()
            };
            for k in 0..WIRES.len() {
                let w = (k + rep + s) % WIRES.len();
                let m = measured(&server, || {
                    engine_side::measure(&clients[w], server.addr, &run, &message)
                })?;
                results[s][w].push(m);
            }
            progress.step(&format!(
                "rep {}/{reps}: HTTP/2 one-way {}",
                rep + 1,
                human(size)
            ));
        }
    }
    drop(server);
    say!(
        "\nHTTP/2 next to PTR1 (one engine fixture, one port; TLS 1.3 with ring; medians of {reps}):\n"
    );
    say!(
        "| one-way | PTR1 (io_uring) | h2c | TLS | h2c ÷ PTR1 | TLS ÷ PTR1 | CPU s/GB PTR1 / h2c / TLS |"
    );
    say!("|---|---:|---:|---:|---:|---:|---|");
    for (size, per_wire) in sizes.iter().zip(&results) {
        let gb: Vec<f64> = per_wire.iter().map(|r| pick(r, |m| m.gb_per_s)).collect();
        crate::report::throughput("h2c", *size, gb[1]);
        crate::report::throughput("tls", *size, gb[2]);
        let cpu: Vec<f64> = per_wire
            .iter()
            .map(|r| pick(r, |m| m.cpu_s_per_gb))
            .collect();
        say!(
            "| {} × 1 | {:.2} GB/s | {:.2} GB/s | {:.2} GB/s | {:.2}× | {:.2}× | {:.2} / {:.2} / {:.2} |",
            human(*size),
            gb[0],
            gb[1],
            gb[2],
            gb[1] / gb[0],
            gb[2] / gb[0],
            cpu[0],
            cpu[1],
            cpu[2]
        );
    }
    if !options.quick {
        print_rss(exe, &client_options)?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Peak RSS of a fresh receiver after one 1 GiB message over h2c and over TLS.
fn print_rss(exe: &Path, options: &Options) -> Result<()> {
    let message = measure::message(1 << 30, 1);
    say!("\nreceiver peak RSS after one 1 GiB message over HTTP/2:");
    for wire in [Transport::H2c, Transport::Tls] {
        let dir = std::env::temp_dir().join(format!(
            "ptr1-bench-rss-{}-{}",
            std::process::id(),
            wire.name()
        ));
        let dir_text = dir.display().to_string();
        let server = Server::start_with(
            exe,
            Transport::Engine,
            Handlers::Core,
            &["--tls-self-signed", &dir_text],
        )?;
        let wire_options = Options {
            ca: Some(dir.join("ca.pem").display().to_string()),
            mode: Mode::OneWay,
            size: 1 << 30,
            buffers: 1,
            duration: Duration::ZERO,
            ..options.clone()
        };
        let client = engine_side::client(wire, &wire_options)?;
        engine_side::measure(&client, server.addr, &wire_options, &message)?;
        let rss = measure::peak_rss(server.pid())?;
        say!(
            "  {}: {:.2} GiB",
            wire.name(),
            rss as f64 / f64::from(1u32 << 30)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
