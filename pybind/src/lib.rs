//! `tensorwire._native`: the Python package's native module (PyO3), and the composition root
//! of tensorwire — one node with the io_uring driver, the tokio fallback, HTTP/2 + TLS and
//! shared memory plugged in, so a Python user never wires transports.
//!
//! What it does **not** do: define the public Python API (the pure-Python package
//! `tensorwire` in `pybind/python/tensorwire` wraps these classes), look inside metadata, or
//! copy payloads: buffers go out as buffer-protocol exports and come in as views over engine
//! memory. Engine threads never wait on the GIL: exports are released by attached threads
//! (`buffers::drain_releases`), and Python handlers run on handler threads of their own.

mod allocator;
mod arrived;
mod buffers;
mod calls;
mod config;
mod convert;
mod dlpack;
mod endpoint;
mod errors;
mod handlers;
mod into;
mod loan;
mod message;
mod node;
mod pending;
mod pump;
mod reference;
mod settled;
mod shm;
mod stats;
mod sync;
mod tells;

use pyo3::prelude::*;

/// Whether io_uring can be used here; `None` if so, else why not.
#[pyfunction]
fn io_uring_unavailable() -> Option<String> {
    tensorwire_engine::io_uring_available().err()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    allocator::configure();
    m.add_class::<message::PyTensorMessage>()?;
    m.add_class::<buffers::Buffer>()?;
    m.add_class::<node::PyNode>()?;
    m.add_class::<reference::PyRef>()?;
    m.add_class::<endpoint::PyEndpoint>()?;
    m.add_class::<endpoint::PyRequest>()?;
    m.add_class::<pump::Pump>()?;
    m.add_class::<arrived::Arrived>()?;
    m.add_class::<pending::PyPending>()?;
    m.add_class::<loan::PyLoan>()?;
    m.add_class::<shm::PyShm>()?;
    m.add_class::<shm::PyDescriptor>()?;
    m.add_function(wrap_pyfunction!(stats::tensor_transport_stats, m)?)?;
    m.add_function(wrap_pyfunction!(io_uring_unavailable, m)?)?;
    Ok(())
}
