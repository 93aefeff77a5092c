//! Nodes on the hosts of a [`Testbed`](crate::netns::Testbed): either PTR1 driver, optionally
//! with HTTP/2 (h2c or TLS), and the endpoints the across-hosts cases ask.
//!
//! Each node that needs tokio gets a runtime of its own, started inside its host: the compat
//! crate's own runtime is process-wide, and its worker threads (which make the sockets) would
//! sit in whichever namespace used it first.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tensorwire_engine::{Node, NodeBuilder, Reply, TensorMessage};
use tokio::runtime::Runtime;

use crate::http2::Wire;
use crate::netns::Host;
use crate::{Driver, checksum, require_io_uring};

/// A node running inside a host, with the runtime its tokio parts use.
pub struct HostNode {
    node: Node,
    /// Dropped after the node (field order).
    _runtime: Option<Runtime>,
}

impl Deref for HostNode {
    type Target = Node;

    fn deref(&self) -> &Node {
        &self.node
    }
}

/// How many times the handler of each request id (a message's `version`) ran.
#[derive(Clone, Default)]
pub struct Deliveries(Arc<Mutex<HashMap<u32, u32>>>);

impl Deliveries {
    /// Counts one delivery of `id`.
    pub fn count(&self, id: u32) {
        *self.lock().entry(id).or_insert(0) += 1;
    }

    /// How many times `id` was delivered.
    pub fn of(&self, id: u32) -> u32 {
        self.lock().get(&id).copied().unwrap_or(0)
    }

    /// The ids delivered more than once.
    pub fn duplicates(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .lock()
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Distinct ids delivered.
    pub fn distinct(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, u32>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Starts a node on `host` (listening on its address, any port) with `driver`, and `wire` as
/// its HTTP/2 transport if given; `configure` adds settings.
pub fn start_node(
    host: &Host,
    driver: Driver,
    wire: Option<&Wire>,
    configure: impl FnOnce(NodeBuilder) -> NodeBuilder + Send,
) -> HostNode {
    start_node_on(host, 0, driver, wire, configure)
}

/// [`start_node`] listening on `port` (0: any).
pub fn start_node_on(
    host: &Host,
    port: u16,
    driver: Driver,
    wire: Option<&Wire>,
    configure: impl FnOnce(NodeBuilder) -> NodeBuilder + Send,
) -> HostNode {
    host.enter(|| {
        let runtime = (driver == Driver::Tokio || wire.is_some()).then(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("tensorwire-host-tokio")
                .enable_all()
                .build()
                .expect("a tokio runtime starts")
        });
        let handle = runtime.as_ref().map(|runtime| runtime.handle().clone());
        let builder = Node::builder(host.addr(port))
            .cores(2)
            .in_process_delivery(false);
        let builder = match (driver, &handle) {
            (Driver::Uring, _) => {
                require_io_uring();
                builder
            }
            (Driver::Tokio, Some(handle)) => builder.force_fallback(true).fallback(Arc::new(
                tensorwire_compat::TokioFallback::on_runtime(handle.clone()),
            )),
            (Driver::Tokio, None) => unreachable!("a tokio node has a runtime"),
        };
        let builder = match wire {
            Some(wire) => wire.configure_on(builder, handle),
            None => builder,
        };
        let node = configure(builder).build().expect("the node starts");
        assert_eq!(node.stats().driver, driver.name());
        HostNode {
            node,
            _runtime: runtime,
        }
    })
}

/// A server on `host` with `echo` (returns the request) and `digest` (counts the delivery of
/// the request's id in `deliveries` and answers with its checksum), two handler threads each.
pub fn start_server(
    host: &Host,
    driver: Driver,
    wire: Option<&Wire>,
    deliveries: &Deliveries,
    configure: impl FnOnce(NodeBuilder) -> NodeBuilder + Send,
) -> HostNode {
    start_server_on(host, 0, driver, wire, deliveries, configure)
}

/// [`start_server`] listening on `port` (0: any).
pub fn start_server_on(
    host: &Host,
    port: u16,
    driver: Driver,
    wire: Option<&Wire>,
    deliveries: &Deliveries,
    configure: impl FnOnce(NodeBuilder) -> NodeBuilder + Send,
) -> HostNode {
    let node = start_node_on(host, port, driver, wire, configure);
    node.serve("echo", 2, |request| Ok(Reply::Tensor(request.message)))
        .expect("echo registers");
    let deliveries = deliveries.clone();
    node.serve("digest", 2, move |request| {
        deliveries.count(request.message.version);
        Ok(digest_reply(&request.message))
    })
    .expect("digest registers");
    node
}

/// What `digest` answers for `message`: its id and checksum.
pub fn digest_reply(message: &TensorMessage) -> Reply {
    let mut data = message.version.to_le_bytes().to_vec();
    data.extend_from_slice(&checksum(message).to_le_bytes());
    Reply::Single {
        msg_type: "digest".into(),
        data: Bytes::from(data),
    }
}
