//! The read path: records, generations, and the tiers in order.
//!
//! A read of `(dataset, object, offset, len)` is split into the dataset's
//! records (`recordsize`, 4 KiB to 1 MiB, a power of two, as in ZFS). Each
//! record is looked up in the ARC; a miss claims the record's fill (one read
//! below per record at a time), reads the whole record from the first tier
//! below the ARC that holds it or else from primary storage into an aligned
//! buffer, inserts it, and wakes any reader that waited. Whole records are
//! the unit of caching because that is what makes a cache cheap to index;
//! the cost is read amplification on small random reads, which `recordsize`
//! trades off per dataset.
//!
//! Generations (`objects`). A record is only as good as the object version
//! it was read from: records carry the token of the generation they were
//! read under, and a hit requires the current one, so a file rewritten
//! behind the cache turns every older record into a miss at once. Writes
//! through the cache (`write`) go to primary first, then drop the records
//! they touched from every tier, then adopt the new generation without a
//! new token. (An outside change that lands between our write and our
//! re-stat is taken for ours: a known, narrow window that every
//! write-through cache over a shared file system shares. `revalidate` keeps
//! out of it: while a write of ours is in that window it leaves a moved
//! generation to the write, so a watcher woken by our own writes never
//! takes them for an outside change.)
//!
//! Reads past the end behave as `pread`: short at the end, empty beyond it.
//!
//! Tiers (`tiers`, `crate::tier`). Below the ARC sits an ordered list of
//! tiers; the L2ARC on the cache devices is the first. A record the ARC
//! misses is looked up in each by a hash of (dataset identity, object,
//! record, generation token) before primary storage is read. The ARC tells
//! every tier what it filled and what it let go; the L2ARC's feeders copy
//! records from the ARC's cold ends through the `FeedSource` the cache
//! implements. A feed that raced with a write checks the log of recent
//! invalidations before it indexes its batch, under the lock the write
//! holds while it drops its records, and leaves out what the write made
//! stale, so a record copied before a write can never be found after it.
//!
//! The folder: `config` (settings and their checks), `objects` (datasets,
//! object states, handles), `view` (read views), `read` (the record walk),
//! `write` (writes, holes, the invalidation log), `tiers`, `queue` (many
//! reads in flight from one thread), `prefetch`, `read_ahead` and
//! `zstream` (read-ahead of sequential readers), `properties` (what may
//! change while running), `prewarm` (the ARC's shape saved and restored). No `impl Cache` lives outside it
//! (`scripts/import-cycles` checks).
//!
//! Locking: every lock of the engine has a rank, and the order in which
//! they nest is written, with the why of each, in `lock_order.rs`, whose
//! wrappers check it in every debug build. Waits are bounded: a
//! single-flight waiter waits for a read below it that either finishes or
//! fails (primary and device I/O have their own timeouts or none; a hung
//! primary hangs its readers as it would without a cache), and device
//! removal waits for reads in flight on that device only.

mod config;
mod objects;
pub(crate) mod prefetch;
mod prewarm;
pub(crate) mod properties;
mod queue;
mod read;
mod read_ahead;
mod tiers;
pub(crate) mod tunables;
mod view;
mod write;
pub(crate) mod zstream;

pub use config::{
    ARC_MAX_AUTO, CacheConfig, CacheMode, ConfigError, DatasetConfig, RECORDSIZE_DEFAULT_BYTES,
    RECORDSIZE_MAX_BYTES, RECORDSIZE_MIN_BYTES, validate_recordsize,
};
#[cfg(feature = "internals")]
pub use objects::OBJECT_STATES_MAX;
pub use objects::{DatasetId, ObjectHandle};
pub use prewarm::{ArcCheckpointer, RestoreError, RestoredShape, SavedShapeSummary, ShapeStats};
pub use queue::{ReadCompletion, ReadQueue};
pub use view::ReadView;

use std::sync::atomic::AtomicU64;

use std::sync::{Arc, OnceLock};

use crate::arc::live::{ArcConfig, LiveArc};
use crate::hash::FastHashMap;
use crate::l2arc::L2Arc;
use crate::l2arc::ring::IoEngine;
use crate::lock_order::{RankedMutex, RankedRwLock, rank};
use crate::stats::{CacheStats, ReadPathCounters};
use objects::{Dataset, ObjectState};
use write::Invalidations;

