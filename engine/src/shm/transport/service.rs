//! Moving messages: sending a request (laid out on the calling thread, copied on the copy
//! thread when it needs a slot), and the poll thread that accepts and greets connections,
//! receives (hellos, maps, requests, replies, releases), sends what waited for room, gives
//! leases back, retires idle segments and notices holders that left.

use std::cell::Cell;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tensorwire_proto::TensorMessage;
use tensorwire_proto::shm::{Control, MAX_DATAGRAM, WireReply, decode};
use tensorwire_proto::stats;
use tensorwire_proto::transport::{
    ActorPath, Answer, Completion, Deadline, Error, OutboundRequest, Reply, RequestKind,
};

use crate::shm::segments::SlotMut;
use crate::shm::socket;
use crate::shm::transport::conn::Conn;
use crate::shm::transport::holding::{map_segment, unmap_segment, unpack};
use crate::shm::transport::packing::{Layout, layout};
use crate::shm::transport::responder;
use crate::shm::transport::{Shared, WhenFull, elsewhere, lock};

thread_local! {
    static TRANSPORT_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as the poll thread (a copy it would make goes to the copy thread
/// instead, so the poll thread never copies).
pub(crate) fn mark_poll_thread() {
    TRANSPORT_THREAD.with(|t| t.set(true));
}

/// Whether the calling thread is the poll thread.
pub(crate) fn on_poll_thread() -> bool {
    TRANSPORT_THREAD.with(Cell::get)
}

/// A request waiting for its answer.
pub(crate) struct Waiting {
    pub(crate) conn: u64,
    pub(crate) peer: SocketAddr,
    pub(crate) kind: RequestKind,
    completion: Box<dyn Completion>,
    timer: u64,
}

impl Waiting {
    pub(crate) fn fail(self, error: Error) {
        crate::pending::cancel_timer(self.timer);
        self.completion.complete(Err(error));
    }
}

/// A request on its way out.
struct Outgoing {
    id: u64,
    conn: Arc<Conn>,
    peer: SocketAddr,
    path: ActorPath,
    kind: RequestKind,
    message: TensorMessage,
    deadline: Deadline,
    layout: Layout,
}

/// Sends `request` on `conn`. Small messages go out from this thread (a non-blocking
/// `sendmsg`; when the socket is full the poll thread sends it); a copy into a slot runs on
/// the copy thread, or here if `here` (the caller waits anyway).
pub(crate) fn send(shared: &Arc<Shared>, conn: &Arc<Conn>, request: OutboundRequest, here: bool) {
    let OutboundRequest {
        peer,
        path,
        kind,
        message,
        deadline,
        completion,
        ..
    } = request;
    if completion.is_cancelled() {
        return completion.complete(Err(Error::Cancelled));
    }
    let layout = match layout(&message, &shared.limits, path.as_str().len(), conn) {
        Ok(layout) => layout,
        Err(e) => return completion.complete(Err(e)),
    };
    let id = next_id();
    // Cancellation is armed before the request is listed and checked after, so a caller
    // that gave up at any point is never lost.
    let cancelled = Arc::new(AtomicBool::new(false));
    {
        let (shared, cancelled) = (Arc::downgrade(shared), Arc::clone(&cancelled));
        completion.on_cancel(Box::new(move || {
            cancelled.store(true, Ordering::Release);
            if let Some(shared) = shared.upgrade() {
                finish(&shared, id, Err(Error::Cancelled));
            }
        }));
    }
    lock(&shared.pending).insert(
        id,
        Waiting {
            conn: conn.id,
            peer,
            kind,
            completion,
            timer: 0,
        },
    );
    if cancelled.load(Ordering::Acquire) {
        return finish(shared, id, Err(Error::Cancelled));
    }
    // The deadline is armed after the request is listed: one that passed already (a
    // timeout of 0) finds it.
    if let Some(at) = deadline.at() {
        let weak = Arc::downgrade(shared);
        let timer = crate::pending::schedule_timer(
            at,
            Box::new(move || {
                if let Some(shared) = weak.upgrade() {
                    finish(&shared, id, Err(deadline.error(kind.as_str())));
                }
            }),
        );
        match lock(&shared.pending).get_mut(&id) {
            Some(waiting) => waiting.timer = timer,
            None => crate::pending::cancel_timer(timer),
        }
    }
    let outgoing = Outgoing {
        id,
        conn: Arc::clone(conn),
        peer,
        path,
        kind,
        message,
        deadline,
        layout,
    };
    if outgoing.layout.copy == 0 || (here && !on_poll_thread()) {
        return transmit(shared, outgoing);
    }
    let job = Box::new(move |shared: &Arc<Shared>| transmit(shared, outgoing));
    if shared.copier.push(job).is_err() {
        finish(shared, id, Err(Error::Shutdown));
    }
}

/// Copies (if needed) and sends one request that still waits for its answer.
fn transmit(shared: &Arc<Shared>, outgoing: Outgoing) {
    let Outgoing {
        id,
        conn,
        peer,
        path,
        kind,
        message,
        deadline,
        layout,
    } = outgoing;
    if !lock(&shared.pending).contains_key(&id) {
        return; // its deadline passed or its caller gave up while it waited
    }
    let slot = if layout.copy > 0 {
        match credit(shared, layout.copy, deadline) {
            Ok(slot) => Some(slot),
            Err(why) => {
                return full(shared, id, peer, path, kind, message, deadline, &why);
            }
        }
    } else {
        None
    };
    let packed = match layout.fill(
        &message,
        &shared.limits,
        slot,
        &shared.lending,
        conn.peer.pid,
    ) {
        Ok(packed) => packed,
        Err(e) => return finish(shared, id, Err(e)),
    };
    let control = Control::Request {
        id,
        kind,
        path: path.as_str().to_owned(),
        body: packed.body,
    };
    let segments: Vec<_> = packed.segments.iter().collect();
    match conn.transmit(&segments, &control) {
        Ok(_) => {
            stats::global().record_shm_sent(message.total_bytes(), packed.copied, packed.zero_copy);
        }
        Err(e) => {
            for lease in packed.leases {
                shared.lending.release(conn.peer.pid, lease);
            }
            finish(
                shared,
                id,
                Err(Error::ConnectionClosed {
                    peer,
                    detail: Some(e),
                }),
            );
        }
    }
}

/// A slot of `len` bytes, waiting for credit (within the send's deadline and the configured
/// wait) when the quota is used up. `Err` says why there is none.
pub(crate) fn credit(shared: &Shared, len: usize, deadline: Deadline) -> Result<SlotMut, String> {
    match shared.segments.take(len) {
        Ok(slot) => return Ok(slot),
        Err(tensorwire_proto::shm::ShmError::Quota { .. }) => {}
        Err(e) => return Err(e.to_string()),
    }
    stats::global().record_shm_credit_wait();
    let until = Deadline::after(Instant::now(), shared.config.credit_wait).min(deadline);
    let until = until
        .at()
        .unwrap_or_else(|| Instant::now() + shared.config.credit_wait);
    shared.segments.take_until(len, until).map_err(|e| match e {
        tensorwire_proto::shm::ShmError::Quota { .. } => format!(
            "receivers hold this node's shared memory ({} of {} bytes in held slots); no \
             credit came back within {:?}",
            shared.segments.held_bytes(),
            shared.segments.quota(),
            shared.config.credit_wait
        ),
        other => other.to_string(),
    })
}

/// No credit came: the send goes over the remote path or fails, as configured.
#[allow(clippy::too_many_arguments)]
fn full(
    shared: &Arc<Shared>,
    id: u64,
    peer: SocketAddr,
    path: ActorPath,
    kind: RequestKind,
    message: TensorMessage,
    deadline: Deadline,
    why: &str,
) {
    let Some(waiting) = lock(&shared.pending).remove(&id) else {
        return;
    };
    crate::pending::cancel_timer(waiting.timer);
    if shared.config.when_full == WhenFull::FallBack {
        stats::global().record_shm_credit_fallback();
        tracing::debug!(%peer, %why, "shared memory is full: sending over the remote path");
        let request = OutboundRequest::new(peer, path, kind, message, deadline, waiting.completion);
        return elsewhere(shared, request, false, why);
    }
    stats::global().record_shm_credit_refusal();
    waiting.completion.complete(Err(Error::SharedMemoryFull {
        reason: why.to_owned(),
    }));
}

fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Completes request `id` (if it still waits) and forgets its deadline.
pub(crate) fn finish(shared: &Shared, id: u64, outcome: Result<Answer, Error>) {
    let waiting = lock(&shared.pending).remove(&id);
    if let Some(waiting) = waiting {
        crate::pending::cancel_timer(waiting.timer);
        waiting.completion.complete(outcome);
    }
}

/// Sends the releases of views that dropped, batched per connection. A reply sends them first
/// too: the asker then has the memory of its request back before it sees the answer, and its
/// next send reuses that (cache-warm) slot.
pub(crate) fn send_releases(shared: &Shared) {
    for (conn, leases) in shared.releases.take() {
        for chunk in leases.chunks((MAX_DATAGRAM - 64) / 8) {
            let release = Control::Release {
                leases: chunk.to_vec(),
            };
            let _ = conn.transmit(&[], &release);
        }
    }
}

/// Receives what waits on `conn` on a caller's thread that waits for its own reply anyway:
/// polls the socket for up to `budget` or until `done()`, handling whatever arrives (its reply
/// completes its request). A caller that finds the poll thread receiving leaves it to it. The
/// reply then needs no wake-up of the poll thread or of the caller.
pub(crate) fn receive_while(
    shared: &Arc<Shared>,
    conn: &Arc<Conn>,
    budget: Duration,
    done: &dyn Fn() -> bool,
) {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let start = Instant::now();
    conn.caller_waits();
    BUF.with(|buf| {
        let mut buf = buf.borrow_mut();
        if buf.len() < MAX_DATAGRAM {
            buf.resize(MAX_DATAGRAM, 0);
        }
        while !done() && start.elapsed() < budget {
            if let Some(_rx) = conn.try_receive_lock()
                && drain(shared, conn, &mut buf).is_none()
            {
                conn.close(); // the poll thread sees the hang-up and cleans up
                return;
            }
            std::hint::spin_loop();
        }
    });
    conn.caller_done();
}

/// Receives and handles every datagram waiting on `conn` (the poll thread); `false` once it is
/// closed or broken.
pub(crate) fn receive_ready(shared: &Arc<Shared>, conn: &Arc<Conn>, buf: &mut [u8]) -> bool {
    let _rx = conn.receive_lock();
    drain(shared, conn, buf).is_some()
}

/// Receives and handles every datagram waiting now: how many, or `None` once closed or
/// broken.
fn drain(shared: &Arc<Shared>, conn: &Arc<Conn>, buf: &mut [u8]) -> Option<usize> {
    let mut handled = 0;
    loop {
        match socket::receive(conn.raw(), buf, 1) {
            Ok(Some(received)) => {
                if !take(shared, conn, buf, received) {
                    return None;
                }
                handled += 1;
            }
            Ok(None) => return (!conn.is_closed()).then_some(handled),
            Err(_) => return None,
        }
    }
}

/// Handles one received datagram; `false` at end of stream or when the peer broke the
/// protocol.
fn take(shared: &Arc<Shared>, conn: &Arc<Conn>, buf: &[u8], received: socket::Received) -> bool {
    {
        if received.len == 0 {
            return false;
        }
        let Ok(control) = decode(&buf[..received.len]) else {
            tracing::debug!("invalid shared-memory datagram: closing the connection");
            return false;
        };
        if received.truncated {
            stats::global().record_shm_fd_failure();
        }
        handle(shared, conn, control, received.fds, received.truncated)
    }
}

/// Handles one datagram; `false` if the peer broke the protocol (the connection closes).
fn handle(
    shared: &Arc<Shared>,
    conn: &Arc<Conn>,
    control: Control,
    mut fds: Vec<OwnedFd>,
    truncated: bool,
) -> bool {
    match control {
        Control::Map { segment, len } => {
            if truncated || fds.is_empty() {
                // At the descriptor limit: the segment never arrived. The peer announces it
                // again the next time it uses it; what refers to it now fails cleanly.
                lock(&conn.lost).insert(segment);
                let _ = conn.transmit(&[], &Control::Unmapped { segment });
                return true;
            }
            lock(&conn.lost).remove(&segment);
            match map_segment(conn, segment, len, fds.pop()) {
                Ok(()) => true,
                Err(why) => {
                    tracing::warn!(node = %conn.node, %why, "a shared-memory segment was refused");
                    false
                }
            }
        }
        Control::Unmapped { segment } => {
            conn.forget(segment);
            true
        }
        Control::Retire { segment } => {
            unmap_segment(conn, segment);
            true
        }
        Control::Release { leases } => {
            for lease in leases {
                shared.lending.release(conn.peer.pid, lease);
            }
            true
        }
        Control::Request {
            id,
            kind,
            path,
            body,
        } => {
            let refuse = |text: String| {
                for lease in body.leases() {
                    shared.releases.push(Arc::downgrade(conn), lease);
                }
                responder::answer(shared, conn, id, WireReply::Error(text));
            };
            if let Err(text) = shared.inbound.admit(kind, &path) {
                refuse(text);
                return true;
            }
            match unpack(
                conn,
                &shared.releases,
                &shared.lending,
                &body,
                &shared.limits,
            ) {
                Ok(message) => responder::deliver(shared, conn, id, kind, path, message),
                Err(text) => responder::answer(shared, conn, id, WireReply::Error(text)),
            }
            true
        }
        Control::Reply { id, reply } => {
            let waiting = lock(&shared.pending).get(&id).map(|w| (w.kind, w.peer));
            let Some((kind, peer)) = waiting else {
                // Nobody waits any more (deadline, cancel): what it lent goes straight back.
                if let WireReply::Tensor(body) = &reply {
                    for lease in body.leases() {
                        shared.releases.push(Arc::downgrade(conn), lease);
                    }
                }
                return true;
            };
            let outcome = match reply {
                WireReply::Ack if kind == RequestKind::Tell => Ok(Answer::Ack),
                WireReply::Ack => Err(Error::UnexpectedReply {
                    peer,
                    request: "ask",
                    reply: "Ack",
                }),
                WireReply::Single { msg_type, data } => {
                    Ok(Answer::Reply(Reply::Single { msg_type, data }))
                }
                WireReply::Error(text) => Err(Error::Remote {
                    peer: Some(peer),
                    text,
                }),
                WireReply::Tensor(body) => unpack(
                    conn,
                    &shared.releases,
                    &shared.lending,
                    &body,
                    &shared.limits,
                )
                .map(|m| Answer::Reply(Reply::Tensor(m)))
                .map_err(|text| Error::Remote {
                    peer: Some(peer),
                    text: format!("the reply could not be mapped: {text}"),
                }),
            };
            finish(shared, id, outcome);
            true
        }
        Control::Hello(_) => false,
    }
}
