use bytes::Bytes;
use proptest::prelude::*;

use super::*;
use crate::error::{LimitExceeded, Misuse};
use crate::test_util::{Recorder, any_message, cat, chunks};

fn golden_message() -> TensorMessage {
    TensorMessage::new(
        7,
        Bytes::from_static(b"meta"),
        vec![
            Bytes::from_static(b"abc"),
            Bytes::new(),
            Bytes::from_static(b"defg"),
        ],
    )
}

fn golden() -> Vec<u8> {
    cat(&[
        b"PTM1",                   // magic
        &[7, 0, 0, 0],             // version 7
        &[4, 0, 0, 0, 0, 0, 0, 0], // metadata_len 4
        &[3, 0, 0, 0],             // buffer_count 3
        &[3, 0, 0, 0, 0, 0, 0, 0], // buffer 0: 3 bytes
        &[0, 0, 0, 0, 0, 0, 0, 0], // buffer 1: empty
        &[4, 0, 0, 0, 0, 0, 0, 0], // buffer 2: 4 bytes
        b"meta",                   // metadata
        b"abc",                    // buffer 0 (buffer 1 has no bytes)
        b"defg",                   // buffer 2
    ])
}

fn streamed(limits: Limits, pieces: &[Vec<u8>]) -> Result<TensorMessage, WireError> {
    let mut sut = Decoder::new(limits);
    for piece in pieces {
        sut.push(piece)?;
    }
    sut.finish()
}

#[test]
fn body_with_an_empty_buffer_between_non_empty_ones_matches_golden_bytes() {
    let encoded = encode(&golden_message(), &Limits::default()).unwrap();
    assert_eq!(encoded.to_vec(), golden());
    assert_eq!(
        encoded.parts().len(),
        3,
        "metadata + two non-empty buffers, no concatenation"
    );
    assert_eq!(
        decode(Bytes::from(golden()), &Limits::default()).unwrap(),
        golden_message()
    );
    let bytewise: Vec<Vec<u8>> = golden().iter().map(|b| vec![*b]).collect();
    assert_eq!(
        streamed(Limits::default(), &bytewise).unwrap(),
        golden_message()
    );
}

#[test]
fn a_head_joined_to_moved_parts_is_the_same_body_with_no_reference_taken() {
    let message = golden_message();
    let head = encode_head(&message, &Limits::default()).unwrap();
    assert_eq!(head.wire_len(), len_u64(golden().len()));
    let metadata_at = message.metadata.as_ptr();
    let TensorMessage {
        metadata, buffers, ..
    } = message;
    let parts = std::iter::once(metadata).chain(buffers);
    let encoded = head.clone().join(parts.clone());
    assert_eq!(encoded.to_vec(), golden());
    assert_eq!(
        encoded,
        encode(&golden_message(), &Limits::default()).unwrap()
    );
    let slices = head.into_slices(parts);
    assert_eq!(
        slices.len(),
        4,
        "head, metadata and the two non-empty buffers"
    );
    assert_eq!(slices.concat(), golden());
    assert_eq!(
        slices[1].as_ptr(),
        metadata_at,
        "the metadata moved, not copied"
    );
}

#[test]
fn a_head_is_refused_where_the_body_would_be() {
    let limits = Limits::builder().max_buffers(2).build();
    assert_eq!(
        encode_head(&golden_message(), &limits).unwrap_err(),
        encode(&golden_message(), &limits).unwrap_err()
    );
}

#[test]
fn control_only_body_matches_golden_bytes() {
    let message = TensorMessage::new(3, Bytes::from_static(b"m"), vec![]);
    let golden = cat(&[
        b"PTM1",                   // magic
        &[3, 0, 0, 0],             // version 3
        &[1, 0, 0, 0, 0, 0, 0, 0], // metadata_len 1
        &[0, 0, 0, 0],             // buffer_count 0
        b"m",                      // metadata
    ]);
    assert_eq!(
        encode(&message, &Limits::default()).unwrap().to_vec(),
        golden
    );
    assert_eq!(
        decode(Bytes::from(golden), &Limits::default()).unwrap(),
        message
    );
}

#[test]
fn one_shot_decode_returns_slices_of_the_body() {
    let body = Bytes::from(golden());
    let message = decode(body.clone(), &Limits::default()).unwrap();
    let start = body.as_ptr() as usize;
    let at = message.buffers[2].as_ptr() as usize;
    assert_eq!(at, start + 20 + 24 + 4 + 3);
}

#[test]
fn streamed_payload_lands_in_memory_from_the_allocator() {
    let recorder = Recorder::default();
    let mut sut = Decoder::with_allocator(Limits::default(), recorder.alloc());
    sut.push(&golden()).unwrap();
    assert!(sut.is_complete());
    assert_eq!(sut.finish().unwrap(), golden_message());
    assert_eq!(
        recorder.requests(),
        vec![4, 3, 4],
        "metadata, then each non-empty buffer"
    );
}

#[test]
fn truncated_body_is_rejected() {
    let wire = golden();
    for cut in [0, 5, 19, 20, 43, 44, wire.len() - 1] {
        let err = streamed(Limits::default(), &[wire[..cut].to_vec()]).unwrap_err();
        assert!(
            matches!(err, WireError::Malformed(Malformed::Truncated { .. })),
            "{cut}: {err}"
        );
        let err = decode(Bytes::copy_from_slice(&wire[..cut]), &Limits::default()).unwrap_err();
        assert!(
            matches!(err, WireError::Malformed(Malformed::Truncated { .. })),
            "{cut}: {err}"
        );
    }
}

