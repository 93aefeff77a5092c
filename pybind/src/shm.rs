//! `node.shm`: the node's shared-memory regions and leases (the seed's control plane) —
//! offer, publish/open, map, release, unpublish, clear, stats.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tensorwire_engine::fork::Birth;
use tensorwire_engine::shm::{Descriptor, ShmError, ShmManager};

use crate::buffers::{Buffer, drain_releases, export};
use crate::errors::{InvalidArgument, LeaseInvalid, OutOfMemory, SharedMemoryError};

/// One leased view of a region: what a holder presents to `map` or `release`.
#[pyclass(frozen, eq, hash, module = "tensorwire._native", name = "Descriptor")]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PyDescriptor {
    /// The region.
    #[pyo3(get)]
    region_id: u64,
    /// The region's generation when the lease was granted.
    #[pyo3(get)]
    generation: u64,
    /// Where the view starts in the region.
    #[pyo3(get)]
    offset: u64,
    /// The view's length.
    #[pyo3(get)]
    len: u64,
    /// The lease.
    #[pyo3(get)]
    lease_id: u64,
}

#[pymethods]
impl PyDescriptor {
    #[new]
    fn new(region_id: u64, generation: u64, offset: u64, len: u64, lease_id: u64) -> Self {
        Self {
            region_id,
            generation,
            offset,
            len,
            lease_id,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Descriptor(region_id={}, generation={}, offset={}, len={}, lease_id={})",
            self.region_id, self.generation, self.offset, self.len, self.lease_id
        )
    }
}

impl From<Descriptor> for PyDescriptor {
    fn from(d: Descriptor) -> Self {
        Self::new(d.region_id, d.generation, d.offset, d.len, d.lease_id)
    }
}

impl From<&PyDescriptor> for Descriptor {
    fn from(d: &PyDescriptor) -> Self {
        Self {
            region_id: d.region_id,
            generation: d.generation,
            offset: d.offset,
            len: d.len,
            lease_id: d.lease_id,
        }
    }
}

/// The node's shared-memory manager.
#[pyclass(frozen, module = "tensorwire._native", name = "Shm")]
pub(crate) struct PyShm {
    manager: ShmManager,
    /// The process that made it: a child made by `fork()` since has none of its memory (nor
    /// the threads that hold its locks), and every call there fails at once.
    birth: Birth,
}

impl PyShm {
    pub(crate) fn new(manager: ShmManager) -> Self {
        Self {
            manager,
            birth: Birth::here(),
        }
    }

    fn here(&self, what: &str) -> PyResult<&ShmManager> {
        self.birth
            .check()
            .map_err(|e| crate::errors::to_py(&e, what))?;
        Ok(&self.manager)
    }
}

#[pymethods]
impl PyShm {
    /// Copies `data` into a new sealed region and leases a view of it for `ttl` seconds.
    #[pyo3(signature = (data, ttl = 60.0))]
    fn offer(&self, py: Python<'_>, data: &Bound<'_, PyAny>, ttl: f64) -> PyResult<PyDescriptor> {
        drain_releases(py);
        let bytes = export(data, 0)?;
        let ttl = seconds(ttl)?;
        let manager = self.here("offering a region")?;
        py.detach(|| manager.offer(bytes, ttl))
            .map(Into::into)
            .map_err(|e| to_py(&e, "offering a region"))
    }

    /// Copies `data` into a new sealed region published under `name`.
    fn publish(&self, py: Python<'_>, name: &str, data: &Bound<'_, PyAny>) -> PyResult<()> {
        drain_releases(py);
        let bytes = export(data, 0)?;
        let manager = self.here("publishing a region")?;
        py.detach(|| manager.publish(name, bytes))
            .map_err(|e| to_py(&e, &format!("publishing {name:?}")))
    }

    /// Leases a view of the region published under `name` for `ttl` seconds.
    #[pyo3(signature = (name, ttl = 60.0))]
    fn open(&self, name: &str, ttl: f64) -> PyResult<PyDescriptor> {
        self.here("opening a region")?
            .open(name, seconds(ttl)?)
            .map(Into::into)
            .map_err(|e| to_py(&e, &format!("opening {name:?}")))
    }

    /// The leased bytes, as a read-only `Buffer` (views keep the region alive).
    fn map(&self, descriptor: &PyDescriptor) -> PyResult<Buffer> {
        self.here("mapping a region")?
            .map(&descriptor.into())
            .map(|bytes| Buffer::new(bytes, false))
            .map_err(|e| to_py(&e, &format!("mapping {}", descriptor.__repr__())))
    }

    /// Ends the lease; `False` if it had already ended (idempotent).
    fn release(&self, descriptor: &PyDescriptor) -> PyResult<bool> {
        Ok(self.here("releasing a lease")?.release(&descriptor.into()))
    }

    /// Removes the name: new opens fail, existing leases drain.
    fn unpublish(&self, name: &str) -> PyResult<()> {
        self.here("unpublishing a region")?
            .unpublish(name)
            .map_err(|e| to_py(&e, &format!("unpublishing {name:?}")))
    }

    /// Revokes every lease and name.
    fn clear(&self) -> PyResult<()> {
        self.here("clearing regions")?.clear();
        Ok(())
    }

    /// Regions, names, leases and bytes alive (the seed's keys) and the backend.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.here("reading shared-memory stats")?.stats();
        let dict = PyDict::new(py);
        dict.set_item("backend", stats.backend)?;
        dict.set_item("regions", stats.regions)?;
        dict.set_item("published_regions", stats.published_regions)?;
        dict.set_item("active_leases", stats.active_leases)?;
        dict.set_item("bytes", stats.bytes)?;
        dict.set_item("quota_used", self.manager.quota_used())?;
        Ok(dict)
    }
}

fn seconds(ttl: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(ttl)
        .map_err(|_| InvalidArgument::new_err(format!("ttl must be >= 0 seconds, not {ttl}")))
}

/// Shared-memory errors as Python exceptions.
fn to_py(err: &ShmError, context: &str) -> PyErr {
    let message = format!("{context}: {err}");
    match err {
        ShmError::EmptyName
        | ShmError::Exists { .. }
        | ShmError::SlotBusy
        | ShmError::RangeOverflow
        | ShmError::RangeInvalid => InvalidArgument::new_err(message),
        ShmError::NotFound { .. }
        | ShmError::RegionGone
        | ShmError::Stale
        | ShmError::LeaseInactive
        | ShmError::LeaseExpired => LeaseInvalid::new_err(message),
        ShmError::Quota { .. } | ShmError::Exhausted | ShmError::Os { .. } => {
            OutOfMemory::new_err(message)
        }
        _ => SharedMemoryError::new_err(message),
    }
}
