//! The tokio baselines. The seed design: `write_vectored` with at most 64 slices per call, and
//! `read_exact` of header, table, path, metadata and each buffer, every section into a fresh
//! zero-filled `Vec`. And tokio done as well as it goes without io_uring ("tokio-pool", a
//! stand-in for the compat crate's PTR1 path until that exists): 1024 slices per call, and
//! every section received into the engine's receive pool, so only the runtime differs.

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use bytes::Bytes;
use tensorwire_engine::{PoolConfig, ReceivePool};
use tensorwire_proto::ptr1::{self, Frame};
use tensorwire_proto::{
    Body, Encoded, FixedHeader, Format, Layout, Limits, ReceiveBuffer, TensorMessage,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::measure::{Sample, WriteCursor, check_sink_ack, sequential};
use crate::{Mode, Options};

/// How a tokio baseline writes, and where it receives.
#[derive(Clone, Debug)]
pub(crate) enum Design {
    /// At most 64 slices per `write_vectored`; a fresh zero-filled `Vec` per section.
    Seed,
    /// At most 1024 slices per `write_vectored`; sections in receive-pool memory.
    Pooled(ReceivePool),
}

impl Design {
    pub(crate) fn seed() -> Self {
        Self::Seed
    }

    /// With a receive pool of the engine's default configuration.
    pub(crate) fn pooled() -> Self {
        Self::Pooled(ReceivePool::new(PoolConfig::default()))
    }

    fn max_slices(&self) -> usize {
        match self {
            Self::Seed => 64,
            Self::Pooled(_) => 1024,
        }
    }
}

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

pub(crate) fn serve(listen: SocketAddr, design: Design) -> Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let listener = TcpListener::bind(listen).await?;
        println!("listening on {}", listener.local_addr()?);
        std::io::stdout().flush()?;
        loop {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            let design = design.clone();
            tokio::spawn(async move {
                let _ = serve_connection(stream, &design).await;
            });
        }
    })
}

async fn serve_connection(mut stream: TcpStream, design: &Design) -> Result<()> {
    let limits = Limits::default();
    while let Some(frame) = read_frame(&mut stream, &limits, design).await? {
        let reply = ptr1::encode(&fixture_reply(frame), &limits)?;
        write_frame(&mut stream, &reply, design.max_slices()).await?;
    }
    Ok(())
}

/// Reads one frame; `None` at a clean end of stream.
async fn read_frame(
    stream: &mut TcpStream,
    limits: &Limits,
    design: &Design,
) -> Result<Option<Frame>> {
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
    let frame = match design {
        // A fresh zero-filled Vec for every section.
        Design::Seed => read_body(stream, layout, |len| vec![0u8; len]).await?,
        Design::Pooled(pool) => read_body(stream, layout, pool.allocator()).await?,
    };
    Ok(Some(frame))
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

/// Writes a frame with `write_vectored` calls of at most `max_slices` slices, handling short
/// writes.
async fn write_frame(stream: &mut TcpStream, encoded: &Encoded, max_slices: usize) -> Result<()> {
    let mut cursor = WriteCursor::new(encoded);
    while !cursor.is_done() {
        let written = stream.write_vectored(&cursor.batch(max_slices)).await?;
        cursor.advance(written)?;
    }
    stream.flush().await?;
    Ok(())
}

async fn ask(
    stream: &mut TcpStream,
    path: &str,
    message: &TensorMessage,
    design: &Design,
) -> Result<Frame> {
    let limits = Limits::default();
    let frame = Frame::Ask {
        path: path.to_owned(),
        message: message.clone(),
    };
    let encoded = ptr1::encode(&frame, &limits)?;
    write_frame(stream, &encoded, design.max_slices()).await?;
    read_frame(stream, &limits, design)
        .await?
        .context("server closed the connection")
}

async fn connect(peer: SocketAddr) -> Result<TcpStream> {
    let stream = TcpStream::connect(peer).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// A tokio baseline client: a tokio runtime and one pooled connection.
pub(crate) struct Client {
    runtime: tokio::runtime::Runtime,
    design: Design,
    /// The pooled connection and the peer it goes to.
    stream: Option<(SocketAddr, TcpStream)>,
}

impl Client {
    pub(crate) fn new(design: Design) -> Result<Self> {
        Ok(Self {
            runtime: tokio::runtime::Runtime::new()?,
            design,
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
        let design = &self.design;
        let slot = &mut self.stream;
        match options.mode {
            Mode::OneWay | Mode::Rtt => {
                let (path, min_ops) = if options.mode == Mode::OneWay {
                    ("/actors/sink", 3)
                } else {
                    ("/actors/echo", 100)
                };
                sequential(options.duration, min_ops, total, || {
                    runtime.block_on(async {
                        if slot.as_ref().is_none_or(|(to, _)| *to != peer) {
                            *slot = Some((peer, connect(peer).await?));
                        }
                        let (_, stream) = slot.as_mut().context("connected above")?;
                        match ask(stream, path, message, design).await? {
                            Frame::SingleResponse { msg_type, data, .. } => {
                                check_sink_ack(&msg_type, &data, total)
                            }
                            Frame::TensorResponse(reply) if reply.total_bytes() == total => Ok(()),
                            other => Err(anyhow!("unexpected reply {other:?}")),
                        }
                    })
                })
            }
            Mode::InFlight => runtime.block_on(in_flight(peer, options, message, design)),
        }
    }
}

/// `inflight` tasks, each with its own connection (the seed design has no multiplexing).
async fn in_flight(
    peer: SocketAddr,
    options: &Options,
    message: &TensorMessage,
    design: &Design,
) -> Result<Sample> {
    let total = message.total_bytes();
    let deadline = Instant::now() + options.duration.max(Duration::from_millis(100));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..options.inflight {
        let (message, design) = (message.clone(), design.clone());
        tasks.push(tokio::spawn(async move {
            let mut stream = connect(peer).await?;
            let mut ops = 0u64;
            while Instant::now() < deadline {
                match ask(&mut stream, "/actors/echo", &message, &design).await? {
                    Frame::TensorResponse(reply) if reply.total_bytes() == total => ops += 1,
                    other => return Err(anyhow!("unexpected reply {other:?}")),
                }
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
    Ok(sample)
}

pub(crate) fn run(
    peer: SocketAddr,
    options: &Options,
    message: &TensorMessage,
    design: Design,
) -> Result<Sample> {
    Client::new(design)?.measure(peer, options, message)
}
