//! Who a same-host peer is, and every check that proves it, without sockets: the client checks
//! the knock's offer, the socket's credentials and the server's hello; the server checks the
//! client's hello against the credentials the kernel recorded. A failed check is a
//! [`Refusal`] whose text says why (for `route()` and the logs).
//!
//! The node behind a port counts as on this host only if all of this holds: it answered the
//! knock on the very port the caller addressed; the socket it named belongs (`SO_PEERCRED`) to
//! the process and user it said; it is on this boot, in this user namespace, under this user;
//! and on the socket it sent back the secret of the ticket it gave over TCP, which the client
//! never sends. Its queue ring has a size this side accepts.

use crate::shm::wire::Hello;
use crate::shm::{Offer, QueueShape};

/// Who this node is, as it says in its hello.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// `/proc/sys/kernel/random/boot_id` (empty if unreadable: then nobody is local).
    pub boot_id: String,
    /// The user namespace's inode number.
    pub user_ns: u64,
    /// The user id.
    pub uid: u32,
    /// The process id.
    pub pid: u32,
    /// The node's TCP address, as text.
    pub node: String,
}

/// What the kernel recorded about the other end of a Unix socket (`SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Credentials {
    /// Its process id.
    pub pid: u32,
    /// Its user id.
    pub uid: u32,
}

/// Why a peer is not (or may not be) reached over shared memory.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    // ---- not on this host (nothing is wrong) ----
    /// Another boot: another host, or this one restarted.
    #[error("it runs on another host (its boot id differs)")]
    AnotherHost,
    /// Another user namespace.
    #[error("it runs in another user namespace")]
    AnotherNamespace,
    /// Another user: shared memory is same-user only.
    #[error("it runs as uid {theirs}, this node as uid {ours}: shared memory is same-user only")]
    AnotherUser {
        /// Its uid.
        theirs: u32,
        /// Ours.
        ours: u32,
    },

    // ---- the peer is not who it says ----
    /// The socket belongs to another user than the node said.
    #[error(
        "the shared-memory socket belongs to uid {socket}, not uid {said} (refused: another user \
         may be squatting it)"
    )]
    SocketOfAnotherUser {
        /// The socket owner's uid.
        socket: u32,
        /// The uid the node said.
        said: u32,
    },
    /// The socket belongs to another process than the node said.
    #[error(
        "the shared-memory socket belongs to pid {socket}, but the node said pid {said} (refused)"
    )]
    SocketOfAnotherProcess {
        /// The socket owner's pid.
        socket: u32,
        /// The pid the node said.
        said: u32,
    },
    /// The hello says another pid than the kernel reports.
    #[error("its hello says pid {said}, but the socket's peer is pid {socket} (refused)")]
    WrongPid {
        /// The pid in the hello.
        said: u32,
        /// The pid the kernel reports.
        socket: u32,
    },
    /// The server could not prove it issued the knock's ticket.
    #[error(
        "the process on the shared-memory socket could not prove it issued the ticket (refused)"
    )]
    NoProof,
    /// The client's hello redeems no valid ticket of this node (unknown, used, expired, or
    /// issued to another knocker).
    #[error("the hello redeems no valid ticket")]
    NoTicket,
    /// The peer's queue ring has a size outside what this side accepts.
    #[error(
        "its queue ring of {bytes} bytes is not a power of two between {min} and {max} (refused)"
    )]
    BadQueue {
        /// The ring's bytes, as said.
        bytes: u32,
        /// The smallest accepted.
        min: u32,
        /// The largest accepted.
        max: u32,
    },
}

impl Refusal {
    /// Whether the peer is simply elsewhere (another host, namespace or user), rather than
    /// misbehaving.
    pub fn is_elsewhere(&self) -> bool {
        matches!(
            self,
            Self::AnotherHost | Self::AnotherNamespace | Self::AnotherUser { .. }
        )
    }
}

