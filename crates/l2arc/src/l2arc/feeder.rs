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
//! While a stop flush runs (`stop_flush`) the feeders stay quiet: it is the
//! only writer, and a burst in progress ends after its batch in flight.
//!
//! Writes overlap the next batch. A device's feeder hands each batch to a
//! writer thread of its own (`BatchWriter`) and selects and encodes the
//! next while it is written; it then waits for the write, indexes that
//! batch and hands over the next. Done one after the other, encoding and
//! writing added up: with a reader on both cores, 4-5 ms and 9-14 ms for
//! 8 MiB, and a page-cache-fast reader evicted faster than that. One batch
//! is in flight at a time, so headers reach the device in order and a
//! header never names a log block that is not durable. If a write fails,
//! the batch prepared behind it (whose log block names the failed one) is
//! dropped and the writer's chain goes back to before the failure. The
//! last batch of a burst is written and indexed before the feeder sleeps.
//!
//! Races with writes. The selected records are copied and released before
//! the slow device write (a record a feed holds cannot be evicted). A write
//! through the cache may make a copied record stale while the batch is in
//! flight; [`StaleWriteGate`] leaves such records out of the index, deciding
//! under the lock that writes hold while they drop their records.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::cache_device::CacheDevice;
use super::writer::{PreparedBatch, commit_batch};
use super::{FeedRecord, L2Arc, WriteGate};
use crate::arc::live::RecordKey;
use crate::lock_order::{RankedCondvar, RankedMutex, rank};
use crate::tier::{ColdRecord, FeedSource, Keeping};

/// Wakes the feeder early when the ARC has taken in enough new bytes that
/// its cold end is moving toward records not yet on flash.
pub(crate) struct FeedWake {
    inserted_bytes: AtomicU64,
    threshold_bytes: AtomicU64,
    /// Wake-ups so far: each feeder waits for it to pass the count it saw.
    wakeups: RankedMutex<u64, { rank::FEED_WAKE }>,
    wake: RankedCondvar,
}

impl FeedWake {
    /// Wakes after `threshold_bytes` inserted since the last feed.
    pub(crate) fn new(threshold_bytes: u64) -> Self {
        assert!(threshold_bytes > 0);
        Self {
            inserted_bytes: AtomicU64::new(0),
            threshold_bytes: AtomicU64::new(threshold_bytes),
            wakeups: RankedMutex::new(0),
            wake: RankedCondvar::new(),
        }
    }

    /// The ARC took in `bytes` of new records. Cheap: one atomic add, and a
    /// notification only on crossing the threshold.
    pub(crate) fn note_insert(&self, bytes: u64) {
        let before = self.inserted_bytes.fetch_add(bytes, Ordering::Relaxed);
        let threshold_bytes = self.threshold_bytes.load(Ordering::Relaxed);
        debug_assert!(threshold_bytes > 0, "set only to more than 0");
        if before < threshold_bytes && before + bytes >= threshold_bytes {
            self.wake_now();
        }
    }

    /// Wakes after `threshold_bytes` inserted (the ARC's size is known
    /// once the tier is attached to it).
    pub(crate) fn set_threshold_bytes(&self, threshold_bytes: u64) {
        assert!(threshold_bytes > 0);
        self.threshold_bytes
            .store(threshold_bytes, Ordering::Relaxed);
    }

    /// Wakes every feeder at once (the write-back queue has work).
    pub(crate) fn wake_now(&self) {
        debug_assert!(self.threshold_bytes.load(Ordering::Relaxed) > 0);
        *self.wakeups.lock().expect("feed wake poisoned") += 1;
        self.wake.notify_all();
    }

    /// Waits `pause` at most, less if woken since `seen` (updated); then
    /// starts counting anew. True if it was woken by eviction pressure.
    fn wait(&self, pause: Duration, seen: &mut u64) -> bool {
        let mut wakeups = self.wakeups.lock().expect("feed wake poisoned");
        // Wake-ups only grow: none seen that did not happen.
        debug_assert!(*seen <= *wakeups);
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
pub(super) struct FeedClaims<'a> {
    l2: &'a L2Arc,
    key_hashes: Vec<u64>,
}

impl<'a> FeedClaims<'a> {
    /// No claims yet.
    pub(super) fn new(l2: &'a L2Arc) -> Self {
        let claims = Self {
            l2,
            key_hashes: Vec::new(),
        };
        debug_assert!(claims.key_hashes.is_empty());
        claims
    }
}

impl FeedClaims<'_> {
    /// Claims `key_hash` for this feed unless it is on flash already or
    /// another feed has it.
    pub(super) fn claim(&mut self, key_hash: u64) -> bool {
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
        // Of a record's identity below the ARC, never 0.
        debug_assert_ne!(key_hash, 0);
        claimed
    }
}

