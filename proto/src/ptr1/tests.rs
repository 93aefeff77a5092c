use std::cell::RefCell;
use std::rc::Rc;

use bytes::Bytes;
use proptest::prelude::*;

use super::*;
use crate::error::{LimitExceeded, LimitField, Misuse};
use crate::test_util::{Recorder, any_bytes, any_message, cat, chunks};
use crate::{Body, Layout, ReceiveBuffer};

fn msg(version: u32, metadata: &'static [u8], buffers: &[&'static [u8]]) -> TensorMessage {
    TensorMessage {
        version,
        metadata: Bytes::from_static(metadata),
        buffers: buffers.iter().map(|b| Bytes::from_static(b)).collect(),
    }
}

/// Checks encode, one-shot decode and byte-by-byte streaming decode against golden bytes.
fn assert_golden(frame: &Frame, golden: &[u8]) {
    let limits = Limits::default();
    let encoded = encode(frame, &limits).unwrap();
    assert_eq!(encoded.to_vec(), golden, "encoding of {frame:?}");
    assert_eq!(encoded.wire_len(), golden.len() as u64);
    assert_eq!(
        &decode(Bytes::copy_from_slice(golden), &limits).unwrap(),
        frame
    );
    let mut sut = Decoder::new(limits);
    let mut decoded = None;
    for (i, byte) in golden.iter().enumerate() {
        let (consumed, frame) = sut.decode(std::slice::from_ref(byte)).unwrap();
        assert_eq!(consumed, 1);
        assert_eq!(
            frame.is_some(),
            i + 1 == golden.len(),
            "frame completes at the last byte"
        );
        decoded = decoded.or(frame);
    }
    assert_eq!(decoded.as_ref(), Some(frame));
    sut.end_of_stream().unwrap();
}

#[test]
fn ask_with_an_empty_buffer_between_non_empty_ones_matches_golden_bytes() {
    let frame = Frame::Ask {
        path: "/actors/echo".into(),
        message: msg(7, b"meta", &[b"abc", b"", b"defg"]),
    };
    let golden = cat(&[
        b"PTR1",                   // magic
        &[1],                      // kind: Ask
        &[0, 0, 0],                // reserved
        &[7, 0, 0, 0],             // version 7
        &[12, 0, 0, 0],            // path_len 12
        &[4, 0, 0, 0, 0, 0, 0, 0], // metadata_len 4
        &[3, 0, 0, 0],             // buffer_count 3
        &[3, 0, 0, 0, 0, 0, 0, 0], // buffer 0: 3 bytes
        &[0, 0, 0, 0, 0, 0, 0, 0], // buffer 1: empty
        &[4, 0, 0, 0, 0, 0, 0, 0], // buffer 2: 4 bytes
        b"/actors/echo",           // path
        b"meta",                   // metadata
        b"abc",                    // buffer 0 (buffer 1 has no bytes)
        b"defg",                   // buffer 2
    ]);
    assert_golden(&frame, &golden);
}

#[test]
fn tell_with_non_ascii_path_and_zero_buffers_matches_golden_bytes() {
    let frame = Frame::Tell {
        path: "/actors/数据".into(),
        message: msg(0x0102_0304, b"", &[]),
    };
    let golden = cat(&[
        b"PTR1",                   // magic
        &[2],                      // kind: Tell
        &[0, 0, 0],                // reserved
        &[4, 3, 2, 1],             // version 0x01020304, little-endian
        &[14, 0, 0, 0],            // path_len 14 (two 3-byte UTF-8 characters)
        &[0, 0, 0, 0, 0, 0, 0, 0], // metadata_len 0
        &[0, 0, 0, 0],             // buffer_count 0
        b"/actors/",               // path, ASCII part
        &[0xE6, 0x95, 0xB0],       // path: U+6570
        &[0xE6, 0x8D, 0xAE],       // path: U+636E
    ]);
    assert_golden(&frame, &golden);
}

