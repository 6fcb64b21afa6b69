//! The L2ARC as a tier below the ARC (`crate::tier`): what the read path
//! asks of it, and what it does with the records the ARC fills and lets
//! go.
//!
//! Evictions are sorted here, not in the ARC: the eligibility rules
//! (`secondarycache`, `l2arc_noprefetch`, `l2arc_mfuonly`, already on
//! flash) are the L2ARC's policy, and ZFS's `evict_l2_*` counters describe
//! it. What is eligible and not yet on flash goes to the bounded write-back
//! queue (`writeback`), never to the device directly: an eviction must not
//! wait for flash.

use std::ops::Range;
use std::sync::atomic::Ordering;

use super::L2Arc;
use super::writeback::Queued;
use crate::arc::live::Record;
use crate::arc::policy::ListId;
use crate::buf::AlignedBuf;
use crate::tier::{BelowKey, EvictedRecord, Tier};

impl Tier for L2Arc {
    fn read(&self, key: &BelowKey<'_>) -> Option<AlignedBuf> {
        let (key_hash, recordsize_bytes) = (key.hash, key.recordsize_bytes);
        // `record_key_hash` is never 0 (0 marks an empty slot).
        debug_assert_ne!(key_hash, 0);
        let data = L2Arc::read(self, key_hash, recordsize_bytes)?;
        // The device format bounds a record's logical size by what the
        // reader asked for; a longer one would be another record's.
        (data.len() <= recordsize_bytes as usize).then_some(data)
    }

    fn read_piece(
        &self,
        key: &BelowKey<'_>,
        wanted: Range<usize>,
    ) -> Option<(AlignedBuf, Range<usize>, usize)> {
        let (data, range, record_bytes) = self.read_sectors(key.hash, wanted)?;
        assert!(
            range.end <= data.len(),
            "a sector read's range lies in its buffer"
        );
        Some((data, range, record_bytes))
    }

    fn holds(&self, key_hash: u64) -> Option<bool> {
        debug_assert_ne!(key_hash, 0);
        self.sector_table_of(key_hash)
    }

    fn offer_fill(&self, bytes: u64) {
        // One record: at most what one location can hold.
        debug_assert!(
            bytes <= u64::from(super::format::MAX_ASIZE_BLOCKS) * super::format::BLOCK_BYTES
        );
        if self.live.feed_again() {
            self.feed_wake.note_insert(bytes);
        }
    }

    fn offer_primary_fill(&self, key: &BelowKey<'_>, record: &Record, seen_before: bool) {
        // The feeder copies from the ARC's cold ends on its own schedule:
        // a fill is nothing to it but bytes (`offer_fill`).
        debug_assert!(record.data.len() <= key.recordsize_bytes as usize);
        let _ = seen_before;
    }

    fn kstats(&self, out: &mut Vec<(&'static str, u64)>) {
        // The L2ARC's counters are the cache's `l2` stats (per device and
        // summed), not a tier's extra list.
        debug_assert!(out.len() < usize::MAX);
    }

    fn offer_evicted(&self, evicted: &mut dyn Iterator<Item = EvictedRecord>) {
        let (noprefetch, mfuonly) = (self.live.noprefetch(), self.live.mfuonly());
        let counters = &self.evict_counters;
        let takes_writes = self.takes_writes();
        let mut wake = false;
        for EvictedRecord {
            key,
            record,
            from,
            prefetched,
            keeping,
        } in evicted
        {
            let bytes = record.data.len() as u64;
            if bytes == 0 {
                continue;
            }
            let key_hash = keeping.key_hash(&key, record.generation_token);
            if self.contains(key_hash) {
                counters.cached.fetch_add(bytes, Ordering::Relaxed);
                continue;
            }
            let eligible = keeping.below_arc
                && !(prefetched && noprefetch)
                && !(mfuonly && from != ListId::Mfu);
            if !eligible {
                counters.ineligible.fetch_add(bytes, Ordering::Relaxed);
                continue;
            }
            counters.eligible.fetch_add(bytes, Ordering::Relaxed);
            // Evicted from a resident list (a ghost holds no buffer).
            debug_assert!(matches!(from, ListId::Mfu | ListId::Mru));
            match from {
                ListId::Mfu => counters.eligible_mfu.fetch_add(bytes, Ordering::Relaxed),
                _ => counters.eligible_mru.fetch_add(bytes, Ordering::Relaxed),
            };
            let (queued, wake_now) = if takes_writes {
                self.writeback.push(Queued {
                    key,
                    key_hash,
                    record,
                    keeping,
                })
            } else {
                (false, false)
            };
            if queued {
                counters.queued.fetch_add(bytes, Ordering::Relaxed);
            } else {
                counters.skip.fetch_add(bytes, Ordering::Relaxed);
            }
            wake |= wake_now;
        }
        if wake {
            self.feed_wake.wake_now();
        }
    }

    fn drop_record(&self, key_hash: u64) {
        debug_assert_ne!(key_hash, 0);
        self.invalidate(key_hash);
    }

    fn band(&self) -> crate::top_objects::Below {
        // Per device too (the reader notes the slot, `note_l2_device`),
        // for as many slots as there are devices.
        const _: () = assert!(crate::analytics::DEVICE_HISTOGRAMS_MAX <= super::DEVICES_MAX);
        debug_assert!(self.hits.load(Ordering::Relaxed) < u64::MAX);
        crate::top_objects::Below::L2Arc
    }

    fn stop(&self) {
        L2Arc::stop(self);
        debug_assert!(self.stopping.load(Ordering::Relaxed), "feeders see it");
    }
}