impl FeedClaims<'_> {
    /// Gives up this feed's claims on `key_hashes` before it ends (and
    /// forgets them, so that the end does not drop another feed's claims).
    pub(super) fn release(&mut self, key_hashes: impl Iterator<Item = u64>) {
        let mut feeding = self.l2.feeding.lock().expect("feed claims poisoned");
        for key_hash in key_hashes {
            if let Some(at) = self.key_hashes.iter().position(|&k| k == key_hash) {
                self.key_hashes.swap_remove(at);
                feeding.remove(&key_hash);
            }
        }
        // Ours are among every feed's claims.
        debug_assert!(self.key_hashes.len() <= feeding.len());
    }
}

impl Drop for FeedClaims<'_> {
    fn drop(&mut self) {
        let mut feeding = self.l2.feeding.lock().expect("feed claims poisoned");
        // Claims released equal claims taken: each of ours is still held.
        debug_assert!(self.key_hashes.iter().all(|k| feeding.contains(k)));
        for key_hash in &self.key_hashes {
            feeding.remove(key_hash);
        }
    }
}

/// A record chosen for the next batch: its L2 identity, its ARC key (for
/// the stale-write check) and its bytes: the record's own buffer, still in
/// the ARC or evicted and waiting in the write-back queue.
struct Selected {
    key_hash: u64,
    key: RecordKey,
    data: SelectedBytes,
    keeping: Keeping,
}

enum SelectedBytes {
    /// Still in the ARC, held (so not evictable) until the batch is
    /// encoded: the feed copies it once, into the batch, and lets go
    /// before the device write.
    Resident(Arc<crate::arc::live::Record>),
    Evicted(Arc<crate::arc::live::Record>),
}

impl SelectedBytes {
    fn as_slice(&self) -> &[u8] {
        let bytes: &[u8] = match self {
            SelectedBytes::Resident(record) | SelectedBytes::Evicted(record) => &record.data,
        };
        // Empty records are never selected (nor queued for write-back).
        debug_assert!(!bytes.is_empty());
        bytes
    }
}

/// Leaves out of the index the records that a write may have changed since
/// their bytes were taken (see the module comment and [`WriteGate`] for the
/// lock order): for a record copied from the ARC, writes since the feed
/// began; for an evicted record from the write-back queue, writes since it
/// was read (`Record::fill_sequence`).
pub(super) struct StaleWriteGate<'a> {
    pub(super) source: &'a dyn FeedSource,
    pub(super) keys: &'a [RecordKey],
    /// Per record: the invalidation sequence its bytes are known good at.
    pub(super) since: &'a [u64],
}

impl WriteGate for StaleWriteGate<'_> {
    fn admit(&mut self, records: usize, index: &mut dyn FnMut(&[bool])) {
        assert!(records <= self.keys.len() && self.keys.len() == self.since.len());
        self.source
            .checked_admit_unwritten(self.keys, self.since, records, index);
    }
}

/// What one feed chose: the records, their claims, and what the
/// stale-write gate needs once they are on the device.
struct FeedSelection<'a> {
    claims: FeedClaims<'a>,
    selected: Vec<Selected>,
    keys: Vec<RecordKey>,
    /// Per record: the invalidation sequence its bytes are known good at.
    since: Vec<u64>,
    batch_bytes: u64,
}

