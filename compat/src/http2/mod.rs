//! PTM1 over HTTP/2 (hyper) and TLS (rustls): the compatibility path. Bodies are streamed —
//! the sender hands h2 the PTM1 head, the metadata and each buffer as separate chunks, the
//! receiver decodes DATA frames as they arrive straight into the node's receive memory — so
//! neither side ever holds a second copy of a message.
//!
//! Connections come from the node's PTR1 listener (a hand-off of everything that does not
//! start with `PTR1`, with the bytes already read) or from a standalone listener
//! ([`Http2Transport::listen`]). Sends come from the node's router.

mod accept;
mod client;
mod config;
mod prefixed;
mod read_ahead;
mod record_copy;
mod recv;
mod send_body;
mod service;
mod tls;
mod wire;

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tensorwire_proto::Limits;
use tensorwire_proto::session::SessionConfig;
use tensorwire_proto::transport::{
    Error, HandOff, Inbound, Outbound, OutboundRequest, ReceiveMemory, Transport, TransportFactory,
    TransportSetup,
};
use tokio::runtime::Handle;
use tokio::sync::watch;

pub use config::Http2Config;
pub use tls::{TlsConfig, TlsConfigBuilder};

use crate::{runtime, socket_options};

/// Starts [`Http2Transport`]s: plug it into a node with `NodeBuilder::transport`.
#[derive(Clone, Debug, Default)]
pub struct Http2 {
    config: Http2Config,
    /// Where the transports run; `None` is the crate's own runtime.
    runtime: Option<Handle>,
}

impl Http2 {
    /// A factory with these settings; its transports run on the crate's own runtime.
    pub fn new(config: Http2Config) -> Self {
        Self {
            config,
            runtime: None,
        }
    }

    /// Runs the transports on the application's runtime instead, which must have IO and time
    /// enabled and outlive the nodes. Sockets are made by that runtime's worker threads, so
    /// they belong to those threads' network namespace.
    #[must_use]
    pub fn on_runtime(mut self, runtime: Handle) -> Self {
        self.runtime = Some(runtime);
        self
    }
}

impl TransportFactory for Http2 {
    fn name(&self) -> &'static str {
        "http2"
    }

    fn start(&self, setup: TransportSetup) -> Result<Arc<dyn Transport>, Error> {
        let config = self.config.clone();
        let transport = match &self.runtime {
            Some(runtime) => Http2Transport::start_on(config, setup, runtime.clone())?,
            None => Http2Transport::start(config, setup)?,
        };
        Ok(transport)
    }
}

/// A running HTTP/2 transport of one node: server (hand-offs, standalone listeners) and client.
pub struct Http2Transport {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Http2Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http2Transport")
            .field("tls", &self.shared.config.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Http2Transport {
    /// Starts the transport on the crate's runtime.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] if TLS is required but no certificate is configured; [`Error::Io`] if
    /// the runtime cannot start.
    pub fn start(config: Http2Config, setup: TransportSetup) -> Result<Arc<Self>, Error> {
        let handle = runtime::handle(2).map_err(|e| Error::io("start the tokio runtime", e))?;
        Self::start_on(config, setup, handle)
    }

    /// [`Http2Transport::start`] on the runtime of `handle` (IO and time enabled).
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] if TLS is required but no certificate is configured.
    pub fn start_on(
        config: Http2Config,
        setup: TransportSetup,
        handle: Handle,
    ) -> Result<Arc<Self>, Error> {
        let acceptor = match &config.tls {
            Some(tls) => tls.server.clone().map(tokio_rustls::TlsAcceptor::from),
            None => None,
        };
        if config.require_tls && acceptor.is_none() {
            return Err(Error::Misuse(
                "HTTP/2 requires TLS but no server certificate is configured".into(),
            ));
        }
        let TransportSetup {
            inbound,
            memory,
            session,
            limits,
            ..
        } = setup;
        let (shutdown, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            handle,
            inbound,
            memory,
            session,
            limits,
            config,
            acceptor,
            peers: client::Peers::default(),
            shutdown,
            connections: AtomicUsize::new(0),
        });
        Ok(Arc::new(Self { shared }))
    }

