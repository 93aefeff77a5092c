use super::*;

fn token(n: u8) -> Token {
    Token([n; 16])
}

fn message(lens: &[usize]) -> TensorMessage {
    let buffers = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| Bytes::from(vec![u8::try_from(i % 251).unwrap(); len]))
        .collect();
    TensorMessage::new(7, Bytes::from_static(b"meta"), buffers)
}

#[test]
fn parts_are_page_aligned_and_cover_the_buffer_once() {
    for (len, count) in [
        (1 << 20, 4),
        ((1 << 20) + 1, 4),
        (300_000, 3),
        (64 << 20, 64),
    ] {
        let mut at = 0;
        for index in 0..count {
            let range = part(len, count, index);
            assert_eq!(range.start, at.min(len), "{len} / {count}");
            assert!(range.start % PART_ALIGN == 0 || range.is_empty());
            at = range.end.max(at);
        }
        assert_eq!(at, len, "{len} / {count}: covered");
    }
}

#[test]
fn a_plan_cuts_long_buffers_and_keeps_short_ones_in_the_request() {
    let message = message(&[1 << 20, 100, 3 << 20]);
    let plan = plan(&message, 4, token(1)).unwrap();
    assert_eq!(plan.stripes.len(), 4);
    for (k, (descriptor, stripe)) in plan.stripes.iter().enumerate() {
        assert_eq!(usize::from(descriptor.index), k);
        let lens: Vec<usize> = stripe.buffers.iter().map(Bytes::len).collect();
        let parsed = StripeDescriptor::parse(&descriptor.to_path(), &lens).unwrap();
        assert_eq!(&parsed, descriptor);
        assert_eq!(
            parsed.pieces.iter().map(|p| p.buffer).collect::<Vec<_>>(),
            [0, 2]
        );
    }
    // The request: the header and the one short buffer.
    assert_eq!(plan.request.buffers.len(), 2);
    let header = StripedHeader::parse(&plan.request.buffers[0], 1).unwrap();
    assert_eq!(header.token, token(1));
    assert_eq!(
        header.buffers,
        [
            BufferPlace::Cut(1 << 20),
            BufferPlace::Inline,
            BufferPlace::Cut(3 << 20)
        ]
    );
    // Put back together from the parts, it is the message.
    let cut: Vec<Bytes> = [0, 2]
        .iter()
        .map(|&b| {
            let mut whole = Vec::new();
            for (descriptor, stripe) in &plan.stripes {
                let i = descriptor
                    .pieces
                    .iter()
                    .position(|p| p.buffer == b)
                    .unwrap();
                whole.extend_from_slice(&stripe.buffers[i]);
            }
            Bytes::from(whole)
        })
        .collect();
    assert_eq!(header.rebuild(plan.request, cut).unwrap(), message);
}

#[test]
fn a_message_without_long_buffers_is_not_cut() {
    assert!(plan(&message(&[100, 4096]), 4, token(2)).is_none());
    assert!(
        plan(&message(&[1 << 20]), 1, token(2)).is_none(),
        "one stripe is none"
    );
}

#[test]
fn descriptors_that_do_not_match_their_frame_are_refused() {
    let path = StripeDescriptor {
        token: token(3),
        index: 1,
        count: 4,
        pieces: vec![Piece {
            buffer: 0,
            buffer_len: 1 << 20,
        }],
    }
    .to_path();
    let good = part(1 << 20, 4, 1).len();
    assert!(StripeDescriptor::parse(&path, &[good]).is_ok());
    for (path, lens) in [
        (path.clone(), vec![good + 1]),
        (path.clone(), vec![good, good]),
        (path.replace(" 1 4 ", " 4 4 "), vec![good]),
        (path.replace(" 1 4 ", " 0 1 "), vec![good]),
        (path.replace("tw-stripe/1", "tw-stripe/2"), vec![good]),
        (path.replace("0:", "x:"), vec![good]),
        ("/actors/echo".to_owned(), vec![good]),
        (path.replace(":1048576", ":1000"), vec![good]),
    ] {
        assert!(StripeDescriptor::parse(&path, &lens).is_err(), "{path}");
    }
}

#[test]
fn headers_are_checked_before_they_are_trusted() {
    let header = StripedHeader {
        token: token(4),
        count: 4,
        buffers: vec![BufferPlace::Cut(1 << 20), BufferPlace::Inline],
    };
    let bytes = header.encode();
    assert_eq!(StripedHeader::parse(&bytes, 1).unwrap(), header);
    assert!(
        StripedHeader::parse(&bytes, 2).is_err(),
        "inline count differs"
    );
    assert!(StripedHeader::parse(&bytes[..bytes.len() - 1], 1).is_err());
    let mut longer = bytes.to_vec();
    longer.push(0);
    assert!(StripedHeader::parse(&longer, 1).is_err(), "trailing bytes");
    let mut huge_count = bytes.to_vec();
    huge_count[23..27].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(StripedHeader::parse(&huge_count, 1).is_err());
    let short = StripedHeader {
        buffers: vec![BufferPlace::Cut(1000)],
        ..header
    };
    assert!(
        StripedHeader::parse(&short.encode(), 0).is_err(),
        "too short to cut"
    );
}

#[test]
fn capabilities_say_whether_a_peer_takes_stripes() {
    let caps = Capabilities { max_stripes: 16 };
    assert_eq!(Capabilities::parse(&caps.encode()), Some(caps));
    assert_eq!(Capabilities::parse(b"stripes=0 max-stripes=16"), None);
    assert_eq!(Capabilities::parse(b"max-stripes=16"), None);
    assert_eq!(Capabilities::parse(b"stripes=1 max-stripes=1"), None);
    assert_eq!(
        Capabilities::parse(b"other=x stripes=1 max-stripes=999"),
        Some(Capabilities {
            max_stripes: MAX_STRIPES
        })
    );
    assert_eq!(Capabilities::parse(b"\xff"), None);
}

#[test]
fn capabilities_say_how_many_requests_a_peer_reads_ahead() {
    let with_stripes = capabilities_reply(Some(Capabilities { max_stripes: 8 }), 64);
    assert_eq!(
        Capabilities::parse(&with_stripes),
        Some(Capabilities { max_stripes: 8 })
    );
    assert_eq!(pipeline_depth(&with_stripes), Some(64));
    let without = capabilities_reply(None, 64);
    assert_eq!(Capabilities::parse(&without), None, "takes no stripes");
    assert_eq!(pipeline_depth(&without), Some(64));
    // A peer that says nothing of it, or one, or nonsense: one request at a time.
    assert_eq!(pipeline_depth(b"stripes=1 max-stripes=16"), None);
    assert_eq!(pipeline_depth(b"pipeline=1"), None);
    assert_eq!(pipeline_depth(b"pipeline=lots"), None);
    assert_eq!(pipeline_depth(b"pipeline=70000"), None);
    assert_eq!(pipeline_depth(b"\xff"), None);
}
