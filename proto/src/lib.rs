//! The sans-IO core of tensorwire.
//!
//! This crate defines what every tensorwire transport agrees on:
//!
//! - [`TensorMessage`]: a `version`, opaque `metadata` and an ordered list of contiguous buffers;
//! - the **PTR1** raw-TCP frame codec ([`ptr1`]) and the **PTM1** HTTP/2 body codec ([`ptm1`]),
//!   byte-compatible with other PTR1/PTM1 peers;
//! - the [`Limits`] every decoder enforces before it asks for payload memory;
//! - the process-wide transport [`stats`];
//! - the pure [`route`] selection function.
//!
//! # What this crate does not do
//!
//! It opens no sockets, reads no clock, starts no threads and contains no `unsafe` code. It never
//! looks inside `metadata`, never converts or checks tensor dtypes, shapes or byte order, and
//! never retries anything. The only environment it reads is the limit, transport-preference and
//! same-host congestion-control variables, and only when a caller asks it to
//! ([`Limits::from_env`], [`route::Preference::from_env`],
//! [`congestion::SameHostCongestion::from_env`]).
//!
//! # Decoding without copies
//!
//! Both decoders work in two steps. The *head* (fixed header and length table) is parsed and
//! **every limit is checked** before anything else happens. Then the caller is told the lengths
//! of the metadata and of each buffer ([`Layout`]) and provides the memory the payload goes
//! into ([`ReceiveBuffer`]); the decoder either copies arriving chunks straight into that memory
//! ([`Body::fill`]) or hands out the unfilled regions for a scatter read by the caller's I/O
//! layer ([`Body::unfilled`] / [`Body::advance`]). A one-shot decode from a contiguous [`Bytes`]
//! returns zero-copy slices of it.
//!
//! [`Bytes`]: bytes::Bytes
#![forbid(unsafe_code)]

mod body;
mod config;
pub mod congestion;
mod encode;
mod error;
pub mod fast_hash;
mod head;
mod kind;
mod len;
mod limits;
mod message;
pub mod ptm1;
pub mod ptr1;
mod reader;
pub mod route;
pub mod session;
pub mod shm;
pub mod stats;
pub mod stripe;
pub mod transport;

#[cfg(test)]
mod test_util;

#[cfg(any(fuzzing, test))]
pub mod fuzzing;

pub use body::{Body, ReceiveBuffer};
pub use encode::{Encoded, Head};
pub use error::{ConfigError, Format, LimitExceeded, LimitField, Malformed, Misuse, WireError};
pub use head::{FixedHeader, Layout};
pub use len::len_u64;
pub use limits::{Limits, LimitsBuilder};
pub use message::TensorMessage;
