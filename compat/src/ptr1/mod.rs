//! The tokio PTR1 driver: the fallback for the io_uring engine, driving the same sessions.

mod client;
mod io;
mod server;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tensorwire_proto::Limits;
use tensorwire_proto::session::{
    ClientRequest, ConnectionPool, ConnectionPoolConfig, SessionConfig,
};
use tensorwire_proto::transport::{
    Completion, Driver, DriverFactory, DriverGauges, DriverSetup, Error, HandOff, Inbound,
    Outbound, OutboundRequest, ReceiveMemory,
};
use tokio::runtime::Handle;
use tokio::sync::{Notify, mpsc, watch};

use crate::runtime;
pub(crate) use crate::sync::{lock, stopped};

/// How long shutdown waits for the driver's tasks to finish.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// Starts [`TokioDriver`]s: plug it into a node as its fallback.
#[derive(Clone, Debug, Default)]
pub struct TokioFallback {
    /// Where the drivers run; `None` is the crate's own runtime.
    runtime: Option<Handle>,
}

impl TokioFallback {
    /// The fallback factory; its drivers run on the crate's own runtime (started on first use,
    /// shared by every driver of the process).
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs the drivers on the application's runtime instead, which must have IO and time
    /// enabled and outlive the nodes. Sockets are made by that runtime's worker threads, so
    /// they belong to those threads' network namespace.
    pub fn on_runtime(runtime: Handle) -> Self {
        Self {
            runtime: Some(runtime),
        }
    }
}

impl DriverFactory for TokioFallback {
    fn name(&self) -> &'static str {
        "tokio"
    }

    fn start(&self, setup: DriverSetup) -> Result<Box<dyn Driver>, Error> {
        let driver = match &self.runtime {
            Some(runtime) => TokioDriver::start_on(setup, runtime.clone())?,
            None => TokioDriver::start(setup)?,
        };
        Ok(Box::new(driver))
    }
}

/// A running tokio PTR1 driver of one node.
pub struct TokioDriver {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for TokioDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokioDriver").finish_non_exhaustive()
    }
}

/// A request for a client connection to carry.
pub(crate) struct Outgoing {
    pub(crate) peer: std::net::SocketAddr,
    pub(crate) request: ClientRequest,
    pub(crate) completion: Box<dyn Completion>,
}

/// What a client connection's task is told.
pub(crate) enum Command {
    Carry(Outgoing),
    Cancel(u64),
    /// Idle too long above the pool's cap: close.
    Close,
}

/// What every task of one driver shares.
pub(crate) struct Shared {
    pub(crate) handle: Handle,
    pub(crate) inbound: Arc<dyn Inbound>,
    pub(crate) memory: Arc<dyn ReceiveMemory>,
    pub(crate) handoff: Option<Arc<dyn HandOff>>,
    pub(crate) session: Arc<SessionConfig>,
    pub(crate) limits: Limits,
    pub(crate) require_tls: bool,
    pub(crate) pool: Mutex<ConnectionPool<u64, Outgoing>>,
    /// The command channel of each client connection.
    pub(crate) conns: Mutex<HashMap<u64, mpsc::UnboundedSender<Command>>>,
    pub(crate) next_id: AtomicU64,
    /// The pool's earliest deadline may have moved.
    pub(crate) pool_changed: Notify,
    pub(crate) shutdown: watch::Sender<bool>,
    /// The driver closes gracefully: accept nothing more, close each served connection once
    /// its request is answered.
    pub(crate) draining: watch::Sender<bool>,
    /// Served connections open.
    pub(crate) serving: AtomicUsize,
    /// Tasks still running.
    pub(crate) tasks: AtomicUsize,
    pub(crate) connections: AtomicUsize,
    /// Where striped requests' stripes go (`None`: the node takes none).
    pub(crate) stripes: Option<Arc<tensorwire_proto::session::StripeStore>>,
}

/// `config` for one pool shared by `threads` runtime threads: the byte budget is per driver
/// thread (the io_uring driver keeps a pool per core), the connection cap stays per pool.
fn one_pool_for_all_threads(
    mut config: ConnectionPoolConfig,
    threads: usize,
) -> ConnectionPoolConfig {
    let threads = u64::try_from(threads.max(1)).unwrap_or(u64::MAX);
    config.busy_bytes_per_peer = config.busy_bytes_per_peer.saturating_mul(threads);
    config
}

