//! Sending a request over a connection: laid out on the calling thread, copied into a fresh
//! slot on the copy thread (or the caller's, when it waits anyway), then handed to the session,
//! which gives it an id on this connection and queues its record.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use tensorwire_proto::TensorMessage;
use tensorwire_proto::shm::{OverBound, SendError, ShmError};
use tensorwire_proto::stats;
use tensorwire_proto::transport::{
    ActorPath, Completion, Deadline, Error, OutboundRequest, RequestKind,
};

use super::conn::{Conn, Waiter};
use super::lending::{Promise, Taken};
use super::packing::{INLINE_REQUEST, Layout, layout};
use super::{Transport, WhenFull};
use crate::shm::segments::class;

/// A request on its way out.
struct Outgoing {
    peer: SocketAddr,
    path: ActorPath,
    kind: RequestKind,
    message: TensorMessage,
    deadline: Deadline,
    completion: Box<dyn Completion>,
    layout: Layout,
}

/// Sends `request` on `conn`. A message that needs a copy into a slot is copied on the copy
/// thread, or here if `here` (the caller waits anyway) and this is not the driver thread.
pub(super) fn send(t: &Arc<Transport>, conn: &Arc<Conn>, request: OutboundRequest, here: bool) {
    let OutboundRequest {
        peer,
        path,
        kind,
        message,
        deadline,
        completion,
        ..
    } = request;
    crate::phase_marks::mark(crate::phase_marks::Phase::ShmSend);
    if completion.is_cancelled() {
        return completion.complete(Err(Error::Cancelled));
    }
    let locate = |b: &[u8]| conn.locate(b);
    let path_len = path.as_str().len();
    let layout = match layout(
        &message,
        &t.limits,
        path_len,
        INLINE_REQUEST,
        &t.segments,
        &locate,
    ) {
        Ok(layout) => layout,
        Err(e) => return completion.complete(Err(e)),
    };
    let outgoing = Outgoing {
        peer,
        path,
        kind,
        message,
        deadline,
        completion,
        layout,
    };
    if here && !super::wake::on_driver_thread() {
        // The caller reads the reply itself only within a spin window (`caller::wait_here`);
        // without one, the peer must ring for it as for any other.
        let reading = !t.config.spin.is_zero();
        return transmit(t, conn, outgoing, reading, None);
    }
    if outgoing.layout.copy == 0 {
        return transmit(t, conn, outgoing, false, None);
    }
    if let Some(taken) = slot_at_once(t, conn.peer.pid, outgoing.layout.copy) {
        return transmit(t, conn, outgoing, false, Some(taken));
    }
    stats::global().record_shm_copy_thread_copy();
    let conn = Arc::clone(conn);
    let job = Box::new(move |t: &Arc<Transport>| transmit(t, &conn, outgoing, false, None));
    if let Err(job) = t.copier.push(job) {
        drop(job); // dropping the job drops its completion: the caller sees it abandoned
    }
}

/// A copy of up to this many bytes is made on the sending thread (any thread, the driver's
/// included) when a slot is free at once: it costs less than handing the send to the copy
/// thread and waking it. Larger copies, and sends that must wait for credit, go to the copy
/// thread.
pub(super) const COPY_AT_ONCE: usize = 64 << 10;

/// A slot for a copy of `len` bytes for process `holder` that may be made on this thread: one
/// that is small enough, free now (never waits for credit) and within what `holder` may hold.
pub(super) fn slot_at_once(t: &Transport, holder: u32, len: usize) -> Option<Taken<'_>> {
    if len == 0 || len > COPY_AT_ONCE {
        return None;
    }
    // Checked, not promised: a copy this short ends within moments, so copies made at the
    // same moment for one process pass its bound by one such slot each at most, and a
    // promise would cost every small message a third lock of the lease book.
    let bounds = &t.config.bounds;
    t.lending
        .may_promise(bounds, holder, class(len) as u64)
        .ok()?;
    let slot = t.segments.take(len).ok()?;
    Some(Taken::new(slot, None))
}

