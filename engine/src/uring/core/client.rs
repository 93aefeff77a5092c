//! Outgoing connections: the per-peer pool, connecting, and driving each one's client session
//! with the request it carries.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use tensorwire_proto::session::{Checkin, Checkout, ClientEvent, ClientSession, WaiterId};
use tensorwire_proto::transport::Error;

use super::{Backlog, Core};
use crate::sys;
use crate::tcp_options;
use crate::uring::commands::{Event, Outgoing};
use crate::uring::conn::{Client, Conn, ConnKey, InFlight, Role};
use crate::uring::op::{Connect, Op, Owner};

impl Core {
    /// A new request: on an idle pooled connection, a new one, or in the queue for its peer.
    pub(super) fn start_outgoing(&mut self, outgoing: Outgoing) {
        if outgoing.completion.is_cancelled() {
            return outgoing.completion.complete(Err(Error::Cancelled));
        }
        if self.stopping {
            return outgoing.completion.complete(Err(self.stop_error()));
        }
        let (deadline, bytes) = (
            outgoing.request.deadline().at(),
            outgoing.request.pool_bytes(),
        );
        let depth = outgoing.request.pipeline();
        match self
            .pool
            .checkout_pipelined(outgoing.peer, outgoing, bytes, deadline, depth)
        {
            Checkout::Reuse(key, outgoing) | Checkout::Pipeline(key, outgoing) => {
                self.begin(key, outgoing);
            }
            Checkout::Connect(outgoing) => self.connect(outgoing),
            Checkout::Full(outgoing) => outgoing.completion.complete(Err(self.pool.full_error())),
            Checkout::Queued(id) => {
                // Its deadline runs in the pool; a caller that gives up takes it out at once.
                if let Some(waiting) = self.pool.waiter(id) {
                    let core = self.handle.clone();
                    waiting.completion.on_cancel(Box::new(move || {
                        core.post(Event::CancelWaiting { id });
                    }));
                }
            }
        }
    }

    /// Opens a connection for `outgoing` (already counted as open by the pool).
    pub(super) fn connect(&mut self, outgoing: Outgoing) {
        let (peer, bytes) = (outgoing.peer, outgoing.request.pool_bytes());
        if outgoing.completion.is_cancelled() || self.stopping {
            let error = if self.stopping {
                self.stop_error()
            } else {
                Error::Cancelled
            };
            outgoing.completion.complete(Err(error));
            if let Some(next) = self.pool.not_opened(peer) {
                self.backlog.push_back(Backlog {
                    conn: None,
                    outgoing: next,
                });
            }
            return;
        }
        let socket = sys::tcp_socket(&peer);
        let fd = match socket {
            Ok(fd) => Arc::new(fd),
            Err(source) => {
                outgoing
                    .completion
                    .complete(Err(Error::Connect { peer, source }));
                // Nothing was opened: a waiting request may try in its place.
                if let Some(next) = self.pool.not_opened(peer) {
                    self.backlog.push_back(Backlog {
                        conn: None,
                        outgoing: next,
                    });
                }
                return;
            }
        };
        tcp_options::tune_connecting(fd.as_raw_fd(), peer, &self.ctx.session);
        let session = ClientSession::connecting(
            Arc::clone(&self.ctx.session),
            Arc::clone(&self.ctx.memory),
            peer,
            self.now,
        );
        let client = Client {
            session,
            peer,
            connecting: None,
            carrying: std::collections::VecDeque::new(),
            pooled: false,
        };
        let zero_copy = self.ctx.zero_copy.allowed(Some(peer));
        let key = self
            .conns
            .insert(Conn::new(Arc::clone(&fd), Role::Client(client), zero_copy));
        self.pool.opened(peer, key, bytes);
        match self.submit(Owner::Conn(key), Op::Connect(Connect::new(fd, peer))) {
            Some(op) => {
                if let Some(client) = self.conns.client_mut(key) {
                    client.connecting = Some(op);
                }
                self.begin(key, outgoing);
            }
            None => {
                outgoing.completion.complete(Err(Error::io(
                    "submitting a connect",
                    std::io::Error::other("the ring refused the operation"),
                )));
                self.close(key);
            }
        }
    }

    /// Starts `outgoing` on connection `key` (idle, still connecting, or carrying requests
    /// its peer lets it pipeline).
    pub(super) fn begin(&mut self, key: ConnKey, outgoing: Outgoing) {
        let now = self.now;
        let Some(client) = self.conns.client_mut(key) else {
            // It closed after the pool handed it this request (a waiter pipelined onto it as
            // another was answered, just before it failed): the request never left; it goes
            // another way.
            return self.start_outgoing(outgoing);
        };
        client.pooled = false;
        if outgoing.completion.is_cancelled() {
            outgoing.completion.complete(Err(Error::Cancelled));
            return self.answered(key);
        }
        let id = self.next_request;
        self.next_request += 1;
        let Outgoing {
            request,
            completion,
            ..
        } = outgoing;
        let token = match client.session.start(request, now) {
            Ok(token) => token,
            Err(request) => {
                // The pool only offers connections that can take a request; should one not
                // (its writing failed while others were on their way), it is offered no more
                // — it closes once they are answered — and the request is not lost: it goes
                // back through the pool.
                let peer = client.peer;
                if client.carrying.is_empty() {
                    self.close(key);
                } else {
                    self.pool.retire(peer, key);
                }
                return self.start_outgoing(Outgoing {
                    peer,
                    request,
                    completion,
                });
            }
        };
        let core = self.handle.clone();
        completion.on_cancel(Box::new(move || {
            core.post(Event::Cancel {
                conn: key,
                request: id,
            });
        }));
        client.carrying.push_back(InFlight {
            id,
            token,
            completion,
        });
        self.pump(key);
    }

