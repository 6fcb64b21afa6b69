//! The tiers below the ARC, as the cache holds them.
//!
//! The cache keeps an ordered list of tiers (`Tiers`): reads try them in
//! order after an ARC miss, and every fill, eviction and stale record is
//! told to each. The list only grows (a tier whose devices are all gone
//! answers misses), so readers walk it without a lock. The L2ARC is the
//! first tier, made with the first cache device; its devices are managed
//! here (add, remove), and its feeders copy records from the ARC through
//! the [`FeedSource`] this cache implements: its cold records, resolved
//! to how their datasets want them kept, and the stale-write gate of the
//! invalidation log (`write`).

use std::io;
use std::sync::{Arc, OnceLock, Weak};

use super::Cache;
use super::config::{CacheMode, RECORDSIZE_MIN_BYTES};
use super::objects::Dataset;
use crate::arc::live::{EvictionSink, Record, RecordKey};
use crate::arc::policy::{Evicted, ListId};
use crate::l2arc::device::{DeviceIo, FileDevice};
use crate::l2arc::ring::IoEngine;
use crate::l2arc::{DeviceOpen, L2Arc};
use crate::lock_order::{RankedMutex, rank};
use crate::tier::{ColdRecord, EvictedRecord, FeedSource, Keeping, TIERS_MAX, Tier};

/// The tiers below the ARC, in read order (see the module comment).
pub(super) struct Tiers {
    slots: [OnceLock<Arc<dyn Tier>>; TIERS_MAX],
    /// Serialises appends (reads take no lock).
    appending: RankedMutex<(), { rank::OBJECTS }>,
}

impl Default for Tiers {
    fn default() -> Self {
        let tiers = Self {
            slots: Default::default(),
            appending: RankedMutex::new(()),
        };
        debug_assert!(tiers.iter().next().is_none(), "no tier yet");
        tiers
    }
}

impl Tiers {
    /// The tiers, in read order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Arc<dyn Tier>> {
        // Set slots are a prefix (appends fill the first free one): a set
        // slot's predecessor is set, read in this order, race-free.
        debug_assert!(
            self.slots
                .windows(2)
                .all(|w| w[1].get().is_none() || w[0].get().is_some())
        );
        self.slots.iter().map_while(OnceLock::get)
    }

    /// Whether there is no tier below the ARC (no cache device yet): a
    /// miss then goes straight to primary storage, with no key to hash.
    pub(super) fn is_empty(&self) -> bool {
        let empty = self.slots[0].get().is_none();
        debug_assert!(!empty || self.iter().next().is_none());
        empty
    }

    /// Appends a tier below the others.
    fn push(&self, tier: Arc<dyn Tier>) {
        let _appending = self.appending.lock().expect("tier list poisoned");
        let free = self
            .slots
            .iter()
            .find(|slot| slot.get().is_none())
            .expect("at most TIERS_MAX tiers");
        let set = free.set(tier).is_ok();
        assert!(set, "a free slot is set once, under the append lock");
    }
}

impl Dataset {
    /// How this dataset wants its records kept below the ARC, now.
    pub(super) fn keeping(&self) -> Keeping {
        // Checked when the dataset was added.
        debug_assert!(
            self.config.sector_table_min_bytes as usize
                >= crate::l2arc::format::SECTOR_TABLE_RECORD_BYTES_FLOOR
        );
        Keeping {
            dataset_uid: self.uid,
            below_arc: self.props.secondarycache() == CacheMode::All,
            compression: self.props.compression(),
            sector_table_min_bytes: self.config.sector_table_min_bytes,
        }
    }
}

/// The ARC's eviction sink: hands what the ARC lets go to the tiers.
/// Holds the cache weakly (the cache owns the ARC).
struct TierEvictionSink(Weak<Cache>);

impl EvictionSink for TierEvictionSink {
    fn evicted(&self, records: &mut dyn Iterator<Item = Evicted<RecordKey, Arc<Record>>>) {
        if let Some(cache) = self.0.upgrade() {
            // What the ARC lets go leaves a resident list, not a ghost one.
            let mut resident = records.inspect(|evicted| {
                debug_assert!(matches!(evicted.from, ListId::Mru | ListId::Mfu));
            });
            cache.offer_evicted(&mut resident);
        }
    }
}

