//! Statistics as Python values: the process-wide counters under the seed's keys, and a node's
//! gauges as numbers and dicts.

use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyDict};
use tensorwire_engine::Node;

use crate::buffers::drain_releases;
use crate::{errors, tells};

/// The process-wide transport counters under the seed's keys (`active_copy_model` one of
/// `unused`, `direct_tcp`, `packed_http2_compatibility`, `shared_memory`), plus each node's
/// driver, why io_uring is not used (if it is not), errors raised by kind and fire-and-forget
/// tells that failed.
#[pyfunction]
pub(crate) fn tensor_transport_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    drain_releases(py);
    let snapshot = tensorwire_proto::stats::global().snapshot();
    let dict = PyDict::new(py);
    for (key, value) in snapshot.counters() {
        dict.set_item(key, value)?;
    }
    dict.set_item("active_copy_model", snapshot.active_copy_model.as_str())?;
    let engine = tensorwire_engine::stats::snapshot();
    dict.set_item("zero_copy_requests", engine.zero_copy_requests)?;
    dict.set_item("zero_copy_done", engine.zero_copy_done)?;
    dict.set_item("zero_copy_copied", engine.zero_copy_copied)?;
    dict.set_item("fallback_reason", engine.fallback_reason)?;
    let drivers = PyDict::new(py);
    for (addr, driver) in engine.drivers {
        drivers.set_item(addr.to_string(), driver)?;
    }
    dict.set_item("drivers", drivers)?;
    dict.set_item(
        "errors",
        errors::raised()
            .into_iter()
            .collect::<Vec<_>>()
            .into_py_dict(py)?,
    )?;
    dict.set_item("tells_failed", tells::failures())?;
    Ok(dict)
}

/// A node's driver, pools and connection gauges.
pub(crate) fn node_stats<'py>(py: Python<'py>, node: &Node) -> PyResult<Bound<'py, PyDict>> {
    let stats = node.stats();
    let dict = PyDict::new(py);
    dict.set_item("address", node.local_addr().to_string())?;
    dict.set_item("driver", stats.driver)?;
    dict.set_item("fallback_reason", stats.fallback_reason)?;
    dict.set_item("transport", stats.transport)?;
    dict.set_item("transport_connections", stats.transport_connections)?;
    let pool = &stats.pool;
    dict.set_item(
        "pool",
        [
            ("hits", pool.hits),
            ("misses", pool.misses),
            ("heap", pool.heap),
            ("idle_bytes", pool.idle_bytes),
            ("receiving_bytes", pool.receiving_bytes),
            ("released", pool.released),
        ]
        .into_py_dict(py)?,
    )?;
    let gauges = &stats.gauges;
    dict.set_item(
        "gauges",
        [
            ("connections", gauges.connections),
            ("timers", gauges.timers),
            ("operations", gauges.operations),
            ("peers", gauges.peers),
            ("waiting", gauges.waiting),
            ("failed_cores", gauges.failed_cores),
            ("core_restarts", gauges.core_restarts),
        ]
        .into_py_dict(py)?,
    )?;
    let shm = PyDict::new(py);
    shm.set_item("connections", stats.shm_connections)?;
    shm.set_item("leases", stats.shm_leases)?;
    shm.set_item("lent_bytes", stats.shm_lent_bytes)?;
    shm.set_item("segments", stats.shm_segments)?;
    shm.set_item("segment_bytes", stats.shm_segment_bytes)?;
    shm.set_item("held_bytes", node.shm().held_bytes())?;
    dict.set_item("shm", shm)?;
    // The flat keys of earlier versions.
    dict.set_item("shm_connections", stats.shm_connections)?;
    dict.set_item("shm_leases", stats.shm_leases)?;
    Ok(dict)
}
