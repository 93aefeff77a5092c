//! `tensorwire._native`: the Python package's native module (PyO3), and the composition root
//! of tensorwire — one node with the io_uring driver, the tokio fallback, HTTP/2 + TLS and
//! shared memory plugged in, so a Python user never wires transports.
//!
//! What it does **not** do: define the public Python API (the pure-Python package
//! `tensorwire` in `pybind/python/tensorwire` wraps these classes), look inside metadata, or
//! copy payloads: buffers go out as buffer-protocol exports and come in as views over engine
//! memory. Engine threads never wait on the GIL: exports are released by attached threads
//! (`buffers::drain_releases`), and Python handlers run on handler threads of their own.

mod buffers;
mod convert;
mod endpoint;
mod errors;
mod loan;
mod message;
mod node;
mod pump;
mod shm;

use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyDict};

/// The process-wide transport counters under the seed's keys, plus each node's driver and
/// why io_uring is not used (if it is not).
#[pyfunction]
fn tensor_transport_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    buffers::drain_releases(py);
    let snapshot = tensorwire_proto::stats::global().snapshot();
    let dict = PyDict::new(py);
    for (key, value) in snapshot.counters() {
        dict.set_item(key, value)?;
    }
    dict.set_item(
        "active_copy_model",
        format!("{:?}", snapshot.active_copy_model),
    )?;
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
    Ok(dict)
}

/// Whether io_uring can be used here; `None` if so, else why not.
#[pyfunction]
fn io_uring_unavailable() -> Option<String> {
    tensorwire_engine::io_uring_available().err()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<message::PyTensorMessage>()?;
    m.add_class::<buffers::Buffer>()?;
    m.add_class::<node::PyNode>()?;
    m.add_class::<endpoint::PyEndpoint>()?;
    m.add_class::<endpoint::PyRequest>()?;
    m.add_class::<pump::Pump>()?;
    m.add_class::<loan::PyLoan>()?;
    m.add_class::<shm::PyShm>()?;
    m.add_class::<shm::PyDescriptor>()?;
    m.add_function(wrap_pyfunction!(tensor_transport_stats, m)?)?;
    m.add_function(wrap_pyfunction!(io_uring_unavailable, m)?)?;
    Ok(())
}
