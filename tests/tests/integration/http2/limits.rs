//! Statuses for requests that cannot be served, each checked with an independent client
//! (curl) or ours: 413 before the body is read, 400, 404, 405, 415, 431; and more asks than a
//! connection's stream limit all complete.

use std::process::Command;

use tensorwire_engine::{Node, Reply, TensorMessage};
use tensorwire_proto::Limits;
use tensorwire_tests::http2::Wire;
use tensorwire_tests::pki::PemDir;
use tensorwire_tests::*;

/// An h2c echo server with `limits`.
fn server(limits: Limits) -> Node {
    let node = Wire::H2c
        .builder(Driver::Uring)
        .limits(limits)
        .build()
        .unwrap();
    node.serve_on_core("echo", |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    node
}

/// curl POSTs `body` to `path` on `node` as a tensor message; the HTTP status. `extra`
/// headers replace the default ones of the same name.
fn post(node: &Node, path: &str, body: &[u8], extra: &[&str]) -> String {
    let mut headers = vec![
        "x-message-type: __pulsing_tensor_message__",
        "x-message-mode: ask",
    ];
    for header in extra.iter().filter(|h| h.contains(':')) {
        let name = &header[..header.find(':').unwrap_or(0)];
        headers.retain(|h| !h.starts_with(name));
    }
    let dir = PemDir::new();
    let file = dir.write("body.ptm1", "");
    std::fs::write(&file, body).unwrap();
    let output = Command::new("curl")
        .args([
            "--max-time",
            "10",
            "--http2-prior-knowledge",
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .args(headers.iter().flat_map(|h| ["-H", h]))
        .args(extra.iter().flat_map(|h| ["-H", h]))
        .arg("--data-binary")
        .arg(format!("@{}", file.display()))
        .arg(format!("http://{}{path}", node.local_addr()))
        .output()
        .expect("curl is installed");
    let code = String::from_utf8_lossy(&output.stdout).into_owned();
    if code == "000" {
        // No response: say why (curl's exit status and message) in the failed assertion.
        let why = String::from_utf8_lossy(&output.stderr);
        return format!("000 ({}: {})", output.status, why.trim());
    }
    code
}

fn ptm1(message: &TensorMessage) -> Vec<u8> {
    tensorwire_proto::ptm1::encode(message, &Limits::default())
        .unwrap()
        .to_vec()
}

#[test]
fn a_body_over_the_limit_is_refused_with_413_before_it_is_read() {
    let _serial = serial();
    let node = server(Limits::builder().max_wire_bytes(1 << 20).build());
    let client = Wire::H2c.builder(Driver::Uring).build().unwrap();
    let before = node.stats().pool;
    let err = client
        .ask(node.local_addr(), "echo", patterned(1, 8, 1 << 20), TIMEOUT)
        .wait()
        .unwrap_err();
    assert!(
        err.remote_text().is_some_and(|t| t.starts_with("413")),
        "{err}"
    );
    let after = node.stats().pool;
    assert_eq!(
        (after.hits, after.misses),
        (before.hits, before.misses),
        "no receive memory was taken"
    );
    // The connection is still good for a message that fits.
    let small = patterned(2, 1, 1000);
    assert_eq!(
        tensor(
            client
                .ask(node.local_addr(), "echo", small.clone(), TIMEOUT)
                .wait()
                .unwrap()
        ),
        small
    );
}

#[test]
fn a_head_declaring_a_1_tib_buffer_is_refused_with_413_before_any_allocation() {
    let _serial = serial();
    let node = server(Limits::default());
    let mut head = b"PTM1".to_vec();
    head.extend_from_slice(&1u32.to_le_bytes());
    head.extend_from_slice(&0u64.to_le_bytes());
    head.extend_from_slice(&1u32.to_le_bytes());
    head.extend_from_slice(&(1u64 << 40).to_le_bytes());
    let rss = resident_bytes();
    assert_eq!(post(&node, "/actors/echo", &head, &[]), "413");
    assert!(
        resident_bytes() < rss + (64 << 20),
        "no memory committed for the declared TiB"
    );
}

#[test]
fn malformed_bodies_unknown_endpoints_and_wrong_requests_get_their_statuses() {
    let _serial = serial();
    let node = server(Limits::default());
    let good = ptm1(&patterned(1, 2, 100));
    assert_eq!(post(&node, "/actors/echo", &good, &[]), "200");
    assert_eq!(
        post(&node, "/actors/echo", b"PTMX: not a PTM1 body at all", &[]),
        "400",
        "bad magic"
    );
    assert_eq!(
        post(&node, "/actors/echo", &good[..good.len() - 1], &[]),
        "400",
        "truncated body"
    );
    assert_eq!(
        post(&node, "/actors/nobody", &good, &[]),
        "404",
        "unknown endpoint"
    );
    assert_eq!(
        post(&node, "/actors/echo", &good, &["x-message-mode: shout"]),
        "400",
        "bad mode"
    );
    assert_eq!(
        post(
            &node,
            "/actors/echo",
            &good,
            &["x-message-type: something/else"]
        ),
        "415",
        "not a tensor message"
    );
    // A header block too large (431): `interop::nghttp_sees_431_for_a_header_block_too_large`
    // (curl 7.88 sometimes loses that response to the reset after it).
    let get = Command::new("curl")
        .args([
            "--max-time",
            "10",
            "--http2-prior-knowledge",
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .arg(format!("http://{}/actors/echo", node.local_addr()))
        .output()
        .expect("curl is installed");
    assert_eq!(String::from_utf8_lossy(&get.stdout), "405", "GET");
}

#[test]
fn more_asks_than_the_stream_limit_all_complete() {
    let _serial = serial();
    let node = server(Limits::default());
    let client = Wire::H2c.builder(Driver::Uring).build().unwrap();
    // The server allows 64 concurrent streams per connection; the client queues the rest.
    let asks: Vec<_> = (0..300)
        .map(|i| client.ask(node.local_addr(), "echo", patterned(i, 1, 512), TIMEOUT))
        .collect();
    for (i, ask) in asks.into_iter().enumerate() {
        assert_eq!(
            tensor(ask.wait().unwrap()),
            patterned(u32::try_from(i).unwrap(), 1, 512)
        );
    }
}
