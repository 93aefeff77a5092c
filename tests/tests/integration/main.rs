//! Cross-crate integration tests: real sockets, real io_uring, the tokio fallback, a second
//! process.

mod across;
mod close;
mod conformance;
mod congestion;
mod defects;
mod engine;
mod fallback;
mod fork;
mod http2;
mod review;
mod routing;
mod shm;
