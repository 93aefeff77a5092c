//! Interop with independent HTTP/2 implementations (Debian's curl, nghttp2's nghttp, h2load
//! and nghttpd — `.ci/run` installs them): their requests get decodable PTM1 replies, and our
//! client gets the right answers from their server.

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tensorwire_engine::{Node, Reply, TensorMessage};
use tensorwire_proto::Limits;
use tensorwire_tests::http2::{Pki, Wire};
use tensorwire_tests::pki::PemDir;
use tensorwire_tests::*;

fn ptm1(message: &TensorMessage) -> Vec<u8> {
    tensorwire_proto::ptm1::encode(message, &Limits::default())
        .unwrap()
        .to_vec()
}

fn run(program: &str, args: &[String]) -> std::process::Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} must be installed (apt-get install curl nghttp2-client nghttp2-server): {e}"))
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

#[test]
fn curl_over_h2c_posts_a_ptm1_body_and_gets_a_decodable_ptm1_reply() {
    let _serial = serial();
    let node = Wire::H2c.echo_server(Driver::Uring);
    let dir = PemDir::new();
    let message = patterned(9, 4, 10_000);
    let body = dir.write("body.ptm1", "");
    std::fs::write(&body, ptm1(&message)).unwrap();
    let reply = dir.path().join("reply.ptm1");
    let mut args = strings(&[
        "--max-time",
        "10",
        "--http2-prior-knowledge",
        "-s",
        "-D",
        "-",
    ]);
    args.extend(strings(&[
        "-H",
        "x-message-type: __pulsing_tensor_message__",
        "-H",
        "x-message-mode: ask",
    ]));
    args.extend(["--data-binary".to_owned(), format!("@{}", body.display())]);
    args.extend(["-o".to_owned(), reply.display().to_string()]);
    args.push(format!("http://{}/actors/echo", node.local_addr()));
    let output = run("curl", &args);
    let headers = String::from_utf8_lossy(&output.stdout).to_ascii_lowercase();
    assert!(headers.starts_with("http/2 200"), "{headers}");
    assert!(headers.contains("x-response-type: tensor"), "{headers}");
    let got = tensorwire_proto::ptm1::decode(
        Bytes::from(std::fs::read(&reply).unwrap()),
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(got, message);
}

#[test]
fn curl_over_mutual_tls_gets_a_decodable_ptm1_reply() {
    let _serial = serial();
    let pki = Pki::new();
    let node = Wire::Tls(pki.server_tls(true)).echo_server(Driver::Uring);
    let dir = PemDir::new();
    let (ca, cert, key) = (
        dir.write("ca.pem", &pki.ca.cert),
        dir.write("client.pem", &pki.client.cert),
        dir.write("client.key", &pki.client.key),
    );
    let message = patterned(2, 16, 4096);
    let body = dir.write("body.ptm1", "");
    std::fs::write(&body, ptm1(&message)).unwrap();
    let reply = dir.path().join("reply.ptm1");
    let mut args = strings(&["--max-time", "10", "--http2", "-s", "-w", "%{http_code}"]);
    for (flag, path) in [("--cacert", &ca), ("--cert", &cert), ("--key", &key)] {
        args.extend([flag.to_owned(), path.display().to_string()]);
    }
    args.extend(strings(&[
        "-H",
        "x-message-type: __pulsing_tensor_message__",
    ]));
    args.extend(["--data-binary".to_owned(), format!("@{}", body.display())]);
    args.extend(["-o".to_owned(), reply.display().to_string()]);
    args.push(format!("https://{}/actors/echo", node.local_addr()));
    let output = run("curl", &args);
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "200",
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let got = tensorwire_proto::ptm1::decode(
        Bytes::from(std::fs::read(&reply).unwrap()),
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(got, message);
    // Without a client certificate curl gets no answer.
    let mut args = strings(&[
        "--max-time",
        "10",
        "--http2",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
    ]);
    args.extend(["--cacert".to_owned(), ca.display().to_string()]);
    args.push(format!("https://{}/actors/echo", node.local_addr()));
    assert_eq!(String::from_utf8_lossy(&run("curl", &args).stdout), "000");
}

#[test]
fn h2load_drives_concurrent_asks_and_all_are_answered_2xx() {
    let _serial = serial();
    let node = Wire::H2c.echo_server(Driver::Uring);
    let dir = PemDir::new();
    let body = dir.write("body.ptm1", "");
    std::fs::write(&body, ptm1(&patterned(1, 2, 2000))).unwrap();
    let mut args = strings(&[
        "-n",
        "200",
        "-c",
        "4",
        "-m",
        "8",
        "-H",
        "x-message-type: __pulsing_tensor_message__",
    ]);
    args.extend(["-d".to_owned(), body.display().to_string()]);
    args.push(format!("http://{}/actors/echo", node.local_addr()));
    let output = run("h2load", &args);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("200 succeeded"), "{text}");
    assert!(text.contains("200 2xx"), "{text}");
}

#[test]
fn nghttp_sees_413_and_a_reset_for_an_oversize_body() {
    let _serial = serial();
    let node = Wire::H2c
        .builder(Driver::Uring)
        .limits(Limits::builder().max_wire_bytes(1 << 20).build())
        .build()
        .unwrap();
    node.serve_on_core("echo", |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    let dir = PemDir::new();
    let body = dir.write("body.ptm1", "");
    std::fs::write(&body, ptm1(&patterned(1, 1, 4 << 20))).unwrap();
    let mut args = strings(&["-v", "-H", "x-message-type: __pulsing_tensor_message__"]);
    args.extend(["-d".to_owned(), body.display().to_string()]);
    args.push(format!("http://{}/actors/echo", node.local_addr()));
    let text = String::from_utf8_lossy(&run("nghttp", &args).stdout).into_owned();
    assert!(text.contains(":status: 413"), "{text}");
    assert!(
        text.contains("RST_STREAM"),
        "the unread upload is reset: {text}"
    );
}

/// A header block over the limit (16 KiB) is answered 431. Checked with nghttp, which shows
/// every frame it receives: curl 7.88 sometimes reports only the reset that follows the 431
/// (`HTTP/2 stream 1 was not closed cleanly: PROTOCOL_ERROR`) while it is still uploading.
#[test]
fn nghttp_sees_431_for_a_header_block_too_large() {
    let _serial = serial();
    let node = Wire::H2c.builder(Driver::Uring).build().unwrap();
    node.serve_on_core("echo", |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    let dir = PemDir::new();
    let body = dir.write("body.ptm1", "");
    std::fs::write(&body, ptm1(&patterned(1, 2, 100))).unwrap();
    let big = format!("x-big: {}", "a".repeat(20_000));
    let mut args = strings(&[
        "-v",
        "-H",
        "x-message-type: __pulsing_tensor_message__",
        "-H",
        &big,
    ]);
    args.extend(["-d".to_owned(), body.display().to_string()]);
    args.push(format!("http://{}/actors/echo", node.local_addr()));
    let text = String::from_utf8_lossy(&run("nghttp", &args).stdout).into_owned();
    assert!(text.contains(":status: 431"), "{text}");
}

/// nghttpd with `--echo-upload` on a free port; killed when dropped.
struct Nghttpd(Child, SocketAddr);

impl Nghttpd {
    fn start(tls: Option<(&std::path::Path, &std::path::Path)>) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut command = Command::new("nghttpd");
        command.args(["--echo-upload", "-a", "127.0.0.1"]);
        match tls {
            Some((key, cert)) => command.arg(port.to_string()).arg(key).arg(cert),
            None => command.arg("--no-tls").arg(port.to_string()),
        };
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nghttpd must be installed (apt-get install nghttp2-server)");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < deadline, "nghttpd did not start listening");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self(child, addr)
    }
}

impl Drop for Nghttpd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn echoed_by(client: &Node, addr: SocketAddr, message: &TensorMessage) {
    match client
        .ask(addr, "echo", message.clone(), TIMEOUT)
        .wait()
        .unwrap()
    {
        // nghttpd answers 200 with the upload and no x-response-type: a single reply.
        Reply::Single { data, .. } => assert_eq!(data, Bytes::from(ptm1(message))),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn our_client_gets_its_body_back_from_nghttpd_over_h2c_and_tls() {
    let _serial = serial();
    let message = patterned(6, 4, 512 << 10);
    let server = Nghttpd::start(None);
    let client = Wire::H2c.builder(Driver::Uring).build().unwrap();
    echoed_by(&client, server.1, &message);
    let pki = Pki::new();
    let dir = PemDir::new();
    let (key, cert) = (
        dir.write("server.key", &pki.server.key),
        dir.write("server.pem", &pki.server.cert),
    );
    let server = Nghttpd::start(Some((&key, &cert)));
    let client = Wire::Tls(pki.client_tls(None))
        .builder(Driver::Uring)
        .build()
        .unwrap();
    echoed_by(&client, server.1, &message);
}
