//! Which path a send between hosts takes, and that every path works across them.

use std::time::{Duration, Instant};

use tensorwire_engine::Route;
use tensorwire_tests::across::{Deliveries, start_node, start_server};
use tensorwire_tests::http2::Wire;
use tensorwire_tests::netns::Testbed;
use tensorwire_tests::{Driver, checksum, serial, tensor};

use super::{LONG, across, ask_digest, message, mutual_tls};

across!(auto_picks_ptr1_across_hosts_without_waiting_for_a_hello);

/// `auto` between hosts is PTR1, and `route()` says why; shared memory is asked for on every
/// send, so its hello must fail (or be skipped) at once, not after its timeout.
fn auto_picks_ptr1_across_hosts_without_waiting_for_a_hello(driver: Driver) {
    let bed = Testbed::new(2);
    let deliveries = Deliveries::default();
    let server = start_server(bed.host(0), driver, None, &deliveries, |b| b);
    let peer = bed.host(0).addr(server.local_addr().port());
    let hello = Duration::from_secs(5);
    let client = start_node(bed.host(1), driver, None, |b| b.shm_hello_timeout(hello));
    bed.host(1).enter(|| {
        let started = Instant::now();
        for id in 0..20 {
            ask_digest(&client, peer, id, 1, 4096, LONG).expect("an ask across hosts");
        }
        let twenty = started.elapsed();
        assert!(
            twenty < hello,
            "20 asks took {twenty:?}: a send waited for the shared-memory hello ({hello:?})"
        );
        let started = Instant::now();
        let route = client.route_to(peer, None).expect("a route");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "route() waited {:?} for a hello that cannot succeed",
            started.elapsed()
        );
        assert_eq!(route.route, Route::RawTcp, "{}", route.reason);
        assert!(!route.reason.is_empty());
        println!("route across hosts: {:?}: {}", route.route, route.reason);
        assert_eq!(client.stats().shm_connections, 0);
    });
    assert_eq!(deliveries.distinct(), 20);
    assert!(deliveries.duplicates().is_empty());
}

#[test]
fn h2c_works_across_hosts() {
    let _serial = serial();
    one_round_trip_over(&Wire::H2c, &Wire::H2c, Route::Http2);
}

#[test]
fn tls_with_client_certificates_works_across_hosts() {
    let _serial = serial();
    let (server, client) = mutual_tls();
    one_round_trip_over(&server, &client, Route::Http2);
}

/// A 16 × 1 MiB echo from host 1 to host 0 over `client_wire`, checked byte for byte.
fn one_round_trip_over(server_wire: &Wire, client_wire: &Wire, want: Route) {
    let bed = Testbed::new(2);
    let deliveries = Deliveries::default();
    let server = start_server(
        bed.host(0),
        Driver::Uring,
        Some(server_wire),
        &deliveries,
        |b| b,
    );
    let peer = bed.host(0).addr(server.local_addr().port());
    let client = start_node(bed.host(1), Driver::Uring, Some(client_wire), |b| b);
    bed.host(1).enter(|| {
        let route = client.route_to(peer, None).expect("a route");
        assert_eq!(route.route, want, "{}", route.reason);
        let request = message(7, 16, 1 << 20);
        let want_sum = checksum(&request);
        let reply = client
            .ask(peer, "echo", request, LONG)
            .wait()
            .expect("an echo across hosts");
        assert_eq!(checksum(&tensor(reply)), want_sum, "the echo is intact");
        ask_digest(&client, peer, 8, 4, 3 << 20, LONG).expect("a digest across hosts");
        assert!(
            client.stats().transport_connections >= 1,
            "HTTP/2 carried it"
        );
    });
    assert_eq!(deliveries.of(8), 1);
}
