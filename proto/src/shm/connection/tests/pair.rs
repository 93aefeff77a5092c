//! The in-memory pair: two connections joined by a queue and a socket per direction, read the
//! way a real driver can (records first, the socket only when a session asks), with virtual
//! time and knobs for lost descriptors, refused maps and a peer that reads nothing.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::super::*;
use crate::shm::queue::record_size;

/// One direction: records for the queue, datagrams for the socket.
#[derive(Default)]
pub(super) struct Wire {
    pub(super) queue: VecDeque<Vec<u8>>,
    pub(super) socket: VecDeque<Vec<u8>>,
    /// Ring bytes produced into the queue and consumed from it (head and tail).
    pub(super) head: u64,
    pub(super) tail: u64,
}

pub(super) struct Side {
    pub(super) conn: ShmConnection,
    pub(super) events: Vec<ConnEvent>,
    /// Whether descriptors sent to this side are lost (it is at its descriptor limit).
    pub(super) loses_descriptors: bool,
    /// Whether this side's driver refuses to map what it is told to.
    pub(super) refuse_maps: Option<CloseReason>,
    /// Whether the queue to the peer has room.
    pub(super) room: bool,
    /// Whether this side consumes the records queued for it.
    pub(super) reads: bool,
}

pub(super) struct Pair {
    pub(super) now: Instant,
    pub(super) client: Side,
    pub(super) server: Side,
    pub(super) to_server: Wire,
    pub(super) to_client: Wire,
}

pub(super) fn config(role: Role) -> ConnectionConfig {
    ConnectionConfig::new(role, Limits::default())
}

impl Side {
    pub(super) fn new(config: ConnectionConfig) -> Self {
        Self {
            conn: ShmConnection::new(config),
            events: Vec::new(),
            loses_descriptors: false,
            refuse_maps: None,
            room: true,
            reads: true,
        }
    }

    pub(super) fn take(&mut self) -> Vec<ConnEvent> {
        std::mem::take(&mut self.events)
    }
}

impl Pair {
    pub(super) fn new() -> Self {
        Self::with(config(Role::Client), config(Role::Server))
    }

    pub(super) fn with(client: ConnectionConfig, server: ConnectionConfig) -> Self {
        Self {
            now: Instant::now(),
            client: Side::new(client),
            server: Side::new(server),
            to_server: Wire::default(),
            to_client: Wire::default(),
        }
    }

    /// Moves everything until nothing moves.
    pub(super) fn drive(&mut self) {
        loop {
            let mut moved = false;
            moved |= Self::flush(&mut self.client, &mut self.to_server, self.now);
            moved |= Self::flush(&mut self.server, &mut self.to_client, self.now);
            moved |= Self::deliver(&mut self.server, &mut self.to_server);
            moved |= Self::deliver(&mut self.client, &mut self.to_client);
            moved |= Self::consumed(&mut self.client, &self.to_server, self.now);
            moved |= Self::consumed(&mut self.server, &self.to_client, self.now);
            if !moved {
                return;
            }
        }
    }

    pub(super) fn flush(side: &mut Side, wire: &mut Wire, now: Instant) -> bool {
        let mut moved = false;
        while let Some(transmit) = side.conn.poll_transmit() {
            if !side.room {
                side.conn.handle_blocked(now);
                break;
            }
            match transmit {
                Transmit::Record(record) => {
                    wire.head += record_size(record.len());
                    wire.queue.push_back(record.to_vec());
                    side.conn.handle_queued(wire.head);
                }
                Transmit::Map { datagram, .. } => {
                    wire.socket.push_back(datagram.clone());
                    side.conn.handle_transmitted();
                }
            }
            moved = true;
        }
        moved
    }

    /// Feeds queued records to `side` while it wants them, and answers its events as a
    /// driver would.
    pub(super) fn deliver(side: &mut Side, wire: &mut Wire) -> bool {
        let mut moved = false;
        loop {
            moved |= Self::events(side, wire);
            if !side.reads || !side.conn.wants_records() {
                return moved;
            }
            let Some(record) = wire.queue.pop_front() else {
                return moved;
            };
            wire.tail += record_size(record.len());
            side.conn.handle_record(Bytes::from(record));
            moved = true;
        }
    }

    /// Tells the producer `side` how far its peer consumed `wire` (as a driver reads the
    /// peer's tail): whether that let it read again.
    pub(super) fn consumed(side: &mut Side, wire: &Wire, now: Instant) -> bool {
        if !side.conn.reads_pending() {
            return false;
        }
        let paused = !side.conn.wants_records();
        side.conn.handle_consumed(wire.tail, now);
        paused && side.conn.wants_records()
    }

    pub(super) fn events(side: &mut Side, wire: &mut Wire) -> bool {
        let mut moved = false;
        while let Some(event) = side.conn.poll_event() {
            moved = true;
            match event {
                ConnEvent::Map { segment, .. } => {
                    let outcome = side.refuse_maps.clone().map_or(Ok(()), Err);
                    side.conn.handle_mapped(segment, outcome);
                }
                ConnEvent::DrainSocket => {
                    while let Some(datagram) = wire.socket.pop_front() {
                        let arrived = if side.loses_descriptors {
                            FdArrival::Lost
                        } else {
                            FdArrival::Arrived
                        };
                        side.conn.handle_datagram(&datagram, arrived);
                    }
                    side.conn.resume();
                }
                other => side.events.push(other),
            }
        }
        moved
    }

    pub(super) fn advance(&mut self, by: Duration) {
        self.now += by;
        self.client.conn.handle_timeout(self.now);
        self.server.conn.handle_timeout(self.now);
        self.drive();
    }

    pub(super) fn ask(&mut self, body: Body, segments: &[(u64, u64)]) -> u64 {
        let id = self
            .client
            .conn
            .send_request(
                self.now,
                RequestKind::Ask,
                "/actors/echo".into(),
                body,
                segments,
                Some(self.now + Duration::from_secs(30)),
            )
            .unwrap();
        self.drive();
        id
    }

    /// `n` asks with a small inline body from the client, moved as far as they go.
    pub(super) fn asks(&mut self, n: usize) {
        for _ in 0..n {
            self.client
                .conn
                .send_request(
                    self.now,
                    RequestKind::Ask,
                    "/actors/echo".into(),
                    Body::Inline(Bytes::new()),
                    &[],
                    None,
                )
                .unwrap();
        }
        self.drive();
    }

    /// The ids of the requests the server was handed since the last look.
    pub(super) fn served_ids(&mut self) -> Vec<u64> {
        self.server
            .take()
            .into_iter()
            .filter_map(|event| match event {
                ConnEvent::Request { id, .. } => Some(id),
                _ => None,
            })
            .collect()
    }

    /// The one request the server got.
    pub(super) fn served(&mut self) -> (u64, Body) {
        let events = self.server.take();
        match events.as_slice() {
            [ConnEvent::Request { id, body, .. }] => (*id, body.clone()),
            other => panic!("expected one request, got {other:?}"),
        }
    }
}
