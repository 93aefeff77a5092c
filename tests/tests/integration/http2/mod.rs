//! The HTTP/2 + TLS transport over real sockets: round trips on h2c and TLS, mutual TLS and its
//! failures, limits and statuses, slow clients, and interop with curl, nghttp2 and h2load.

mod failure;
mod interop;
mod limits;
mod round_trip;
mod slow;
mod tls;
