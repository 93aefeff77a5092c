//! Outgoing connections on tokio: the shared per-peer pool, and one task per connection that
//! drives its client session with the requests the pool gives it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tensorwire_proto::session::{Checkin, Checkout, ClientEvent, ClientSession, RequestToken};
use tensorwire_proto::transport::{Completion, Error};
use tokio::sync::mpsc;

use crate::ptr1::io::{self, Ready};
use crate::ptr1::{Command, Outgoing, Shared, lock, stopped};
use crate::socket_options;

/// Starts a request: on an idle pooled connection, a new one, or in its peer's queue.
pub(crate) fn start(shared: &Arc<Shared>, outgoing: Outgoing) {
    if outgoing.completion.is_cancelled() {
        return outgoing.completion.complete(Err(Error::Cancelled));
    }
    if shared.is_shut_down() {
        // (A request handed back by a connection that failed as the driver stopped: the pool
        // is drained and served no more.)
        return outgoing.completion.complete(Err(Error::Shutdown));
    }
    let peer = outgoing.peer;
    let (deadline, bytes) = (
        outgoing.request.deadline().at(),
        outgoing.request.pool_bytes(),
    );
    let depth = outgoing.request.pipeline();
    let checkout = lock(&shared.pool).checkout_pipelined(peer, outgoing, bytes, deadline, depth);
    match checkout {
        Checkout::Reuse(id, outgoing) | Checkout::Pipeline(id, outgoing) => {
            let sender = lock(&shared.conns).get(&id).cloned();
            let sent = match sender {
                Some(sender) => sender.send(Command::Carry(outgoing)),
                None => Err(mpsc::error::SendError(Command::Carry(outgoing))),
            };
            if let Err(mpsc::error::SendError(Command::Carry(outgoing))) = sent {
                // The connection's task is ending: it tells the pool itself (`closed`), and
                // the pool no longer offers it, so trying again finds another way.
                start(shared, outgoing);
            }
        }
        Checkout::Connect(outgoing) => connect(shared, outgoing),
        Checkout::Full(outgoing) => {
            let error = lock(&shared.pool).full_error();
            outgoing.completion.complete(Err(error));
        }
        Checkout::Queued(id) => {
            // Its deadline runs in the pool (the janitor); a caller that gives up takes it out
            // at once. The hook may run right here, so it must not take the pool's lock itself.
            if let Some(waiting) = lock(&shared.pool).waiter(id) {
                let weak = Arc::downgrade(shared);
                let handle = shared.handle.clone();
                waiting.completion.on_cancel(Box::new(move || {
                    handle.spawn(async move {
                        let Some(shared) = weak.upgrade() else { return };
                        let cancelled = lock(&shared.pool).cancel(id);
                        if let Some(outgoing) = cancelled {
                            outgoing.completion.complete(Err(Error::Cancelled));
                        }
                    });
                }));
            }
            shared.pool_changed.notify_one();
        }
    }
}

/// Opens a connection for `outgoing` (already counted as open by the pool).
fn connect(shared: &Arc<Shared>, outgoing: Outgoing) {
    if shared.is_shut_down() {
        return outgoing.completion.complete(Err(Error::Shutdown));
    }
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let (sender, commands) = mpsc::unbounded_channel();
    lock(&shared.conns).insert(id, sender.clone());
    let bytes = outgoing.request.pool_bytes();
    lock(&shared.pool).opened(outgoing.peer, id, bytes);
    Shared::spawn(
        shared,
        connection(Arc::clone(shared), id, outgoing, sender, commands),
    );
}

/// A request a connection carries.
struct Current {
    /// Distinguishes it among the connection's requests (for cancellation).
    id: u64,
    /// The request in its session.
    token: RequestToken,
    completion: Box<dyn Completion>,
}

