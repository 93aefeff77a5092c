use proptest::prelude::*;

use super::*;

fn shared(segment: u64, offset: u64, len: u64, lease: u64) -> Shared {
    Shared {
        segment,
        offset,
        len,
        lease,
    }
}

fn samples() -> Vec<Control> {
    vec![
        Control::Hello(Hello {
            boot_id: "4f1c-boot".into(),
            user_ns: 4_026_531_837,
            uid: 1000,
            pid: 4242,
            node: "127.0.0.1:9000".into(),
            ticket: 31,
            via: "127.0.0.1:51000".into(),
            proof: [7; 16],
            queue: 1 << 20,
        }),
        Control::Request {
            id: 7,
            kind: RequestKind::Ask,
            path: "/actors/echo".into(),
            body: Body::Packed(shared(2, 0, 4096, 11)),
        },
        Control::Request {
            id: 8,
            kind: RequestKind::Tell,
            path: "/actors/sink".into(),
            body: Body::Parts {
                version: 3,
                metadata: Part::Inline(Bytes::from_static(b"{\"dtype\":\"f32\"}")),
                buffers: vec![
                    Part::Shared(shared(1, 0, 1 << 20, 1)),
                    Part::Shared(shared(1, 1 << 20, 7, 1)),
                    Part::Inline(Bytes::from_static(b"tail")),
                    Part::Returned(Returned {
                        segment: 7,
                        offset: 4096,
                        len: 100,
                    }),
                ],
            },
        },
        Control::Request {
            id: 10,
            kind: RequestKind::Ask,
            path: "/actors/small".into(),
            body: Body::Inline(Bytes::from_static(b"PTM1-a-small-body")),
        },
        Control::Reply {
            id: 7,
            reply: WireReply::Tensor(Body::Parts {
                version: 1,
                metadata: Part::Shared(shared(4, 64, 99, 3)),
                buffers: vec![],
            }),
        },
        Control::Reply {
            id: 9,
            reply: WireReply::Single {
                msg_type: "ack".into(),
                data: Bytes::from_static(b"1048576"),
            },
        },
        Control::Reply {
            id: 10,
            reply: WireReply::Ack,
        },
        Control::Reply {
            id: 11,
            reply: WireReply::Error("no endpoint at /actors/x".into()),
        },
        Control::Release {
            leases: vec![1, 2, 3],
        },
        Control::Map {
            segment: 4,
            len: 64 << 20,
        },
        Control::Retire { segment: 4 },
        Control::Unmapped { segment: 5 },
        Control::Bell,
    ]
}

#[test]
fn every_message_round_trips() {
    for control in samples() {
        let bytes = encode(&control).unwrap();
        assert_eq!(decode(&bytes), Ok(control.clone()), "{control:?}");
    }
}

#[test]
fn a_release_datagram_matches_its_golden_bytes() {
    let golden = [
        b"TWS4".as_slice(),
        &[4],          // tag: Release
        &[2, 0, 0, 0], // two leases
        &[5, 0, 0, 0, 0, 0, 0, 0],
        &[6, 0, 0, 0, 0, 0, 0, 0],
    ]
    .concat();
    assert_eq!(
        encode(&Control::Release { leases: vec![5, 6] }).unwrap(),
        golden
    );
}

#[test]
fn a_map_datagram_matches_its_golden_bytes() {
    let golden = [
        b"TWS4".as_slice(),
        &[5],                      // tag: Map
        &[9, 0, 0, 0, 0, 0, 0, 0], // segment 9
        &[0, 0, 0, 4, 0, 0, 0, 0], // 64 MiB
    ]
    .concat();
    let map = Control::Map {
        segment: 9,
        len: 64 << 20,
    };
    assert_eq!(encode(&map).unwrap(), golden);
}

#[test]
fn a_bell_datagram_is_the_magic_and_its_tag() {
    assert_eq!(encode(&Control::Bell).unwrap(), b"TWS4\x08");
    assert_eq!(encode(&Control::Bell).unwrap(), BELL);
}

#[test]
fn a_map_fits_the_room_a_connected_socket_is_read_with_and_nothing_longer_decodes() {
    let largest_map = Control::Map {
        segment: u64::MAX,
        len: u64::MAX,
    };
    assert!(encode(&largest_map).unwrap().len() < MAX_SOCKET_DATAGRAM);
    // Cut to the receiver's room, a longer datagram never decodes.
    let mut long = encode(&largest_map).unwrap();
    long.resize(MAX_SOCKET_DATAGRAM, 0);
    assert!(decode(&long).is_err());
    assert_eq!(
        decode(b"TWS3\x07\x05\0\0\0\0\0\0\0"),
        Err(DecodeError("bad magic")),
        "a TWS3 peer's messages are not this protocol's"
    );
}

#[test]
fn malformed_datagrams_are_refused_with_a_reason() {
    assert_eq!(decode(b"XXXX\x04"), Err(DecodeError("bad magic")));
    assert_eq!(decode(b"TWS1\x04\0\0\0\0"), Err(DecodeError("bad magic")));
    assert_eq!(decode(b"TWS4\x09"), Err(DecodeError("unknown message tag")));
    // A count that claims more items than bytes left: refused before allocating.
    assert_eq!(
        decode(b"TWS4\x04\xff\xff\xff\xff"),
        Err(DecodeError("a list runs past the end"))
    );
    let mut extra = encode(&Control::Release { leases: vec![1] }).unwrap();
    extra.push(0);
    assert_eq!(decode(&extra), Err(DecodeError("bytes after the message")));
    assert!(decode(&vec![0u8; MAX_DATAGRAM + 1]).is_err());
}

