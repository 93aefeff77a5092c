//! A core's connections: server and client connections, each owning its socket and its
//! session, and saying which receive and send it wants next (the core submits them). Operations in flight hold their own reference to the socket, so a connection
//! can be dropped at any time: its descriptor closes when the last operation on it completes.

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;

use tensorwire_proto::session::{ClientSession, DrivenSession, RequestToken, ServerSession};
use tensorwire_proto::transport::{Completion, Withdraw};

pub(crate) use crate::uring::keys::ConnKey;
use crate::uring::keys::OpKey;
use crate::uring::op::SendMsg;

mod receive;

/// The connections of one core.
pub(crate) type ConnSlab = crate::uring::slab::Slab<ConnKey, Conn>;

impl ConnSlab {
    /// The client side of connection `key`, if it is one.
    pub(crate) fn client_mut(&mut self, key: ConnKey) -> Option<&mut Client> {
        match &mut self.get_mut(key)?.role {
            Role::Client(client) => Some(client),
            Role::Server(_) => None,
        }
    }

    /// The server side of connection `key`, if it is one.
    pub(crate) fn server_mut(&mut self, key: ConnKey) -> Option<&mut Server> {
        match &mut self.get_mut(key)?.role {
            Role::Server(server) => Some(server),
            Role::Client(_) => None,
        }
    }
}

/// One TCP connection.
pub(crate) struct Conn {
    pub(crate) fd: Arc<OwnedFd>,
    pub(crate) role: Role,
    /// The receive in flight, if any (set only once its submission succeeded).
    pub(crate) recv_op: Option<OpKey>,
    /// The send in flight, if any.
    pub(crate) send_op: Option<OpKey>,
    /// The deadline queued in the core's timers.
    pub(crate) timer: Option<Instant>,
    /// `SO_RCVLOWAT` as last set (1, the kernel's default).
    low_water: usize,
    /// Frames may go out with `SENDMSG_ZC`.
    pub(crate) zero_copy: bool,
    /// A zero-copy send was submitted on it: its pages (and the socket) may be held until the
    /// peer takes them, also after `zero_copy` turned off.
    pub(crate) used_zero_copy: bool,
    /// Segments that arrived out of order so far, as last read (a loss upstream).
    out_of_order: u32,
    /// Receive steps left that take what comes instead of waiting for a low-water mark,
    /// since the last loss.
    marks_off: u32,
}

pub(crate) enum Role {
    Server(Server),
    Client(Client),
}

pub(crate) struct Server {
    pub(crate) session: ServerSession,
    pub(crate) peer: Option<SocketAddr>,
    /// The request waiting for mailbox space, to withdraw if the session gives up on it.
    pub(crate) waiting: Option<(u64, Box<dyn Withdraw>)>,
}

pub(crate) struct Client {
    pub(crate) session: ClientSession,
    pub(crate) peer: SocketAddr,
    /// The connect in flight.
    pub(crate) connecting: Option<OpKey>,
    /// The requests being carried, in the order they were started (outcomes mostly come in
    /// that order; one given up on comes at once).
    pub(crate) carrying: std::collections::VecDeque<InFlight>,
    /// Whether the connection sits idle in the pool.
    pub(crate) pooled: bool,
}

pub(crate) struct InFlight {
    /// Distinguishes the requests carried by the core's connections (for cancellation).
    pub(crate) id: u64,
    /// The request in its session.
    pub(crate) token: RequestToken,
    pub(crate) completion: Box<dyn Completion>,
}

impl Client {
    /// Takes out the request `token` is for.
    pub(crate) fn take(&mut self, token: RequestToken) -> Option<InFlight> {
        let index = self.carrying.iter().position(|c| c.token == token)?;
        self.carrying.remove(index)
    }
}

impl Conn {
    pub(crate) fn new(fd: Arc<OwnedFd>, role: Role, zero_copy: bool) -> Self {
        Self {
            fd,
            role,
            recv_op: None,
            send_op: None,
            timer: None,
            low_water: 1,
            zero_copy,
            used_zero_copy: false,
            out_of_order: 0,
            marks_off: 0,
        }
    }
}

impl Conn {
    /// The session, whichever the role: what the I/O code drives.
    pub(crate) fn session(&mut self) -> &mut dyn DrivenSession {
        match &mut self.role {
            Role::Server(server) => &mut server.session,
            Role::Client(client) => &mut client.session,
        }
    }

    /// The send the connection wants next, if its session has bytes to send and none is in
    /// flight; with `SENDMSG_ZC` if the connection may and the frame is at least
    /// `zero_copy_min` bytes (`None`: the ring has no zero-copy send).
    pub(crate) fn next_send(
        &mut self,
        now: Instant,
        zero_copy_min: Option<u64>,
    ) -> Option<SendMsg> {
        if self.send_op.is_some() {
            return None;
        }
        let transmit = self.session().poll_transmit(now)?;
        let zero_copy =
            self.zero_copy && zero_copy_min.is_some_and(|min| transmit.largest_frame() >= min);
        self.used_zero_copy |= zero_copy;
        Some(SendMsg::new(Arc::clone(&self.fd), transmit, zero_copy))
    }

    /// Whether the kernel holds an operation of this connection (a receive, a send, a
    /// connect): closing it then needs a cancel, and it cannot be handed off.
    pub(crate) fn in_kernel(&self) -> bool {
        self.recv_op.is_some()
            || self.send_op.is_some()
            || matches!(&self.role, Role::Client(client) if client.connecting.is_some())
    }
}