impl Cache {
    /// Attaches a tier a fleet of nodes shares, in an S3-compatible
    /// bucket, below the L2ARC (made now if no cache device was added
    /// yet): records filled from primary storage are written to it behind
    /// the reader, and an ARC and L2ARC miss reads it before primary
    /// storage. At most one; refused if the fleet key is shorter than 32
    /// bytes. Checks nothing on the network: a tier that does not answer
    /// is skipped, never an error to a reader.
    #[cfg(feature = "object-store")]
    pub fn add_shared_tier(
        self: &Arc<Self>,
        config: crate::shared::SharedTierConfig,
    ) -> io::Result<()> {
        if self.shared.get().is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a shared tier is attached already",
            ));
        }
        let tier = Arc::new(crate::shared::SharedTier::new(config)?);
        // Read after the L2ARC: it is the first tier, made now if need be.
        self.l2_or_init();
        if self.shared.set(Arc::clone(&tier)).is_err() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a shared tier is attached already",
            ));
        }
        self.tiers.push(tier as Arc<dyn Tier>);
        debug_assert!(self.tiers.iter().count() >= 2, "after the L2ARC");
        Ok(())
    }

    /// The shared tier's read latency (GETs that found a block), if one is
    /// attached.
    #[cfg(feature = "object-store")]
    pub fn shared_read_latency(&self) -> Option<crate::latency::HistogramSnapshot> {
        let snapshot = self.shared.get().map(|s| s.read_latency());
        debug_assert!(snapshot.is_none() || !self.tiers.is_empty());
        snapshot
    }

    /// The counters of every tier but the L2ARC (whose are `l2`).
    pub(super) fn tier_kstats(&self) -> Vec<(&'static str, u64)> {
        let mut out = Vec::new();
        for tier in self.tiers.iter().skip(usize::from(self.l2.get().is_some())) {
            tier.kstats(&mut out);
        }
        debug_assert!(self.l2.get().is_some() || out.is_empty());
        out
    }

    /// The L2ARC, once a cache device has been added.
    #[cfg(feature = "internals")]
    pub fn l2arc(&self) -> Option<&Arc<L2Arc>> {
        // The L2ARC, once made, is the first tier (appended before it is
        // published: a reader that sees it sees the tier).
        debug_assert!(self.l2.get().is_none_or(|l2| {
            self.tiers
                .iter()
                .next()
                .is_some_and(|first| std::ptr::addr_eq(Arc::as_ptr(l2), Arc::as_ptr(first)))
        }));
        self.l2.get()
    }

    /// The L2ARC, made with the first cache device: attached to this
    /// cache's ARC as its feed source and appended to the tiers.
    fn l2_or_init(self: &Arc<Self>) -> &Arc<L2Arc> {
        let l2 = self.l2.get_or_init(|| {
            let expected_records =
                (self.config.arc_max_bytes / u64::from(RECORDSIZE_MIN_BYTES)) as usize;
            let mut config = self.config.l2arc.clone();
            if self.ioengine() != IoEngine::IoUring {
                // Polling is through io_uring too: psync means no ring.
                config.l2arc_read_poll_us = 0;
            }
            let l2 = Arc::new(L2Arc::with_tunables(
                config,
                expected_records.min(1 << 20),
                Arc::clone(&self.tunables),
            ));
            let source: Weak<dyn FeedSource> = Arc::downgrade(self) as Weak<dyn FeedSource>;
            // Wake the feeder after a quarter of the ARC, at most half a batch.
            let feed_wake_bytes =
                (self.config.arc_max_bytes / 8).clamp(1, crate::l2arc::BATCH_BYTES_MAX / 4);
            l2.attach(source, feed_wake_bytes);
            self.tiers.push(Arc::clone(&l2) as Arc<dyn Tier>);
            self.arc
                .set_eviction_sink(Box::new(TierEvictionSink(Arc::downgrade(self))));
            l2
        });
        // The L2ARC, once made, is the first tier (appended before it is
        // published: a reader that sees it sees the tier).
        debug_assert!(self.l2.get().is_none_or(|l2| {
            self.tiers
                .iter()
                .next()
                .is_some_and(|first| std::ptr::addr_eq(Arc::as_ptr(l2), Arc::as_ptr(first)))
        }));
        l2
    }

    /// Adds a cache device (L2ARC): reused and rebuilt if it holds an L2ARC
    /// log, initialised if blank, refused if it holds anything else or is
    /// attached already (the same file or block device by any path).
    /// Starts the device's feeder. Errors name the device.
    pub fn add_cache_device(
        self: &Arc<Self>,
        io: Box<dyn DeviceIo>,
    ) -> io::Result<(u8, DeviceOpen)> {
        let l2 = self.l2_or_init();
        let name = io.name();
        let added = l2.add_device(io)?;
        debug_assert!(usize::from(added.0) < crate::l2arc::DEVICES_MAX);
        crate::l2arc::feeder::spawn_device_feeder(l2, added.0)
            .map_err(|e| io::Error::new(e.kind(), format!("cache device {name}: {e}")))?;
        Ok(added)
    }

    /// Adds a cache file or block device by path, creating a file of
    /// `create_size_bytes` if it does not exist.
    pub fn add_cache_path(
        self: &Arc<Self>,
        path: impl AsRef<std::path::Path>,
        create_size_bytes: Option<u64>,
    ) -> io::Result<(u8, DeviceOpen)> {
        let device = FileDevice::open(path, create_size_bytes)?;
        let added = self.add_cache_device(Box::new(device))?;
        debug_assert!(self.l2.get().is_some(), "made with the first device");
        Ok(added)
    }

    /// Removes a cache device; waits for reads in flight on it.
    pub fn remove_cache_device(&self, slot: u8) -> io::Result<()> {
        // The L2ARC, once made, is the first tier (appended before it is
        // published: a reader that sees it sees the tier).
        debug_assert!(self.l2.get().is_none_or(|l2| {
            self.tiers
                .iter()
                .next()
                .is_some_and(|first| std::ptr::addr_eq(Arc::as_ptr(l2), Arc::as_ptr(first)))
        }));
        match self.l2.get() {
            Some(l2) => l2.remove_device(slot),
            None => Err(io::Error::new(io::ErrorKind::NotFound, "no cache devices")),
        }
    }

    /// One pass of the L2ARC feeder, written and indexed before it
    /// returns (each device's feeder thread does this by itself; tests
    /// call it to feed at a point of their choosing).
    #[cfg(any(test, feature = "test-utils"))]
    pub fn feed_l2arc(&self) -> crate::l2arc::FeedOutcome {
        let outcome = match self.l2.get() {
            Some(l2) => l2.feed_once(self),
            None => crate::l2arc::FeedOutcome::default(),
        };
        // Without an L2ARC nothing is fed.
        debug_assert!(self.l2.get().is_some() || (outcome.records == 0 && outcome.bytes == 0));
        outcome
    }

    /// The stop flush: writes the ARC's records that only DRAM holds to
    /// the cache devices, so that a restart finds them on flash. Call it
    /// at a clean stop once nothing reads any more (a front end has
    /// drained), then drop the cache.
    ///
    /// Eligible is what the feeder would write (not on flash already, not
    /// only read ahead under `l2arc_noprefetch`, not MRU under
    /// `l2arc_mfuonly`, `secondarycache=all`); they go MFU first, then
    /// MRU, hottest first in each, then the evicted records waiting in the
    /// write-back queue. In batches of each online device's batch size,
    /// the devices written side by side, while the device feeders wait;
    /// bounded by `budget` (checked before each batch; a budget above zero
    /// writes at least one) and by the endurance budget (`l2arc_dwpd`),
    /// not by `l2arc_write_max`. A zero budget writes nothing and reports
    /// every eligible record left. Without a cache device there is
    /// nothing to do (an empty report); with none online every eligible
    /// record is left. Counted in `l2_stop_flush_*`. The budget a service
    /// was configured with is [`Cache::l2arc_stop_budget`].
    pub fn flush_arc_to_l2(&self, budget: std::time::Duration) -> crate::l2arc::StopFlush {
        let report = match self.l2.get() {
            Some(l2) => l2.flush_from(self, budget),
            None => crate::l2arc::StopFlush {
                budget,
                ..Default::default()
            },
        };
        // Left records come with a reason, and only left records do.
        debug_assert_eq!(report.records_left > 0, report.cut.is_some());
        report
    }

    /// Hands what the ARC let go to every tier, each record with how its
    /// dataset wants it kept.
    fn offer_evicted(&self, records: &mut dyn Iterator<Item = Evicted<RecordKey, Arc<Record>>>) {
        let datasets = self.datasets.read().expect("dataset lock poisoned");
        let mut offered = records.filter_map(|evicted| {
            // Datasets are never removed: every key's slot is in the list.
            debug_assert!((evicted.key.dataset as usize) < datasets.len());
            let dataset = datasets.get(evicted.key.dataset as usize)?;
            Some(EvictedRecord {
                key: evicted.key,
                record: evicted.value,
                from: evicted.from,
                prefetched: evicted.prefetched,
                keeping: dataset.keeping(),
            })
        });
        let mut tiers = self.tiers.iter();
        let first = tiers.next();
        match (first, tiers.next()) {
            (None, _) => {}
            (Some(only), None) => only.checked_offer_evicted(&mut offered),
            (Some(first), Some(_)) => {
                // More than one tier: each sees every record.
                let all: Vec<EvictedRecord> = offered.collect();
                for tier in std::iter::once(first).chain(self.tiers.iter().skip(1)) {
                    tier.checked_offer_evicted(&mut all.iter().cloned());
                }
            }
        }
    }

    /// Tells every tier that the ARC filled a record of `bytes`.
    pub(super) fn offer_fill(&self, bytes: u64) {
        debug_assert!(
            bytes <= u64::from(super::RECORDSIZE_MAX_BYTES),
            "one record"
        );
        for tier in self.tiers.iter() {
            tier.checked_offer_fill(bytes);
        }
    }

    /// Drops a record a write made stale from every tier.
    pub(super) fn drop_below(&self, key_hash: u64) {
        debug_assert_ne!(key_hash, 0, "0 marks an empty slot below");
        for tier in self.tiers.iter() {
            tier.checked_drop_record(key_hash);
        }
    }
}

