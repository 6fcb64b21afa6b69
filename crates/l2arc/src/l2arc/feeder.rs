//! The feeder: what goes from the ARC to flash, and when.
//!
//! No eviction path writes to flash (a slow device must never stall a
//! reader). Instead a feeder thread wakes, scans the eviction ends of the
//! ARC lists (MFU first, then MRU) a few write sizes deep
//! (`l2arc_headroom`), and copies the eligible records to the next device
//! in one batch. Eligible is a policy, never an accident: not already on
//! flash, not only read ahead when `l2arc_noprefetch`, not MRU when
//! `l2arc_mfuonly`, and the dataset's `secondarycache` allows it.
//!
//! Pacing. While a feed fills its whole budget the feeder goes again at
//! once; while it finds some work it waits `l2arc_feed_min_ms`; when it
//! finds none, `l2arc_feed_secs`. The budget is the device's batch size,
//! capped by `l2arc_write_max` and by the endurance budget (`l2arc_dwpd`),
//! never by a small fixed rate, so the cache warms as fast as misses come.
//!
//! Eviction pressure cuts any wait short (`FeedWake`): once the ARC has
//! taken in a quarter of itself (at most half a batch) since the last feed,
//! records that were new at that feed are nearing the cold end, and a timer
//! would let them fall out of DRAM before they reach flash. ZFS's feeder
//! wakes on its timer alone, which is why what the ARC evicts between
//! wake-ups is lost to its L2ARC.
//!
//! Races with writes. The selected records are copied and released before
//! the slow device write (a record a feed holds cannot be evicted). A write
//! through the cache may make a copied record stale while the batch is in
//! flight; [`StaleWriteGate`] leaves such records out of the index, deciding
//! under the lock that writes hold while they drop their records.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use super::FeedRecord;
use super::WriteGate;
use super::format::Compression;
use crate::arc::live::RecordKey;
use crate::arc::policy::ListId;
use crate::hash::{FastBuildHasher, hash_one};
use crate::read_path::{Cache, CacheMode, Dataset, FeedOutcome, l2_key_hash};

/// Wakes the feeder early when the ARC has taken in enough new bytes that
/// its cold end is moving toward records not yet on flash.
pub(crate) struct FeedWake {
    inserted_bytes: AtomicU64,
    threshold_bytes: u64,
    woken: Mutex<bool>,
    wake: Condvar,
}

impl FeedWake {
    /// Wakes after `threshold_bytes` inserted since the last feed.
    pub(crate) fn new(threshold_bytes: u64) -> Self {
        assert!(threshold_bytes > 0);
        Self {
            inserted_bytes: AtomicU64::new(0),
            threshold_bytes,
            woken: Mutex::new(false),
            wake: Condvar::new(),
        }
    }

    /// The ARC took in `bytes` of new records. Cheap: one atomic add, and a
    /// notification only on crossing the threshold.
    pub(crate) fn note_insert(&self, bytes: u64) {
        let before = self.inserted_bytes.fetch_add(bytes, Ordering::Relaxed);
        if before < self.threshold_bytes && before + bytes >= self.threshold_bytes {
            *self.woken.lock().expect("feed wake poisoned") = true;
            self.wake.notify_one();
        }
    }

    /// Waits `pause` at most, less if woken; then starts counting anew.
    /// True if it was woken by eviction pressure.
    fn wait(&self, pause: Duration) -> bool {
        let mut woken = self.woken.lock().expect("feed wake poisoned");
        if !*woken && !pause.is_zero() {
            woken = self
                .wake
                .wait_timeout(woken, pause)
                .expect("feed wake poisoned")
                .0;
        }
        let was_woken = *woken;
        *woken = false;
        self.inserted_bytes.store(0, Ordering::Relaxed);
        was_woken
    }
}

/// A record chosen for the next batch: its L2 identity, its ARC key (for
/// the stale-write check) and its bytes, copied out of the ARC.
struct Selected {
    key_hash: u64,
    key: RecordKey,
    data: Vec<u8>,
    compression: Compression,
}

/// Leaves out of the index the records of objects written since the feed
/// began (see the module comment and [`WriteGate`] for the lock order).
struct StaleWriteGate<'a> {
    cache: &'a Cache,
    /// Invalidation sequence when the feed chose its records.
    start_sequence: u64,
    keys: &'a [RecordKey],
}

