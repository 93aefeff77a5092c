use proptest::prelude::*;

use super::*;

fn samples() -> Vec<Control> {
    vec![
        Control::Hello(Hello {
            boot_id: "4f1c-boot".into(),
            user_ns: 4_026_531_837,
            uid: 1000,
            pid: 4242,
            node: "127.0.0.1:9000".into(),
        }),
        Control::Request {
            id: 7,
            kind: RequestKind::Ask,
            path: "/actors/echo".into(),
            body: BodyRef::Packed {
                fd: 0,
                lease: 11,
                len: 4096,
            },
        },
        Control::Request {
            id: 8,
            kind: RequestKind::Tell,
            path: "/actors/sink".into(),
            body: BodyRef::Direct {
                version: 3,
                metadata: Bytes::from_static(b"{\"dtype\":\"f32\"}"),
                segments: vec![
                    Segment {
                        fd: 0,
                        lease: 1,
                        offset: 0,
                        len: 1 << 20,
                    },
                    Segment {
                        fd: 1,
                        lease: 2,
                        offset: 4096,
                        len: 7,
                    },
                ],
            },
        },
        Control::Request {
            id: 10,
            kind: RequestKind::Ask,
            path: "/actors/small".into(),
            body: BodyRef::Inline(Bytes::from_static(b"PTM1-a-small-body")),
        },
        Control::Reply {
            id: 7,
            reply: WireReply::Tensor(BodyRef::Packed {
                fd: 0,
                lease: 3,
                len: 99,
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
    ]
}

#[test]
fn every_message_round_trips() {
    for control in samples() {
        assert_eq!(
            decode(&encode(&control)),
            Ok(control.clone()),
            "{control:?}"
        );
    }
}

#[test]
fn a_release_datagram_matches_its_golden_bytes() {
    let golden = [
        b"TWS1".as_slice(),
        &[4],          // tag: Release
        &[2, 0, 0, 0], // two leases
        &[5, 0, 0, 0, 0, 0, 0, 0],
        &[6, 0, 0, 0, 0, 0, 0, 0],
    ]
    .concat();
    assert_eq!(encode(&Control::Release { leases: vec![5, 6] }), golden);
}

#[test]
fn malformed_datagrams_are_refused_with_a_reason() {
    assert_eq!(decode(b"XXXX\x04"), Err(DecodeError("bad magic")));
    assert_eq!(decode(b"TWS1\x09"), Err(DecodeError("unknown message tag")));
    // A count that claims more items than bytes left: refused before allocating.
    assert_eq!(
        decode(b"TWS1\x04\xff\xff\xff\xff"),
        Err(DecodeError("a list runs past the end"))
    );
    let mut extra = encode(&Control::Release { leases: vec![1] });
    extra.push(0);
    assert_eq!(decode(&extra), Err(DecodeError("bytes after the message")));
    assert!(decode(&vec![0u8; MAX_DATAGRAM + 1]).is_err());
}

proptest! {
    #[test]
    fn any_bytes_decode_without_panicking(data in prop::collection::vec(any::<u8>(), 0..256)) {
        let mut datagram = b"TWS1".to_vec();
        datagram.extend_from_slice(&data);
        let _ = decode(&datagram);
    }

    #[test]
    fn every_truncation_of_a_valid_message_is_refused(cut in 0usize..200) {
        for control in samples() {
            let bytes = encode(&control);
            if cut < bytes.len() {
                prop_assert!(decode(&bytes[..cut]).is_err());
            }
        }
    }
}
