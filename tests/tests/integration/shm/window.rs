//! A window of asks waited for on the calling thread (`Node::ask_to` + `Node::wait_for`, what
//! Python's `ask_nowait` uses): every reply arrives, in order, over shared memory and over
//! PTR1; a wait limited in time leaves its ask going.

use std::collections::VecDeque;
use std::time::Duration;

use tensorwire_engine::{Node, Preference, Reply, Route, Via};
use tensorwire_tests::*;

fn pair(preference: Preference) -> (Node, Node) {
    let server = Node::builder(any_local_address())
        .in_process_delivery(false)
        .shared_memory(true)
        .build()
        .unwrap();
    server
        .serve("echo", 2, |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    server
        .serve("slow", 1, |r| {
            std::thread::sleep(Duration::from_millis(300));
            Ok(Reply::Tensor(r.message))
        })
        .unwrap();
    let client = Node::builder(any_local_address())
        .in_process_delivery(false)
        .shared_memory(true)
        .preference(preference)
        .build()
        .unwrap();
    (server, client)
}

#[test]
fn a_window_of_asks_waited_for_on_the_calling_thread_gets_every_reply_in_order() {
    let _serial = serial();
    for (preference, route) in [
        (Preference::SharedMemory, Route::SharedMemory),
        (Preference::Raw, Route::RawTcp),
    ] {
        let (server, client) = pair(preference);
        let to = client
            .destination(server.local_addr(), "echo", Via::Preferred)
            .unwrap();
        let (mut window, mut next, mut checked) = (VecDeque::new(), 0u32, 0u32);
        while checked < 300 {
            while window.len() < 8 && next < 300 {
                let message = patterned(next, 2, 1000 + next as usize * 97);
                window.push_back((message.clone(), client.ask_to(&to, message, TIMEOUT)));
                next += 1;
            }
            let (sent, mut pending) = window.pop_front().expect("asks are in flight");
            let (reply, took) = client
                .wait_for(&to, &mut pending, None, None)
                .expect("no limit: the wait ends with the ask")
                .unwrap();
            assert_eq!(took, route, "ask {checked}");
            assert_eq!(tensor(reply), sent, "ask {checked}");
            checked += 1;
        }
    }
}

#[test]
fn a_wait_that_reaches_its_limit_leaves_the_ask_going() {
    let _serial = serial();
    for preference in [Preference::SharedMemory, Preference::Raw] {
        let (server, client) = pair(preference);
        let to = client
            .destination(server.local_addr(), "slow", Via::Preferred)
            .unwrap();
        let sent = patterned(7, 1, 4096);
        let mut pending = client.ask_to(&to, sent.clone(), TIMEOUT);
        // The handler answers after 300 ms: a wait that honoured its 50 ms limit saw nothing.
        let limited = client.wait_for(&to, &mut pending, Some(Duration::from_millis(50)), None);
        assert!(
            limited.is_none(),
            "{preference:?}: the wait outlived its limit and saw the reply"
        );
        let (reply, _) = client
            .wait_for(&to, &mut pending, None, None)
            .expect("no limit")
            .unwrap();
        assert_eq!(tensor(reply), sent, "{preference:?}");
    }
}
