//! Moving messages: packing a request or reply into shared memory and sending it, the poll
//! thread that receives (hellos, requests, replies, releases) and notices closed peers, and
//! the responder that answers a request over the connection it came on.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tensorwire_proto::TensorMessage;
use tensorwire_proto::shm::{Control, MAX_DATAGRAM, MAX_FDS, WireReply, decode};
use tensorwire_proto::stats;
use tensorwire_proto::transport::{
    Answer, Completion, Delivery, Error, InboundRequest, OutboundRequest, Reply, RequestKind,
    Responder,
};

use crate::shm::transport::conn::{Conn, same_host};
use crate::shm::transport::holding::unpack;
use crate::shm::transport::packing::pack;
use crate::shm::transport::{Shared, complete_waiting, lock};

/// A single reply's data travels inline up to this.
const INLINE_SINGLE: usize = MAX_DATAGRAM - 4096;

/// A request waiting for its answer.
pub(crate) struct Waiting {
    pub(crate) conn: u64,
    peer: std::net::SocketAddr,
    pub(crate) kind: RequestKind,
    pub(crate) completion: Box<dyn Completion>,
    timer: u64,
}

/// Sends `request` on `conn`.
pub(crate) fn send(shared: &Arc<Shared>, conn: &Arc<Conn>, request: OutboundRequest) {
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
    let id = next_id();
    let packed = match pack(shared, conn, &message) {
        Ok(packed) => packed,
        Err(e) => return completion.complete(Err(e)),
    };
    // Registered before the send, so a fast reply finds it.
    let timer = deadline.at().map_or(0, |at| {
        let shared = Arc::downgrade(shared);
        crate::pending::schedule_timer(
            at,
            Box::new(move || {
                if let Some(shared) = shared.upgrade() {
                    complete_waiting(&shared, id, Err(deadline.error(kind.as_str())));
                }
            }),
        )
    });
    {
        let shared = Arc::downgrade(shared);
        completion.on_cancel(Box::new(move || {
            if let Some(shared) = shared.upgrade() {
                complete_waiting(&shared, id, Err(Error::Cancelled));
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
            timer,
        },
    );
    let control = Control::Request {
        id,
        kind,
        path: path.as_str().to_owned(),
        body: packed.body,
    };
    if let Err(e) = conn.send(&control, &packed.fds) {
        for lease in packed.leases {
            shared.lending.release(conn.id, lease);
        }
        complete_waiting(
            shared,
            id,
            Err(Error::ConnectionClosed {
                peer,
                detail: Some(e),
            }),
        );
        return;
    }
    stats::global().record_shm_sent(message.total_bytes(), packed.copied, packed.zero_copy);
}

fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The poll thread: accepts, receives, sends batched releases, revokes overdue leases.
pub(crate) fn run(shared: &Arc<Shared>, listener: &OwnedFd) {
    let mut conns: HashMap<u64, (Arc<Conn>, bool)> = HashMap::new();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    while !shared.stop.load(Ordering::Acquire) {
        for (conn, verified) in std::mem::take(&mut *lock(&shared.joining)) {
            conns.insert(conn.id, (conn, verified));
        }
        let mut fds: Vec<libc::pollfd> = vec![
            pollfd(shared.wake.as_raw_fd()),
            pollfd(listener.as_raw_fd()),
        ];
        let ids: Vec<u64> = conns.keys().copied().collect();
        fds.extend(ids.iter().map(|id| pollfd(conns[id].0.raw())));
        let (_, next) = shared.lending.revoke_expired(Instant::now());
        let timeout = next.map_or(1000, |at| {
            i32::try_from(
                at.saturating_duration_since(Instant::now())
                    .as_millis()
                    .clamp(1, 1000),
            )
            .unwrap_or(1000)
        });
        let nfds = libc::nfds_t::try_from(fds.len()).unwrap_or(0);
        // SAFETY: `fds` is a live array of `nfds` pollfd entries for the duration of the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), nfds, timeout) };
        if ready < 0 {
            continue; // EINTR
        }
        if fds[0].revents != 0 {
            drain_eventfd(shared.wake.as_raw_fd());
        }
        for (conn, leases) in shared.releases.take() {
            for chunk in leases.chunks((MAX_DATAGRAM - 64) / 8) {
                let _ = conn.send(
                    &Control::Release {
                        leases: chunk.to_vec(),
                    },
                    &[],
                );
            }
        }
        if fds[1].revents != 0 {
            while let Ok(Some(fd)) = crate::shm::os::accept(listener.as_raw_fd()) {
                if crate::shm::os::peer_uid(fd.as_raw_fd()).ok() == Some(shared.hello.uid) {
                    let conn = Arc::new(Conn::new(fd));
                    conns.insert(conn.id, (conn, false));
                }
            }
        }
        for (i, id) in ids.iter().enumerate() {
            let revents = fds[i + 2].revents;
            if revents == 0 {
                continue;
            }
            let keep = match conns.get_mut(id) {
                Some((conn, verified)) => receive_all(shared, conn, verified, &mut buf),
                None => true,
            };
            if !keep {
                if let Some((conn, _)) = conns.remove(id) {
                    closed(shared, &conn);
                }
            }
        }
    }
    for (_, (conn, _)) in conns {
        conn.close();
        closed(shared, &conn);
    }
}

fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

fn drain_eventfd(fd: RawFd) {
    let mut value = 0u64;
    // SAFETY: reads 8 bytes into a live local of 8 bytes.
    let _ = unsafe { libc::read(fd, (&raw mut value).cast(), 8) };
}

/// Receives every datagram waiting on `conn`; `false` once it is closed or broken.
fn receive_all(
    shared: &Arc<Shared>,
    conn: &Arc<Conn>,
    verified: &mut bool,
    buf: &mut [u8],
) -> bool {
    loop {
        let received = match crate::shm::os::receive(conn.raw(), buf, MAX_FDS) {
            Ok(Some(received)) => received,
            Ok(None) => return !conn.is_closed(),
            Err(_) => return false,
        };
        if received.len == 0 {
            return false;
        }
        let Ok(control) = decode(&buf[..received.len]) else {
            tracing::debug!("invalid shared-memory datagram: closing the connection");
            return false;
        };
        if !*verified {
            // The first message of an accepted connection must be a hello from this host.
            let Control::Hello(theirs) = control else {
                return false;
            };
            if !same_host(&shared.hello, &theirs)
                || conn
                    .send(&Control::Hello(shared.hello.clone()), &[])
                    .is_err()
            {
                return false;
            }
            *verified = true;
            continue;
        }
        if received.truncated {
            stats::global().record_shm_fd_failure();
        }
        handle(shared, conn, control, received.fds, received.truncated);
    }
}

fn handle(
    shared: &Arc<Shared>,
    conn: &Arc<Conn>,
    control: Control,
    fds: Vec<OwnedFd>,
    truncated: bool,
) {
    match control {
        Control::Request {
            id,
            kind,
            path,
            body,
        } => {
            let refuse = |text: String| {
                for lease in body.leases() {
                    shared.releases_push(conn, lease);
                }
                let _ = conn.send(
                    &Control::Reply {
                        id,
                        reply: WireReply::Error(text),
                    },
                    &[],
                );
            };
            if truncated {
                return refuse("the receiver is at its descriptor limit: the message's memory was not received".into());
            }
            if let Err(text) = shared.inbound.admit(kind, &path) {
                return refuse(text);
            }
            match unpack(conn, &shared.releases, &body, fds, &shared.limits) {
                Ok(message) => deliver(shared, conn, id, kind, path, message),
                Err(text) => {
                    let _ = conn.send(
                        &Control::Reply {
                            id,
                            reply: WireReply::Error(text),
                        },
                        &[],
                    );
                }
            }
        }
        Control::Reply { id, reply } => {
            let kind = lock(&shared.pending).get(&id).map(|w| w.kind);
            let outcome = match reply {
                WireReply::Ack => Ok(Answer::Ack),
                WireReply::Single { msg_type, data } => {
                    Ok(Answer::Reply(Reply::Single { msg_type, data }))
                }
                WireReply::Error(text) => Err(Error::Remote { peer: None, text }),
                WireReply::Tensor(body) => {
                    let message = if truncated {
                        Err(
                            "descriptors were lost: this process is at its descriptor limit"
                                .to_owned(),
                        )
                    } else {
                        unpack(conn, &shared.releases, &body, fds, &shared.limits)
                    };
                    message
                        .map(|m| Answer::Reply(Reply::Tensor(m)))
                        .map_err(|text| Error::Remote {
                            peer: None,
                            text: format!("the reply could not be mapped: {text}"),
                        })
                }
            };
            if kind.is_some() {
                finish(shared, id, outcome);
            }
        }
        Control::Release { leases } => {
            for lease in leases {
                shared.lending.release(conn.id, lease);
            }
        }
        Control::Hello(_) => {}
    }
}

/// Completes request `id` and forgets its deadline.
fn finish(shared: &Shared, id: u64, outcome: Result<Answer, Error>) {
    let waiting = lock(&shared.pending).remove(&id);
    if let Some(waiting) = waiting {
        crate::pending::cancel_timer(waiting.timer);
        waiting.completion.complete(outcome);
    }
}

/// A connection closed: what waited on it fails, what it held goes back.
fn closed(shared: &Shared, conn: &Conn) {
    conn.close();
    shared.lending.release_all(conn.id);
    let ids: Vec<(u64, std::net::SocketAddr)> = lock(&shared.pending)
        .iter()
        .filter(|(_, w)| w.conn == conn.id)
        .map(|(&id, w)| (id, w.peer))
        .collect();
    for (id, peer) in ids {
        let detail = std::io::Error::other("the shared-memory peer closed its connection");
        finish(
            shared,
            id,
            Err(Error::ConnectionClosed {
                peer,
                detail: Some(detail),
            }),
        );
    }
}

fn deliver(
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
    let request = InboundRequest::new(kind, path.clone(), message);
    match shared.inbound.deliver(request, responder) {
        Delivery::Enqueued => {
            if kind == RequestKind::Tell {
                let _ = conn.send(
                    &Control::Reply {
                        id,
                        reply: WireReply::Ack,
                    },
                    &[],
                );
            }
        }
        Delivery::Refused(text) => {
            let _ = conn.send(
                &Control::Reply {
                    id,
                    reply: WireReply::Error(text),
                },
                &[],
            );
        }
        Delivery::Waiting(withdraw) => {
            // The mailbox is full: the answer (an Ack, for a tell) waits; at the enqueue
            // deadline the request is withdrawn and refused, unless it got in meanwhile.
            let timeout = shared.session.enqueue_timeout;
            let conn = Arc::clone(conn);
            let at = Instant::now()
                .checked_add(timeout)
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
            crate::pending::schedule_timer(
                at,
                Box::new(move || {
                    if withdraw.withdraw() {
                        let text = format!(
                            "the mailbox of {path} stayed full for {timeout:?}; the {} was not delivered",
                            kind.as_str()
                        );
                        let _ = conn.send(
                            &Control::Reply {
                                id,
                                reply: WireReply::Error(text),
                            },
                            &[],
                        );
                    }
                }),
            );
        }
    }
}

/// Answers one request over the connection it came on.
struct ShmResponder {
    shared: Arc<Shared>,
    conn: Arc<Conn>,
    id: u64,
    kind: RequestKind,
}

impl Responder for ShmResponder {
    fn enqueued(&self) {
        if self.kind == RequestKind::Tell {
            let _ = self.conn.send(
                &Control::Reply {
                    id: self.id,
                    reply: WireReply::Ack,
                },
                &[],
            );
        }
    }

    fn respond(self: Box<Self>, answer: Result<Reply, String>) {
        if self.kind == RequestKind::Tell {
            return; // acknowledged at enqueue
        }
        let (reply, fds, leases) = match answer {
            Err(text) => (WireReply::Error(text), Vec::new(), Vec::new()),
            Ok(Reply::Single { data, .. }) if data.len() > INLINE_SINGLE => (
                WireReply::Error(format!(
                    "a single reply of {} bytes is larger than shared memory carries inline ({INLINE_SINGLE})",
                    data.len()
                )),
                Vec::new(),
                Vec::new(),
            ),
            Ok(Reply::Single { msg_type, data }) => {
                (WireReply::Single { msg_type, data }, Vec::new(), Vec::new())
            }
            Ok(Reply::Tensor(message)) => match pack(&self.shared, &self.conn, &message) {
                Ok(packed) => {
                    stats::global().record_shm_sent(
                        message.total_bytes(),
                        packed.copied,
                        packed.zero_copy,
                    );
                    (WireReply::Tensor(packed.body), packed.fds, packed.leases)
                }
                Err(e) => (
                    WireReply::Error(format!("cannot send the reply: {e}")),
                    Vec::new(),
                    Vec::new(),
                ),
            },
        };
        if self
            .conn
            .send(&Control::Reply { id: self.id, reply }, &fds)
            .is_err()
        {
            for lease in leases {
                self.shared.lending.release(self.conn.id, lease);
            }
        }
    }
}

impl Shared {
    /// Gives a lease of the peer's back (a request refused before it was mapped).
    fn releases_push(&self, conn: &Arc<Conn>, lease: u64) {
        let _ = conn.send(
            &Control::Release {
                leases: vec![lease],
            },
            &[],
        );
    }
}
