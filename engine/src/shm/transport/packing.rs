//! Laying a message out for a same-host peer: where its buffers already are (sealed loaned
//! slots, no copy), in the datagram itself (small bodies), or copied once into a pooled slot.

use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

use bytes::Bytes;
use tensorwire_proto::shm::{BodyRef, MAX_FDS, Segment};
use tensorwire_proto::transport::Error;
use tensorwire_proto::{TensorMessage, len_u64};

use crate::shm::loaned;
use crate::shm::transport::Shared;
use crate::shm::transport::conn::Conn;
use crate::shm::transport::lending::Lent;

/// Metadata travels inline (in the datagram) up to this; larger goes into a slot.
const INLINE_METADATA: usize = 16 << 10;
/// A whole PTM1 body travels in the datagram up to this (half the datagram limit): below a
/// few pages, copying through the socket costs less than mapping a slot and releasing it.
pub(crate) const INLINE_BODY: usize = 32 << 10;

/// A message laid out in shared memory, ready to send.
pub(crate) struct Packed {
    pub(crate) body: BodyRef,
    /// Descriptors to send (they stay open while the lending keeps their regions).
    pub(crate) fds: Vec<RawFd>,
    pub(crate) leases: Vec<u64>,
    pub(crate) copied: u64,
    pub(crate) zero_copy: u64,
}

/// Lays `message` out for `conn`: its buffers where they are if all of them are in sealed
/// loaned regions, else the whole message copied once into a pooled slot (as a PTM1 body).
pub(crate) fn pack(shared: &Shared, conn: &Conn, message: &TensorMessage) -> Result<Packed, Error> {
    let hold_until = Instant::now() + shared.config.max_hold;
    let direct: Option<Vec<_>> = (!message.buffers.is_empty()
        && message.buffers.len() <= MAX_FDS
        && message.metadata.len() <= INLINE_METADATA)
        .then(|| message.buffers.iter().map(|b| loaned::lookup(b)).collect())
        .flatten();
    if let Some(regions) = direct {
        let mut segments = Vec::with_capacity(regions.len());
        let mut fds = Vec::with_capacity(regions.len());
        let mut leases = Vec::with_capacity(regions.len());
        for (i, ((region, offset), buffer)) in regions.into_iter().zip(&message.buffers).enumerate()
        {
            fds.push(region.as_fd().as_raw_fd());
            let lease = shared
                .lending
                .lend(conn.id, Lent::Sealed { _region: region }, hold_until);
            leases.push(lease);
            segments.push(Segment {
                fd: u8::try_from(i).unwrap_or(u8::MAX),
                lease,
                offset,
                len: len_u64(buffer.len()),
            });
        }
        let zero_copy = len_u64(segments.len());
        return Ok(Packed {
            body: BodyRef::Direct {
                version: message.version,
                metadata: message.metadata.clone(),
                segments,
            },
            fds,
            leases,
            copied: 0,
            zero_copy,
        });
    }
    let encoded = tensorwire_proto::ptm1::encode(message, &shared.limits).map_err(Error::Encode)?;
    let len = usize::try_from(encoded.wire_len())
        .map_err(|_| Error::Misuse("message too large".into()))?;
    if len <= INLINE_BODY {
        let mut body = Vec::with_capacity(len);
        for slice in encoded.slices() {
            body.extend_from_slice(slice);
        }
        return Ok(Packed {
            body: BodyRef::Inline(Bytes::from(body)),
            fds: Vec::new(),
            leases: Vec::new(),
            copied: message.total_bytes(),
            zero_copy: 0,
        });
    }
    let slot = shared
        .lending
        .slot(len)
        .map_err(|e| Error::Memory(e.to_string()))?;
    let written = slot.fill(encoded.slices());
    let fd = slot.read_only_fd().as_raw_fd();
    let lease = shared.lending.lend(conn.id, Lent::Pooled(slot), hold_until);
    Ok(Packed {
        body: BodyRef::Packed {
            fd: 0,
            lease,
            len: len_u64(written),
        },
        fds: vec![fd],
        leases: vec![lease],
        copied: message.total_bytes(),
        zero_copy: 0,
    })
}
