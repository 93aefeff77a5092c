//! Blocking `std::net`: one thread per connection, `write_vectored` (1024 slices per call) and
//! `read_exact`. The simplest thing one would write by hand; the latency reference.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use tensorwire_proto::ptr1::{self, Frame};
use tensorwire_proto::{Body, Encoded, FixedHeader, Format, Limits, TensorMessage};

use crate::measure::{
    Sample, WriteCursor, check_echo, check_sink_ack, min_round_trips, sequential,
};
use crate::seed::fixture_reply;
use crate::{Mode, Options};

const MAX_SLICES: usize = 1024;

pub(crate) fn serve(listen: SocketAddr) -> Result<()> {
    let choice = crate::socket_options::choice()?;
    let listener = crate::socket_options::listen(listen, &choice)?;
    println!("listening on {}", listener.local_addr()?);
    std::io::stdout().flush()?;
    for stream in listener.incoming() {
        let mut stream = stream?;
        crate::socket_options::like_tensorwire(&stream, &choice);
        std::thread::spawn(move || {
            let limits = Limits::default();
            while let Ok(Some(frame)) = read_frame(&mut stream, &limits) {
                let Ok(reply) = ptr1::encode(&fixture_reply(frame), &limits) else {
                    break;
                };
                if write_frame(&mut stream, &reply).is_err() {
                    break;
                }
            }
        });
    }
    Ok(())
}

fn read_frame(stream: &mut TcpStream, limits: &Limits) -> Result<Option<Frame>> {
    let mut head = [0u8; ptr1::FIXED_HEADER_LEN];
    match stream.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let fixed = FixedHeader::parse(Format::Ptr1, &head, limits)?;
    let mut table = vec![0u8; fixed.table_len()?];
    stream.read_exact(&mut table)?;
    let mut body = Body::new(fixed.layout(&table, limits)?);
    body.expose(usize::MAX, &mut |len| {
        Ok::<_, tensorwire_proto::WireError>(vec![0u8; len])
    })?;
    let mut received = 0;
    for section in body.unfilled() {
        stream.read_exact(section)?;
        received += section.len();
    }
    body.advance(received)?;
    Ok(Some(Frame::from_body(body)?))
}

fn write_frame(stream: &mut TcpStream, encoded: &Encoded) -> Result<()> {
    let mut cursor = WriteCursor::new(encoded);
    while !cursor.is_done() {
        let written = stream.write_vectored(&cursor.batch(MAX_SLICES))?;
        cursor.advance(written)?;
    }
    Ok(())
}

fn ask(stream: &mut TcpStream, path: &str, message: &TensorMessage) -> Result<Frame> {
    let limits = Limits::default();
    let frame = Frame::Ask {
        path: path.to_owned(),
        message: message.clone(),
    };
    write_frame(stream, &ptr1::encode(&frame, &limits)?)?;
    read_frame(stream, &limits)?.context("server closed the connection")
}

fn connect(peer: SocketAddr) -> Result<TcpStream> {
    crate::socket_options::connect(peer)
}

pub(crate) fn run(peer: SocketAddr, options: &Options, message: &TensorMessage) -> Result<Sample> {
    let total = message.total_bytes();
    match options.mode {
        Mode::OneWay | Mode::Rtt => {
            let mut stream = connect(peer)?;
            let (path, min_ops) = if options.mode == Mode::OneWay {
                ("/actors/sink", 3)
            } else {
                ("/actors/echo", min_round_trips(total))
            };
            sequential(options, min_ops, total, || {
                match ask(&mut stream, path, message)? {
                    Frame::SingleResponse { msg_type, data, .. } => {
                        check_sink_ack(&msg_type, &data, total)
                    }
                    Frame::TensorResponse(reply) => check_echo(options, message, &reply),
                    other => Err(anyhow!("unexpected reply {other:?}")),
                }
            })
            .map(|mut sample| {
                sample.verified = options.verify && options.mode == Mode::Rtt;
                sample
            })
        }
        Mode::Tell => anyhow::bail!("tell mode needs a tensorwire client"),
        Mode::InFlight => {
            let deadline = Instant::now() + options.duration.max(Duration::from_millis(100));
            let started = Instant::now();
            let threads: Vec<_> = (0..options.inflight)
                .map(|_| {
                    let (message, options) = (message.clone(), options.clone());
                    std::thread::spawn(move || -> Result<u64> {
                        let mut stream = connect(peer)?;
                        let mut ops = 0;
                        while Instant::now() < deadline {
                            match ask(&mut stream, "/actors/echo", &message)? {
                                Frame::TensorResponse(reply) => {
                                    check_echo(&options, &message, &reply)?;
                                }
                                other => return Err(anyhow!("unexpected reply {other:?}")),
                            }
                            ops += 1;
                        }
                        Ok(ops)
                    })
                })
                .collect();
            let mut sample = Sample::default();
            for thread in threads {
                sample.ops += thread
                    .join()
                    .map_err(|_| anyhow!("client thread panicked"))??;
            }
            sample.elapsed = started.elapsed();
            sample.payload_bytes = sample.ops * total;
            sample.verified = options.verify;
            Ok(sample)
        }
    }
}