impl FeedSelection<'_> {
    fn batch(&self) -> Vec<FeedRecord<'_>> {
        // A key and a since per record; the bytes are the records'.
        debug_assert!(
            self.keys.len() == self.selected.len() && self.since.len() == self.keys.len()
        );
        debug_assert_eq!(
            self.selected
                .iter()
                .map(|s| s.data.as_slice().len() as u64)
                .sum::<u64>(),
            self.batch_bytes
        );
        self.selected
            .iter()
            .map(|s| FeedRecord {
                key_hash: s.key_hash,
                data: s.data.as_slice(),
                compression: s.keeping.compression,
                sector_table_min_bytes: s.keeping.sector_table_min_bytes,
            })
            .collect()
    }

    /// The gate that indexes what of the batch no write made stale.
    fn gate<'g>(&'g self, source: &'g dyn FeedSource) -> StaleWriteGate<'g> {
        debug_assert_eq!(self.keys.len(), self.since.len());
        StaleWriteGate {
            source,
            keys: &self.keys,
            since: &self.since,
        }
    }

    /// After `records` (a prefix) went into a batch: the rest go back to
    /// the write-back queue; the bytes are let go (the batch has its
    /// copy). True if some were left out.
    fn settle(&mut self, records: usize) -> bool {
        assert!(records <= self.selected.len());
        let left_out = records < self.selected.len();
        let selected = std::mem::take(&mut self.selected);
        if left_out {
            requeue_left_out(self.claims.l2, selected, records, &mut self.claims);
        }
        left_out
    }
}

/// A device feeder's writer thread: writes the batches its feeder
/// prepared, one at a time and in order, while the feeder selects and
/// encodes the next. Encoding (copies, compression, checksums) and the
/// device write then overlap instead of adding up: on this machine under
/// a reader's load a feed of 8 MiB spent 4-5 ms encoding and 9-14 ms
/// writing. At most one batch is in flight: the next is written only once
/// the one before is durable and its header written.
pub(crate) struct BatchWriter {
    jobs: SyncSender<(Arc<CacheDevice>, PreparedBatch)>,
    done: Receiver<(io::Result<()>, PreparedBatch)>,
}

impl BatchWriter {
    fn spawn(slot: u8) -> io::Result<Self> {
        debug_assert!(usize::from(slot) < super::DEVICES_MAX);
        let (jobs, job_rx) = sync_channel::<(Arc<CacheDevice>, PreparedBatch)>(1);
        let (done_tx, done) = sync_channel(1);
        std::thread::Builder::new()
            .name(format!("l2arc-write-{slot}"))
            .spawn(move || {
                for (device, prepared) in job_rx {
                    let result = commit_batch(&device, &prepared);
                    device.commits_in_flight.fetch_sub(1, Ordering::SeqCst);
                    if done_tx.send((result, prepared)).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Self { jobs, done })
    }
}

/// What one feed did.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct FeedOutcome {
    /// Records written to cache devices.
    pub records: usize,
    /// Bytes written to cache devices.
    pub bytes: u64,
    /// The feed wrote as much as it was allowed: feed again soon.
    pub full: bool,
}

/// A feed's two sides: the flash tier it writes, and the ARC above it
/// that it copies from (through `FeedSource` only).
#[derive(Clone, Copy)]
struct Feeder<'a> {
    l2: &'a L2Arc,
    source: &'a dyn FeedSource,
}

impl L2Arc {
    /// One pass of the L2ARC feeder for `source`: copy eligible records
    /// from the cold ends of its ARC (MFU first, then MRU) to the next
    /// cache device of the rotor, written and indexed before it returns.
    /// (Each device's own feeder thread feeds it alone, its writes
    /// overlapped.)
    #[cfg(any(test, feature = "test-utils"))]
    pub(crate) fn feed_once(&self, source: &dyn FeedSource) -> FeedOutcome {
        let outcome = Feeder { l2: self, source }.feed_now(None);
        // Records written take blocks of the device.
        debug_assert!(outcome.records == 0 || outcome.bytes > 0);
        outcome
    }
}

