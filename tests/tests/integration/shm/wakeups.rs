//! Wake-ups on the same-host path: a side that sleeps is rung by its peer for every message it
//! must read, whether or not the threads involved spin first.

use std::time::{Duration, Instant};

use tensorwire_engine::{Destination, Node, NodeBuilder, Preference, Reply, Route, Via};
use tensorwire_tests::*;

/// The driver's periodic look (`TICK` in `engine/src/shm/transport/driver.rs`) is 500 ms: an
/// answer that took longer than half of it was found by that look, not rung for.
const RUNG_WITHIN: Duration = Duration::from_millis(250);

/// A node on shared memory that never spins: every message it reads, it was woken for (the
/// default where a process may use a single CPU).
fn sleeper() -> NodeBuilder {
    Node::builder(any_local_address())
        .in_process_delivery(false)
        .shared_memory(true)
        .preference(Preference::SharedMemory)
        .shm_spin(Duration::ZERO)
}

#[test]
fn blocking_asks_without_a_spin_window_are_rung_for_never_left_to_the_periodic_look() {
    let _serial = serial();
    let slowest = slowest_of_twenty_asks(sleeper(), sleeper());
    assert!(
        slowest < RUNG_WITHIN,
        "an answer waited {slowest:?}: a wake-up was lost and the periodic look found it"
    );
}

#[test]
fn a_spinning_client_and_a_sleeping_server_answer_every_blocking_ask_at_once() {
    let _serial = serial();
    let client = sleeper().shm_spin(Duration::from_micros(100));
    let slowest = slowest_of_twenty_asks(sleeper(), client);
    assert!(
        slowest < RUNG_WITHIN,
        "an answer waited {slowest:?}: a wake-up was lost and the periodic look found it"
    );
}

#[test]
fn an_ask_the_driver_reads_after_blocking_asks_that_left_the_peer_untold_is_rung_for() {
    // A caller that read its own reply leaves the peer untold to ring when nothing more is
    // waited for (`Conn::caller_done`); an ask whose reply the sleeping driver must read then
    // has to tell the peer again, or its answer waits for the periodic look.
    let _serial = serial();
    let spinning = || sleeper().shm_spin(Duration::from_micros(100));
    let (_server, client, to) = echo_pair(spinning(), spinning());
    let mut slowest = Duration::ZERO;
    for round in 0..10u32 {
        let message = patterned(round, 1, 4096);
        let (reply, route) = client
            .ask_blocking_to(&to, message.clone(), TIMEOUT, None)
            .unwrap();
        assert_eq!(route, Route::SharedMemory, "round {round}");
        assert_eq!(tensor(reply), message, "round {round}");
        // Past both spin windows: the client's driver sleeps, the connection untold.
        std::thread::sleep(Duration::from_millis(5));
        let started = Instant::now();
        let reply = client.ask_to(&to, message.clone(), TIMEOUT).wait().unwrap();
        slowest = slowest.max(started.elapsed());
        assert_eq!(tensor(reply), message, "round {round}");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        slowest < RUNG_WITHIN,
        "an answer the driver reads waited {slowest:?}: the peer was not told to ring"
    );
}

/// Twenty blocking asks from a `client` node to an echo on a `server` node, a pause between
/// them so both sides go back to sleep: the longest one took.
fn slowest_of_twenty_asks(server: NodeBuilder, client: NodeBuilder) -> Duration {
    let (_server, client, to) = echo_pair(server, client);
    let mut slowest = Duration::ZERO;
    for round in 0..20u32 {
        let message = patterned(round, 2, 4096);
        let started = Instant::now();
        let (reply, route) = client
            .ask_blocking_to(&to, message.clone(), TIMEOUT, None)
            .unwrap();
        slowest = slowest.max(started.elapsed());
        assert_eq!(route, Route::SharedMemory, "round {round}");
        assert_eq!(tensor(reply), message, "round {round}");
        std::thread::sleep(Duration::from_millis(2));
    }
    slowest
}

/// A `server` node with an echo, a `client` node, and the echo as the client reaches it.
fn echo_pair(server: NodeBuilder, client: NodeBuilder) -> (Node, Node, Destination) {
    let server = server.build().unwrap();
    server
        .serve("echo", 1, |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    let client = client.build().unwrap();
    let to = client
        .destination(server.local_addr(), "echo", Via::Preferred)
        .unwrap();
    (server, client, to)
}
