//! Shutdown with requests in flight: every request completes or fails, none hangs.

use std::time::Duration;

use tensorwire_engine::{Error, Node, Pending, Reply};
use tensorwire_tests::*;

use super::conformance;

conformance!(
    pairs: [
        shutdown_of_the_client_fails_or_completes_every_request_in_flight,
        shutdown_of_the_server_fails_or_completes_every_request_in_flight,
    ],
    servers: [],
);

fn slow_server(drivers: Drivers, threads: usize) -> Node {
    let server = drivers.server().build().unwrap();
    server
        .serve("slow", threads, |r| {
            std::thread::sleep(Duration::from_millis(100));
            Ok(Reply::Tensor(r.message))
        })
        .unwrap();
    server
}

fn slow_asks(client: &Node, server: &Node, count: u32) -> Vec<Pending<Reply>> {
    (0..count)
        .map(|i| client.ask(server.local_addr(), "slow", patterned(i, 1, 100), TIMEOUT))
        .collect()
}

fn shutdown_of_the_client_fails_or_completes_every_request_in_flight(drivers: Drivers) {
    let server = slow_server(drivers, 4);
    let client = drivers.client_node();
    let pendings = slow_asks(&client, &server, 40);
    std::thread::sleep(Duration::from_millis(150));
    client.shutdown();
    let (mut ok, mut failed) = (0, 0);
    for mut pending in pendings {
        match pending
            .wait_timeout(Duration::from_secs(10))
            .expect("no request hangs")
        {
            Ok(_) => ok += 1,
            Err(Error::Shutdown) => failed += 1,
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert_eq!(ok + failed, 40);
    assert!(failed > 0, "some were still in flight at shutdown");
    let late = client
        .ask(server.local_addr(), "slow", patterned(1, 1, 1), TIMEOUT)
        .wait();
    assert!(matches!(late, Err(Error::Shutdown)), "{late:?}");
    let late = client.ask_blocking(server.local_addr(), "slow", patterned(1, 1, 1), TIMEOUT);
    assert!(matches!(late, Err(Error::Shutdown)), "{late:?}");
}

fn shutdown_of_the_server_fails_or_completes_every_request_in_flight(drivers: Drivers) {
    let server = slow_server(drivers, 2);
    let client = drivers.client_node();
    let pendings = slow_asks(&client, &server, 20);
    std::thread::sleep(Duration::from_millis(150));
    server.shutdown();
    for mut pending in pendings {
        let result = pending
            .wait_timeout(Duration::from_secs(10))
            .expect("no request hangs");
        if let Err(e) = result {
            assert!(e.is_connection() || e.is_remote(), "{e}");
        }
    }
}
