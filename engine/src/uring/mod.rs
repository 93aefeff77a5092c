//! The io_uring driver of PTR1 sessions: one thread per core, one ring each, the connections
//! placed on a core for life, and one small file per operation under [`op`].
//!
//! The driver only moves bytes: what a connection means is decided by its session
//! (`tensorwire_proto::session`). Requests reach a core through a bounded queue plus an
//! eventfd wake; received requests go to the node through its `Inbound`, their answers come
//! back as events.

mod commands;
mod conn;
mod core;
mod keys;
mod op;
mod ring;
mod slab;
mod supervise;
#[cfg(test)]
mod tests;
mod timers;

use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use tensorwire_proto::Limits;
use tensorwire_proto::session::{ClientRequest, ConnectionPoolConfig, SessionConfig};
use tensorwire_proto::transport::{
    Driver, DriverGauges, DriverSetup, Error, HandOff, Inbound, Outbound, OutboundRequest,
    ReceiveMemory,
};

pub(crate) use ring::availability;

use crate::sync::lock;
use commands::{CoreHandle, Event, Outgoing};

/// When frames are sent with `SENDMSG_ZC` (the kernel sends from the frame's own pages instead
/// of copying them; the memory is held until the kernel's notification).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ZeroCopy {
    /// For frames of at least the threshold to peers that are not on loopback (where the kernel
    /// copies anyway); a connection whose sends come back "copied" stops using it.
    Auto,
    /// For every frame of at least the threshold, loopback included (for measuring).
    Always,
    /// Never.
    Never,
}

impl ZeroCopy {
    /// Whether frames to `peer` may use `SENDMSG_ZC`.
    pub(crate) fn allowed(self, peer: Option<SocketAddr>) -> bool {
        match self {
            Self::Always => true,
            Self::Never => false,
            // On loopback the kernel copies every zero-copy skb anyway (deferred copy).
            Self::Auto => peer.is_some_and(|peer| !peer.ip().is_loopback()),
        }
    }
}

/// Settings of the io_uring driver beyond the [`DriverSetup`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct UringConfig {
    pub(crate) ring_entries: u32,
    /// New requests queued per core at most.
    pub(crate) queue_capacity: usize,
    pub(crate) zero_copy: ZeroCopy,
    pub(crate) zero_copy_min_bytes: u64,
    /// How long shutdown waits for operations in flight before leaking their memory.
    pub(crate) shutdown_timeout: Duration,
    /// How long a core polls instead of sleeping after a short idle spell.
    pub(crate) busy_poll: Duration,
    /// How often a failed core is restarted on a new ring within a minute, at most (then it
    /// stays out of the driver).
    pub(crate) core_restarts: u32,
}

/// What every core of a driver shares.
pub(crate) struct Context {
    pub(crate) inbound: Arc<dyn Inbound>,
    pub(crate) memory: Arc<dyn ReceiveMemory>,
    pub(crate) handoff: Option<Arc<dyn HandOff>>,
    pub(crate) session: Arc<SessionConfig>,
    pub(crate) pool: ConnectionPoolConfig,
    pub(crate) require_tls: bool,
    pub(crate) zero_copy: ZeroCopy,
    pub(crate) zero_copy_min: u64,
    pub(crate) shutdown_timeout: Duration,
    /// How long a core polls instead of sleeping after a short idle spell.
    pub(crate) busy_poll: Duration,
    /// Every core of the driver, once all have started: an accepted connection is placed on
    /// the next live one in turn, whichever core's accept took it.
    pub(crate) cores: OnceLock<Vec<CoreHandle>>,
    /// The round-robin of accepted connections.
    pub(crate) next_accepted: AtomicUsize,
    /// Where striped requests' stripes go (`None`: the node takes none).
    pub(crate) stripes: Option<Arc<tensorwire_proto::session::StripeStore>>,
}

/// The io_uring PTR1 driver of one node.
pub(crate) struct UringDriver {
    cores: Vec<CoreHandle>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    next: AtomicUsize,
    limits: Limits,
    /// Closed only after every core thread has stopped using it.
    listener: Mutex<Option<TcpListener>>,
    shut_down: AtomicBool,
}

impl UringDriver {
    /// Starts `setup.threads` core threads on the node's listener.
    ///
    /// # Errors
    ///
    /// [`Error::DriverUnavailable`] if a ring cannot be set up on a core thread;
    /// [`Error::Io`] if a thread or eventfd cannot be created.
    pub(crate) fn start(setup: DriverSetup, config: UringConfig) -> Result<Self, Error> {
        let ctx = Arc::new(Context {
            inbound: setup.inbound,
            memory: setup.memory,
            handoff: setup.handoff,
            session: setup.session,
            pool: setup.pool,
            require_tls: setup.require_tls,
            zero_copy: config.zero_copy,
            zero_copy_min: config.zero_copy_min_bytes,
            shutdown_timeout: config.shutdown_timeout,
            busy_poll: config.busy_poll,
            cores: OnceLock::new(),
            next_accepted: AtomicUsize::new(0),
            stripes: setup.stripes,
        });
        let listener_fd = setup.listener.as_raw_fd();
        let mut driver = Self {
            cores: Vec::new(),
            threads: Mutex::new(Vec::new()),
            next: AtomicUsize::new(0),
            limits: setup.limits,
            listener: Mutex::new(Some(setup.listener)),
            shut_down: AtomicBool::new(false),
        };
        for index in 0..setup.threads.max(1) {
            match spawn_core(index, Arc::clone(&ctx), listener_fd, config) {
                Ok((handle, thread)) => {
                    driver.cores.push(handle);
                    lock(&driver.threads).push(thread);
                }
                Err(e) => {
                    driver.shutdown();
                    return Err(e);
                }
            }
        }
        let _ = ctx.cores.set(driver.cores.clone());
        Ok(driver)
    }
}

