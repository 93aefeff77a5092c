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
