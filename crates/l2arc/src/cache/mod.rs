//! The read path: records, generations, and the tiers in order.
//!
//! A read of `(dataset, object, offset, len)` is split into the dataset's
//! records (`recordsize`, 4 KiB to 1 MiB, a power of two, as in ZFS). Each
//! record is looked up in the ARC; a miss claims the record's fill (one read
//! below per record at a time), reads the whole record from primary storage
//! into an aligned buffer, inserts it, and wakes any reader that waited.
//! Whole records are the unit of caching because that is what makes a cache
//! cheap to index; the cost is read amplification on small random reads,
//! which `recordsize` trades off per dataset.
//!
//! Generations. A record is only as good as the object version it was read
//! from. Every object the cache has opened has a shared state with its last
//! known generation (inode, size, mtime) and a token derived from it; records
//! carry the token they were read under, and a hit requires the current one.
//! `open` and `revalidate` compare the primary's generation with the
//! remembered one, so a file rewritten or replaced behind the cache changes
//! the token and every older record turns into a miss at once, with no scan.
//! Writes through the cache go to primary first, then drop the records they
//! touched, then adopt the object's new generation without changing its token:
//! untouched records stay valid. (An outside change that lands between our
//! write and our re-stat is taken for ours: a known, narrow window that every
//! write-through cache over a shared file system shares. `revalidate` keeps
//! out of it: while a write of ours is in that window it leaves a moved
//! generation to the write, so a watcher woken by our own writes never
//! takes them for an outside change.)
//!
//! Reads past the end behave as `pread`: short at the end, empty beyond it.
//!
//! [`Cache::read`] blocks for each record below the ARC; a read queue
//! (`read_queue`) keeps many in flight from one thread, under the same rules.
//!
//! Below the ARC sits the L2ARC (when cache devices are added): a record the
//! ARC misses is looked up there by a hash of (dataset identity, object,
//! record, generation token) before primary storage is read. A feeder thread
//! copies records from the cold ends of the ARC lists to flash. Writes drop
//! the records they touch from both tiers; a feed that raced with a write
//! checks a short log of recent invalidations before it indexes its batch,
//! under the lock the write holds while it drops its records, and leaves out
//! what the write made stale, so a record copied before a write can never be
//! found after it.
//!
//! Locking. What each lock protects, and the one order in which they nest
//! (a thread holding a lock may take only locks below it in this list):
//!
//! 1. `CacheDevice::writer` (one per cache device): the device's header as
//!    last written, its log sequence and sweep mark. Held by a feed for the
//!    whole batch write; nothing else waits on it but removal.
//! 2. `Cache::invalidations`: the log of recent writes. A write holds it
//!    while it drops its records; a feed holds it while it decides which of
//!    its batch to index and indexes them (`WriteGate`), so the two never
//!    interleave.
//! 3. `ObjectState::generation` (one per object): the last generation seen
//!    and the invalidation epoch; the token is derived under it. Beside it,
//!    never around it: `ObjectState::streams` (`zstream`), held by a demand
//!    read while it notes itself and claims its stream's span (ARC lookups,
//!    and its streams' pace locks, below it).
//! 4. Leaves, each held alone and briefly: the L2ARC index shards, the ARC
//!    shards (`LiveArc`), a fill's result slot, the L2ARC's device list
//!    (read-locked to clone device handles out, at times under 1 and 2),
//!    the endurance budget, and the write-back queue of evicted records.
//!
//! Evictions are handed to the L2ARC's write-back (`l2arc::writeback`)
//! after the ARC shard's lock is released: the sink takes `datasets`
//! (read), an index shard and the write-back queue, one at a time.
//!
//! `Cache::datasets` (read-mostly) and `Cache::objects` (the object table)
//! are taken alone, never around another lock. Waits are bounded:
//! a single-flight waiter waits for a read below it that either finishes or
//! fails (primary and device I/O have their own timeouts or none; a hung
//! primary hangs its readers as it would without a cache), and device
//! removal waits for reads in flight on that device only.

