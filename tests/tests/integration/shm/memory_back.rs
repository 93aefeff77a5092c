//! A node's shared-memory segments go back to the system once idle, however many messages each
//! one carried.

use std::time::{Duration, Instant};

use tensorwire_engine::Reply;
use tensorwire_tests::*;

/// Waits until `f` holds, up to `limit`.
fn within(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !f() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[test]
fn segments_that_carried_several_messages_are_given_back_once_idle() {
    let _serial = serial();
    let server = shm_builder().build().unwrap();
    server
        .serve("echo", 2, |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    // No idle cache: every segment idle for 2 s is retired.
    let client = shm_builder()
        .shm_idle_keep(0)
        .shm_idle_after(Duration::from_secs(2))
        .build()
        .unwrap();
    for round in 0..3 {
        let message = patterned(round, 1, 8 << 20);
        let reply = tensor(
            client
                .ask(server.local_addr(), "echo", message.clone(), TIMEOUT)
                .wait()
                .unwrap(),
        );
        assert_eq!(reply, message);
    }
    assert!(
        client.stats().shm_segment_bytes > 0,
        "the asks used segments"
    );
    // The first ask announced the segment to the server; the later ones reused it. Retired,
    // it must be unmapped and its memory given back, not kept by the connection.
    assert!(
        within(Duration::from_secs(8), || {
            let stats = client.stats();
            stats.shm_segments == 0 && stats.shm_segment_bytes == 0
        }),
        "idle segments are given back: {} segments, {} bytes still held",
        client.stats().shm_segments,
        client.stats().shm_segment_bytes
    );
}
