//! The router's choice per send: `Node::route_to` explains it, `ask_via` forces a path past the
//! in-process shortcut, and the choice matches where the bytes went.

use std::time::Duration;

use tensorwire_engine::{Node, Preference, Reply, Route};
use tensorwire_tests::{any_local_address, patterned};

const TIMEOUT: Duration = Duration::from_secs(10);

fn echo_node() -> Node {
    let node = Node::builder(any_local_address())
        .shared_memory(false)
        .build()
        .unwrap();
    node.serve("echo", 1, |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    node
}

#[test]
fn a_node_in_this_process_is_reached_through_its_mailbox_unless_a_path_is_forced() {
    let server = echo_node();
    let client = Node::builder(any_local_address())
        .shared_memory(false)
        .build()
        .unwrap();
    let auto = client.route_to(server.local_addr(), None).unwrap();
    assert_eq!(auto.route, Route::LocalMailbox);
    assert!(auto.reason.contains("in this process"), "{}", auto.reason);

    let forced = client
        .route_to(server.local_addr(), Some(Preference::Raw))
        .unwrap();
    assert_eq!(forced.route, Route::RawTcp);
    assert!(
        forced.reason.contains("asked for this send"),
        "{}",
        forced.reason
    );

    // Same process: the reply aliases the buffer sent. Forced over PTR1: it is a copy that
    // crossed a socket into receive memory.
    let sent = patterned(1, 1, 4096);
    let ask = |force| {
        let reply = client
            .ask_via(server.local_addr(), "echo", sent.clone(), TIMEOUT, force)
            .wait()
            .unwrap();
        let Reply::Tensor(reply) = reply else {
            panic!("a tensor reply")
        };
        assert_eq!(reply, sent);
        reply.buffers[0].as_ptr() == sent.buffers[0].as_ptr()
    };
    assert!(
        ask(None),
        "the in-process reply aliases the sender's buffer"
    );
    assert!(
        !ask(Some(Preference::Raw)),
        "the forced ask crossed a socket as PTR1"
    );
}

#[test]
fn forcing_http2_without_the_transport_plugged_in_is_a_clear_error() {
    let server = echo_node();
    let client = Node::builder(any_local_address())
        .shared_memory(false)
        .build()
        .unwrap();
    let err = client
        .route_to(server.local_addr(), Some(Preference::Http2))
        .unwrap_err();
    assert!(err.to_string().contains("HTTP/2"), "{err}");
    let err = client
        .tell_via(
            server.local_addr(),
            "echo",
            patterned(1, 0, 0),
            TIMEOUT,
            Some(Preference::Http2),
        )
        .wait()
        .unwrap_err();
    assert!(err.to_string().contains("HTTP/2"), "{err}");
}
