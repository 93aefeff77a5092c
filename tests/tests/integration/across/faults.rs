//! A link that stops answering (black hole) or answers with resets, mid-transfer and idle.

use std::time::{Duration, Instant};

use tensorwire_engine::Keepalive;
use tensorwire_tests::Driver;
use tensorwire_tests::across::{Deliveries, HostNode, start_node, start_server, start_server_on};
use tensorwire_tests::http2::Wire;
use tensorwire_tests::netns::{Host, Testbed};

use super::over_http2;
use super::{LONG, across, ask_digest, ask_digest_of, eventually, message};

across!(
    a_black_hole_mid_transfer_fails_the_ask_in_time_and_frees_both_ends,
    an_idle_connection_to_a_peer_that_vanished_is_dropped_before_reuse,
    a_reset_mid_body_fails_cleanly_and_delivers_nothing,
);

over_http2!(reset_mid_body => a_reset_mid_body_over_h2c_fails_cleanly_and_delivers_nothing, a_reset_mid_body_over_tls_fails_cleanly_and_delivers_nothing);

fn a_reset_mid_body_fails_cleanly_and_delivers_nothing(driver: Driver) {
    reset_mid_body(driver, None);
}

/// A server whose body deadline is short: a body that stops moving for 1 s is given up.
fn impatient_server(
    host: &Host,
    driver: Driver,
    wire: Option<&Wire>,
    deliveries: &Deliveries,
) -> HostNode {
    start_server(host, driver, wire, deliveries, |b| {
        b.min_transfer_rate(1 << 20, Duration::from_secs(1))
    })
}

/// Connections the node holds on any path.
fn connections(node: &HostNode) -> usize {
    let stats = node.stats();
    stats.gauges.connections + stats.transport_connections
}

/// Sends a 256 MiB ask over a 1 Gbit/s link (about 2 s on the wire) and applies `fault` once
/// the server has started receiving its body; what the ask ended with, and after how long.
fn ask_with_fault_mid_body(
    bed: &Testbed,
    server: &HostNode,
    client: &HostNode,
    timeout: Duration,
    fault: impl FnOnce() + Send,
) -> (Result<(), tensorwire_engine::Error>, Duration) {
    let peer = bed.host(0).addr(server.local_addr().port());
    let request = message(1, 4, 64 << 20);
    std::thread::scope(|scope| {
        let asked = scope.spawn(|| {
            bed.host(1).enter(|| {
                let started = Instant::now();
                let outcome = ask_digest_of(client, peer, request, timeout);
                (outcome, started.elapsed())
            })
        });
        let receiving = eventually(Duration::from_secs(10), || {
            server.stats().pool.receiving_bytes >= 16 << 20
        });
        assert!(
            receiving,
            "the body started arriving: {:?}",
            server.stats().pool
        );
        fault();
        asked.join().expect("the asking thread does not panic")
    })
}

/// Both ways dropped while a body is moving: the ask fails with a timeout within its
/// deadline, the server's body deadline frees its connection and receive memory, and once
/// the hole is lifted new asks go through on new connections.
fn a_black_hole_mid_transfer_fails_the_ask_in_time_and_frees_both_ends(driver: Driver) {
    black_hole_mid_transfer(driver, None);
}

/// The black-hole case over h2c: HTTP/2 has no body rate deadline, its PING keepalive (1 s
/// here, on both ends) is what closes the silent connection.
#[test]
fn a_black_hole_mid_transfer_over_h2c_fails_the_ask_in_time_and_frees_both_ends() {
    let _serial = tensorwire_tests::serial();
    let wire = Wire::H2cKeepAlive(Duration::from_secs(1));
    black_hole_mid_transfer(Driver::Uring, Some(&wire));
}

