//! The store's bounds against a peer that sends stripes to hold memory or places: every way an
//! assembly goes gives its budget back, one peer cannot take every place or keep an assembly
//! alive by sending new stripes, cut buffers stay within what a message can have.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::ReceiveBuffer;
use crate::stripe::Piece as StripePiece;
use crate::transport::HeapMemory;

const PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const OTHER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const LEN: u64 = 128 << 10;

fn store(memory: &Arc<HeapMemory>) -> StripeStore {
    let shared: Arc<dyn ReceiveMemory> = Arc::clone(memory) as _;
    StripeStore::new(shared, Limits::default(), 16)
}

/// Stripe `index` of 2 of request `token`, carrying its part of buffer `buffer` (`LEN` long).
fn stripe(token: u8, index: u16, buffer: u32) -> StripeDescriptor {
    stripe_of(token, index, buffer, LEN)
}

/// Stripe `index` of 2 of request `token`, carrying its part of buffer `buffer` (`len` long).
fn stripe_of(token: u8, index: u16, buffer: u32, len: u64) -> StripeDescriptor {
    StripeDescriptor {
        token: Token([token; 16]),
        index,
        count: 2,
        pieces: vec![StripePiece {
            buffer,
            buffer_len: len,
        }],
    }
}

/// Claims and fills stripe `index` (its parts marked done and charged).
fn deliver(store: &StripeStore, descriptor: &StripeDescriptor, now: Instant) {
    for part in store.claim(descriptor, PEER, now).unwrap() {
        drop(part.freeze());
    }
}

#[test]
fn a_stripe_refused_after_others_were_received_gives_their_budget_back() {
    let memory = Arc::new(HeapMemory::new(1 << 30));
    let sut = store(&memory);
    let now = Instant::now();
    deliver(&sut, &stripe(1, 0, 0), now);
    assert_eq!(memory.charged(), LEN / 2, "the received part is charged");
    let again = sut.claim(&stripe(1, 0, 0), PEER, now);
    assert!(again.unwrap_err().contains("twice"));
    assert!(sut.is_empty(), "the request failed");
    assert_eq!(memory.charged(), 0, "and its budget came back");
}

#[test]
fn small_stripes_sent_now_and_then_do_not_keep_a_request_past_its_first_stripes_ttl() {
    let memory = Arc::new(HeapMemory::new(1 << 30));
    let sut = store(&memory);
    let start = Instant::now();
    deliver(&sut, &stripe(1, 0, 0), start);
    let soon = start + ASSEMBLY_TTL - Duration::from_secs(1);
    deliver(&sut, &stripe(1, 0, 1), soon);
    assert_eq!(sut.len(), 1, "a stripe within the ttl is taken");
    // Two parts of 64 KiB in 40 s: below 64 KiB/s for the 10 s past the ttl.
    let late = start + ASSEMBLY_TTL + Duration::from_secs(10);
    let refused = sut.claim(&stripe(1, 0, 2), PEER, late).unwrap_err();
    assert!(refused.contains("after its request's first"), "{refused}");
    assert!(sut.is_empty(), "the request failed with it");
    assert_eq!(memory.charged(), 0);
}

#[test]
fn a_stripe_that_waited_behind_its_requests_others_moving_bytes_is_taken() {
    let memory = Arc::new(HeapMemory::new(1 << 30));
    let sut = store(&memory);
    let start = Instant::now();
    let big = |index| stripe_of(5, index, 0, 64 << 20);
    deliver(&sut, &big(0), start);
    // The second stripe got a connection only once the first was through, 40 s in.
    let parts = sut
        .claim(
            &big(1),
            PEER,
            start + ASSEMBLY_TTL + Duration::from_secs(10),
        )
        .expect("32 MiB came meanwhile, far above the minimum rate");
    assert_eq!(parts.len(), 1);
}

#[test]
fn one_peer_cannot_take_every_place_and_another_still_gets_one() {
    let memory = Arc::new(HeapMemory::new(1 << 30));
    let sut = store(&memory);
    let now = Instant::now();
    let held: Vec<_> = (0..MAX_ASSEMBLIES_PER_PEER)
        .map(|i| {
            let mut descriptor = stripe(0, 0, 0);
            descriptor.token.0[..8].copy_from_slice(&(i as u64).to_le_bytes());
            sut.claim(&descriptor, PEER, now).unwrap()
        })
        .collect();
    let refused = sut.claim(&stripe(0xEE, 0, 0), PEER, now).unwrap_err();
    assert!(refused.contains(&PEER.to_string()), "{refused}");
    assert!(
        sut.claim(&stripe(0xEE, 0, 0), OTHER, now).is_ok(),
        "another peer is not refused"
    );
    drop(held);
}

#[test]
fn the_stripes_one_peer_begins_hold_at_most_a_wire_limits_worth() {
    let memory = Arc::new(HeapMemory::new(1 << 30));
    let limits = Limits::builder().max_wire_bytes(2 * LEN + LEN / 2).build();
    let shared: Arc<dyn ReceiveMemory> = Arc::clone(&memory) as _;
    let sut = StripeStore::new(shared, limits, 16);
    let now = Instant::now();
    let first = sut.claim(&stripe(1, 0, 0), PEER, now).unwrap();
    let second = sut.claim(&stripe(2, 0, 0), PEER, now).unwrap();
    let refused = sut.claim(&stripe(3, 0, 0), PEER, now).unwrap_err();
    assert!(refused.contains("this peer began"), "{refused}");
    assert!(sut.claim(&stripe(3, 0, 0), OTHER, now).is_ok());
    drop((first, second));
}

#[test]
fn a_cut_buffer_beyond_what_a_message_can_have_is_refused() {
    let memory = Arc::new(HeapMemory::new(1 << 30));
    let sut = store(&memory);
    let beyond = u32::try_from(Limits::default().max_buffers()).unwrap_or(u32::MAX);
    let refused = sut
        .claim(&stripe(1, 0, beyond), PEER, Instant::now())
        .unwrap_err();
    assert!(refused.contains("cannot be a cut buffer"), "{refused}");
    assert!(sut.is_empty());
}
