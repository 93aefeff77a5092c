//! A fast hasher for tables whose keys this node chooses: ids it gave out (leases, requests),
//! paths it registered. Such a table never inserts a key a peer picked (a peer's key is only
//! looked up), so a peer cannot fill a bucket with colliding keys and the flooding resistance
//! of the standard hasher buys nothing there. A table a peer inserts into keeps the standard
//! hasher.

use std::hash::{BuildHasherDefault, Hasher};

/// Builds [`FastHasher`]s.
pub type FastHash = BuildHasherDefault<FastHasher>;

/// A multiply-rotate hash over 8-byte words (the scheme of rustc's `FxHasher`).
#[derive(Default)]
pub struct FastHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FastHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, byte: u8) {
        self.add(u64::from(byte));
    }

    fn write_u32(&mut self, word: u32) {
        self.add(u64::from(word));
    }

    fn write_u64(&mut self, word: u64) {
        self.add(word);
    }

    fn write_usize(&mut self, word: usize) {
        self.add(word as u64);
    }

    fn finish(&self) -> u64 {
        // The multiply carries low bits up, never down: keys that differ only in high bits
        // (slot offsets, multiples of 64 KiB) would share their low bits, which pick the
        // bucket. Rotating brings the well-mixed high bits down.
        self.0.rotate_left(26)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn paths_that_differ_anywhere_are_told_apart() {
        let paths = [
            "/actors/echo",
            "/actors/echp",
            "/actors/echo/",
            "/actors/ech",
            "",
            "a",
        ];
        let mut table: HashMap<&str, usize, FastHash> = HashMap::default();
        for (i, path) in paths.iter().enumerate() {
            table.insert(path, i);
        }
        for (i, path) in paths.iter().enumerate() {
            assert_eq!(table.get(path), Some(&i), "{path:?}");
        }
        assert_eq!(table.get("/actors/other"), None);
    }

    #[test]
    fn a_trailing_partial_word_changes_the_hash() {
        let hash = |s: &str| {
            let mut h = FastHasher::default();
            h.write(s.as_bytes());
            h.finish()
        };
        assert_ne!(hash("/actors/echo1"), hash("/actors/echo2"));
        assert_ne!(hash("abcdefgh"), hash("abcdefghi"));
    }

    #[test]
    fn ids_and_tuples_of_them_are_told_apart() {
        let mut table: HashMap<(u32, u64, u64), u64, FastHash> = HashMap::default();
        let mut n = 0;
        for holder in [1u32, 7, 4_000_000] {
            for segment in [0u64, 1, 2, 1 << 40] {
                for slot in [0u64, 65_536, 131_072] {
                    table.insert((holder, segment, slot), n);
                    n += 1;
                }
            }
        }
        assert_eq!(table.len() as u64, n);
        assert_eq!(table.get(&(7, 1 << 40, 65_536)), Some(&22));
        assert_eq!(table.get(&(7, 1 << 40, 65_537)), None);
    }
}