impl<'a> Feeder<'a> {
    /// One feed, written and indexed before it returns: to `device`
    /// (a device feeder without a writer thread), or to the rotor's next.
    /// Its resident records stay held through the device write (tests,
    /// and a feeder whose writer thread could not start).
    fn feed_now(self, device: Option<&CacheDevice>) -> FeedOutcome {
        let l2 = self.l2;
        let budget_bytes = match device {
            Some(device) => l2.feed_budget_bytes_for(device),
            None => l2.feed_budget_bytes(),
        };
        if budget_bytes == 0 {
            return FeedOutcome::default();
        }
        let mut selection = self.select_feed(l2, budget_bytes);
        let batch = selection.batch();
        let mut gate = selection.gate(self.source);
        let written = match device {
            Some(device) => l2.write_batch_gated_to(device, &batch, &mut gate),
            None => l2.write_batch_gated(&batch, &mut gate),
        };
        let Ok((bytes, records)) = written else {
            return FeedOutcome::default();
        };
        drop(batch);
        debug_assert!(records <= selection.keys.len(), "written ≤ selected");
        let left_out = selection.settle(records);
        FeedOutcome {
            records,
            bytes,
            full: left_out || selection.batch_bytes >= budget_bytes,
        }
    }

    /// One feed of a device feeder: selects and prepares the next batch
    /// for `device` while the one before is being written (`in_flight`),
    /// then waits for that one, indexes it, and hands this one to
    /// `writer`. The caller finishes the last one in flight
    /// (`finish_in_flight`) before it sleeps or lets go of the cache.
    fn feed_pipelined(
        self,
        device: &Arc<CacheDevice>,
        writer: &BatchWriter,
        in_flight: &mut Option<FeedSelection<'a>>,
    ) -> FeedOutcome {
        let l2 = self.l2;
        let budget_bytes = l2.feed_budget_bytes_for(device);
        let (_, hand) = device.position();
        if budget_bytes == 0 || hand.saturating_add(device.batch_blocks_max) > device.end_block {
            // A wrap writes the header before the batch: never while one
            // is in flight whose header must come first.
            self.finish_in_flight(device, writer, in_flight);
            if budget_bytes == 0 {
                return FeedOutcome::default();
            }
        }
        let mut selection = self.select_feed(l2, budget_bytes);
        let batch = selection.batch();
        let prepared = if batch.is_empty() {
            Ok(None)
        } else {
            l2.prepare_batch(device, &batch)
        };
        drop(batch);
        let prepared = match prepared {
            Ok(Some(prepared)) => prepared,
            Ok(None) => {
                self.finish_in_flight(device, writer, in_flight);
                return FeedOutcome::default();
            }
            Err(e) => {
                l2.note_write_error(device, &e);
                self.finish_in_flight(device, writer, in_flight);
                return FeedOutcome::default();
            }
        };
        let (records, bytes) = (prepared.records(), prepared.bytes());
        debug_assert!(records <= selection.keys.len(), "prepared ≤ selected");
        let left_out = selection.settle(records);
        if in_flight.is_some() {
            device
                .counters
                .writes_pipelined
                .fetch_add(1, Ordering::Relaxed);
        }
        if !self.finish_in_flight(device, writer, in_flight) {
            // This batch's log block names the failed one's: dropped, as
            // the writer's chain went back to before that one.
            return FeedOutcome::default();
        }
        device.commits_in_flight.fetch_add(1, Ordering::SeqCst);
        if device.is_removed() {
            device.commits_in_flight.fetch_sub(1, Ordering::SeqCst);
            return FeedOutcome::default();
        }
        writer
            .jobs
            .send((Arc::clone(device), prepared))
            .expect("the batch writer thread ended");
        let full = left_out || selection.batch_bytes >= budget_bytes;
        *in_flight = Some(selection);
        FeedOutcome {
            records,
            bytes,
            full,
        }
    }

    /// Waits for the batch in flight, if any, and indexes what of it the
    /// stale-write gate admits (its records' claims held until then);
    /// false if its write failed.
    fn finish_in_flight(
        self,
        device: &CacheDevice,
        writer: &BatchWriter,
        in_flight: &mut Option<FeedSelection<'_>>,
    ) -> bool {
        let Some(selection) = in_flight.take() else {
            return true;
        };
        let (result, prepared) = writer.done.recv().expect("the batch writer thread ended");
        // The gate covers the records this batch was prepared from.
        debug_assert!(prepared.records() <= selection.keys.len());
        let l2 = selection.claims.l2;
        l2.finish_batch(device, prepared, result, &mut selection.gate(self.source))
            .is_ok()
    }

