//! Entry points for the cargo-fuzz targets in `fuzz/` (compiled only under `cfg(fuzzing)`).
//!
//! Each decoder target decodes the input both in one piece and split into chunks whose sizes
//! the input itself chooses, checks that both agree, and checks that no more memory was
//! requested than the (small) fuzzing limits allow. The PTR1 sessions are driven by scripts of
//! driver steps (`sessions`), and so is the same-host session (`shm_session`).

mod sessions;
mod shm_session;

use std::cell::Cell;

use bytes::Bytes;

use crate::{Limits, WireError, ptm1, ptr1};

pub use sessions::{ptr1_client_session, ptr1_server_session};
pub use shm_session::shm_session;

/// Limits small enough that any accepted layout can be allocated quickly.
fn limits() -> Limits {
    Limits::builder()
        .max_wire_bytes(1 << 20)
        .max_metadata_bytes(1 << 16)
        .max_buffers(1024)
        .build()
}

/// Splits `data` into a chunk-size seed and the input proper.
fn split(data: &[u8]) -> (usize, &[u8]) {
    match data.split_first() {
        Some((&seed, rest)) => (usize::from(seed) + 1, rest),
        None => (1, data),
    }
}

/// PTR1: streaming decode in chunks vs. one-shot decode of the same bytes.
pub fn ptr1_decode(data: &[u8]) {
    let (chunk, input) = split(data);
    let limits = limits();
    let requested = Cell::new(0u64);
    let mut decoder = ptr1::Decoder::with_allocator(limits, |len| {
        requested.set(requested.get() + crate::len::len_u64(len));
        vec![0u8; len]
    });
    let mut streamed: Result<Option<ptr1::Frame>, WireError> = Ok(None);
    let mut consumed_total = 0;
    'feed: for piece in input.chunks(chunk) {
        let mut rest = piece;
        while !rest.is_empty() {
            match decoder.decode(rest) {
                Ok((consumed, frame)) => {
                    consumed_total += consumed;
                    rest = &rest[consumed..];
                    if let Some(frame) = frame {
                        streamed = Ok(Some(frame));
                        break 'feed;
                    }
                }
                Err(error) => {
                    streamed = Err(error);
                    break 'feed;
                }
            }
        }
    }
    assert!(
        requested.get() <= limits.max_wire_bytes(),
        "over-allocation"
    );
    let one_shot = ptr1::decode(Bytes::copy_from_slice(input), &limits);
    // A frame that used the whole input decodes the same both ways.
    if let Ok(Some(frame)) = &streamed {
        if consumed_total == input.len() {
            assert_eq!(one_shot.as_ref(), Ok(frame));
        }
    }
    if let Ok(frame) = &one_shot {
        assert_eq!(streamed.as_ref().ok().and_then(Option::as_ref), Some(frame));
        let encoded = ptr1::encode(frame, &limits).expect("a decoded frame re-encodes");
        let again = ptr1::decode(Bytes::from(encoded.to_vec()), &limits);
        assert_eq!(again.as_ref(), Ok(frame), "re-encoding round-trips");
        // Byte-exact unless the input had non-zero reserved bytes (ignored on read) or an
        // Error text that was not UTF-8 (decoded lossily).
        let lossy = matches!(frame, ptr1::Frame::Error { .. });
        if input[5..8] == [0, 0, 0] && !lossy {
            assert_eq!(encoded.to_vec(), input, "re-encoding is byte-exact");
        }
    }
}

/// PTM1: chunked body decode vs. one-shot decode of the same bytes.
pub fn ptm1_decode(data: &[u8]) {
    let (chunk, input) = split(data);
    let limits = limits();
    let requested = Cell::new(0u64);
    let mut decoder = ptm1::Decoder::with_allocator(limits, |len| {
        requested.set(requested.get() + crate::len::len_u64(len));
        vec![0u8; len]
    });
    let streamed = input
        .chunks(chunk)
        .try_for_each(|piece| decoder.push(piece));
    assert!(
        requested.get() <= limits.max_wire_bytes(),
        "over-allocation"
    );
    let streamed = streamed.and_then(|()| decoder.finish());
    let one_shot = ptm1::decode(Bytes::copy_from_slice(input), &limits);
    assert_eq!(
        streamed.is_ok(),
        one_shot.is_ok(),
        "{streamed:?} vs {one_shot:?}"
    );
    if let (Ok(a), Ok(b)) = (&streamed, &one_shot) {
        assert_eq!(a, b);
        // PTM1 is canonical: a body that decodes re-encodes to the same bytes.
        assert_eq!(
            ptm1::encode(a, &limits).expect("re-encodes").to_vec(),
            input
        );
    }
}

/// The shared-memory control datagram and the knock reply: no panic on any input, and every
/// datagram that decodes encodes back to the same bytes (the format has one spelling), except
/// error texts longer than the limit, which encoding cuts.
pub fn shm_control_decode(data: &[u8]) {
    use crate::shm::{Control, KnockReply, MAX_ERROR_TEXT, WireReply, decode, encode};

    if let Ok(Some(reply)) = KnockReply::decode(data) {
        assert_eq!(KnockReply::decode(&reply.encode()), Ok(Some(reply)));
    }
    let Ok(control) = decode(data) else {
        return;
    };
    let long_error = matches!(
        &control,
        Control::Reply { reply: WireReply::Error(text), .. } if text.len() > MAX_ERROR_TEXT
    );
    let again = encode(&control).expect("a decoded datagram fits in one");
    if !long_error {
        assert_eq!(again, data, "a datagram re-encodes to the same bytes");
    }
    assert!(decode(&again).is_ok());
    // Bounded work: the leases a body names are no more than its bytes allow.
    if let Control::Request { body, .. } = &control {
        assert!(body.leases().len() <= data.len() / 32 + 1);
    }
}