/// Both ways dropped while a body is moving, over PTR1 or over `http2` on both ends.
fn black_hole_mid_transfer(driver: Driver, http2: Option<&Wire>) {
    let bed = Testbed::new(2);
    bed.limit_rate(bed.host(1), "1gbit");
    let deliveries = Deliveries::default();
    let server = impatient_server(bed.host(0), driver, http2, &deliveries);
    let peer = bed.host(0).addr(server.local_addr().port());
    let client = start_node(bed.host(1), driver, http2, |b| b);
    let timeout = Duration::from_secs(3);
    let (outcome, took) =
        ask_with_fault_mid_body(&bed, &server, &client, timeout, || bed.host(0).black_hole());
    let err = outcome.expect_err("the ask cannot finish through a black hole");
    // The deadline, or (HTTP/2 here, with its 1 s PING) the keepalive finding the link dead.
    assert!(
        err.is_timeout() || err.is_connection(),
        "a timeout or a dead connection, classified: {err}"
    );
    assert!(
        took < timeout + Duration::from_secs(1),
        "failed after {took:?}"
    );
    let freed = eventually(Duration::from_secs(6), || {
        connections(&server) == 0 && server.stats().pool.receiving_bytes == 0
    });
    assert!(
        freed,
        "the server gave up the stalled body: {:?}",
        server.stats()
    );
    assert!(
        eventually(Duration::from_secs(4), || connections(&client) == 0),
        "the client closed the connection its ask gave up: {:?}",
        client.stats()
    );
    bed.host(0).clear_faults();
    bed.host(1)
        .enter(|| ask_digest(&client, peer, 2, 1, 1 << 20, LONG))
        .expect("an ask once the hole is lifted");
    assert_eq!(
        deliveries.of(1),
        0,
        "the cut-off body never reached the handler"
    );
    assert_eq!(deliveries.of(2), 1);
}

/// A pooled idle connection whose peer vanished without a FIN (its host went silent, then
/// the node stopped) is found dead by TCP keepalive and dropped from the pool before a
/// request could be handed to it; a server started again on the address is reached at once.
fn an_idle_connection_to_a_peer_that_vanished_is_dropped_before_reuse(driver: Driver) {
    let bed = Testbed::new(2);
    let deliveries = Deliveries::default();
    let server = start_server(bed.host(0), driver, None, &deliveries, |b| b);
    let port = server.local_addr().port();
    let peer = bed.host(0).addr(port);
    let quick = Keepalive {
        idle: Duration::from_secs(1),
        interval: Duration::from_secs(1),
        probes: 2,
    };
    let client = start_node(bed.host(1), driver, None, |b| b.keepalive(Some(quick)));
    bed.host(1)
        .enter(|| ask_digest(&client, peer, 1, 1, 4096, LONG))
        .expect("first ask");
    assert!(
        client.stats().gauges.connections >= 1,
        "a pooled connection"
    );
    bed.host(0).black_hole();
    drop(server);
    let noticed = eventually(Duration::from_secs(15), || {
        client.stats().gauges.connections == 0
    });
    assert!(
        noticed,
        "keepalive found the dead connection: {:?}",
        client.stats().gauges
    );
    bed.host(0).clear_faults();
    let again = start_server_on(bed.host(0), port, driver, None, &deliveries, |b| b);
    let started = Instant::now();
    bed.host(1)
        .enter(|| ask_digest(&client, peer, 2, 1, 4096, LONG))
        .expect("the first ask to the restarted server");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no dead connection was tried first"
    );
    drop(again);
    assert_eq!(deliveries.of(2), 1);
}

/// Resets both ways while a body is moving: the ask fails with a connection error (not its
/// deadline), the handler never sees a part of it, and nothing is sent again later. Over PTR1,
/// or over HTTP/2 with the (server, client) wires.
fn reset_mid_body(driver: Driver, http2: Option<(&Wire, &Wire)>) {
    let bed = Testbed::new(2);
    bed.limit_rate(bed.host(1), "1gbit");
    let deliveries = Deliveries::default();
    let (server_wire, client_wire) = http2.unzip();
    let server = impatient_server(bed.host(0), driver, server_wire, &deliveries);
    let peer = bed.host(0).addr(server.local_addr().port());
    let client = start_node(bed.host(1), driver, client_wire, |b| b);
    let timeout = Duration::from_secs(20);
    let (outcome, took) = ask_with_fault_mid_body(&bed, &server, &client, timeout, || {
        bed.host(0).reset_arrivals();
        bed.host(1).reset_arrivals();
    });
    let err = outcome.expect_err("a reset connection cannot answer");
    assert!(
        !err.is_timeout(),
        "the reset is reported as such, not as a timeout: {err}"
    );
    assert!(took < timeout, "failed after {took:?}");
    let path = if http2.is_some() {
        "HTTP/2"
    } else {
        driver.name()
    };
    println!("{path} reset mid-body: {err} after {took:?}");
    bed.host(0).clear_faults();
    bed.host(1).clear_faults();
    assert!(
        eventually(Duration::from_secs(5), || connections(&server) == 0),
        "the server dropped the reset connection: {:?}",
        server.stats()
    );
    bed.host(1)
        .enter(|| ask_digest(&client, peer, 2, 1, 1 << 20, LONG))
        .expect("an ask after the resets");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        deliveries.of(1),
        0,
        "nothing half-delivered, nothing replayed"
    );
    assert_eq!(deliveries.of(2), 1);
}
