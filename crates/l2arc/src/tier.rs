//! The tiers below the ARC, and what they may ask of the ARC above them.
//!
//! Why an interface. Every read passes the ARC; below it a record may be
//! kept on local flash (the L2ARC), in a tier a fleet shares, or nowhere.
//! The read path should not care which: on a miss it asks the tiers in
//! order for the record and takes the first intact copy; it tells them
//! what the ARC filled and what it let go (each tier decides what to keep),
//! and which records a write made stale. So a new tier is a new
//! implementation of [`Tier`], not a new branch in the read path.
//!
//! Why a way up. A tier that copies records out of DRAM on its own
//! schedule (the L2ARC's feeder, which must never stall an eviction) needs
//! the ARC's cold records and the rule that keeps out what a write made
//! stale while a copy was in flight. It gets both through [`FeedSource`],
//! never through the cache itself: the flash tier compiles and is tested
//! without the read path that uses it, as foyer's storage engine knows
//! nothing of its hybrid cache.
//!
//! Identity. Every tier names a record by one 64-bit hash of (dataset
//! identity, object, record, generation token): [`record_key_hash`]. A
//! record cached under an older generation of its object has another hash,
//! so no tier can hand it out for the current one; the hash is never 0, so
//! 0 can mark an empty slot. [`RecordKey`] (dataset slot, object, record)
//! is the ARC's own name, which tiers see only to match a write's
//! invalidations. A tier a fleet shares cannot use either: the hash and
//! the dataset slot mean something on one node only. So a read below the
//! ARC passes a [`BelowKey`]: the hash, and what a fleet-stable name is
//! made of (the object as its primary names it, the version the record is
//! read under, the record's index, size and compression), each built only
//! by a tier that asks for it (the version costs a lock).

use std::ops::Range;
use std::sync::Arc;

use crate::arc::live::{Record, RecordKey};
use crate::arc::policy::ListId;
use crate::buf::AlignedBuf;
use crate::hash::hash_one;
use crate::l2arc::format::Compression;
use crate::primary::{Generation, PrimaryObject};

/// Most tiers below the ARC: the L2ARC, a shared tier, one more.
pub(crate) const TIERS_MAX: usize = 4;

/// The identity of a record below the ARC (see the module comment).
pub(crate) fn record_key_hash(dataset_uid: u64, object: u64, record: u64, token: u64) -> u64 {
    let key_hash = hash_one(&(dataset_uid, object, record, token)).max(1);
    debug_assert_ne!(key_hash, 0);
    key_hash
}

/// How a record's dataset wants it kept below the ARC.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Keeping {
    /// The dataset's stable identity (name and primary storage).
    pub(crate) dataset_uid: u64,
    /// `secondarycache=all`: tiers below the ARC may keep its records.
    pub(crate) below_arc: bool,
    /// How to store it (`compression`).
    pub(crate) compression: Compression,
    /// Plain records at least this long get a sector table on flash.
    pub(crate) sector_table_min_bytes: u32,
}

impl Keeping {
    /// The identity below the ARC of the record `key` read under `token`.
    pub(crate) fn key_hash(&self, key: &RecordKey, token: u64) -> u64 {
        // Checked when the dataset was added: a table covers 64 KiB or more.
        debug_assert!(
            self.sector_table_min_bytes as usize
                >= crate::l2arc::format::SECTOR_TABLE_RECORD_BYTES_FLOOR
        );
        record_key_hash(self.dataset_uid, key.object, key.record, token)
    }
}

/// A record as the tiers below the ARC name it (see the module comment).
pub(crate) struct BelowKey<'a> {
    /// The node-local identity (`record_key_hash`): the L2ARC's key.
    pub(crate) hash: u64,
    /// The object, which knows its identity beyond this node, if any
    /// (`PrimaryObject::source_identity`).
    pub(crate) object: &'a dyn PrimaryObject,
    /// The version the record is read under, if the object's token still
    /// stands for it (called only by a tier that needs it: a lock).
    pub(crate) generation: &'a dyn Fn() -> Option<Generation>,
    /// The record's index in the object.
    pub(crate) index: u64,
    /// The dataset's recordsize: the record holds at most this.
    pub(crate) recordsize_bytes: u32,
    /// The dataset's `compression`.
    pub(crate) compression: Compression,
}

