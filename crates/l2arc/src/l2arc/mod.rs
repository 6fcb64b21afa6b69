//! The L2ARC: a second-level read cache on flash, between the ARC and primary.
//!
//! Why a log. Flash is fast to read at random and wears when written at
//! random, and a cache is rewritten constantly. So each cache device is a
//! circular log: the feeder gathers records that are about to fall out of the
//! ARC and writes them in one large sequential batch at the device's write
//! hand; the hand sweeps the device and wraps, and whatever it sweeps over is
//! simply gone. There is no allocator, no free-space map and no write
//! amplification beyond one pass over the device per lap.
//!
//! Why lazy invalidation. An index entry names a block and the lap it was
//! written in; the device publishes its hand (and lap) before it writes a
//! batch, so an entry is valid exactly when the hand has not swept past it
//! since (`CacheDevice::holds`). Entries that the hand overwrote are dropped
//! when a lookup meets them and by a sweep every sixteenth of a lap, so the
//! write path never has to find them.
//!
//! Why 16 bytes of DRAM a record. The index keeps only what finds and
//! validates a record: the packed location word, a CRC-32C of the stored
//! bytes seeded with the 64-bit hash of its identity (dataset, object,
//! record, object generation), and a fingerprint of that hash (15-byte
//! slots, `index`). A read recomputes the CRC with the hash the reader
//! asked for, so one check catches corruption, a misdirected or overwritten
//! block, and a record that belongs to someone else (one whose hash shares
//! the fingerprint included). Everything else (sizes, compression framing,
//! the log) lives on the device.
//!
//! Why it never returns bad data. Every failure on the L2ARC side — an I/O
//! error, a checksum mismatch, a failed decompression, a device that is
//! faulted, rebuilding or being removed — drops the entry and reports a miss;
//! the read path then reads primary storage. A device that keeps failing is
//! faulted and leaves the rotor; the cache goes on at primary speed.
//!
//! Why it survives restarts. Each batch ends with a log block that lists its
//! records and points at the previous log block; the device header points at
//! the newest. At open, the index is rebuilt by walking that chain backwards,
//! verifying every checksum, in a background thread while reads go on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use crate::tier::FeedSource;

mod as_tier;
mod cache_device;
pub(crate) mod device;
#[cfg(any(test, feature = "test-utils"))]
pub(crate) mod faulty_device;
pub(crate) mod feeder;
pub mod format;
pub mod index;
mod lifecycle;
pub(crate) mod poll;
pub(crate) mod reader;
mod rebuild;
pub(crate) mod ring;
mod sector_tables;
mod space;
mod stats;
mod stop_flush;
mod sweep;
pub(crate) mod tunables;
pub(crate) mod writeback;
mod writer;

use crate::lock_order::{RankedMutex, RankedRwLock, rank};
use cache_device::CacheDevice;
pub use feeder::FeedOutcome;
use index::L2Index;
pub use lifecycle::DeviceOpen;
pub(crate) use reader::RunRead;
#[cfg(feature = "internals")]
pub use rebuild::REBUILD_BUFFER_BYTES_MAX;
pub use ring::IoEngine;
pub use stats::{DeviceStats, L2Stats};
pub use stop_flush::{StopFlush, StopFlushCut};
pub use writer::FeedRecord;
#[cfg(feature = "internals")]
pub use writer::LogOnlyRecord;
pub(crate) use writer::WriteGate;

/// Devices per cache: the location word has 4 bits for the device.
pub(crate) const DEVICES_MAX: usize = 16;
/// Largest batch (records plus log block) written in one sequential write.
pub const BATCH_BYTES_MAX: u64 = 16 << 20;

// The pool of freed large buffers takes two batches of a feeder's copies
// (`buf::POOLED_BYTES_MAX`).
const _: () = assert!(crate::buf::POOLED_BYTES_MAX as u64 >= 2 * BATCH_BYTES_MAX);

/// A device needs room for several batches to be a useful log.
pub(crate) const DEVICE_DATA_BYTES_MIN: u64 = 4 << 20;
/// Consecutive I/O errors after which a device is faulted.
pub const DEVICE_ERRORS_MAX: u32 = 8;
/// Sweeps of overwritten index entries per lap of the write hand.
const SWEEPS_PER_LAP: u32 = 16;

