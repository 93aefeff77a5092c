//! Shared memory on one host: the node's [`ShmManager`] (regions, names, leases, loaned
//! slots) and the memfd machinery under it.
//!
//! Nothing is ever created in `/dev/shm`: every region is an anonymous memfd, sized with
//! `fallocate` (a full memory limit is an error, never a SIGBUS), charged to a byte quota
//! (a memfd is not bounded by `/dev/shm`), and sealed so its size can never change; regions
//! handed to readers are sealed against writes too, so no reader can see them change.

mod loaned;
mod manager;
mod os;
mod quota;
mod region;
pub(crate) mod transport;

pub use manager::{Loan, ShmBackend, ShmManager, ShmManagerStats};
pub use tensorwire_proto::shm::{Descriptor, ShmError};
