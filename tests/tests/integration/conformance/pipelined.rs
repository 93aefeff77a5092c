//! Client-side pipelining on every driver pair: a node with many asks on their way to a peer
//! that says it pipelines gathers them onto a few connections, every reply reaching its own
//! asker; a peer that does not say so never gets a request before it answered the last.

use std::time::Duration;

use tensorwire_engine::Node;
use tensorwire_proto::ptr1::Frame;
use tensorwire_proto::stats;
use tensorwire_proto::stripe::CAPABILITIES_PATH;
use tensorwire_tests::stripes::StrictPeer;
use tensorwire_tests::*;

use super::conformance;

conformance!(
    pairs: [
        concurrent_asks_to_a_peer_that_pipelines_share_a_few_connections,
        a_peer_without_the_capability_never_gets_a_request_before_its_last_reply,
        a_peer_with_the_capability_gets_pipelined_requests_and_answers_each_in_order,
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

fn is_capabilities_ask(frame: &Frame) -> bool {
    matches!(frame, Frame::Ask { path, .. } if path == CAPABILITIES_PATH)
}
