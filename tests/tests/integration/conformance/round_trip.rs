//! Messages of every shape arrive intact, over every driver pair.

use std::time::Duration;

use bytes::Bytes;
use tensorwire_engine::{Node, Reply, TensorMessage};
use tensorwire_proto::stats;
use tensorwire_tests::*;

use super::conformance;

conformance!(
    pairs: [
        round_trips_with_0_1_16_and_1024_buffers_return_the_same_message,
        more_than_1024_buffers_arrive_in_order,
        empty_buffers_between_non_empty_ones_survive_the_round_trip,
        a_message_of_256_mib_arrives_intact,
        a_thousand_concurrent_asks_are_neither_lost_nor_mixed_up,
        a_single_response_reaches_the_asker,
        a_tell_is_acknowledged,
        blocking_asks_reuse_one_pooled_connection,
        sequential_asks_reuse_one_pooled_connection,
        receive_pool_slots_are_reused_in_a_steady_loop,
    ],
    servers: [],
);

fn ask(client: &Node, server: &Node, path: &str, message: TensorMessage) -> TensorMessage {
    tensor(
        client
            .ask(server.local_addr(), path, message, TIMEOUT)
            .wait()
            .unwrap_or_else(|e| panic!("ask to {path}: {e}")),
    )
}

fn round_trips_with_0_1_16_and_1024_buffers_return_the_same_message(drivers: Drivers) {
    let (server, client) = (drivers.echo_server(), drivers.client_node());
    for path in ["echo", "/actors/echo-core"] {
        for (count, len) in [(0, 0), (1, 4096), (16, 65_536), (1024, 1000)] {
            let message = patterned(u32::try_from(count).unwrap(), count, len);
            let reply = ask(&client, &server, path, message.clone());
            assert_eq!(reply, message, "{count} buffers of {len} bytes to {path}");
        }
    }
}

fn more_than_1024_buffers_arrive_in_order(drivers: Drivers) {
    let (server, client) = (drivers.echo_server(), drivers.client_node());
    let message = patterned(5, 3000, 17);
    assert_eq!(ask(&client, &server, "echo-core", message.clone()), message);
}

fn empty_buffers_between_non_empty_ones_survive_the_round_trip(drivers: Drivers) {
    let (server, client) = (drivers.echo_server(), drivers.client_node());
    let buffers = vec![
        Bytes::new(),
        Bytes::from_static(b"abc"),
        Bytes::new(),
        Bytes::new(),
        Bytes::from_static(b"d"),
    ];
    let message = TensorMessage::new(3, Bytes::new(), buffers);
    assert_eq!(ask(&client, &server, "echo", message.clone()), message);
}