crate::settings::settings! {
/// The L2ARC tunables, named as ZFS names them.
#[derive(Clone, Debug)]
pub struct L2ArcConfig {
    /// Most bytes written per feed; 0 = no cap but the batch size and the
    /// endurance budget.
    pub l2arc_write_max_bytes: u64,
    /// How deep the feeder scans the ARC's cold ends, in multiples of the
    /// write size.
    pub l2arc_headroom: u32,
    /// Feeder period when there is nothing to write.
    pub l2arc_feed_secs: f64,
    /// Feeder period while it keeps finding records to write.
    pub l2arc_feed_min_ms: u64,
    /// Turbo feed (OpenZFS's `l2arc_feed_again`): feed again at once while
    /// there is more to write, and wake the feeder early when the ARC takes
    /// in enough new records that unfed ones near its cold end.
    pub l2arc_feed_again: bool,
    /// Do not cache records that were only read ahead.
    pub l2arc_noprefetch: bool,
    /// Cache only records from the MFU side of the ARC.
    pub l2arc_mfuonly: bool,
    /// Rebuild the index from the devices' logs at open.
    pub l2arc_rebuild_enabled: bool,
    /// Endurance budget: device writes per day (0 = unlimited).
    pub l2arc_dwpd: f64,
    /// Initialise a device whose header is not an L2ARC header (a device
    /// holding something else). Off: such a device is refused.
    pub force_init_foreign: bool,
    /// How read queues read cache devices: io_uring, psync, or auto.
    pub l2arc_ioengine: IoEngine,
    /// Longest a blocking flash read polls for its completion before it
    /// sleeps, when a core is spare for it (`poll`); 0: never poll.
    pub l2arc_read_poll_us: u64,
    /// Most bytes of evicted records held for the feeder (`writeback`):
    /// DRAM beyond `arc_max`; 0 turns the write-back off.
    pub l2arc_writeback_max_bytes: u64,
    /// Seconds a clean stop may spend writing what only the ARC holds to
    /// the cache devices (`stop_flush`; 0: no flush). The front ends pass
    /// it to `Cache::flush_arc_to_l2`.
    pub l2arc_stop_budget_secs: f64,
}
}

impl Default for L2ArcConfig {
    fn default() -> Self {
        let config = Self {
            l2arc_write_max_bytes: 0,
            l2arc_headroom: 8,
            l2arc_feed_secs: 1.0,
            l2arc_feed_min_ms: 200,
            l2arc_feed_again: true,
            l2arc_noprefetch: true,
            l2arc_mfuonly: false,
            l2arc_rebuild_enabled: true,
            l2arc_dwpd: 0.0,
            force_init_foreign: false,
            l2arc_ioengine: IoEngine::Auto,
            l2arc_read_poll_us: 100,
            l2arc_writeback_max_bytes: 2 * BATCH_BYTES_MAX,
            l2arc_stop_budget_secs: 5.0,
        };
        // The write-back queue holds at least a batch.
        debug_assert!(config.l2arc_writeback_max_bytes >= BATCH_BYTES_MAX);
        config
    }
}

/// The flash tier: devices, the index, and the rotor between them.
pub struct L2Arc {
    config: L2ArcConfig,
    /// The feed tunables in force (`cache::tunables`): read on every use.
    live: Arc<tunables::LiveTunables>,
    cache_guid: u128,
    devices: RankedRwLock<DeviceList, { rank::LEAF }>,
    index: L2Index,
    rotor: AtomicU64,
    misses: AtomicU64,
    hits: AtomicU64,
    /// Blocking flash reads that polled for their completion, and those of
    /// them whose poll ran out (`poll`).
    reads_polled: AtomicU64,
    reads_poll_slept: AtomicU64,
    /// Feeds started early by eviction pressure (`feeder::FeedWake`).
    feed_wakeups: AtomicU64,
    /// Wakes the device feeders early (eviction pressure, queued work).
    feed_wake: Arc<feeder::FeedWake>,
    /// The ARC this tier copies records from (`attach`).
    feed_source: OnceLock<Weak<dyn FeedSource>>,
    /// Endurance budget: bytes the feeder may still write (refilled with time).
    budget_bytes: RankedMutex<(f64, std::time::Instant), { rank::LEAF }>,
    stopping: AtomicBool,
    /// Evicted records waiting for the feeder, and how evictions went.
    writeback: writeback::WriteBack,
    evict_counters: writeback::EvictCounters,
    /// Sector tables of records read in pieces lately (`sector_tables`).
    sector_tables: sector_tables::SectorTables,
    /// Key hashes of the records a feed has chosen and not yet indexed:
    /// each device has its own feeder, and two must not write one record.
    feeding:
        RankedMutex<std::collections::HashSet<u64, crate::hash::FastBuildHasher>, { rank::LEAF }>,
    /// Feeds moving records between the write-back queue and `feeding`
    /// (taken off the queue, not yet claimed; or released, not yet put
    /// back): with the claims, what `records_being_fed` counts, so that it
    /// and the queue's size are never both 0 while a record is in hand.
    records_in_transit: std::sync::atomic::AtomicUsize,
    /// Stop flushes running (`stop_flush`): the device feeders are quiet
    /// while there is one.
    stop_flushes: std::sync::atomic::AtomicU32,
    /// What the stop flushes wrote and left (`l2_stop_flush_*`).
    stop_flush_counters: stop_flush::StopFlushCounters,
}

