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
