//! Transports that run beside a node's PTR1 driver (HTTP/2 + TLS, later shared memory): how a
//! node starts one, and what it asks of it.

use std::sync::Arc;

use crate::config::SessionConfig;
use crate::limits::Limits;
use crate::transport::{Error, HandOff, Inbound, Outbound, ReceiveMemory};

/// Starts a transport for a node.
pub trait TransportFactory: Send + Sync + 'static {
    /// The transport's name (`"http2"`, …).
    fn name(&self) -> &'static str;

    /// Starts it with the node's endpoints and receive memory.
    ///
    /// # Errors
    ///
    /// Whatever stopped it from starting (a bad certificate, …).
    fn start(&self, setup: TransportSetup) -> Result<Arc<dyn Transport>, Error>;
}

/// A running transport: it carries the sends the router gives it and, if it serves
/// connections, takes over those the PTR1 listener hands off.
pub trait Transport: Outbound {
    /// The transport's name (`"http2"`, …).
    fn name(&self) -> &'static str;

    /// Where the PTR1 listener sends connections that do not start with `PTR1`, if this
    /// transport serves them.
    fn handoff(&self) -> Option<Arc<dyn HandOff>>;

    /// Whether sends through it are encrypted (TLS). The router sends every remote message
    /// through an encrypting transport.
    fn encrypts(&self) -> bool;

    /// Whether its server accepts encrypted connections only: then plaintext PTR1 is refused.
    fn requires_encryption(&self) -> bool;

    /// Whether its server requires clients to prove who they are (TLS client certificates).
    /// Such a node serves no path without that proof — shared memory included, unless
    /// allowed explicitly.
    fn requires_client_identity(&self) -> bool {
        false
    }

    /// Connections it holds now (server and client).
    fn connections(&self) -> usize;

    /// Stops serving and fails what is in flight. Idempotent.
    fn shutdown(&self);
}

/// Everything a transport needs from its node.
#[non_exhaustive]
pub struct TransportSetup {
    /// Where received requests go.
    pub inbound: Arc<dyn Inbound>,
    /// Where received payload goes.
    pub memory: Arc<dyn ReceiveMemory>,
    /// Deadlines (enqueue, idle, connect) and limits.
    pub session: Arc<SessionConfig>,
    /// Limits of received and sent messages.
    pub limits: Limits,
}

impl TransportSetup {
    /// A setup with the given parts.
    pub fn new(
        inbound: Arc<dyn Inbound>,
        memory: Arc<dyn ReceiveMemory>,
        session: Arc<SessionConfig>,
    ) -> Self {
        Self {
            inbound,
            memory,
            limits: session.limits,
            session,
        }
    }
}

impl std::fmt::Debug for TransportSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransportSetup")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}
