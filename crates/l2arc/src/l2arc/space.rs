//! What a cache device holds now (`l2_asize`, `l2_size`, `l2_bufs`): the
//! records of the index entries whose blocks the write hand has not
//! overwritten, counted in buckets along the data area and written off as
//! the hand passes.
//!
//! Why. Index entries are dropped lazily (a lookup that meets one, and
//! the sweep every sixteenth of a lap): a sum over what the index holds
//! counted up to a sixteenth of a device of records already overwritten,
//! and `l2_asize` exceeded the device (issue 32: 136,118,272 bytes on a
//! data area of 133,169,152). Before each batch the hand overwrites a
//! range ahead of it (`Geometry::holds`: a block of the previous lap is
//! intact only from `batch_blocks_max` past the hand). So each bucket
//! says which lap its bytes are of, and as that range reaches a bucket its
//! bytes of the older lap are written off at once (`advance`), whatever
//! the index still holds; an entry removed later from a written-off
//! bucket subtracts nothing (`remove`).
//!
//! Exact to a bucket: the bucket the overwritten range reaches into is
//! written off whole, so what is counted is at most a bucket (1/4096 of
//! the data area) less than what is held, never more. Each bucket word
//! is one atomic (`lap mod 32` above the amount): a removal and a write-
//! off of one bucket, racing, subtract its bytes once. Adds and write-offs
//! happen under the device's writer lock, removals anywhere.

use std::sync::atomic::{AtomicU64, Ordering};

use super::format::{BLOCK_BYTES, Compression, Location};

/// Buckets per device, at most (64 KiB of counters a device).
const BUCKETS_MAX: u64 = 4096;
/// A bucket word: the lap (mod 32) in the top 5 bits, the amount below.
const LAP_SHIFT: u32 = 59;
const AMOUNT_MASK: u64 = (1 << LAP_SHIFT) - 1;
/// The three amounts of a bucket: records, bytes of plain records (as
/// stored), bytes of compressed records (as allocated).
const ENTRIES: usize = 0;
const PLAIN: usize = 1;
const COMPRESSED: usize = 2;

/// Records and bytes a device holds (see the module comment).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Held {
    pub entries: u64,
    /// Bytes of uncompressed records, as stored.
    pub plain_bytes: u64,
    /// Allocated bytes of compressed records.
    pub compressed_bytes: u64,
}

impl Held {
    /// Allocated size (`l2_asize`).
    pub(crate) fn asize_bytes(&self) -> u64 {
        // A record is one of the two: each sum is of its own records.
        debug_assert!(
            self.plain_bytes
                .checked_add(self.compressed_bytes)
                .is_some()
        );
        self.plain_bytes + self.compressed_bytes
    }
}

/// The amounts one index entry adds to its bucket.
fn amounts(location: Location) -> [u64; 3] {
    debug_assert!(location.asize_blocks() >= 1 && location.compression().is_some());
    if location.compression() == Some(Compression::Off) {
        [1, location.stored_bytes() as u64, 0]
    } else {
        [1, 0, u64::from(location.asize_blocks()) * BLOCK_BYTES]
    }
}

fn word(lap_mod32: u32, amount: u64) -> u64 {
    debug_assert!(lap_mod32 < 32 && amount <= AMOUNT_MASK);
    (u64::from(lap_mod32) << LAP_SHIFT) | amount
}

fn lap_of(word: u64) -> u32 {
    const { assert!(64 - LAP_SHIFT == 5, "32 laps: a location's lap_mod32") };
    (word >> LAP_SHIFT) as u32
}

/// A device's held records, by bucket (see the module comment).
pub(crate) struct Space {
    start_block: u32,
    end_block: u32,
    bucket_blocks: u32,
    /// `batch_blocks_max`: how far past the hand the previous lap is gone.
    margin_blocks: u32,
    buckets: Box<[[AtomicU64; 3]]>,
}

impl Space {
    /// The space of a data area `[start_block, end_block)` whose hand is
    /// at `hand` in `lap`, holding nothing yet.
    pub(crate) fn new(
        start_block: u32,
        end_block: u32,
        margin_blocks: u32,
        lap: u32,
        hand: u32,
    ) -> Space {
        assert!(start_block < end_block && margin_blocks >= 1);
        let blocks = u64::from(end_block - start_block);
        let bucket_blocks = blocks.div_ceil(BUCKETS_MAX) as u32;
        let count = blocks.div_ceil(u64::from(bucket_blocks)) as usize;
        let space = Space {
            start_block,
            end_block,
            bucket_blocks,
            margin_blocks,
            buckets: (0..count).map(|_| Default::default()).collect(),
        };
        for k in 0..count {
            let empty = word(space.expected_lap(k, lap, hand), 0);
            for amount in &space.buckets[k] {
                amount.store(empty, Ordering::Relaxed);
            }
        }
        assert!(count as u64 <= BUCKETS_MAX && count as u64 * u64::from(bucket_blocks) >= blocks);
        space
    }

