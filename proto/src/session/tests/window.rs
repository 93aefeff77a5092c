//! The receive window: how much final memory a frame's bytes open ahead of them, cold and
//! warm, within the receive budget.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use super::pair::{CountingMemory, Pair};
use super::server::{frames, header};
use crate::ptr1::Frame;
use crate::session::{CloseReason, SessionConfig};

#[test]
fn a_header_declaring_huge_buffers_commits_no_memory_until_bytes_arrive() {
    let mut sut = Pair::new();
    let wire = ask_head(&[16 << 20; 16]);
    sut.raw_to_server(&wire);
    // Only the first buffer has memory, and only a small window of it is prepared (committed)
    // and charged to the budget.
    assert_eq!(sut.memory.allocations.load(Relaxed), 1);
    assert_eq!(sut.memory.prepared.load(Relaxed), 64 << 10);
    assert_eq!(sut.memory.heap.charged(), 64 << 10);
    sut.raw_to_server(&[1]);
    assert_eq!(sut.memory.allocations.load(Relaxed), 1);
    assert_eq!(
        sut.memory.heap.charged(),
        (64 << 10) + 1,
        "the window slides by what arrived"
    );
}

#[test]
fn memory_is_committed_a_bounded_window_ahead_of_the_bytes_that_arrived() {
    let mut sut = Pair::new();
    let wire = ask_head(&[64 << 20]);
    sut.raw_to_server(&wire);
    let mut arrived = 0u64;
    for _ in 0..40 {
        sut.raw_to_server(&[7; 50_000]);
        arrived += 50_000;
        let charged = sut.memory.heap.charged();
        let prepared = sut.memory.prepared.load(Relaxed);
        assert!(
            charged <= 5 * arrived + (64 << 10) && prepared == charged,
            "{charged} charged, {prepared} prepared for {arrived} arrived"
        );
    }
    // The peer gives up: everything charged is given back.
    sut.to_server.finished = true;
    sut.drive();
    assert!(matches!(
        sut.server_closed,
        Some(CloseReason::Truncated { .. })
    ));
    assert_eq!(sut.memory.heap.charged(), 0);
}

/// A server whose receive memory is a warm pool slot (committed already) and whose budget is
/// `budget` bytes.
fn warm_pair(budget: u64) -> (Pair, Arc<CountingMemory>) {
    let memory = CountingMemory::new(budget);
    memory.warm.store(true, Relaxed);
    (pair_with(&memory), memory)
}

/// A pair whose server receives into `memory`.
fn pair_with(memory: &Arc<CountingMemory>) -> Pair {
    let mut sut = Pair::new();
    let shared: Arc<dyn crate::transport::ReceiveMemory> = memory.clone();
    sut.server = crate::session::ServerSession::new(
        Arc::new(SessionConfig::default()),
        shared,
        false,
        sut.now,
    );
    sut
}

/// The head of an ask to `/actors/echo` declaring buffers of `lens` bytes, without metadata.
fn ask_head(lens: &[u64]) -> Vec<u8> {
    let mut wire = header(1, 12, 0, lens);
    wire.extend_from_slice(b"/actors/echo");
    wire
}

#[test]
fn committed_memory_opens_a_wider_window_once_bytes_paid_for_it() {
    let (mut sut, memory) = warm_pair(1 << 30);
    let wire = ask_head(&[4 << 20]);
    sut.raw_to_server(&wire);
    // A header alone opens the smallest window, warm memory or not: what is exposed is
    // charged to the shared budget, and a peer that stalls after its header holds no more.
    assert_eq!(memory.allocations.load(Relaxed), 1);
    assert_eq!(memory.heap.charged(), 64 << 10);
    // Once 64 KiB arrived, the warm section is open whole (64 times what came, where cold
    // memory opens 4 times), so one read can take the rest of it.
    sut.raw_to_server(&vec![9; 64 << 10]);
    assert_eq!(memory.heap.charged(), 4 << 20);
    sut.raw_to_server(&vec![9; (4 << 20) - (64 << 10)]);
    assert_eq!(sut.requests.len(), 1);
    assert_eq!(sut.requests[0].1.message.buffers[0].len(), 4 << 20);
    assert!(sut.requests[0].1.message.buffers[0].iter().all(|&b| b == 9));
    assert_eq!(memory.heap.charged(), 0, "the frame gave its charge back");
}

#[test]
fn committed_memory_beyond_the_budget_opens_only_the_window_the_bytes_paid_for() {
    // Room for the cold window and what the bytes bring, not for the wider warm one.
    let (mut sut, memory) = warm_pair((64 << 10) + 2000);
    let wire = ask_head(&[4 << 20]);
    sut.raw_to_server(&wire);
    assert_eq!(memory.heap.charged(), 64 << 10);
    sut.raw_to_server(&[1; 1000]);
    assert_eq!(
        memory.heap.charged(),
        (64 << 10) + 1000,
        "the window slides as before"
    );
}

#[test]
fn a_frame_over_the_receive_budget_is_answered_with_an_error() {
    let wire_head = ask_head(&[4 << 20]);
    // A budget smaller than the first window.
    let memory = CountingMemory::new(1000);
    let mut sut = pair_with(&memory);
    sut.raw_to_server(&wire_head);
    sut.raw_to_server(&[0; 5000]);
    let replies = frames(&sut.take_from_server());
    assert!(
        matches!(&replies[..], [Frame::Error { text, .. }] if text.contains("frames still arriving may hold at most 1000 bytes")),
        "{replies:?}"
    );
    assert_eq!(memory.heap.charged(), 0);
}

#[test]
fn a_long_length_table_does_not_open_the_warm_window() {
    // 4,096 buffers: a 32 KiB length table, then nothing. The head counts for the cold window
    // (four times it) but not for the warm one, which needs body bytes.
    let (mut sut, memory) = warm_pair(1 << 30);
    let mut lens = vec![1u64; 4096];
    lens[0] = 16 << 20;
    let wire = ask_head(&lens);
    let head_len = u64::try_from(wire.len()).unwrap();
    sut.raw_to_server(&wire);
    assert_eq!(memory.heap.charged(), 4 * head_len);
    assert!(
        memory.heap.charged() < 1 << 20,
        "the warm window opened on a head alone"
    );
}