impl Cache {
    /// `candidates` as the feed sees them: each with how its dataset wants
    /// it kept (none of an unknown dataset).
    fn resolve_candidates(
        &self,
        candidates: Vec<(RecordKey, std::sync::Weak<Record>, bool)>,
        out: &mut Vec<ColdRecord>,
    ) {
        let datasets: Vec<Arc<Dataset>> =
            self.datasets.read().expect("dataset lock poisoned").clone();
        let before = out.len();
        out.extend(
            candidates
                .into_iter()
                .filter_map(|(key, record, prefetched)| {
                    let dataset = datasets.get(key.dataset as usize)?;
                    Some(ColdRecord {
                        key,
                        record,
                        prefetched,
                        keeping: dataset.keeping(),
                    })
                }),
        );
        // At most one cold record per candidate, none of an unknown dataset.
        debug_assert!(
            out[before..]
                .iter()
                .all(|c| (c.key.dataset as usize) < datasets.len())
        );
    }
}

impl FeedSource for Cache {
    fn cold_records(&self, scan_bytes_per_shard: u64, mfu_only: bool, out: &mut Vec<ColdRecord>) {
        debug_assert!(scan_bytes_per_shard > 0);
        let mut candidates = Vec::new();
        self.arc
            .feed_candidates(ListId::Mfu, scan_bytes_per_shard, &mut candidates);
        if !mfu_only {
            self.arc
                .feed_candidates(ListId::Mru, scan_bytes_per_shard, &mut candidates);
        }
        self.resolve_candidates(candidates, out);
    }

