//! Both sessions driven against each other in memory with virtual time.

mod client;
mod client_pipelined;
mod client_unsent;
mod finish;
mod pair;
mod pipelined;
mod pool;
mod pool_model;
mod server;
mod stripes;
mod window;
