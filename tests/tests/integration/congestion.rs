//! Same-host connections ask for the congestion control the node names (reno unless
//! `TENSORWIRE_SAME_HOST_CONGESTION` or `NodeBuilder::same_host_congestion` says otherwise):
//! PTR1 on both drivers and the blocking calls, and HTTP/2, in both roles; `system` keeps the
//! kernel's. Read from outside, with `ss` (iproute2).

use std::process::Command;

use tensorwire_engine::{Node, NodeBuilder, Reply};
use tensorwire_proto::congestion::SameHostCongestion;
use tensorwire_tests::http2::Wire;
use tensorwire_tests::*;

#[test]
fn same_host_connections_ask_for_reno_on_both_drivers_and_the_blocking_calls() {
    let _serial = serial();
    if kernel_default() == "reno" {
        eprintln!("NOTE: the kernel's default is reno here: this test cannot tell it apart");
    }
    for driver in [Driver::Uring, Driver::Tokio] {
        let seen = congestion_after_asks(driver.builder(), SameHostCongestion::default());
        // The driver's connection and the blocking calls' own, both ends of each.
        assert!(seen.len() >= 4, "{driver:?}: two connections: {seen:?}");
        assert!(seen.iter().all(|cc| cc == "reno"), "{driver:?}: {seen:?}");
    }
}

#[test]
fn same_host_http2_connections_ask_for_reno_too() {
    let _serial = serial();
    for driver in [Driver::Uring, Driver::Tokio] {
        let seen = congestion_after_asks(Wire::H2c.builder(driver), SameHostCongestion::default());
        assert!(seen.len() >= 2, "{driver:?}: both ends: {seen:?}");
        assert!(seen.iter().all(|cc| cc == "reno"), "{driver:?}: {seen:?}");
    }
}

#[test]
fn system_keeps_the_kernels_congestion_control() {
    let _serial = serial();
    let kernel = kernel_default();
    if kernel == "reno" {
        eprintln!("NOTE: the kernel's default is reno here: `system` cannot be told apart");
    }
    for driver in [Driver::Uring, Driver::Tokio] {
        let seen = congestion_after_asks(driver.builder(), SameHostCongestion::system());
        assert!(seen.len() >= 2, "{driver:?}: {seen:?}");
        assert!(seen.iter().all(|cc| *cc == kernel), "{driver:?}: {seen:?}");
    }
}

/// The kernel's default congestion control.
fn kernel_default() -> String {
    let path = "/proc/sys/net/ipv4/tcp_congestion_control";
    std::fs::read_to_string(path).unwrap().trim().to_owned()
}

/// The congestion control of every established connection to a fresh server built by
/// `builder`, after one ask through the driver and one blocking ask from a client node built
/// the same way.
fn congestion_after_asks(builder: NodeBuilder, choice: SameHostCongestion) -> Vec<String> {
    let build = || {
        builder
            .clone()
            .same_host_congestion(choice.clone())
            .in_process_delivery(false)
            .build()
            .unwrap()
    };
    let (server, client): (Node, Node) = (build(), build());
    server
        .serve_on_core("echo", |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    let message = patterned(1, 1, 256 << 10);
    let to = server.local_addr();
    client
        .ask(to, "echo", message.clone(), TIMEOUT)
        .wait()
        .unwrap();
    client.ask_blocking(to, "echo", message, TIMEOUT).unwrap();
    congestion_of_connections(to.port())
}

/// `ss`'s congestion-control name for each end of the established TCP connections from or to
/// 127.0.0.1:`port` (without `-o` or `-e`, the first word of `ss -i`'s second line is it).
fn congestion_of_connections(port: u16) -> Vec<String> {
    let at = format!("127.0.0.1:{port}");
    let filter = format!("( src {at} or dst {at} )");
    let out = Command::new("ss")
        .args(["-tinH", "state", "established", &filter])
        .output()
        .expect("ss (iproute2) runs");
    assert!(out.status.success(), "ss: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| line.starts_with(char::is_whitespace))
        .filter_map(|info| info.split_whitespace().next().map(str::to_owned))
        .collect()
}
