//! Starting a built node: the listener, the same-host and plugged-in transports, the PTR1
//! driver (io_uring, or the fallback and why), and the receive pool's upkeep timer.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tensorwire_proto::Limits;
use tensorwire_proto::congestion::SameHostCongestion;
use tensorwire_proto::route::Preference;
use tensorwire_proto::session::{SessionConfig, StripeStore};
use tensorwire_proto::shm::PeerBounds;
use tensorwire_proto::transport::{Driver, DriverSetup, Error, HandOff, Transport, TransportSetup};

use crate::blocking::BlockingPool;
use crate::endpoint::Registry;
use crate::node::pipelines::PipelineDepths;
use crate::node::stripes::{StripeConfig, StripeSender};
use crate::node::{Node, NodeInner, local};
use crate::pool::ReceivePool;
use crate::shm::transport::{KnockDesk, KnockHandOff, ShmConfig, ShmTransport};
use crate::shm::{Segments, SegmentsConfig, ShmManager};
use crate::uring::{UringConfig, UringDriver};
use crate::{stats, tcp_options, uring};

use super::{NodeBuilder, ShmAccess};

/// How often an io_uring core that failed is restarted on a new ring within a minute, at most.
const CORE_RESTARTS_PER_MINUTE: u32 = 3;

const NO_FALLBACK_HINT: &str = "plug in the tokio fallback with \
    NodeBuilder::fallback(Arc::new(tensorwire_compat::TokioFallback::default()))";

