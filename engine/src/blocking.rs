//! Blocking calls: one exchange on the calling thread with plain system calls.
//!
//! A thread that blocks for its reply anyway gains nothing from a ring: io_uring's receive path
//! (arm a poll, run task work, retry the receive) costs more than one blocking wait for a single
//! sequential exchange. So `Node::ask_blocking` sends with non-blocking `sendmsg` and waits with
//! `poll`, driving the same frame state machines (`FrameSend`, `FrameRecv`) and the same receive
//! pool as the cores: a large body still lands straight in final pool memory.
//!
//! Each thread keeps its own small pool of connections per node and peer (LIFO, at most the
//! node's idle cap). A pooled connection is checked for a peer close (`poll`, zero timeout)
//! before reuse; a close that arrives after that check fails the request, which is never
//! replayed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorwire_proto::Encoded;
use tensorwire_proto::ptr1::Frame;
use tensorwire_proto::stats;

use crate::frame_io::{FrameRecv, FrameSend, RecvProgress};
use crate::node::Shared;
use crate::{Error, sys};

/// One thread's blocking connections to the peers of one node.
pub(crate) struct BlockingClient {
    shared: Arc<Shared>,
    idle: HashMap<SocketAddr, Vec<Conn>>,
}

struct Conn {
    fd: OwnedFd,
    recv: FrameRecv,
}

/// What a deadline is reported as.
#[derive(Clone, Copy)]
pub(crate) struct Deadline {
    pub(crate) at: Instant,
    pub(crate) timeout: Duration,
    pub(crate) what: &'static str,
}

impl Deadline {
    fn left(self) -> Result<Duration, Error> {
        self.at
            .checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero())
            .ok_or(Error::Timeout {
                what: self.what,
                after: self.timeout,
            })
    }
}

impl BlockingClient {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            idle: HashMap::new(),
        }
    }

    /// Sends `encoded` to `peer` and returns the reply frame.
    pub(crate) fn exchange(
        &mut self,
        peer: SocketAddr,
        encoded: Encoded,
        deadline: Deadline,
    ) -> Result<Frame, Error> {
        let mut conn = self.take(peer, deadline)?;
        let (frame, reusable) = conn.exchange(&self.shared, peer, encoded, deadline)?;
        let idle = self.idle.entry(peer).or_default();
        if reusable && idle.len() < self.shared.config.idle_connections_per_peer {
            idle.push(conn);
        }
        Ok(frame)
    }

    /// A pooled connection that still looks alive, or a new one.
    fn take(&mut self, peer: SocketAddr, deadline: Deadline) -> Result<Conn, Error> {
        while let Some(conn) = self.idle.get_mut(&peer).and_then(Vec::pop) {
            // Readable while idle means the peer closed (or sent bytes nobody asked for).
            let events = libc::POLLIN | libc::POLLRDHUP;
            if matches!(
                sys::poll_one(conn.fd.as_raw_fd(), events, Duration::ZERO),
                Ok(0)
            ) {
                return Ok(conn);
            }
        }
        let connect = |source| Error::Connect { peer, source };
        let fd = sys::tcp_socket(&peer).map_err(connect)?;
        sys::set_nonblocking(fd.as_raw_fd()).map_err(connect)?;
        let _ = sys::set_nodelay(fd.as_raw_fd());
        if !sys::connect_nonblocking(fd.as_raw_fd(), &sys::RawAddr::new(peer)).map_err(connect)? {
            let limit = deadline.left()?.min(self.shared.config.connect_timeout);
            let ready = sys::poll_one(fd.as_raw_fd(), libc::POLLOUT, limit).map_err(connect)?;
            if ready == 0 {
                return Err(Error::Timeout {
                    what: "connect",
                    after: limit,
                });
            }
            sys::take_socket_error(fd.as_raw_fd()).map_err(connect)?;
        }
        Ok(Conn {
            fd,
            recv: FrameRecv::new(),
        })
    }
}

impl Conn {
    /// Sends the request while watching for an early reply, then reads the reply. Returns it
    /// and whether the connection is still in step (reusable).
    fn exchange(
        &mut self,
        shared: &Shared,
        peer: SocketAddr,
        encoded: Encoded,
        deadline: Deadline,
    ) -> Result<(Frame, bool), Error> {
        let fd = self.fd.as_raw_fd();
        let mut send = FrameSend::new(encoded);
        let wire_len = send.wire_len();
        loop {
            match send.send_nonblocking(fd) {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                // The peer may have answered (an Error frame) before it stopped reading.
                Err(e) => return self.early_reply(shared, peer, deadline, e),
            }
            let events = sys::poll_one(fd, libc::POLLOUT | libc::POLLIN, deadline.left()?)
                .map_err(|e| closed(peer, e))?;
            if events & libc::POLLIN != 0 {
                // An answer before the request is complete: the stream is out of step.
                let frame = self.read_reply(shared, peer, deadline)?;
                return Ok((frame, false));
            }
        }
        stats::global().record_raw_frame_sent(wire_len);
        Ok((self.read_reply(shared, peer, deadline)?, true))
    }

    fn early_reply(
        &mut self,
        shared: &Shared,
        peer: SocketAddr,
        deadline: Deadline,
        send_error: std::io::Error,
    ) -> Result<(Frame, bool), Error> {
        match self.read_reply(shared, peer, deadline) {
            Ok(frame) => Ok((frame, false)),
            Err(_) => Err(closed(peer, send_error)),
        }
    }

    fn read_reply(
        &mut self,
        shared: &Shared,
        peer: SocketAddr,
        deadline: Deadline,
    ) -> Result<Frame, Error> {
        let fd = self.fd.as_raw_fd();
        loop {
            let progress = match self.recv.buffered(&shared.limits, &shared.pool) {
                Some(progress) => progress,
                None => {
                    let res = self.recv.step_nonblocking(fd);
                    if res == -libc::EAGAIN || res == -libc::EWOULDBLOCK {
                        let left = deadline.left()?;
                        sys::poll_one(fd, libc::POLLIN, left).map_err(|e| closed(peer, e))?;
                        continue;
                    }
                    self.recv.complete(res, &shared.limits, &shared.pool)
                }
            };
            match progress {
                RecvProgress::More => {}
                RecvProgress::Frame { frame, wire_len } => {
                    stats::global().record_raw_frame_received(wire_len);
                    return Ok(frame);
                }
                RecvProgress::Closed | RecvProgress::ForeignPreface(_) => {
                    return Err(Error::ConnectionClosed { peer, detail: None });
                }
                RecvProgress::Failed { error, .. } => return Err(error.into_client_error(peer)),
            }
        }
    }
}

fn closed(peer: SocketAddr, detail: std::io::Error) -> Error {
    Error::ConnectionClosed {
        peer,
        detail: Some(detail),
    }
}
