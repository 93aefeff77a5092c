//! Striping between sessions: stripes on several connections into one store, the request
//! put together from them, and every way it can fail delivering nothing.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::pair::{Pair, message};
use crate::Limits;
use crate::session::{ASSEMBLY_TTL, StripeStore};
use crate::stripe::{
    CAPABILITIES_TYPE, Capabilities, EXTENSION_STRIPE, Framing, Plan, Token, plan,
};
use crate::transport::{Answer, Error, HeapMemory, Reply, RequestKind};

const TIMEOUT: Duration = Duration::from_secs(30);

fn store() -> Arc<StripeStore> {
    Arc::new(StripeStore::new(
        Arc::new(HeapMemory::new(1 << 30)),
        Limits::default(),
        16,
    ))
}

fn striped(message: &crate::TensorMessage, count: u16) -> Plan {
    plan(message, count, Token([7; 16])).unwrap()
}

/// Sends every stripe of `plan` on a connection of its own; returns each one's outcome.
fn send_stripes(store: &Arc<StripeStore>, plan: &Plan) -> Vec<Result<Answer, Error>> {
    plan.stripes
        .iter()
        .map(|(descriptor, parts)| {
            let mut pair = Pair::new().with_stripes(Arc::clone(store));
            pair.read_chunk = 100_003; // reads that never line up with the parts
            let framing = Framing::Stripe(descriptor.clone());
            pair.start_framed(RequestKind::Tell, parts.clone(), &framing, TIMEOUT);
            pair.drive();
            assert!(pair.requests.is_empty(), "a stripe is never delivered");
            pair.done.pop().expect("the stripe was answered")
        })
        .collect()
}

/// Sends the striped request of `plan` on a connection of its own.
fn send_request(store: &Arc<StripeStore>, plan: Plan) -> (Pair, Result<Answer, Error>) {
    let mut pair = Pair::new().with_stripes(Arc::clone(store));
    pair.start_framed(RequestKind::Ask, plan.request, &Framing::Striped, TIMEOUT);
    pair.drive();
    let outcome = pair.done.pop().expect("the request was answered");
    (pair, outcome)
}

#[test]
fn a_striped_ask_is_delivered_whole_from_stripes_on_separate_connections() {
    let store = store();
    let request = message(&[3 << 20, 100, (1 << 20) + 12_345]);
    let plan = striped(&request, 4);
    for outcome in send_stripes(&store, &plan) {
        assert_eq!(outcome.unwrap(), Answer::Ack);
    }
    let (pair, answer) = send_request(&store, plan);
    assert_eq!(
        answer.unwrap(),
        Answer::Reply(Reply::Tensor(request.clone()))
    );
    assert_eq!(pair.requests.len(), 1);
    assert_eq!(
        pair.requests[0].1.message, request,
        "delivered exactly as sent"
    );
    assert!(store.is_empty(), "the request took its stripes");
}

#[test]
fn a_stripe_cut_off_mid_body_fails_its_request_and_nothing_is_delivered() {
    let store = store();
    let request = message(&[4 << 20]);
    let plan = striped(&request, 4);
    // Three stripes arrive; the fourth connection breaks half-way through its body.
    let (last, first) = plan.stripes.split_last().unwrap();
    for (descriptor, parts) in first {
        let mut pair = Pair::new().with_stripes(Arc::clone(&store));
        pair.start_framed(
            RequestKind::Tell,
            parts.clone(),
            &Framing::Stripe(descriptor.clone()),
            TIMEOUT,
        );
        pair.drive();
        assert_eq!(pair.done.pop().unwrap().unwrap(), Answer::Ack);
    }
    let frame = crate::ptr1::Frame::Tell {
        path: last.0.to_path(),
        message: last.1.clone(),
    };
    let bytes = crate::ptr1::encode_extended(&frame, EXTENSION_STRIPE, &Limits::default())
        .unwrap()
        .to_vec();
    let mut cut = Pair::new().with_stripes(Arc::clone(&store));
    cut.raw_to_server(&bytes[..bytes.len() / 2]);
    assert_eq!(store.len(), 1, "the stripe is being received");
    cut.to_server.finished = true; // the connection breaks half-way through the body
    cut.drive();
    assert!(cut.server_closed.is_some(), "{:?}", cut.server_closed);
    assert!(
        store.is_empty(),
        "the broken stripe failed its request at once"
    );

    let (pair, answer) = send_request(&store, plan);
    let text = match answer {
        Err(Error::Remote { text, .. }) => text,
        other => panic!("expected a remote error, got {other:?}"),
    };
    assert!(text.contains("missing"), "{text}");
    assert!(pair.requests.is_empty(), "nothing was delivered");
}

