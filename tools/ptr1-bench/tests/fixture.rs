//! The fixture in a second process: every server implementation answers the engine client
//! byte-exactly (wire compatibility between engine, seed-design and blocking peers), `run`
//! prints measurements, and the forced fallback stops the engine server with a clear error.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use std::sync::Arc;

use tensorwire_compat::{Http2, Http2Config, TlsConfig};
use tensorwire_engine::{Node, Preference, Reply, TensorMessage};

const BIN: &str = env!("CARGO_BIN_EXE_ptr1-bench");
const TIMEOUT: Duration = Duration::from_secs(30);

struct Server(Child, SocketAddr);

impl Server {
    fn start(transport: &str, extra: &[&str]) -> Self {
        Self::start_saying(transport, extra).0
    }

    /// The server, and the lines it printed before `listening on ADDR`.
    fn start_saying(transport: &str, extra: &[&str]) -> (Self, Vec<String>) {
        let mut child = Command::new(BIN)
            .args(["serve", "--transport", transport, "--listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .expect("ptr1-bench starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut before = Vec::new();
        let addr = loop {
            let line = lines.next().expect("a ready line").unwrap();
            if let Some(addr) = line.trim().strip_prefix("listening on ") {
                break addr.parse().unwrap();
            }
            before.push(line);
        };
        (Self(child, addr), before)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn client() -> Node {
    Node::builder("127.0.0.1:0".parse().unwrap())
        .in_process_delivery(false)
        .shared_memory(false)
        .build()
        .expect("client node")
}

fn message() -> TensorMessage {
    let buffers = (0..5u8)
        .map(|i| {
            Bytes::from(
                (0..1000 * usize::from(i))
                    .map(|j| j.to_le_bytes()[0] ^ i)
                    .collect::<Vec<u8>>(),
            )
        })
        .collect();
    TensorMessage::new(42, Bytes::from_static(b"{\"schema\":1}"), buffers)
}

fn check_fixture(transport: &str) {
    check_fixture_with(transport, &[]);
}

fn check_fixture_with(transport: &str, extra: &[&str]) {
    let server = Server::start(transport, extra);
    check_answers(transport, &server, &client());
}

fn check_answers(transport: &str, server: &Server, client: &Node) {
    let sent = message();
    let echo = client
        .ask(server.1, "/actors/echo", sent.clone(), TIMEOUT)
        .wait()
        .unwrap();
    assert_eq!(
        echo,
        Reply::Tensor(sent.clone()),
        "{transport} echo returns the message, version included"
    );
    let sink = client
        .ask(server.1, "/actors/sink", sent.clone(), TIMEOUT)
        .wait()
        .unwrap();
    let expected = Reply::Single {
        msg_type: "ack".into(),
        data: Bytes::from(sent.total_bytes().to_string()),
    };
    assert_eq!(
        sink, expected,
        "{transport} sink acknowledges the byte count"
    );
    client
        .tell(server.1, "/actors/sink", sent, TIMEOUT)
        .wait()
        .unwrap();
}

#[test]
fn engine_fixture_answers_echo_sink_and_tell_from_another_process() {
    check_fixture("engine");
}

#[test]
fn seed_design_fixture_speaks_the_same_wire_format() {
    check_fixture("seed");
}

#[test]
fn blocking_fixture_speaks_the_same_wire_format() {
    check_fixture("std");
}

#[test]
fn tokio_fallback_fixture_speaks_the_same_wire_format() {
    check_fixture("tokio");
}

#[test]
fn engine_fixture_with_handler_threads_answers_the_same() {
    check_fixture_with("engine", &["--handlers", "threads"]);
}

#[test]
fn engine_fixture_answers_the_same_over_h2c_and_tls_on_its_one_port() {
    let dir = std::env::temp_dir().join(format!("ptr1-bench-fixture-{}", std::process::id()));
    let dir_text = dir.display().to_string();
    let server = Server::start("engine", &["--tls-self-signed", &dir_text]);
    let h2c = Node::builder("127.0.0.1:0".parse().unwrap())
        .in_process_delivery(false)
        .preference(Preference::Http2)
        .transport(Arc::new(Http2::new(Http2Config::h2c())))
        .build()
        .unwrap();
    check_answers("engine over h2c", &server, &h2c);
    let ca = std::fs::read(dir.join("ca.pem")).expect("the fixture wrote its CA");
    let tls = TlsConfig::builder().trust_pem(ca).build().unwrap();
    let tls = Node::builder("127.0.0.1:0".parse().unwrap())
        .in_process_delivery(false)
        .transport(Arc::new(Http2::new(Http2Config::tls(tls, false))))
        .build()
        .unwrap();
    check_answers("engine over TLS", &server, &tls);
    // And PTR1 on the same port.
    check_answers("engine over PTR1", &server, &client());
    assert_eq!(h2c.stats().transport_connections, 1);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_1_gib_message_over_http2_peaks_the_receiver_below_1_2_gib() {
    let server = Server::start("engine", &[]);
    let client = Node::builder("127.0.0.1:0".parse().unwrap())
        .in_process_delivery(false)
        .preference(Preference::Http2)
        .transport(Arc::new(Http2::new(Http2Config::h2c())))
        .build()
        .unwrap();
    let message = TensorMessage::new(1, Bytes::new(), vec![Bytes::from(vec![7u8; 1 << 30])]);
    let reply = client
        .ask(server.1, "/actors/sink", message, TIMEOUT)
        .wait()
        .unwrap();
    assert_eq!(
        reply,
        Reply::Single {
            msg_type: "ack".into(),
            data: Bytes::from((1u64 << 30).to_string()),
        }
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.0.id())).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .expect("VmHWM in /proc/PID/status");
    let peak = peak_kib << 10;
    assert!(
        peak <= (12u64 << 30) / 10,
        "the receiver peaked at {:.2} GiB for a 1 GiB body",
        peak as f64 / f64::from(1u32 << 30)
    );
}

#[test]
fn run_prints_a_json_measurement() {
    let server = Server::start("engine", &[]);
    let output = Command::new(BIN)
        .args([
            "run",
            "--connect",
            &server.1.to_string(),
            "--mode",
            "rtt",
            "--size",
            "4096",
            "--seconds",
            "0.2",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["transport"], "engine");
    assert!(json["ops"].as_u64().unwrap() >= 100, "{json}");
    assert!(json["latency_p50_us"].as_f64().unwrap() > 0.0, "{json}");
    let (p50, p999) = (
        json["latency_p50_us"].as_f64().unwrap(),
        json["latency_p999_us"].as_f64().unwrap(),
    );
    assert!(
        p50 <= p999 && p999 <= json["latency_max_us"].as_f64().unwrap(),
        "{json}"
    );
}

#[test]
fn run_verifies_echoed_payloads_and_takes_units() {
    let server = Server::start("engine", &[]);
    let output = Command::new(BIN)
        .args([
            "run",
            "--to",
            &server.1.to_string(),
            "--mode",
            "inflight",
            "--size",
            "64KiB",
        ])
        .args(["--buffers", "16", "--messages", "200", "--verify", "--json"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["size"], 65536);
    assert_eq!(json["ops"], 200);
    assert_eq!(json["verified"], true);
}

#[test]
fn run_measures_tells_and_refuses_them_for_clients_without_tells() {
    let server = Server::start("engine", &[]);
    let addr = server.1.to_string();
    let output = Command::new(BIN)
        .args([
            "run",
            "--to",
            &addr,
            "--mode",
            "tell",
            "--size",
            "1MiB",
            "--messages",
            "20",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        (json["mode"].as_str(), json["ops"].as_u64()),
        (Some("Tell"), Some(20))
    );
    let refused = Command::new(BIN)
        .args(["run", "--to", &addr, "--mode", "tell", "--transport", "std"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("needs a tensorwire client"));
}

#[test]
fn serve_transport_tls_generates_a_test_ca_and_refuses_plaintext() {
    let (server, said) = Server::start_saying("tls", &[]);
    let ca_path = said
        .iter()
        .find_map(|l| l.strip_prefix("test CA (pass it to run --ca): "))
        .unwrap_or_else(|| panic!("the CA's path is printed first: {said:?}"));
    let ca = std::fs::read(ca_path).expect("the fixture wrote its CA");
    let tls = TlsConfig::builder().trust_pem(ca).build().unwrap();
    let tls = Node::builder("127.0.0.1:0".parse().unwrap())
        .in_process_delivery(false)
        .transport(Arc::new(Http2::new(Http2Config::tls(tls, false))))
        .build()
        .unwrap();
    check_answers("serve --transport tls", &server, &tls);
    let plaintext = client()
        .ask(server.1, "/actors/echo", message(), TIMEOUT)
        .wait();
    assert!(
        plaintext.is_err(),
        "PTR1 in clear text is refused: {plaintext:?}"
    );
    if let Some(dir) = std::path::Path::new(ca_path).parent() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn serve_transport_h2c_and_shm_answer_over_their_paths() {
    let server = Server::start("h2c", &[]);
    let h2c = Node::builder("127.0.0.1:0".parse().unwrap())
        .in_process_delivery(false)
        .preference(Preference::Http2)
        .transport(Arc::new(Http2::new(Http2Config::h2c())))
        .build()
        .unwrap();
    check_answers("serve --transport h2c", &server, &h2c);
    let server = Server::start("shm", &[]);
    let shm = Node::builder("127.0.0.1:0".parse().unwrap())
        .in_process_delivery(false)
        .preference(Preference::SharedMemory)
        .build()
        .unwrap();
    check_answers("serve --transport shm", &server, &shm);
    let route = shm.route_to(server.1, None).unwrap();
    assert_eq!(
        route.route,
        tensorwire_engine::Route::SharedMemory,
        "{}",
        route.reason
    );
}

#[test]
fn the_suite_keeps_every_sample_verified_with_the_environment_in_its_json() {
    let path = std::env::temp_dir().join(format!("ptr1-bench-suite-{}.json", std::process::id()));
    let out = Command::new(BIN)
        .args(["suite", "--smoke", "--only", "ptr1", "--json"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    let columns: Vec<&str> = json["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["key"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        [
            "engine",
            "engine_striped",
            "engine_spinning",
            "tokio",
            "seed",
            "std"
        ]
    );
    let spins = |key: &str| {
        json["columns"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["key"] == key && c["spins_through_gaps"].as_bool() == Some(true))
    };
    assert!(spins("engine_spinning") && !spins("engine"));
    let cases = json["cases"].as_array().unwrap();
    assert_eq!(
        cases.len(),
        3 * 2 * 2 + 1,
        "modes × smoke sizes × buffer counts, and the sporadic row"
    );
    let sporadic: Vec<&serde_json::Value> =
        cases.iter().filter(|c| c["mode"] == "sporadic").collect();
    assert_eq!(sporadic.len(), 1, "one sporadic row");
    assert_eq!(sporadic[0]["size"], 4096, "of the smallest size");
    for column in &columns {
        let sample = &sporadic[0]["columns"][column]["samples"][0];
        let gap = sample["gap_us"].as_f64().unwrap();
        assert!(gap >= 10_000.0, "{column}: each ask slept {gap} µs first");
    }
    let back_to_back = cases.iter().find(|c| c["mode"] == "rtt").unwrap();
    let gap = back_to_back["columns"]["engine"]["samples"][0]["gap_us"].as_f64();
    assert_eq!(gap, Some(0.0), "the other rows do not sleep");
    for case in cases {
        for column in &columns {
            if spins(column) && case["mode"] != "sporadic" {
                // Measured on the sporadic row only, and left out of the others.
                assert!(case["columns"][column].is_null(), "{column} {case}");
                continue;
            }
            let samples = case["columns"][column]["samples"].as_array().unwrap();
            assert_eq!(samples.len(), 1, "{case}");
            assert!(samples[0]["ops"].as_u64().unwrap() > 0);
            let echoed = case["mode"] != "oneway";
            assert_eq!(
                samples[0]["verified"].as_bool(),
                Some(echoed),
                "{column} {case}"
            );
        }
    }
    let env = &json["environment"];
    for key in ["kernel", "cpu", "cores", "commit", "packages"] {
        assert!(!env[key].is_null(), "environment has {key}: {env}");
    }
    assert!(
        json["peers"]["skipped"].is_string(),
        "peers are said to be skipped"
    );
}

#[test]
fn bad_arguments_are_usage_errors_naming_the_choices() {
    let run = |args: &[&str]| {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?} is a usage error");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&[
        "run",
        "--to",
        "127.0.0.1:1",
        "--transport",
        "carrier-pigeon",
    ]);
    assert!(err.contains("engine") && err.contains("shm"), "{err}");
    let err = run(&["run", "--to", "127.0.0.1:1", "--size", "12parsecs"]);
    assert!(err.contains("unknown size unit"), "{err}");
    let err = run(&["run", "--to", "127.0.0.1:1", "--mode", "sideways"]);
    assert!(err.contains("oneway") && err.contains("inflight"), "{err}");
    let err = run(&["suite", "--only", "ptr1,pigeons"]);
    assert!(err.contains("http2") && err.contains("peers"), "{err}");
    let help = Command::new(BIN).args(["run", "--help"]).output().unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--verify"));
}

#[test]
fn an_unreachable_server_is_a_clear_error_with_the_address() {
    let out = Command::new(BIN)
        .args(["run", "--to", "127.0.0.1:1", "--seconds", "0.1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("127.0.0.1:1"), "{err}");
}

#[test]
fn forced_fallback_stops_the_engine_server_with_a_clear_error() {
    let mut child = Command::new(BIN)
        .args(["serve", "--transport", "engine", "--listen", "127.0.0.1:0"])
        .env("TENSORWIRE_FORCE_FALLBACK", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the server did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(!status.success());
    assert!(
        stderr.contains("io_uring driver is unavailable"),
        "{stderr}"
    );
    assert!(stderr.contains("TENSORWIRE_FORCE_FALLBACK"), "{stderr}");
    assert!(stderr.contains("NodeBuilder::fallback"), "{stderr}");
}
