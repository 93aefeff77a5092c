//! The Linux data plane of tensorwire: a node with its endpoints, and a thread-per-core io_uring
//! driver of PTR1 sessions.
//!
//! A [`Node`] listens on one TCP port. Its endpoints (`/actors/{name}`) receive requests
//! through a bounded mailbox, pulled by the user ([`Node::endpoint`]), served by handler
//! threads ([`Node::serve`]) or by handlers that run on the driver thread that received the
//! request ([`Node::serve_on_core`]). [`Node::ask`] and [`Node::tell`] send to any PTR1 peer
//! (or, in process, straight to the mailbox) and return a [`Pending`] result that any executor
//! can await or any thread can [`Pending::wait`] on; the blocking forms run the exchange on the
//! calling thread.
//!
//! What a PTR1 connection means is written once, without I/O, in `tensorwire_proto::session`;
//! the io_uring driver (one ring per core thread, one small file per operation) only moves
//! bytes. A frame goes out as one `SENDMSG` (header, path, metadata and every buffer as
//! iovecs) and comes in through per-connection scratch and `RECVMSG`s straight into
//! receive-pool memory ([`ReceivePool`]), committed as the bytes arrive; the payload is copied
//! only by the kernel.
//!
//! # What this crate does not do
//!
//! It does not speak HTTP/2 or TLS (connections that do not start with `PTR1` go to a
//! `HandOff`, if one is plugged in), does not depend on tokio, does not retry or replay a
//! request, and does not look inside metadata. Where io_uring is unavailable it runs the
//! fallback driver plugged in with [`NodeBuilder::fallback`] (the tokio driver of
//! `tensorwire-compat`), or fails to build with [`Error::DriverUnavailable`] saying why.

mod blocking;
mod endpoint;
pub mod fork;
mod inflight;
mod node;
mod panics;
mod pause;
mod pending;
mod phase_marks;
mod pool;
pub mod shm;
pub mod stats;
mod sync;
mod sys;
mod tcp_options;
mod unmap;
mod uring;

pub use endpoint::{Endpoint, Incoming, Recv, Replier, Request};
pub use node::{Destination, Node, NodeBuilder, NodeStats, RouteChoice, ShmAccess, Via};
pub use pending::Pending;
pub use pool::{PoolBuffer, PoolConfig, PoolStats, ReceivePool};
pub use tensorwire_proto::TensorMessage;
pub use tensorwire_proto::route::{Preference, Route};
pub use tensorwire_proto::session::{Keepalive, SessionConfig};
pub use tensorwire_proto::transport::{
    Error, LimitSide, LocalPeer, OverLimit, RemoteKind, Reply, RequestKind,
};
pub use uring::ZeroCopy;

/// Whether io_uring can be used in this process; `Err` says why not.
///
/// # Errors
///
/// The reason (kernel, seccomp, sysctl, or `TENSORWIRE_FORCE_FALLBACK`).
pub fn io_uring_available() -> Result<(), String> {
    uring::availability().map(|_| ())
}
