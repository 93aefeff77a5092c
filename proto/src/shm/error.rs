//! What can go wrong with shared-memory regions and leases (the texts follow the reference
//! implementation's, so peers and logs read the same).

use thiserror::Error;

/// A shared-memory operation that could not be done.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShmError {
    // ---- caller misuse ----
    /// `publish` with an empty name.
    #[error("published region name must not be empty")]
    EmptyName,
    /// `publish` with a name already taken.
    #[error("shared-memory region '{name}' already exists")]
    Exists {
        /// The name.
        name: String,
    },
    /// `open` or `unpublish` of a name that is not (or no longer) published.
    #[error("shared-memory region '{name}' was not found")]
    NotFound {
        /// The name.
        name: String,
    },
    /// A loaned slot was written, offered or published again after it was handed on.
    #[error("the loaned slot was already handed on; it cannot be written or handed on again")]
    SlotBusy,

    // ---- stale or forged descriptors ----
    /// The descriptor's region is gone (released, expired, cleared).
    #[error("shared-memory region is no longer available")]
    RegionGone,
    /// The descriptor's generation does not match the region's.
    #[error("stale shared-memory region descriptor")]
    Stale,
    /// The descriptor's lease was released or revoked.
    #[error("shared-memory lease is no longer active")]
    LeaseInactive,
    /// The descriptor's lease passed its deadline.
    #[error("shared-memory lease has expired")]
    LeaseExpired,
    /// `offset + len` overflows.
    #[error("shared-memory descriptor range overflow")]
    RangeOverflow,
    /// The range ends past the region.
    #[error("shared-memory descriptor range is invalid")]
    RangeInvalid,

    // ---- the peer ----
    /// A received region lacks the seals that make it safe to map.
    #[error("a received shared-memory region lacks the seals {missing} (refused)")]
    SealsMissing {
        /// The missing seals, as text.
        missing: String,
    },
    /// A received region is smaller than its message says.
    #[error("a received shared-memory region has {actual} bytes but {declared} were declared")]
    TooSmall {
        /// Bytes the message declared.
        declared: u64,
        /// Bytes the file has.
        actual: u64,
    },

    // ---- local resources ----
    /// The regions would exceed the manager's byte quota.
    #[error(
        "shared memory quota exceeded: {requested} bytes requested, {available} of {quota} available"
    )]
    Quota {
        /// Bytes asked for.
        requested: u64,
        /// Bytes left.
        available: u64,
        /// The quota.
        quota: u64,
    },
    /// An identifier space ran out (after 2^64 regions or leases).
    #[error("shared-memory identifier exhausted")]
    Exhausted,
    /// The operating system refused (memfd, fallocate, mmap, seals, descriptors).
    #[error("shared memory: {op} failed: {reason}")]
    Os {
        /// The operation.
        op: &'static str,
        /// The OS error text.
        reason: String,
    },
}
