use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::session::{Checkin, Checkout, ConnectionPool, ConnectionPoolConfig};

fn peer(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn pool(idle: usize, max: usize) -> ConnectionPool<u32, &'static str> {
    let config = ConnectionPoolConfig {
        idle_per_peer: idle,
        max_per_peer: max,
        trim_after: Duration::from_secs(1),
        ..ConnectionPoolConfig::default()
    };
    ConnectionPool::new(config)
}

#[test]
fn the_most_recently_used_idle_connection_is_reused_first() {
    let mut sut = pool(8, 32);
    let now = Instant::now();
    assert_eq!(sut.checkout(peer(1), "a", 1, None), Checkout::Connect("a"));
    assert_eq!(sut.checkout(peer(1), "b", 1, None), Checkout::Connect("b"));
    assert_eq!(sut.checkin(peer(1), 10, now), Checkin::Idle);
    assert_eq!(sut.checkin(peer(1), 11, now), Checkin::Idle);
    assert_eq!(
        sut.checkout(peer(1), "c", 1, None),
        Checkout::Reuse(11, "c")
    );
    assert_eq!(
        sut.checkout(peer(1), "d", 1, None),
        Checkout::Reuse(10, "d")
    );
}

#[test]
fn requests_beyond_the_cap_wait_in_order_for_a_free_connection() {
    let mut sut = pool(8, 1);
    let now = Instant::now();
    assert_eq!(sut.checkout(peer(1), "a", 1, None), Checkout::Connect("a"));
    assert!(matches!(
        sut.checkout(peer(1), "b", 1, None),
        Checkout::Queued(_)
    ));
    assert!(matches!(
        sut.checkout(peer(1), "c", 1, None),
        Checkout::Queued(_)
    ));
    assert_eq!(sut.checkin(peer(1), 7, now), Checkin::Serve(7, "b"));
    // The connection breaks: the next waiter opens a new one.
    assert_eq!(sut.closed(peer(1), 7), Some("c"));
    assert_eq!(sut.waiting(), 0);
    // Other peers are not limited by this one.
    assert_eq!(sut.checkout(peer(2), "x", 1, None), Checkout::Connect("x"));
}

#[test]
fn large_requests_spread_over_fewer_connections_than_small_ones() {
    const MIB: u64 = 1 << 20;
    let config = ConnectionPoolConfig {
        max_per_peer: 32,
        busy_bytes_per_peer: 2 * MIB,
        ..ConnectionPoolConfig::default()
    };
    let mut sut: ConnectionPool<u32, &str> = ConnectionPool::new(config);
    let now = Instant::now();
    // 1 MiB asks: two at once, the third waits for one of them.
    assert_eq!(
        sut.checkout(peer(1), "a", MIB, None),
        Checkout::Connect("a")
    );
    assert_eq!(
        sut.checkout(peer(1), "b", MIB, None),
        Checkout::Connect("b")
    );
    assert!(matches!(
        sut.checkout(peer(1), "c", MIB, None),
        Checkout::Queued(_)
    ));
    assert_eq!(sut.checkin(peer(1), 1, now), Checkin::Serve(1, "c"));
    assert_eq!(sut.answered(peer(1), 1), None, "\"c\" is answered");
    assert_eq!(sut.checkin(peer(1), 1, now), Checkin::Idle);
    // One 64 MiB ask at a time, though a connection is idle; one larger than the whole budget
    // still goes when nothing else is on its way.
    assert!(matches!(
        sut.checkout(peer(1), "big", 64 * MIB, None),
        Checkout::Queued(_)
    ));
    assert_eq!(sut.checkin(peer(1), 2, now), Checkin::Serve(2, "big"));
    // Small requests beside it use the idle connection and new ones, up to the cap.
    assert_eq!(
        sut.checkout(peer(1), "s0", 4096, None),
        Checkout::Reuse(1, "s0")
    );
    for n in 2..32 {
        assert_eq!(
            sut.checkout(peer(1), "s", 4096, None),
            Checkout::Connect("s"),
            "connection {n}"
        );
    }
    assert!(matches!(
        sut.checkout(peer(1), "s32", 4096, None),
        Checkout::Queued(_)
    ));
    // The budget is per peer.
    assert_eq!(
        sut.checkout(peer(2), "x", 64 * MIB, None),
        Checkout::Connect("x")
    );
}