/// Copies (if needed, into `slot` when one was taken already) and hands one request to the
/// session. `reading`: the calling thread reads the reply itself next (`caller::wait_here`,
/// which hands the connection back to the driver when it stops), so the peer need not ring
/// for it.
fn transmit(
    t: &Arc<Transport>,
    conn: &Arc<Conn>,
    outgoing: Outgoing,
    reading: bool,
    taken: Option<Taken<'_>>,
) {
    let Outgoing {
        peer,
        path,
        kind,
        message,
        deadline,
        completion,
        layout,
    } = outgoing;
    if completion.is_cancelled() {
        return completion.complete(Err(Error::Cancelled));
    }
    let taken = match slot_for(t, conn.peer.pid, taken, layout.copy, deadline) {
        Ok(taken) => taken,
        Err(why) => {
            let request = OutboundRequest::new(peer, path, kind, message, deadline, completion);
            return full(t, request, &why);
        }
    };
    let total = message.total_bytes();
    let mut packed = match layout.fill(message, &t.limits, taken, &t.lending, conn.peer.pid) {
        Ok(packed) => packed,
        Err(e) => return completion.complete(Err(e)),
    };
    let segments: Vec<(u64, u64)> = packed
        .segments
        .iter()
        .map(|s| (s.id, s.len() as u64))
        .collect();
    // The caller may give up at any point: the hook finds the request by its id once it has
    // one, and a cancellation that came before is acted on right after.
    let cancel = Arc::new(Cancel::default());
    {
        let (cancel, conn, t) = (Arc::clone(&cancel), Arc::downgrade(conn), Arc::downgrade(t));
        completion.on_cancel(Box::new(move || cancel.fire(&conn, &t)));
    }
    let now = Instant::now();
    let mut wake_driver = false;
    crate::phase_marks::mark(crate::phase_marks::Phase::SessionEnter);
    let sent = conn.with(t, |st| {
        if reading {
            Conn::reading(st);
        } else {
            wake_driver = conn.ring_for_driver(st, t.wake.is_asleep());
        }
        let id = st.session.send_request(
            now,
            kind,
            path.as_str().to_owned(),
            packed.take_body(),
            &segments,
            deadline.at(),
        );
        crate::phase_marks::mark(crate::phase_marks::Phase::RequestQueued);
        match id {
            Ok(id) => {
                Conn::attach(st, &packed.segments);
                cancel.id.store(id, Ordering::Release);
                let waiter = Waiter {
                    completion,
                    peer,
                    kind,
                    deadline,
                };
                Conn::wait_for(st, id, waiter);
                Ok(())
            }
            Err(e) => Err((e, completion)),
        }
    });
    if wake_driver {
        t.wake.signal();
    }
    match sent {
        Ok(()) => {
            stats::global().record_shm_sent(total, packed.copied, packed.zero_copy);
            if cancel.early.load(Ordering::Acquire) {
                cancel.fire(&Arc::downgrade(conn), &Arc::downgrade(t));
            }
            if let Some(at) = deadline.at() {
                t.wake.deadline(at);
            }
        }
        Err((e, completion)) => {
            t.lending.release(conn.peer.pid, &packed.leases);
            completion.complete(Err(send_error(e, peer, kind, deadline)));
        }
    }
}

/// The slot a copy of `len` bytes for process `holder` goes into: `taken` if one was taken
/// already, none if nothing is copied, else one waited for as [`credit`] does. `Err` says why
/// there is none.
pub(super) fn slot_for<'a>(
    t: &'a Transport,
    holder: u32,
    taken: Option<Taken<'a>>,
    len: usize,
    deadline: Deadline,
) -> Result<Option<Taken<'a>>, String> {
    match taken {
        Some(slot) => Ok(Some(slot)),
        None if len > 0 => credit(t, holder, len, deadline).map(Some),
        None => Ok(None),
    }
}