/// What `arc_max = auto` resolved at start: the bounds, the limits they
/// came from, and the memory source the watcher then reads.
type AutoResolved = (
    crate::arc::breathe::BreatheConfig,
    crate::arc::memory::MemoryLimits,
    crate::arc::memory::SystemMemory,
);

/// The cache: datasets over primary storage, with the ARC (and, once cache
/// devices are added, the L2ARC) in front.
///
/// Stopping. Dropping the cache stops its background work; the L2ARC's
/// log on the cache devices is consistent at every batch, so a restart
/// rebuilds what was on flash. What only DRAM held is lost, unless the
/// program calls [`Cache::flush_arc_to_l2`] first, once its readers are
/// done, with the budget it can spare (the configured one is
/// [`Cache::l2arc_stop_budget`]):
///
/// ```no_run
/// # fn stop(cache: std::sync::Arc<l2arc::Cache>) {
/// let flushed = cache.flush_arc_to_l2(cache.l2arc_stop_budget());
/// eprintln!("{} records to flash, {} left", flushed.records_written, flushed.records_left);
/// drop(cache);
/// # }
/// ```
pub struct Cache {
    /// Itself, for what must outlive a call (spans filled by the pool).
    pub(crate) me: std::sync::Weak<Cache>,
    /// The threads that fill sequential streams' spans (`zstream`),
    /// started with the first span; None inside if none could start.
    span_pool: OnceLock<Option<crate::cache::zstream::SpanPool>>,
    pub(crate) config: CacheConfig,
    pub(crate) arc: Arc<LiveArc>,
    /// What `arc_max = auto` resolved to (None with a fixed `arc_max`).
    arc_auto: Option<crate::arc::breathe::ArcAuto>,
    /// The memory watcher of `arc_max = auto`, stopped when the cache is
    /// dropped.
    watcher: OnceLock<crate::arc::breathe::Watcher>,
    pub(crate) datasets: RankedRwLock<Vec<Arc<Dataset>>, { rank::DATASETS }>,
    objects: RankedMutex<FastHashMap<(u32, u64), Arc<ObjectState>>, { rank::OBJECTS }>,
    /// Set once unheld object states were dropped (see `object_state`).
    object_states_dropped: std::sync::atomic::AtomicBool,
    /// Blocks of 2^32 invalidation epochs handed to object states made
    /// after a drop, so no state ever reuses an epoch of an earlier one.
    next_epoch: AtomicU64,
    pub(crate) counters: ReadPathCounters,
    /// The tiers below the ARC, in the order reads try them.
    tiers: tiers::Tiers,
    /// The L2ARC (also the first of `tiers`), once a cache device is
    /// added: its devices are managed here, and read queues read its
    /// records on their own rings.
    l2: OnceLock<Arc<L2Arc>>,
    /// The shared tier (also one of `tiers`, after the L2ARC), once added.
    #[cfg(feature = "object-store")]
    shared: OnceLock<Arc<crate::shared::SharedTier>>,
    invalidations: RankedMutex<Invalidations, { rank::INVALIDATIONS }>,
    /// `invalidations.sequence`, readable without the lock: a fill notes it
    /// before it reads, so a write-back of its record can tell which writes
    /// came after (`Record::fill_sequence`).
    invalidation_sequence: AtomicU64,
    /// How read queues read flash (`l2arc_ioengine`, resolved at start),
    /// and why `auto` fell back to psync, if it did.
    ioengine: (IoEngine, Option<String>),
    /// Latency by tier (see `analytics`).
    pub(crate) analytics: crate::analytics::Analytics,
    /// The L2ARC tunables that change while running (`tunables`), shared
    /// with the L2ARC once it is made.
    pub(crate) tunables: Arc<crate::l2arc::tunables::LiveTunables>,
    /// The ARC's shape saved and restored, and the prewarm (`prewarm`).
    shape: prewarm::ShapeCounters,
}

impl Drop for Cache {
    fn drop(&mut self) {
        // The L2ARC, once made, is the first tier: it is stopped here too.
        debug_assert!(self.l2.get().is_none() || self.tiers.iter().next().is_some());
        for tier in self.tiers.iter() {
            tier.stop();
        }
    }
}

