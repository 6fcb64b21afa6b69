/*
 * Key hashing for the replay maps.
 *
 * The std `HashMap` defaults to SipHash with a random seed: robust against
 * adversarial keys, but several times slower than needed for u64 block
 * numbers, and seeded differently on every run.  Replays hash every request
 * at least once, so hashing is a visible share of their time, and we want
 * two runs of the same trace to behave identically down to map iteration
 * order.  Keys here are block numbers and object ids that arrive in long
 * sequential runs; a plain multiply would leave the low bits (hashbrown's
 * bucket index) poorly mixed for such keys, so we use the full 64-bit
 * finaliser of MurmurHash3 (fmix64), which is a bijection with good
 * avalanche in every bit and costs two multiplies.
 */

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A deterministic hasher for `u64` keys (MurmurHash3's fmix64).
#[derive(Default, Clone, Copy)]
pub struct KeyHasher {
    state: u64,
}

#[inline]
fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

impl Hasher for KeyHasher {
    #[inline]
    fn finish(&self) -> u64 {
        fmix64(self.state)
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        // Fold successive words so that non-u64 keys still hash correctly.
        self.state = fmix64(self.state ^ i);
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }
}

/// `HashMap` keyed by `u64` using `KeyHasher`.
pub type KeyMap<V> = HashMap<u64, V, BuildHasherDefault<KeyHasher>>;

/// An empty `KeyMap` with room for `capacity` entries.
pub fn key_map_with_capacity<V>(capacity: usize) -> KeyMap<V> {
    HashMap::with_capacity_and_hasher(capacity, BuildHasherDefault::default())
}
