//! Client-side pipelining on every driver pair: a node with many asks on their way to a peer
//! that says it pipelines gathers them onto a few connections, every reply reaching its own
//! asker; a peer that does not say so never gets a request before it answered the last.

use std::time::Duration;

use tensorwire_engine::Node;
use tensorwire_proto::ptr1::Frame;
use tensorwire_proto::stats;
use tensorwire_proto::stripe::CAPABILITIES_PATH;
use tensorwire_proto::transport::Error;
use tensorwire_tests::stripes::StrictPeer;
use tensorwire_tests::*;

use super::conformance;

conformance!(
    pairs: [
        concurrent_asks_to_a_peer_that_pipelines_share_a_few_connections,
        a_peer_without_the_capability_never_gets_a_request_before_its_last_reply,
        a_peer_with_the_capability_gets_pipelined_requests_and_answers_each_in_order,
        requests_queued_on_a_connection_that_fails_before_writing_them_go_another_way,
    ],
    servers: [],
);

/// Asks in flight at once in each wave.
const WAVE: usize = 64;

/// Sends `WAVE` asks of distinct messages at once to `to` and checks every reply is its own
/// ask's message.
fn wave(client: &Node, to: std::net::SocketAddr, round: u32) {
    let messages: Vec<_> = (0..WAVE)
        .map(|i| patterned(round * 1000 + u32::try_from(i).unwrap(), 1, 1000 + i * 37))
        .collect();
    let asks: Vec<_> = messages
        .iter()
        .map(|m| client.ask(to, "echo", m.clone(), TIMEOUT))
        .collect();
    for (ask, message) in asks.into_iter().zip(&messages) {
        let reply = tensor(ask.wait().expect("the ask is answered"));
        assert_eq!(&reply, message, "a reply reached the wrong asker");
    }
}

fn concurrent_asks_to_a_peer_that_pipelines_share_a_few_connections(drivers: Drivers) {
    let server = drivers.echo_server();
    let client = drivers
        .client()
        .cores(1)
        .idle_connections_per_peer(2)
        .idle_trim_after(Duration::from_millis(100))
        .build()
        .unwrap();
    // The first wave goes one ask per connection while the peer is asked what it takes.
    wave(&client, server.local_addr(), 0);
    std::thread::sleep(Duration::from_millis(400)); // idle connections above 2 are trimmed
    let before = stats::global().snapshot().raw_connections_accepted;
    for round in 1..4 {
        wave(&client, server.local_addr(), round);
    }
    let opened = stats::global().snapshot().raw_connections_accepted - before;
    // One per ask would take 32 (the pool's cap), less the 2 kept idle, in each wave.
    assert!(
        opened <= 4,
        "{opened} connections opened for 3 waves of {WAVE} asks"
    );
}

fn a_peer_without_the_capability_never_gets_a_request_before_its_last_reply(drivers: Drivers) {
    let peer = StrictPeer::start();
    let client = drivers.client().cores(1).build().unwrap();
    for round in 0..3 {
        wave(&client, peer.addr(), round);
    }
    let seen = peer.seen();
    assert!(
        seen.iter().any(|s| is_capabilities_ask(&s.frame)),
        "the peer was asked what it takes"
    );
    let early = seen.iter().filter(|s| s.pipelined).count();
    assert_eq!(
        early, 0,
        "requests pipelined to a peer that never said it takes them"
    );
}

fn a_peer_with_the_capability_gets_pipelined_requests_and_answers_each_in_order(drivers: Drivers) {
    // The control for the test above: the same peer, saying it takes 8 at once, reads them
    // one after another all the same.
    let peer = StrictPeer::start_answering(Some(8));
    let client = drivers.client().cores(1).build().unwrap();
    for round in 0..3 {
        wave(&client, peer.addr(), round);
    }
    let early = peer.seen().iter().filter(|s| s.pipelined).count();
    assert!(
        early > 0,
        "no request was pipelined to a peer that takes them"
    );
}

fn requests_queued_on_a_connection_that_fails_before_writing_them_go_another_way(drivers: Drivers) {
    // One connection to the peer, which takes 64 requests at once: a burst of 60 KiB asks is
    // pipelined onto it, far more than its socket buffers hold while the peer reads nothing.
    let peer = StrictPeer::start_narrow(Some(64));
    let client = drivers
        .client()
        .cores(1)
        .max_connections_per_peer(1)
        .build()
        .unwrap();
    wave(&client, peer.addr(), 0); // the peer is asked what it takes
    peer.hold();
    let before = peer.seen().len();
    let messages: Vec<_> = (0..48).map(|i| patterned(7000 + i, 1, 60 << 10)).collect();
    let asks: Vec<_> = messages
        .iter()
        .map(|m| client.ask(peer.addr(), "echo", m.clone(), TIMEOUT))
        .collect();
    peer.wait_held();
    // The client fills what the kernel takes of the frames behind it meanwhile.
    std::thread::sleep(Duration::from_millis(200));
    // The connection breaks with the peer holding its first frame unanswered: whatever had
    // gone out fails (the peer may have seen it), what had not goes on a new connection.
    peer.close_held();
    let (mut answered, mut failed) = (0, 0);
    for (ask, message) in asks.into_iter().zip(&messages) {
        match ask.wait() {
            Ok(reply) => {
                assert_eq!(&tensor(reply), message, "a reply reached the wrong asker");
                answered += 1;
            }
            Err(e) => {
                assert!(matches!(e, Error::ConnectionClosed { .. }), "{e}");
                failed += 1;
            }
        }
    }
    assert!(failed >= 1, "the held request fails with its connection");
    // The kernel holds a few dozen KiB of a connection with 536-byte segments and a 4 KiB
    // window, and a transmit is 256 KiB at most: most of the 48 were never written.
    assert!(
        answered >= messages.len() / 2,
        "only {answered} of {} went another way ({failed} failed with the connection)",
        messages.len()
    );
    let versions: Vec<u32> = peer.seen()[before..]
        .iter()
        .filter_map(|s| match &s.frame {
            Frame::Ask { path, message } if path == "/actors/echo" => Some(message.version),
            _ => None,
        })
        .collect();
    let distinct: std::collections::HashSet<_> = versions.iter().collect();
    assert_eq!(
        distinct.len(),
        versions.len(),
        "a request reached the peer twice"
    );
}

fn is_capabilities_ask(frame: &Frame) -> bool {
    matches!(frame, Frame::Ask { path, .. } if path == CAPABILITIES_PATH)
}