/// A record the ARC let go, offered to the tiers below.
#[derive(Clone)]
pub(crate) struct EvictedRecord {
    pub(crate) key: RecordKey,
    pub(crate) record: Arc<Record>,
    /// The ARC list it left from.
    pub(crate) from: ListId,
    /// Only ever read ahead, never asked for.
    pub(crate) prefetched: bool,
    pub(crate) keeping: Keeping,
}

/// A record at a cold end of the ARC, as a feed sees it: held weakly, so
/// that the ARC may still evict it while the feed looks at others.
pub(crate) struct ColdRecord {
    pub(crate) key: RecordKey,
    pub(crate) record: std::sync::Weak<Record>,
    pub(crate) prefetched: bool,
    pub(crate) keeping: Keeping,
}

/// A tier below the ARC. Every method is a best effort: a tier that fails
/// answers a miss, and the read goes on to the next tier or to primary
/// storage; it never returns bytes it did not verify.
pub(crate) trait Tier: Send + Sync {
    /// The whole record, if the tier holds an intact copy of at most
    /// `key.recordsize_bytes` (a miss or any failure: `None`).
    fn read(&self, key: &BelowKey<'_>) -> Option<AlignedBuf>;

    /// Several records at once (a read-ahead's span): fills the `None`
    /// slots of `out` (one per key) that it holds intact. The default
    /// reads them one by one; a tier whose reads are round trips (the
    /// shared tier) has them in flight together.
    fn read_many(&self, keys: &[BelowKey<'_>], out: &mut [Option<AlignedBuf>]) {
        debug_assert_eq!(keys.len(), out.len());
        for (key, slot) in keys.iter().zip(out.iter_mut()) {
            if slot.is_none() {
                *slot = self.read(key);
            }
        }
    }

    /// Bytes `wanted` of the record without reading it whole, if the tier
    /// can: a buffer, the range of it that holds them (cut at the
    /// record's end), and the record's length.
    fn read_piece(
        &self,
        key: &BelowKey<'_>,
        wanted: Range<usize>,
    ) -> Option<(AlignedBuf, Range<usize>, usize)>;

    /// Whether the tier may hold the record (no I/O): `Some(true)` when it
    /// holds it in pieces that are worth reading alone (`read_piece`).
    fn holds(&self, key_hash: u64) -> Option<bool>;

    /// The ARC filled a record of `bytes` (from a tier or from primary).
    fn offer_fill(&self, bytes: u64);

    /// The ARC filled `record` from primary storage (not from a tier):
    /// `seen_before` when its insert was a ghost hit (the ARC saw it
    /// before and let it go). A tier that keeps what primary storage
    /// costs (the shared tier) copies it from here; one that copies from
    /// DRAM on its own schedule (the L2ARC) ignores it. Never blocks.
    fn offer_primary_fill(&self, key: &BelowKey<'_>, record: &Record, seen_before: bool);

    /// The tier's own counters, as (kstat name, value), appended to `out`.
    fn kstats(&self, out: &mut Vec<(&'static str, u64)>);

    /// The analytics band its hits are counted in (`crate::analytics`):
    /// each kind of tier has its own latency heat map.
    fn band(&self) -> crate::top_objects::Below;

    /// Records the ARC let go, in the order it let them go.
    fn offer_evicted(&self, evicted: &mut dyn Iterator<Item = EvictedRecord>);

    /// A write made the record stale: the tier must never return it again.
    fn drop_record(&self, key_hash: u64);

    /// The cache is going away: end background work.
    fn stop(&self);
}

/// What a tier that copies records out of DRAM by itself may ask of the
/// ARC above it (see the module comment).
pub(crate) trait FeedSource: Send + Sync {
    /// Records at the ARC's cold ends, MFU first, then MRU unless
    /// `mfu_only`: about `scan_bytes_per_shard` deep in each shard.
    fn cold_records(&self, scan_bytes_per_shard: u64, mfu_only: bool, out: &mut Vec<ColdRecord>);

    /// Every resident record of the ARC, hottest first: the MFU list,
    /// then the MRU list unless `mfu_only`, each from its most recently
    /// used end (the stop flush's order: what a restart most wants back).
    fn resident_records(&self, mfu_only: bool, out: &mut Vec<ColdRecord>);

    /// Shards of the ARC (the scan's depth is per shard).
    fn arc_shards(&self) -> usize;

    /// The sequence number of the latest write through the cache: bytes
    /// copied now are known good at it.
    fn write_sequence(&self) -> u64;

    /// Under the lock that writes hold while they drop records, calls
    /// `index` once with one flag per record of `keys[..records]`: true
    /// when no write since `since[i]` touched `keys[i]` (and the log still
    /// reaches back that far). Whatever `index` indexes is then safe: a
    /// later write will find it and drop it.
    fn admit_unwritten(
        &self,
        keys: &[RecordKey],
        since: &[u64],
        records: usize,
        index: &mut dyn FnMut(&[bool]),
    );
}

/// A record a tier is offered or hands up is at most what one location
/// on flash holds (511 blocks), and a recordsize is at most 1 MiB.
const RECORD_BYTES_MAX: u64 =
    crate::l2arc::format::MAX_ASIZE_BLOCKS as u64 * crate::l2arc::format::BLOCK_BYTES;
const _: () = assert!(
    RECORD_BYTES_MAX >= 1 << 20,
    "a location holds a 1 MiB record"
);
const _: () = assert!(TIERS_MAX >= 1 && TIERS_MAX <= u8::MAX as usize);

/// The contracts of [`Tier`], checked on both sides of the call: the read
/// path calls tiers through these, so that every tier, whatever its kind,
/// is held to them.
impl dyn Tier + '_ {
    /// [`Tier::read`]: at most `recordsize_bytes`.
    pub(crate) fn checked_read(&self, key: &BelowKey<'_>) -> Option<AlignedBuf> {
        debug_assert_ne!(key.hash, 0, "0 marks an empty slot");
        debug_assert!(key.recordsize_bytes.is_power_of_two());
        let data = self.read(key);
        // (The read path's hot side: the caller asserts it once more.)
        debug_assert!(
            data.as_ref()
                .is_none_or(|data| data.len() <= key.recordsize_bytes as usize),
            "a tier returns at most a record"
        );
        data
    }

    /// [`Tier::read_many`]: a slot per key, filled ones kept, each at most
    /// a record.
    pub(crate) fn checked_read_many(&self, keys: &[BelowKey<'_>], out: &mut [Option<AlignedBuf>]) {
        assert_eq!(keys.len(), out.len(), "a slot per key");
        let filled_before = out.iter().filter(|s| s.is_some()).count();
        self.read_many(keys, out);
        debug_assert!(out.iter().filter(|s| s.is_some()).count() >= filled_before);
        debug_assert!(
            keys.iter().zip(out.iter()).all(|(k, s)| s
                .as_ref()
                .is_none_or(|d| d.len() <= k.recordsize_bytes as usize)),
            "a tier returns at most a record"
        );
    }

    /// [`Tier::offer_primary_fill`]: one record, of at most its size.
    pub(crate) fn checked_offer_primary_fill(
        &self,
        key: &BelowKey<'_>,
        record: &Record,
        seen_before: bool,
    ) {
        debug_assert!(record.data.len() <= key.recordsize_bytes as usize);
        debug_assert_ne!(key.hash, 0, "0 marks an empty slot");
        self.offer_primary_fill(key, record, seen_before);
    }

    /// [`Tier::read_piece`]: a range of the buffer, no longer than wanted,
    /// within the record.
    pub(crate) fn checked_read_piece(
        &self,
        key: &BelowKey<'_>,
        wanted: Range<usize>,
    ) -> Option<(AlignedBuf, Range<usize>, usize)> {
        debug_assert!(key.hash != 0 && wanted.start <= wanted.end);
        let piece = self.read_piece(key, wanted.clone());
        if let Some((data, range, record_bytes)) = &piece {
            debug_assert!(
                range.start <= range.end && range.end <= data.len(),
                "a piece lies within its buffer"
            );
            debug_assert!(
                range.len() <= wanted.len() && range.len() <= *record_bytes,
                "a piece is no more than wanted, within its record"
            );
        }
        piece
    }

    /// [`Tier::holds`] (no I/O).
    pub(crate) fn checked_holds(&self, key_hash: u64) -> Option<bool> {
        debug_assert_ne!(key_hash, 0, "0 marks an empty slot");
        self.holds(key_hash)
    }

    /// [`Tier::offer_fill`]: one record's bytes.
    pub(crate) fn checked_offer_fill(&self, bytes: u64) {
        debug_assert!(bytes <= RECORD_BYTES_MAX, "one record");
        self.offer_fill(bytes);
    }

    /// [`Tier::offer_evicted`]: records that left a resident list, each
    /// kept as a checked dataset wants.
    pub(crate) fn checked_offer_evicted(&self, evicted: &mut dyn Iterator<Item = EvictedRecord>) {
        let mut checked = evicted.inspect(|e| {
            debug_assert!(matches!(e.from, ListId::Mru | ListId::Mfu));
            debug_assert!(e.record.data.len() as u64 <= RECORD_BYTES_MAX);
        });
        self.offer_evicted(&mut checked);
    }

    /// [`Tier::band`]: a tier's, never primary storage's.
    pub(crate) fn checked_band(&self) -> crate::top_objects::Below {
        let band = self.band();
        debug_assert_ne!(
            band,
            crate::top_objects::Below::Primary,
            "a tier is no primary"
        );
        band
    }

    /// [`Tier::drop_record`].
    pub(crate) fn checked_drop_record(&self, key_hash: u64) {
        debug_assert_ne!(key_hash, 0, "0 marks an empty slot");
        self.drop_record(key_hash);
    }
}

/// The contracts of [`FeedSource`], checked where a feed calls it.
impl dyn FeedSource + '_ {
    /// [`FeedSource::cold_records`]: appends (never removes), each record
    /// kept as a checked dataset wants.
    pub(crate) fn checked_cold_records(
        &self,
        scan_bytes_per_shard: u64,
        mfu_only: bool,
        out: &mut Vec<ColdRecord>,
    ) {
        debug_assert!(scan_bytes_per_shard > 0);
        let before = out.len();
        self.cold_records(scan_bytes_per_shard, mfu_only, out);
        debug_assert!(out.len() >= before);
        debug_assert!(out[before..].iter().all(|c| {
            c.keeping.sector_table_min_bytes as usize
                >= crate::l2arc::format::SECTOR_TABLE_RECORD_BYTES_FLOOR
        }));
    }

    /// [`FeedSource::resident_records`]: appends (never removes), each
    /// record kept as a checked dataset wants.
    pub(crate) fn checked_resident_records(&self, mfu_only: bool, out: &mut Vec<ColdRecord>) {
        let before = out.len();
        self.resident_records(mfu_only, out);
        debug_assert!(out.len() >= before);
        debug_assert!(out[before..].iter().all(|c| {
            c.keeping.sector_table_min_bytes as usize
                >= crate::l2arc::format::SECTOR_TABLE_RECORD_BYTES_FLOOR
        }));
    }

    /// [`FeedSource::arc_shards`]: 1 to 1024, as `Cache::new` checks.
    pub(crate) fn checked_arc_shards(&self) -> usize {
        let shards = self.arc_shards();
        assert!((1..=1024).contains(&shards), "an ARC of 1 to 1024 shards");
        shards
    }

    /// [`FeedSource::admit_unwritten`]: `index` is called exactly once,
    /// with one flag per record.
    pub(crate) fn checked_admit_unwritten(
        &self,
        keys: &[RecordKey],
        since: &[u64],
        records: usize,
        index: &mut dyn FnMut(&[bool]),
    ) {
        assert!(records <= keys.len() && keys.len() == since.len());
        let mut calls = 0usize;
        self.admit_unwritten(keys, since, records, &mut |flags: &[bool]| {
            assert_eq!(flags.len(), records, "a flag per record");
            calls += 1;
            index(flags);
        });
        assert_eq!(calls, 1, "indexed exactly once, under the lock");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_key_hash_is_never_zero_and_tells_generations_apart() {
        for token in 0..1000u64 {
            let a = record_key_hash(7, 1, 2, token);
            let b = record_key_hash(7, 1, 2, token + 1);
            assert_ne!(a, 0);
            assert_ne!(a, b);
        }
        assert_ne!(record_key_hash(1, 2, 3, 4), record_key_hash(2, 2, 3, 4));
    }
}
