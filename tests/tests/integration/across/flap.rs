//! A link that goes down and up under load, and a peer that stops and comes back.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use tensorwire_tests::Driver;
use tensorwire_tests::across::{Deliveries, start_node, start_server, start_server_on};
use tensorwire_tests::http2::Wire;
use tensorwire_tests::netns::{Host, Testbed};

use super::over_http2;
use super::{LONG, across, ask_digest, check_digest, message};

across!(
    a_link_flap_under_64_asks_ends_every_ask_in_time,
    a_peer_stopped_and_started_again_ends_in_flight_asks_at_once_and_serves_later_ones,
    a_peer_killed_and_restarted_fails_in_flight_asks_and_serves_later_ones,
);

/// `eth0` down for a second while 64 asks of 1 MiB are in flight on a 1 Gbit/s link (taken
/// down once a few were delivered): every ask ends — answered or failed — within its
/// deadline, none twice, and the nodes keep working.
fn a_link_flap_under_64_asks_ends_every_ask_in_time(driver: Driver) {
    link_flap_under_64_asks(driver, None);
}

over_http2!(link_flap_under_64_asks => a_link_flap_under_64_asks_over_h2c_ends_every_ask_in_time, a_link_flap_under_64_asks_over_tls_ends_every_ask_in_time);

/// The flap case over PTR1, or over HTTP/2 with the (server, client) wires.
fn link_flap_under_64_asks(driver: Driver, http2: Option<(&Wire, &Wire)>) {
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
        "{path} link flap: {before} delivered before it, {answered} answered, {failed} failed"
    );
    assert!(before < 64, "asks were in flight when the link went down");
    assert!(deliveries.duplicates().is_empty(), "no ask delivered twice");
    for id in 0..64 {
        assert!(deliveries.of(id) <= 1);
    }
    bed.host(1)
        .enter(|| ask_digest(&client, peer, 100, 1, 1 << 20, LONG))
        .expect("an ask after the flap");
}

/// The server node stops while asks are in flight (its handler is slow) and starts again on
/// the same address: each in-flight ask ends at once, answered or with an error that is not
/// its deadline, and later asks reconnect.
fn a_peer_stopped_and_started_again_ends_in_flight_asks_at_once_and_serves_later_ones(
    driver: Driver,
) {
    peer_stopped_and_started_again(driver, None);
}

over_http2!(peer_stopped_and_started_again => a_peer_stopped_and_started_again_over_h2c_serves_later_asks, a_peer_stopped_and_started_again_over_tls_serves_later_asks);

/// [`a_peer_stopped_and_started_again_ends_in_flight_asks_at_once_and_serves_later_ones`],
/// over PTR1 or over HTTP/2 with the (server, client) wires.
fn peer_stopped_and_started_again(driver: Driver, http2: Option<(&Wire, &Wire)>) {
    let bed = Testbed::new(2);
    let deliveries = Deliveries::default();
    let (server_wire, client_wire) = http2.unzip();
    let server = start_server(bed.host(0), driver, server_wire, &deliveries, |b| b);
    server
        .serve("slow", 2, |_| {
            std::thread::sleep(Duration::from_millis(300));
            Ok(tensorwire_engine::Reply::Tensor(message(0, 0, 0)))
        })
        .expect("slow registers");
    let port = server.local_addr().port();
    let peer = bed.host(0).addr(port);
    let client = start_node(bed.host(1), driver, client_wire, |b| b);
    let timeout = Duration::from_secs(10);
    let in_flight: Vec<_> = bed.host(1).enter(|| {
        (0..8)
            .map(|id| client.ask(peer, "slow", message(id, 1, 64 << 10), timeout))
            .collect()
    });
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    drop(server);
    let again = start_server_on(bed.host(0), port, driver, server_wire, &deliveries, |b| b);
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
    if http2.is_some() {
        assert!(
            client.stats().transport_connections >= 1,
            "HTTP/2 carried the asks"
        );
    }
    drop(again);
}

/// The server process is killed (SIGKILL: no shutdown, the kernel closes its sockets) while 8
/// asks wait on its slow handler, then started again on the same address: every in-flight ask
/// fails at once with a connection error, later asks reconnect.
fn a_peer_killed_and_restarted_fails_in_flight_asks_and_serves_later_ones(driver: Driver) {
    let bed = Testbed::new(2);
    let server = ServerProcess::start(bed.host(0), 0, driver);
    let peer = server.addr;
    let client = start_node(bed.host(1), driver, None, |b| b);
    let timeout = Duration::from_secs(10);
    let in_flight: Vec<_> = bed.host(1).enter(|| {
        (0..8)
            .map(|id| client.ask(peer, "slow", message(id, 1, 64 << 10), timeout))
            .collect()
    });
    std::thread::sleep(Duration::from_millis(100));
    drop(server);
    let killed = Instant::now();
    let mut failed = 0;
    for pending in in_flight {
        if let Err(e) = pending.wait() {
            assert!(
                e.is_connection(),
                "a killed peer is a connection error: {e}"
            );
            failed += 1;
        }
    }
    let took = killed.elapsed();
    println!(
        "{} killed peer: {failed} of 8 in-flight asks failed, in {took:?}",
        driver.name()
    );
    assert!(
        failed >= 6,
        "the asks still waiting on the killed handler failed"
    );
    assert!(
        took < Duration::from_secs(2),
        "they failed at once, not at their deadline"
    );
    let _again = ServerProcess::start(bed.host(0), peer.port(), driver);
    bed.host(1).enter(|| {
        for id in 10..20 {
            let request = message(id, 2, 1 << 20);
            let want = tensorwire_tests::checksum(&request);
            let reply = client
                .ask(peer, "echo", request, LONG)
                .wait()
                .expect("asks to the new process");
            assert_eq!(
                tensorwire_tests::checksum(&tensorwire_tests::tensor(reply)),
                want
            );
        }
    });
}

/// `netbed-server` in a host; killed (SIGKILL) when dropped.
struct ServerProcess {
    child: Child,
    addr: SocketAddr,
}

impl ServerProcess {
    fn start(host: &Host, port: u16, driver: Driver) -> Self {
        let mut child = host
            .command(env!("CARGO_BIN_EXE_netbed-server"))
            .args([host.addr(port).to_string().as_str(), driver.name()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("netbed-server starts");
        let stdout = child.stdout.take().expect("a pipe");
        let (said, heard) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = said.send(line);
        });
        let Ok(line) = heard.recv_timeout(Duration::from_secs(30)) else {
            let _ = child.kill();
            panic!("netbed-server did not say where it listens within 30 s");
        };
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("netbed-server said {line:?}"));
        Self { child, addr }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