/// A slot of `len` bytes for process `holder`, waiting for credit (within the send's deadline
/// and the configured wait) while the quota is used up. A process that holds all it may gets
/// no slot and no wait: waiting for its own releases would hold this thread (the copy thread,
/// a handler's) for every other peer, while the process decides when it releases. `Err` says
/// why there is none.
fn credit(t: &Transport, holder: u32, len: usize, deadline: Deadline) -> Result<Taken<'_>, String> {
    let promise =
        promise(t, holder, len).map_err(|over| format!("{over}; it must release views first"))?;
    match t.segments.take(len) {
        Ok(slot) => return Ok(Taken::new(slot, Some(promise))),
        Err(ShmError::Quota { .. }) => {}
        Err(e) => return Err(e.to_string()),
    }
    stats::global().record_shm_credit_wait();
    let wait = t.config.credit_wait;
    let until = Deadline::after(Instant::now(), wait).min(deadline);
    let until = until.at().unwrap_or_else(|| Instant::now() + wait);
    let slot = t.segments.take_until(len, until).map_err(|e| match e {
        ShmError::Quota { .. } => format!(
            "receivers hold this node's shared memory ({} of {} bytes in held slots); no \
             credit came back within {wait:?}",
            t.segments.held_bytes(),
            t.segments.quota(),
        ),
        other => other.to_string(),
    })?;
    Ok(Taken::new(slot, Some(promise)))
}

/// A slot for `len` bytes more promised to process `holder`, if it may hold that on top of
/// what it holds and what copies under way for it were promised (counted at the slot's size,
/// as what it holds is; [`PeerBounds::held_bytes_per_process`](tensorwire_proto::shm::PeerBounds)).
fn promise(t: &Transport, holder: u32, len: usize) -> Result<Promise<'_>, OverBound> {
    t.lending
        .promise(&t.config.bounds, holder, class(len) as u64)
}

/// No credit came: the send goes over the remote path or fails, as configured.
fn full(t: &Transport, request: OutboundRequest, why: &str) {
    if t.config.when_full == WhenFull::FallBack {
        stats::global().record_shm_credit_fallback();
        tracing::debug!(peer = %request.peer, %why, "shared memory is full: sending over the remote path");
        return t.elsewhere(request, false, why);
    }
    stats::global().record_shm_credit_refusal();
    request.completion.complete(Err(Error::SharedMemoryFull {
        reason: why.to_owned(),
    }));
}

fn send_error(e: SendError, peer: SocketAddr, kind: RequestKind, deadline: Deadline) -> Error {
    match e {
        SendError::Deadline => deadline.error(kind.as_str()),
        SendError::Closed(reason) => Error::ConnectionClosed {
            peer,
            detail: Some(std::io::Error::other(reason.to_string())),
        },
        SendError::TooManyInFlight(n) => Error::Overloaded {
            what: "the shared-memory connection's requests in flight",
            capacity: n,
        },
        SendError::PeerNotReading(_) => Error::ConnectionClosed {
            peer,
            detail: Some(std::io::Error::other(e.to_string())),
        },
        other => Error::Misuse(other.to_string()),
    }
}

/// A caller's cancellation, which may come before its request has an id.
#[derive(Default)]
struct Cancel {
    /// The request's id on its connection (0 until it has one).
    id: AtomicU64,
    /// The caller gave up before the request had an id.
    early: AtomicBool,
}

impl Cancel {
    fn fire(&self, conn: &Weak<Conn>, t: &Weak<Transport>) {
        let id = self.id.load(Ordering::Acquire);
        if id == 0 {
            self.early.store(true, Ordering::Release);
            return;
        }
        if let (Some(conn), Some(t)) = (conn.upgrade(), t.upgrade()) {
            conn.cancel(&t, id);
        }
    }
}
