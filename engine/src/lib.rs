//! The Linux data plane of tensorwire: a thread-per-core io_uring engine serving PTR1 frames.
//!
//! A [`Node`] listens on one TCP port and runs N *core* threads, each owning one io_uring
//! instance and the connections placed on it for life. Endpoints (`/actors/{name}`) receive
//! requests through a bounded mailbox, served by a handler on its own threads
//! ([`Node::serve`]) or pulled by the user ([`Node::endpoint`]). [`Node::ask`] and
//! [`Node::tell`] send to any PTR1 peer (or, in process, straight to the mailbox) and return a
//! [`Pending`] result that any executor can await or any thread can [`Pending::wait`] on.
//!
//! A frame goes out as one `SENDMSG` (header, path, metadata and every buffer as iovecs, with
//! `MSG_WAITALL`) and comes in as a header read, a length-table read and `RECVMSG`s straight
//! into receive-pool memory ([`ReceivePool`]); the payload is copied only by the kernel.
//!
//! # What this crate does not do
//!
//! It does not speak HTTP/2 or TLS (connections that do not start with `PTR1` go to a
//! [`Handoff`], if one is attached), does not depend on tokio, does not retry or replay a
//! request, and does not look inside metadata. Where io_uring is unavailable it reports
//! [`Error::IoUringUnavailable`]; the tokio fallback lives in `tensorwire-compat`.

mod blocking;
mod completion;
mod core;
mod endpoint;
mod error;
mod frame_io;
mod node;
mod pool;
mod remote_reply;
mod ring;
pub mod stats;
mod sys;

pub use completion::Pending;
pub use endpoint::{Endpoint, Incoming, Replier, Reply, Request, RequestKind};
pub use error::Error;
pub use node::{Handoff, Node, NodeBuilder, ZeroCopy};
pub use pool::{PoolBuffer, PoolConfig, PoolStats, ReceivePool};
pub use sys::open_fd_count;
pub use tensorwire_proto::{TensorMessage, ptr1::FrameKind};

/// Widens a `usize` length to `u64` (lossless on every supported target).
pub(crate) const fn len_u64(len: usize) -> u64 {
    const _: () = assert!(usize::BITS <= u64::BITS);
    len as u64
}

/// Whether io_uring can be used in this process; `Err` says why not.
pub fn io_uring_available() -> Result<(), String> {
    ring::availability().map(|_| ())
}
