//! Where a same-host message travels by its size: inside a record of the queue (small), or
//! copied into a slot — on the sending thread when the copy is small and a slot is free, on
//! the copy thread otherwise.

use tensorwire_engine::{Endpoint, Incoming, Node, TensorMessage};
use tensorwire_proto::stats;
use tensorwire_tests::*;

use super::data_path::eventually;

/// A server with an `inbox` endpoint, and a client node.
fn server_inbox_client() -> (Node, Endpoint, Node) {
    let server = shm_builder().build().unwrap();
    let inbox = server.endpoint("inbox").unwrap();
    (server, inbox, shm_builder().build().unwrap())
}

/// Tells `message` from `client` to `server`'s inbox and receives it there.
fn through(client: &Node, server: &Node, inbox: &Endpoint, message: TensorMessage) -> Incoming {
    client
        .tell(server.local_addr(), "inbox", message, TIMEOUT)
        .wait()
        .unwrap();
    inbox.recv_blocking(Some(TIMEOUT)).unwrap().unwrap()
}

#[test]
fn a_small_message_travels_in_the_record_and_holds_no_memory() {
    let _serial = serial();
    let (server, inbox, client) = server_inbox_client();
    let before = stats::global().snapshot();
    let incoming = through(&client, &server, &inbox, patterned(3, 3, 2048));
    assert_eq!(incoming.request().message, patterned(3, 3, 2048));
    assert_eq!(client.stats().shm_leases, 0, "no slot was lent for it");
    assert!(
        eventually(|| stats::global().snapshot().shm_messages_sent > before.shm_messages_sent),
        "it went over shared memory"
    );
}

#[test]
fn a_message_above_8_kib_goes_in_a_slot_copied_by_the_thread_that_sends_it() {
    let _serial = serial();
    let server = shm_builder().build().unwrap();
    let inbox = server.endpoint_with_capacity("inbox", 8).unwrap();
    let client = shm_builder().build().unwrap();
    // Once to set up the connection.
    drop(through(&client, &server, &inbox, patterned(1, 1, 16)));
    // A tell is sent from this thread without waiting for its reply (as an async ask is): a
    // 36 KiB copy is made here, a 1 MiB one on the copy thread. The counters are the
    // process's, so a few tries allow for a test running beside this one.
    let copy_thread_copies = |message: TensorMessage| {
        let mut seen = Vec::new();
        for _ in 0..5 {
            let before = stats::global().snapshot().shm_copy_thread_copies;
            let incoming = through(&client, &server, &inbox, message.clone());
            assert_eq!(incoming.request().message, message);
            seen.push(stats::global().snapshot().shm_copy_thread_copies - before);
            if seen.last() == Some(&0) {
                break;
            }
        }
        seen
    };
    let seen = copy_thread_copies(patterned(2, 3, 12 << 10));
    assert_eq!(
        seen.last(),
        Some(&0),
        "copies on the copy thread per try: {seen:?}"
    );
    let held = through(&client, &server, &inbox, patterned(2, 3, 4096));
    // The tries dropped just before release their slots asynchronously.
    assert!(
        eventually(|| client.stats().shm_leases == 1),
        "the 12 KiB message holds one slot: {} lent",
        client.stats().shm_leases
    );
    drop(held);
    assert!(eventually(|| client.stats().shm_leases == 0));
    let before = stats::global().snapshot().shm_copy_thread_copies;
    let incoming = through(&client, &server, &inbox, patterned(3, 1, 1 << 20));
    assert_eq!(incoming.request().message, patterned(3, 1, 1 << 20));
    assert!(stats::global().snapshot().shm_copy_thread_copies > before);
}

#[test]
fn a_slot_loaned_by_another_node_of_this_process_is_copied_not_named() {
    let _serial = serial();
    let server = shm_builder().build().unwrap();
    let inbox = server.endpoint("inbox").unwrap();
    let (lender, sender) = (
        shm_builder().build().unwrap(),
        shm_builder().build().unwrap(),
    );
    // The sender's own segment 1 holds other bytes: a loan of the lender's segment 1 named by
    // segment and offset would have the server read those.
    let own = patterned(1, 1, 1 << 20);
    drop(through(&sender, &server, &inbox, own));
    assert!(eventually(|| sender.stats().shm_leases == 0));
    let mut loan = lender.shm().loan(1 << 20).unwrap();
    loan.as_mut_slice().fill(0xA5);
    let buffer = loan.freeze();
    let message = TensorMessage::new(
        2,
        bytes::Bytes::from_static(b"{}"),
        vec![buffer.clone(), buffer.slice(4096..8192)],
    );
    let incoming = through(&sender, &server, &inbox, message.clone());
    let received = &incoming.request().message;
    assert!(
        received
            .buffers
            .iter()
            .all(|b| b.iter().all(|&x| x == 0xA5)),
        "the server read other bytes than the loan's"
    );
    assert_eq!(received, &message);
    assert_eq!(sender.stats().shm_leases, 1, "the sender lent its own copy");
}

#[test]
fn buffers_of_one_loan_travel_under_one_lease_until_the_last_view_drops() {
    let _serial = serial();
    let (server, inbox, client) = server_inbox_client();
    let mut loan = client.shm().loan(64 << 10).unwrap();
    for (i, b) in loan.as_mut_slice().iter_mut().enumerate() {
        *b = (i / 1024).to_le_bytes()[0];
    }
    let whole = loan.freeze();
    let parts: Vec<_> = (0..16)
        .map(|i| whole.slice(i * 4096..(i + 1) * 4096))
        .collect();
    let message = TensorMessage::new(3, bytes::Bytes::from_static(b"{}"), parts);
    let before = stats::global().snapshot().shm_zero_copy_buffers;
    let incoming = through(&client, &server, &inbox, message.clone());
    let mut received = incoming.request().message.clone();
    drop(incoming);
    assert_eq!(received, message);
    assert!(stats::global().snapshot().shm_zero_copy_buffers >= before + 16);
    assert_eq!(
        client.stats().shm_leases,
        1,
        "16 views of one loan, one lease"
    );
    // Views dropped out of order: the lease holds until the last one goes.
    let last = received.buffers.swap_remove(7);
    drop(received);
    // Releases travel asynchronously: give a wrongly released lease time to show.
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(client.stats().shm_leases, 1, "a view still holds the loan");
    assert_eq!(last[..], message.buffers[7][..]);
    drop(last);
    assert!(eventually(|| client.stats().shm_leases == 0));
}
