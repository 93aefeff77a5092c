//! A core's connections: a slab of server and client connections, each owning its socket and
//! its session. Operations in flight hold their own reference to the socket, so a connection
//! can be dropped at any time: its descriptor closes when the last operation on it completes.

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;

use tensorwire_proto::session::{ClientSession, ServerSession};
use tensorwire_proto::transport::{Completion, Withdraw};

pub(crate) use crate::uring::keys::ConnKey;
use crate::uring::keys::OpKey;

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
    pub(crate) low_water: usize,
    /// Frames may go out with `SENDMSG_ZC`.
    pub(crate) zero_copy: bool,
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
    /// The request being carried.
    pub(crate) current: Option<InFlight>,
    /// Whether the connection sits idle in the pool.
    pub(crate) pooled: bool,
}

pub(crate) struct InFlight {
    /// Distinguishes the requests carried by one connection (for cancellation).
    pub(crate) id: u64,
    pub(crate) completion: Box<dyn Completion>,
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
        }
    }

    /// The session's next deadline.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match &self.role {
            Role::Server(server) => server.session.poll_timeout(),
            Role::Client(client) => client.session.poll_timeout(),
        }
    }
}

struct Slot {
    generation: u32,
    conn: Option<Conn>,
}

/// The connections of one core.
#[derive(Default)]
pub(crate) struct ConnSlab {
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: usize,
}

impl ConnSlab {
    pub(crate) fn insert(&mut self, conn: Conn) -> ConnKey {
        self.live += 1;
        match self.free.pop() {
            Some(index) => {
                let slot = &mut self.slots[index as usize];
                slot.generation = slot.generation.wrapping_add(1);
                slot.conn = Some(conn);
                ConnKey {
                    index,
                    generation: slot.generation,
                }
            }
            None => {
                let index = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
                self.slots.push(Slot {
                    generation: 0,
                    conn: Some(conn),
                });
                ConnKey {
                    index,
                    generation: 0,
                }
            }
        }
    }

    pub(crate) fn get_mut(&mut self, key: ConnKey) -> Option<&mut Conn> {
        let slot = self.slots.get_mut(key.index as usize)?;
        if slot.generation != key.generation {
            return None;
        }
        slot.conn.as_mut()
    }

    pub(crate) fn remove(&mut self, key: ConnKey) -> Option<Conn> {
        let slot = self.slots.get_mut(key.index as usize)?;
        if slot.generation != key.generation {
            return None;
        }
        let conn = slot.conn.take()?;
        self.free.push(key.index);
        self.live -= 1;
        Some(conn)
    }

    /// Keys of every connection.
    pub(crate) fn keys(&self) -> Vec<ConnKey> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.conn.is_some())
            .map(|(index, slot)| ConnKey {
                index: u32::try_from(index).unwrap_or(u32::MAX),
                generation: slot.generation,
            })
            .collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.live
    }
}

/// The session calls the I/O code needs, whichever the role.
impl Conn {
    pub(crate) fn poll_read(&mut self) -> Option<tensorwire_proto::session::ReadBuf> {
        match &mut self.role {
            Role::Server(server) => server.session.poll_read(),
            Role::Client(client) => client.session.poll_read(),
        }
    }

    pub(crate) fn handle_read(
        &mut self,
        buf: tensorwire_proto::session::ReadBuf,
        result: std::io::Result<usize>,
        now: Instant,
    ) {
        match &mut self.role {
            Role::Server(server) => server.session.handle_read(buf, result, now),
            Role::Client(client) => client.session.handle_read(buf, result, now),
        }
    }

    pub(crate) fn poll_transmit(
        &mut self,
        now: Instant,
    ) -> Option<tensorwire_proto::session::Transmit> {
        match &mut self.role {
            Role::Server(server) => server.session.poll_transmit(now),
            Role::Client(client) => client.session.poll_transmit(now),
        }
    }

    pub(crate) fn handle_written(&mut self, n: usize, now: Instant) {
        match &mut self.role {
            Role::Server(server) => server.session.handle_written(n, now),
            Role::Client(client) => client.session.handle_written(n, now),
        }
    }

    pub(crate) fn handle_write_error(&mut self, error: std::io::Error, now: Instant) {
        match &mut self.role {
            Role::Server(server) => server.session.handle_write_error(error),
            Role::Client(client) => client.session.handle_write_error(error, now),
        }
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        match &mut self.role {
            Role::Server(server) => server.session.handle_timeout(now),
            Role::Client(client) => client.session.handle_timeout(now),
        }
    }
}
