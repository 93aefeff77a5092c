//! The crate's own tokio runtime, started on first use and kept for the process.

use std::sync::OnceLock;

use tokio::runtime::{Builder, Handle, Runtime};

/// The runtime's handle; the runtime starts with `workers` threads the first time (at most
/// 4, at least 1) and is shared by every driver of the process.
pub(crate) fn handle(workers: usize) -> Result<Handle, std::io::Error> {
    static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        Builder::new_multi_thread()
            .worker_threads(workers.clamp(1, 4))
            .thread_name("tensorwire-tokio")
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| e.to_string())
    });
    match runtime {
        Ok(runtime) => Ok(runtime.handle().clone()),
        Err(text) => Err(std::io::Error::other(format!(
            "cannot start the tokio runtime: {text}"
        ))),
    }
}
