//! A fast hasher for the endpoint table's paths. The table holds only paths this node
//! registered; a peer's path is only looked up, never inserted, so a peer cannot fill a bucket
//! with colliding keys and the DoS resistance of the standard hasher buys nothing here.

use std::hash::{BuildHasherDefault, Hasher};

/// Builds [`PathHasher`]s.
pub(crate) type PathHash = BuildHasherDefault<PathHasher>;

/// A multiply-rotate hash over 8-byte words (the scheme of rustc's `FxHasher`).
#[derive(Default)]
pub(crate) struct PathHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl PathHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for PathHasher {
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

    fn finish(&self) -> u64 {
        self.0
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
        let mut table: HashMap<&str, usize, PathHash> = HashMap::default();
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
            let mut h = PathHasher::default();
            h.write(s.as_bytes());
            h.finish()
        };
        assert_ne!(hash("/actors/echo1"), hash("/actors/echo2"));
        assert_ne!(hash("abcdefgh"), hash("abcdefghi"));
    }
}