    fn bucket_start(&self, k: usize) -> u64 {
        debug_assert!(k < self.buckets.len());
        u64::from(self.start_block) + k as u64 * u64::from(self.bucket_blocks)
    }

    fn bucket_of(&self, block: u32) -> usize {
        debug_assert!(block >= self.start_block && block < self.end_block);
        ((block - self.start_block) / self.bucket_blocks) as usize
    }

    /// The lap (mod 32) whose records bucket `k` counts when the hand is
    /// at `hand` in `lap`: this lap's once the overwritten range ahead of
    /// the hand has reached the bucket, the previous lap's before.
    fn expected_lap(&self, k: usize, lap: u32, hand: u32) -> u32 {
        // The hand lies in the data area (at its end after a batch there).
        debug_assert!(hand >= self.start_block && hand <= self.end_block);
        let overwritten_to = u64::from(hand) + u64::from(self.margin_blocks);
        let counted = if self.bucket_start(k) < overwritten_to {
            lap
        } else {
            lap.wrapping_sub(1)
        };
        counted % 32
    }

    /// Counts an entry the index takes in, if its bucket counts its lap
    /// (it does unless the hand has overwritten the bucket since).
    /// Called under the device's writer lock.
    pub(crate) fn add(&self, location: Location) -> bool {
        let bucket = &self.buckets[self.bucket_of(location.block())];
        let lap = u32::from(location.lap_mod32());
        if lap_of(bucket[ENTRIES].load(Ordering::Relaxed)) != lap {
            return false;
        }
        for (amount, add) in bucket.iter().zip(amounts(location)) {
            let before = amount.fetch_add(add, Ordering::Relaxed);
            // Under the writer lock no write-off runs: the tags agree,
            // and an amount is at most the data area.
            debug_assert_eq!(lap_of(before), lap);
            debug_assert!((before & AMOUNT_MASK) + add <= AMOUNT_MASK);
        }
        true
    }

    /// Counts the entries of a rebuilt run at once (one pass over the
    /// buckets, not three atomics an entry). Under the writer lock.
    pub(crate) fn add_all(&self, locations: impl Iterator<Item = Location>) {
        let mut sums = vec![[0u64; 3]; self.buckets.len()];
        debug_assert_eq!(sums.len(), self.buckets.len());
        for location in locations {
            let k = self.bucket_of(location.block());
            let lap = u32::from(location.lap_mod32());
            if lap_of(self.buckets[k][ENTRIES].load(Ordering::Relaxed)) == lap {
                for (sum, add) in sums[k].iter_mut().zip(amounts(location)) {
                    *sum += add;
                }
            }
        }
        for (bucket, sum) in self.buckets.iter().zip(&sums) {
            if sum[ENTRIES] != 0 {
                for (amount, add) in bucket.iter().zip(sum) {
                    amount.fetch_add(*add, Ordering::Relaxed);
                }
            }
        }
    }

