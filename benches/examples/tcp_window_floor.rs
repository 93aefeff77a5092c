//! What loopback TCP gives 64 small asks in flight with no transport around it, spread over
//! fewer or more connections: two threads, each spinning over its non-blocking sockets as MPI's
//! TCP progress loop does, the server echoing every complete request. PTR1 carries one request
//! at a time per connection, so 64 asks in flight take 64 connections; this measures what
//! carrying several per connection (pipelining) would change, with and without writing the
//! messages that are ready on one connection in one system call.
//!
//! `cargo run --release -p tensorwire-benches --example tcp_window_floor [SECONDS] [BYTES]`
//! (default 1 s, 4096) prints asks/s for 64 connections of 1 ask each, then 8, 4 and 1
//! connections of 8, 16 and 64 asks each, once writing each message on its own and once
//! writing every message ready on a connection together. `docs/benchmarks.md` ("What bounds
//! 64 asks in flight") reads tensorwire's in-flight cells against it.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

const IN_FLIGHT: usize = 64;

fn main() {
    let mut args = std::env::args().skip(1);
    let seconds: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1.0);
    let size: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4096);
    let duration = Duration::from_secs_f64(seconds);
    println!("{IN_FLIGHT} asks of {size} bytes in flight, {seconds} s per line");
    for coalesce in [false, true] {
        for conns in [64, 8, 4, 1] {
            let rate = measure(conns, size, coalesce, duration);
            let how = if coalesce {
                "ready messages in one write"
            } else {
                "one write per message"
            };
            println!(
                "{conns:>2} connection(s) × {:>2} asks, {how}: {rate:>9.0} asks/s",
                IN_FLIGHT / conns
            );
        }
    }
}

/// One side's end of a connection: bytes read but not yet whole messages, bytes to write.
struct End {
    stream: TcpStream,
    input: Vec<u8>,
    output: Vec<u8>,
    written: usize,
    /// The peer closed (a read returned 0).
    closed: bool,
}

impl End {
    fn new(stream: TcpStream) -> Self {
        stream.set_nodelay(true).expect("TCP_NODELAY");
        stream.set_nonblocking(true).expect("non-blocking");
        Self {
            stream,
            input: Vec::new(),
            output: Vec::new(),
            written: 0,
            closed: false,
        }
    }

    /// Reads what is there; returns how many whole messages are buffered (and drops them).
    fn take_messages(&mut self, size: usize) -> usize {
        let mut chunk = [0u8; 64 << 10];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    self.closed = true;
                    break;
                }
                Ok(n) => self.input.extend_from_slice(&chunk[..n]),
                // WouldBlock: nothing more now; anything else: the peer is gone.
                Err(_) => break,
            }
        }
        let whole = self.input.len() / size;
        self.input.drain(..whole * size);
        whole
    }

    /// Queues `count` messages; `coalesce`: one write for all of them, else one each.
    fn send(&mut self, count: usize, size: usize, coalesce: bool) {
        for _ in 0..count {
            self.output.resize(self.output.len() + size, 7);
            if !coalesce {
                self.flush();
            }
        }
        self.flush();
    }

    fn flush(&mut self) {
        while self.written < self.output.len() {
            match self.stream.write(&self.output[self.written..]) {
                Ok(n) => self.written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                // The peer is gone (the client closes when its time is up).
                Err(_) => break,
            }
        }
        self.output.clear();
        self.written = 0;
    }
}

fn measure(conns: usize, size: usize, coalesce: bool, duration: Duration) -> f64 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    let mut clients = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..conns {
        clients.push(End::new(TcpStream::connect(address).expect("connect")));
        servers.push(End::new(listener.accept().expect("accept").0));
    }
    let server = std::thread::spawn(move || {
        // Echoes until every client closed.
        while servers.iter().any(|end| !end.closed) {
            for end in &mut servers {
                let whole = end.take_messages(size);
                if whole > 0 {
                    end.send(whole, size, coalesce);
                } else {
                    end.flush();
                }
            }
        }
    });
    let per_conn = IN_FLIGHT / conns;
    for end in &mut clients {
        end.send(per_conn, size, coalesce);
    }
    let start = Instant::now();
    let mut done = 0u64;
    while start.elapsed() < duration {
        for end in &mut clients {
            let whole = end.take_messages(size);
            done += whole as u64;
            if whole > 0 {
                end.send(whole, size, coalesce);
            } else {
                end.flush();
            }
        }
    }
    let rate = done as f64 / start.elapsed().as_secs_f64();
    drop(clients);
    server.join().expect("the echo thread");
    rate
}
