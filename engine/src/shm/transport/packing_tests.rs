//! Layout and fill: what a packed message keeps alive, and until when.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tensorwire_proto::shm::{Body, Part, Returned};
use tensorwire_proto::{Limits, TensorMessage, len_u64};

use super::{INLINE_REPLY, Located, layout};
use crate::shm::segments::{Segments, SegmentsConfig};
use crate::shm::transport::lending::Lending;

/// Stands for the peer's segment mapped here: when its last view drops, the lease it came
/// under is released (on a real connection, a Release record queued to the peer).
struct PeerMapping {
    bytes: Vec<u8>,
    released: Arc<AtomicBool>,
}

impl AsRef<[u8]> for PeerMapping {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for PeerMapping {
    fn drop(&mut self) {
        self.released.store(true, Ordering::SeqCst);
    }
}

const PEER_SEGMENT: u64 = 7;

fn segments() -> Segments {
    Segments::new(SegmentsConfig {
        quota: 64 << 20,
        idle_keep: 0,
        idle_after: Duration::ZERO,
    })
}

/// A view of `len` bytes at `at` of a peer's mapping, the mapping's only handle, and the flag
/// its release sets.
fn peer_view(at: usize, len: usize) -> (Bytes, std::ops::Range<usize>, Arc<AtomicBool>) {
    let released = Arc::new(AtomicBool::new(false));
    let mapping = Bytes::from_owner(PeerMapping {
        bytes: vec![0xA5; 64 << 10],
        released: Arc::clone(&released),
    });
    let base = mapping.as_ptr() as usize;
    let range = base..base + mapping.len();
    (mapping.slice(at..at + len), range, released)
}

/// Finds bytes in the peer's mapping at `mapping`, as the connection's lookup does.
fn locator(mapping: std::ops::Range<usize>) -> impl Fn(&[u8]) -> Option<Located> {
    move |bytes| {
        super::within(bytes, mapping.clone()).map(|offset| Located {
            segment: PEER_SEGMENT,
            offset: len_u64(offset),
            mapping: mapping.clone(),
        })
    }
}

#[test]
fn a_view_of_the_peer_s_memory_is_released_only_after_the_record_naming_it_is_sent() {
    // An echo's reply: its one buffer is the asker's own memory, sent back by reference. The
    // reply's message holds the last view of that memory, so the view must outlive the record
    // that names it: a Release queued before the record lets the asker lend the slot again
    // (or refuse the reply) before it reads the record.
    let (view, mapping, released) = peer_view(4096, 8192);
    let locate = locator(mapping);
    let message = TensorMessage::new(1, Bytes::from_static(b"meta"), vec![view]);
    let limits = Limits::default();
    let ours = segments();
    let planned = layout(&message, &limits, 16, INLINE_REPLY, &ours, &locate).unwrap();
    assert_eq!(planned.copy, 0, "sent where it is: nothing to copy");

    let lending = Lending::default();
    let mut packed = planned.fill(message, &limits, None, &lending, 42).unwrap();
    assert!(
        !released.load(Ordering::SeqCst),
        "fill released the peer's memory before the record naming it was written"
    );
    let body = packed.take_body();
    let Body::Parts { buffers, .. } = &body else {
        panic!("expected a body of parts");
    };
    assert_eq!(
        buffers.as_slice(),
        [Part::Returned(Returned {
            segment: PEER_SEGMENT,
            offset: 4096,
            len: 8192,
        })]
    );
    drop(body); // the record is written (its body goes with it) ...
    assert!(
        !released.load(Ordering::SeqCst),
        "the view was released with the body, before the send was done"
    );
    drop(packed); // ... then the send's bookkeeping is done: now the release may go
    assert!(released.load(Ordering::SeqCst));
}

#[test]
fn a_small_message_s_parts_move_into_the_record_and_live_as_long_as_it() {
    // Inline: the parts (views of anybody's memory, here the peer's metadata) are moved into
    // the record, so they drop with the record's body, after it is written.
    let (metadata, mapping, released) = peer_view(0, 100);
    let locate = locator(mapping);
    let message = TensorMessage::new(1, metadata, vec![Bytes::from(vec![1u8; 256])]);
    let limits = Limits::default();
    let ours = segments();
    let planned = layout(&message, &limits, 16, INLINE_REPLY, &ours, &locate).unwrap();
    assert_eq!(planned.copy, 0);
    let lending = Lending::default();
    let mut packed = planned.fill(message, &limits, None, &lending, 42).unwrap();
    let body = packed.take_body();
    assert!(
        matches!(body, Body::InlineSlices(_)),
        "expected an inline body"
    );
    drop(packed);
    assert!(
        !released.load(Ordering::SeqCst),
        "the inline body's parts were dropped before the body itself"
    );
    drop(body);
    assert!(released.load(Ordering::SeqCst));
}
