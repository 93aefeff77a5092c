//! Shared memory on one host: the node's message memory (slots in a few large memfd segments,
//! lent by credit), the same-host data path over it, and the [`ShmManager`] control plane
//! (regions, names, leases, loaned slots).
//!
//! Nothing is ever created in `/dev/shm`: every segment is an anonymous memfd, reserved with
//! `fallocate` (a full memory limit is an error, never a SIGBUS), charged to a byte quota (a
//! memfd is not bounded by `/dev/shm`), and sealed so its size can never change. Peers map it
//! read-only. A slot a holder still references is never written, zeroed or reused.

mod manager;
pub mod not_inherited;
mod os;
mod queue;
mod quota;
mod segments;
mod socket;
pub mod split_copy;
mod stream_copy;
pub(crate) mod transport;
mod window;

pub use manager::{Loan, ShmBackend, ShmManager, ShmManagerStats};
pub(crate) use segments::{Segments, SegmentsConfig};
pub use tensorwire_proto::shm::{Descriptor, PeerBounds, ShmError};
pub use transport::WhenFull;
pub use window::Window;
