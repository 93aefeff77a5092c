//! Moving a connection's bytes: arming its receive and send operations as its session asks,
//! applying their completions, its deadlines, and closing it.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use io_uring::cqueue;
use tensorwire_proto::session::ReadBuf;
use tensorwire_proto::transport::Error;

use crate::uring::ZeroCopy;
use crate::uring::conn::{Conn, ConnKey, Role};
use crate::uring::core::Core;
use crate::uring::op::{Cancel, Notification, Op, OpKey, Owner, RecvMode, RecvMsg, SendMsg};
use crate::{stats, sys};

/// Bodies with less than this left are received in one `MSG_WAITALL` step, without a mark.
const LOW_WATER_MIN: u64 = 128 << 10;
/// The largest low-water mark: bounds how much arrives between two wake-ups.
const LOW_WATER_MAX: u64 = 1 << 20;

impl Core {
    /// Lets the connection's session act: its events, then the reads and writes it wants,
    /// then its deadline.
    pub(crate) fn pump(&mut self, key: ConnKey) {
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

    pub(crate) fn update_timer(&mut self, key: ConnKey) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let next = conn.session().poll_timeout();
        let old = std::mem::replace(&mut conn.timer, next);
        self.timers.update(key, old, next);
    }

    pub(crate) fn on_timeout(&mut self, key: ConnKey) {
        let now = self.now;
        if let Some(conn) = self.conns.get_mut(key) {
            conn.session().handle_timeout(now);
        }
        self.pump(key);
    }

