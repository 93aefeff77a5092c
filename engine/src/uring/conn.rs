//! A core's connections: a slab of server and client connections, each owning its socket and
//! its session. Operations in flight hold their own reference to the socket, so a connection
//! can be dropped at any time: its descriptor closes when the last operation on it completes.

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;

use tensorwire_proto::session::{ClientSession, DrivenSession, ServerSession};
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
    /// Segments that arrived out of order so far, as last read (a loss upstream).
    pub(crate) out_of_order: u32,
    /// Receive steps left that take what comes instead of waiting for a low-water mark,
    /// since the last loss.
    pub(crate) marks_off: u32,
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
            out_of_order: 0,
            marks_off: 0,
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

/// The session, whichever the role: what the I/O code drives.
impl Conn {
    pub(crate) fn session(&mut self) -> &mut dyn DrivenSession {
        match &mut self.role {
            Role::Server(server) => &mut server.session,
            Role::Client(client) => &mut client.session,
        }
    }
}