#[test]
fn trailing_bytes_are_rejected_in_the_same_chunk_or_a_later_one() {
    let expected: WireError = Malformed::TrailingBytes {
        format: Format::Ptm1,
        expected: 55,
        extra: 1,
    }
    .into();
    let mut wire = golden();
    wire.push(0);
    assert_eq!(
        streamed(Limits::default(), &[wire.clone()]).unwrap_err(),
        expected
    );
    assert_eq!(
        streamed(Limits::default(), &[golden(), vec![0]]).unwrap_err(),
        expected
    );
    assert_eq!(
        decode(Bytes::from(wire), &Limits::default()).unwrap_err(),
        expected
    );
    // A trailing empty chunk is not data.
    assert_eq!(
        streamed(Limits::default(), &[golden(), vec![]]).unwrap(),
        golden_message()
    );
}

#[test]
fn bad_magic_is_rejected() {
    let mut wire = golden();
    wire[..4].copy_from_slice(b"PTR1");
    let expected: WireError = Malformed::BadMagic {
        format: Format::Ptm1,
        found: *b"PTR1",
    }
    .into();
    assert_eq!(
        streamed(Limits::default(), &[wire.clone()]).unwrap_err(),
        expected
    );
    assert_eq!(
        decode(Bytes::from(wire), &Limits::default()).unwrap_err(),
        expected
    );
}

#[test]
fn count_is_checked_before_metadata_and_both_before_allocation() {
    let limits = Limits::builder()
        .max_buffers(2)
        .max_metadata_bytes(3)
        .build();
    let recorder = Recorder::default();
    let mut sut = Decoder::with_allocator(limits, recorder.alloc());
    // Both the count (3 > 2) and the metadata (4 > 3) are over; PTM1 reports the count.
    let err = sut.push(&golden()[..20]).unwrap_err();
    assert_eq!(
        err,
        LimitExceeded {
            field: LimitField::BufferCount,
            value: 3,
            limit: 2
        }
        .into()
    );
    assert!(recorder.requests().is_empty());
    assert_eq!(
        sut.push(b"x").unwrap_err(),
        WireError::Misuse(Misuse::DecoderFailed)
    );
}

#[test]
fn body_larger_than_the_wire_limit_is_rejected_before_parsing() {
    let limits = Limits::builder().max_wire_bytes(54).build();
    let err = decode(Bytes::from(golden()), &limits).unwrap_err();
    assert_eq!(
        err,
        LimitExceeded {
            field: LimitField::WireBytes,
            value: 55,
            limit: 54
        }
        .into()
    );
    let err = streamed(limits, &[golden()]).unwrap_err();
    assert_eq!(
        err,
        LimitExceeded {
            field: LimitField::WireBytes,
            value: 55,
            limit: 54
        }
        .into()
    );
}

#[test]
fn length_sum_overflow_is_rejected_before_allocation() {
    let wire = cat(&[
        b"PTM1",
        &[0; 4],
        &[0; 8],
        &[2, 0, 0, 0],
        &u64::MAX.to_le_bytes(),
        &1u64.to_le_bytes(),
    ]);
    let limits = Limits::builder().max_wire_bytes(u64::MAX).build();
    let recorder = Recorder::default();
    let mut sut = Decoder::with_allocator(limits, recorder.alloc());
    let err = sut.push(&wire).unwrap_err();
    let expected = Malformed::LengthSumOverflow {
        format: Format::Ptm1,
        index: 0,
        len: u64::MAX,
    };
    assert_eq!(err, expected.into());
    assert!(recorder.requests().is_empty());
}

#[test]
fn encoder_checks_count_then_metadata() {
    let limits = Limits::builder()
        .max_buffers(2)
        .max_metadata_bytes(3)
        .build();
    let err = encode(&golden_message(), &limits).unwrap_err();
    assert_eq!(
        err,
        LimitExceeded {
            field: LimitField::BufferCount,
            value: 3,
            limit: 2
        }
        .into()
    );
}

proptest! {
    #[test]
    fn any_body_decodes_identically_however_it_is_split(
        message in any_message(),
        cuts in prop::collection::vec(any::<usize>(), 0..30),
    ) {
        let limits = Limits::default();
        let wire = encode(&message, &limits).unwrap().to_vec();
        prop_assert_eq!(&streamed(limits, &chunks(&wire, &cuts)).unwrap(), &message);
        prop_assert_eq!(&decode(Bytes::from(wire), &limits).unwrap(), &message);
    }

    #[test]
    fn arbitrary_bodies_never_panic_and_never_over_allocate(
        data in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        let mut wire = b"PTM1".to_vec();
        wire.extend_from_slice(&data);
        let limits = Limits::builder().max_wire_bytes(2048).max_metadata_bytes(128).max_buffers(4).build();
        let recorder = Recorder::default();
        let mut sut = Decoder::with_allocator(limits, recorder.alloc());
        let _ = sut.push(&wire);
        prop_assert!(recorder.total() <= 2048);
        let _ = decode(Bytes::from(wire), &limits);
    }
}
