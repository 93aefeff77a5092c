//! Striping across hosts, where one flow is capped (`Testbed::limit_rate_per_flow`: an `htb`
//! class per connection, as per-flow hashing or shaping caps one flow in a datacenter): a
//! large ask cut into 4 stripes travels on 4 connections, each capped on its own, and arrives
//! intact. The speed-up over one connection is printed here (a report, not an assertion); the
//! benchmark that holds it to ≥ 3.5× is `ptr1-bench suite --netns --flow-rate RATE`
//! (docs/benchmarks.md, "Striping").

use std::time::{Duration, Instant};

use tensorwire_proto::stats;
use tensorwire_tests::Driver;
use tensorwire_tests::across::{Deliveries, start_node, start_server};
use tensorwire_tests::netns::Testbed;

use super::{LONG, across, ask_digest};

across!(a_striped_ask_under_a_per_flow_cap_travels_on_four_connections_and_arrives_intact);

/// Each connection's cap, both ways.
const FLOW_RATE: &str = "200mbit";
const FLOW_MBIT: f64 = 200.0;
/// Bytes of each ask: 16 MiB in one buffer.
const ASK_BYTES: usize = 16 << 20;
/// Asks timed per client.
const ASKS: u32 = 3;

fn a_striped_ask_under_a_per_flow_cap_travels_on_four_connections_and_arrives_intact(
    driver: Driver,
) {
    let bed = Testbed::new(2);
    bed.limit_rate_per_flow(bed.host(1), FLOW_RATE);
    let deliveries = Deliveries::default();
    let server = start_server(bed.host(0), driver, None, &deliveries, |b| b);
    let peer = bed.host(0).addr(server.local_addr().port());
    let one = start_node(bed.host(1), driver, None, |b| b);
    let striping = start_node(bed.host(1), driver, None, |b| {
        b.stripes(4).stripe_threshold(1 << 20)
    });
    let (one_flow, striped, stripes_sent, connections) = bed.host(1).enter(|| {
        let timed = |node: &tensorwire_engine::Node, first: u32| -> Duration {
            let started = Instant::now();
            for id in first..first + ASKS {
                ask_digest(node, peer, id, 1, ASK_BYTES, LONG).expect("a 16 MiB ask");
            }
            started.elapsed()
        };
        // Warm: the connection is open.
        ask_digest(&one, peer, 1, 1, 1 << 20, LONG).expect("a warm-up ask");
        let one_flow = timed(&one, 100);
        let accepted_before = stats::global().snapshot().raw_connections_accepted;
        // Warm: the striping client learns the server takes stripes, its connections open.
        ask_digest(&striping, peer, 2, 1, 4 << 20, LONG).expect("a striped warm-up ask");
        let before = stats::global().snapshot();
        let striped = timed(&striping, 200);
        let after = stats::global().snapshot();
        (
            one_flow,
            striped,
            after.stripes_sent - before.stripes_sent,
            after.raw_connections_accepted - accepted_before,
        )
    });
    let mbit = |took: Duration| f64::from(ASKS) * ASK_BYTES as f64 * 8.0 / 1e6 / took.as_secs_f64();
    let (one_mbit, striped_mbit) = (mbit(one_flow), mbit(striped));
    println!(
        "{} asks of 16 MiB, {FLOW_RATE} per flow ({}): one connection {one_mbit:.0} Mbit/s, \
         4 stripes {striped_mbit:.0} Mbit/s = {:.2}× (the benchmark: ptr1-bench suite --netns \
         --flow-rate)",
        ASKS,
        driver.name(),
        striped_mbit / one_mbit
    );
    assert!(
        one_mbit < FLOW_MBIT * 1.1,
        "one connection is held to its class's rate ({one_mbit:.0} Mbit/s)"
    );
    assert_eq!(
        stripes_sent,
        u64::from(ASKS) * 4,
        "every timed ask went as 4 stripes"
    );
    assert!(
        connections >= 4,
        "the stripes travelled on connections of their own ({connections} accepted)"
    );
    for id in (100..100 + ASKS).chain(200..200 + ASKS).chain([1, 2]) {
        assert_eq!(deliveries.of(id), 1, "ask {id} was delivered once");
    }
}