#[test]
fn a_closed_idle_connection_does_not_let_a_large_waiting_request_past_the_budget() {
    const MIB: u64 = 1 << 20;
    let config = ConnectionPoolConfig {
        idle_per_peer: 8,
        max_per_peer: 32,
        busy_bytes_per_peer: 2 * MIB,
        ..ConnectionPoolConfig::default()
    };
    let mut sut: ConnectionPool<u32, &str> = ConnectionPool::new(config);
    let now = Instant::now();
    // Three small requests; two finish and leave their connections idle.
    for name in ["s1", "s2", "s3"] {
        assert_eq!(
            sut.checkout(peer(1), name, 4096, None),
            Checkout::Connect(name)
        );
    }
    assert_eq!(sut.checkin(peer(1), 1, now), Checkin::Idle);
    assert_eq!(sut.checkin(peer(1), 2, now), Checkin::Idle);
    // A 64 MiB request waits while one connection is busy, idle ones notwithstanding.
    assert!(matches!(
        sut.checkout(peer(1), "big", 64 * MIB, None),
        Checkout::Queued(_)
    ));
    // An idle connection closes (trimmed, or by the peer): no new connection for it yet.
    assert_eq!(sut.closed(peer(1), 1), None);
    assert_eq!(sut.waiting(), 1);
    // The busy one finishes: the waiting request takes it.
    assert_eq!(sut.checkin(peer(1), 3, now), Checkin::Serve(3, "big"));
    // The busy connection breaks instead: the waiter then opens a new one.
    assert!(matches!(
        sut.checkout(peer(1), "big2", 64 * MIB, None),
        Checkout::Queued(_)
    ));
    assert_eq!(sut.closed(peer(1), 3), Some("big2"));
}

#[test]
fn requests_beyond_the_waiting_bound_are_refused_over_all_peers() {
    let config = ConnectionPoolConfig {
        max_per_peer: 1,
        max_waiting: 2,
        ..ConnectionPoolConfig::default()
    };
    let mut sut: ConnectionPool<u32, &str> = ConnectionPool::new(config);
    let now = Instant::now();
    assert_eq!(sut.checkout(peer(1), "a", 1, None), Checkout::Connect("a"));
    assert_eq!(sut.checkout(peer(2), "x", 1, None), Checkout::Connect("x"));
    assert!(matches!(
        sut.checkout(peer(1), "b", 1, None),
        Checkout::Queued(_)
    ));
    assert!(matches!(
        sut.checkout(peer(2), "y", 1, None),
        Checkout::Queued(_)
    ));
    assert_eq!(sut.checkout(peer(1), "c", 1, None), Checkout::Full("c"));
    assert_eq!(sut.checkout(peer(2), "z", 1, None), Checkout::Full("z"));
    assert_eq!(sut.waiting(), 2);
    // A free connection is still handed out, and a waiter leaving makes room again.
    assert_eq!(sut.checkout(peer(3), "n", 1, None), Checkout::Connect("n"));
    assert_eq!(sut.checkin(peer(1), 7, now), Checkin::Serve(7, "b"));
    assert!(matches!(
        sut.checkout(peer(1), "d", 1, None),
        Checkout::Queued(_)
    ));
}

