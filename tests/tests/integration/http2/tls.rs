//! TLS: mutual TLS with the peer identity visible to handlers, and every way a handshake must
//! fail — untrusted server, wrong name, missing, foreign or expired client certificate, a
//! client that does not offer `h2` — each with a clear error; plaintext refused where TLS is
//! required.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use tensorwire_compat::TlsConfig;
use tensorwire_engine::{Error, Node, Reply};
use tensorwire_tests::http2::{Pki, Wire};
use tensorwire_tests::pki::{Ca, PemDir};
use tensorwire_tests::*;

/// A TLS server requiring client certificates from `pki`'s CA; it records each identity.
fn mutual_server(pki: &Pki) -> (Node, Arc<Mutex<Vec<Option<String>>>>) {
    let server = Wire::Tls(pki.server_tls(true))
        .builder(Driver::Uring)
        .build()
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    server
        .serve("whoami", 1, move |request| {
            record.lock().unwrap().push(request.identity.clone());
            Ok(Reply::Tensor(request.message))
        })
        .unwrap();
    (server, seen)
}

fn client(tls: TlsConfig) -> Node {
    Wire::Tls(tls).builder(Driver::Uring).build().unwrap()
}

fn ask(client: &Node, server: &Node) -> Result<Reply, Error> {
    client
        .ask(server.local_addr(), "whoami", patterned(1, 1, 64), TIMEOUT)
        .wait()
}

#[test]
fn mutual_tls_succeeds_and_the_handler_sees_the_client_identity() {
    let _serial = serial();
    let pki = Pki::new();
    let (server, seen) = mutual_server(&pki);
    let reply = ask(&client(pki.client_tls(Some(&pki.client))), &server).unwrap();
    assert_eq!(tensor(reply), patterned(1, 1, 64));
    assert_eq!(*seen.lock().unwrap(), vec![Some("client-a".to_owned())]);
}

#[test]
fn a_client_without_a_certificate_is_refused_by_a_mutual_tls_server() {
    let _serial = serial();
    let pki = Pki::new();
    let (server, seen) = mutual_server(&pki);
    let err = ask(&client(pki.client_tls(None)), &server).unwrap_err();
    // TLS 1.3: the client learns of the rejection on its first read, as a TLS alert.
    println!("{err}");
    assert!(err.is_tls(), "{err}");
    assert!(seen.lock().unwrap().is_empty(), "no request got through");
}

#[test]
fn a_client_certificate_from_a_foreign_ca_is_refused() {
    let _serial = serial();
    let pki = Pki::new();
    let (server, seen) = mutual_server(&pki);
    let foreign = Ca::new("someone else's CA").client("client-a");
    let err = ask(&client(pki.client_tls(Some(&foreign))), &server).unwrap_err();
    println!("{err}");
    assert!(err.is_tls(), "{err}");
    assert!(seen.lock().unwrap().is_empty());
}

#[test]
fn an_expired_client_certificate_is_refused() {
    let _serial = serial();
    let pki = Pki::new();
    let (server, seen) = mutual_server(&pki);
    let expired = pki.ca.expired_client("client-a");
    let err = ask(&client(pki.client_tls(Some(&expired))), &server).unwrap_err();
    println!("{err}");
    assert!(err.is_tls(), "{err}");
    assert!(seen.lock().unwrap().is_empty());
}

#[test]
fn a_server_from_an_untrusted_ca_is_refused_by_the_client() {
    let _serial = serial();
    let pki = Pki::new();
    let (server, _) = mutual_server(&pki);
    let other = Pki::new();
    let err = ask(&client(other.client_tls(Some(&other.client))), &server).unwrap_err();
    println!("{err}");
    assert!(err.is_tls(), "{err}");
    assert!(err.to_string().contains("certificate"), "{err}");
}

#[test]
fn a_server_certificate_for_another_name_is_refused_by_the_client() {
    let _serial = serial();
    let pki = Pki::new();
    let server = Wire::Tls(pki.server_tls(false)).echo_server(Driver::Uring);
    let tls = TlsConfig::builder()
        .trust_pem(pki.ca.cert)
        .server_name("wrong.example")
        .build()
        .unwrap();
    let err = client(tls)
        .ask(server.local_addr(), "echo", patterned(1, 1, 1), TIMEOUT)
        .wait()
        .unwrap_err();
    println!("{err}");
    assert!(err.is_tls(), "{err}");
    assert!(
        err.to_string().contains("NotValidForName") || err.to_string().contains("name"),
        "{err}"
    );
}

#[test]
fn plaintext_ptr1_and_h2c_are_refused_where_tls_is_required() {
    let _serial = serial();
    let pki = Pki::new();
    let server = Wire::Tls(pki.server_tls(false)).echo_server(Driver::Uring);
    // PTR1: an Error frame saying why.
    let mut raw = raw_stream(server.local_addr());
    raw.write_all(&encoded_ask("/actors/echo", patterned(1, 1, 8)))
        .unwrap();
    let frame = read_frame(&mut raw).unwrap().expect("an Error frame");
    let text = format!("{frame:?}");
    assert!(text.contains("TLS"), "{text}");
    // h2c: curl with prior knowledge gets no HTTP response.
    let status = curl(&[
        "--http2-prior-knowledge",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("http://{}/actors/echo", server.local_addr()),
    ]);
    assert_eq!(status.trim(), "000", "h2c got an answer: {status}");
}

#[test]
fn a_tls_client_that_offers_no_alpn_is_closed_without_http() {
    let _serial = serial();
    let pki = Pki::new();
    let server = Wire::Tls(pki.server_tls(false)).echo_server(Driver::Uring);
    let dir = PemDir::new();
    let ca = dir.write("ca.pem", &pki.ca.cert);
    // openssl s_client without -alpn: the handshake may succeed, then the server closes.
    let mut child = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &server.local_addr().to_string(),
            "-CAfile",
        ])
        .arg(&ca)
        .args(["-tls1_3", "-quiet"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl is installed");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .ok();
    let output = wait_with_timeout(child, std::time::Duration::from_secs(10));
    assert!(
        output.stdout.is_empty(),
        "the server answered: {:?}",
        String::from_utf8_lossy(&output.stdout)
    );
    // And curl offering only http/1.1 is refused in the handshake.
    let curl_ca = ca.to_string_lossy().into_owned();
    let status = curl(&[
        "--http1.1",
        "--cacert",
        &curl_ca,
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("https://{}/actors/echo", server.local_addr()),
    ]);
    assert_eq!(status.trim(), "000");
}

#[test]
fn unusable_pem_and_incomplete_settings_are_refused_with_a_clear_error() {
    let err = TlsConfig::builder()
        .identity_pem("not a pem".as_bytes().to_vec(), Vec::new())
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("certificate chain"), "{err}");
    let pki = Pki::new();
    let err = TlsConfig::builder()
        .identity_pem(pki.server.cert.clone(), pki.server.key)
        .require_client_cert(true)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("CA"), "{err}");
}

/// Runs curl; its standard output.
pub(crate) fn curl(args: &[&str]) -> String {
    let output = Command::new("curl")
        .args(["--max-time", "10"])
        .args(args)
        .output()
        .expect("curl is installed");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Waits for `child` at most `timeout`, then kills it; its output.
pub(crate) fn wait_with_timeout(
    mut child: std::process::Child,
    timeout: std::time::Duration,
) -> std::process::Output {
    let deadline = std::time::Instant::now() + timeout;
    while child.try_wait().ok().flatten().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait_with_output().expect("the child's output")
}
