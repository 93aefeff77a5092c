//! The server side of a request that came over shared memory: delivering it to the node (with
//! the peer's credentials as its identity), and answering it over the connection it came on
//! — one helper for every answer, a tensor reply laid out like a request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorwire_proto::TensorMessage;
use tensorwire_proto::shm::{Control, MAX_DATAGRAM, WireReply};
use tensorwire_proto::stats;
use tensorwire_proto::transport::{
    Deadline, Delivery, InboundRequest, LocalPeer, Reply, RequestKind, Responder,
};

use crate::shm::transport::Shared;
use crate::shm::transport::conn::Conn;
use crate::shm::transport::packing::layout;
use crate::shm::transport::service::{credit, on_poll_thread, send_releases};

/// A single reply's data travels inline up to this.
const INLINE_SINGLE: usize = MAX_DATAGRAM - 4096;

/// Sends `reply` to request `id` on `conn` (a broken connection is noticed by the poll
/// thread; the asker's deadline covers the rest).
pub(crate) fn answer(shared: &Shared, conn: &Conn, id: u64, reply: WireReply) {
    send_releases(shared);
    // A connection that broke is noticed by the poll thread; the asker's deadline covers it.
    let _ = conn.transmit(&[], &Control::Reply { id, reply });
}

/// Hands a received request to the node; a tell is acknowledged once it is in the mailbox.
pub(crate) fn deliver(
    shared: &Arc<Shared>,
    conn: &Arc<Conn>,
    id: u64,
    kind: RequestKind,
    path: String,
    message: TensorMessage,
) {
    let responder = Box::new(ShmResponder {
        shared: Arc::clone(shared),
        conn: Arc::clone(conn),
        id,
        kind,
    });
    let mut request = InboundRequest::new(kind, path.clone(), message);
    request.peer = conn.node.parse().ok();
    request.local_peer = Some(LocalPeer {
        uid: conn.peer.uid,
        pid: conn.peer.pid,
    });
    match shared.inbound.deliver(request, responder) {
        Delivery::Enqueued if kind == RequestKind::Tell => {
            answer(shared, conn, id, WireReply::Ack);
        }
        Delivery::Enqueued => {}
        Delivery::Refused(text) => answer(shared, conn, id, WireReply::Error(text)),
        Delivery::Waiting(withdraw) => {
            // The mailbox is full: the answer (an Ack, for a tell) waits; at the enqueue
            // deadline the request is withdrawn and refused, unless it got in meanwhile.
            let timeout = shared.session.enqueue_timeout;
            let (shared, conn) = (Arc::downgrade(shared), Arc::clone(conn));
            let at = Instant::now()
                .checked_add(timeout)
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
            crate::pending::schedule_timer(
                at,
                Box::new(move || {
                    if withdraw.withdraw()
                        && let Some(shared) = shared.upgrade()
                    {
                        let text = format!(
                            "the mailbox of {path} stayed full for {timeout:?}; the {kind} was \
                             not delivered"
                        );
                        answer(&shared, &conn, id, WireReply::Error(text));
                    }
                }),
            );
        }
    }
}

/// Answers one request over the connection it came on.
pub(crate) struct ShmResponder {
    shared: Arc<Shared>,
    conn: Arc<Conn>,
    id: u64,
    kind: RequestKind,
}

impl Responder for ShmResponder {
    fn enqueued(&self) {
        if self.kind == RequestKind::Tell {
            answer(&self.shared, &self.conn, self.id, WireReply::Ack);
        }
    }

    fn respond(self: Box<Self>, answer_: Result<Reply, String>) {
        if self.kind == RequestKind::Tell {
            return; // acknowledged at enqueue
        }
        let reply = match answer_ {
            Err(text) => WireReply::Error(text),
            Ok(Reply::Single { data, .. }) if data.len() > INLINE_SINGLE => {
                WireReply::Error(format!(
                    "a single reply of {} bytes is larger than shared memory carries inline \
                     ({INLINE_SINGLE})",
                    data.len()
                ))
            }
            Ok(Reply::Single { msg_type, data }) => WireReply::Single { msg_type, data },
            Ok(Reply::Tensor(message)) => {
                if on_poll_thread() && needs_copy(&self.shared, &self.conn, &message) {
                    // A handler that ran on the poll thread: copy on the copy thread.
                    let (conn, id) = (Arc::clone(&self.conn), self.id);
                    let job = Box::new(move |shared: &Arc<Shared>| {
                        reply_tensor(shared, &conn, id, &message);
                    });
                    if let Err(job) = self.shared.copier.push(job) {
                        drop(job);
                    }
                    return;
                }
                return reply_tensor(&self.shared, &self.conn, self.id, &message);
            }
        };
        answer(&self.shared, &self.conn, self.id, reply);
    }
}

fn needs_copy(shared: &Shared, conn: &Conn, message: &TensorMessage) -> bool {
    layout(message, &shared.limits, 0, conn).is_ok_and(|l| l.copy > 0)
}

/// Lays a tensor reply out (copying it into a slot if needed, waiting for credit as a send
/// would) and sends it; a reply that cannot be sent becomes an error reply.
fn reply_tensor(shared: &Shared, conn: &Arc<Conn>, id: u64, message: &TensorMessage) {
    let fail = |text: String| answer(shared, conn, id, WireReply::Error(text));
    let layout = match layout(message, &shared.limits, 0, conn) {
        Ok(layout) => layout,
        Err(e) => return fail(format!("cannot send the reply: {e}")),
    };
    let slot = if layout.copy > 0 {
        match credit(
            shared,
            layout.copy,
            Deadline::after(Instant::now(), Duration::MAX),
        ) {
            Ok(slot) => Some(slot),
            Err(why) => return fail(format!("cannot send the reply over shared memory: {why}")),
        }
    } else {
        None
    };
    let packed = match layout.fill(
        message,
        &shared.limits,
        slot,
        &shared.lending,
        conn.peer.pid,
    ) {
        Ok(packed) => packed,
        Err(e) => return fail(format!("cannot send the reply: {e}")),
    };
    let control = Control::Reply {
        id,
        reply: WireReply::Tensor(packed.body),
    };
    let segments: Vec<_> = packed.segments.iter().collect();
    send_releases(shared);
    match conn.transmit(&segments, &control) {
        Ok(_) => {
            stats::global().record_shm_sent(message.total_bytes(), packed.copied, packed.zero_copy);
        }
        Err(_) => {
            for lease in packed.leases {
                shared.lending.release(conn.peer.pid, lease);
            }
        }
    }
}
