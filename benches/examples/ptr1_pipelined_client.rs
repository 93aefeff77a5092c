//! What a PTR1 server gives a client that pipelines: one thread spinning over non-blocking
//! connections to a running server (`ptr1-bench serve`), each carrying `depth` asks to
//! `/actors/echo` at once and writing every ask it can send in one write, as MPI's TCP progress
//! loop does. Replies are decoded in order; a reply of the wrong kind or length stops the run.
//!
//! `cargo run --release -p tensorwire-benches --example ptr1_pipelined_client -- ADDR
//! [SECONDS] [BYTES] [CONNECTIONS,...]` (default 1 s, 4096, `64,8,1`) prints asks/s for 64 asks
//! in flight as 64 connections × 1 (what PTR1 clients do today), 8 × 8 and 1 × 64. `docs/benchmarks.md`
//! ("What bounds 64 asks in flight") compares servers with it.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_proto::ptr1::{self, Decoder, Frame};
use tensorwire_proto::{Limits, TensorMessage};

const IN_FLIGHT: usize = 64;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(addr) = args.next() else {
        eprintln!("usage: ptr1_pipelined_client ADDR [SECONDS] [BYTES]");
        std::process::exit(2);
    };
    let seconds: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1.0);
    let size: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4096);
    let conns: Vec<usize> = args
        .next()
        .map(|list| list.split(',').filter_map(|c| c.parse().ok()).collect())
        .unwrap_or_else(|| vec![64, 8, 1]);
    let message = TensorMessage::new(1, Bytes::new(), vec![Bytes::from(vec![7u8; size])]);
    let ask = ptr1::encode(
        &Frame::Ask {
            path: "/actors/echo".into(),
            message,
        },
        &Limits::default(),
    )
    .expect("a small ask encodes")
    .to_vec();
    println!("{IN_FLIGHT} asks of {size} bytes in flight to {addr}, {seconds} s per line");
    for conns in conns {
        let rate = measure(&addr, conns, &ask, size, Duration::from_secs_f64(seconds));
        println!(
            "{conns:>2} connection(s) × {:>2} asks: {rate:>9.0} asks/s",
            IN_FLIGHT / conns
        );
    }
}

/// One connection: asks owed, bytes to write, replies being decoded.
struct Conn {
    stream: TcpStream,
    decoder: Decoder,
    output: Vec<u8>,
    written: usize,
    /// Asks to send as soon as the output is written.
    owed: usize,
}

fn measure(addr: &str, conns: usize, ask: &[u8], size: usize, duration: Duration) -> f64 {
    let depth = IN_FLIGHT / conns;
    let mut ends: Vec<Conn> = (0..conns)
        .map(|_| {
            let stream = TcpStream::connect(addr).expect("connect to the server");
            stream.set_nodelay(true).expect("TCP_NODELAY");
            stream.set_nonblocking(true).expect("non-blocking");
            Conn {
                stream,
                decoder: Decoder::new(Limits::default()),
                output: Vec::new(),
                written: 0,
                owed: depth,
            }
        })
        .collect();
    let mut input = vec![0u8; 256 << 10];
    let mut replies = 0u64;
    let (mut reads, mut writes) = (0u64, 0u64);
    let start = Instant::now();
    let mut counting_from = None;
    while start.elapsed() < duration {
        for end in &mut ends {
            // Everything owed goes in one write.
            if end.written == end.output.len() && end.owed > 0 {
                end.output.clear();
                end.written = 0;
                for _ in 0..end.owed {
                    end.output.extend_from_slice(ask);
                }
                end.owed = 0;
            }
            if end.written < end.output.len() {
                match end.stream.write(&end.output[end.written..]) {
                    Ok(n) => {
                        end.written += n;
                        writes += 1;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => panic!("write: {e}"),
                }
            }
            let n = match end.stream.read(&mut input) {
                Ok(0) => panic!("the server closed the connection"),
                Ok(n) => {
                    reads += 1;
                    n
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
                Err(e) => panic!("read: {e}"),
            };
            let mut rest = &input[..n];
            while !rest.is_empty() {
                let (used, frame) = end.decoder.decode(rest).expect("a well-formed reply");
                rest = &rest[used..];
                match frame {
                    None => {}
                    Some(Frame::TensorResponse(reply))
                        if reply.buffers.len() == 1 && reply.buffers[0].len() == size =>
                    {
                        end.owed += 1;
                        replies += 1;
                    }
                    Some(other) => panic!("unexpected reply: {other:?}"),
                }
            }
        }
        // The first tenth warms up.
        if counting_from.is_none() && start.elapsed() >= duration / 10 {
            counting_from = Some((Instant::now(), replies));
        }
    }
    println!(
        "    {:.1} replies per read, {:.1} asks per write",
        replies as f64 / reads.max(1) as f64,
        replies as f64 / writes.max(1) as f64
    );
    let (since, before) = counting_from.unwrap_or((start, 0));
    (replies - before) as f64 / since.elapsed().as_secs_f64()
}