#[test]
fn a_waiting_request_expires_at_its_deadline_and_a_cancelled_one_is_handed_back() {
    let mut sut = pool(8, 1);
    let now = Instant::now();
    sut.checkout(peer(1), "a", 1, None);
    let Checkout::Queued(_) = sut.checkout(peer(1), "b", 1, Some(now + Duration::from_secs(2)))
    else {
        panic!("not queued");
    };
    let Checkout::Queued(c) = sut.checkout(peer(1), "c", 1, None) else {
        panic!("not queued");
    };
    assert_eq!(sut.poll_timeout(), Some(now + Duration::from_secs(2)));
    assert!(
        sut.handle_timeout(now + Duration::from_secs(1))
            .requests
            .is_empty()
    );
    assert_eq!(
        sut.handle_timeout(now + Duration::from_secs(2)).requests,
        vec!["b"]
    );
    assert_eq!(sut.cancel(c), Some("c"));
    assert_eq!(sut.cancel(c), None, "only once");
    assert_eq!(sut.checkin(peer(1), 1, now), Checkin::Idle);
}

#[test]
fn idle_connections_above_the_cap_are_trimmed_after_the_delay() {
    let mut sut = pool(1, 32);
    let now = Instant::now();
    for _ in 0..3 {
        assert_eq!(sut.checkout(peer(1), "r", 1, None), Checkout::Connect("r"));
    }
    for conn in 0..3 {
        assert_eq!(sut.checkin(peer(1), conn, now), Checkin::Idle);
    }
    assert_eq!(sut.idle(), 3);
    let at = sut.poll_timeout().unwrap();
    assert_eq!(at, now + Duration::from_secs(1));
    let expired = sut.handle_timeout(at);
    assert_eq!(
        expired.trimmed,
        vec![0, 1],
        "the least recently used go first"
    );
    assert_eq!(sut.idle(), 1);
    assert_eq!(sut.poll_timeout(), None);
}

#[test]
fn a_peer_without_connections_or_waiters_leaves_the_map() {
    let mut sut = pool(8, 32);
    let now = Instant::now();
    for port in 0..1000 {
        assert_eq!(
            sut.checkout(peer(port), "r", 1, None),
            Checkout::Connect("r")
        );
        assert_eq!(sut.closed(peer(port), 1), None);
    }
    assert_eq!(sut.peers(), 0);
    sut.checkout(peer(5), "r", 1, None);
    sut.checkin(peer(5), 9, now);
    assert_eq!(sut.peers(), 1);
    sut.closed(peer(5), 9);
    assert_eq!((sut.peers(), sut.idle()), (0, 0));
}

#[test]
fn draining_hands_back_every_waiter_and_idle_connection() {
    let mut sut = pool(8, 1);
    let now = Instant::now();
    sut.checkout(peer(1), "a", 1, None);
    sut.checkout(peer(1), "b", 1, Some(now + Duration::from_secs(9)));
    sut.checkout(peer(2), "c", 1, None);
    sut.checkin(peer(2), 5, now);
    let (requests, idle) = sut.drain();
    assert_eq!((requests, idle), (vec!["b"], vec![5]));
    assert_eq!(sut.poll_timeout(), None);
}

/// A pool whose peers have 4 connections before requests are pipelined.
fn pipelining_pool(max: usize) -> ConnectionPool<u32, u32> {
    ConnectionPool::new(ConnectionPoolConfig {
        max_per_peer: max,
        pipeline_connections: 4,
        ..ConnectionPoolConfig::default()
    })
}

#[test]
fn small_requests_to_a_pipelining_peer_spread_over_a_few_connections_then_pipeline() {
    let mut sut = pipelining_pool(32);
    let p = peer(1);
    for n in 0..4 {
        assert_eq!(
            sut.checkout_pipelined(p, n, 4096, None, 3),
            Checkout::Connect(n)
        );
        sut.opened(p, 100 + n, 4096);
    }
    // Four connections open: the next go onto the one carrying fewest, round the four.
    let mut onto = Vec::new();
    for n in 4..12 {
        match sut.checkout_pipelined(p, n, 4096, None, 3) {
            Checkout::Pipeline(conn, request) => {
                assert_eq!(request, n);
                onto.push(conn);
            }
            other => panic!("request {n}: {other:?}"),
        }
    }
    onto.sort_unstable();
    assert_eq!(onto, vec![100, 100, 101, 101, 102, 102, 103, 103]);
    assert_eq!(sut.carried(p), 12);
    // Every connection carries its peer's depth: a new one is opened.
    assert_eq!(
        sut.checkout_pipelined(p, 12, 4096, None, 3),
        Checkout::Connect(12)
    );
}