#[test]
fn tensor_response_matches_golden_bytes() {
    let frame = Frame::TensorResponse(msg(9, b"r", &[b"xy"]));
    let golden = cat(&[
        b"PTR1",                   // magic
        &[3],                      // kind: TensorResponse
        &[0, 0, 0],                // reserved
        &[9, 0, 0, 0],             // version 9 (the response's own)
        &[0, 0, 0, 0],             // path_len 0
        &[1, 0, 0, 0, 0, 0, 0, 0], // metadata_len 1
        &[1, 0, 0, 0],             // buffer_count 1
        &[2, 0, 0, 0, 0, 0, 0, 0], // buffer 0: 2 bytes
        b"r",                      // metadata
        b"xy",                     // buffer 0
    ]);
    assert_golden(&frame, &golden);
}

#[test]
fn ack_matches_golden_bytes() {
    let frame = Frame::Ack { version: 7 };
    let golden = cat(&[
        b"PTR1",                   // magic
        &[4],                      // kind: Ack
        &[0, 0, 0],                // reserved
        &[7, 0, 0, 0],             // version: the request's
        &[0, 0, 0, 0],             // path_len 0
        &[0, 0, 0, 0, 0, 0, 0, 0], // metadata_len 0
        &[0, 0, 0, 0],             // buffer_count 0
    ]);
    assert_golden(&frame, &golden);
}

#[test]
fn error_matches_golden_bytes() {
    let frame = Frame::Error {
        version: 7,
        text: "boom".into(),
    };
    let golden = cat(&[
        b"PTR1",                   // magic
        &[5],                      // kind: Error
        &[0, 0, 0],                // reserved
        &[7, 0, 0, 0],             // version: the request's
        &[0, 0, 0, 0],             // path_len 0
        &[4, 0, 0, 0, 0, 0, 0, 0], // metadata_len 4
        &[0, 0, 0, 0],             // buffer_count 0
        b"boom",                   // metadata: the error text
    ]);
    assert_golden(&frame, &golden);
}

#[test]
fn single_response_matches_golden_bytes() {
    let frame = Frame::SingleResponse {
        version: 7,
        msg_type: "ack".into(),
        data: Bytes::from_static(b"1024"),
    };
    let golden = cat(&[
        b"PTR1",                   // magic
        &[6],                      // kind: SingleResponse
        &[0, 0, 0],                // reserved
        &[7, 0, 0, 0],             // version: the request's
        &[3, 0, 0, 0],             // path_len 3
        &[4, 0, 0, 0, 0, 0, 0, 0], // metadata_len 4
        &[0, 0, 0, 0],             // buffer_count 0
        b"ack",                    // path slot: msg_type
        b"1024",                   // metadata slot: data
    ]);
    assert_golden(&frame, &golden);
}

#[test]
fn encoder_references_payload_without_copying() {
    let message = msg(1, b"meta", &[b"abc", b"", b"defg"]);
    let frame = Frame::Ask {
        path: "/actors/x".into(),
        message: message.clone(),
    };
    let encoded = encode(&frame, &Limits::default()).unwrap();
    let parts = encoded.parts();
    assert_eq!(parts.len(), 3, "metadata and the two non-empty buffers");
    assert_eq!(parts[0].as_ptr(), message.metadata.as_ptr());
    assert_eq!(parts[1].as_ptr(), message.buffers[0].as_ptr());
    assert_eq!(parts[2].as_ptr(), message.buffers[2].as_ptr());
    assert_eq!(encoded.head().len(), 28 + 3 * 8 + "/actors/x".len());
}

#[test]
fn one_shot_decode_returns_slices_of_the_input() {
    let frame = Frame::Ask {
        path: "/a".into(),
        message: msg(1, b"m", &[b"payload"]),
    };
    let wire = Bytes::from(encode(&frame, &Limits::default()).unwrap().to_vec());
    let Frame::Ask { message, .. } = decode(wire.clone(), &Limits::default()).unwrap() else {
        panic!("decoded kind changed")
    };
    let start = wire.as_ptr() as usize;
    let at = message.buffers[0].as_ptr() as usize;
    assert!(
        at >= start && at < start + wire.len(),
        "buffer points into the wire bytes"
    );
}

