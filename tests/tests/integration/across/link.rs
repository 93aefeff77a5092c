//! Links that are slower, smaller or larger than loopback, and more than one client.

use std::time::Instant;

use tensorwire_tests::across::{Deliveries, start_node, start_server};
use tensorwire_tests::http2::Wire;
use tensorwire_tests::netns::Testbed;
use tensorwire_tests::{Driver, checksum, tensor};

use super::over_http2;
use super::{LONG, across, ask_digest, ask_digest_of, message};

across!(
    a_256_mib_ask_arrives_intact_over_a_1_gbit_link,
    round_trips_are_intact_at_mtu_1280_and_9000,
    two_clients_on_two_hosts_load_one_server,
);

fn a_256_mib_ask_arrives_intact_over_a_1_gbit_link(driver: Driver) {
    big_ask_over_a_slow_link(driver, None);
}

fn round_trips_are_intact_at_mtu_1280_and_9000(driver: Driver) {
    round_trips_at_mtus(driver, None);
}

over_http2!(big_ask_over_a_slow_link => over_h2c_a_256_mib_ask_arrives_intact_over_a_1_gbit_link, over_tls_a_256_mib_ask_arrives_intact_over_a_1_gbit_link);

over_http2!(round_trips_at_mtus => over_h2c_round_trips_are_intact_at_mtu_1280_and_9000, over_tls_round_trips_are_intact_at_mtu_1280_and_9000);

/// `htb` at 1 Gbit/s both ways: a 256 MiB ask and a 16 MiB echo arrive intact, at about the
/// link's rate; over PTR1, or over HTTP/2 with the (server, client) wires.
fn big_ask_over_a_slow_link(driver: Driver, http2: Option<(&Wire, &Wire)>) {
    let bed = Testbed::new(2);
    bed.limit_rate(bed.host(1), "1gbit");
    let deliveries = Deliveries::default();
    let (server_wire, client_wire) = http2.unzip();
    let server = start_server(bed.host(0), driver, server_wire, &deliveries, |b| b);
    let peer = bed.host(0).addr(server.local_addr().port());
    let client = start_node(bed.host(1), driver, client_wire, |b| b);
    let path = if http2.is_some() {
        "HTTP/2"
    } else {
        driver.name()
    };
    let request = message(1, 4, 64 << 20);
    bed.host(1).enter(|| {
        let started = Instant::now();
        ask_digest_of(&client, peer, request, LONG).expect("256 MiB over 1 Gbit/s");
        let took = started.elapsed();
        let mbit = 256.0 * 8.0 * 1.048_576 / took.as_secs_f64();
        println!("256 MiB over htb 1 Gbit/s ({path}): {took:?}, {mbit:.0} Mbit/s");
        assert!(mbit < 1100.0, "the rate limit held ({mbit:.0} Mbit/s)");
        let request = message(2, 1, 16 << 20);
        let want = checksum(&request);
        let reply = client
            .ask(peer, "echo", request, LONG)
            .wait()
            .expect("16 MiB echo");
        assert_eq!(checksum(&tensor(reply)), want, "the echo is intact");
    });
    assert_eq!(deliveries.of(1), 1);
    if http2.is_some() {
        assert!(
            client.stats().transport_connections >= 1,
            "HTTP/2 carried the asks"
        );
    }
}

/// Segments of 1,280 and 9,000 bytes carry the same frames (PTR1, or HTTP/2 with the wires).
fn round_trips_at_mtus(driver: Driver, http2: Option<(&Wire, &Wire)>) {
    let bed = Testbed::new(2);
    let deliveries = Deliveries::default();
    let (server_wire, client_wire) = http2.unzip();
    let server = start_server(bed.host(0), driver, server_wire, &deliveries, |b| b);
    let peer = bed.host(0).addr(server.local_addr().port());
    for (round, mtu) in [1280u32, 9000].into_iter().enumerate() {
        bed.set_mtu(mtu);
        // A new client per MTU: a pooled connection keeps the segment size it started with.
        let client = start_node(bed.host(1), driver, client_wire, |b| b);
        let base = u32::try_from(round).expect("two rounds") * 100;
        bed.host(1).enter(|| {
            for (i, (count, len)) in [(1, 100), (16, 1 << 20), (1, 64 << 20), (3, 12_345)]
                .into_iter()
                .enumerate()
            {
                let id = base + u32::try_from(i).expect("four sizes");
                let request = message(id, count, len);
                let want = checksum(&request);
                let reply = client
                    .ask(peer, "echo", request, LONG)
                    .wait()
                    .unwrap_or_else(|e| panic!("MTU {mtu}, {count} × {len} B: {e}"));
                assert_eq!(
                    checksum(&tensor(reply)),
                    want,
                    "MTU {mtu}: the echo is intact"
                );
                ask_digest(&client, peer, id, count, len, LONG).expect("digest");
            }
        });
        if http2.is_some() {
            assert!(
                client.stats().transport_connections >= 1,
                "HTTP/2 carried the asks"
            );
        }
    }
    assert_eq!(deliveries.distinct(), 8);
    assert!(deliveries.duplicates().is_empty());
}

fn two_clients_on_two_hosts_load_one_server(driver: Driver) {
    three_hosts(driver, None);
}

over_http2!(three_hosts => over_h2c_two_clients_on_two_hosts_load_one_server, over_tls_two_clients_on_two_hosts_load_one_server);

/// Three hosts: clients on hosts 1 and 2 ask the server on host 0 at the same time, over PTR1
/// or over HTTP/2 with the (server, client) wires.
fn three_hosts(driver: Driver, http2: Option<(&Wire, &Wire)>) {
    let bed = Testbed::new(3);
    let deliveries = Deliveries::default();
    let (server_wire, client_wire) = http2.unzip();
    let server = start_server(bed.host(0), driver, server_wire, &deliveries, |b| b);
    let peer = bed.host(0).addr(server.local_addr().port());
    let clients: Vec<_> = (1..3)
        .map(|h| start_node(bed.host(h), driver, client_wire, |b| b))
        .collect();
    std::thread::scope(|scope| {
        for (h, client) in clients.iter().enumerate() {
            let host = bed.host(h + 1);
            scope.spawn(move || {
                host.enter(|| {
                    let base = u32::try_from(h).expect("two clients") * 1000;
                    let mut window = Vec::new();
                    for i in 0..200u32 {
                        let len = [4096, 65_536, 1 << 20][i as usize % 3];
                        let request = message(base + i, 2, len);
                        let want = checksum(&request);
                        window.push((base + i, want, client.ask(peer, "digest", request, LONG)));
                        if window.len() == 8 {
                            let (id, want, pending) = window.remove(0);
                            super::check_digest(&pending.wait().expect("an ask"), id, want);
                        }
                    }
                    for (id, want, pending) in window {
                        super::check_digest(&pending.wait().expect("an ask"), id, want);
                    }
                });
            });
        }
    });
    assert_eq!(
        deliveries.distinct(),
        400,
        "every ask of both clients was delivered"
    );
    assert!(deliveries.duplicates().is_empty());
    if http2.is_some() {
        for client in &clients {
            assert!(
                client.stats().transport_connections >= 1,
                "HTTP/2 carried the asks"
            );
        }
    }
    let accepted = server.stats().gauges.connections;
    println!(
        "three hosts ({}): server holds {accepted} connections",
        driver.name()
    );
}
