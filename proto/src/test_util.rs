//! Helpers shared by the codec tests.

use std::cell::RefCell;
use std::rc::Rc;

use bytes::Bytes;
use proptest::prelude::*;

use crate::TensorMessage;

/// Concatenates annotated pieces of a golden frame.
pub(crate) fn cat(pieces: &[&[u8]]) -> Vec<u8> {
    pieces.concat()
}

/// An allocator that records every length it was asked for.
#[derive(Clone, Default)]
pub(crate) struct Recorder(Rc<RefCell<Vec<usize>>>);

impl Recorder {
    pub(crate) fn alloc(&self) -> impl FnMut(usize) -> Vec<u8> + use<> {
        let requests = Rc::clone(&self.0);
        move |len| {
            requests.borrow_mut().push(len);
            vec![0; len]
        }
    }

    pub(crate) fn requests(&self) -> Vec<usize> {
        self.0.borrow().clone()
    }

    pub(crate) fn total(&self) -> u64 {
        self.0
            .borrow()
            .iter()
            .map(|&n| crate::len::len_u64(n))
            .sum()
    }
}

/// Splits `data` at the given cut points (taken modulo its length).
pub(crate) fn chunks(data: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
    points.push(0);
    points.push(data.len());
    points.sort_unstable();
    points
        .windows(2)
        .map(|w| data[w[0]..w[1]].to_vec())
        .collect()
}

pub(crate) fn any_bytes(max: usize) -> impl Strategy<Value = Bytes> {
    prop::collection::vec(any::<u8>(), 0..=max).prop_map(Bytes::from)
}

pub(crate) fn any_message() -> impl Strategy<Value = TensorMessage> {
    (
        any::<u32>(),
        any_bytes(48),
        prop::collection::vec(any_bytes(80), 0..12),
    )
        .prop_map(|(version, metadata, buffers)| TensorMessage {
            version,
            metadata,
            buffers,
        })
}
