//! Length conversions between `usize` (memory) and `u64` (the wire).

/// Widens a `usize` length to `u64`.
///
/// Every target Rust supports has a `usize` of at most 64 bits, so this widening is lossless;
/// the assertion turns a hypothetical 128-bit target into a build error.
pub const fn len_u64(len: usize) -> u64 {
    const _: () = assert!(usize::BITS <= u64::BITS);
    len as u64
}

/// Reads a little-endian `u32` from the first four bytes of `bytes`.
pub(crate) fn le_u32(bytes: &[u8]) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[..4]);
    u32::from_le_bytes(word)
}

/// Reads a little-endian `u64` from the first eight bytes of `bytes`.
pub(crate) fn le_u64(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(word)
}
