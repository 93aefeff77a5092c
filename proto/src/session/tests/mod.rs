//! Both sessions driven against each other in memory with virtual time.

mod client;
mod pair;
mod pool;
mod server;
mod window;