impl NodeBuilder {
    /// Binds, starts the driver and returns the running node.
    ///
    /// # Errors
    ///
    /// [`Error::DriverUnavailable`] if io_uring cannot be used here (the reason says why) and
    /// no fallback is plugged in; [`Error::Config`] for a bad limit, transport or same-host
    /// congestion-control variable;
    /// [`Error::Io`] if binding fails.
    pub fn build(self) -> Result<Node, Error> {
        let limits = match self.limits {
            Some(limits) => limits,
            None => Limits::from_env()?,
        };
        let preference = match self.preference {
            Some(preference) => preference,
            None => Preference::from_env()?,
        };
        let same_host_congestion = match &self.same_host_congestion {
            Some(choice) => choice.clone(),
            None => SameHostCongestion::from_env()?,
        };
        let listener = TcpListener::bind(self.bind).map_err(|e| Error::io("bind", e))?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| Error::io("getsockname", e))?;
        let mut session = self.session.clone();
        session.limits = limits;
        session.same_host_congestion = same_host_congestion;
        tcp_options::tune_listener(listener.as_raw_fd(), local_addr, &session);
        let session = Arc::new(session);
        let registry = Arc::new(Registry::new(self.mailbox_capacity, self.mailbox_waiting));
        let pool = ReceivePool::new(self.receive_pool);
        let transport: Option<Arc<dyn Transport>> = match &self.transport {
            Some(factory) => Some(factory.start(TransportSetup::new(
                registry.clone(),
                Arc::new(pool.clone()),
                Arc::clone(&session),
            ))?),
            None => None,
        };
        let next_handoff = self
            .handoff
            .clone()
            .or_else(|| transport.as_ref().and_then(|t| t.handoff()));
        let require_tls =
            self.require_tls || transport.as_ref().is_some_and(|t| t.requires_encryption());
        let encrypts = transport.as_ref().is_some_and(|t| t.encrypts());
        let shm_quota = self
            .shm_quota
            .unwrap_or_else(|| crate::pool::physical_memory() / 4);
        let segments = Segments::new(SegmentsConfig {
            quota: shm_quota,
            idle_keep: self.shm_idle_keep,
            idle_after: self.shm_idle_after,
        });
        let shm_manager = ShmManager::with_segments(self.shm_backend, segments.clone());
        let strict = require_tls
            || transport
                .as_ref()
                .is_some_and(|t| t.requires_client_identity());
        let (shm, shm_off) = self.start_shm(local_addr, &registry, &session, segments, strict);
        let desk = shm.as_ref().map_or_else(
            || Arc::new(KnockDesk::refusing(shm_off.clone())),
            ShmTransport::desk,
        );
        let handoff: Option<Arc<dyn HandOff>> = Some(Arc::new(KnockHandOff {
            desk,
            next: next_handoff,
        }));
        let stripe_store = (self.stripes_taken >= 2).then(|| {
            Arc::new(StripeStore::new(
                Arc::new(pool.clone()),
                limits,
                self.stripes_taken,
            ))
        });
        let stripe_config = self.stripe_config()?;
        let setup = |listener| {
            let mut setup = DriverSetup::new(
                listener,
                registry.clone(),
                Arc::new(pool.clone()),
                Arc::clone(&session),
            );
            setup.handoff = handoff.clone();
            setup.pool = self.pool;
            setup.limits = limits;
            setup.threads = self.cores;
            setup.require_tls = require_tls;
            setup.stripes = stripe_store.clone();
            setup
        };
        let reason = if self.force_fallback {
            Some("forced by NodeBuilder::force_fallback".to_owned())
        } else {
            uring::availability().err()
        };
        let driver: Arc<dyn Driver> = match reason {
            None => {
                let config = UringConfig {
                    ring_entries: self.ring_entries,
                    queue_capacity: self.request_queue_capacity,
                    zero_copy: self.zero_copy,
                    zero_copy_min_bytes: self.zero_copy_min_bytes,
                    shutdown_timeout: self.shutdown_timeout,
                    busy_poll: self.core_busy_poll,
                    core_restarts: CORE_RESTARTS_PER_MINUTE,
                };
                Arc::new(UringDriver::start(setup(listener), config)?)
            }
            Some(reason) => {
                let Some(factory) = &self.fallback else {
                    stats::record_fallback(&reason, None);
                    return Err(Error::DriverUnavailable {
                        driver: "io_uring",
                        reason,
                        hint: NO_FALLBACK_HINT,
                    });
                };
                stats::record_fallback(&reason, Some(factory.name()));
                Arc::from(factory.start(setup(listener))?)
            }
        };
        let blocking = BlockingPool::new(
            Arc::clone(&session),
            Arc::new(pool.clone()),
            limits,
            self.pool.idle_per_peer,
            // The calling thread drives its exchange as a core drives its connections.
            self.core_busy_poll,
        );
        let stripes = StripeSender::new(stripe_config, Arc::downgrade(&driver));
        let pipelines = PipelineDepths::new(Arc::downgrade(&driver));
        let inner = Arc::new(NodeInner {
            local_addr,
            driver,
            stripes,
            pipelines,
            stripe_store,
            registry,
            pool,
            blocking,
            limits,
            preference,
            in_process_delivery: self.in_process_delivery,
            require_tls,
            encrypts,
            transport,
            shm,
            shm_off,
            shm_hello_timeout: self.shm_hello_timeout,
            shm_manager,
            busy_poll: self.busy_poll,
            handler_threads: Mutex::new(Vec::new()),
            outbound: crate::inflight::InFlightCount::default(),
            birth: crate::fork::Birth::here(),
            shut_down: AtomicBool::new(false),
        });
        if let Some(shm) = &inner.shm {
            let node = Arc::downgrade(&inner);
            shm.set_elsewhere(Box::new(move |request| match node.upgrade() {
                Some(node) => node.send_remote(request),
                None => request.completion.complete(Err(Error::Shutdown)),
            }));
        }
        local::register(local_addr, Arc::downgrade(&inner));
        stats::register_node(local_addr, inner.driver.name());
        maintain(Arc::downgrade(&inner), self.receive_pool.idle_ttl);
        Ok(Node { inner })
    }
}