mod config;
mod objects;
pub(crate) mod prefetch;
pub(crate) mod properties;
mod queue;
mod read;
mod read_ahead;
mod tiers;
mod view;
mod write;
pub(crate) mod zstream;

pub use config::{
    CacheConfig, CacheMode, ConfigError, DatasetConfig, RECORDSIZE_DEFAULT_BYTES,
    RECORDSIZE_MAX_BYTES, RECORDSIZE_MIN_BYTES, validate_recordsize,
};
pub use objects::{DatasetId, OBJECT_STATES_MAX, ObjectHandle};
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

/// The cache: datasets over primary storage, with the ARC (and, once cache
/// devices are added, the L2ARC) in front.
pub struct Cache {
    /// Itself, for what must outlive a call (spans filled by the pool).
    pub(crate) me: std::sync::Weak<Cache>,
    /// The threads that fill sequential streams' spans (`zstream`),
    /// started with the first span; None inside if none could start.
    span_pool: OnceLock<Option<crate::cache::zstream::SpanPool>>,
    pub(crate) config: CacheConfig,
    pub(crate) arc: LiveArc,
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
}

impl Drop for Cache {
    fn drop(&mut self) {
        for tier in self.tiers.iter() {
            tier.stop();
        }
    }
}

impl Cache {
    /// Builds a cache with no datasets and no cache device.
    pub fn new(config: CacheConfig) -> Result<Arc<Self>, ConfigError> {
        if !(1..=1024).contains(&config.arc_shards) {
            return Err(ConfigError::Shards(config.arc_shards));
        }
        if config.arc_max_bytes < u64::from(RECORDSIZE_MIN_BYTES) * config.arc_shards as u64 {
            return Err(ConfigError::ArcMax(config.arc_max_bytes));
        }
        let ioengine = config
            .l2arc
            .l2arc_ioengine
            .resolve()
            .map_err(|e| ConfigError::IoEngine(e.to_string()))?;
        Ok(Arc::new_cyclic(|me| Self {
            me: me.clone(),
            span_pool: OnceLock::new(),
            arc: LiveArc::new(ArcConfig {
                arc_max_bytes: config.arc_max_bytes,
                shards: config.arc_shards,
                dram_policy: config.dram_policy,
            }),
            config,
            datasets: RankedRwLock::new(Vec::new()),
            objects: RankedMutex::new(FastHashMap::default()),
            object_states_dropped: std::sync::atomic::AtomicBool::new(false),
            next_epoch: AtomicU64::new(1),
            counters: ReadPathCounters::default(),
            tiers: tiers::Tiers::default(),
            l2: OnceLock::new(),
            invalidations: RankedMutex::new(Invalidations::default()),
            invalidation_sequence: AtomicU64::new(0),
            ioengine,
            analytics: crate::analytics::Analytics::default(),
        }))
    }

    /// The span fillers of sequential streams, started on first use.
    pub(crate) fn span_pool(&self) -> Option<&crate::cache::zstream::SpanPool> {
        self.span_pool
            .get_or_init(crate::cache::zstream::SpanPool::start)
            .as_ref()
    }

    /// How read queues read flash: `IoUring` or `Psync`.
    pub fn ioengine(&self) -> IoEngine {
        self.ioengine.0
    }

    /// Why `l2arc_ioengine=auto` fell back to psync, if it did.
    pub fn ioengine_fallback_reason(&self) -> Option<&str> {
        self.ioengine.1.as_deref()
    }

    /// Latency histograms by tier and per-dataset counters (see `analytics`).
    pub fn analytics(&self) -> &crate::analytics::Analytics {
        &self.analytics
    }

    /// `arc_max`: the most DRAM record buffers may take.
    pub fn arc_max_bytes(&self) -> u64 {
        self.config.arc_max_bytes
    }

    /// A snapshot of every counter.
    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        CacheStats {
            arc: self.arc.stats(),
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
        }
    }

    /// Checks the ARC's invariants (tests; O(entries)).
    pub fn assert_consistent(&self) {
        self.arc.assert_consistent();
    }
}
