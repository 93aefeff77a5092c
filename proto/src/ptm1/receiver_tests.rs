use bytes::Bytes;
use proptest::prelude::*;

use super::*;
use crate::ptm1::encode;
use crate::test_util::{Recorder, any_message, chunks};

/// Pushes `pieces`; returns the message and every layout reported, in order.
fn received(
    limits: Limits,
    pieces: &[Vec<u8>],
    recorder: &Recorder,
) -> Result<(TensorMessage, Vec<Layout>), WireError> {
    let mut alloc = recorder.alloc();
    let mut alloc = |len| Ok::<_, WireError>(alloc(len));
    let mut sut = BodyReceiver::new(limits);
    let mut heads = Vec::new();
    for piece in pieces {
        let mut rest = &piece[..];
        loop {
            let pushed = sut.push(rest, &mut alloc)?;
            heads.extend(pushed.head);
            rest = &rest[pushed.consumed..];
            if rest.is_empty() {
                break;
            }
        }
    }
    Ok((sut.finish()?, heads))
}

fn body(message: &TensorMessage) -> Vec<u8> {
    encode(message, &Limits::default()).unwrap().to_vec()
}

#[test]
fn the_head_is_reported_once_before_any_payload_memory_is_asked_for() {
    let message = TensorMessage::new(
        3,
        Bytes::from_static(b"meta"),
        vec![Bytes::from(vec![7u8; 100])],
    );
    let wire = body(&message);
    let recorder = Recorder::default();
    let mut alloc = recorder.alloc();
    let mut alloc = |len| Ok::<_, WireError>(alloc(len));
    let mut sut = BodyReceiver::new(Limits::default());
    let pushed = sut.push(&wire, &mut alloc).unwrap();
    let layout = pushed.head.expect("the head is complete");
    assert_eq!(pushed.consumed, layout.head_len());
    assert_eq!(layout.buffer_lens(), &[100]);
    assert_eq!(recorder.total(), 0, "nothing allocated for the head");
    assert_eq!(sut.layout(), Some(&layout));
    let pushed = sut.push(&wire[pushed.consumed..], &mut alloc).unwrap();
    assert!(pushed.head.is_none());
    assert!(sut.is_complete());
    assert_eq!(sut.finish().unwrap(), message);
    assert_eq!(recorder.requests(), vec![4, 100]);
}

#[test]
fn a_declared_buffer_that_never_arrives_costs_no_memory() {
    // One buffer of 1 GiB declared; the body stops after the head.
    let mut wire = b"PTM1".to_vec();
    wire.extend_from_slice(&1u32.to_le_bytes());
    wire.extend_from_slice(&0u64.to_le_bytes());
    wire.extend_from_slice(&1u32.to_le_bytes());
    wire.extend_from_slice(&(1u64 << 30).to_le_bytes());
    let recorder = Recorder::default();
    let err = received(Limits::default(), &[wire], &recorder).unwrap_err();
    assert!(
        matches!(err, WireError::Malformed(Malformed::Truncated { .. })),
        "{err}"
    );
    assert_eq!(recorder.total(), 0);
}

#[test]
fn bytes_after_the_message_are_refused() {
    let message = TensorMessage::new(1, Bytes::new(), vec![Bytes::from_static(b"abc")]);
    let mut wire = body(&message);
    wire.extend_from_slice(b"xyz");
    let err = received(Limits::default(), &[wire], &Recorder::default()).unwrap_err();
    assert!(
        matches!(
            err,
            WireError::Malformed(Malformed::TrailingBytes { extra: 3, .. })
        ),
        "{err}"
    );
}

#[test]
fn an_empty_message_completes_with_its_head() {
    let message = TensorMessage::new(9, Bytes::new(), Vec::new());
    let (got, heads) =
        received(Limits::default(), &[body(&message)], &Recorder::default()).unwrap();
    assert_eq!(got, message);
    assert_eq!(heads.len(), 1);
}

#[test]
fn an_allocation_failure_is_returned_and_ends_the_body() {
    let message = TensorMessage::new(1, Bytes::new(), vec![Bytes::from_static(b"abc")]);
    let wire = body(&message);
    let mut sut = BodyReceiver::<Vec<u8>>::new(Limits::default());
    let mut refuse = |_len| Err::<Vec<u8>, WireError>(Misuse::DecoderFailed.into());
    let head = sut.push(&wire, &mut refuse).unwrap();
    let err = sut.push(&wire[head.consumed..], &mut refuse).unwrap_err();
    assert_eq!(err, WireError::from(Misuse::DecoderFailed));
    let mut alloc = |len| Ok::<_, WireError>(vec![0; len]);
    assert!(sut.push(b"", &mut alloc).is_err(), "refused after an error");
}

#[test]
fn limits_are_checked_on_the_head() {
    let message = TensorMessage::new(1, Bytes::new(), vec![Bytes::new(); 3]);
    let limits = Limits::builder().max_buffers(2).build();
    let err = received(limits, &[body(&message)], &Recorder::default()).unwrap_err();
    assert!(matches!(err, WireError::LimitExceeded(_)), "{err}");
}

proptest! {
    #[test]
    fn any_body_arrives_intact_however_it_is_split(
        message in any_message(),
        cuts in prop::collection::vec(any::<usize>(), 0..30),
    ) {
        let wire = body(&message);
        let recorder = Recorder::default();
        let (got, heads) = received(Limits::default(), &chunks(&wire, &cuts), &recorder).unwrap();
        prop_assert_eq!(&got, &message);
        prop_assert_eq!(heads.len(), 1);
        prop_assert_eq!(recorder.total(), message.total_bytes() + len_u64(message.metadata.len()));
    }
}