impl UringDriver {
    /// The next core in the round-robin that has not failed; once every one has, the error
    /// names why the first one did.
    fn next_live_core(&self) -> Result<&CoreHandle, Error> {
        match (next_live(&self.cores, &self.next), self.cores.first()) {
            (Some(core), _) => Ok(core),
            (None, Some(first)) => Err(Error::DriverFailed {
                driver: "io_uring",
                reason: format!(
                    "every core thread failed (the first: {})",
                    first.shared.failure().unwrap_or_default()
                ),
            }),
            (None, None) => Err(Error::Shutdown),
        }
    }
}

/// The next of `cores` in the round-robin kept by `next` that has not failed.
pub(crate) fn next_live<'a>(cores: &'a [CoreHandle], next: &AtomicUsize) -> Option<&'a CoreHandle> {
    let count = cores.len();
    let start = next.fetch_add(1, Ordering::Relaxed);
    (0..count)
        .filter_map(|step| cores.get(start.wrapping_add(step) % count))
        .find(|core| !core.shared.is_failed())
}

impl Outbound for UringDriver {
    fn send(&self, request: OutboundRequest) {
        let OutboundRequest {
            peer,
            path,
            kind,
            message,
            deadline,
            completion,
            framing,
            pipeline,
            ..
        } = request;
        if self.shut_down.load(Ordering::Acquire) {
            return completion.complete(Err(Error::Shutdown));
        }
        // Encoded on the caller's thread: the core only moves the bytes.
        let encoded =
            ClientRequest::encode_framed(kind, &path, message, &framing, &self.limits, deadline);
        let request = match encoded {
            Ok(request) => request.with_pipeline(pipeline),
            Err(e) => return completion.complete(Err(e)),
        };
        let core = match self.next_live_core() {
            Ok(core) => core,
            Err(e) => return completion.complete(Err(e)),
        };
        let outgoing = Outgoing {
            peer,
            request,
            completion,
        };
        core.submit(outgoing);
    }
}

impl Driver for UringDriver {
    fn name(&self) -> &'static str {
        "io_uring"
    }

    fn gauges(&self) -> DriverGauges {
        let mut gauges = DriverGauges::default();
        for core in &self.cores {
            let shared = &core.shared;
            gauges.connections += shared.connections.load(Ordering::Relaxed);
            gauges.timers += shared.timers.load(Ordering::Relaxed);
            gauges.operations += shared.operations.load(Ordering::Relaxed);
            gauges.peers += shared.peers.load(Ordering::Relaxed);
            gauges.waiting += shared.waiting.load(Ordering::Relaxed);
            gauges.failed_cores += usize::from(shared.is_failed());
            gauges.core_restarts += shared.restarts.load(Ordering::Relaxed);
        }
        gauges
    }

    fn drain(&self) {
        for core in &self.cores {
            core.shared.draining.store(true, Ordering::Release);
            core.post(Event::Drain);
        }
    }

    fn drained(&self) -> bool {
        self.cores.iter().all(|core| core.shared.is_drained())
    }

    fn shutdown(&self) {
        self.shut_down.store(true, Ordering::Release);
        for core in &self.cores {
            core.post(Event::Shutdown);
        }
        let threads = std::mem::take(&mut *lock(&self.threads));
        let current = std::thread::current().id();
        for thread in threads {
            if thread.thread().id() == current {
                continue; // shutdown from a handler on this core: it ends by itself
            }
            if thread.join().is_err() {
                tracing::error!("a core thread ended with a panic");
            }
        }
        drop(lock(&self.listener).take());
    }
}

impl Drop for UringDriver {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts a core thread; returns once its ring exists (or failed to).
fn spawn_core(
    index: usize,
    ctx: Arc<Context>,
    listener: std::os::fd::RawFd,
    config: UringConfig,
) -> Result<(CoreHandle, JoinHandle<()>), Error> {
    let (handle, inbox) = CoreHandle::new(config.queue_capacity)?;
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
    let core_handle = handle.clone();
    let thread = std::thread::Builder::new()
        .name(format!("tensorwire-core-{index}"))
        .spawn(move || match ring::Ring::new(config.ring_entries) {
            Ok(ring) => {
                let _ = ready_tx.send(Ok(()));
                supervise::run_core_thread(index, ring, ctx, core_handle, inbox, listener, config);
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e));
            }
        })
        .map_err(|e| Error::io("spawning a core thread", e))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok((handle, thread)),
        Ok(Err(e)) => Err(Error::DriverUnavailable {
            driver: "io_uring",
            reason: format!("core ring setup: {e}"),
            hint: "plug in a fallback driver (NodeBuilder::fallback)",
        }),
        Err(_) => Err(Error::DriverUnavailable {
            driver: "io_uring",
            reason: "the core thread died at start".into(),
            hint: "plug in a fallback driver (NodeBuilder::fallback)",
        }),
    }
}