impl WriteGate for StaleWriteGate<'_> {
    fn admit(&mut self, records: usize, index: &mut dyn FnMut(&[bool])) {
        assert!(records <= self.keys.len());
        let invalidations = self
            .cache
            .invalidations
            .lock()
            .expect("invalidations poisoned");
        // The log is bounded: if it no longer reaches back to our start,
        // any record may have been written; index none of them.
        let lost_track = invalidations
            .recent
            .front()
            .is_some_and(|&(sequence, _)| sequence > self.start_sequence + 1);
        let written: std::collections::HashSet<u64, FastBuildHasher> = invalidations
            .recent
            .iter()
            .filter(|&&(sequence, _)| sequence > self.start_sequence)
            .map(|&(_, object_hash)| object_hash)
            .collect();
        let keep: Vec<bool> = self.keys[..records]
            .iter()
            .map(|key| !(lost_track || written.contains(&hash_one(&(key.dataset, key.object)))))
            .collect();
        index(&keep);
    }
}

impl Cache {
    /// One pass of the L2ARC feeder: copy eligible records from the cold
    /// ends of the ARC (MFU first, then MRU) to the next cache device.
    pub fn feed_l2arc(&self) -> FeedOutcome {
        let Some(l2) = self.l2.get() else {
            return FeedOutcome::default();
        };
        let budget_bytes = l2.feed_budget_bytes();
        if budget_bytes == 0 {
            return FeedOutcome::default();
        }
        let start_sequence = self
            .invalidations
            .lock()
            .expect("invalidations poisoned")
            .sequence;
        let selected = self.select_for_feed(budget_bytes);
        let batch_bytes: u64 = selected.iter().map(|s| s.data.len() as u64).sum();
        let batch: Vec<FeedRecord<'_>> = selected
            .iter()
            .map(|s| FeedRecord {
                key_hash: s.key_hash,
                data: &s.data,
                compression: s.compression,
            })
            .collect();
        let keys: Vec<RecordKey> = selected.iter().map(|s| s.key).collect();
        let mut gate = StaleWriteGate {
            cache: self,
            start_sequence,
            keys: &keys,
        };
        let (bytes, records) = match l2.write_batch_gated(&batch, &mut gate) {
            Ok(written) => written,
            Err(_) => return FeedOutcome::default(),
        };
        assert!(records <= batch.len());
        FeedOutcome {
            records,
            bytes,
            full: batch_bytes >= budget_bytes && records == batch.len(),
        }
    }

    /// The eligible records at the ARC's cold ends, up to `budget_bytes`,
    /// copied out so that the ARC may evict them while the batch is written.
    fn select_for_feed(&self, budget_bytes: u64) -> Vec<Selected> {
        let l2 = self.l2.get().expect("feeding needs an L2ARC");
        let config = l2.config();
        let scan_bytes = budget_bytes.saturating_mul(u64::from(config.l2arc_headroom.max(1)));
        let per_shard = scan_bytes.div_ceil(self.config.arc_shards as u64).max(1);
        let mut candidates = Vec::new();
        self.arc
            .feed_candidates(ListId::Mfu, per_shard, &mut candidates);
        if !config.l2arc_mfuonly {
            self.arc
                .feed_candidates(ListId::Mru, per_shard, &mut candidates);
        }
        let datasets: Vec<Arc<Dataset>> =
            self.datasets.read().expect("dataset lock poisoned").clone();
        let mut selected = Vec::new();
        let mut batch_bytes = 0u64;
        for (key, record, prefetched) in candidates {
            if (prefetched && config.l2arc_noprefetch) || record.data.is_empty() {
                continue;
            }
            let Some(dataset) = datasets.get(key.dataset as usize) else {
                continue;
            };
            if dataset.props.secondarycache() == CacheMode::None {
                continue;
            }
            let key_hash =
                l2_key_hash(dataset.uid, key.object, key.record, record.generation_token);
            if l2.contains(key_hash) {
                continue;
            }
            batch_bytes += record.data.len() as u64;
            // Copied now and the buffer let go: a record a feed holds
            // cannot be evicted, and the device write is slow.
            selected.push(Selected {
                key_hash,
                key,
                data: record.data.to_vec(),
                compression: dataset.props.compression(),
            });
            if batch_bytes >= budget_bytes {
                break;
            }
        }
        selected
    }
}

/// The feeder thread: feeds while there is work, sleeps when there is none,
/// and ends with the cache.
pub(crate) fn feeder_loop(cache: Weak<Cache>, wake: Arc<FeedWake>) {
    let mut pause = Duration::from_millis(10);
    loop {
        let woken = wake.wait(pause);
        let Some(cache) = cache.upgrade() else {
            return;
        };
        let Some(l2) = cache.l2.get() else {
            return;
        };
        if woken {
            l2.feed_wakeups.fetch_add(1, Ordering::Relaxed);
        }
        let config = l2.config().clone();
        let outcome = cache.feed_l2arc();
        drop(cache);
        pause = if outcome.full && config.l2arc_feed_again {
            Duration::ZERO
        } else if outcome.records > 0 {
            Duration::from_millis(config.l2arc_feed_min_ms)
        } else {
            Duration::from_secs_f64(config.l2arc_feed_secs.clamp(0.001, 3600.0))
        };
    }
}