impl NodeBuilder {
    /// The same-host transport, if this node's access allows it and it starts; else why not.
    fn start_shm(
        &self,
        node: SocketAddr,
        registry: &Arc<Registry>,
        session: &Arc<SessionConfig>,
        segments: Segments,
        strict: bool,
    ) -> (Option<ShmTransport>, String) {
        let off = match (self.shm_access, strict) {
            (ShmAccess::Off, _) => "shared memory is off on this node".to_owned(),
            (ShmAccess::Auto, true) => "this node requires TLS or client certificates: it \
                 serves and uses shared memory only when allowed explicitly \
                 (NodeBuilder::shm_access(ShmAccess::SameUser), shared_memory=\"same-user\" in \
                 Python)"
                .to_owned(),
            (ShmAccess::Auto | ShmAccess::SameUser, _) => {
                let config = ShmConfig {
                    credit_wait: self.shm_credit_wait,
                    when_full: self.shm_when_full,
                    hello_timeout: self.shm_hello_timeout,
                    spin: self.shm_spin,
                    queue_bytes: self.shm_queue_bytes,
                    bounds: held_bound(
                        self.shm_bounds.unwrap_or_else(fitted_bounds),
                        segments.quota(),
                    ),
                };
                let inbound: Arc<dyn tensorwire_proto::transport::Inbound> = registry.clone();
                match ShmTransport::start(node, inbound, Arc::clone(session), config, segments) {
                    Ok(shm) => return (Some(shm), String::new()),
                    Err(e) => {
                        tracing::warn!(error = %e, "shared memory unavailable for this node; same-host peers use TCP");
                        format!("shared memory could not start on this node: {e}")
                    }
                }
            }
        };
        (None, off)
    }
}

impl NodeBuilder {
    /// The striping settings: explicit values, else `TENSORWIRE_STRIPES` and
    /// `TENSORWIRE_STRIPE_THRESHOLD`, else none (one stripe) and 4 MiB.
    fn stripe_config(&self) -> Result<StripeConfig, Error> {
        let var = |name: &'static str| -> Result<Option<u64>, Error> {
            match std::env::var(name) {
                Ok(text) => text.trim().parse::<u64>().map(Some).map_err(|_| {
                    Error::Config(tensorwire_proto::ConfigError {
                        variable: name,
                        value: text.clone(),
                        expected: "a base-10 unsigned integer",
                    })
                }),
                Err(_) => Ok(None),
            }
        };
        let count = match self.stripes {
            Some(count) => count,
            None => var(STRIPES_VAR)?.map_or(1, |n| {
                u16::try_from(n)
                    .unwrap_or(u16::MAX)
                    .clamp(1, tensorwire_proto::stripe::MAX_STRIPES)
            }),
        };
        let threshold = match self.stripe_threshold {
            Some(bytes) => bytes,
            None => var(STRIPE_THRESHOLD_VAR)?.unwrap_or(DEFAULT_STRIPE_THRESHOLD),
        };
        Ok(StripeConfig {
            count,
            threshold,
            loopback: self.stripe_loopback,
        })
    }
}

/// Stripes per large request, when `NodeBuilder::stripes` is not called.
const STRIPES_VAR: &str = "TENSORWIRE_STRIPES";
/// Payload bytes from which a request is striped, when `NodeBuilder::stripe_threshold` is not
/// called.
const STRIPE_THRESHOLD_VAR: &str = "TENSORWIRE_STRIPE_THRESHOLD";
/// The default stripe threshold.
const DEFAULT_STRIPE_THRESHOLD: u64 = 4 << 20;

/// `bounds` with what one peer process may hold set to half of `quota` (this node's
/// shared-memory bytes) where it was left at its default (`u64::MAX`).
fn held_bound(bounds: PeerBounds, quota: u64) -> PeerBounds {
    if bounds.held_bytes_per_process != u64::MAX {
        return bounds;
    }
    PeerBounds {
        held_bytes_per_process: quota / 2,
        ..bounds
    }
}

/// The per-peer bounds fitted to this process's descriptor limit and `vm.max_map_count`.
fn fitted_bounds() -> PeerBounds {
    let open_files = crate::sys::open_files_limit().unwrap_or(1024);
    let max_map_count = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65_530);
    PeerBounds::fitted(open_files, max_map_count)
}

/// Gives idle receive-pool slots back to the system every half `ttl` while the node lives.
fn maintain(node: std::sync::Weak<NodeInner>, ttl: Duration) {
    let every = (ttl / 2).max(Duration::from_millis(100));
    let Some(at) = std::time::Instant::now().checked_add(every) else {
        return;
    };
    crate::pending::schedule_timer(
        at,
        Box::new(move || {
            let Some(inner) = node.upgrade() else {
                return;
            };
            if inner.is_shut_down() {
                return;
            }
            let now = std::time::Instant::now();
            inner.pool().release_unused(now);
            if let Some(store) = &inner.stripe_store {
                store.sweep(now);
            }
            drop(inner);
            maintain(node, ttl);
        }),
    );
}