/// The devices by slot, and what the removed ones counted.
#[derive(Default)]
struct DeviceList {
    slots: Vec<Option<Arc<CacheDevice>>>,
    /// The counters (`crate::stats::kstat_kind`) of the devices removed,
    /// summed: the cache-wide counters are these plus the devices', so
    /// they never fall when a device leaves (issue 32). Updated under
    /// the list's lock with the slot, so a snapshot sees a device either
    /// in its slot or here, never both or neither.
    retired: Vec<(&'static str, u64)>,
}

/// See [`L2Arc::begin_transit`].
pub(crate) struct InTransit<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for InTransit<'_> {
    fn drop(&mut self) {
        let before = self.0.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(before > 0, "a transit ended that never began");
    }
}

/// The devices in `slots`, in slot order.
fn all_of(slots: &[Option<Arc<CacheDevice>>]) -> Vec<Arc<CacheDevice>> {
    // At most `DEVICES_MAX`, each in its own slot.
    debug_assert!(slots.len() <= DEVICES_MAX);
    debug_assert!(
        slots
            .iter()
            .enumerate()
            .all(|(i, d)| d.as_ref().is_none_or(|d| usize::from(d.slot) == i))
    );
    slots.iter().flatten().cloned().collect()
}

/// Seed for random guids: time, pid and an address, mixed.
fn random_u128() -> u128 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let local = 0u8;
    let a = crate::hash::mix64(t as u64 ^ u64::from(std::process::id()) << 32);
    let b = crate::hash::mix64(a ^ (&local as *const u8 as u64) ^ (t >> 64) as u64);
    let guid = (u128::from(a) << 64) | u128::from(b);
    // Never 0 (a 128-bit mix; 0 would read as no guid at all).
    debug_assert_ne!(guid, 0);
    guid
}

impl L2Arc {
    /// An L2ARC with no devices yet; `expected_records` pre-sizes the index.
    ///
    /// # Panics
    /// If a feed tunable is out of range (`Cache::new` refuses those).
    pub fn new(config: L2ArcConfig, expected_records: usize) -> Self {
        let live = tunables::LiveTunables::from_config(&config).unwrap_or_else(|e| panic!("{e}"));
        Self::with_tunables(config, expected_records, Arc::new(live))
    }

    /// [`Self::new`] reading its feed tunables from `live` (the cache's).
    pub(crate) fn with_tunables(
        config: L2ArcConfig,
        expected_records: usize,
        live: Arc<tunables::LiveTunables>,
    ) -> Self {
        let l2 = Self {
            live,
            cache_guid: random_u128(),
            devices: RankedRwLock::new(DeviceList::default()),
            index: L2Index::new(64, expected_records),
            rotor: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            reads_polled: AtomicU64::new(0),
            reads_poll_slept: AtomicU64::new(0),
            feed_wakeups: AtomicU64::new(0),
            feed_wake: Arc::new(feeder::FeedWake::new(BATCH_BYTES_MAX / 4)),
            feed_source: OnceLock::new(),
            budget_bytes: RankedMutex::new((0.0, std::time::Instant::now())),
            stopping: AtomicBool::new(false),
            writeback: writeback::WriteBack::new(
                config.l2arc_writeback_max_bytes,
                // Wake the feeder at a quarter of a batch (or of the queue).
                (BATCH_BYTES_MAX / 4).min(config.l2arc_writeback_max_bytes / 4),
            ),
            evict_counters: writeback::EvictCounters::default(),
            sector_tables: sector_tables::SectorTables::new(),
            feeding: RankedMutex::new(std::collections::HashSet::default()),
            records_in_transit: std::sync::atomic::AtomicUsize::new(0),
            stop_flushes: std::sync::atomic::AtomicU32::new(0),
            stop_flush_counters: stop_flush::StopFlushCounters::default(),
            config,
        };
        debug_assert!(l2.is_empty() && l2.writeback.held_bytes() == 0);
        l2
    }

    /// The tunables this L2ARC started with (the feed tunables that
    /// change while running are in [`Self::live_config`]).
    pub fn config(&self) -> &L2ArcConfig {
        debug_assert_ne!(self.cache_guid, 0);
        &self.config
    }

    /// The tunables in force now: the start's, with the live feed tunables.
    pub fn live_config(&self) -> L2ArcConfig {
        let live = &self.live;
        let config = self
            .config
            .clone()
            .l2arc_write_max_bytes(live.write_max_bytes())
            .l2arc_headroom(live.headroom())
            .l2arc_noprefetch(live.noprefetch())
            .l2arc_mfuonly(live.mfuonly())
            .l2arc_feed_again(live.feed_again())
            .l2arc_dwpd(live.dwpd())
            .l2arc_feed_secs(live.feed_secs())
            .l2arc_feed_min_ms(live.feed_min_ms())
            .l2arc_stop_budget_secs(live.stop_budget_secs());
        debug_assert!(config.l2arc_headroom >= 1);
        config
    }