#[test]
fn scatter_reads_into_unfilled_memory_yield_the_same_frame() {
    let frame = Frame::Ask {
        path: "/p".into(),
        message: msg(3, b"mm", &[b"abc", b"", b"defgh"]),
    };
    let wire = encode(&frame, &Limits::default()).unwrap().to_vec();
    let fixed = crate::FixedHeader::parse(Format::Ptr1, &wire, &Limits::default()).unwrap();
    let layout: Layout = fixed.layout(&wire[28..], &Limits::default()).unwrap();
    assert_eq!(layout.buffer_lens(), &[3, 0, 5]);
    let mut body = Body::new(layout.clone());
    let mut alloc = |len| Ok::<_, WireError>(vec![0u8; len]);
    let mut rest = &wire[layout.head_len()..];
    while !body.is_complete() {
        // Like one recvmsg that returns at most 3 bytes, scattered over the unfilled slices.
        body.expose(4, &mut alloc).unwrap();
        let mut n = 0;
        for slice in body.unfilled() {
            let take = slice.len().min(3 - n).min(rest.len());
            slice[..take].copy_from_slice(&rest[..take]);
            rest = &rest[take..];
            n += take;
            if n == 3 {
                break;
            }
        }
        body.advance(n).unwrap();
    }
    assert_eq!(Frame::from_body(body).unwrap(), frame);
}

#[test]
fn advancing_past_the_end_is_caller_misuse() {
    let frame = Frame::Ask {
        path: "/p".into(),
        message: msg(3, b"", &[b"abc"]),
    };
    let wire = encode(&frame, &Limits::default()).unwrap().to_vec();
    let fixed = crate::FixedHeader::parse(Format::Ptr1, &wire, &Limits::default()).unwrap();
    let layout = fixed.layout(&wire[28..], &Limits::default()).unwrap();
    let mut body = Body::<Vec<u8>>::new(layout);
    body.expose(64, &mut |len| Ok::<_, WireError>(vec![0u8; len]))
        .unwrap();
    let err = body.advance(6).unwrap_err();
    assert_eq!(
        err,
        WireError::Misuse(Misuse::AdvancePastEnd {
            by: 6,
            remaining: 5
        })
    );
}

#[test]
fn allocator_returning_the_wrong_length_is_caller_misuse() {
    let frame = Frame::Tell {
        path: "/p".into(),
        message: msg(3, b"", &[b"abc"]),
    };
    let wire = encode(&frame, &Limits::default()).unwrap().to_vec();
    let mut sut = Decoder::with_allocator(Limits::default(), |len| vec![0u8; len + 1]);
    let err = sut.decode(&wire).unwrap_err();
    assert!(matches!(
        err,
        WireError::Misuse(Misuse::ReceiveBufferLength {
            expected: 3,
            actual: 4,
            ..
        })
    ));
}

#[test]
fn memory_is_requested_only_when_the_first_byte_of_a_section_arrives() {
    let frame = Frame::Ask {
        path: "/p".into(),
        message: msg(3, b"mm", &[b"abc", b"defgh"]),
    };
    let wire = encode(&frame, &Limits::default()).unwrap().to_vec();
    let head_and_path = 28 + 2 * 8 + 2;
    let recorder = Recorder::default();
    let mut sut = Decoder::with_allocator(Limits::default(), recorder.alloc());
    assert_eq!(sut.decode(&wire[..head_and_path]).unwrap().0, head_and_path);
    assert_eq!(
        recorder.requests(),
        Vec::<usize>::new(),
        "head and path only"
    );
    sut.decode(&wire[head_and_path..head_and_path + 1]).unwrap();
    assert_eq!(recorder.requests(), vec![2], "first metadata byte");
    sut.decode(&wire[head_and_path + 1..head_and_path + 3])
        .unwrap();
    assert_eq!(recorder.requests(), vec![2, 3], "first byte of buffer 0");
    let (_, done) = sut.decode(&wire[head_and_path + 3..]).unwrap();
    assert_eq!(done, Some(frame));
    assert_eq!(recorder.requests(), vec![2, 3, 5]);
}

