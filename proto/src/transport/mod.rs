//! The seams between a node and its transports, and the types that cross them.
//!
//! A node owns endpoints, routes sends and offers its API; a transport moves bytes. They meet
//! only here:
//!
//! - a transport that receives hands each request to the node's [`Inbound`] with a
//!   [`Responder`] for the answer (and first asks [`Inbound::admit`] whether the path is
//!   served, before committing any payload memory);
//! - the node hands a transport an [`OutboundRequest`] with a [`Deadline`] and a
//!   [`Completion`];
//! - received payload goes into the node's [`ReceiveMemory`];
//! - a PTR1 [`Driver`] (io_uring or the tokio fallback) is started by a [`DriverFactory`] on
//!   the node's listener; connections that are not PTR1 go to a [`HandOff`];
//! - other transports (HTTP/2 + TLS) are started by a [`TransportFactory`] beside it.
//!
//! Everything fails with the one [`Error`] type.

mod error;
mod memory;
mod plugin;
mod remote;
mod request;
mod seam;
mod split;
mod stripes;

pub use error::Error;
pub(crate) use error::format_duration;
pub use memory::{HeapMemory, ReceiveMemory, RecvBuffer, RecvStorage};
pub use plugin::{Transport, TransportFactory, TransportSetup};
pub use remote::{LimitSide, NO_ENDPOINT, OverLimit, RemoteKind};
pub(crate) use remote::{REJECTED, REQUIRES_TLS};
pub use request::{ActorPath, Answer, Deadline, InboundRequest, LocalPeer, Reply, RequestKind};
pub use seam::{
    Completion, Delivery, Driver, DriverFactory, DriverGauges, DriverSetup, HandOff, Inbound,
    Outbound, OutboundRequest, Responder, Withdraw,
};
pub use split::{JoinStorage, SplitBuffer, check_ranges, heap_split};
pub use stripes::{
    ASSEMBLY_TTL, DEFAULT_MAX_STRIPES, MAX_ASSEMBLIES, MAX_ASSEMBLIES_PER_PEER, MIN_ASSEMBLY_RATE,
    StripeStore,
};
