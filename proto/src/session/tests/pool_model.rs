//! The pool driven as a driver drives it, by random scripts, against a model of what each
//! connection carries: no request is lost or handed out twice, a connection is reused idle
//! only when it carries nothing, pipelining never goes past the peer's depth, and the pool's
//! count of what each peer's connections carry is the model's.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use crate::session::{Checkin, Checkout, ConnectionPool, ConnectionPoolConfig};

/// What a script does next.
#[derive(Clone, Debug)]
enum Step {
    /// A request to peer `peer % 2` (the first takes one request per connection at a time,
    /// the second 4), small or large.
    Send { peer: u8, large: bool },
    /// The oldest request on the `pick`-th busy connection is answered.
    Answer { pick: u8 },
    /// The `pick`-th connection breaks.
    Break { pick: u8 },
    /// The requests handed to busy connections are started on them (a driver that starts
    /// them later, as the io_uring core does from its backlog).
    Run,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (any::<u8>(), any::<bool>()).prop_map(|(peer, large)| Step::Send { peer, large }),
        4 => any::<u8>().prop_map(|pick| Step::Answer { pick }),
        1 => any::<u8>().prop_map(|pick| Step::Break { pick }),
        2 => Just(Step::Run),
    ]
}

/// A request: its number, its peer's depth.
type Request = (u32, u16);

/// The driver's side: each open connection's peer and the requests it carries, in order.
#[derive(Default)]
struct Model {
    conns: BTreeMap<u32, (SocketAddr, Vec<Request>)>,
    idle: BTreeSet<u32>,
    next_conn: u32,
    /// Requests answered or refused, by number.
    finished: BTreeSet<u32>,
    /// Requests handed to a busy connection, not started on it yet.
    backlog: Vec<(SocketAddr, u32, Request)>,
}

impl Model {
    /// The pool handed `request` to `conn` (`None`: a new one).
    fn carry(
        &mut self,
        peer: SocketAddr,
        conn: Option<u32>,
        request: Request,
        bytes: u64,
        sut: &mut ConnectionPool<u32, Request>,
    ) {
        let conn = match conn {
            Some(conn) => conn,
            None => {
                let conn = self.next_conn;
                self.next_conn += 1;
                self.conns.insert(conn, (peer, Vec::new()));
                sut.opened(peer, conn, bytes);
                conn
            }
        };
        assert!(
            !self.idle.contains(&conn),
            "an idle connection was handed a request without a checkout"
        );
        let (_, carried) = self.conns.get_mut(&conn).expect("an open connection");
        carried.push(request);
        assert!(
            carried.len() <= usize::from(request.1.max(1)),
            "{} requests on a connection to a peer of depth {}",
            carried.len(),
            request.1
        );
    }
}

fn peer_of(n: u8) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7000 + u16::from(n % 2)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_pool_keeps_the_model_s_counts_and_loses_nothing(steps in prop::collection::vec(step(), 1..200)) {
        let mut sut: ConnectionPool<u32, Request> = ConnectionPool::new(ConnectionPoolConfig {
            max_per_peer: 2,
            idle_per_peer: 2,
            max_waiting: 1_000,
            pipeline_connections: 1,
            busy_bytes_per_peer: 1 << 20,
            trim_after: Duration::from_secs(1),
        });
        let mut model = Model::default();
        let now = Instant::now();
        let mut sent = 0u32;
        for step in steps {
            match step {
                Step::Send { peer, large } => {
                    let depth = if peer % 2 == 0 { 1 } else { 4 };
                    let (peer, bytes) = (peer_of(peer), if large { 512 << 10 } else { 4096 });
                    let request = (sent, depth);
                    sent += 1;
                    match sut.checkout_pipelined(peer, request, bytes, None, depth) {
                        Checkout::Reuse(conn, r) => {
                            prop_assert!(model.idle.remove(&conn), "reused a connection that was not idle");
                            model.carry(peer, Some(conn), r, bytes, &mut sut);
                        }
                        Checkout::Pipeline(conn, r) => model.carry(peer, Some(conn), r, bytes, &mut sut),
                        Checkout::Connect(r) => model.carry(peer, None, r, bytes, &mut sut),
                        Checkout::Queued(_) => {}
                        Checkout::Full(r) => { model.finished.insert(r.0); }
                    }
                }
                Step::Answer { pick } => {
                    let busy: Vec<u32> = model.conns.iter().filter(|(_, (_, c))| !c.is_empty()).map(|(k, _)| *k).collect();
                    if busy.is_empty() { continue; }
                    let conn = busy[usize::from(pick) % busy.len()];
                    let (peer, carried) = model.conns.get_mut(&conn).expect("open");
                    let peer = *peer;
                    let done = carried.remove(0);
                    prop_assert!(model.finished.insert(done.0), "request {} answered twice", done.0);
                    if let Some(next) = sut.answered(peer, conn) {
                        model.backlog.push((peer, conn, next));
                    }
                    let pending = model.backlog.iter().any(|&(_, c, _)| c == conn);
                    if model.conns[&conn].1.is_empty() {
                        match sut.checkin(peer, conn, now) {
                            Checkin::Serve(c, next) => { prop_assert_eq!(c, conn); model.backlog.push((peer, conn, next)); }
                            Checkin::Idle => { prop_assert!(!pending, "checked in idle with a request handed to it"); model.idle.insert(conn); }
                            Checkin::Carrying => prop_assert!(pending, "the pool thinks an empty connection carries"),
                        }
                    }
                }
                Step::Break { pick } => {
                    let keys: Vec<u32> = model.conns.keys().copied().collect();
                    if keys.is_empty() { continue; }
                    let conn = keys[usize::from(pick) % keys.len()];
                    let (peer, carried) = model.conns.remove(&conn).expect("open");
                    model.idle.remove(&conn);
                    for r in carried { model.finished.insert(r.0); }
                    if let Some(next) = sut.closed(peer, conn) {
                        model.carry(peer, None, next, 4096, &mut sut);
                    }
                }
                Step::Run => {
                    for (peer, conn, request) in std::mem::take(&mut model.backlog) {
                        if model.conns.contains_key(&conn) {
                            model.carry(peer, Some(conn), request, 4096, &mut sut);
                        } else {
                            // Its connection broke meanwhile: the request goes through the
                            // pool again (it never left).
                            match sut.checkout_pipelined(peer, request, 4096, None, request.1) {
                                Checkout::Reuse(c, r) => { prop_assert!(model.idle.remove(&c)); model.carry(peer, Some(c), r, 4096, &mut sut); }
                                Checkout::Pipeline(c, r) => model.carry(peer, Some(c), r, 4096, &mut sut),
                                Checkout::Connect(r) => model.carry(peer, None, r, 4096, &mut sut),
                                Checkout::Queued(_) => {}
                                Checkout::Full(r) => { model.finished.insert(r.0); }
                            }
                        }
                    }
                }
            }
            for n in 0..2u8 {
                let peer = peer_of(n);
                let carried: usize = model.conns.values().filter(|(p, _)| *p == peer).map(|(_, c)| c.len()).sum();
                let handed = model.backlog.iter().filter(|&&(p, c, _)| p == peer && model.conns.contains_key(&c)).count();
                prop_assert_eq!(sut.carried(peer), carried + handed, "what the pool counts on {}", peer);
            }
        }
        // Everything still carried or waiting is accounted for: answered, refused, on a
        // connection, or in the queue.
        let carried: usize = model.conns.values().map(|(_, c)| c.len()).sum();
        let handed = model.backlog.len();
        prop_assert_eq!(model.finished.len() + carried + handed + sut.waiting(), sent as usize);
    }
}
