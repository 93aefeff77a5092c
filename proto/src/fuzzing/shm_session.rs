//! The same-host session driven by the fuzzer: the input picks the role, then is a script of
//! what a driver can see and do — records from the peer (well-formed messages with fields the
//! script chooses, or any bytes at all), `Map` datagrams whose descriptor arrives or is lost,
//! mappings that succeed or fail, sends, replies (lending slot bytes), releases, retirements,
//! the queue accepting or refusing transmits, the peer consuming the queue, time passing,
//! cancellations and hang-ups.
//!
//! Checked on every input: no panic; every request the session took gets exactly one outcome
//! (a reply or a failure), none after it; no outcome for a request it never took; the bytes
//! queued for the peer stay within the bound (plus the one message that crossed it); requests
//! in flight stay within theirs.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::Limits;
use crate::shm::{
    Body, CloseReason, ConnEvent, ConnectionConfig, Control, FdArrival, MAX_DATAGRAM, Part, Role,
    Shared, ShmConnection, Transmit, WireReply, encode,
};
use crate::transport::RequestKind;

/// A session of the role the first byte picks, fed the rest as a script.
pub fn shm_session(data: &[u8]) {
    let mut script = Script(data);
    let role = if script.byte().unwrap_or(0) & 1 == 0 {
        Role::Client
    } else {
        Role::Server
    };
    let mut config = ConnectionConfig::new(role, small_limits());
    config.max_in_flight = 16;
    config.max_queued_bytes = 4096;
    config.read_pause_bytes = 1024;
    config.read_pause_lent_bytes = 1 << 16;
    config.max_peer_segments = 8;
    config.max_segment_bytes = 1 << 20;
    let bound = config.max_queued_bytes + MAX_DATAGRAM as u64;
    let max_in_flight = config.max_in_flight;
    let mut session = ShmConnection::new(config);
    let mut now = Instant::now();
    let mut taken: HashSet<u64> = HashSet::new();
    let mut answered: HashSet<u64> = HashSet::new();
    let mut served: Vec<u64> = Vec::new();
    let mut socket: Vec<Vec<u8>> = Vec::new();
    let mut head = 0u64;
    while let Some(step) = script.byte() {
        match step % 14 {
            0..=2 => {
                let record = record(&mut script);
                session.handle_record(Bytes::from(record));
            }
            3 => {
                let len = usize::from(script.byte().unwrap_or(0));
                let bytes = script.take(len);
                session.handle_record(Bytes::copy_from_slice(bytes));
            }
            4 => {
                let pick = script.byte().unwrap_or(0);
                // A bell now and then among the maps (a byte of its own picks which): it asks
                // for nothing but a look.
                let map = encode(&if pick >= 0xf0 {
                    Control::Bell
                } else {
                    Control::Map {
                        segment: u64::from(script.byte().unwrap_or(0) % 12),
                        len: u64::from(script.byte().unwrap_or(0)) << 12,
                    }
                })
                .unwrap_or_default();
                if script.byte().unwrap_or(0) & 1 == 0 {
                    socket.push(map);
                } else {
                    session.handle_datagram(&map, arrival(script.byte().unwrap_or(0)));
                }
            }
            5 if role == Role::Client => {
                let kind = kind(script.byte().unwrap_or(0));
                let segment = u64::from(script.byte().unwrap_or(0) % 4);
                let deadline = now + Duration::from_millis(u64::from(script.byte().unwrap_or(0)));
                let body = body(&mut script);
                if let Ok(id) = session.send_request(
                    now,
                    kind,
                    "/actors/a".into(),
                    body,
                    &[(segment, 1 << 16)],
                    Some(deadline),
                ) {
                    assert!(taken.insert(id), "an id is never given twice");
                }
            }
            6 if !served.is_empty() => {
                let at = usize::from(script.byte().unwrap_or(0)) % served.len();
                let id = served.swap_remove(at);
                let reply = reply(&mut script);
                let lent = u64::from(script.byte().unwrap_or(0)) << 12;
                session.send_reply(id, reply, &[(1, 1 << 16)], lent);
            }
            7 => {
                let lease = u64::from(script.byte().unwrap_or(0));
                session.send_releases(&[lease, lease + 1]);
            }
            8 => session.retire(u64::from(script.byte().unwrap_or(0) % 4)),
            9 => {
                if script.byte().unwrap_or(0) % 4 == 0 {
                    session.handle_blocked(now);
                } else if let Some(transmit) = session.poll_transmit() {
                    if matches!(transmit, Transmit::Record(_)) {
                        head += 64;
                        session.handle_queued(head);
                    } else {
                        session.handle_transmitted();
                    }
                }
            }
            10 => {
                now += Duration::from_millis(u64::from(script.byte().unwrap_or(0)) * 40);
                session.handle_timeout(now);
            }
            11 => {
                let id = u64::from(script.byte().unwrap_or(0));
                session.cancel(id);
                if taken.contains(&id) {
                    answered.insert(id);
                }
            }
            12 => session.handle_peer_closed(),
            13 => {
                let by = u64::from(script.byte().unwrap_or(0));
                // Mostly behind the head, as a reader is; sometimes past it, as a liar is.
                let tail = if by & 1 == 0 {
                    head.saturating_sub(by * 8)
                } else {
                    head.saturating_add(by << 40)
                };
                session.handle_consumed(tail, now);
            }
            _ => {}
        }
        while let Some(event) = session.poll_event() {
            match event {
                ConnEvent::Map { segment, .. } => {
                    let outcome = if script.byte().unwrap_or(0) % 8 == 0 {
                        Err(CloseReason::Local("refused".into()))
                    } else {
                        Ok(())
                    };
                    session.handle_mapped(segment, outcome);
                }
                ConnEvent::DrainSocket => {
                    for datagram in socket.drain(..) {
                        session.handle_datagram(&datagram, arrival(script.byte().unwrap_or(0)));
                    }
                    session.resume();
                }
                ConnEvent::Request { id, .. } => {
                    assert_eq!(role, Role::Server, "only a server is handed requests");
                    served.push(id);
                }
                ConnEvent::Reply { id, .. } | ConnEvent::Failed { id, .. } => {
                    assert!(taken.contains(&id), "an outcome for a request never taken");
                    assert!(answered.insert(id), "a second outcome for request {id}");
                }
                ConnEvent::Unmap { .. } | ConnEvent::Released { .. } | ConnEvent::Closed(_) => {}
            }
        }
        assert!(
            session.queued_bytes() <= bound,
            "queued bytes over the bound"
        );
        assert!(
            !(session.paused_for_unread() && session.wants_records()),
            "a server paused for its unread replies reads no requests"
        );
        assert!(
            session.in_flight() <= max_in_flight,
            "in flight over the bound"
        );
    }
    session.close(CloseReason::Shutdown);
    while let Some(event) = session.poll_event() {
        if let ConnEvent::Failed { id, .. } = event {
            assert!(answered.insert(id), "a second outcome for request {id}");
        }
    }
    assert!(
        taken.iter().all(|id| answered.contains(id)),
        "a request without an outcome after close"
    );
}

