//! Shared memory without memory: the bookkeeping of regions, names and leases (the seed's
//! ShmManager rules), the codec of the same-host control protocol, and the knock that proves
//! a peer is the node behind the port it was addressed at. The engine's `shm` module adds
//! memfds, mappings and the Unix socket.

mod error;
mod knock;
mod leases;
mod wire;

pub use error::ShmError;
pub use knock::{KNOCK, KnockError, KnockReply, MAX_KNOCK_REPLY, Offer};
pub use leases::{Descriptor, Leases, ShmStats};
pub use wire::{
    Body, Control, DecodeError, EncodeError, Hello, MAX_DATAGRAM, MAX_ERROR_TEXT, Part, Returned,
    SHARED_PART_BYTES, Shared, WireReply, decode, encode,
};