    fn resident_records(&self, mfu_only: bool, out: &mut Vec<ColdRecord>) {
        let mut candidates = Vec::new();
        self.arc.resident_hot_first(ListId::Mfu, &mut candidates);
        if !mfu_only {
            self.arc.resident_hot_first(ListId::Mru, &mut candidates);
        }
        // At most the ARC's records: a snapshot, O(records).
        debug_assert!(candidates.len() as u64 <= self.arc.config().arc_max_bytes);
        self.resolve_candidates(candidates, out);
    }

    fn arc_shards(&self) -> usize {
        debug_assert_eq!(self.config.arc_shards, self.arc.config().shards);
        self.config.arc_shards
    }

    fn write_sequence(&self) -> u64 {
        let invalidations = self.invalidations.lock().expect("invalidations poisoned");
        // Published under this lock: the atomic copy agrees.
        debug_assert_eq!(
            invalidations.sequence,
            self.invalidation_sequence
                .load(std::sync::atomic::Ordering::Acquire)
        );
        invalidations.sequence
    }

    fn admit_unwritten(
        &self,
        keys: &[RecordKey],
        since: &[u64],
        records: usize,
        index: &mut dyn FnMut(&[bool]),
    ) {
        // A flag for each of the first `records` keys, each with its since.
        assert!(records <= keys.len() && keys.len() == since.len());
        self.admit_unwritten_records(keys, since, records, index);
    }
}
