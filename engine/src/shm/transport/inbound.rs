//! The server side of a request that came over shared memory: delivering it to the node (with
//! the peer's credentials as its identity), and answering it on the connection it came on — a
//! tensor reply laid out like a request (in the record, where its buffers already are, or
//! copied once into a fresh slot).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorwire_proto::TensorMessage;
use tensorwire_proto::shm::{MAX_DATAGRAM, WireReply};
use tensorwire_proto::stats;
use tensorwire_proto::transport::{
    Deadline, Delivery, InboundRequest, LocalPeer, Reply, RequestKind, Responder,
};

use super::Transport;
use super::conn::{Conn, Delivered};
use super::lending::Taken;
use super::outbound::{slot_at_once, slot_for};
use super::packing::{INLINE_REPLY, Layout, layout};

/// A single reply's data travels in the record up to this.
const INLINE_SINGLE: usize = MAX_DATAGRAM - 4096;

/// Hands a received request to the node; a tell is acknowledged once it is in the mailbox.
pub(super) fn deliver(t: &Arc<Transport>, conn: &Arc<Conn>, delivered: Delivered) {
    crate::phase_marks::mark(crate::phase_marks::Phase::Delivered);
    let Delivered {
        id,
        kind,
        path,
        message,
    } = delivered;
    let responder = Box::new(ShmResponder {
        transport: Arc::clone(t),
        conn: Arc::clone(conn),
        id,
        kind,
    });
    let mut request = InboundRequest::new(kind, path.clone(), message);
    request.peer = conn.node_addr;
    request.local_peer = Some(LocalPeer {
        uid: conn.peer.uid,
        pid: conn.peer.pid,
    });
    match t.inbound.deliver(request, responder) {
        Delivery::Enqueued if kind == RequestKind::Tell => answer(t, conn, id, WireReply::Ack),
        Delivery::Enqueued => {}
        Delivery::Refused(text) => answer(t, conn, id, WireReply::Error(text)),
        Delivery::Waiting(withdraw) => {
            // The mailbox is full: the answer (an Ack, for a tell) waits; at the enqueue
            // deadline the request is withdrawn and refused, unless it got in meanwhile.
            let timeout = t.session.enqueue_timeout;
            let (transport, conn) = (Arc::downgrade(t), Arc::clone(conn));
            let at = Instant::now()
                .checked_add(timeout)
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
            crate::pending::schedule_timer(
                at,
                Box::new(move || {
                    if withdraw.withdraw()
                        && let Some(t) = transport.upgrade()
                    {
                        let text = format!(
                            "the mailbox of {path} stayed full for {timeout:?}; the {kind} was \
                             not delivered"
                        );
                        answer(&t, &conn, id, WireReply::Error(text));
                    }
                }),
            );
        }
    }
}

/// Sends `reply` to request `id` on `conn` (a broken connection fails the asker there).
fn answer(t: &Arc<Transport>, conn: &Arc<Conn>, id: u64, reply: WireReply) {
    crate::phase_marks::mark(crate::phase_marks::Phase::Answer);
    conn.with(t, |st| st.session.send_reply(id, reply, &[], 0));
}

/// Answers one request over the connection it came on.
struct ShmResponder {
    transport: Arc<Transport>,
    conn: Arc<Conn>,
    id: u64,
    kind: RequestKind,
}

impl Responder for ShmResponder {
    fn enqueued(&self) {
        if self.kind == RequestKind::Tell {
            answer(&self.transport, &self.conn, self.id, WireReply::Ack);
        }
    }

    fn respond(self: Box<Self>, outcome: Result<Reply, String>) {
        crate::phase_marks::mark(crate::phase_marks::Phase::Responded);
        if self.kind == RequestKind::Tell {
            return; // acknowledged at enqueue
        }
        let reply = match outcome {
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
                let (t, conn, id) = (self.transport, self.conn, self.id);
                let locate = |b: &[u8]| conn.locate(b);
                let layout =
                    match layout(&message, &t.limits, 0, INLINE_REPLY, &t.segments, &locate) {
                        Ok(layout) => layout,
                        Err(e) => {
                            let text = format!("cannot send the reply: {e}");
                            return answer(&t, &conn, id, WireReply::Error(text));
                        }
                    };
                let taken = slot_at_once(&t, conn.peer.pid, layout.copy);
                if layout.copy > 0 && taken.is_none() && super::wake::on_driver_thread() {
                    // A handler that ran on the driver thread, with a large copy or one that
                    // waits for credit: copy on the copy thread.
                    stats::global().record_shm_copy_thread_copy();
                    let job = Box::new(move |t: &Arc<Transport>| {
                        reply_tensor(t, &conn, id, message, layout, None);
                    });
                    if let Err(job) = t.copier.push(job) {
                        drop(job);
                    }
                    return;
                }
                return reply_tensor(&t, &conn, id, message, layout, taken);
            }
        };
        answer(&self.transport, &self.conn, self.id, reply);
    }
}

/// Sends a tensor reply as `layout` says (copying it into `slot`, or into a slot it waits for
/// credit for as a send would, if it needs a copy); a reply that cannot be sent becomes an
/// error reply.
fn reply_tensor(
    t: &Arc<Transport>,
    conn: &Arc<Conn>,
    id: u64,
    message: TensorMessage,
    layout: Layout,
    taken: Option<Taken<'_>>,
) {
    let fail = |text: String| answer(t, conn, id, WireReply::Error(text));
    let deadline = Deadline::never();
    let taken = match slot_for(t, conn.peer.pid, taken, layout.copy, deadline) {
        Ok(taken) => taken,
        Err(why) => return fail(format!("cannot send the reply over shared memory: {why}")),
    };
    let total = message.total_bytes();
    let mut packed = match layout.fill(message, &t.limits, taken, &t.lending, conn.peer.pid) {
        Ok(packed) => packed,
        Err(e) => return fail(format!("cannot send the reply: {e}")),
    };
    let segments: Vec<(u64, u64)> = packed
        .segments
        .iter()
        .map(|s| (s.id, s.len() as u64))
        .collect();
    crate::phase_marks::mark(crate::phase_marks::Phase::Answer);
    let sent = conn.with(t, |st| {
        Conn::attach(st, &packed.segments);
        st.session.send_reply(
            id,
            WireReply::Tensor(packed.take_body()),
            &segments,
            packed.lent,
        )
    });
    if sent {
        stats::global().record_shm_sent(total, packed.copied, packed.zero_copy);
    } else {
        t.lending.release(conn.peer.pid, &packed.leases);
    }
}