#[test]
fn exposing_a_window_allocates_and_prepares_only_what_it_covers() {
    type Log = Rc<RefCell<Vec<(usize, std::ops::Range<usize>)>>>;
    #[derive(Debug)]
    struct Traced(Vec<u8>, Log);
    impl AsMut<[u8]> for Traced {
        fn as_mut(&mut self) -> &mut [u8] {
            &mut self.0
        }
    }
    impl ReceiveBuffer for Traced {
        fn freeze(self) -> Bytes {
            Bytes::from(self.0)
        }
        fn prepare(&mut self, range: std::ops::Range<usize>) {
            self.1.borrow_mut().push((self.0.len(), range));
        }
    }
    let frame = Frame::Tell {
        path: String::new(),
        message: msg(1, b"", &[&[1; 100], b"", &[2; 100]]),
    };
    let wire = encode(&frame, &Limits::default()).unwrap().to_vec();
    let fixed = crate::FixedHeader::parse(Format::Ptr1, &wire, &Limits::default()).unwrap();
    let layout = fixed.layout(&wire[28..], &Limits::default()).unwrap();
    let body_at = layout.head_len();
    let prepared = Rc::new(RefCell::new(Vec::new()));
    let allocated = RefCell::new(Vec::new());
    let mut alloc = |len| {
        allocated.borrow_mut().push(len);
        Ok::<_, WireError>(Traced(vec![0; len], Rc::clone(&prepared)))
    };
    let mut body = Body::new(layout);
    body.expose(60, &mut alloc).unwrap();
    assert_eq!(body.exposed_unfilled(), 60);
    assert_eq!(
        body.unfilled().map(|s| s.len()).collect::<Vec<_>>(),
        vec![60]
    );
    // Receive 50 bytes, then widen the window past the empty buffer into the third one.
    let mut n = 0;
    for slice in body.unfilled() {
        let take = slice.len().min(50 - n);
        slice[..take].copy_from_slice(&wire[body_at + n..body_at + n + take]);
        n += take;
    }
    body.advance(n).unwrap();
    body.expose(100, &mut alloc).unwrap();
    assert_eq!(
        body.unfilled().map(|s| s.len()).collect::<Vec<_>>(),
        vec![50, 50]
    );
    assert_eq!(
        *prepared.borrow(),
        vec![(100, 0..60), (100, 60..100), (100, 0..50)],
        "each range is prepared once, in order"
    );
    let mut rest = &wire[body_at + 50..];
    while !body.is_complete() {
        body.expose(1000, &mut alloc).unwrap();
        let mut n = 0;
        for slice in body.unfilled() {
            slice.copy_from_slice(&rest[..slice.len()]);
            rest = &rest[slice.len()..];
            n += slice.len();
        }
        body.advance(n).unwrap();
    }
    assert_eq!(
        *allocated.borrow(),
        vec![100, 100],
        "the empty buffer needs no memory"
    );
    assert_eq!(Frame::from_body(body).unwrap(), frame);
}

// ---- malformed input -------------------------------------------------------------------------

/// Small limits so the allocation bound is easy to state.
fn small_limits() -> Limits {
    Limits::builder()
        .max_wire_bytes(4096)
        .max_metadata_bytes(256)
        .max_buffers(8)
        .build()
}

/// A PTR1 fixed header with the given fields.
fn header(kind: u8, path_len: u32, metadata_len: u64, count: u32) -> Vec<u8> {
    cat(&[
        b"PTR1",
        &[kind, 0, 0, 0],
        &7u32.to_le_bytes(),
        &path_len.to_le_bytes(),
        &metadata_len.to_le_bytes(),
        &count.to_le_bytes(),
    ])
}

/// Feeds `wire` in one go and then as single bytes; both must fail with `expected`, and the
/// allocator must never have been asked for more than the limits allow.
fn assert_rejected(wire: &[u8], limits: Limits, expected: &WireError, max_alloc: u64) {
    for chunk in [wire.len().max(1), 1] {
        let recorder = Recorder::default();
        let mut sut = Decoder::with_allocator(limits, recorder.alloc());
        let mut decode_error = None;
        for piece in wire.chunks(chunk) {
            match sut.decode(piece) {
                Ok((_, Some(frame))) => panic!("decoded {frame:?} from malformed input"),
                Ok(_) => {}
                Err(e) => {
                    decode_error = Some(e);
                    break;
                }
            }
        }
        assert!(
            recorder.total() <= max_alloc,
            "asked for {:?}",
            recorder.requests()
        );
        assert!(recorder.total() <= limits.max_wire_bytes());
        match decode_error {
            Some(error) => {
                assert_eq!(&error, expected, "chunk size {chunk}");
                let again = sut.decode(b"PTR1").unwrap_err();
                assert_eq!(again, WireError::Misuse(Misuse::DecoderFailed));
            }
            None => assert_eq!(
                sut.end_of_stream().as_ref(),
                Err(expected),
                "chunk size {chunk}"
            ),
        }
    }
}

