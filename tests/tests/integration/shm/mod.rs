//! Shared memory: the node's manager (regions, names, leases, loans) and the same-host data
//! path (memfds over a Unix socket), in one process and across processes.

mod cross_process;
mod data_path;
mod hostile;
mod hostile_harness;
mod hostile_more;
mod identity;
mod layout;
mod manager;
mod memory_back;
mod wakeups;
mod window;
