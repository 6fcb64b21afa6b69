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
//! One feeder per device. Each cache device has its own feeder thread
//! (as OpenZFS has had since 2026), which fills batches for that device
//! alone: devices are written side by side, a slow or faulted one holds
//! back no other, and the write rate grows with the devices. The feeders
//! share the ARC's cold ends and the write-back queue; a record one of
//! them has chosen is claimed (`L2Arc::feeding`) until it is indexed or
//! given up, so no two write it. The scan reaches `l2arc_headroom` batches
//! deep, so a second feeder finds the next batch behind the first's claims.
//!
//! Races with writes. The selected records are copied and released before
//! the slow device write (a record a feed holds cannot be evicted). A write
//! through the cache may make a copied record stale while the batch is in
//! flight; [`StaleWriteGate`] leaves such records out of the index, deciding
//! under the lock that writes hold while they drop their records.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use super::cache_device::CacheDevice;
use super::format::Compression;
use super::{FeedRecord, L2Arc, WriteGate};
use crate::arc::live::RecordKey;
use crate::arc::policy::ListId;
use crate::hash::{FastBuildHasher, hash_one};
use crate::read_path::{Cache, CacheMode, Dataset, FeedOutcome, Invalidation, l2_key_hash};

/// Wakes the feeder early when the ARC has taken in enough new bytes that
/// its cold end is moving toward records not yet on flash.
pub(crate) struct FeedWake {
    inserted_bytes: AtomicU64,
    threshold_bytes: u64,
    /// Wake-ups so far: each feeder waits for it to pass the count it saw.
    wakeups: Mutex<u64>,
    wake: Condvar,
}

impl FeedWake {
    /// Wakes after `threshold_bytes` inserted since the last feed.
    pub(crate) fn new(threshold_bytes: u64) -> Self {
        assert!(threshold_bytes > 0);
        Self {
            inserted_bytes: AtomicU64::new(0),
            threshold_bytes,
            wakeups: Mutex::new(0),
            wake: Condvar::new(),
        }
    }

    /// The ARC took in `bytes` of new records. Cheap: one atomic add, and a
    /// notification only on crossing the threshold.
    pub(crate) fn note_insert(&self, bytes: u64) {
        let before = self.inserted_bytes.fetch_add(bytes, Ordering::Relaxed);
        if before < self.threshold_bytes && before + bytes >= self.threshold_bytes {
            self.wake_now();
        }
    }

    /// Wakes every feeder at once (the write-back queue has work).
    pub(crate) fn wake_now(&self) {
        *self.wakeups.lock().expect("feed wake poisoned") += 1;
        self.wake.notify_all();
    }

    /// Waits `pause` at most, less if woken since `seen` (updated); then
    /// starts counting anew. True if it was woken by eviction pressure.
    fn wait(&self, pause: Duration, seen: &mut u64) -> bool {
        let mut wakeups = self.wakeups.lock().expect("feed wake poisoned");
        if *wakeups == *seen && !pause.is_zero() {
            wakeups = self
                .wake
                .wait_timeout(wakeups, pause)
                .expect("feed wake poisoned")
                .0;
        }
        let was_woken = *wakeups != *seen;
        *seen = *wakeups;
        self.inserted_bytes.store(0, Ordering::Relaxed);
        was_woken
    }
}

/// The records a feed has claimed (`L2Arc::feeding`), released when the
/// feed ends, however it ends.
struct FeedClaims<'a> {
    l2: &'a L2Arc,
    key_hashes: Vec<u64>,
}

impl FeedClaims<'_> {
    /// Claims `key_hash` for this feed unless it is on flash already or
    /// another feed has it.
    fn claim(&mut self, key_hash: u64) -> bool {
        if self.l2.contains(key_hash) {
            return false;
        }
        let claimed = self
            .l2
            .feeding
            .lock()
            .expect("feed claims poisoned")
            .insert(key_hash);
        if claimed {
            self.key_hashes.push(key_hash);
        }
        claimed
    }
}

impl FeedClaims<'_> {
    /// Gives up this feed's claims on `key_hashes` before it ends (and
    /// forgets them, so that the end does not drop another feed's claims).
    fn release(&mut self, key_hashes: impl Iterator<Item = u64>) {
        let mut feeding = self.l2.feeding.lock().expect("feed claims poisoned");
        for key_hash in key_hashes {
            if let Some(at) = self.key_hashes.iter().position(|&k| k == key_hash) {
                self.key_hashes.swap_remove(at);
                feeding.remove(&key_hash);
            }
        }
    }
}

impl Drop for FeedClaims<'_> {
    fn drop(&mut self) {
        let mut feeding = self.l2.feeding.lock().expect("feed claims poisoned");
        for key_hash in &self.key_hashes {
            feeding.remove(key_hash);
        }
    }
}

/// A record chosen for the next batch: its L2 identity, its ARC key (for
/// the stale-write check) and its bytes: copied out of the ARC, or the
/// evicted record's own buffer from the write-back queue.
struct Selected {
    key_hash: u64,
    key: RecordKey,
    data: SelectedBytes,
    compression: Compression,
    sector_table_min_bytes: u32,
}

