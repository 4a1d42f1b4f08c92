//! A fast, non-cryptographic hasher for the name indexes built over dumps (FxHash, the
//! multiply-rotate hash rustc uses). Dumps have 100k+ instruction and value names; the standard
//! library's SipHash costs several times more per key and buys DoS resistance that local files
//! do not need.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

/// FxHash state: one word, rotated, xored with each input word and multiplied by a constant.
#[derive(Debug, Default, Clone, Copy)]
pub struct FxHasher {
    hash: u64,
}

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// `BuildHasher` of [`FxHasher`].
pub type FxBuildHasher = BuildHasherDefault<FxHasher>;
/// A `HashMap` hashed with [`FxHasher`].
pub type FxHashMap<K, V> = HashMap<K, V, FxBuildHasher>;
/// A `HashSet` hashed with [`FxHasher`].
pub type FxHashSet<K> = HashSet<K, FxBuildHasher>;

/// An empty [`FxHashMap`] with room for `n` entries.
pub fn map_with_capacity<K, V>(n: usize) -> FxHashMap<K, V> {
    HashMap::with_capacity_and_hasher(n, FxBuildHasher::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_keys_distinct_entries() {
        let mut m: FxHashMap<&str, usize> = map_with_capacity(4);
        let keys = [
            "a",
            "ab",
            "abcdefgh",
            "abcdefghi",
            "fusion.1",
            "fusion.10",
            "",
        ];
        for (k, key) in keys.iter().enumerate() {
            m.insert(key, k);
        }
        for (k, key) in keys.iter().enumerate() {
            assert_eq!(m.get(key), Some(&k));
        }
        let mut h1 = FxHasher::default();
        h1.write(b"abc");
        let mut h2 = FxHasher::default();
        h2.write(b"abc\0");
        assert_ne!(h1.finish(), h2.finish());
    }
}
