//! Random loss of wire-sized frames on the client's link (nftables `numgen random` on the
//! bridge, both directions): TCP retransmits, every ask is answered correctly and delivered
//! once.

use std::time::Instant;

use tensorwire_tests::Driver;
use tensorwire_tests::across::{Deliveries, start_node, start_server};
use tensorwire_tests::http2::Wire;
use tensorwire_tests::netns::Testbed;

use super::over_http2;
use super::{LONG, across, check_digest, message, percentiles};

across!(
    asks_survive_a_tenth_of_a_percent_loss,
    asks_survive_one_percent_loss
);

fn asks_survive_a_tenth_of_a_percent_loss(driver: Driver) {
    thousand_mixed_asks_under_loss(driver, 1, None);
}

fn asks_survive_one_percent_loss(driver: Driver) {
    thousand_mixed_asks_under_loss(driver, 10, None);
}

over_http2!(|driver, wires| thousand_mixed_asks_under_loss(driver, 10, wires) => h2c_asks_survive_one_percent_loss, tls_asks_survive_one_percent_loss);

/// The sizes of the 1,000 asks: mostly 4 KiB to 256 KiB, every tenth 1 to 16 MiB, with 1 to
/// 16 buffers (about 0.7 GB in all).
fn shape(i: u32) -> (usize, usize) {
    let mut x = u64::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    x ^= x >> 29;
    let pick = |x: u64, n: u64| usize::try_from(x % n).expect("small");
    let count = 1 + pick(x >> 8, 16);
    let bytes = if i % 10 == 9 {
        (1 << 20) << pick(x >> 16, 5)
    } else {
        (4 << 10) << pick(x >> 16, 7)
    };
    (count, (bytes / count).max(1))
}

/// 1,000 asks, 8 in flight, while `per_mille` of the frames on the client's link are dropped;
/// over PTR1, or over HTTP/2 with the (server, client) wires.
fn thousand_mixed_asks_under_loss(driver: Driver, per_mille: u32, http2: Option<(&Wire, &Wire)>) {
    let bed = Testbed::new(2);
    let deliveries = Deliveries::default();
    let (server_wire, client_wire) = http2.unzip();
    let server = start_server(bed.host(0), driver, server_wire, &deliveries, |b| b);
    let peer = bed.host(0).addr(server.local_addr().port());
    let client = start_node(bed.host(1), driver, client_wire, |b| b);
    let path = match client_wire {
        Some(Wire::H2c | Wire::H2cKeepAlive(_)) => "h2c",
        Some(Wire::Tls(_)) => "TLS",
        None => driver.name(),
    };
    bed.drop_randomly(bed.host(1), per_mille);
    let mut latencies = Vec::with_capacity(1000);
    let started = Instant::now();
    bed.host(1).enter(|| {
        let mut window = std::collections::VecDeque::new();
        let mut finish = |(id, want, sent, pending): (
            u32,
            u64,
            Instant,
            tensorwire_engine::Pending<tensorwire_engine::Reply>,
        )| {
            let reply = pending
                .wait()
                .unwrap_or_else(|e| panic!("ask {id} at {per_mille}‰ loss failed: {e}"));
            latencies.push(Instant::now().duration_since(sent));
            check_digest(&reply, id, want);
        };
        for id in 0..1000u32 {
            let (count, len) = shape(id);
            let request = message(id, count, len);
            let want = tensorwire_tests::checksum(&request);
            let pending = client.ask(peer, "digest", request, LONG);
            window.push_back((id, want, Instant::now(), pending));
            if window.len() == 8 {
                finish(window.pop_front().expect("a full window"));
            }
        }
        window.into_iter().for_each(&mut finish);
    });
    let took = started.elapsed();
    let dropped = bed.dropped_frames(bed.host(1));
    bed.clear_loss(bed.host(1));
    assert!(dropped > 0, "the loss was in force");
    if http2.is_some() {
        assert!(
            client.stats().transport_connections >= 1,
            "HTTP/2 carried the asks"
        );
    }
    assert_eq!(deliveries.distinct(), 1000, "every ask was delivered");
    assert_eq!(
        deliveries.duplicates(),
        Vec::<u32>::new(),
        "none was delivered twice"
    );
    println!(
        "{path} at {per_mille}‰ loss: 1,000 asks in {took:?}, {dropped} frames dropped; latency {}",
        percentiles(&mut latencies)
    );
}