enum SelectedBytes {
    Copied(Vec<u8>),
    Evicted(Arc<crate::arc::live::Record>),
}

impl SelectedBytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            SelectedBytes::Copied(bytes) => bytes,
            SelectedBytes::Evicted(record) => &record.data,
        }
    }
}

/// Leaves out of the index the records that a write may have changed since
/// their bytes were taken (see the module comment and [`WriteGate`] for the
/// lock order): for a record copied from the ARC, writes since the feed
/// began; for an evicted record from the write-back queue, writes since it
/// was read (`Record::fill_sequence`).
struct StaleWriteGate<'a> {
    cache: &'a Cache,
    keys: &'a [RecordKey],
    /// Per record: the invalidation sequence its bytes are known good at.
    since: &'a [u64],
}

impl WriteGate for StaleWriteGate<'_> {
    fn admit(&mut self, records: usize, index: &mut dyn FnMut(&[bool])) {
        assert!(records <= self.keys.len() && self.keys.len() == self.since.len());
        let invalidations = self
            .cache
            .invalidations
            .lock()
            .expect("invalidations poisoned");
        // The log is bounded: a record older than its oldest entry may have
        // been written without a trace; index none of those.
        let oldest_logged = invalidations.recent.front().map(|i| i.sequence);
        let since_min = self.since[..records].iter().copied().min().unwrap_or(0);
        let mut written: std::collections::HashMap<u64, Vec<Invalidation>, FastBuildHasher> =
            std::collections::HashMap::default();
        for invalidation in invalidations
            .recent
            .iter()
            .filter(|i| i.sequence > since_min)
        {
            written
                .entry(invalidation.object_hash)
                .or_default()
                .push(*invalidation);
        }
        let keep: Vec<bool> = self.keys[..records]
            .iter()
            .zip(self.since)
            .map(|(key, &since)| {
                let lost_track = oldest_logged.is_some_and(|oldest| oldest > since + 1);
                let touched = written
                    .get(&hash_one(&(key.dataset, key.object)))
                    .is_some_and(|list| {
                        list.iter().any(|i| {
                            i.sequence > since && (i.records.0..=i.records.1).contains(&key.record)
                        })
                    });
                !(lost_track || touched)
            })
            .collect();
        index(&keep);
    }
}

impl Cache {
    /// One pass of the L2ARC feeder: copy eligible records from the cold
    /// ends of the ARC (MFU first, then MRU) to the next cache device of
    /// the rotor. (Each device's own feeder thread feeds it alone.)
    pub fn feed_l2arc(&self) -> FeedOutcome {
        self.feed_to(None)
    }

    /// One feed: a batch for `device` alone (its own feeder's), or for
    /// the rotor's next device.
    fn feed_to(&self, device: Option<&CacheDevice>) -> FeedOutcome {
        let Some(l2) = self.l2.get() else {
            return FeedOutcome::default();
        };
        let budget_bytes = match device {
            Some(device) => l2.feed_budget_bytes_for(device),
            None => l2.feed_budget_bytes(),
        };
        if budget_bytes == 0 {
            return FeedOutcome::default();
        }
        let start_sequence = self
            .invalidations
            .lock()
            .expect("invalidations poisoned")
            .sequence;
        let mut claims = FeedClaims {
            l2,
            key_hashes: Vec::new(),
        };
        let selected = self.select_for_feed(budget_bytes, &mut claims);
        let since: Vec<u64> = selected
            .iter()
            .map(|s| match &s.data {
                SelectedBytes::Copied(_) => start_sequence,
                SelectedBytes::Evicted(record) => record.fill_sequence,
            })
            .collect();
        let batch_bytes: u64 = selected
            .iter()
            .map(|s| s.data.as_slice().len() as u64)
            .sum();
        let batch: Vec<FeedRecord<'_>> = selected
            .iter()
            .map(|s| FeedRecord {
                key_hash: s.key_hash,
                data: s.data.as_slice(),
                compression: s.compression,
                sector_table_min_bytes: s.sector_table_min_bytes,
            })
            .collect();
        let keys: Vec<RecordKey> = selected.iter().map(|s| s.key).collect();
        let mut gate = StaleWriteGate {
            cache: self,
            keys: &keys,
            since: &since,
        };
        let written = match device {
            Some(device) => l2.write_batch_gated_to(device, &batch, &mut gate),
            None => l2.write_batch_gated(&batch, &mut gate),
        };
        let Ok((bytes, records)) = written else {
            return FeedOutcome::default();
        };
        assert!(records <= batch.len());
        let left_out = records < batch.len();
        drop(batch);
        if left_out {
            requeue_left_out(l2, selected, records, &mut claims);
        }
        FeedOutcome {
            records,
            bytes,
            full: left_out || batch_bytes >= budget_bytes,
        }
    }

