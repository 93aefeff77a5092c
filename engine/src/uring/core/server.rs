//! Accepted connections: driving each one's server session, delivering its requests to the
//! node and its answers back.

use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use tensorwire_proto::session::{ServerEvent, ServerSession};
use tensorwire_proto::transport::{Delivery, Reply, Responder};

use super::Core;
use crate::sys;
use crate::tcp_options;
use crate::uring::commands::{CoreHandle, Event};
use crate::uring::conn::{Conn, ConnKey, Role, Server};
use crate::uring::next_live;

impl Core {
    /// A completion of the accept: a new connection (or an error, retried elsewhere), placed
    /// on the next live core in turn. The kernel hands a burst of connections to whichever
    /// core's accept it wakes first, mostly the same one, which would leave the other cores
    /// idle while that one serves them all. A core that stops (it failed, or the driver stops)
    /// still hands a connection its accept took on to a live core, which serves it unless it
    /// stops too; a driver closing gracefully accepts nothing new.
    pub(super) fn on_accept(&mut self, res: i32) {
        if res < 0 {
            return; // e.g. ECONNABORTED: the next connection is accepted as usual
        }
        // SAFETY: a successful accept returns a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(res) };
        if self.draining {
            return;
        }
        let ctx = Arc::clone(&self.ctx);
        let target = ctx
            .cores
            .get()
            .and_then(|cores| next_live(cores, &ctx.next_accepted))
            .filter(|core| !core.is_current());
        let Some(core) = target else {
            return self.adopt(fd);
        };
        match core.offer(Event::Adopt(fd)) {
            Ok(()) => {}
            // That core stopped since it was picked: this one serves the connection.
            Err(Event::Adopt(fd)) => self.adopt(fd),
            Err(_) => {} // not reached: offer gives back the event it was given
        }
    }

    /// Starts serving an accepted connection on this core.
    pub(super) fn adopt(&mut self, fd: OwnedFd) {
        if self.stopping || self.draining {
            return;
        }
        tcp_options::tune_accepted(fd.as_raw_fd(), &self.ctx.session);
        let peer = sys::peer_addr(fd.as_raw_fd()).ok();
        let zero_copy = self.ctx.zero_copy.allowed(peer);
        let session = ServerSession::new(
            Arc::clone(&self.ctx.session),
            Arc::clone(&self.ctx.memory),
            self.ctx.require_tls,
            self.now,
        )
        .with_stripes(self.ctx.stripes.clone(), peer);
        let server = Server {
            session,
            peer,
            waiting: None,
        };
        let key = self
            .conns
            .insert(Conn::new(Arc::new(fd), Role::Server(server), zero_copy));
        self.pump(key);
    }

    /// Handles what the server session asks for until it asks for nothing more.
    pub(super) fn server_events(&mut self, key: ConnKey) {
        let outer = self.serving_events.replace(key);
        self.each_server_event(key);
        self.serving_events = outer;
    }

    fn each_server_event(&mut self, key: ConnKey) {
        let ctx = Arc::clone(&self.ctx);
        loop {
            let now = self.now;
            let Some(Conn {
                role: Role::Server(server),
                fd,
                ..
            }) = self.conns.get_mut(key)
            else {
                return;
            };
            let Some(event) = server.session.poll_event() else {
                return;
            };
            match event {
                ServerEvent::Admit { kind, path } => {
                    let admitted = ctx.inbound.admit(kind, &path);
                    server.session.admit(admitted, now);
                }
                ServerEvent::Request { seq, mut request } => {
                    request.peer = server.peer;
                    let responder = Box::new(CoreResponder {
                        core: self.handle.clone(),
                        conn: key,
                        seq,
                    });
                    let delivery = ctx.inbound.deliver(request, responder);
                    // The delivery may have run a handler that answered already (on this core).
                    let Some(server) = self.conns.server_mut(key) else {
                        return;
                    };
                    match delivery {
                        Delivery::Enqueued => server.session.handle_enqueued(seq, now),
                        Delivery::Waiting(withdraw) => server.waiting = Some((seq, withdraw)),
                        Delivery::Refused(text) => {
                            server.session.handle_answer(seq, Err(text), now)
                        }
                    }
                    self.take_self_posted();
                }
                ServerEvent::Withdraw { seq } => {
                    // Without a handle the request already got in (its Enqueued is on its way).
                    let withdrawn = server
                        .waiting
                        .take_if(|(s, _)| *s == seq)
                        .is_some_and(|(_, withdraw)| withdraw.withdraw());
                    server.session.handle_withdrawn(seq, withdrawn, now);
                }
                ServerEvent::ShutdownWrite => {
                    let _ = sys::shutdown(fd.as_raw_fd(), libc::SHUT_WR);
                }
                ServerEvent::Close(reason) => {
                    tracing::debug!(%reason, peer = ?server.peer, "closing a server connection");
                    return self.close(key);
                }
                ServerEvent::HandOff { preface } => return self.hand_off(key, preface),
                _ => {}
            }
        }
    }

    /// A request that waited for mailbox space got in.
    pub(super) fn on_enqueued(&mut self, key: ConnKey, seq: u64) {
        let now = self.now;
        if let Some(server) = self.conns.server_mut(key) {
            if server.waiting.as_ref().is_some_and(|(s, _)| *s == seq) {
                server.waiting = None;
            }
            server.session.handle_enqueued(seq, now);
            if self.serving_events != Some(key) {
                self.pump(key);
            }
        }
    }

    /// The answer to a served request (a late one to an earlier request is ignored by the
    /// session; one for a connection that is gone is dropped).
    pub(super) fn on_answer(&mut self, key: ConnKey, seq: u64, answer: Result<Reply, String>) {
        let now = self.now;
        if let Some(server) = self.conns.server_mut(key) {
            server.session.handle_answer(seq, answer, now);
            // Answered at once by a handler its event loop ran: that loop goes on.
            if self.serving_events != Some(key) {
                self.pump(key);
            }
        }
    }

    /// Gives a connection whose first bytes are not PTR1 to the hand-off, with those bytes.
    fn hand_off(&mut self, key: ConnKey, preface: Vec<u8>) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let busy = conn.in_kernel();
        let handoff = self.ctx.handoff.clone();
        let (Some(handoff), false) = (handoff, busy) else {
            return self.close(key);
        };
        let Some(conn) = self.conns.remove(key) else {
            return;
        };
        self.timers.update(key, conn.timer, None);
        match Arc::try_unwrap(conn.fd) {
            Ok(fd) => handoff.hand_off(TcpStream::from(fd), preface),
            Err(_) => tracing::warn!("cannot hand off a connection still in use; closed"),
        }
    }
}

/// Answers one request served by this core, from whichever thread answers it.
struct CoreResponder {
    core: CoreHandle,
    conn: ConnKey,
    seq: u64,
}

impl Responder for CoreResponder {
    fn enqueued(&self) {
        self.core.post(Event::Enqueued {
            conn: self.conn,
            seq: self.seq,
        });
    }

    fn respond(self: Box<Self>, answer: Result<Reply, String>) {
        self.core.post(Event::Answer {
            conn: self.conn,
            seq: self.seq,
            answer,
        });
    }
}