#[test]
fn frame_with_bad_magic_is_rejected_before_allocation() {
    let mut wire = header(1, 0, 0, 0);
    wire[3] = b'2';
    let expected = Malformed::BadMagic {
        format: Format::Ptr1,
        found: *b"PTR2",
    }
    .into();
    assert_rejected(&wire, small_limits(), &expected, 0);
    assert_eq!(
        expected.to_string(),
        "malformed PTR1 frame: magic is \"PTR2\", expected \"PTR1\""
    );
}

#[test]
fn frame_with_unknown_kind_is_rejected_before_allocation() {
    for kind in [0u8, 7, 255] {
        let expected = Malformed::UnknownKind(kind).into();
        assert_rejected(&header(kind, 0, 0, 0), small_limits(), &expected, 0);
    }
}

#[test]
fn path_over_64_kib_is_rejected_before_allocation() {
    let expected = LimitExceeded {
        field: LimitField::PathBytes,
        value: 65_537,
        limit: 65_536,
    }
    .into();
    assert_rejected(&header(1, 65_537, 0, 0), Limits::default(), &expected, 0);
}

#[test]
fn path_of_exactly_64_kib_is_accepted() {
    let path = "p".repeat(65_536);
    let frame = Frame::Ask {
        path,
        message: msg(1, b"", &[]),
    };
    let wire = encode(&frame, &Limits::default()).unwrap();
    assert_eq!(
        decode(Bytes::from(wire.to_vec()), &Limits::default()).unwrap(),
        frame
    );
}

#[test]
fn invalid_utf8_path_is_rejected_before_the_metadata_arrives() {
    let wire = cat(&[&header(1, 2, 4, 0), &[0xFF, 0xFE]]);
    let expected = WireError::Malformed(Malformed::InvalidPath {
        len: 2,
        source: String::from_utf8(vec![0xFF, 0xFE])
            .unwrap_err()
            .utf8_error(),
    });
    // Only the 4 metadata bytes were asked for (the frame's layout was valid).
    assert_rejected(&wire, small_limits(), &expected, 4);
}

#[test]
fn metadata_over_the_limit_is_rejected_before_allocation() {
    let expected = LimitExceeded {
        field: LimitField::MetadataBytes,
        value: 257,
        limit: 256,
    }
    .into();
    assert_rejected(&header(1, 0, 257, 0), small_limits(), &expected, 0);
}

#[test]
fn buffer_count_over_the_limit_is_rejected_before_the_length_table() {
    let expected = LimitExceeded {
        field: LimitField::BufferCount,
        value: 9,
        limit: 8,
    }
    .into();
    // Only the fixed header is sent: the error comes before any table byte is needed.
    assert_rejected(&header(1, 0, 0, 9), small_limits(), &expected, 0);
    let default_count = u32::try_from(Limits::DEFAULT_MAX_BUFFERS + 1).unwrap();
    let expected = LimitExceeded {
        field: LimitField::BufferCount,
        value: 65_537,
        limit: 65_536,
    };
    assert_rejected(
        &header(1, 0, 0, default_count),
        Limits::default(),
        &expected.into(),
        0,
    );
}

#[test]
fn length_table_overflow_is_rejected_before_allocation() {
    let limits = Limits::builder()
        .max_wire_bytes(u64::MAX)
        .max_metadata_bytes(u64::MAX)
        .max_buffers(u64::MAX)
        .build();
    // 28 + 8·16 + metadata overflows u64.
    let wire = header(1, 0, u64::MAX - 100, 16);
    let expected = Malformed::LengthTableOverflow {
        format: Format::Ptr1,
        buffer_count: 16,
    };
    assert_rejected(&wire, limits, &expected.into(), 0);
}

#[test]
fn length_sum_overflow_is_rejected_before_allocation() {
    let limits = Limits::builder().max_wire_bytes(u64::MAX).build();
    let wire = cat(&[
        &header(1, 0, 0, 2),
        &(1u64 << 63).to_le_bytes(),
        &(1u64 << 63).to_le_bytes(),
    ]);
    let expected = Malformed::LengthSumOverflow {
        format: Format::Ptr1,
        index: 1,
        len: 1 << 63,
    };
    assert_rejected(&wire, limits, &expected.into(), 0);
}