async fn connection(
    shared: Arc<Shared>,
    id: u64,
    first: Outgoing,
    sender: mpsc::UnboundedSender<Command>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    shared.connections.fetch_add(1, Ordering::Relaxed);
    let peer = first.peer;
    let mut session = ClientSession::connecting(
        Arc::clone(&shared.session),
        Arc::clone(&shared.memory),
        peer,
        Instant::now(),
    );
    let mut next_request = 0u64;
    // The requests carried, in the order they were started.
    let mut carrying: VecDeque<Current> = VecDeque::new();
    // Requests the session handed back unwritten: they go through the pool again once this
    // connection is closed.
    let mut unsent: Vec<Outgoing> = Vec::new();
    let mut conn = Conn {
        shared: &shared,
        id,
        sender: &sender,
    };
    conn.begin(&mut session, first, &mut carrying, &mut next_request);
    let mut shutdown = shared.shutdown.subscribe();
    let connecting = socket_options::connect(peer, &shared.session);
    tokio::pin!(connecting);
    let stream = loop {
        tokio::select! {
            connected = &mut connecting => break match connected {
                Ok(stream) => {
                    socket_options::tune(&stream, &shared.session);
                    session.handle_connected();
                    Some(stream)
                }
                Err(e) => {
                    session.handle_connect_error(e);
                    None
                }
            },
            () = io::sleep_until(session.poll_timeout()) => {
                // A request's deadline (or the connect's) passed: its caller hears now; the
                // others pipelined onto this connection wait on for it.
                session.handle_timeout(Instant::now());
                if settle_while_connecting(&mut session, &mut carrying, &mut unsent, &shared, id) {
                    break None;
                }
            }
            () = stopped(&mut shutdown) => {
                session.shut_down();
                break None;
            }
        }
    };
    let mut read = None;
    let mut transmit = None;
    let mut pooled = false;
    // The outcomes taken from the session in one turn (kept for the task's life: no list per
    // reply).
    let mut finished = Vec::new();
    'connection: loop {
        let mut close = false;
        while let Some(event) = session.poll_event() {
            match event {
                ClientEvent::Done { token, outcome } => {
                    if let Some(index) = carrying.iter().position(|c| c.token == token) {
                        finished.extend(carrying.remove(index).map(|done| (done, outcome)));
                    }
                }
                ClientEvent::Unsent { token, request } => {
                    unsent.extend(hand_back(&mut carrying, token, request, peer));
                }
                ClientEvent::Close(reason) => {
                    tracing::debug!(%reason, %peer, "closing a client connection");
                    close = true;
                }
                _ => {}
            }
        }
        if close || stream.is_none() {
            // Ending (or never connected): offered no more, so nothing is pipelined onto it
            // from here on.
            lock(&shared.pool).retire(peer, id);
        }
        // A request started below may have its outcome at once (its deadline had passed):
        // the events are looked at again before waiting.
        let mut started = false;
        for _ in 0..finished.len() {
            // The pool hears of every outcome; with others still on their way, a request
            // waiting for the peer may be pipelined behind them.
            let next = lock(&shared.pool).answered(peer, id);
            if let Some(next) = next {
                conn.begin(&mut session, next, &mut carrying, &mut next_request);
                started = true;
            }
        }
        if !close && carrying.is_empty() && !pooled && session.is_reusable() && stream.is_some() {
            // Back to the pool (or straight to the next request waiting for this peer) before
            // the caller hears of the outcome, so its next request finds it there.
            loop {
                let checkin = lock(&shared.pool).checkin(peer, id, Instant::now());
                match checkin {
                    Checkin::Serve(_, next) if next.completion.is_cancelled() => {
                        next.completion.complete(Err(Error::Cancelled));
                        lock(&shared.pool).answered(peer, id);
                    }
                    Checkin::Serve(_, next) => {
                        conn.begin(&mut session, next, &mut carrying, &mut next_request);
                        started = true;
                        break;
                    }
                    Checkin::Idle => {
                        pooled = true;
                        break;
                    }
                    // A request handed to it is on its way here (`Command::Carry`).
                    Checkin::Carrying => break,
                }
            }
            shared.pool_changed.notify_one();
        }
        for (done, outcome) in finished.drain(..) {
            done.completion.complete(outcome);
        }
        if close {
            break 'connection;
        }
        if started {
            continue 'connection;
        }
        let Some(stream) = &stream else {
            break;
        };
        let now = Instant::now();
        if transmit.is_none() {
            transmit = session.poll_transmit(now);
        }
        if read.is_none() {
            read = session.poll_read();
        }
        let deadline = session.poll_timeout();
        tokio::select! {
            ready = io::step(stream, &mut read, &mut transmit) => match ready {
                Ready::Read(buf, result) => session.handle_read(buf, result, Instant::now()),
                Ready::Wrote(n) => session.handle_written(n, Instant::now()),
                Ready::WriteFailed(e) => session.handle_write_error(e, Instant::now()),
                Ready::Nothing => {}
            },
            command = commands.recv() => match command {
                Some(Command::Carry(outgoing)) => {
                    pooled = false;
                    conn.begin(&mut session, outgoing, &mut carrying, &mut next_request);
                }
                Some(Command::Cancel(request)) => {
                    if let Some(carried) = carrying.iter().find(|c| c.id == request) {
                        session.cancel(carried.token);
                    }
                }
                // Trimmed from the pool: close.
                Some(Command::Close) | None => break,
            },
            () = io::sleep_until(deadline) => session.handle_timeout(Instant::now()),
            () = stopped(&mut shutdown) => session.shut_down(),
        }
    }
    for carried in carrying {
        carried
            .completion
            .complete(Err(Error::ConnectionClosed { peer, detail: None }));
    }
    lock(&shared.conns).remove(&id);
    let next = lock(&shared.pool).closed(peer, id);
    if let Some(next) = next {
        connect(&shared, next);
    }
    for outgoing in unsent {
        start(&shared, outgoing);
    }
    // Requests handed to this connection after it stopped looking go another way; closing
    // first means a later hand-over fails at the sender, which tries again itself.
    commands.close();
    while let Ok(command) = commands.try_recv() {
        if let Command::Carry(outgoing) = command {
            start(&shared, outgoing);
        }
    }
    shared.connections.fetch_sub(1, Ordering::Relaxed);
}

