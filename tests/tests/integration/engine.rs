use std::time::Duration;

use tensorwire_tests::*;

#[test]
fn echo_round_trip_with_one_buffer_over_tcp() {
    let server = echo_node();
    let client = client_node();
    let message = patterned(7, 1, 1000);
    let reply = client
        .ask(
            server.local_addr(),
            "/actors/echo",
            message.clone(),
            TIMEOUT,
        )
        .wait();
    assert_eq!(tensor(reply.unwrap()), message);
    let _ = Duration::ZERO;
}
