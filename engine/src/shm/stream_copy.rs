//! A copy that writes around the CPU caches: non-temporal stores (SSE2's `movntdq`, on every
//! x86-64 CPU), which send whole lines to memory without first reading each destination line
//! into the cache. For copies far larger than the caches this moves 1.5–1.7× the bytes of
//! `memcpy` per second on the development VM (`benches/examples/split_copy.rs`), and it does not
//! push other data out of the caches. Elsewhere than x86-64 it is `copy_from_slice`.
//!
//! The stores are ordered with a store fence before the call returns, so whatever the caller
//! publishes afterwards (a queue index with `Release`) is seen after the bytes.

/// Copies `source` into `destination` with non-temporal stores.
///
/// # Panics
///
/// If the two differ in length (as `copy_from_slice`).
pub(crate) fn stream_copy(destination: &mut [u8], source: &[u8]) {
    assert_eq!(
        destination.len(),
        source.len(),
        "a copy into a destination of another length"
    );
    #[cfg(target_arch = "x86_64")]
    {
        let len = source.len();
        let head = destination.as_ptr().align_offset(LINE).min(len);
        let body = (len - head) / LINE * LINE;
        destination[..head].copy_from_slice(&source[..head]);
        let (middle, tail) = destination[head..].split_at_mut(body);
        // SAFETY: `middle` is `body` writable bytes starting at a 64-byte boundary, `body` is
        // a multiple of 64, and `source[head..]` has at least `body` readable bytes; a
        // `&mut` and a `&` slice never overlap.
        unsafe { stream(middle.as_mut_ptr(), source[head..].as_ptr(), body) };
        tail.copy_from_slice(&source[head + body..]);
        // SAFETY: `sfence` (SSE, part of every x86-64 CPU) has no operands and no
        // preconditions. The non-temporal stores are weakly ordered: fenced here, before
        // anything the caller stores next.
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    destination.copy_from_slice(source);
}

/// A cache line: the unit the loop stores.
#[cfg(target_arch = "x86_64")]
const LINE: usize = 64;

/// Copies `len` bytes from `source` to `destination` with 16-byte non-temporal stores.
///
/// # Safety
///
/// `destination` must be valid for writes of `len` bytes and 64-byte aligned, `source` valid
/// for reads of `len` bytes, the two must not overlap, and `len` must be a multiple of 64.
#[cfg(target_arch = "x86_64")]
unsafe fn stream(destination: *mut u8, source: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let mut at = 0;
    while at < len {
        for lane in (0..LINE).step_by(16) {
            // SAFETY: `at + lane + 16 <= len` (both are multiples of 16 below a multiple of
            // 64), so the 16 bytes read and written are within what the caller vouched for;
            // the store's address is 16-byte aligned (the destination is 64-byte aligned) and
            // the load takes any alignment.
            unsafe {
                let v = _mm_loadu_si128(source.add(at + lane).cast::<__m128i>());
                _mm_stream_si128(destination.add(at + lane).cast::<__m128i>(), v);
            }
        }
        at += LINE;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_alignment_and_length_is_copied_exactly() {
        let source: Vec<u8> = (0..1000u32).map(|i| (i * 13).to_le_bytes()[0]).collect();
        for start in [0usize, 1, 15, 16, 63, 64] {
            for len in [0usize, 1, 63, 64, 65, 127, 128, 500, 900] {
                let mut target = vec![0xAAu8; 1000];
                let from = &source[start..start + len.min(1000 - start)];
                let place = (start * 7) % 64;
                let end = place + from.len();
                stream_copy(&mut target[place..end], from);
                assert_eq!(&target[place..end], from, "start {start}, len {len}");
                assert!(target[..place].iter().all(|&b| b == 0xAA), "before");
                assert!(target[end..].iter().all(|&b| b == 0xAA), "after");
            }
        }
    }
}