impl Cache {
    /// Builds a cache with no datasets and no cache device.
    pub fn new(config: CacheConfig) -> Result<Arc<Self>, ConfigError> {
        let mut config = config;
        if !(1..=1024).contains(&config.arc_shards) {
            return Err(ConfigError::Shards(config.arc_shards));
        }
        let auto = Self::resolve_arc_max_auto(&mut config)?;
        if config.arc_max_bytes < u64::from(RECORDSIZE_MIN_BYTES) * config.arc_shards as u64 {
            return Err(ConfigError::ArcMax(config.arc_max_bytes));
        }
        let ioengine = config
            .l2arc
            .l2arc_ioengine
            .resolve()
            .map_err(|e| ConfigError::IoEngine(e.to_string()))?;
        assert!(
            (1..=1024).contains(&config.arc_shards)
                && config.arc_max_bytes >= u64::from(RECORDSIZE_MIN_BYTES)
        );
        let live = crate::l2arc::tunables::LiveTunables::from_config(&config.l2arc)
            .map_err(|e| ConfigError::Tunable(e.to_string()))?;
        // Resolved: io_uring or psync, and a reason only for a fallback.
        assert!(ioengine.0 != IoEngine::Auto);
        assert!(ioengine.1.is_none() || ioengine.0 == IoEngine::Psync);
        let arc = Arc::new(LiveArc::new(ArcConfig {
            arc_max_bytes: config.arc_max_bytes,
            shards: config.arc_shards,
            dram_policy: config.dram_policy,
        }));
        let (arc_auto, watcher) = match auto {
            Some(auto) => {
                let (arc_auto, watcher) = Self::start_breathing(&arc, auto)?;
                (Some(arc_auto), Some(watcher))
            }
            None => (None, None),
        };
        let cache = Arc::new_cyclic(|me| Self {
            me: me.clone(),
            span_pool: OnceLock::new(),
            arc,
            arc_auto,
            watcher: OnceLock::new(),
            config,
            datasets: RankedRwLock::new(Vec::new()),
            objects: RankedMutex::new(FastHashMap::default()),
            object_states_dropped: std::sync::atomic::AtomicBool::new(false),
            next_epoch: AtomicU64::new(1),
            counters: ReadPathCounters::default(),
            tiers: tiers::Tiers::default(),
            l2: OnceLock::new(),
            #[cfg(feature = "object-store")]
            shared: OnceLock::new(),
            invalidations: RankedMutex::new(Invalidations::default()),
            invalidation_sequence: AtomicU64::new(0),
            ioengine,
            analytics: crate::analytics::Analytics::default(),
            tunables: Arc::new(live),
            shape: prewarm::ShapeCounters::default(),
        });
        if let Some(w) = watcher {
            let _ = cache.watcher.set(w);
        }
        debug_assert_eq!(cache.arc_auto.is_some(), cache.watcher.get().is_some());
        Ok(cache)
    }

    /// `arc_max = auto`: the ceiling from the host and the memory cgroup,
    /// written into `config.arc_max_bytes` (None with a fixed `arc_max`).
    fn resolve_arc_max_auto(config: &mut CacheConfig) -> Result<Option<AutoResolved>, ConfigError> {
        use crate::arc::breathe::BreatheConfig;
        if config.arc_max_bytes != ARC_MAX_AUTO {
            return Ok(None);
        }
        let mut memory = crate::arc::memory::SystemMemory::open();
        let limits = memory
            .limits()
            .map_err(|e| ConfigError::Memory(e.to_string()))?;
        let floor_bytes = u64::from(RECORDSIZE_MIN_BYTES) * config.arc_shards as u64;
        let breathe = BreatheConfig::resolve(
            limits,
            config.arc_min_bytes,
            config.arc_sys_free_bytes,
            floor_bytes,
        );
        config.arc_max_bytes = breathe.c_max_bytes;
        assert!(config.arc_max_bytes >= floor_bytes);
        Ok(Some((breathe, limits, memory)))
    }