#[test]
fn total_over_the_wire_limit_is_rejected_after_the_table_and_before_allocation() {
    let wire = cat(&[&header(1, 0, 0, 1), &4096u64.to_le_bytes()]);
    let expected = LimitExceeded {
        field: LimitField::WireBytes,
        value: 28 + 8 + 4096,
        limit: 4096,
    };
    assert_rejected(&wire, small_limits(), &expected.into(), 0);
    // The default limit: one 64 GiB buffer plus the head is over 64 GiB.
    let wire = cat(&[&header(1, 0, 0, 1), &(64u64 << 30).to_le_bytes()]);
    let expected = LimitExceeded {
        field: LimitField::WireBytes,
        value: (64 << 30) + 36,
        limit: 64 << 30,
    };
    assert_rejected(&wire, Limits::default(), &expected.into(), 0);
}

#[test]
fn head_plus_metadata_over_the_wire_limit_is_rejected_before_the_table() {
    let limits = Limits::builder().max_wire_bytes(100).build();
    let expected = LimitExceeded {
        field: LimitField::WireBytes,
        value: 28 + 80 + 5,
        limit: 100,
    };
    assert_rejected(&header(1, 0, 5, 10), limits, &expected.into(), 0);
}

#[test]
fn truncated_input_is_an_error_at_end_of_stream() {
    let frame = Frame::Ask {
        path: "/a".into(),
        message: msg(1, b"meta", &[b"abcdef"]),
    };
    let wire = encode(&frame, &Limits::default()).unwrap().to_vec();
    let full = wire.len() as u64;
    for cut in [1, 27, 28, 36, 37, wire.len() - 1] {
        let expected_len = match cut {
            ..28 => 28,
            28..36 => 28 + 8 + 2 + 4, // head, path and metadata are known; buffers not yet
            _ => full,
        };
        let expected = Malformed::Truncated {
            format: Format::Ptr1,
            expected: expected_len,
            received: cut as u64,
        };
        assert_rejected(&wire[..cut], small_limits(), &expected.into(), 4 + 6);
        let one_shot = decode(Bytes::copy_from_slice(&wire[..cut]), &small_limits()).unwrap_err();
        assert!(
            matches!(one_shot, WireError::Malformed(Malformed::Truncated { .. })),
            "{cut}"
        );
    }
}

#[test]
fn trailing_bytes_after_a_single_frame_are_rejected() {
    let mut wire = encode(&Frame::Ack { version: 1 }, &Limits::default())
        .unwrap()
        .to_vec();
    wire.extend_from_slice(b"xy");
    let err = decode(Bytes::from(wire), &Limits::default()).unwrap_err();
    assert_eq!(
        err,
        Malformed::TrailingBytes {
            format: Format::Ptr1,
            expected: 28,
            extra: 2
        }
        .into()
    );
}

#[test]
fn reply_kinds_with_slots_they_must_leave_empty_are_rejected() {
    let cases: [(&[u8], &str, &str); 4] = [
        (
            &cat(&[&header(4, 0, 0, 1), &0u64.to_le_bytes()]),
            "Ack",
            "buffer list",
        ),
        (&cat(&[&header(4, 0, 1, 0), b"x"]), "Ack", "metadata"),
        (&cat(&[&header(5, 1, 0, 0), b"x"]), "Error", "path"),
        (&cat(&[&header(3, 1, 0, 0), b"x"]), "TensorResponse", "path"),
    ];
    for (wire, kind, slot) in cases {
        let err = decode(Bytes::copy_from_slice(wire), &Limits::default()).unwrap_err();
        assert!(
            matches!(&err, WireError::Malformed(Malformed::UnexpectedSlot { kind: k, slot: s, .. }) if *k == kind && *s == slot),
            "{err}"
        );
    }
}

#[test]
fn error_text_that_is_not_utf8_is_decoded_lossily() {
    let wire = cat(&[&header(5, 0, 3, 0), &[b'o', 0xFF, b'k']]);
    let frame = decode(Bytes::from(wire), &Limits::default()).unwrap();
    assert_eq!(
        frame,
        Frame::Error {
            version: 7,
            text: "o\u{FFFD}k".into()
        }
    );
}

