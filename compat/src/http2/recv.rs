//! Receiving a PTM1 body from HTTP/2 DATA frames as they arrive, straight into the node's
//! receive memory: no whole-body collect, one copy per byte (out of h2's read buffer), memory
//! asked for a section only when its first byte arrives, the receive budget charged for what
//! the head declares before any payload memory, and a minimum rate so a trickling peer does
//! not hold its stream forever.

use std::time::Instant;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use tensorwire_proto::ptm1::BodyReceiver;
use tensorwire_proto::session::RateMeter;
use tensorwire_proto::transport::{Error, ReceiveMemory, RecvBuffer};
use tensorwire_proto::{Limits, TensorMessage, WireError};

impl std::fmt::Display for RecvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Wire(e) => e.fmt(f),
            Self::Length {
                declared,
                described,
            } => write!(
                f,
                "content-length is {declared} but the PTM1 head describes {described} bytes"
            ),
            Self::Memory(text) | Self::Stalled(text) | Self::Broken(text) => f.write_str(text),
        }
    }
}

/// Why a body could not be received.
#[derive(Debug)]
pub(crate) enum RecvError {
    /// Not a valid PTM1 body (400), or over a limit (413): the head's lengths or
    /// `content-length`.
    Wire(WireError),
    /// `content-length` and the PTM1 head disagree: 400.
    Length { declared: u64, described: u64 },
    /// The receive budget or an allocation failed: 503.
    Memory(String),
    /// The peer sent too slowly: 408.
    Stalled(String),
    /// The stream broke (reset, connection lost).
    Broken(String),
}

/// The rate a body must keep: `min_rate` bytes per second over every `window`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MinRate {
    pub(crate) bytes_per_second: u64,
    pub(crate) window: std::time::Duration,
}

/// Receives one PTM1 body. `declared` is its `content-length`, if it had one.
pub(crate) async fn receive(
    mut body: Incoming,
    declared: Option<u64>,
    memory: &dyn ReceiveMemory,
    limits: &Limits,
    rate: MinRate,
) -> Result<TensorMessage, RecvError> {
    if let Some(len) = declared {
        limits
            .check(tensorwire_proto::LimitField::WireBytes, len)
            .map_err(|e| RecvError::Wire(e.into()))?;
    }
    let mut receiver = BodyReceiver::<RecvBuffer>::new(*limits);
    let mut charge = Charge { memory, bytes: 0 };
    let mut meter = RateMeter::new(rate.bytes_per_second, rate.window);
    meter.start(Instant::now());
    let mut alloc = |len| memory.allocate(len).map_err(Fail::Memory);
    loop {
        let deadline = meter.deadline().map(tokio::time::Instant::from_std);
        let frame = match deadline {
            Some(at) => match tokio::time::timeout_at(at, body.frame()).await {
                Ok(frame) => frame,
                Err(_) if meter.check(Instant::now()) => continue,
                Err(_) => {
                    return Err(RecvError::Stalled(format!(
                        "the body arrived slower than {} bytes/s",
                        rate.bytes_per_second
                    )));
                }
            },
            None => body.frame().await,
        };
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|e| RecvError::Broken(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers carry nothing we use
        };
        meter.progress(data.len());
        let mut rest = &data[..];
        while !rest.is_empty() {
            let pushed = receiver.push(rest, &mut alloc).map_err(Fail::into_recv)?;
            rest = &rest[pushed.consumed..];
            if let Some(layout) = pushed.head {
                if let Some(declared) = declared.filter(|&len| len != layout.wire_len()) {
                    let described = layout.wire_len();
                    return Err(RecvError::Length {
                        declared,
                        described,
                    });
                }
                let payload = layout.body_len();
                if !memory.charge(payload) {
                    return Err(RecvError::Memory(format!(
                        "a body of {payload} bytes does not fit the receive budget of {} bytes",
                        memory.budget()
                    )));
                }
                charge.bytes = payload;
            }
        }
    }
    receiver.finish().map_err(RecvError::Wire)
}

/// An allocation or decoding failure while pushing.
enum Fail {
    Wire(WireError),
    Memory(Error),
}

impl From<WireError> for Fail {
    fn from(e: WireError) -> Self {
        Self::Wire(e)
    }
}

impl Fail {
    fn into_recv(self) -> RecvError {
        match self {
            Self::Wire(e) => RecvError::Wire(e),
            Self::Memory(e) => RecvError::Memory(e.to_string()),
        }
    }
}

/// Budget charged for a body being received; given back when it is done, however it ends.
struct Charge<'a> {
    memory: &'a dyn ReceiveMemory,
    bytes: u64,
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.memory.release(self.bytes);
        }
    }
}