    /// Starts the memory watcher of `arc_max = auto` on `arc`.
    fn start_breathing(
        arc: &Arc<LiveArc>,
        (breathe, limits, memory): AutoResolved,
    ) -> Result<(crate::arc::breathe::ArcAuto, crate::arc::breathe::Watcher), ConfigError> {
        assert_eq!(arc.config().arc_max_bytes, breathe.c_max_bytes);
        arc.set_breathing(breathe);
        let cgroup = memory.cgroup().cloned();
        let watcher = crate::arc::breathe::Watcher::start(
            Arc::clone(arc),
            breathe,
            memory,
            cgroup.as_ref(),
            limits.cgroup_limit_bytes,
        )
        .map_err(|e| ConfigError::Memory(format!("memory watcher: {e}")))?;
        let auto = crate::arc::breathe::ArcAuto {
            breathe,
            limits,
            cgroup,
            unarmed: watcher.unarmed.clone(),
        };
        Ok((auto, watcher))
    }

    /// What `arc_max = auto` resolved to: the ceiling `c_max`, the floor
    /// `arc_min`, `arc_sys_free` and the limits they came from (None with
    /// a fixed `arc_max`).
    pub fn arc_auto(&self) -> Option<&crate::arc::breathe::ArcAuto> {
        debug_assert!(
            self.arc_auto
                .as_ref()
                .is_none_or(|a| a.breathe.c_max_bytes == self.config.arc_max_bytes)
        );
        self.arc_auto.as_ref()
    }

    /// The span fillers of sequential streams, started on first use.
    pub(crate) fn span_pool(&self) -> Option<&crate::cache::zstream::SpanPool> {
        let pool = self
            .span_pool
            .get_or_init(crate::cache::zstream::SpanPool::start)
            .as_ref();
        debug_assert!(self.span_pool.get().is_some(), "started once, kept");
        pool
    }

    /// How read queues read flash: `IoUring` or `Psync`.
    pub fn ioengine(&self) -> IoEngine {
        debug_assert!(self.ioengine.0 != IoEngine::Auto, "resolved at start");
        self.ioengine.0
    }

    /// Why `l2arc_ioengine=auto` fell back to psync, if it did.
    pub fn ioengine_fallback_reason(&self) -> Option<&str> {
        // Only `auto` falls back, and only to psync.
        debug_assert!(self.ioengine.1.is_none() || self.ioengine.0 == IoEngine::Psync);
        self.ioengine.1.as_deref()
    }

    /// Latency histograms by tier and per-dataset counters (see `analytics`).
    pub fn analytics(&self) -> &crate::analytics::Analytics {
        // The cache is only ever reached through the `Arc` `new` made.
        debug_assert!(self.me.strong_count() > 0);
        &self.analytics
    }

    /// `arc_max`: the most DRAM record buffers may take.
    pub fn arc_max_bytes(&self) -> u64 {
        debug_assert_eq!(self.config.arc_max_bytes, self.arc.config().arc_max_bytes);
        self.config.arc_max_bytes
    }

    /// A snapshot of every counter.
    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        let arc = self.arc.stats();
        let stats = CacheStats {
            shape: self.shape_stats(arc.prewarm_joined),
            arc,
            ioengine_uring: self.ioengine() == IoEngine::IoUring,
            arc_max: self.arc.config().arc_max_bytes,
            reads: c.reads.get(),
            read_bytes: c.read_bytes.get(),
            writes: c.writes.get(),
            write_bytes: c.write_bytes.get(),
            primary_reads: c.primary_reads.get(),
            primary_read_bytes: c.primary_read_bytes.get(),
            primary_errors: c.primary_errors.get(),
            primary_stale: c.primary_stale.get(),
            zfetch_hits: c.zfetch_hits.get(),
            zfetch_io_issued: c.zfetch_io_issued.get(),
            l2: self.l2.get().map(|l2| l2.stats()),
            shared: self.tier_kstats(),
        };
        assert_eq!(stats.arc_max, self.config.arc_max_bytes);
        stats
    }

    /// Checks the ARC's invariants (tests; O(entries)).
    #[cfg(any(test, feature = "test-utils"))]
    pub fn assert_consistent(&self) {
        assert_eq!(self.arc.config().arc_max_bytes, self.config.arc_max_bytes);
        assert_eq!(self.arc.config().shards, self.config.arc_shards);
        self.arc.assert_consistent();
    }
}
