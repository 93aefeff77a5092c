use bytes::Bytes;

/// One tensor message: an opaque `version`, opaque `metadata` and ordered payload `buffers`.
///
/// tensorwire never interprets `version` or `metadata`; the caller's schema (dtype, shape, byte
/// order, tensor names) lives in `metadata`. Each buffer is one contiguous byte region; its
/// order is the only structure tensorwire preserves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMessage {
    /// Carried unchanged end to end; never negotiated or checked.
    pub version: u32,
    /// Opaque caller bytes (for example a serialized schema).
    pub metadata: Bytes,
    /// The payload, in order. Empty buffers are allowed and preserved.
    pub buffers: Vec<Bytes>,
}

impl TensorMessage {
    /// Builds a message from its parts.
    pub fn new(version: u32, metadata: impl Into<Bytes>, buffers: Vec<Bytes>) -> Self {
        Self {
            version,
            metadata: metadata.into(),
            buffers,
        }
    }

    /// The same message in memory of this process alone: metadata and every buffer copied.
    ///
    /// A received buffer may be a view of another process's memory (shared memory on one
    /// host). That sender can never reuse the memory while a view lives, but a process of the
    /// same user can still write pages it owns; a receiver that must not depend on the sender
    /// takes a private copy (`docs/python.md`, "What a same-user peer can do").
    pub fn private_copy(&self) -> Self {
        Self {
            version: self.version,
            metadata: Bytes::copy_from_slice(&self.metadata),
            buffers: self
                .buffers
                .iter()
                .map(|b| Bytes::copy_from_slice(b))
                .collect(),
        }
    }

    /// The number of payload bytes: the sum of the buffer lengths. Metadata is not counted.
    pub fn total_bytes(&self) -> u64 {
        self.buffers.iter().fold(0u64, |sum, buffer| {
            sum.saturating_add(crate::len::len_u64(buffer.len()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_copy_is_equal_and_shares_no_memory() {
        let shared = Bytes::from(vec![5u8; 4096]);
        let sut = TensorMessage::new(3, Bytes::from_static(b"m"), vec![shared.clone()]);
        let copy = sut.private_copy();
        assert_eq!(copy, sut);
        assert_ne!(copy.buffers[0].as_ptr(), shared.as_ptr());
    }

    #[test]
    fn total_bytes_counts_buffers_only() {
        let sut = TensorMessage::new(
            7,
            Bytes::from_static(b"metadata is not counted"),
            vec![
                Bytes::from_static(b"abc"),
                Bytes::new(),
                Bytes::from_static(b"defg"),
            ],
        );
        assert_eq!(sut.total_bytes(), 7);
    }

    #[test]
    fn control_only_message_has_zero_total_bytes() {
        let sut = TensorMessage::new(3, Bytes::from_static(b"m"), Vec::new());
        assert_eq!(sut.total_bytes(), 0);
    }
}