/// The outcomes a session gave while connecting, delivered (a request waiting for the peer
/// that the pool hands this connection instead goes through the pool again; one the session
/// hands back goes to `unsent`); whether it closed.
fn settle_while_connecting(
    session: &mut ClientSession,
    carrying: &mut VecDeque<Current>,
    unsent: &mut Vec<Outgoing>,
    shared: &Arc<Shared>,
    id: u64,
) -> bool {
    let peer = session.peer();
    let mut closed = false;
    while let Some(event) = session.poll_event() {
        match event {
            ClientEvent::Done { token, outcome } => {
                let Some(index) = carrying.iter().position(|c| c.token == token) else {
                    continue;
                };
                let next = lock(&shared.pool).answered(peer, id);
                if let Some(next) = next {
                    start(shared, next);
                }
                if let Some(done) = carrying.remove(index) {
                    done.completion.complete(outcome);
                }
            }
            ClientEvent::Unsent { token, request } => {
                // A session hands nothing back before it connected; were it to, the request
                // would go another way once this connection is closed, like any other.
                lock(&shared.pool).retire(peer, id);
                unsent.extend(hand_back(carrying, token, request, peer));
            }
            ClientEvent::Close(reason) => {
                tracing::debug!(%reason, %peer, "closing a client connection");
                closed = true;
            }
            _ => {}
        }
    }
    closed
}

/// Request `token`, handed back unwritten by the session, taken off the connection to go
/// through the pool again with its caller's completion.
fn hand_back(
    carrying: &mut VecDeque<Current>,
    token: RequestToken,
    request: tensorwire_proto::session::ClientRequest,
    peer: std::net::SocketAddr,
) -> Option<Outgoing> {
    let index = carrying.iter().position(|c| c.token == token)?;
    let carried = carrying.remove(index)?;
    Some(Outgoing {
        peer,
        request,
        completion: carried.completion,
    })
}

/// The connection task's own handles, for starting requests on its session.
struct Conn<'a> {
    shared: &'a Arc<Shared>,
    id: u64,
    sender: &'a mpsc::UnboundedSender<Command>,
}

impl Conn<'_> {
    /// Starts `outgoing` on the session behind what it carries; registers its cancellation
    /// with this task. A session that cannot take it (its writing failed while others were on
    /// their way) is offered no more, and the request goes back through the pool.
    fn begin(
        &mut self,
        session: &mut ClientSession,
        outgoing: Outgoing,
        carrying: &mut VecDeque<Current>,
        next_request: &mut u64,
    ) {
        let Outgoing {
            peer,
            request,
            completion,
        } = outgoing;
        let token = match session.start(request, Instant::now()) {
            Ok(token) => token,
            Err(request) => {
                lock(&self.shared.pool).retire(peer, self.id);
                return start(
                    self.shared,
                    Outgoing {
                        peer,
                        request,
                        completion,
                    },
                );
            }
        };
        let id = *next_request;
        *next_request += 1;
        let sender = self.sender.clone();
        completion.on_cancel(Box::new(move || {
            let _ = sender.send(Command::Cancel(id));
        }));
        carrying.push_back(Current {
            id,
            token,
            completion,
        });
    }
}

/// Fails requests whose deadline passed while they waited for a connection, and closes idle
/// connections above the cap that stayed idle too long.
pub(crate) async fn pool_janitor(shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        let next = lock(&shared.pool).poll_timeout();
        tokio::select! {
            () = io::sleep_until(next) => {
                let expired = lock(&shared.pool).handle_timeout(Instant::now());
                for outgoing in expired.requests {
                    let request = outgoing.request;
                    let error = request.deadline().error(request.kind().as_str());
                    outgoing.completion.complete(Err(error));
                }
                let mut conns = lock(&shared.conns);
                for id in expired.trimmed {
                    if let Some(sender) = conns.remove(&id) {
                        let _ = sender.send(Command::Close);
                    }
                }
            }
            () = shared.pool_changed.notified() => {}
            () = stopped(&mut shutdown) => return,
        }
    }
}
