//! The fixture and the client on a tensorwire node: its io_uring driver, or the tokio fallback.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Result, anyhow};
use bytes::Bytes;
use std::sync::Arc;

use tensorwire_compat::{Http2, Http2Config};
use tensorwire_engine::{Node, NodeBuilder, Preference, Reply, Request, TensorMessage};

use crate::measure::{Sample, check_echo, check_sink_ack, min_round_trips, sequential};
use crate::{Handlers, Mode, Options, Transport};

const TIMEOUT: Duration = Duration::from_secs(120);

/// A builder for a node on `transport`'s driver (the tokio one is plugged in and forced).
fn builder(
    transport: Transport,
    bind: SocketAddr,
    options: &Options,
    serving: bool,
) -> Result<NodeBuilder> {
    // Each transport measures its own path: shared memory only where asked for.
    let mut builder = Node::builder(bind)
        .in_process_delivery(false)
        .shared_memory(serving || transport == Transport::Shm);
    if let Some(cores) = options.cores {
        builder = builder.cores(cores);
    }
    if let Some(bytes) = options.busy_bytes {
        builder = builder.busy_bytes_per_peer(bytes as u64);
    }
    if let Some(budget) = options.busy_poll {
        builder = builder.busy_poll(budget);
    }
    if let Some(budget) = options.core_poll {
        builder = builder.core_busy_poll(budget);
    }
    if let Some(window) = options.shm_spin {
        builder = builder.shm_spin(window);
    }
    match (serving, options.stripes) {
        (true, Some(taken)) => builder = builder.stripes_taken(taken),
        (false, Some(stripes)) => builder = builder.stripes(stripes),
        (_, None) => {}
    }
    if let Some(bytes) = options.stripe_threshold {
        builder = builder.stripe_threshold(bytes);
    }
    if options.stripe_loopback {
        builder = builder.stripe_loopback(true);
    }

    match transport {
        Transport::Tokio => {
            builder = builder
                .force_fallback(true)
                .fallback(Arc::new(tensorwire_compat::TokioFallback::default()));
        }
        Transport::H2c => {
            builder = builder
                .preference(Preference::Http2)
                .transport(Arc::new(Http2::new(tuned(Http2Config::h2c())?)));
        }
        Transport::Tls => {
            let config = tuned(Http2Config::tls(crate::tls::client(options)?, false))?;
            builder = builder.transport(Arc::new(Http2::new(config)));
        }
        Transport::Shm => builder = builder.preference(Preference::SharedMemory),
        Transport::Engine | Transport::Seed | Transport::Std => {}
    }
    Ok(builder)
}

/// `config` with the `TENSORWIRE_HTTP2_*` tuning variables applied.
fn tuned(mut config: Http2Config) -> Result<Http2Config> {
    config.tune_from_env()?;
    Ok(config)
}

/// Hosts `/actors/echo` and `/actors/sink` until killed.
pub(crate) fn serve(options: &Options) -> Result<()> {
    // PTR1, h2c and (with a certificate) TLS on one port.
    let config = tuned(match crate::tls::server(options)? {
        Some(tls) => Http2Config::tls(tls, options.require_tls),
        None => Http2Config::h2c(),
    })?;
    let node = builder(options.transport, options.listen, options, true)?
        .transport(Arc::new(Http2::new(config)))
        .build()?;
    register_fixture(&node, options.handlers)?;
    println!("listening on {}", node.local_addr());
    std::io::stdout().flush()?;
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// The fixture endpoints: `echo` returns the request; `sink` acknowledges its byte count.
pub(crate) fn register_fixture(node: &Node, handlers: Handlers) -> Result<()> {
    fn echo(request: Request) -> Result<Reply, String> {
        Ok(Reply::Tensor(request.message))
    }
    fn sink(request: Request) -> Result<Reply, String> {
        let total = request.message.total_bytes();
        Ok(Reply::Single {
            msg_type: "ack".into(),
            data: Bytes::from(total.to_string()),
        })
    }
    match handlers {
        Handlers::Core => {
            node.serve_on_core("echo", echo)?;
            node.serve_on_core("sink", sink)?;
        }
        Handlers::Threads => {
            node.serve("echo", 2, echo)?;
            node.serve("sink", 2, sink)?;
        }
    }
    Ok(())
}

/// A client node for measurements (it never short-cuts to an in-process node).
pub(crate) fn client(transport: Transport, options: &Options) -> Result<Node> {
    Ok(builder(transport, "127.0.0.1:0".parse()?, options, false)?.build()?)
}

pub(crate) fn run(peer: SocketAddr, options: &Options, message: &TensorMessage) -> Result<Sample> {
    let node = client(options.transport, options)?;
    if options.loaned {
        return measure(&node, peer, options, &loaned_like(&node, message)?);
    }
    measure(&node, peer, options, message)
}

/// A message with the same version, metadata and buffers, its buffers slices of one loaned,
/// frozen slot of `node` (64-byte aligned, as a producer writes a step's tensors into one
/// region; iceoryx2's in-place peer loans one request slice the same way): they travel without
/// a copy, under one lease.
pub(crate) fn loaned_like(node: &Node, message: &TensorMessage) -> Result<TensorMessage> {
    let mut starts = Vec::with_capacity(message.buffers.len());
    let mut end = 0usize;
    for buffer in &message.buffers {
        starts.push(end);
        end = (end + buffer.len()).next_multiple_of(64);
    }
    let mut loan = node.shm().loan(end.max(1))?;
    for (&at, buffer) in starts.iter().zip(&message.buffers) {
        loan.as_mut_slice()[at..at + buffer.len()].copy_from_slice(buffer);
    }
    let whole = loan.freeze();
    let buffers = starts
        .iter()
        .zip(&message.buffers)
        .map(|(&at, buffer)| whole.slice(at..at + buffer.len()))
        .collect::<Vec<Bytes>>();
    Ok(TensorMessage::new(
        message.version,
        message.metadata.clone(),
        buffers,
    ))
}

pub(crate) fn measure(
    node: &Node,
    peer: SocketAddr,
    options: &Options,
    message: &TensorMessage,
) -> Result<Sample> {
    let total = message.total_bytes();
    match options.mode {
        Mode::OneWay => sequential(options, 3, total, || {
            match node.ask_blocking(peer, "/actors/sink", message.clone(), TIMEOUT)? {
                Reply::Single { msg_type, data } => check_sink_ack(&msg_type, &data, total),
                other => Err(anyhow!("sink answered {other:?}")),
            }
        }),
        Mode::Tell => sequential(options, 3, total, || {
            node.tell_blocking(peer, "/actors/sink", message.clone(), TIMEOUT)?;
            Ok(())
        }),
        Mode::Rtt => {
            let mut sample = sequential(options, min_round_trips(total), total, || {
                match node.ask_blocking(peer, "/actors/echo", message.clone(), TIMEOUT)? {
                    Reply::Tensor(reply) => check_echo(options, message, &reply),
                    other => Err(anyhow!("echo answered {other:?}")),
                }
            })?;
            sample.verified = options.verify;
            Ok(sample)
        }
        Mode::InFlight => crate::in_flight::measure(node, peer, options, message, TIMEOUT),
    }
}
