//! Moving a connection's bytes: arming its receive and send operations as its session asks,
//! applying their completions, its deadlines, and closing it.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use io_uring::cqueue;
use tensorwire_proto::session::{RateMeter, ReadBuf};
use tensorwire_proto::transport::Error;

use super::Core;
use crate::uring::ZeroCopy;
use crate::uring::conn::{ConnKey, Role};
use crate::uring::op::{Cancel, Notification, Op, OpKey, Owner};
use crate::{stats, sys};

impl Core {
    /// Lets the connection's session act: its events, then the reads and writes it wants,
    /// then its deadline.
    pub(super) fn pump(&mut self, key: ConnKey) {
        let server = match self.conns.get_mut(key) {
            Some(conn) => matches!(conn.role, Role::Server(_)),
            None => return,
        };
        if server {
            self.server_events(key);
        } else {
            self.client_events(key);
        }
        self.take_self_posted();
        if self.conns.get_mut(key).is_none() {
            return;
        }
        self.arm_send(key);
        self.arm_recv(key);
        self.update_timer(key);
    }

    pub(super) fn update_timer(&mut self, key: ConnKey) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let next = conn.session().poll_timeout();
        let old = std::mem::replace(&mut conn.timer, next);
        self.timers.update(key, old, next);
    }

    pub(super) fn on_timeout(&mut self, key: ConnKey) {
        let now = self.now;
        if let Some(conn) = self.conns.get_mut(key) {
            conn.session().handle_timeout(now);
        }
        self.pump(key);
    }

    fn arm_recv(&mut self, key: ConnKey) {
        let poll_first = self.ring.recv_poll_first;
        let Some(recv) = self
            .conns
            .get_mut(key)
            .and_then(|conn| conn.next_recv(poll_first))
        else {
            return;
        };
        match self.submit(Owner::Conn(key), Op::Recv(recv)) {
            Some(op) => {
                if let Some(conn) = self.conns.get_mut(key) {
                    conn.recv_op = Some(op);
                }
            }
            None => self.close(key),
        }
    }

    fn arm_send(&mut self, key: ConnKey) {
        let now = self.now;
        let zero_copy_min = self.ring.send_zc.then_some(self.ctx.zero_copy_min);
        let Some(send) = self
            .conns
            .get_mut(key)
            .and_then(|conn| conn.next_send(now, zero_copy_min))
        else {
            return;
        };
        let op = Op::Send(send);
        match self.submit(Owner::Conn(key), op) {
            Some(op) => {
                if let Some(conn) = self.conns.get_mut(key) {
                    conn.send_op = Some(op);
                }
            }
            None => self.close(key),
        }
    }

    pub(super) fn on_received(&mut self, key: ConnKey, buf: ReadBuf, res: i32) {
        let now = self.now;
        if res > 0 {
            self.note_io(key, now);
        }
        let Some(conn) = self.conns.get_mut(key) else {
            return; // closed meanwhile: the memory goes back here
        };
        conn.recv_op = None;
        let result = usize::try_from(res).map_err(|_| io::Error::from_raw_os_error(-res));
        conn.session().handle_read(buf, result, now);
        self.pump(key);
    }

    pub(super) fn on_sent(&mut self, op: OpKey, key: ConnKey, res: i32, flags: u32) {
        let now = self.now;
        let auto = self.ctx.zero_copy == ZeroCopy::Auto;
        if res > 0 && !cqueue::notif(flags) {
            self.note_io(key, now);
        }
        let Some(Op::Send(send)) = self.ops.get_mut(op).map(|entry| &mut entry.op) else {
            return;
        };
        if cqueue::notif(flags) {
            // The kernel is done with the pages of an earlier submission.
            send.notifications = send.notifications.saturating_sub(1);
            let done = send.is_done();
            let notification = Notification::from_result(res);
            stats::record_zero_copy_notification(notification.copied);
            if done {
                self.ops.remove(op);
            }
            if let Some(conn) = self.conns.get_mut(key) {
                if notification.copied && auto {
                    conn.zero_copy = false; // the kernel copies anyway: plain sends are cheaper
                }
            }
            return;
        }
        if cqueue::more(flags) {
            send.notifications += 1; // a notification follows: keep the memory for it
        }
        let outcome = match usize::try_from(res) {
            Ok(0) => Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => Ok((n, send.advance(n))),
            Err(_) => Err(io::Error::from_raw_os_error(-res)),
        };
        let more_to_send = matches!(outcome, Ok((_, false)));
        if !more_to_send {
            self.finish_send(op);
        }
        let Some(conn) = self.conns.get_mut(key) else {
            if more_to_send {
                self.finish_send(op); // nobody will send the rest
            }
            return;
        };
        match outcome {
            Ok((n, true)) => {
                conn.send_op = None;
                conn.session().handle_written(n, now);
            }
            Ok((n, false)) => {
                conn.session().handle_written(n, now);
                if !self.resubmit(op) {
                    self.finish_send(op);
                    return self.close(key);
                }
            }
            Err(error) => {
                conn.send_op = None;
                conn.session().handle_write_error(error, now);
            }
        }
        self.pump(key);
    }

    /// A send submits nothing more: it leaves the slab now, or with its last zero-copy
    /// notification if the kernel still holds its pages.
    fn finish_send(&mut self, op: OpKey) {
        if let Some(Op::Send(send)) = self.ops.get_mut(op).map(|entry| &mut entry.op) {
            send.finished = true;
            if send.is_done() {
                self.ops.remove(op);
            }
        }
    }

    /// Closes a connection now: its operations are cancelled and keep their memory (and the
    /// socket) until their last completion.
    pub(super) fn close(&mut self, key: ConnKey) {
        let Some(conn) = self.conns.remove(key) else {
            return;
        };
        self.timers.update(key, conn.timer, None);
        if conn.in_kernel() {
            let _ = sys::shutdown(conn.fd.as_raw_fd(), libc::SHUT_RDWR);
            self.submit(Owner::Core, Op::Cancel(Cancel::Fd(Arc::clone(&conn.fd))));
        }
        if conn.used_zero_copy {
            // A zero-copy send still waiting for the peer to take its pages holds the socket.
            let session = &self.ctx.session;
            let meter = RateMeter::new(session.min_rate, session.rate_window);
            self.lingering.closed(&conn.fd, self.now, meter);
        }
        match conn.role {
            Role::Server(server) => {
                if let Some((_, withdraw)) = server.waiting {
                    let _ = withdraw.withdraw();
                }
            }
            Role::Client(client) => {
                let peer = client.peer;
                for carried in client.carrying {
                    carried
                        .completion
                        .complete(Err(Error::ConnectionClosed { peer, detail: None }));
                }
                if let Some(next) = self.pool.closed(client.peer, key) {
                    self.backlog.push_back(super::Backlog {
                        conn: None,
                        outgoing: next,
                    });
                }
            }
        }
    }

    /// Closes every connection; requests being carried fail with `error()`.
    pub(super) fn close_all(&mut self, error: impl Fn() -> Error) {
        for key in self.conns.keys() {
            if let Some(conn) = self.conns.get_mut(key) {
                if let Role::Client(client) = &mut conn.role {
                    for carried in client.carrying.drain(..) {
                        carried.completion.complete(Err(error()));
                    }
                }
            }
            self.close(key);
        }
    }
}