fn a_message_of_256_mib_arrives_intact(drivers: Drivers) {
    let (server, client) = (drivers.echo_server(), drivers.client_node());
    let len = 256 << 20;
    let mut data = vec![0u8; len];
    for (i, chunk) in data.chunks_mut(8).enumerate() {
        let word = u64::try_from(i)
            .unwrap()
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    let message = TensorMessage::new(1, Bytes::from_static(b"big"), vec![Bytes::from(data)]);
    let expected = checksum(&message);
    let reply = ask(&client, &server, "echo-core", message);
    assert_eq!(reply.buffers[0].len(), len);
    assert_eq!(checksum(&reply), expected);
    assert!(
        client.stats().pool.misses >= 1,
        "the reply landed in a receive-pool slot"
    );
}

fn a_thousand_concurrent_asks_are_neither_lost_nor_mixed_up(drivers: Drivers) {
    let (server, client) = (drivers.echo_server(), drivers.client_node());
    let peer = server.local_addr();
    let accepted_before = stats::global().snapshot().raw_connections_accepted;
    let pendings: Vec<_> = (0..1000u32)
        .map(|i| {
            let len = 100 + i as usize;
            let fill = u8::try_from(i % 251).unwrap();
            let message = TensorMessage::new(
                i,
                Bytes::from(i.to_string()),
                vec![Bytes::from(vec![fill; len])],
            );
            let path = if i % 2 == 0 { "echo" } else { "echo-core" };
            (i, client.ask(peer, path, message, TIMEOUT))
        })
        .collect();
    for (i, pending) in pendings {
        let reply = tensor(pending.wait().unwrap_or_else(|e| panic!("ask {i}: {e}")));
        assert_eq!(reply.version, i);
        assert_eq!(reply.metadata, Bytes::from(i.to_string()));
        let fill = u8::try_from(i % 251).unwrap();
        assert_eq!(reply.buffers[0], Bytes::from(vec![fill; 100 + i as usize]));
    }
    let accepted = stats::global().snapshot().raw_connections_accepted - accepted_before;
    assert!(
        accepted > 2,
        "several connections were used, not one: {accepted}"
    );
}

fn a_single_response_reaches_the_asker(drivers: Drivers) {
    let server = drivers.server().build().unwrap();
    server
        .serve_on_core("sink", |r| {
            let total = r.message.total_bytes();
            Ok(Reply::Single {
                msg_type: "ack".into(),
                data: Bytes::from(total.to_string()),
            })
        })
        .unwrap();
    let client = drivers.client_node();
    let reply = client
        .ask(server.local_addr(), "sink", patterned(1, 3, 1000), TIMEOUT)
        .wait()
        .unwrap();
    assert_eq!(
        reply,
        Reply::Single {
            msg_type: "ack".into(),
            data: Bytes::from_static(b"3000")
        }
    );
}

fn a_tell_is_acknowledged(drivers: Drivers) {
    let server = drivers.server().build().unwrap();
    let inbox = server.endpoint("inbox").unwrap();
    let client = drivers.client_node();
    client
        .tell(server.local_addr(), "inbox", patterned(7, 2, 100), TIMEOUT)
        .wait()
        .unwrap();
    let got = inbox
        .recv_blocking(Some(TIMEOUT))
        .unwrap()
        .expect("the tell");
    assert_eq!(got.request().message, patterned(7, 2, 100));
    client
        .tell_blocking(server.local_addr(), "inbox", patterned(8, 1, 1), TIMEOUT)
        .unwrap();
    assert_eq!(inbox.queued(), 1);
}

fn blocking_asks_reuse_one_pooled_connection(drivers: Drivers) {
    let (server, client) = (drivers.echo_server(), drivers.client_node());
    let before = stats::global().snapshot().raw_connections_accepted;
    for i in 0..20 {
        let message = patterned(i, 2, 3000);
        let reply = client.ask_blocking(server.local_addr(), "echo-core", message.clone(), TIMEOUT);
        assert_eq!(tensor(reply.unwrap()), message);
    }
    let opened = stats::global().snapshot().raw_connections_accepted - before;
    assert_eq!(
        opened, 1,
        "one pooled connection served all 20 blocking asks"
    );
}

fn sequential_asks_reuse_one_pooled_connection(drivers: Drivers) {
    let server = drivers.echo_server();
    let client = drivers.client().cores(1).build().unwrap();
    let before = stats::global().snapshot().raw_connections_accepted;
    for i in 0..20 {
        ask(&client, &server, "echo", patterned(i, 1, 10));
    }
    let opened = stats::global().snapshot().raw_connections_accepted - before;
    assert_eq!(opened, 1, "one connection served all 20 asks");
}

fn receive_pool_slots_are_reused_in_a_steady_loop(drivers: Drivers) {
    let (server, client) = (drivers.echo_server(), drivers.client_node());
    let message = patterned(1, 1, 4 << 20);
    for _ in 0..5 {
        assert_eq!(ask(&client, &server, "echo-core", message.clone()), message);
        std::thread::sleep(Duration::from_millis(1));
    }
    let pool = client.stats().pool;
    assert!(
        pool.hits >= 3,
        "the reply memory came back to the pool and was reused: {pool:?}"
    );
}
