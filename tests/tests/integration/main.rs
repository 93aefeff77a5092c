//! Cross-crate integration tests: real sockets, real io_uring, the tokio fallback, a second
//! process.

mod conformance;
mod defects;
mod engine;
mod fallback;
mod http2;
mod routing;
mod shm;
