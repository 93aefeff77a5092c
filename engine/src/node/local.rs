//! Nodes of this process by listening address, and sends to them: straight into the target
//! endpoint's mailbox with the sender's buffers (no copy, no socket).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock, Weak};

use tensorwire_proto::TensorMessage;
use tensorwire_proto::fast_hash::FastHash;
use tensorwire_proto::route::Route;
use tensorwire_proto::transport::{
    ActorPath, Deadline, Delivery, Error, InboundRequest, Reply, RequestKind,
};

use crate::endpoint::{LocalResponder, SharedCompleter};
use crate::fork::PerProcess;
use crate::node::NodeInner;
use crate::pending::{Completer, Pending, pair, schedule_timer};
use crate::sync::{lock, read, write};

/// This process's nodes by address: read on every send (to route it), written only when a
/// node starts or stops (only this process inserts: the fast hash serves). A child made by
/// `fork()` starts with none: its parent's nodes are not in this process.
struct LocalNodes(RwLock<HashMap<SocketAddr, Weak<NodeInner>, FastHash>>);

fn local_nodes() -> &'static LocalNodes {
    static NODES: PerProcess<LocalNodes> = PerProcess::new();
    NODES.get_or_init(|| LocalNodes(RwLock::new(HashMap::default())))
}

pub(crate) fn register(addr: SocketAddr, node: Weak<NodeInner>) {
    write(&local_nodes().0).insert(addr, node);
}

pub(crate) fn unregister(addr: SocketAddr) {
    let removed = write(&local_nodes().0).remove(&addr);
    drop(removed);
}

/// The node of this process listening at `peer`, if any (an unspecified bind address matches
/// any loopback address with the same port).
pub(crate) fn lookup(peer: SocketAddr) -> Option<Arc<NodeInner>> {
    let nodes = read(&local_nodes().0);
    if let Some(node) = nodes.get(&peer).and_then(Weak::upgrade) {
        return Some(node);
    }
    if !peer.ip().is_loopback() {
        return None;
    }
    let unspecified: IpAddr = if peer.is_ipv4() {
        [0, 0, 0, 0].into()
    } else {
        Ipv6Addr::UNSPECIFIED.into()
    };
    nodes
        .get(&SocketAddr::new(unspecified, peer.port()))
        .and_then(Weak::upgrade)
}

/// Delivers an ask to `target`'s endpoint; a full mailbox waits (without blocking this
/// thread) until the deadline.
pub(crate) fn ask(
    target: &NodeInner,
    path: &ActorPath,
    message: TensorMessage,
    deadline: Deadline,
) -> Pending<Reply> {
    let (completer, pending) = pair();
    completer.set_route(Route::LocalMailbox);
    completer.expire_at(deadline, move || deadline.error("ask"));
    let shared: SharedCompleter<Reply> = Arc::new(Mutex::new(Some(completer)));
    let responder = LocalResponder::Ask(Arc::clone(&shared));
    let _ = deliver(
        target,
        RequestKind::Ask,
        path,
        message,
        deadline,
        responder,
        &shared,
    );
    pending
}

/// Delivers a tell; it completes once the message is in the mailbox (a full mailbox delays
/// it: backpressure), without blocking this thread.
pub(crate) fn tell(
    target: &NodeInner,
    path: &ActorPath,
    message: TensorMessage,
    deadline: Deadline,
) -> Pending<()> {
    let (completer, pending) = pair();
    completer.set_route(Route::LocalMailbox);
    completer.expire_at(deadline, move || deadline.error("tell"));
    let shared: SharedCompleter<()> = Arc::new(Mutex::new(Some(completer)));
    let responder = LocalResponder::Tell(Arc::clone(&shared));
    if deliver(
        target,
        RequestKind::Tell,
        path,
        message,
        deadline,
        responder,
        &shared,
    ) {
        if let Some(completer) = take(&shared) {
            completer.complete(Ok(()));
        }
    }
    pending
}

/// Whether the request is in the mailbox now (otherwise it waits for space, or failed).
fn deliver<T: Send + 'static>(
    target: &NodeInner,
    kind: RequestKind,
    path: &ActorPath,
    message: TensorMessage,
    deadline: Deadline,
    responder: LocalResponder,
    shared: &SharedCompleter<T>,
) -> bool {
    let fail = |error: Error| {
        if let Some(completer) = take(shared) {
            completer.complete(Err(error));
        }
    };
    if let Some(refusal) = target.registry.admit_error(path.as_str()) {
        fail(refusal);
        return false;
    }
    let request = InboundRequest::new(kind, path.to_string(), message);
    match target
        .registry
        .deliver_or_refuse(request, Box::new(responder))
    {
        Ok(Delivery::Waiting(withdraw)) => {
            // Give up the wait when the caller does (it dropped its `Pending`) or at the
            // deadline (the request's own expiry fails it), whichever comes first.
            let withdraw = Arc::new(Mutex::new(Some(withdraw)));
            let once = move || {
                let taken = lock(&withdraw).take();
                if let Some(withdraw) = taken {
                    let _ = withdraw.withdraw();
                }
            };
            if let Some(at) = deadline.at() {
                schedule_timer(at, Box::new(once.clone()));
            }
            if let Some(completer) = &*lock(shared) {
                completer.on_cancel(Box::new(once));
            }
            false
        }
        Ok(Delivery::Enqueued) => true,
        // Not returned: `deliver_or_refuse` returns every refusal as an error.
        Ok(Delivery::Refused(_)) => {
            fail(Error::MailboxClosed);
            false
        }
        Err(refusal) => {
            fail(refusal);
            false
        }
    }
}

fn take<T>(shared: &SharedCompleter<T>) -> Option<Completer<T>> {
    lock(shared).take()
}
