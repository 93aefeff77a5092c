//! The fixture and the client on tensorwire's io_uring engine.

use std::collections::VecDeque;
use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use bytes::Bytes;
use tensorwire_engine::{Node, Reply, TensorMessage};

use crate::measure::{Sample, check_sink_ack, sequential};
use crate::{Mode, Options};

const TIMEOUT: Duration = Duration::from_secs(120);

/// Hosts `/actors/echo` and `/actors/sink` until killed.
pub(crate) fn serve(options: &Options) -> Result<()> {
    let mut builder = Node::builder(options.listen).in_process_delivery(false);
    if let Some(cores) = options.cores {
        builder = builder.cores(cores);
    }
    let node = builder.build()?;
    register_fixture(&node)?;
    println!("listening on {}", node.local_addr());
    std::io::stdout().flush()?;
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// The fixture endpoints: `echo` returns the request; `sink` acknowledges its byte count.
pub(crate) fn register_fixture(node: &Node) -> Result<()> {
    node.serve("echo", 2, |request| Ok(Reply::Tensor(request.message)))?;
    node.serve("sink", 2, |request| {
        let total = request.message.total_bytes();
        Ok(Reply::Single {
            msg_type: "ack".into(),
            data: Bytes::from(total.to_string()),
        })
    })?;
    Ok(())
}

/// A client node for measurements (it never short-cuts to an in-process node).
pub(crate) fn client(cores: Option<usize>) -> Result<Node> {
    let mut builder = Node::builder("127.0.0.1:0".parse()?).in_process_delivery(false);
    if let Some(cores) = cores {
        builder = builder.cores(cores);
    }
    Ok(builder.build()?)
}

pub(crate) fn run(peer: SocketAddr, options: &Options, message: &TensorMessage) -> Result<Sample> {
    let node = client(options.cores)?;
    measure(&node, peer, options, message)
}

pub(crate) fn measure(
    node: &Node,
    peer: SocketAddr,
    options: &Options,
    message: &TensorMessage,
) -> Result<Sample> {
    let total = message.total_bytes();
    match options.mode {
        Mode::OneWay => sequential(options.duration, 3, total, || {
            match node.ask_blocking(peer, "/actors/sink", message.clone(), TIMEOUT)? {
                Reply::Single { msg_type, data } => check_sink_ack(&msg_type, &data, total),
                other => Err(anyhow!("sink answered {other:?}")),
            }
        }),
        Mode::Rtt => sequential(options.duration, 100, total, || {
            match node.ask_blocking(peer, "/actors/echo", message.clone(), TIMEOUT)? {
                Reply::Tensor(reply) if reply.total_bytes() == total => Ok(()),
                other => Err(anyhow!("echo answered {other:?}")),
            }
        }),
        Mode::InFlight => {
            let ask = || node.ask(peer, "/actors/echo", message.clone(), TIMEOUT);
            let mut window: VecDeque<_> = (0..options.inflight).map(|_| ask()).collect();
            let started = Instant::now();
            let mut sample = Sample::default();
            while started.elapsed() < options.duration || sample.ops < 100 {
                let Some(pending) = window.pop_front() else {
                    break;
                };
                match pending.wait()? {
                    Reply::Tensor(reply) if reply.total_bytes() == total => {}
                    other => return Err(anyhow!("echo answered {other:?}")),
                }
                sample.ops += 1;
                sample.payload_bytes += total;
                window.push_back(ask());
            }
            sample.elapsed = started.elapsed();
            for pending in window {
                pending.wait()?;
            }
            Ok(sample)
        }
    }
}