    pub(super) fn on_connected(&mut self, key: ConnKey, res: i32) {
        let Some(client) = self.conns.client_mut(key) else {
            return;
        };
        client.connecting = None;
        if res < 0 {
            client
                .session
                .handle_connect_error(std::io::Error::from_raw_os_error(-res));
        } else {
            client.session.handle_connected();
            if let Some(conn) = self.conns.get_mut(key) {
                tcp_options::connected(conn.fd.as_raw_fd(), &self.ctx.session);
            }
        }
        self.pump(key);
    }

    /// Handles what the client session asks for; a connection that finished its requests and
    /// is still in step goes back to the pool (or to the next waiting request). Requests it
    /// hands back unwritten go through the pool again once it is closed.
    pub(super) fn client_events(&mut self, key: ConnKey) {
        let mut unsent = Vec::new();
        let closed = self.take_client_events(key, &mut unsent);
        for outgoing in unsent {
            self.start_outgoing(outgoing);
        }
        if closed {
            return;
        }
        let Some(client) = self.conns.client_mut(key) else {
            return;
        };
        if client.carrying.is_empty() && !client.pooled && client.session.is_reusable() {
            self.release(key);
        }
    }

    /// Delivers the session's outcomes and closes the connection if it asks; returns whether
    /// it is gone.
    fn take_client_events(&mut self, key: ConnKey, unsent: &mut Vec<Outgoing>) -> bool {
        loop {
            let Some(client) = self.conns.client_mut(key) else {
                return true;
            };
            match client.session.poll_event() {
                Some(ClientEvent::Done { token, outcome }) => {
                    if let Some(carried) = client.take(token) {
                        carried.completion.complete(outcome);
                        self.answered(key);
                    }
                }
                Some(ClientEvent::Unsent { token, request }) => {
                    // Nothing of it reached the peer: it goes another way, not to this
                    // connection (offered no more from here on).
                    let peer = client.peer;
                    if let Some(carried) = client.take(token) {
                        unsent.push(Outgoing {
                            peer,
                            request,
                            completion: carried.completion,
                        });
                    }
                    self.pool.retire(peer, key);
                }
                Some(ClientEvent::Close(reason)) => {
                    tracing::debug!(%reason, peer = %client.peer, "closing a client connection");
                    self.close(key);
                    return true;
                }
                Some(_) => {}
                None => return false,
            }
        }
    }

    /// A request handed to `key` has its outcome (or was never started): with others still
    /// on their way, the first request waiting for its peer may be pipelined behind them; with
    /// none, the connection goes back to the pool.
    fn answered(&mut self, key: ConnKey) {
        let Some(client) = self.conns.client_mut(key) else {
            return;
        };
        let peer = client.peer;
        if client.session.is_closed() {
            // Its Close follows: nothing is handed to it any more (the requests waiting keep
            // their places in the queue).
            return self.pool.retire(peer, key);
        }
        if let Some(next) = self.pool.answered(peer, key) {
            self.backlog.push_back(Backlog {
                conn: Some(key),
                outgoing: next,
            });
        }
        self.release(key);
    }

    /// A connection that finished its request and is in step goes back to the pool, or to the
    /// next request waiting for its peer (started from the backlog, not from here).
    fn release(&mut self, key: ConnKey) {
        let Some(client) = self.conns.client_mut(key) else {
            return;
        };
        if !client.carrying.is_empty() || client.pooled || !client.session.is_reusable() {
            return;
        }
        let peer = client.peer;
        match self.pool.checkin(peer, key, self.now) {
            Checkin::Serve(key, next) => self.backlog.push_back(Backlog {
                conn: Some(key),
                outgoing: next,
            }),
            Checkin::Idle => client.pooled = true,
            // A request handed to it waits in the backlog.
            Checkin::Carrying => {}
        }
    }

    /// A request waiting for a connection was given up by its caller.
    pub(super) fn on_cancel_waiting(&mut self, id: WaiterId) {
        if let Some(outgoing) = self.pool.cancel(id) {
            outgoing.completion.complete(Err(Error::Cancelled));
        }
    }

    /// The caller of request `request` on connection `key` gave up.
    pub(super) fn on_cancel(&mut self, key: ConnKey, request: u64) {
        let Some(client) = self.conns.client_mut(key) else {
            return;
        };
        if let Some(token) = client
            .carrying
            .iter()
            .find(|c| c.id == request)
            .map(|c| c.token)
        {
            client.session.cancel(token);
            self.pump(key);
        }
    }

    /// Requests whose deadline passed while they waited for a connection; idle connections
    /// above the cap that stayed idle too long.
    pub(super) fn pool_timeouts(&mut self) {
        if self.pool.poll_timeout().is_none_or(|at| at > self.now) {
            return;
        }
        let expired = self.pool.handle_timeout(self.now);
        for outgoing in expired.requests {
            let request = outgoing.request;
            let what = request.kind().as_str();
            outgoing
                .completion
                .complete(Err(request.deadline().error(what)));
        }
        for key in expired.trimmed {
            self.close(key);
        }
    }
}
