//! tokio transports for tensorwire.
//!
//! [`TokioFallback`] runs PTR1 connections on a dedicated tokio runtime: the same sessions as
//! the io_uring engine (`tensorwire_proto::session`), driven with readiness and non-blocking
//! vectored reads and writes. A node uses it where io_uring cannot be set up (`ENOSYS`, a
//! seccomp filter, `kernel.io_uring_disabled`) or when it is forced; it is also the honest
//! baseline the benchmarks compare the engine against.
//!
//! Plug it into a node with `NodeBuilder::fallback(Arc::new(TokioFallback::default()))`.
//!
//! # What this crate does not do
//!
//! It never depends on the engine or on io_uring and contains no `unsafe` code. It does not
//! decide what a connection means (the sessions do), does not retry or replay requests, and
//! does not read the environment.
#![forbid(unsafe_code)]

mod ptr1;
mod runtime;

pub use ptr1::{TokioDriver, TokioFallback};