    /// Selects a feed's records (`select_for_feed`) with what the
    /// stale-write gate will need.
    fn select_feed(self, l2: &'a L2Arc, budget_bytes: u64) -> FeedSelection<'a> {
        let start_sequence = self.source.write_sequence();
        let mut claims = FeedClaims::new(l2);
        let selected = self.select_for_feed(budget_bytes, &mut claims);
        let since = selected
            .iter()
            .map(|s| match &s.data {
                SelectedBytes::Resident(_) => start_sequence,
                SelectedBytes::Evicted(record) => record.fill_sequence,
            })
            .collect();
        let batch_bytes = selected
            .iter()
            .map(|s| s.data.as_slice().len() as u64)
            .sum();
        let keys: Vec<RecordKey> = selected.iter().map(|s| s.key).collect();
        // A feed's batch: at most its budget plus one record (O(records)).
        debug_assert!(
            batch_bytes
                <= budget_bytes
                    + selected
                        .iter()
                        .map(|s| s.data.as_slice().len() as u64)
                        .max()
                        .unwrap_or(0)
        );
        FeedSelection {
            claims,
            selected,
            keys,
            since,
            batch_bytes,
        }
    }

    /// Evicted records from the write-back queue first (oldest first),
    /// then the eligible records at the ARC's cold ends, up to
    /// `budget_bytes`; the latter held until the batch is encoded (not
    /// while it is written), so that the ARC may evict them during the
    /// slow device write.
    fn select_for_feed(self, budget_bytes: u64, claims: &mut FeedClaims<'_>) -> Vec<Selected> {
        let l2 = self.l2;
        let config = &l2.live_config();
        let mut selected = Vec::new();
        let mut batch_bytes = 0u64;
        let mut queued = Vec::new();
        let in_transit = l2.begin_transit();
        l2.writeback.take(budget_bytes, &mut queued);
        for q in queued {
            if !claims.claim(q.key_hash) {
                continue;
            }
            batch_bytes += q.record.data.len() as u64;
            selected.push(Selected {
                key_hash: q.key_hash,
                key: q.key,
                data: SelectedBytes::Evicted(q.record),
                keeping: q.keeping,
            });
        }
        drop(in_transit);
        if batch_bytes >= budget_bytes {
            return selected;
        }
        let scan_bytes = budget_bytes.saturating_mul(u64::from(config.l2arc_headroom.max(1)));
        let per_shard = scan_bytes
            .div_ceil(self.source.checked_arc_shards() as u64)
            .max(1);
        let mut candidates = Vec::new();
        self.source
            .checked_cold_records(per_shard, config.l2arc_mfuonly, &mut candidates);
        for ColdRecord {
            key,
            record,
            prefetched,
            keeping,
        } in candidates
        {
            // Held from here until the batch is encoded (`settle`).
            let Some(record) = record.upgrade() else {
                continue; // evicted meanwhile
            };
            if (prefetched && config.l2arc_noprefetch) || record.data.is_empty() {
                continue;
            }
            if !keeping.below_arc {
                continue;
            }
            let key_hash = keeping.key_hash(&key, record.generation_token);
            if !claims.claim(key_hash) {
                continue;
            }
            batch_bytes += record.data.len() as u64;
            // Not copied: held while the batch is encoded (a copy of its
            // own), so the ARC skips it for a few milliseconds and evicts
            // the next record instead; let go before the device write. A
            // copy here, then another into the batch, was half of the
            // feeder's CPU and a pool buffer per record.
            selected.push(Selected {
                key_hash,
                key,
                data: SelectedBytes::Resident(record),
                keeping,
            });
            if batch_bytes >= budget_bytes {
                break;
            }
        }
        // One claim per record selected, none for the others.
        debug_assert_eq!(claims.key_hashes.len(), selected.len());
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
    let _in_transit = l2.begin_transit();
    claims.release(left_out.iter().map(|s| s.key_hash));
    let requeue: Vec<super::writeback::Queued> = selected
        .into_iter()
        .skip(records)
        .filter_map(|s| match s.data {
            SelectedBytes::Evicted(record) => Some(super::writeback::Queued {
                key: s.key,
                key_hash: s.key_hash,
                record,
                keeping: s.keeping,
            }),
            SelectedBytes::Resident(_) => None,
        })
        .collect();
    let skipped = l2.writeback.requeue_front(requeue);
    l2.evict_counters.skip.fetch_add(skipped, Ordering::Relaxed);
    // Claims kept only for the records written.
    debug_assert_eq!(claims.key_hashes.len(), records);
}

/// How often a quiet feeder looks whether the stop flush has ended.
const STOP_FLUSH_PAUSE: Duration = Duration::from_millis(100);

/// Starts the feeder thread of the device in `slot`: it feeds that device
/// from `l2`'s feed source while there is work, sleeps when there is none,
/// and ends with the tier (or its source) or when the device leaves its
/// slot.
pub(crate) fn spawn_device_feeder(l2: &Arc<L2Arc>, slot: u8) -> std::io::Result<()> {
    let Some(device) = l2.device(slot) else {
        return Ok(());
    };
    debug_assert_eq!(device.slot, slot);
    let device = Arc::downgrade(&device);
    let l2 = Arc::downgrade(l2);
    std::thread::Builder::new()
        .name(format!("l2arc-feed-{slot}"))
        .spawn(move || device_feeder_loop(&l2, &device))?;
    Ok(())
}

fn device_feeder_loop(l2: &Weak<L2Arc>, device: &Weak<CacheDevice>) {
    let Some(slot) = device.upgrade().map(|d| d.slot) else {
        return;
    };
    let Some(wake) = l2.upgrade().map(|l2| Arc::clone(&l2.feed_wake)) else {
        return;
    };
    // Without a thread of its own the feeder writes its batches itself.
    let writer = BatchWriter::spawn(slot).ok();
    let mut pause = Duration::from_millis(10);
    let mut seen = 0u64;
    loop {
        let woken = wake.wait(pause, &mut seen);
        let Some(l2) = l2.upgrade() else {
            return;
        };
        let Some(source) = l2.feed_source() else {
            return;
        };
        let Some(device) = device.upgrade() else {
            return; // removed
        };
        if device.is_removed() {
            return;
        }
        if l2.stop_flush_running() {
            // The stop flush is the only writer while it runs.
            pause = STOP_FLUSH_PAUSE;
            continue;
        }
        if woken {
            l2.feed_wakeups.fetch_add(1, Ordering::Relaxed);
        }
        let config = l2.live_config();
        let feeder = Feeder {
            l2: &l2,
            source: &*source,
        };
        let outcome = match &writer {
            Some(writer) => feed_while_full(feeder, &device, writer, config.l2arc_feed_again),
            None => feeder.feed_now(Some(&device)),
        };
        drop(device);
        drop(source);
        drop(l2);
        pause = if outcome.full && config.l2arc_feed_again {
            Duration::ZERO
        } else if outcome.records > 0 {
            Duration::from_millis(config.l2arc_feed_min_ms)
        } else {
            Duration::from_secs_f64(config.l2arc_feed_secs.clamp(0.001, 3600.0))
        };
        debug_assert!(
            pause <= Duration::from_secs(3600).max(Duration::from_millis(config.l2arc_feed_min_ms))
        );
    }
}

/// Feeds `device` again at once while each feed fills its batch (turbo
/// feed), each batch written while the next is prepared; returns with the
/// last one written and indexed, and the last feed's outcome.
fn feed_while_full(
    feeder: Feeder<'_>,
    device: &Arc<CacheDevice>,
    writer: &BatchWriter,
    feed_again: bool,
) -> FeedOutcome {
    // Other feeds of this device wait for the burst: its batches chain.
    let _order = device.commit_order.lock().expect("commit order poisoned");
    let mut in_flight = None;
    let mut outcome = FeedOutcome::default();
    loop {
        let feed = feeder.feed_pipelined(device, writer, &mut in_flight);
        outcome.records += feed.records;
        outcome.bytes += feed.bytes;
        outcome.full = feed.full;
        if !(feed.full && feed_again)
            || device.is_removed()
            || feed.records == 0
            || feeder.l2.stop_flush_running()
        {
            break;
        }
    }
    feeder.finish_in_flight(device, writer, &mut in_flight);
    // No batch is left in flight past a burst.
    debug_assert!(in_flight.is_none());
    outcome
}