    /// Uncounts an entry the index let go, unless the hand overwrote its
    /// bucket since (its bytes were written off then).
    pub(crate) fn remove(&self, location: Location) {
        let bucket = &self.buckets[self.bucket_of(location.block())];
        let lap = u32::from(location.lap_mod32());
        debug_assert!(lap < 32);
        for (amount, sub) in bucket.iter().zip(amounts(location)) {
            // `then`, not `then_some`: the subtraction must not run when
            // the bucket counts another lap (its word may be below `sub`).
            let _ = amount.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                (lap_of(w) == lap && w & AMOUNT_MASK >= sub).then(|| w - sub)
            });
        }
    }

    /// The hand moved from `from` to `to` (`(lap, hand)` as published):
    /// writes off the buckets the range overwritten ahead of it reached.
    /// Called under the device's writer lock, before `to` is published.
    pub(crate) fn advance(&self, from: (u32, u32), to: (u32, u32)) {
        let (first, last) = if from.0 == to.0 {
            // Within a lap, the range ahead moved from `from.1 + margin`
            // to `to.1 + margin`: the buckets starting in between.
            debug_assert!(to.1 >= from.1);
            (self.first_bucket_from(from.1), self.first_bucket_from(to.1))
        } else {
            (0, self.buckets.len())
        };
        for k in first..last {
            let expected = self.expected_lap(k, to.0, to.1);
            for amount in &self.buckets[k] {
                let _ = amount.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                    (lap_of(w) != expected).then_some(word(expected, 0))
                });
            }
        }
        // Every bucket now counts the lap the hand says it may.
        if cfg!(feature = "invariants") {
            for k in 0..self.buckets.len() {
                let w = self.buckets[k][ENTRIES].load(Ordering::Relaxed);
                assert_eq!(lap_of(w), self.expected_lap(k, to.0, to.1), "bucket {k}");
            }
        }
    }

    /// The first bucket that starts at or past `hand + margin`.
    fn first_bucket_from(&self, hand: u32) -> usize {
        let from =
            (u64::from(hand) + u64::from(self.margin_blocks)).max(u64::from(self.start_block));
        let k = (from - u64::from(self.start_block)).div_ceil(u64::from(self.bucket_blocks));
        let k = (k as usize).min(self.buckets.len());
        // Bucket k starts at or past `from`; the one before it, before.
        debug_assert!(k == 0 || self.bucket_start(k - 1) < from);
        debug_assert!(k == self.buckets.len() || self.bucket_start(k) >= from);
        k
    }

    /// Forgets every record (the device's entries left the index).
    pub(crate) fn clear(&self) {
        for amount in self.buckets.iter().flatten() {
            let _ = amount.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                Some(w & !AMOUNT_MASK)
            });
        }
        // Under the writer lock or once the device is out: no add races.
        debug_assert_eq!(self.held(), Held::default());
    }

    /// What is counted now, summed over the buckets.
    pub(crate) fn held(&self) -> Held {
        let mut held = Held::default();
        for bucket in self.buckets.iter() {
            let get = |i: usize| bucket[i].load(Ordering::Relaxed) & AMOUNT_MASK;
            held.entries += get(ENTRIES);
            held.plain_bytes += get(PLAIN);
            held.compressed_bytes += get(COMPRESSED);
        }
        // Every record counted has blocks of its own in the data area.
        debug_assert!(held.entries <= u64::from(self.end_block - self.start_block));
        held
    }

    /// The bound that `l2_asize` exceeded (issue 32): what is counted fits
    /// the data area. O(buckets); under the writer lock (no add runs, so
    /// the sum is not torn upwards), in debug and `invariants` builds.
    pub(crate) fn assert_within_data_area(&self, slot: u8) {
        if cfg!(any(debug_assertions, feature = "invariants")) {
            let held = self.held();
            let capacity = u64::from(self.end_block - self.start_block) * BLOCK_BYTES;
            assert!(
                held.asize_bytes() <= capacity,
                "cache device {slot}: l2_asize {} over its data area of {capacity} bytes",
                held.asize_bytes()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain record of `blocks` blocks at `block` written in `lap`.
    fn at(block: u32, blocks: u16, lap: u32) -> Location {
        Location::new(block, lap, 0, blocks, Compression::Off, 0)
    }

    #[test]
    fn the_hand_writes_off_what_it_overwrites() {
        // 1000 blocks from 256, a margin of 100: 1 block a bucket.
        let space = Space::new(256, 1256, 100, 0, 256);
        // Lap 0: the hand published at 856, then records up to there.
        space.advance((0, 256), (0, 856));
        for b in (256..856).step_by(10) {
            assert!(space.add(at(b, 10, 0)));
        }
        assert_eq!(space.held().entries, 60);
        // Lap 1 starts: the first 100 blocks of lap 0 are overwritten.
        space.advance((0, 856), (1, 266));
        assert_eq!(space.held().entries, 60 - 11);
        // A removal of an overwritten record subtracts nothing; of a held
        // one, its bytes.
        space.remove(at(256, 10, 0));
        assert_eq!(space.held().entries, 49);
        space.remove(at(846, 10, 0));
        assert_eq!(space.held().entries, 48);
        assert_eq!(space.held().plain_bytes, 48 * 10 * BLOCK_BYTES);
        // A record of the new lap counts; one of the old lap behind the
        // range ahead does not.
        assert!(space.add(at(256, 10, 1)));
        assert!(!space.add(at(300, 10, 0)));
        // The next lap: everything of lap 0 is gone.
        space.advance((1, 266), (2, 266));
        assert_eq!(space.held().entries, 0);
    }

    #[test]
    fn removing_a_record_of_another_lap_from_an_empty_bucket_subtracts_nothing() {
        // Lap 0's buckets hold nothing; a stale entry of lap 1 (a device
        // whose hand was reset) is let go: the word is 0, below the
        // amount, and must stay 0 (this overflowed in CI, issue 32).
        let space = Space::new(256, 1256, 100, 0, 256);
        space.remove(at(256, 10, 1));
        space.remove(at(900, 3, 31));
        assert_eq!(space.held(), Held::default());
        assert!(space.add(at(256, 10, 0)));
        space.remove(at(256, 10, 1));
        assert_eq!(space.held().entries, 1);
    }
}