#[test]
fn large_requests_and_peers_that_do_not_pipeline_get_connections_of_their_own() {
    let mut sut = pipelining_pool(32);
    let p = peer(1);
    for n in 0..6 {
        assert_eq!(sut.checkout(p, n, 4096, None), Checkout::Connect(n));
        sut.opened(p, 100 + n, 4096);
    }
    let large = crate::session::MAX_PIPELINED_BYTES + 1;
    assert_eq!(
        sut.checkout_pipelined(p, 6, large, None, 64),
        Checkout::Connect(6)
    );
}

#[test]
fn at_the_cap_a_waiting_request_is_pipelined_onto_a_connection_with_room() {
    let mut sut = pipelining_pool(1);
    let p = peer(1);
    let now = Instant::now();
    assert_eq!(
        sut.checkout_pipelined(p, 0, 10, None, 2),
        Checkout::Connect(0)
    );
    sut.opened(p, 7, 10);
    assert_eq!(
        sut.checkout_pipelined(p, 1, 10, None, 2),
        Checkout::Pipeline(7, 1)
    );
    assert!(matches!(
        sut.checkout_pipelined(p, 2, 10, None, 2),
        Checkout::Queued(_)
    ));
    // The first is answered: the waiting one takes its place on the connection.
    assert_eq!(sut.answered(p, 7), Some(2));
    assert_eq!(sut.carried(p), 2);
    assert_eq!(sut.answered(p, 7), None);
    assert_eq!(
        sut.checkin(p, 7, now),
        Checkin::Carrying,
        "one is still on its way"
    );
    assert_eq!(sut.answered(p, 7), None);
    assert_eq!(sut.checkin(p, 7, now), Checkin::Idle);
    assert_eq!(sut.carried(p), 0);
    assert_eq!(sut.closed(p, 7), None);
}

#[test]
fn once_a_peer_pipelines_requests_gather_on_its_longest_busy_connections() {
    let mut sut = pipelining_pool(32);
    let p = peer(1);
    let now = Instant::now();
    // Eight connections opened one request each, before the peer's depth was known.
    for n in 0..8 {
        assert_eq!(sut.checkout(p, n, 4096, None), Checkout::Connect(n));
        sut.opened(p, 100 + n, 4096);
    }
    // Two of them finish: idle.
    for conn in [106, 107] {
        assert_eq!(sut.answered(p, conn), None);
        assert_eq!(sut.checkin(p, conn, now), Checkin::Idle);
    }
    // Now known to pipeline: requests go onto the four longest busy, not the idle ones.
    for n in 8..16 {
        match sut.checkout_pipelined(p, n, 4096, None, 3) {
            Checkout::Pipeline(conn, _) => assert!((100..104).contains(&conn), "{conn}"),
            other => panic!("request {n}: {other:?}"),
        }
    }
    // They are full (3 each): the idle ones are used next.
    assert!(matches!(
        sut.checkout_pipelined(p, 16, 4096, None, 3),
        Checkout::Reuse(107, 16)
    ));
}

#[test]
fn a_small_request_is_not_pipelined_behind_a_large_one() {
    let mut sut = pipelining_pool(32);
    let p = peer(1);
    let large = crate::session::MAX_PIPELINED_BYTES * 2;
    for n in 0..4 {
        assert_eq!(
            sut.checkout_pipelined(p, n, large, None, 8),
            Checkout::Connect(n)
        );
        sut.opened(p, 100 + n, large);
    }
    assert_eq!(
        sut.checkout_pipelined(p, 4, 100, None, 8),
        Checkout::Connect(4),
        "every busy connection carries a large request"
    );
    sut.opened(p, 104, 100);
    for n in 5..8 {
        assert_eq!(
            sut.checkout_pipelined(p, n, 100, None, 8),
            Checkout::Pipeline(104, n)
        );
    }
}
