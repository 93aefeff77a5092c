//! A link that goes down and up under load, and a peer that stops and comes back.

use std::time::{Duration, Instant};

use tensorwire_tests::Driver;
use tensorwire_tests::across::{Deliveries, start_node, start_server, start_server_on};
use tensorwire_tests::netns::Testbed;

use super::{LONG, across, ask_digest, check_digest, message};

across!(
    a_link_flap_under_64_asks_ends_every_ask_in_time,
    a_peer_stopped_and_started_again_fails_in_flight_asks_and_serves_later_ones,
);

/// `eth0` down for a second while 64 asks of 1 MiB are in flight on a 1 Gbit/s link (taken
/// down once a few were delivered): every ask ends — answered or failed — within its
/// deadline, none twice, and the nodes keep working.
fn a_link_flap_under_64_asks_ends_every_ask_in_time(driver: Driver) {
    let bed = Testbed::new(2);
    bed.limit_rate(bed.host(1), "1gbit");
    let deliveries = Deliveries::default();
    let server = start_server(bed.host(0), driver, None, &deliveries, |b| b);
    let peer = bed.host(0).addr(server.local_addr().port());
    let client = start_node(bed.host(1), driver, None, |b| b);
    let timeout = Duration::from_secs(8);
    let requests: Vec<_> = (0..64u32).map(|id| message(id, 1, 1 << 20)).collect();
    let (answered, failed, before) = bed.host(1).enter(|| {
        let sent = Instant::now();
        let pending: Vec<_> = requests
            .into_iter()
            .map(|request| {
                let (id, want) = (request.version, tensorwire_tests::checksum(&request));
                (id, want, client.ask(peer, "digest", request, timeout))
            })
            .collect();
        assert!(super::eventually(Duration::from_secs(5), || deliveries
            .distinct()
            >= 4));
        let before = deliveries.distinct();
        bed.host(1).set_link(false);
        std::thread::sleep(Duration::from_secs(1));
        bed.host(1).set_link(true);
        let (mut answered, mut failed) = (0, 0);
        for (id, want, pending) in pending {
            match pending.wait() {
                Ok(reply) => {
                    check_digest(&reply, id, want);
                    answered += 1;
                }
                Err(e) => {
                    assert!(e.is_timeout() || e.is_connection(), "ask {id}: {e}");
                    failed += 1;
                }
            }
            assert!(
                sent.elapsed() < timeout + Duration::from_secs(2),
                "ask {id} ended late"
            );
        }
        (answered, failed, before)
    });
    println!(
        "{} link flap: {before} delivered before it, {answered} answered, {failed} failed",
        driver.name()
    );
    assert!(before < 64, "asks were in flight when the link went down");
    assert_eq!(answered + failed, 64);
    assert!(deliveries.duplicates().is_empty(), "no ask delivered twice");
    for id in 0..64 {
        assert!(deliveries.of(id) <= 1);
    }
    bed.host(1)
        .enter(|| ask_digest(&client, peer, 100, 1, 1 << 20, LONG))
        .expect("an ask after the flap");
}

/// The server stops while asks are in flight (its handler is slow) and starts again on the
/// same address: the in-flight asks fail cleanly within their deadline, later asks reconnect.
fn a_peer_stopped_and_started_again_fails_in_flight_asks_and_serves_later_ones(driver: Driver) {
    let bed = Testbed::new(2);
    let deliveries = Deliveries::default();
    let server = start_server(bed.host(0), driver, None, &deliveries, |b| b);
    server
        .serve("slow", 2, |_| {
            std::thread::sleep(Duration::from_millis(300));
            Ok(tensorwire_engine::Reply::Tensor(message(0, 0, 0)))
        })
        .expect("slow registers");
    let port = server.local_addr().port();
    let peer = bed.host(0).addr(port);
    let client = start_node(bed.host(1), driver, None, |b| b);
    let timeout = Duration::from_secs(10);
    let in_flight: Vec<_> = bed.host(1).enter(|| {
        (0..8)
            .map(|id| client.ask(peer, "slow", message(id, 1, 64 << 10), timeout))
            .collect()
    });
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    drop(server);
    let again = start_server_on(bed.host(0), port, driver, None, &deliveries, |b| b);
    for pending in in_flight {
        if let Err(e) = pending.wait() {
            assert!(!e.is_timeout(), "a stopped peer is reported at once: {e}");
        }
        assert!(started.elapsed() < timeout, "an in-flight ask ended late");
    }
    bed.host(1).enter(|| {
        for id in 10..20 {
            ask_digest(&client, peer, id, 2, 1 << 20, LONG).expect("asks to the new server");
        }
    });
    assert_eq!(deliveries.distinct(), 10);
    drop(again);
}