    /// Evicted records from the write-back queue first (oldest first),
    /// then the eligible records at the ARC's cold ends, up to
    /// `budget_bytes`; the latter copied out so that the ARC may evict them
    /// while the batch is written.
    fn select_for_feed(&self, budget_bytes: u64, claims: &mut FeedClaims<'_>) -> Vec<Selected> {
        let l2 = self.l2.get().expect("feeding needs an L2ARC");
        let config = l2.config();
        let datasets: Vec<Arc<Dataset>> =
            self.datasets.read().expect("dataset lock poisoned").clone();
        let mut selected = Vec::new();
        let mut batch_bytes = 0u64;
        let mut queued = Vec::new();
        l2.writeback.take(budget_bytes, &mut queued);
        for q in queued {
            if !claims.claim(q.key_hash) {
                continue;
            }
            let Some(dataset) = datasets.get(q.key.dataset as usize) else {
                continue;
            };
            batch_bytes += q.record.data.len() as u64;
            selected.push(Selected {
                key_hash: q.key_hash,
                key: q.key,
                data: SelectedBytes::Evicted(q.record),
                compression: dataset.props.compression(),
                sector_table_min_bytes: dataset.config.sector_table_min_bytes,
            });
        }
        if batch_bytes >= budget_bytes {
            return selected;
        }
        let scan_bytes = budget_bytes.saturating_mul(u64::from(config.l2arc_headroom.max(1)));
        let per_shard = scan_bytes.div_ceil(self.config.arc_shards as u64).max(1);
        let mut candidates = Vec::new();
        self.arc
            .feed_candidates(ListId::Mfu, per_shard, &mut candidates);
        if !config.l2arc_mfuonly {
            self.arc
                .feed_candidates(ListId::Mru, per_shard, &mut candidates);
        }
        for (key, record, prefetched) in candidates {
            // One record held at a time, only while it is copied.
            let Some(record) = record.upgrade() else {
                continue; // evicted meanwhile
            };
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
            if !claims.claim(key_hash) {
                continue;
            }
            batch_bytes += record.data.len() as u64;
            // Copied now and the buffer let go: a record a feed holds
            // cannot be evicted, and the device write is slow.
            selected.push(Selected {
                key_hash,
                key,
                data: SelectedBytes::Copied(record.data.to_vec()),
                compression: dataset.props.compression(),
                sector_table_min_bytes: dataset.config.sector_table_min_bytes,
            });
            if batch_bytes >= budget_bytes {
                break;
            }
        }
        selected
    }
}

/// The batch filled before the selection ran out (its log block takes room
/// too): the evicted records past the first `records` go back to the front
/// of the queue for the next feed, which comes at once, instead of being
/// lost; copied ones are still in the ARC. Their claims go first, or the
/// next feed (maybe another device's) would find them claimed and drop them.
fn requeue_left_out(
    l2: &L2Arc,
    selected: Vec<Selected>,
    records: usize,
    claims: &mut FeedClaims<'_>,
) {
    let left_out = &selected[records..];
    claims.release(left_out.iter().map(|s| s.key_hash));
    let requeue: Vec<super::writeback::Queued> = selected
        .into_iter()
        .skip(records)
        .filter_map(|s| match s.data {
            SelectedBytes::Evicted(record) => Some(super::writeback::Queued {
                key: s.key,
                key_hash: s.key_hash,
                record,
            }),
            SelectedBytes::Copied(_) => None,
        })
        .collect();
    let skipped = l2.writeback.requeue_front(requeue);
    l2.evict_counters.skip.fetch_add(skipped, Ordering::Relaxed);
}

/// Starts the feeder thread of the device in `slot`: it feeds that device
/// while there is work, sleeps when there is none, and ends with the cache
/// or when the device leaves its slot.
pub(crate) fn spawn_device_feeder(
    cache: Weak<Cache>,
    wake: Arc<FeedWake>,
    l2: &L2Arc,
    slot: u8,
) -> std::io::Result<()> {
    let Some(device) = l2.device(slot) else {
        return Ok(());
    };
    let device = Arc::downgrade(&device);
    std::thread::Builder::new()
        .name(format!("l2arc-feed-{slot}"))
        .spawn(move || device_feeder_loop(&cache, &wake, &device))?;
    Ok(())
}

fn device_feeder_loop(cache: &Weak<Cache>, wake: &FeedWake, device: &Weak<CacheDevice>) {
    let mut pause = Duration::from_millis(10);
    let mut seen = 0u64;
    loop {
        let woken = wake.wait(pause, &mut seen);
        let Some(cache) = cache.upgrade() else {
            return;
        };
        let Some(l2) = cache.l2.get() else {
            return;
        };
        let Some(device) = device.upgrade() else {
            return; // removed
        };
        if device.is_removed() {
            return;
        }
        if woken {
            l2.feed_wakeups.fetch_add(1, Ordering::Relaxed);
        }
        let config = l2.config().clone();
        let outcome = cache.feed_to(Some(&device));
        drop(device);
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
