//! The node's side of the knock (`proto::shm` has the format): on its TCP port it answers
//! `TWSK` with where its shared-memory socket is and a single-use ticket, or with why it does
//! not offer shared memory; then, on the socket, it proves it issued the ticket.
//!
//! The knock arrives through the listener's hand-off (the first bytes are not `PTR1`), so it
//! works beside TLS: it carries no payload, only the proof of which process owns the port.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tensorwire_proto::shm::{KNOCK, KnockReply, Offer, Tickets};
use tensorwire_proto::transport::HandOff;

use crate::shm::os;
use crate::sync::lock;

/// What a node answers to knocks.
pub(crate) struct KnockDesk {
    offer: Result<Where, String>,
    tickets: Mutex<Tickets>,
}

/// Where this node's shared-memory socket is.
pub(crate) struct Where {
    pub(crate) socket: String,
    pub(crate) pid: u32,
    pub(crate) uid: u32,
    pub(crate) boot_id: String,
}

impl KnockDesk {
    /// A desk that offers the socket `where_`.
    pub(crate) fn offering(where_: Where) -> Self {
        Self {
            offer: Ok(where_),
            tickets: Mutex::new(Tickets::default()),
        }
    }

    /// A desk that refuses, saying `why`.
    pub(crate) fn refusing(why: String) -> Self {
        Self {
            offer: Err(why),
            tickets: Mutex::new(Tickets::default()),
        }
    }

    /// The answer to a knock from `knocker`.
    pub(crate) fn answer(&self, knocker: SocketAddr) -> KnockReply {
        let place = match &self.offer {
            Ok(place) => place,
            Err(why) => return KnockReply::Refused(why.clone()),
        };
        let (Ok(id), Ok(secret)) = (os::random::<8>(), os::random::<16>()) else {
            return KnockReply::Refused("no randomness for a ticket".into());
        };
        let id = u64::from_le_bytes(id);
        lock(&self.tickets).issue(Instant::now(), knocker, id, secret);
        KnockReply::Offered(Offer {
            pid: place.pid,
            uid: place.uid,
            boot_id: place.boot_id.clone(),
            socket: place.socket.clone(),
            ticket: id,
            secret,
        })
    }

    /// Redeems ticket `id` for the client that says it knocked from `knocker`: its secret,
    /// once.
    pub(crate) fn redeem(&self, id: u64, knocker: &str) -> Option<[u8; 16]> {
        lock(&self.tickets).redeem(Instant::now(), id, knocker)
    }
}

/// The listener's hand-off: knocks are answered here, anything else goes on to `next` (the
/// HTTP/2 + TLS server) or is closed.
pub(crate) struct KnockHandOff {
    pub(crate) desk: Arc<KnockDesk>,
    pub(crate) next: Option<Arc<dyn HandOff>>,
}

impl HandOff for KnockHandOff {
    fn hand_off(&self, mut stream: TcpStream, already_read: Vec<u8>) {
        if !already_read.starts_with(KNOCK) {
            if let Some(next) = &self.next {
                next.hand_off(stream, already_read);
            }
            return;
        }
        let Ok(knocker) = stream.peer_addr() else {
            return;
        };
        let reply = self.desk.answer(knocker).encode();
        // A fresh socket has room for a few hundred bytes: this never waits (a driver thread
        // runs it); if it somehow would, the knock fails and the client uses TCP.
        if stream.set_nonblocking(true).is_ok() {
            let _ = stream.write(&reply);
        }
    }
}