#[test]
fn a_striped_request_whose_stripes_never_came_is_refused() {
    let store = store();
    let plan = striped(&message(&[1 << 20]), 2);
    let (pair, answer) = send_request(&store, plan);
    assert!(matches!(answer, Err(Error::Remote { .. })), "{answer:?}");
    assert!(pair.requests.is_empty());
}

#[test]
fn a_stripe_sent_twice_is_refused() {
    let store = store();
    let plan = striped(&message(&[1 << 20]), 2);
    let twice = Plan {
        stripes: vec![plan.stripes[0].clone(), plan.stripes[0].clone()],
        request: plan.request.clone(),
    };
    let outcomes = send_stripes(&store, &twice);
    assert_eq!(outcomes[0].as_ref().unwrap(), &Answer::Ack);
    let text = match &outcomes[1] {
        Err(Error::Remote { text, .. }) => text.clone(),
        other => panic!("expected a remote error, got {other:?}"),
    };
    assert!(text.contains("twice"), "{text}");
}

#[test]
fn stripes_whose_request_never_comes_are_dropped_after_their_ttl() {
    let store = store();
    let plan = striped(&message(&[1 << 20]), 2);
    send_stripes(&store, &plan);
    assert_eq!(store.len(), 1);
    let now = std::time::Instant::now();
    store.sweep(now); // starts the idle clock
    store.sweep(now + ASSEMBLY_TTL / 2);
    assert_eq!(store.len(), 1, "not yet");
    store.sweep(now + ASSEMBLY_TTL + Duration::from_secs(1));
    assert!(store.is_empty());
}

#[test]
fn every_node_answers_the_capabilities_ask_and_only_one_that_takes_stripes_offers_them() {
    let ask = crate::TensorMessage::new(0, Bytes::new(), Vec::new());
    for takes in [true, false] {
        let mut pair = Pair::new();
        if takes {
            pair = pair.with_stripes(store());
        }
        pair.start_framed(
            RequestKind::Ask,
            ask.clone(),
            &Framing::Capabilities,
            TIMEOUT,
        );
        pair.drive();
        let answer = pair.done.pop().unwrap();
        let Ok(Answer::Reply(Reply::Single { msg_type, data })) = answer else {
            panic!("{answer:?}");
        };
        assert_eq!(msg_type, CAPABILITIES_TYPE);
        let stripes = takes.then_some(Capabilities { max_stripes: 16 });
        assert_eq!(Capabilities::parse(&data), stripes, "{data:?}");
        assert_eq!(
            crate::stripe::pipeline_depth(&data),
            Some(64),
            "it reads ahead as many requests as it queues replies: {data:?}"
        );
        assert!(pair.requests.is_empty(), "never delivered to the node");
    }
}

#[test]
fn a_node_that_takes_no_stripes_refuses_striped_frames_with_an_error() {
    let plan = striped(&message(&[1 << 20]), 2);
    let (descriptor, parts) = &plan.stripes[0];
    let mut pair = Pair::new();
    pair.start_framed(
        RequestKind::Tell,
        parts.clone(),
        &Framing::Stripe(descriptor.clone()),
        TIMEOUT,
    );
    pair.drive();
    let answer = pair.done.pop().unwrap();
    let Err(Error::Remote { text, .. }) = answer else {
        panic!("{answer:?}");
    };
    assert!(text.contains("unknown PTR1 extension"), "{text}");
    assert!(pair.requests.is_empty());
}
