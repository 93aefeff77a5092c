//! The crate's own tokio runtime, started on first use and kept for the process.
//!
//! A child made by `fork()` inherits a copy of the runtime without its worker threads: tasks
//! spawned on it would never run. The runtime therefore remembers the process that started it,
//! and a child starts its own on first use (the parent's copy is leaked, never dropped:
//! dropping it would wait for threads that do not exist here).

use std::sync::Mutex;

use tokio::runtime::{Builder, Handle, Runtime};

/// The runtime of this process, and the process it was started in.
static RUNTIME: Mutex<Option<(u32, &'static Runtime)>> = Mutex::new(None);

/// The runtime's handle; the runtime starts with `workers` threads the first time in this
/// process (at most 4, at least 1) and is shared by every driver of the process.
pub(crate) fn handle(workers: usize) -> Result<Handle, std::io::Error> {
    let pid = std::process::id();
    let mut slot = crate::sync::lock(&RUNTIME);
    if let Some((owner, runtime)) = *slot
        && owner == pid
    {
        return Ok(runtime.handle().clone());
    }
    let runtime = Builder::new_multi_thread()
        .worker_threads(workers.clamp(1, 4))
        .thread_name("tensorwire-tokio")
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| std::io::Error::other(format!("cannot start the tokio runtime: {e}")))?;
    let runtime: &'static Runtime = Box::leak(Box::new(runtime));
    *slot = Some((pid, runtime));
    Ok(runtime.handle().clone())
}
