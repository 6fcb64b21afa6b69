//! Sector tables kept in DRAM.
//!
//! A sector read (`reader.rs`) checks the 4 KiB blocks it takes from flash
//! against the record's sector table, which lies on flash after the
//! record: read every time, it is a second device read for each small
//! read, half the device's IOPS. Tables are small (4 bytes per 4 KiB
//! block: 1 KiB for a 1 MiB record), so a fixed set of slots keeps the
//! tables of recently read records, and a small read of one of them takes
//! a single device read.
//!
//! A kept table is trusted no more than a checksum is. A wrong entry (a
//! table damaged on flash) makes the block it covers fail its check: a
//! miss, as it would be with the table read from flash. A slot holds the
//! record's key hash and location, so a table is never applied to another
//! record, nor to the same record written again elsewhere; entries mix in
//! the key and the block's index besides.
//!
//! Bounded: `SECTOR_TABLE_SLOTS` slots of at most 510 entries each
//! (2 KiB), about 2 MiB at most, whatever the size of the L2ARC.

use crate::lock_order::{RankedMutex, rank};
use std::sync::Arc;

/// Slots of [`SectorTables`]: a table per slot, direct-mapped by key hash.
pub(super) const SECTOR_TABLE_SLOTS: usize = 1024;

/// A record's table of checksums, as read from flash with one of its
/// blocks that matched it.
struct Kept {
    key_hash: u64,
    location: u64,
    checksums: Arc<[u8]>,
}

/// Recently used sector tables (see the module comment).
pub(super) struct SectorTables {
    slots: Box<[RankedMutex<Option<Kept>, { rank::LEAF }>]>,
}

impl SectorTables {
    pub(super) fn new() -> Self {
        let tables = Self {
            slots: (0..SECTOR_TABLE_SLOTS)
                .map(|_| RankedMutex::new(None))
                .collect(),
        };
        // `slot` maps the high 32 bits onto the slots: fewer than 2^32.
        debug_assert!(tables.slots.len() == SECTOR_TABLE_SLOTS && SECTOR_TABLE_SLOTS < 1 << 32);
        tables
    }

    fn slot(&self, key_hash: u64) -> &RankedMutex<Option<Kept>, { rank::LEAF }> {
        // The key hash is already uniform; its high bits pick the slot.
        let index = ((key_hash >> 32) as usize * self.slots.len()) >> 32;
        debug_assert!(index < self.slots.len());
        &self.slots[index]
    }

    /// The kept table of the record at `location`, if there is one.
    pub(super) fn get(&self, key_hash: u64, location: u64) -> Option<Arc<[u8]>> {
        let slot = self
            .slot(key_hash)
            .lock()
            .expect("sector table slot poisoned");
        let checksums = slot
            .as_ref()
            .filter(|k| k.key_hash == key_hash && k.location == location)
            .map(|k| Arc::clone(&k.checksums));
        // As kept: at most 510 entries.
        debug_assert!(checksums.as_ref().is_none_or(|c| c.len() <= 4 * 510));
        checksums
    }

    /// Keeps a table (the used part of the table block), replacing
    /// whatever its slot held.
    pub(super) fn keep(&self, key_hash: u64, location: u64, checksums: &[u8]) {
        assert!(checksums.len() <= 4 * 510, "a table of at most 510 entries");
        let kept = Kept {
            key_hash,
            location,
            checksums: Arc::from(checksums),
        };
        *self
            .slot(key_hash)
            .lock()
            .expect("sector table slot poisoned") = Some(kept);
    }

    /// Drops the kept table of a record, if its slot holds it.
    pub(super) fn forget(&self, key_hash: u64) {
        let mut slot = self
            .slot(key_hash)
            .lock()
            .expect("sector table slot poisoned");
        if slot.as_ref().is_some_and(|k| k.key_hash == key_hash) {
            *slot = None;
        }
        debug_assert!(slot.as_ref().is_none_or(|k| k.key_hash != key_hash));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_found_only_for_its_record_and_location() {
        let tables = SectorTables::new();
        tables.keep(7 << 40, 100, &[1, 2, 3, 4]);
        assert_eq!(tables.get(7 << 40, 100).as_deref(), Some(&[1, 2, 3, 4][..]));
        assert!(
            tables.get(7 << 40, 101).is_none(),
            "written again elsewhere"
        );
        // Another record in the same slot (same high bits) replaces it.
        tables.keep((7 << 40) | 1, 5, &[9; 8]);
        assert!(tables.get(7 << 40, 100).is_none());
        assert_eq!(tables.get((7 << 40) | 1, 5).map(|t| t.len()), Some(8));
        tables.forget(7 << 40);
        assert!(
            tables.get((7 << 40) | 1, 5).is_some(),
            "forget leaves others"
        );
        tables.forget((7 << 40) | 1);
        assert!(tables.get((7 << 40) | 1, 5).is_none());
    }
}
