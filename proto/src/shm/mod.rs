//! Shared memory without memory: the bookkeeping of regions, names and leases (the seed's
//! ShmManager rules) and the codec of the same-host control protocol. The engine's `shm`
//! module adds memfds, mappings and the Unix socket.

mod error;
mod leases;
mod wire;

pub use error::ShmError;
pub use leases::{Descriptor, Leases, ShmStats};
pub use wire::{
    BodyRef, Control, DecodeError, Hello, MAX_DATAGRAM, MAX_FDS, Segment, WireReply, decode, encode,
};