    fn arm_recv(&mut self, key: ConnKey) {
        let poll_first = self.ring.recv_poll_first;
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if conn.recv_op.is_some() {
            return;
        }
        let Some(buf) = conn.session().poll_read() else {
            return;
        };
        let (mut mode, mut mark) = recv_mode(&buf, poll_first);
        if mode == RecvMode::LowWater && lossy(conn) {
            (mode, mark) = (RecvMode::Any, 1);
        }
        if mark != conn.low_water && sys::set_receive_low_water(conn.fd.as_raw_fd(), mark).is_ok() {
            conn.low_water = mark;
        }
        let mode = if mode == RecvMode::LowWater && conn.low_water != mark {
            RecvMode::Any // the mark could not be set: take what comes
        } else {
            mode
        };
        let op = Op::Recv(RecvMsg::new(Arc::clone(&conn.fd), buf, mode));
        match self.submit(Owner::Conn(key), op) {
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
        let quantum = self.ctx.session.progress_quantum();
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if conn.send_op.is_some() {
            return;
        }
        let Some(transmit) = conn.session().poll_transmit(now) else {
            return;
        };
        let zero_copy =
            conn.zero_copy && zero_copy_min.is_some_and(|min| transmit.wire_len() >= min);
        let op = Op::Send(SendMsg::new(
            Arc::clone(&conn.fd),
            transmit,
            quantum,
            zero_copy,
        ));
        match self.submit(Owner::Conn(key), op) {
            Some(op) => {
                if let Some(conn) = self.conns.get_mut(key) {
                    conn.send_op = Some(op);
                }
            }
            None => self.close(key),
        }
    }

    pub(crate) fn on_received(&mut self, key: ConnKey, buf: ReadBuf, res: i32) {
        let now = self.now;
        let Some(conn) = self.conns.get_mut(key) else {
            return; // closed meanwhile: the memory goes back here
        };
        conn.recv_op = None;
        let result = usize::try_from(res).map_err(|_| io::Error::from_raw_os_error(-res));
        conn.session().handle_read(buf, result, now);
        self.pump(key);
    }

    pub(crate) fn on_sent(&mut self, op: OpKey, key: ConnKey, res: i32, flags: u32) {
        let now = self.now;
        let auto = self.ctx.zero_copy == ZeroCopy::Auto;
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
    pub(crate) fn close(&mut self, key: ConnKey) {
        let Some(conn) = self.conns.remove(key) else {
            return;
        };
        self.timers.update(key, conn.timer, None);
        let busy = conn.recv_op.is_some()
            || conn.send_op.is_some()
            || matches!(&conn.role, Role::Client(client) if client.connecting.is_some());
        if busy {
            let _ = sys::shutdown(conn.fd.as_raw_fd(), libc::SHUT_RDWR);
            self.submit(Owner::Core, Op::Cancel(Cancel::Fd(Arc::clone(&conn.fd))));
        }
        match conn.role {
            Role::Server(server) => {
                if let Some((_, withdraw)) = server.waiting {
                    let _ = withdraw.withdraw();
                }
            }
            Role::Client(client) => {
                if let Some(current) = client.current {
                    let peer = client.peer;
                    current
                        .completion
                        .complete(Err(Error::ConnectionClosed { peer, detail: None }));
                }
                if let Some(next) = self.pool.closed(client.peer, key) {
                    self.backlog.push_back(crate::uring::core::Backlog {
                        conn: None,
                        outgoing: next,
                    });
                }
            }
        }
    }

    /// Closes every connection; requests being carried fail with `error()`.
    pub(crate) fn close_all(&mut self, error: impl Fn() -> Error) {
        for key in self.conns.keys() {
            if let Some(conn) = self.conns.get_mut(key) {
                if let Role::Client(client) = &mut conn.role {
                    if let Some(current) = client.current.take() {
                        current.completion.complete(Err(error()));
                    }
                }
            }
            self.close(key);
        }
    }
}

/// Receive steps after a loss that take what comes instead of waiting for a mark.
const MARKS_OFF_AFTER_LOSS: u32 = 64;

/// Whether the connection saw a loss lately (a segment arrived out of order since the last
/// look, or within the last [`MARKS_OFF_AFTER_LOSS`] steps): then waiting for a low-water
/// mark holds back the bytes that are in while the retransmission is awaited, and costs a
/// third of the rate (measured across the test bed with 0.1 % of frames lost, 64 MiB one-way:
/// 0.20 GB/s with marks against 0.30 without, where without loss marks win 2.2 against 1.7).
fn lossy(conn: &mut Conn) -> bool {
    if let Ok(seen) = sys::received_out_of_order(conn.fd.as_raw_fd()) {
        if seen != conn.out_of_order {
            conn.out_of_order = seen;
            conn.marks_off = MARKS_OFF_AFTER_LOSS;
        }
    }
    if conn.marks_off == 0 {
        return false;
    }
    conn.marks_off -= 1;
    true
}

/// How to receive into `buf`, and the low-water mark that goes with it.
///
/// A window of payload no larger than the progress quantum is one `MSG_WAITALL` receive: the
/// kernel fills it as segments arrive and completes once (the quantum bounds how long a slow
/// but honest peer can go unseen). A larger window of a large body is received in a few big
/// steps instead of one wake-up per arriving segment: each step waits until half of what is
/// still to come (at most 1 MiB, at most the quantum) is queued, then takes everything there.
/// Heads are read as they come.
///
/// Measured with `ptr1-bench` one-way to the fixture (server CPU per message, same run): at
/// 1 MiB, `MSG_WAITALL` windows 183 µs against 219 µs with a mark; at 64 and 256 MiB the marks
/// win (15.6 against 19.1 ms, 59 against 78 ms).
fn recv_mode(buf: &ReadBuf, poll_first: bool) -> (RecvMode, usize) {
    if !buf.is_payload() {
        return (RecvMode::Any, 1);
    }
    let remaining = buf.frame_remaining();
    let capacity = buf.capacity();
    let quantum = buf.progress_quantum();
    if capacity <= quantum {
        return (RecvMode::All, 1);
    }
    if poll_first && remaining >= LOW_WATER_MIN {
        let mark = (remaining / 2).min(LOW_WATER_MAX);
        let mark = usize::try_from(mark)
            .unwrap_or(usize::MAX)
            .min(quantum)
            .max(1);
        return (RecvMode::LowWater, mark);
    }
    (RecvMode::Any, 1)
}
