//! Shared memory without memory: what a same-host connection means (the [`ShmConnection`]
//! session, the hello checks of [`Identity`], knock [`Tickets`], the [`LeaseBook`] of what a
//! node lends, the [`PeerBook`] of what each peer process may hold, the queue format), the
//! codec of the control protocol, the knock that proves a peer is the node behind the port it
//! was addressed at, and the bookkeeping of regions, names and leases (the seed's ShmManager
//! rules). The engine's `shm` module adds memfds, mappings, the Unix socket and the threads.

mod bounds;
mod connection;
mod error;
mod identity;
mod knock;
mod leases;
mod lending;
pub mod queue;
mod requests;
mod tickets;
mod wire;

pub use bounds::{Greeting, OverBound, PeerBook, PeerBounds};
pub use connection::{
    CloseReason, ConnEvent, ConnectionConfig, Failure, FdArrival, Role, SendError, ShmConnection,
    Transmit,
};
pub use error::ShmError;
pub use identity::{Credentials, Identity, Refusal};
pub use knock::{KNOCK, KnockError, KnockReply, MAX_KNOCK_REPLY, Offer};
pub use leases::{Descriptor, Leases, ShmStats};
pub use lending::{LeaseBook, Lent};
pub use queue::{QueueError, QueueShape};
pub use requests::Outstanding;
pub use tickets::{MAX_TICKETS, TICKET_TTL, Tickets};
pub use wire::{
    BELL, Body, Control, DecodeError, EncodeError, Hello, MAX_DATAGRAM, MAX_ERROR_TEXT,
    MAX_SOCKET_DATAGRAM, Part, Record, Returned, SHARED_PART_BYTES, Shared, WireReply, decode,
    decode_shared, encode,
};
