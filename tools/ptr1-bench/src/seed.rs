//! The seed design on tokio: `write_vectored` with at most 64 slices per call, and `read_exact`
//! of header, table, path, metadata and each buffer, every section into a fresh zero-filled
//! `Vec`.

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use bytes::Bytes;
use tensorwire_proto::ptr1::{self, Frame};
use tensorwire_proto::{
    Body, Encoded, FixedHeader, Format, Layout, Limits, ReceiveBuffer, TensorMessage,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::measure::{
    Sample, WriteCursor, check_echo, check_sink_ack, min_round_trips, sequential,
};
use crate::{Mode, Options};

/// Most slices one `write_vectored` call takes in the seed design.
const MAX_SLICES: usize = 64;

/// The fixture's answer to a request (shared with the blocking server).
pub(crate) fn fixture_reply(frame: Frame) -> Frame {
    match frame {
        Frame::Ask { path, message } if path == "/actors/echo" => Frame::TensorResponse(message),
        Frame::Ask { path, message } if path == "/actors/sink" => Frame::SingleResponse {
            version: message.version,
            msg_type: "ack".into(),
            data: Bytes::from(message.total_bytes().to_string()),
        },
        Frame::Tell { message, .. } => Frame::Ack {
            version: message.version,
        },
        other => Frame::Error {
            version: other.version(),
            text: format!("no fixture endpoint for this {} frame", other.kind()),
        },
    }
}

pub(crate) fn serve(listen: SocketAddr) -> Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let choice = crate::socket_options::choice()?;
        let listener = crate::socket_options::listen(listen, &choice)?;
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        println!("listening on {}", listener.local_addr()?);
        std::io::stdout().flush()?;
        loop {
            let (stream, _) = listener.accept().await?;
            crate::socket_options::like_tensorwire(&stream, &choice);
            tokio::spawn(async move {
                let _ = serve_connection(stream).await;
            });
        }
    })
}

async fn serve_connection(mut stream: TcpStream) -> Result<()> {
    let limits = Limits::default();
    while let Some(frame) = read_frame(&mut stream, &limits).await? {
        let reply = ptr1::encode(&fixture_reply(frame), &limits)?;
        write_frame(&mut stream, &reply).await?;
    }
    Ok(())
}

/// Reads one frame; `None` at a clean end of stream.
async fn read_frame(stream: &mut TcpStream, limits: &Limits) -> Result<Option<Frame>> {
    let mut head = [0u8; ptr1::FIXED_HEADER_LEN];
    match stream.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let fixed = FixedHeader::parse(Format::Ptr1, &head, limits)?;
    let mut table = vec![0u8; fixed.table_len()?];
    stream.read_exact(&mut table).await?;
    let layout = fixed.layout(&table, limits)?;
    // A fresh zero-filled Vec for every section.
    Ok(Some(read_body(stream, layout, |len| vec![0u8; len]).await?))
}

/// Fills a body with one `read_exact` per section.
async fn read_body<B: ReceiveBuffer>(
    stream: &mut TcpStream,
    layout: Layout,
    mut alloc: impl FnMut(usize) -> B,
) -> Result<Frame> {
    let mut body = Body::new(layout);
    body.expose(usize::MAX, &mut |len| {
        Ok::<_, tensorwire_proto::WireError>(alloc(len))
    })?;
    let mut received = 0;
    for section in body.unfilled() {
        stream.read_exact(section).await?;
        received += section.len();
    }
    body.advance(received)?;
    Ok(Frame::from_body(body)?)
}

/// Writes a frame with `write_vectored` calls of at most 64 slices, handling short writes.
async fn write_frame(stream: &mut TcpStream, encoded: &Encoded) -> Result<()> {
    let mut cursor = WriteCursor::new(encoded);
    while !cursor.is_done() {
        let written = stream.write_vectored(&cursor.batch(MAX_SLICES)).await?;
        cursor.advance(written)?;
    }
    stream.flush().await?;
    Ok(())
}

