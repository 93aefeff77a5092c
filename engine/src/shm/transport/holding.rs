//! What this process holds of its peers' memory: each received region mapped read-only, its
//! lease given back (batched, by the poll thread) when the last view of it drops.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use bytes::Bytes;
use tensorwire_proto::shm::{BodyRef, ShmError};
use tensorwire_proto::{Limits, TensorMessage};

use crate::shm::os::{self, FileMap};
use crate::shm::region::os_error;
use crate::shm::transport::conn::Conn;

/// Leases whose views dropped, per connection, waiting for the poll thread to send them.
#[derive(Default)]
pub(crate) struct Releases {
    pending: Mutex<Vec<(Weak<Conn>, u64)>>,
    wake: Option<Arc<OwnedFd>>,
}

impl Releases {
    pub(crate) fn new(wake: Arc<OwnedFd>) -> Self {
        Self {
            pending: Mutex::new(Vec::new()),
            wake: Some(wake),
        }
    }

    fn push(&self, conn: Weak<Conn>, lease: u64) {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((conn, lease));
        if let Some(wake) = &self.wake {
            crate::sys::eventfd_signal(wake.as_raw_fd());
        }
    }

    /// Everything waiting, grouped by live connection.
    pub(crate) fn take(&self) -> Vec<(Arc<Conn>, Vec<u64>)> {
        let pending =
            std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner));
        let mut by_conn: Vec<(Arc<Conn>, Vec<u64>)> = Vec::new();
        for (conn, lease) in pending {
            let Some(conn) = conn.upgrade() else { continue };
            match by_conn.iter_mut().find(|(c, _)| c.id == conn.id) {
                Some((_, leases)) => leases.push(lease),
                None => by_conn.push((conn, vec![lease])),
            }
        }
        by_conn
    }
}

/// A peer's region, mapped read-only; gives its lease back when dropped.
struct Held {
    map: FileMap,
    conn: Weak<Conn>,
    lease: u64,
    releases: Arc<Releases>,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        self.map.as_slice()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.releases
            .push(std::mem::take(&mut self.conn), self.lease);
    }
}

/// Turns a received body into a message whose buffers are views of the peer's memory.
///
/// Every descriptor is checked before it is mapped: it must be sealed against shrinking and
/// growing (else a truncation could fault a reader), and as large as the body says. On any
/// failure the leases go back at once.
pub(crate) fn unpack(
    conn: &Arc<Conn>,
    releases: &Arc<Releases>,
    body: &BodyRef,
    fds: Vec<OwnedFd>,
    limits: &Limits,
) -> Result<TensorMessage, String> {
    let result = map_all(conn, releases, body, fds, limits);
    if result.is_err() {
        for lease in body.leases() {
            releases.push(Arc::downgrade(conn), lease);
        }
    }
    result
}

fn map_all(
    conn: &Arc<Conn>,
    releases: &Arc<Releases>,
    body: &BodyRef,
    mut fds: Vec<OwnedFd>,
    limits: &Limits,
) -> Result<TensorMessage, String> {
    let expected = body.fds().len();
    if fds.len() != expected {
        return Err(format!(
            "the message came with {} descriptors but refers to {expected}",
            fds.len()
        ));
    }
    match body {
        BodyRef::Inline(bytes) => {
            tensorwire_proto::ptm1::decode(bytes.clone(), limits).map_err(|e| e.to_string())
        }
        BodyRef::Packed { fd, lease, len } => {
            let fd = fds
                .get_mut(usize::from(*fd))
                .ok_or("a descriptor index is out of range")?;
            let held = hold(conn, releases, fd, *len, *lease).map_err(|e| e.to_string())?;
            let len = usize::try_from(*len).map_err(|_| "the body is too large")?;
            let bytes = Bytes::from_owner(held).slice(0..len);
            tensorwire_proto::ptm1::decode(bytes, limits).map_err(|e| e.to_string())
        }
        BodyRef::Direct {
            version,
            metadata,
            segments,
        } => {
            let mut buffers = Vec::with_capacity(segments.len());
            for (i, segment) in segments.iter().enumerate() {
                let end = segment
                    .offset
                    .checked_add(segment.len)
                    .ok_or("a segment range overflows")?;
                let fd = fds.get_mut(i).ok_or("a descriptor index is out of range")?;
                if usize::from(segment.fd) != i {
                    return Err("segment descriptors are out of order".into());
                }
                let held =
                    hold(conn, releases, fd, end, segment.lease).map_err(|e| e.to_string())?;
                let (start, end) = (to_usize(segment.offset)?, to_usize(end)?);
                buffers.push(Bytes::from_owner(held).slice(start..end));
            }
            let message = TensorMessage::new(*version, metadata.clone(), buffers);
            limits
                .check(
                    tensorwire_proto::LimitField::BufferCount,
                    message.buffers.len() as u64,
                )
                .map_err(|e| e.to_string())?;
            Ok(message)
        }
    }
}

fn to_usize(n: u64) -> Result<usize, String> {
    usize::try_from(n).map_err(|_| "a range is too large for this platform".to_owned())
}

/// Checks and maps one received region of at least `needed` bytes.
fn hold(
    conn: &Arc<Conn>,
    releases: &Arc<Releases>,
    fd: &OwnedFd,
    needed: u64,
    lease: u64,
) -> Result<Held, ShmError> {
    let raw = fd.as_raw_fd();
    let seals = os::seals(raw).unwrap_or(0);
    if seals & os::SEALS_SIZE != os::SEALS_SIZE {
        tensorwire_proto::stats::global().record_shm_fd_failure();
        return Err(ShmError::SealsMissing {
            missing: "SHRINK | GROW".into(),
        });
    }
    let actual = os::size(raw).map_err(|e| os_error("fstat", &e))?;
    if actual < needed {
        tensorwire_proto::stats::global().record_shm_fd_failure();
        return Err(ShmError::TooSmall {
            declared: needed,
            actual,
        });
    }
    let len = usize::try_from(needed).map_err(|_| ShmError::RangeInvalid)?;
    // Mapped read-only and pre-faulted; the descriptor closes when `fd` drops (the mapping
    // keeps the file), so holding many messages costs no descriptors.
    let map = FileMap::new(raw, len, false, true).map_err(|e| os_error("mmap", &e))?;
    Ok(Held {
        map,
        conn: Arc::downgrade(conn),
        lease,
        releases: Arc::clone(releases),
    })
}
