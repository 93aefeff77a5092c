//! How the driver spreads its work over its cores: accepted connections in turn, whichever
//! core's accept took them; and when one of its cores fails, the core is taken out of both
//! round-robins (the others carry every request), once none is left every request fails
//! saying why, and a failed core is restarted on a new ring within its budget.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_proto::TensorMessage;
use tensorwire_proto::session::SessionConfig;
use tensorwire_proto::transport::{
    ActorPath, Deadline, Driver, DriverSetup, Error, Outbound, OutboundRequest, Reply, RequestKind,
};

use super::commands::{Event, Fault};
use super::conn::ConnKey;
use super::{UringConfig, UringDriver, ZeroCopy};
use crate::endpoint::Registry;
use crate::pending::{AskCompletion, Pending, pair};
use crate::pool::{PoolConfig, ReceivePool};
use crate::sync::lock;

/// A driver whose failed cores stay out (the failure tests).
fn driver(cores: usize) -> UringDriver {
    driver_restarting(cores, 0)
}

/// A driver that restarts a failed core at most `core_restarts` times a minute.
fn driver_restarting(cores: usize, core_restarts: u32) -> UringDriver {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut setup = DriverSetup::new(
        listener,
        Arc::new(Registry::new(16, 16)),
        Arc::new(ReceivePool::new(PoolConfig::default())),
        Arc::new(SessionConfig::default()),
    );
    setup.threads = cores;
    let config = UringConfig {
        ring_entries: 64,
        queue_capacity: 64,
        zero_copy: ZeroCopy::Never,
        zero_copy_min_bytes: u64::MAX,
        shutdown_timeout: Duration::from_secs(1),
        busy_poll: Duration::ZERO,
        core_restarts,
    };
    UringDriver::start(setup, config).expect("io_uring is needed for the driver's tests")
}

/// A port nobody listens on: every ask carried to it fails to connect.
fn closed_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Starts an ask of `peer` through `driver`, with `timeout`.
fn start_ask(driver: &UringDriver, peer: SocketAddr, timeout: Duration) -> Pending<Reply> {
    let (completer, pending) = pair();
    driver.send(OutboundRequest::new(
        peer,
        ActorPath::parse("echo").unwrap(),
        RequestKind::Ask,
        TensorMessage::new(1, Bytes::new(), vec![Bytes::from_static(b"x")]),
        Deadline::after(Instant::now(), timeout),
        Box::new(AskCompletion { completer, peer }),
    ));
    pending
}

fn ask(driver: &UringDriver, peer: SocketAddr) -> Error {
    start_ask(driver, peer, Duration::from_secs(5))
        .wait()
        .expect_err("nobody listens")
}