async fn ask(stream: &mut TcpStream, path: &str, message: &TensorMessage) -> Result<Frame> {
    let limits = Limits::default();
    let frame = Frame::Ask {
        path: path.to_owned(),
        message: message.clone(),
    };
    let encoded = ptr1::encode(&frame, &limits)?;
    write_frame(stream, &encoded).await?;
    read_frame(stream, &limits)
        .await?
        .context("server closed the connection")
}

async fn connect(peer: SocketAddr) -> Result<TcpStream> {
    // A blocking connect (instant to the fixture on this host), so the congestion control is
    // asked for before it, as tensorwire's drivers do.
    let stream = crate::socket_options::connect(peer)?;
    stream.set_nonblocking(true)?;
    Ok(TcpStream::from_std(stream)?)
}

/// A seed-design client: a tokio runtime and one pooled connection.
pub(crate) struct Client {
    runtime: tokio::runtime::Runtime,
    /// The pooled connection and the peer it goes to.
    stream: Option<(SocketAddr, TcpStream)>,
}

impl Client {
    pub(crate) fn new() -> Result<Self> {
        Ok(Self {
            runtime: tokio::runtime::Runtime::new()?,
            stream: None,
        })
    }

    pub(crate) fn measure(
        &mut self,
        peer: SocketAddr,
        options: &Options,
        message: &TensorMessage,
    ) -> Result<Sample> {
        let total = message.total_bytes();
        let runtime = &self.runtime;
        let slot = &mut self.stream;
        match options.mode {
            Mode::OneWay | Mode::Rtt => {
                let (path, min_ops) = if options.mode == Mode::OneWay {
                    ("/actors/sink", 3)
                } else {
                    ("/actors/echo", min_round_trips(total))
                };
                sequential(options, min_ops, total, || {
                    runtime.block_on(async {
                        if slot.as_ref().is_none_or(|(to, _)| *to != peer) {
                            *slot = Some((peer, connect(peer).await?));
                        }
                        let (_, stream) = slot.as_mut().context("connected above")?;
                        match ask(stream, path, message).await? {
                            Frame::SingleResponse { msg_type, data, .. } => {
                                check_sink_ack(&msg_type, &data, total)
                            }
                            Frame::TensorResponse(reply) => check_echo(options, message, &reply),
                            other => Err(anyhow!("unexpected reply {other:?}")),
                        }
                    })
                })
                .map(|mut sample| {
                    sample.verified = options.verify && options.mode == Mode::Rtt;
                    sample
                })
            }
            Mode::Tell => anyhow::bail!("tell mode needs a tensorwire client"),
            Mode::InFlight => runtime.block_on(in_flight(peer, options, message)),
        }
    }
}

/// `inflight` tasks, each with its own connection (the seed design has no multiplexing).
async fn in_flight(peer: SocketAddr, options: &Options, message: &TensorMessage) -> Result<Sample> {
    let total = message.total_bytes();
    let deadline = Instant::now() + options.duration.max(Duration::from_millis(100));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..options.inflight {
        let (message, options) = (message.clone(), options.clone());
        tasks.push(tokio::spawn(async move {
            let mut stream = connect(peer).await?;
            let mut ops = 0u64;
            while Instant::now() < deadline {
                match ask(&mut stream, "/actors/echo", &message).await? {
                    Frame::TensorResponse(reply) => check_echo(&options, &message, &reply)?,
                    other => return Err(anyhow!("unexpected reply {other:?}")),
                }
                ops += 1;
            }
            Ok::<u64, anyhow::Error>(ops)
        }));
    }
    let mut sample = Sample::default();
    for task in tasks {
        sample.ops += task.await??;
    }
    sample.elapsed = started.elapsed();
    sample.payload_bytes = sample.ops * total;
    sample.verified = options.verify;
    Ok(sample)
}

pub(crate) fn run(peer: SocketAddr, options: &Options, message: &TensorMessage) -> Result<Sample> {
    Client::new()?.measure(peer, options, message)
}
