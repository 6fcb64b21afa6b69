//! A fast, deterministic hasher for the cache's own keys.
//!
//! Keys are small integers chosen by the cache (dataset, object id, record
//! index), not by an adversary over a network, so SipHash's flood resistance
//! buys nothing and costs a large share of an ARC hit. This is a
//! multiply-rotate hash (in the family of FxHash) with a final avalanche step
//! so that both the low bits (hash table buckets) and the high bits (shard
//! selection) are well mixed. Deterministic across runs, which keeps trace
//! replay and sharded hit ratios reproducible.

use std::hash::{BuildHasher, Hasher};

const SEED_MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

#[derive(Clone, Copy, Default)]
/// The hasher behind [`FastHashMap`]: fast on the integer keys the cache uses.
pub struct FastHasher {
    state: u64,
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.write_u64(u64::from_le_bytes(chunk.try_into().expect("8-byte chunk")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(last) ^ ((rest.len() as u64) << 56));
        }
    }

    #[inline]
    fn write_u64(&mut self, value: u64) {
        self.state = (self.state.rotate_left(23) ^ value).wrapping_mul(SEED_MULTIPLIER);
    }

    #[inline]
    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    #[inline]
    fn write_u8(&mut self, value: u8) {
        self.write_u64(u64::from(value));
    }

    #[inline]
    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        mix64(self.state)
    }
}

/// The avalanche step of splitmix64: every input bit affects every output bit.
#[inline]
pub fn mix64(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[derive(Clone, Copy, Default)]
/// Builds [`FastHasher`]s; the `BuildHasher` of [`FastHashMap`].
pub struct FastBuildHasher;

impl BuildHasher for FastBuildHasher {
    type Hasher = FastHasher;
    fn build_hasher(&self) -> FastHasher {
        FastHasher::default()
    }
}

/// Hashes one value with [`FastHasher`].
pub fn hash_one<T: std::hash::Hash + ?Sized>(value: &T) -> u64 {
    FastBuildHasher.hash_one(value)
}

/// A `HashMap` with [`FastBuildHasher`].
pub type FastHashMap<K, V> = std::collections::HashMap<K, V, FastBuildHasher>;