fn small_limits() -> Limits {
    Limits::builder()
        .max_wire_bytes(1 << 20)
        .max_metadata_bytes(1 << 12)
        .max_buffers(8)
        .build()
}

/// A well-formed message with fields from the script.
fn record(script: &mut Script<'_>) -> Vec<u8> {
    let id = u64::from(script.byte().unwrap_or(0) % 20);
    let control = match script.byte().unwrap_or(0) % 5 {
        0 => Control::Request {
            id,
            kind: kind(script.byte().unwrap_or(0)),
            path: "/actors/a".into(),
            body: body(script),
        },
        1 => Control::Reply {
            id,
            reply: reply(script),
        },
        2 => Control::Release {
            leases: vec![id, id + 1],
        },
        3 => Control::Retire { segment: id % 12 },
        _ => Control::Unmapped { segment: id % 4 },
    };
    encode(&control).unwrap_or_default()
}

fn body(script: &mut Script<'_>) -> Body {
    match script.byte().unwrap_or(0) % 3 {
        0 => Body::Inline(Bytes::copy_from_slice(script.take(8))),
        1 => Body::Packed(shared(script)),
        _ => Body::Parts {
            version: 1,
            metadata: Part::Inline(Bytes::new()),
            buffers: (0..script.byte().unwrap_or(0) % 10)
                .map(|_| Part::Shared(shared(script)))
                .collect(),
        },
    }
}

fn shared(script: &mut Script<'_>) -> Shared {
    Shared {
        segment: u64::from(script.byte().unwrap_or(0) % 12),
        offset: u64::from(script.byte().unwrap_or(0)) << 12,
        len: u64::from(script.byte().unwrap_or(0)) << 8,
        lease: u64::from(script.byte().unwrap_or(0)),
    }
}

fn reply(script: &mut Script<'_>) -> WireReply {
    match script.byte().unwrap_or(0) % 4 {
        0 => WireReply::Tensor(body(script)),
        1 => WireReply::Single {
            msg_type: "x".into(),
            data: Bytes::copy_from_slice(script.take(16)),
        },
        2 => WireReply::Ack,
        _ => WireReply::Error("no".into()),
    }
}

fn kind(byte: u8) -> RequestKind {
    if byte & 1 == 0 {
        RequestKind::Ask
    } else {
        RequestKind::Tell
    }
}

fn arrival(byte: u8) -> FdArrival {
    match byte % 4 {
        0 => FdArrival::Lost,
        1 => FdArrival::None,
        _ => FdArrival::Arrived,
    }
}

/// The script: bytes taken in order.
struct Script<'a>(&'a [u8]);

impl<'a> Script<'a> {
    fn byte(&mut self) -> Option<u8> {
        let (&first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(first)
    }

    fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_of_every_kind_run_without_breaking_an_invariant() {
        // A deterministic sweep standing in for the fuzzer in `cargo test`.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let len = usize::try_from(state % 512).unwrap_or(0);
            let script: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    u8::try_from(state & 0xff).unwrap_or(0)
                })
                .collect();
            shm_session(&script);
        }
    }
}
