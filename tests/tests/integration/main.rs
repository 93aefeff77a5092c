//! Integration tests: loopback, real sockets, real io_uring. One binary, one module per area.

mod engine;