impl Identity {
    /// The hello this side sends: a client redeems `ticket` knocked for from `via`; a server
    /// proves with `proof`. `queue` is the size of this side's queue ring.
    pub fn hello(&self, ticket: u64, via: String, proof: [u8; 16], queue: u32) -> Hello {
        Hello {
            boot_id: self.boot_id.clone(),
            user_ns: self.user_ns,
            uid: self.uid,
            pid: self.pid,
            node: self.node.clone(),
            ticket,
            via,
            proof,
            queue,
        }
    }

    /// Client, after the knock: is the node that answered on this boot and under this user?
    ///
    /// # Errors
    ///
    /// [`Refusal::AnotherHost`] or [`Refusal::AnotherUser`].
    pub fn check_offer(&self, offer: &Offer) -> Result<(), Refusal> {
        if self.boot_id.is_empty() || offer.boot_id != self.boot_id {
            return Err(Refusal::AnotherHost);
        }
        if offer.uid != self.uid {
            return Err(Refusal::AnotherUser {
                theirs: offer.uid,
                ours: self.uid,
            });
        }
        Ok(())
    }

    /// Client, connected to the socket the offer named: does it belong to the process and
    /// user that answered the knock?
    ///
    /// # Errors
    ///
    /// [`Refusal::SocketOfAnotherUser`] or [`Refusal::SocketOfAnotherProcess`].
    pub fn check_socket(&self, offer: &Offer, socket: Credentials) -> Result<(), Refusal> {
        if socket.uid != self.uid {
            return Err(Refusal::SocketOfAnotherUser {
                socket: socket.uid,
                said: self.uid,
            });
        }
        if socket.pid != offer.pid {
            return Err(Refusal::SocketOfAnotherProcess {
                socket: socket.pid,
                said: offer.pid,
            });
        }
        Ok(())
    }

    /// Client, on the server's hello: did it prove it issued the ticket, and is it local?
    ///
    /// # Errors
    ///
    /// [`Refusal::NoProof`], a mismatch of boot, namespace or user, a pid other than the
    /// socket's, or a queue size outside `shape`.
    pub fn check_server_hello(
        &self,
        offer: &Offer,
        socket: Credentials,
        theirs: &Hello,
        shape: QueueShape,
    ) -> Result<(), Refusal> {
        if theirs.proof != offer.secret {
            return Err(Refusal::NoProof);
        }
        self.check_peer(socket, theirs, shape)
    }

    /// Server, on a client's hello (the ticket is redeemed separately): is it local, and the
    /// process the kernel says?
    ///
    /// # Errors
    ///
    /// A mismatch of boot, namespace or user, a pid other than the socket's, or a queue size
    /// outside `shape`.
    pub fn check_client_hello(
        &self,
        socket: Credentials,
        theirs: &Hello,
        shape: QueueShape,
    ) -> Result<(), Refusal> {
        self.check_peer(socket, theirs, shape)
    }