#[test]
fn a_long_error_text_is_cut_so_the_reply_still_fits() {
    let text = "x".repeat(70 << 10);
    let reply = Control::Reply {
        id: 1,
        reply: WireReply::Error(text),
    };
    let bytes = encode(&reply).expect("an error reply always fits");
    let Ok(Control::Reply {
        reply: WireReply::Error(cut),
        ..
    }) = decode(&bytes)
    else {
        panic!("not decoded");
    };
    assert!(cut.len() <= MAX_ERROR_TEXT && cut.len() > MAX_ERROR_TEXT - 8);
    let multibyte = Control::Reply {
        id: 1,
        reply: WireReply::Error("é".repeat(MAX_ERROR_TEXT)),
    };
    assert!(decode(&encode(&multibyte).unwrap()).is_ok());
}

#[test]
fn a_message_too_large_for_a_datagram_is_an_error_not_a_datagram() {
    let request = |path_len: usize, parts: usize| Control::Request {
        id: 1,
        kind: RequestKind::Ask,
        path: "p".repeat(path_len),
        body: Body::Parts {
            version: 1,
            metadata: Part::Inline(Bytes::new()),
            buffers: vec![Part::Shared(shared(1, 0, 1, 1)); parts],
        },
    };
    assert!(encode(&request(60 << 10, 0)).is_ok());
    assert!(matches!(
        encode(&request(MAX_DATAGRAM, 0)),
        Err(EncodeError { len }) if len > MAX_DATAGRAM
    ));
    let fits = (MAX_DATAGRAM - 64) / SHARED_PART_BYTES;
    assert!(encode(&request(1, fits)).is_ok());
    assert!(encode(&request(1, fits * 2)).is_err());
}

#[test]
fn a_record_written_in_place_is_the_encoding_byte_for_byte() {
    for control in samples() {
        let encoded = encode(&control).unwrap();
        let record = Record::new(control.clone()).unwrap();
        assert_eq!(record.len(), encoded.len(), "{control:?}");
        // Written over stale bytes, as in a ring that wrapped: every byte is overwritten.
        let mut ring = vec![0xa5u8; record.len()];
        record.write_to(&mut ring);
        assert_eq!(ring, encoded, "{control:?}");
        assert_eq!(record.to_vec(), encoded);
    }
    // A slice of the wrong length gets what fits, and nothing panics.
    let record = Record::new(samples().remove(3)).unwrap();
    let mut short = vec![0u8; record.len() - 5];
    record.write_to(&mut short);
    assert_eq!(short, encode(record.control()).unwrap()[..record.len() - 5]);
}

#[test]
fn a_body_given_in_slices_is_an_inline_body_on_the_wire() {
    let slices = vec![
        Bytes::from_static(b"PTM1-head"),
        Bytes::new(),
        Bytes::from(vec![7u8; 4096]),
    ];
    let joined = Bytes::from(slices.concat());
    let request = |body| Control::Request {
        id: 3,
        kind: RequestKind::Ask,
        path: "/actors/echo".into(),
        body,
    };
    let sliced = encode(&request(Body::InlineSlices(slices.clone()))).unwrap();
    assert_eq!(
        sliced,
        encode(&request(Body::Inline(joined.clone()))).unwrap()
    );
    assert_eq!(decode(&sliced), Ok(request(Body::Inline(joined))));
    assert!(Body::InlineSlices(slices).shared().is_empty());
}

#[test]
fn a_record_too_large_for_the_queue_is_refused_when_it_is_made() {
    let reply = Control::Reply {
        id: 1,
        reply: WireReply::Tensor(Body::InlineSlices(vec![Bytes::from(vec![
            0u8;
            MAX_DATAGRAM
        ])])),
    };
    assert!(matches!(
        Record::new(reply.clone()),
        Err(EncodeError { len }) if len > MAX_DATAGRAM
    ));
    assert!(encode(&reply).is_err());
}

#[test]
fn a_body_lists_each_lease_once() {
    let body = Body::Parts {
        version: 1,
        metadata: Part::Shared(shared(1, 0, 8, 5)),
        buffers: vec![
            Part::Shared(shared(1, 64, 8, 5)),
            Part::Shared(shared(2, 0, 8, 3)),
            Part::Inline(Bytes::new()),
        ],
    };
    assert_eq!(body.leases(), vec![3, 5]);
    assert_eq!(body.shared().len(), 3);
}

proptest! {
    #[test]
    fn any_bytes_decode_without_panicking(data in prop::collection::vec(any::<u8>(), 0..256)) {
        let mut datagram = b"TWS4".to_vec();
        datagram.extend_from_slice(&data);
        let _ = decode(&datagram);
    }

    #[test]
    fn every_truncation_of_a_valid_message_is_refused(cut in 0usize..200) {
        for control in samples() {
            let bytes = encode(&control).unwrap();
            if cut < bytes.len() {
                prop_assert!(decode(&bytes[..cut]).is_err());
            }
        }
    }
}

#[test]
fn every_committed_fuzz_seed_is_a_message_of_this_protocol() {
    // Seeds of an older protocol only reach the "bad magic" check (the TWS2 seeds did, two
    // protocol versions long).
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/shm_control_decode");
    let mut seeds = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let knock = crate::shm::KnockReply::decode(&bytes).is_ok_and(|r| r.is_some());
        assert!(
            knock || decode(&bytes).is_ok(),
            "{} no longer decodes",
            path.display()
        );
        seeds += 1;
    }
    assert!(seeds >= 15, "{seeds} seeds in {}", dir.display());
}