    /// Attaches the tier to the ARC it copies records from: its feeders
    /// ask `source` for cold records and the stale-write gate, and wake
    /// early once the ARC has taken in `feed_wake_bytes` since a feed.
    /// Once only: a tier serves one cache.
    pub(crate) fn attach(&self, source: Weak<dyn FeedSource>, feed_wake_bytes: u64) {
        assert!(feed_wake_bytes > 0);
        self.feed_wake.set_threshold_bytes(feed_wake_bytes);
        let attached = self.feed_source.set(source).is_ok();
        assert!(attached, "an L2ARC serves one cache");
    }

    /// The ARC this tier feeds from, while it lives.
    fn feed_source(&self) -> Option<Arc<dyn FeedSource>> {
        let source = self.feed_source.get().and_then(Weak::upgrade);
        // An ARC has at least one shard: a feed's scan depth divides by it.
        debug_assert!(source.as_ref().is_none_or(|s| s.checked_arc_shards() >= 1));
        source
    }

    fn device(&self, slot: u8) -> Option<Arc<CacheDevice>> {
        let devices = self.devices.read().expect("device list poisoned");
        let device = devices.slots.get(slot as usize).and_then(Clone::clone);
        debug_assert!(
            device.as_ref().is_none_or(|d| d.slot == slot),
            "in its slot"
        );
        device
    }

    fn all_devices(&self) -> Vec<Arc<CacheDevice>> {
        let devices = self.devices.read().expect("device list poisoned");
        all_of(&devices.slots)
    }

    /// Whether any device takes writes now (online).
    pub(crate) fn takes_writes(&self) -> bool {
        let devices = self.devices.read().expect("device list poisoned");
        debug_assert!(devices.slots.len() <= DEVICES_MAX);
        devices.slots.iter().flatten().any(|d| d.is_online())
    }

    /// Number of records indexed.
    pub fn len(&self) -> usize {
        let len = self.index.len();
        // Every entry is a record in a 4 KiB block of a device: a count
        // this large is one that went below zero and wrapped.
        debug_assert!(
            (len as u64) < u64::MAX / format::BLOCK_BYTES,
            "entry count wrapped"
        );
        len
    }

    /// Whether the index holds no record.
    pub fn is_empty(&self) -> bool {
        let len = self.index.len();
        debug_assert!(
            (len as u64) < u64::MAX / format::BLOCK_BYTES,
            "entry count wrapped"
        );
        len == 0
    }

    /// `key_hash` with the bits the index drops cleared: two keys equal
    /// here share one index entry (`index::L2Index::fingerprint`).
    #[cfg(feature = "internals")]
    pub fn index_fingerprint(&self, key_hash: u64) -> u64 {
        let fingerprint = self.index.fingerprint(key_hash);
        // The key's bits, less those the index drops.
        debug_assert_eq!(fingerprint & !key_hash, 0);
        fingerprint
    }

    /// Bits of `key_hash` the index keeps (`index::L2Index::fingerprint_bits`).
    #[cfg(feature = "internals")]
    pub fn index_fingerprint_bits(&self) -> u32 {
        let bits = self.index.fingerprint_bits();
        debug_assert!((32..=64).contains(&bits));
        bits
    }

    /// Records some feed has chosen and not yet indexed or given up (a
    /// feed in progress, its batch maybe being written), plus feeds that
    /// hold records off the write-back queue and unclaimed for a moment:
    /// 0 once the feeders are idle, and never 0 while the queue is empty
    /// because a feed has its last records in hand.
    #[cfg(feature = "internals")]
    pub fn records_being_fed(&self) -> usize {
        // In this order: a record claimed as the transit ends is seen.
        let in_transit = self.records_in_transit.load(Ordering::SeqCst);
        let feeding = self.feeding.lock().expect("feed claims poisoned");
        // Claims are of record key hashes, never 0.
        debug_assert!(!feeding.contains(&0));
        in_transit + feeding.len()
    }

    /// Marks records in a feed's hands outside both the write-back queue
    /// and the claims, until the guard is dropped.
    pub(crate) fn begin_transit(&self) -> InTransit<'_> {
        let before = self.records_in_transit.fetch_add(1, Ordering::SeqCst);
        // One per feed in its selection: bounded by threads.
        debug_assert!(before < 1 << 20);
        InTransit(&self.records_in_transit)
    }

    /// Stops background work (rebuild threads check this).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        debug_assert!(self.stopping.load(Ordering::Relaxed));
    }
}