    fn check_peer(
        &self,
        socket: Credentials,
        theirs: &Hello,
        shape: QueueShape,
    ) -> Result<(), Refusal> {
        if self.boot_id.is_empty() || self.boot_id != theirs.boot_id {
            return Err(Refusal::AnotherHost);
        }
        if self.user_ns != theirs.user_ns {
            return Err(Refusal::AnotherNamespace);
        }
        if self.uid != theirs.uid || socket.uid != self.uid {
            return Err(Refusal::AnotherUser {
                theirs: theirs.uid,
                ours: self.uid,
            });
        }
        if theirs.pid != socket.pid {
            return Err(Refusal::WrongPid {
                said: theirs.pid,
                socket: socket.pid,
            });
        }
        shape.check(theirs.queue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours() -> Identity {
        Identity {
            boot_id: "boot-a".into(),
            user_ns: 7,
            uid: 1000,
            pid: 10,
            node: "127.0.0.1:9000".into(),
        }
    }

    fn offer() -> Offer {
        Offer {
            pid: 20,
            uid: 1000,
            boot_id: "boot-a".into(),
            socket: "tensorwire/1000/x".into(),
            ticket: 5,
            secret: [9; 16],
        }
    }

    fn theirs() -> Hello {
        Identity { pid: 20, ..ours() }.hello(0, String::new(), [9; 16], QueueShape::DEFAULT.bytes)
    }

    const SOCKET: Credentials = Credentials { pid: 20, uid: 1000 };

    #[test]
    fn a_peer_that_proves_everything_is_accepted_on_both_sides() {
        let shape = QueueShape::DEFAULT;
        assert_eq!(ours().check_offer(&offer()), Ok(()));
        assert_eq!(ours().check_socket(&offer(), SOCKET), Ok(()));
        assert_eq!(
            ours().check_server_hello(&offer(), SOCKET, &theirs(), shape),
            Ok(())
        );
        assert_eq!(ours().check_client_hello(SOCKET, &theirs(), shape), Ok(()));
    }

    #[test]
    fn a_server_that_cannot_prove_it_issued_the_ticket_is_refused() {
        let forged = Hello {
            proof: [0; 16],
            ..theirs()
        };
        let refused = ours().check_server_hello(&offer(), SOCKET, &forged, QueueShape::DEFAULT);
        assert_eq!(refused, Err(Refusal::NoProof));
    }

    #[test]
    fn another_boot_namespace_or_user_is_elsewhere_not_misbehaving() {
        let shape = QueueShape::DEFAULT;
        let other_boot = Hello {
            boot_id: "boot-b".into(),
            ..theirs()
        };
        let other_ns = Hello {
            user_ns: 8,
            ..theirs()
        };
        let other_user = Hello { uid: 0, ..theirs() };
        for (hello, want) in [
            (other_boot, Refusal::AnotherHost),
            (other_ns, Refusal::AnotherNamespace),
            (
                other_user,
                Refusal::AnotherUser {
                    theirs: 0,
                    ours: 1000,
                },
            ),
        ] {
            let got = ours()
                .check_client_hello(SOCKET, &hello, shape)
                .unwrap_err();
            assert_eq!(got, want);
            assert!(got.is_elsewhere());
        }
        let unreadable_boot = Identity {
            boot_id: String::new(),
            ..ours()
        };
        assert_eq!(
            unreadable_boot.check_offer(&offer()),
            Err(Refusal::AnotherHost),
            "without a boot id nobody counts as local"
        );
    }

    #[test]
    fn a_socket_of_another_process_or_user_is_refused_before_the_hello() {
        let squatter = Credentials { pid: 30, uid: 1000 };
        assert_eq!(
            ours().check_socket(&offer(), squatter),
            Err(Refusal::SocketOfAnotherProcess {
                socket: 30,
                said: 20
            })
        );
        let root = Credentials { pid: 20, uid: 0 };
        let refused = ours().check_socket(&offer(), root).unwrap_err();
        assert!(matches!(refused, Refusal::SocketOfAnotherUser { .. }));
        assert!(!refused.is_elsewhere());
    }

    #[test]
    fn a_hello_whose_pid_is_not_the_sockets_is_refused() {
        let lying = Hello {
            pid: 21,
            ..theirs()
        };
        assert_eq!(
            ours().check_client_hello(SOCKET, &lying, QueueShape::DEFAULT),
            Err(Refusal::WrongPid {
                said: 21,
                socket: 20
            })
        );
    }

    #[test]
    fn a_queue_ring_of_a_size_this_side_does_not_accept_is_refused() {
        for bytes in [0, 4096, (1 << 20) + 1, 1 << 30] {
            let odd = Hello {
                queue: bytes,
                ..theirs()
            };
            let got = ours().check_client_hello(SOCKET, &odd, QueueShape::DEFAULT);
            assert!(
                matches!(got, Err(Refusal::BadQueue { .. })),
                "{bytes}: {got:?}"
            );
        }
    }
}
