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
//! [`Http2`] starts the HTTP/2 + TLS transport of PTM1 bodies ([`Http2Transport`]): hyper
//! (HTTP/2 only) and rustls (ring, TLS 1.3, ALPN `h2`, optional client certificates). Bodies
//! are streamed chunk by chunk and decoded as they arrive into the node's receive memory. It
//! serves the connections a PTR1 listener hands over (TLS ClientHello, h2c preface) or its own
//! listener, and carries the sends the router gives it (TLS on, or
//! `PULSING_TENSOR_TRANSPORT=http2`). Plug it in with `NodeBuilder::transport(Arc::new(Http2::new(config)))`.
//!
//! # What this crate does not do
//!
//! It never depends on the engine or on io_uring and contains no `unsafe` code. It does not
//! decide what a PTR1 connection means (the sessions do), does not retry or replay requests,
//! and reads the environment only in the explicit `from_env` constructors
//! ([`Http2Config::from_env`], [`TlsConfig::from_env`]). It serves only tensor messages over
//! HTTP/2 (no HTTP/1, no other message types).
#![forbid(unsafe_code)]

mod http2;
mod ptr1;
mod runtime;
mod socket_options;
mod sync;

pub use http2::{Http2, Http2Config, Http2Transport, TlsConfig, TlsConfigBuilder};
pub use ptr1::{TokioDriver, TokioFallback};
