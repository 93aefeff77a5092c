//! The per-peer connection pool, on every driver: idle connections above the cap are closed,
//! a request waiting for a connection leaves the queue as soon as its caller gives up, and the
//! requests waiting are bounded.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tensorwire_engine::{Error, Node, Reply};
use tensorwire_tests::*;

use super::conformance;

conformance!(
    pairs: [
        idle_connections_above_the_cap_are_closed_after_trim_after,
        a_queued_ask_leaves_the_queue_when_its_caller_gives_up,
        an_ask_beyond_the_waiting_bound_is_refused_as_overloaded,
    ],
    servers: [],
);

/// Waits (up to 5 s) until `gauge` of `node` reads `want`; the last reading.
fn settle(node: &Node, gauge: impl Fn(&Node) -> usize, want: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = gauge(node);
        if now == want || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A server whose `slow` endpoint takes `delay` per request, and counts them.
fn slow_server(drivers: Drivers, delay: Duration) -> (Node, Arc<AtomicUsize>) {
    let server = drivers.server().build().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&served);
    server
        .serve("slow", 4, move |request| {
            count.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(delay);
            Ok(Reply::Tensor(request.message))
        })
        .unwrap();
    (server, served)
}

fn idle_connections_above_the_cap_are_closed_after_trim_after(drivers: Drivers) {
    let (server, _) = slow_server(drivers, Duration::from_millis(200));
    let client = drivers
        .client()
        .cores(1)
        .idle_connections_per_peer(1)
        .idle_trim_after(Duration::from_millis(100))
        .build()
        .unwrap();
    let asks: Vec<_> = (0..4)
        .map(|i| client.ask(server.local_addr(), "slow", patterned(i, 1, 64), TIMEOUT))
        .collect();
    for ask in asks {
        ask.wait().unwrap();
    }
    let connections = |node: &Node| node.stats().gauges.connections;
    // Four at once needed four connections; three of them are above the cap of one.
    assert_eq!(
        settle(&client, connections, 1),
        1,
        "client connections left"
    );
    assert_eq!(
        settle(&server, connections, 1),
        1,
        "server connections left"
    );
    // The one kept still carries the next request.
    let reply = client.ask(server.local_addr(), "slow", patterned(9, 1, 64), TIMEOUT);
    assert_eq!(tensor(reply.wait().unwrap()), patterned(9, 1, 64));
    assert_eq!(connections(&server), 1, "the kept connection was reused");
}

fn a_queued_ask_leaves_the_queue_when_its_caller_gives_up(drivers: Drivers) {
    let (server, served) = slow_server(drivers, Duration::from_millis(600));
    let client = drivers
        .client()
        .cores(1)
        .max_connections_per_peer(1)
        .build()
        .unwrap();
    let first = client.ask(server.local_addr(), "slow", patterned(1, 1, 64), TIMEOUT);
    let waiting = |node: &Node| node.stats().gauges.waiting;
    let queued = client.ask(server.local_addr(), "slow", patterned(2, 1, 64), TIMEOUT);
    assert_eq!(settle(&client, waiting, 1), 1, "the second ask waits");
    drop(queued);
    // Gone from the queue long before the connection frees up (600 ms) or its deadline.
    let started = Instant::now();
    assert_eq!(
        settle(&client, waiting, 0),
        0,
        "the dropped ask still waits"
    );
    assert!(started.elapsed() < Duration::from_millis(400));
    assert_eq!(tensor(first.wait().unwrap()), patterned(1, 1, 64));
    let third = client.ask(server.local_addr(), "slow", patterned(3, 1, 64), TIMEOUT);
    assert_eq!(tensor(third.wait().unwrap()), patterned(3, 1, 64));
    assert_eq!(
        served.load(Ordering::SeqCst),
        2,
        "the dropped ask never ran"
    );
}

fn an_ask_beyond_the_waiting_bound_is_refused_as_overloaded(drivers: Drivers) {
    let (server, served) = slow_server(drivers, Duration::from_millis(300));
    let client = drivers
        .client()
        .cores(1)
        .max_connections_per_peer(1)
        .max_waiting_requests(2)
        .build()
        .unwrap();
    let ask = |i| client.ask(server.local_addr(), "slow", patterned(i, 1, 64), TIMEOUT);
    let carried = ask(0);
    let waiting = |node: &Node| node.stats().gauges.waiting;
    let queued = [ask(1), ask(2)];
    assert_eq!(settle(&client, waiting, 2), 2, "two asks wait");
    let refused = ask(3).wait().expect_err("a third waiter was accepted");
    assert!(
        matches!(refused, Error::Overloaded { capacity: 2, .. }) && refused.is_limit(),
        "{refused:?}"
    );
    // Nothing else is disturbed: the carried and the waiting asks are answered, in order.
    assert_eq!(tensor(carried.wait().unwrap()), patterned(0, 1, 64));
    for (version, ask) in (1..).zip(queued) {
        assert_eq!(tensor(ask.wait().unwrap()), patterned(version, 1, 64));
    }
    assert_eq!(
        served.load(Ordering::SeqCst),
        3,
        "the refused ask never ran"
    );
    assert_eq!(tensor(ask(4).wait().unwrap()), patterned(4, 1, 64));
}