/// Injects `fault` into core `index` and waits until the driver counts it as failed.
fn break_core(driver: &UringDriver, index: usize, fault: Fault, failed: usize) {
    driver.cores[index].post(Event::Fault(fault));
    let until = Instant::now() + Duration::from_secs(5);
    while driver.gauges().failed_cores < failed {
        assert!(Instant::now() < until, "the fault was not noticed");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Opens `count` connections to `driver`'s listener and waits until its cores serve
/// `expected[i]` of them each.
fn connect_and_count(driver: &UringDriver, count: usize, expected: &[usize]) -> Vec<TcpStream> {
    let addr = lock(&driver.listener)
        .as_ref()
        .unwrap()
        .local_addr()
        .unwrap();
    let streams: Vec<_> = (0..count)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let per_core = || -> Vec<usize> {
        driver
            .cores
            .iter()
            .map(|core| core.shared.connections.load(Ordering::Relaxed))
            .collect()
    };
    let until = Instant::now() + Duration::from_secs(5);
    while per_core() != expected {
        assert!(
            Instant::now() < until,
            "connections per core: {:?}, expected {expected:?}",
            per_core()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    streams
}

#[test]
fn accepted_connections_are_spread_over_the_cores_in_turn() {
    let driver = driver(2);
    let _streams = connect_and_count(&driver, 8, &[4, 4]);
}

#[test]
fn a_failed_core_gets_no_accepted_connections() {
    let driver = driver(2);
    break_core(&driver, 0, Fault::RingError, 1);
    let _streams = connect_and_count(&driver, 4, &[0, 4]);
}

#[test]
fn a_failed_core_leaves_no_accept_behind_to_take_connections_nobody_serves() {
    // The failed core's thread stalls before its ring goes (as a preempted thread would; in
    // a CI run every connection hung that way, `[0, 0]`): its accept must be over by then, and
    // what it took handed to the live core.
    let driver = driver(2);
    break_core(&driver, 0, Fault::RingErrorThenStall, 1);
    let _streams = connect_and_count(&driver, 4, &[0, 4]);
}

#[test]
fn a_core_whose_ring_fails_leaves_the_round_robin_and_the_others_carry_every_request() {
    let driver = driver(2);
    let peer = closed_port();
    break_core(&driver, 0, Fault::RingError, 1);
    for _ in 0..8 {
        let err = ask(&driver, peer);
        assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    }
    break_core(&driver, 1, Fault::PanicInRecovery, 2);
    let err = ask(&driver, peer);
    let text = err.to_string();
    assert!(matches!(err, Error::DriverFailed { .. }), "{err:?}");
    assert!(
        text.contains("every core thread failed") && text.contains("an injected ring failure"),
        "{text}"
    );
}

#[test]
fn a_request_caught_in_a_core_panic_fails_naming_the_panic_and_the_core_goes_on() {
    let driver = driver(1);
    // A peer that accepts and never answers: the ask stays on its connection.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let pending = start_ask(
        &driver,
        silent.local_addr().unwrap(),
        Duration::from_secs(10),
    );
    let (_accepted, _) = silent.accept().unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    while driver.gauges().connections == 0 {
        assert!(Instant::now() < until, "the ask never got a connection");
        std::thread::sleep(Duration::from_millis(5));
    }
    driver.cores[0].post(Event::Fault(Fault::Panic));
    let err = pending.wait().expect_err("the panic failed it");
    assert!(
        matches!(&err, Error::DriverFailed { reason, .. } if reason.contains("an injected panic")),
        "{err:?}"
    );
    assert_eq!(driver.gauges().failed_cores, 0, "a recovered core stays in");
    let err = ask(&driver, closed_port());
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
}

/// Waits until core `index` was restarted `restarts` times and is back in the driver.
fn wait_restarted(driver: &UringDriver, index: usize, restarts: usize) {
    let shared = &driver.cores[index].shared;
    let until = Instant::now() + Duration::from_secs(5);
    while shared.restarts.load(Ordering::Relaxed) < restarts || shared.is_failed() {
        assert!(Instant::now() < until, "the core was not restarted");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_failed_core_is_restarted_on_a_new_ring_and_serves_requests_and_connections_again() {
    let driver = driver_restarting(1, 3);
    driver.cores[0].post(Event::Fault(Fault::RingError));
    wait_restarted(&driver, 0, 1);
    assert_eq!(driver.gauges().failed_cores, 0);
    assert_eq!(driver.gauges().core_restarts, 1);
    let err = ask(&driver, closed_port());
    assert!(
        matches!(err, Error::Connect { .. }),
        "carried again: {err:?}"
    );
    let _streams = connect_and_count(&driver, 2, &[2]);
}

#[test]
fn a_core_that_keeps_failing_stays_out_once_its_restarts_are_spent() {
    let driver = driver_restarting(1, 1);
    driver.cores[0].post(Event::Fault(Fault::RingError));
    wait_restarted(&driver, 0, 1);
    break_core(&driver, 0, Fault::RingError, 1);
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        driver.cores[0].shared.is_failed(),
        "not restarted a second time"
    );
    let err = ask(&driver, closed_port());
    assert!(
        err.to_string().contains("every core thread failed"),
        "{err:?}"
    );
}

#[test]
fn a_cancel_meant_for_a_connection_of_the_failed_core_does_not_reach_a_new_one() {
    let driver = driver_restarting(1, 3);
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = silent.local_addr().unwrap();
    let connected = |count: usize| {
        let until = Instant::now() + Duration::from_secs(5);
        while driver.gauges().connections != count {
            assert!(Instant::now() < until, "no connection");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    // The first connection and request of a fresh core: key (0, 0), request 0.
    let first = start_ask(&driver, peer, Duration::from_secs(10));
    let (_first_accepted, _) = silent.accept().unwrap();
    connected(1);
    driver.cores[0].post(Event::Fault(Fault::RingError));
    assert!(matches!(first.wait(), Err(Error::DriverFailed { .. })));
    wait_restarted(&driver, 0, 1);
    let mut second = start_ask(&driver, peer, Duration::from_secs(10));
    let (_second_accepted, _) = silent.accept().unwrap();
    connected(1);
    // A cancel of the first request, late: it names the old connection.
    driver.cores[0].post(Event::Cancel {
        conn: ConnKey {
            index: 0,
            generation: 0,
        },
        request: 0,
    });
    let err = second.wait_timeout(Duration::from_millis(300));
    assert!(err.is_none(), "the new request was not cancelled: {err:?}");
}