impl TokioDriver {
    /// Serves `setup.listener` and carries outbound requests on the crate's runtime.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the runtime or the listener cannot be set up.
    pub fn start(setup: DriverSetup) -> Result<Self, Error> {
        let handle = runtime::handle(setup.threads).map_err(|e| Error::io("starting tokio", e))?;
        Self::start_on(setup, handle)
    }

    /// [`TokioDriver::start`] on the runtime of `handle` (IO and time enabled).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the listener cannot be set up.
    pub fn start_on(setup: DriverSetup, handle: Handle) -> Result<Self, Error> {
        setup
            .listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("setting the listener non-blocking", e))?;
        let (shutdown, _) = watch::channel(false);
        let (draining, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            handle: handle.clone(),
            inbound: setup.inbound,
            memory: setup.memory,
            handoff: setup.handoff,
            stripes: setup.stripes,
            session: setup.session,
            limits: setup.limits,
            require_tls: setup.require_tls,
            pool: Mutex::new(ConnectionPool::new(one_pool_for_all_threads(
                setup.pool,
                setup.threads,
            ))),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            pool_changed: Notify::new(),
            shutdown,
            draining,
            serving: AtomicUsize::new(0),
            tasks: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
        });
        let listener = {
            let _enter = handle.enter();
            tokio::net::TcpListener::from_std(setup.listener)
                .map_err(|e| Error::io("registering the listener with tokio", e))?
        };
        Shared::spawn(&shared, server::accept_loop(Arc::clone(&shared), listener));
        Shared::spawn(&shared, client::pool_janitor(Arc::clone(&shared)));
        Ok(Self { shared })
    }
}

impl Outbound for TokioDriver {
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
        if *self.shared.shutdown.borrow() {
            return completion.complete(Err(Error::Shutdown));
        }
        let limits = &self.shared.limits;
        let request =
            match ClientRequest::encode_framed(kind, &path, message, &framing, limits, deadline) {
                Ok(request) => request.with_pipeline(pipeline),
                Err(e) => return completion.complete(Err(e)),
            };
        client::start(
            &self.shared,
            Outgoing {
                peer,
                request,
                completion,
            },
        );
    }
}

impl Driver for TokioDriver {
    fn name(&self) -> &'static str {
        "tokio"
    }

    fn gauges(&self) -> DriverGauges {
        let mut gauges = DriverGauges::default();
        gauges.connections = self.shared.connections.load(Ordering::Relaxed);
        let pool = lock(&self.shared.pool);
        (gauges.peers, gauges.waiting) = (pool.peers(), pool.waiting());
        drop(pool);
        gauges.operations = self.shared.tasks.load(Ordering::Relaxed);
        gauges
    }

    fn drain(&self) {
        self.shared.draining.send_replace(true);
    }

    fn drained(&self) -> bool {
        *self.shared.draining.borrow() && self.shared.serving.load(Ordering::Acquire) == 0
    }

    fn shutdown(&self) {
        if self.shared.shutdown.send_replace(true) {
            return;
        }
        let (waiting, _) = lock(&self.shared.pool).drain();
        for outgoing in waiting {
            outgoing.completion.complete(Err(Error::Shutdown));
        }
        lock(&self.shared.conns).clear();
        self.shared.pool_changed.notify_one();
        // Tasks see the signal and end; a shutdown from a runtime thread cannot wait for them.
        if Handle::try_current().is_ok() {
            return;
        }
        let deadline = Instant::now() + SHUTDOWN_WAIT;
        while self.shared.tasks.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for TokioDriver {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Shared {
    /// Spawns a task that counts as running until it ends.
    pub(crate) fn spawn(shared: &Arc<Self>, task: impl Future<Output = ()> + Send + 'static) {
        shared.tasks.fetch_add(1, Ordering::AcqRel);
        let guard = TaskGuard(Arc::clone(shared));
        shared.handle.spawn(async move {
            let _guard = guard;
            task.await;
        });
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        *self.shutdown.borrow()
    }
}

/// Counts a task as ended when dropped (also if it panicked).
struct TaskGuard(Arc<Shared>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.tasks.fetch_sub(1, Ordering::AcqRel);
    }
}