// ---- encoder limits ---------------------------------------------------------------------------

#[test]
fn encoder_checks_every_limit_before_building_anything() {
    let limits = small_limits();
    let ask = |path: String, message| Frame::Ask { path, message };
    let cases = [
        (
            ask("p".repeat(65_537), msg(1, b"", &[])),
            LimitField::PathBytes,
            65_537,
            65_536,
        ),
        (
            ask("/a".into(), TensorMessage::new(1, vec![0u8; 257], vec![])),
            LimitField::MetadataBytes,
            257,
            256,
        ),
        (
            ask("/a".into(), msg(1, b"", &[&b""[..]; 9])),
            LimitField::BufferCount,
            9,
            8,
        ),
        (
            ask(
                "/a".into(),
                TensorMessage::new(1, Bytes::new(), vec![Bytes::from(vec![0u8; 4096])]),
            ),
            LimitField::WireBytes,
            28 + 8 + 2 + 4096,
            4096,
        ),
    ];
    for (frame, field, value, limit) in cases {
        assert_eq!(
            encode(&frame, &limits),
            Err(LimitExceeded {
                field,
                value,
                limit
            }
            .into())
        );
    }
}

// ---- properties -------------------------------------------------------------------------------

fn any_frame() -> impl Strategy<Value = Frame> {
    let path = "[/a-z0-9é数]{0,24}";
    prop_oneof![
        (path, any_message()).prop_map(|(path, message)| Frame::Ask { path, message }),
        (path, any_message()).prop_map(|(path, message)| Frame::Tell { path, message }),
        any_message().prop_map(Frame::TensorResponse),
        any::<u32>().prop_map(|version| Frame::Ack { version }),
        (any::<u32>(), ".{0,40}").prop_map(|(version, text)| Frame::Error { version, text }),
        (any::<u32>(), path, any_bytes(64)).prop_map(|(version, msg_type, data)| {
            Frame::SingleResponse {
                version,
                msg_type,
                data,
            }
        }),
    ]
}

proptest! {
    #[test]
    fn any_frame_stream_decodes_identically_however_it_is_split(
        frames in prop::collection::vec(any_frame(), 1..5),
        cuts in prop::collection::vec(any::<usize>(), 0..40),
    ) {
        let limits = Limits::default();
        let stream: Vec<u8> = frames
            .iter()
            .flat_map(|frame| encode(frame, &limits).unwrap().to_vec())
            .collect();
        let recorder = Recorder::default();
        let mut sut = Decoder::with_allocator(limits, recorder.alloc());
        let mut decoded = Vec::new();
        for chunk in chunks(&stream, &cuts) {
            let mut rest = &chunk[..];
            while !rest.is_empty() {
                let (consumed, frame) = sut.decode(rest).unwrap();
                prop_assert!(consumed > 0 || frame.is_some());
                decoded.extend(frame);
                rest = &rest[consumed..];
            }
        }
        sut.end_of_stream().unwrap();
        prop_assert_eq!(&decoded, &frames);
        // Exactly the non-empty metadata and buffers were allocated, nothing more.
        let payload: u64 = frames.iter().map(|f| {
            let e = encode(f, &limits).unwrap();
            e.parts().iter().map(|p| p.len() as u64).sum::<u64>()
        }).sum();
        prop_assert_eq!(recorder.total(), payload);
    }

    #[test]
    fn one_shot_decode_inverts_encode(frame in any_frame()) {
        let wire = encode(&frame, &Limits::default()).unwrap();
        prop_assert_eq!(decode(Bytes::from(wire.to_vec()), &Limits::default()).unwrap(), frame);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_never_over_allocate(
        data in prop::collection::vec(any::<u8>(), 0..512),
        kind in 0u8..8,
    ) {
        let mut wire = header(kind, 0, 0, 0);
        wire.truncate(5);
        wire.extend_from_slice(&data);
        let limits = small_limits();
        let recorder = Recorder::default();
        let mut sut = Decoder::with_allocator(limits, recorder.alloc());
        let _ = sut.decode(&wire);
        prop_assert!(recorder.total() <= limits.max_wire_bytes());
        let _ = decode(Bytes::from(wire), &limits);
    }
}