    /// Serves HTTP/2 (and TLS) on `listener` as well, without a PTR1 listener in front: for
    /// use without the engine. Returns the address it listens on.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the listener cannot be registered with the runtime.
    pub fn listen(&self, listener: std::net::TcpListener) -> Result<SocketAddr, Error> {
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("getsockname", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("set_nonblocking", e))?;
        socket_options::tune_listener(&listener, &self.shared.session);
        let shared = Arc::clone(&self.shared);
        let _enter = self.shared.handle.enter();
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| Error::io("register the listener", e))?;
        self.shared.handle.spawn(accept::listen(shared, listener));
        Ok(addr)
    }
}

impl Outbound for Http2Transport {
    fn send(&self, request: OutboundRequest) {
        client::send(&self.shared, request);
    }
}

impl Transport for Http2Transport {
    fn name(&self) -> &'static str {
        if self.shared.config.tls.is_some() {
            "http2+tls"
        } else {
            "http2"
        }
    }

    fn handoff(&self) -> Option<Arc<dyn HandOff>> {
        Some(Arc::new(Handoff(Arc::clone(&self.shared))))
    }

    fn encrypts(&self) -> bool {
        self.shared.config.tls.is_some()
    }

    fn requires_encryption(&self) -> bool {
        self.shared.config.require_tls
    }

    fn requires_client_identity(&self) -> bool {
        self.shared
            .config
            .tls
            .as_ref()
            .is_some_and(|tls| tls.client_auth)
    }

    fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::Relaxed)
    }

    fn shutdown(&self) {
        if self.shared.shutdown.send_replace(true) {
            return;
        }
        // Connections send GOAWAY and finish what is in flight; a shutdown from outside the
        // runtime waits a little for them.
        if Handle::try_current().is_ok() {
            return;
        }
        let deadline = std::time::Instant::now() + SHUTDOWN_WAIT;
        while self.connections() > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Http2Transport {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// How long shutdown waits for connections to finish.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// Takes over connections from a PTR1 listener.
struct Handoff(Arc<Shared>);

impl HandOff for Handoff {
    fn hand_off(&self, stream: TcpStream, already_read: Vec<u8>) {
        if let Err(e) = stream.set_nonblocking(true) {
            return tracing::debug!(error = %e, "cannot hand a connection to HTTP/2; closed");
        }
        let shared = Arc::clone(&self.0);
        self.0.handle.spawn(async move {
            match tokio::net::TcpStream::from_std(stream) {
                Ok(stream) => accept::serve(shared, stream, already_read).await,
                Err(e) => tracing::debug!(error = %e, "cannot register a handed-off connection"),
            }
        });
    }
}

/// What every task of one transport shares.
pub(crate) struct Shared {
    pub(crate) handle: Handle,
    pub(crate) inbound: Arc<dyn Inbound>,
    pub(crate) memory: Arc<dyn ReceiveMemory>,
    pub(crate) session: Arc<SessionConfig>,
    pub(crate) limits: Limits,
    pub(crate) config: Http2Config,
    pub(crate) acceptor: Option<tokio_rustls::TlsAcceptor>,
    pub(crate) peers: client::Peers,
    pub(crate) shutdown: watch::Sender<bool>,
    pub(crate) connections: AtomicUsize,
}

impl Shared {
    pub(crate) fn is_shut_down(&self) -> bool {
        *self.shutdown.borrow()
    }
}

/// Counts a connection as open until dropped.
pub(crate) struct Guard(Arc<Shared>);

impl Guard {
    pub(crate) fn connection(shared: &Arc<Shared>) -> Self {
        shared.connections.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(shared))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}
