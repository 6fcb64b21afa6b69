//! The live ARC: the policy with real buffers, shards and single-flight fills.
//!
//! Sharding. One lock around one ARC would serialise every hit. The key space
//! is split by hash into independent ARCs, each with `arc_max / shards` bytes
//! and its own lock, so readers of different records rarely meet. Each shard
//! adapts its own `p`; with a well-mixed hash every shard sees a sample of the
//! same workload, and the hit ratio stays within a fraction of a point of one
//! big ARC (checked on the OLTP trace in the tests).
//!
//! Buffers. A record's bytes live in one page-aligned buffer behind an `Arc`.
//! A hit hands the reader a clone of that `Arc` (no copy); a reader clones
//! only under the shard lock, so under that lock a strong count of one means
//! no reader holds the buffer and eviction may free it. A referenced buffer is
//! skipped by eviction, and an insert that finds nothing evictable is refused,
//! so the bytes the ARC accounts for never exceed `arc_max`.
//!
//! Single flight. A miss registers a fill for its key before it reads below;
//! later readers of the same key wait for that fill instead of issuing their
//! own read, as ZFS does with its hash lock and I/O-in-progress flag. An
//! invalidation (a write) that races with a fill marks the fill doomed and
//! removes it from the table: readers that arrive after the write start a
//! fresh read, and the doomed result is handed to its waiters (who raced with
//! the write) but never inserted.
//!
//! Statistics are plain counters inside each shard, updated under the lock the
//! access already holds, so counting costs no shared atomic on the hit path.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use super::policy::{AccessKind, ArcPolicy, DramPolicy, Evicted, InsertOutcome, ListId};
use crate::buf::AlignedBuf;
use crate::hash::{FastHashMap, hash_one};
use crate::lock_order::{RankedCondvar, RankedMutex, RankedMutexGuard, rank};

/// Identity of one record: the `record`-th `recordsize` block of an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecordKey {
    /// Dataset index within the cache.
    pub dataset: u32,
    /// Object identity within the dataset (the primary's id).
    pub object: u64,
    /// Record number: offset / recordsize.
    pub record: u64,
}

/// A cached record: its bytes and the version of the object they belong to.
#[derive(Debug)]
pub struct Record {
    /// The record's bytes (its length is the record's logical size).
    pub data: AlignedBuf,
    /// Token of the object generation the bytes were read under; a reader
    /// whose object now has another token must not use them.
    pub generation_token: u64,
    /// The cache's invalidation sequence just before the bytes were read:
    /// a write logged after it may have changed them (the L2ARC's
    /// write-back checks this before it indexes the record).
    pub fill_sequence: u64,
}

impl Record {
    /// DRAM the record costs, as the ARC accounts it.
    pub fn size_bytes(&self) -> u64 {
        // Accounted by its whole aligned allocation, never less than used.
        debug_assert!(self.data.len() <= self.data.capacity_bytes());
        self.data.capacity_bytes() as u64
    }
}

/// How a [`LiveArc`] is sized and split.
#[derive(Clone, Copy, Debug)]
pub struct ArcConfig {
    /// `arc_max`: most bytes of record buffers held in DRAM.
    pub arc_max_bytes: u64,
    /// Independent ARCs the key space is split into (1 for exact replay).
    pub shards: usize,
    /// ARC, or plain LRU as a benchmark baseline (see `policy`).
    pub dram_policy: DramPolicy,
}

/// The error a failed fill hands to every reader waiting on it.
#[derive(Clone, Debug)]
pub struct FillError {
    pub kind: io::ErrorKind,
    pub message: String,
}

impl FillError {
    /// The claim was dropped unfilled (`FillClaim`'s drop): nothing went
    /// wrong below, so a waiter looks the record up again (and may claim
    /// it) instead of failing.
    pub fn is_abandoned(&self) -> bool {
        self.kind == ABANDONED_KIND
    }
}

/// The kind of the error an abandoned fill hands its waiters.
const ABANDONED_KIND: io::ErrorKind = io::ErrorKind::Interrupted;

impl From<FillError> for io::Error {
    fn from(e: FillError) -> io::Error {
        io::Error::new(e.kind, e.message)
    }
}

type FillResult = Result<Arc<Record>, FillError>;

/// A read of one record in progress.
pub struct Fill {
    result: RankedMutex<Option<FillResult>, { rank::LEAF }>,
    ready: RankedCondvar,
    doomed: AtomicBool,
    /// Readers blocked in `wait`, changed only under `result`'s lock. Most
    /// fills have none, and `Condvar::notify_all` makes a futex system call
    /// even then: one per miss, about 0.2 µs here (measured).
    waiting: AtomicU32,
    /// The claimant is a prefetch (read-ahead).
    prefetch: bool,
    /// A demand reader waited for this fill: the record goes in as
    /// demanded, not as a prefetch (read and written under the shard's
    /// lock). As OpenZFS does for a demand read that finds a prefetch's
    /// I/O in progress: otherwise read-ahead that runs just ahead of a
    /// sequential reader would leave every record it fetched flagged as
    /// prefetched, which the L2ARC leaves out under `l2arc_noprefetch`.
    demanded: AtomicBool,
    /// The claimant is the prewarm (`claim_prewarm`): a reader that waits
    /// on it is counted (`prewarm_joined`).
    prewarm: bool,
}

impl Fill {
    /// Blocks until the filling reader completes.
    pub fn wait(&self) -> FillResult {
        let mut result = self.result.lock().expect("fill lock poisoned");
        while result.is_none() {
            let before = self.waiting.fetch_add(1, Ordering::Relaxed);
            debug_assert!(before < u32::MAX, "waiters wrapped");
            result = self.ready.wait(result).expect("fill lock poisoned");
            let before = self.waiting.fetch_sub(1, Ordering::Relaxed);
            debug_assert!(before >= 1, "a waiter left that never came");
        }
        result.clone().expect("checked above")
    }

    /// The result if the fill has completed, without waiting.
    pub fn try_result(&self) -> Option<FillResult> {
        self.result.lock().expect("fill lock poisoned").clone()
    }
}

/// What a lookup found.
pub enum Lookup<'a> {
    /// In the ARC: the record, shared.
    Hit(Arc<Record>),
    /// Another reader is filling the record: wait on it.
    InFlight(Arc<Fill>),
    /// This reader must fill the record and [`FillClaim::complete`] it.
    Claimed(FillClaim<'a>),
}

/// The duty to fill one record. Dropping it without completing (a panic, an
/// early return) fails the fill so that waiters are never stranded.
pub struct FillClaim<'a> {
    arc: &'a LiveArc,
    key: RecordKey,
    kind: AccessKind,
    fill: Arc<Fill>,
    completed: bool,
}

impl FillClaim<'_> {
    pub fn key(&self) -> RecordKey {
        // A live claim still has the duty (`complete` and `detach` take it).
        debug_assert!(!self.completed);
        self.key
    }

    /// The fill this claim completes: its result, once published, is the
    /// record (or error) every waiter gets.
    pub(crate) fn fill(&self) -> Arc<Fill> {
        debug_assert!(!self.completed);
        Arc::clone(&self.fill)
    }

    /// Publishes the fill's result: inserts a good record in the ARC (unless
    /// an invalidation doomed it) and wakes every waiter.
    pub fn complete(self, result: io::Result<Arc<Record>>) {
        debug_assert!(!self.completed, "a claim completes once");
        let _ghost_hit = self.complete_noting_ghost(result);
    }

    /// [`Self::complete`], and whether the insert was a ghost hit: the ARC
    /// had seen the record before (it was evicted since), so it goes in as
    /// frequently used (the shared tier's `mfu` admission).
    pub(crate) fn complete_noting_ghost(mut self, result: io::Result<Arc<Record>>) -> bool {
        debug_assert!(!self.completed, "a claim completes once");
        self.completed = true;
        let result = result.map_err(|e| FillError {
            kind: e.kind(),
            message: e.to_string(),
        });
        self.arc
            .complete_fill(self.key, self.kind, &self.fill, result)
    }
}

impl FillClaim<'_> {
    /// The claim without its borrow of the ARC, so that it can move to
    /// another thread with an owner of the ARC (a read-ahead span claimed
    /// on a request thread and filled on a worker). The holder must
    /// [`DetachedClaim::attach`] it to the same ARC again, to complete it
    /// or to drop it (which fails the fill as a dropped claim does).
    pub(crate) fn detach(mut self) -> DetachedClaim {
        debug_assert!(!self.completed);
        self.completed = true; // the detached claim carries the duty
        DetachedClaim {
            key: self.key,
            kind: self.kind,
            fill: Arc::clone(&self.fill),
        }
    }
}

/// A [`FillClaim`] away from its ARC (see [`FillClaim::detach`]).
#[must_use = "attach it to its ARC to complete or drop it: waiters wait until then"]
pub(crate) struct DetachedClaim {
    key: RecordKey,
    kind: AccessKind,
    fill: Arc<Fill>,
}

impl DetachedClaim {
    /// The claim again, on `arc`, which must be the one it was taken from.
    pub(crate) fn attach(self, arc: &LiveArc) -> FillClaim<'_> {
        // The same ARC: the fill registered for the key there is this one,
        // unless a write doomed it (and took it out of the table).
        if cfg!(feature = "invariants") {
            let registered = arc
                .shard(&self.key)
                .fills
                .get(&self.key)
                .is_some_and(|f| Arc::ptr_eq(f, &self.fill));
            assert!(
                registered || self.fill.doomed.load(Ordering::Acquire),
                "a detached claim attached to another ARC"
            );
        }
        FillClaim {
            arc,
            key: self.key,
            kind: self.kind,
            fill: self.fill,
            completed: false,
        }
    }
}

/// Counts an insert's outcome in the shard's stats (ghost hits, inserts
/// refused); returns whether it was a ghost hit.
fn count_insert(stats: &mut ArcStats, outcome: &InsertOutcome) -> bool {
    match *outcome {
        InsertOutcome::Inserted { ghost } | InsertOutcome::NoRoom { ghost } => {
            match ghost {
                Some(ListId::MruGhost) => stats.mru_ghost_hits += 1,
                Some(ListId::MfuGhost) => stats.mfu_ghost_hits += 1,
                _ => {}
            }
            if matches!(outcome, InsertOutcome::NoRoom { .. }) {
                stats.insert_no_room += 1;
            }
            // Only a ghost list remembers a key without its record.
            debug_assert!(ghost.is_none_or(ListId::is_ghost));
            ghost.is_some()
        }
        InsertOutcome::TooLarge => {
            stats.insert_no_room += 1;
            false
        }
    }
}

impl Drop for FillClaim<'_> {
    fn drop(&mut self) {
        if !self.completed {
            let error = FillError {
                kind: ABANDONED_KIND,
                message: "record fill abandoned".into(),
            };
            self.arc
                .complete_fill(self.key, self.kind, &self.fill, Err(error));
        }
        // Either way no waiter is stranded: the fill has its result (a
        // completed claim published it; a detached one carries the duty).
        if cfg!(feature = "invariants") && !self.completed {
            assert!(self.fill.try_result().is_some());
        }
    }
}

/// Counters of one shard, summed by `LiveArc::stats`. Names follow ZFS's
/// arcstats.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct ArcStats {
    /// Reads served from DRAM (`hits` in arcstats).
    pub hits: u64,
    /// Reads not in DRAM.
    pub misses: u64,
    /// Demand reads served from DRAM.
    pub demand_data_hits: u64,
    /// Demand reads not in DRAM.
    pub demand_data_misses: u64,
    /// Prefetch reads served from DRAM.
    pub prefetch_data_hits: u64,
    /// Prefetch reads not in DRAM.
    pub prefetch_data_misses: u64,
    /// Hits on the recency list (MRU).
    pub mru_hits: u64,
    /// Hits on the frequency list (MFU).
    pub mfu_hits: u64,
    /// Misses that found the key in the MRU ghost list (grow `p`).
    pub mru_ghost_hits: u64,
    /// Misses that found the key in the MFU ghost list (shrink `p`).
    pub mfu_ghost_hits: u64,
    /// Reads that found the record's fill in flight and waited for it.
    pub iohits: u64,
    /// Demand reads that found a prefetch's fill in flight (arcstats
    /// `demand_iohit_predictive_prefetch`): the record goes in as demanded.
    pub demand_iohit_predictive_prefetch: u64,
    /// Hits on a record whose object changed since it was read: dropped.
    pub stale_drops: u64,
    /// Records evicted from the MRU list (a count, not bytes).
    pub evicted_mru: u64,
    /// Records evicted from the MFU list (a count, not bytes).
    pub evicted_mfu: u64,
    /// Inserts refused because every eviction candidate was referenced.
    pub insert_no_room: u64,
    /// Records dropped by writes and explicit invalidation.
    pub invalidated: u64,
    /// Bytes of records in DRAM (arcstats `size`).
    pub size: u64,
    /// Target size `c`, bytes.
    pub c: u64,
    /// Target size of the MRU side `p`, bytes.
    pub p: u64,
    /// Bytes on the MRU list.
    pub mru_size: u64,
    /// Bytes on the MFU list.
    pub mfu_size: u64,
    /// Bytes remembered by the MRU ghost list (no data).
    pub mru_ghost_size: u64,
    /// Bytes remembered by the MFU ghost list (no data).
    pub mfu_ghost_size: u64,
    /// Records in DRAM.
    pub entries: u64,
    /// `c_min` (`arc_min`): the least `c` (= `arc_max` when fixed).
    pub c_min: u64,
    /// `c_max`: the most `c` (`arc_max`, or its ceiling when auto).
    pub c_max: u64,
    /// `arc_no_grow`: 1 while `c` may not grow (memory short lately).
    pub arc_no_grow: u64,
    /// Samples that found free memory under `arc_sys_free`.
    pub memory_throttle_count: u64,
    /// Memory free at the last sample (host or cgroup, the lesser).
    pub memory_available_bytes: u64,
    /// `arc_sys_free`: memory kept free for others (0 when fixed).
    pub arc_sys_free: u64,
    /// Shrinks of `c` for want of memory.
    pub arc_shrinks: u64,
    /// Bytes those shrinks evicted.
    pub arc_shrunk_bytes: u64,
    /// Reads that found a prewarm's read of their record in flight and
    /// waited for it (listed as `arc_prewarm_joined` by `CacheStats`).
    pub prewarm_joined: u64,
}

impl ArcStats {
    fn add(&mut self, o: &ArcStats) {
        // Each access counts once by kind and once by list (a shard's).
        debug_assert_eq!(o.hits, o.demand_data_hits + o.prefetch_data_hits);
        debug_assert_eq!(o.hits, o.mru_hits + o.mfu_hits);
        debug_assert_eq!(o.misses, o.demand_data_misses + o.prefetch_data_misses);
        debug_assert!(o.size <= o.c, "shard holds {} > c {}", o.size, o.c);
        debug_assert!(o.p <= o.c);
        self.hits += o.hits;
        self.misses += o.misses;
        self.demand_data_hits += o.demand_data_hits;
        self.demand_data_misses += o.demand_data_misses;
        self.prefetch_data_hits += o.prefetch_data_hits;
        self.prefetch_data_misses += o.prefetch_data_misses;
        self.mru_hits += o.mru_hits;
        self.mfu_hits += o.mfu_hits;
        self.mru_ghost_hits += o.mru_ghost_hits;
        self.mfu_ghost_hits += o.mfu_ghost_hits;
        self.iohits += o.iohits;
        self.demand_iohit_predictive_prefetch += o.demand_iohit_predictive_prefetch;
        self.stale_drops += o.stale_drops;
        self.evicted_mru += o.evicted_mru;
        self.evicted_mfu += o.evicted_mfu;
        self.insert_no_room += o.insert_no_room;
        self.invalidated += o.invalidated;
        self.size += o.size;
        self.c += o.c;
        self.p += o.p;
        self.mru_size += o.mru_size;
        self.mfu_size += o.mfu_size;
        self.mru_ghost_size += o.mru_ghost_size;
        self.mfu_ghost_size += o.mfu_ghost_size;
        self.entries += o.entries;
        self.prewarm_joined += o.prewarm_joined;
    }

    /// `(name, value)` pairs in arcstats order, for printing and export.
    pub fn kstats(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("hits", self.hits),
            ("misses", self.misses),
            ("demand_data_hits", self.demand_data_hits),
            ("demand_data_misses", self.demand_data_misses),
            ("prefetch_data_hits", self.prefetch_data_hits),
            ("prefetch_data_misses", self.prefetch_data_misses),
            ("mru_hits", self.mru_hits),
            ("mfu_hits", self.mfu_hits),
            ("mru_ghost_hits", self.mru_ghost_hits),
            ("mfu_ghost_hits", self.mfu_ghost_hits),
            ("iohits", self.iohits),
            (
                "demand_iohit_predictive_prefetch",
                self.demand_iohit_predictive_prefetch,
            ),
            ("stale_drops", self.stale_drops),
            ("evict_mru", self.evicted_mru),
            ("evict_mfu", self.evicted_mfu),
            ("insert_no_room", self.insert_no_room),
            ("invalidated", self.invalidated),
            ("size", self.size),
            ("c", self.c),
            ("p", self.p),
            ("mru_size", self.mru_size),
            ("mfu_size", self.mfu_size),
            ("mru_ghost_size", self.mru_ghost_size),
            ("mfu_ghost_size", self.mfu_ghost_size),
            ("entries", self.entries),
            ("c_min", self.c_min),
            ("arc_no_grow", self.arc_no_grow),
            ("memory_throttle_count", self.memory_throttle_count),
            ("memory_available_bytes", self.memory_available_bytes),
            ("arc_sys_free", self.arc_sys_free),
            ("arc_shrinks", self.arc_shrinks),
            ("arc_shrunk_bytes", self.arc_shrunk_bytes),
        ]
    }
}

/// One entry of a shard's shape (`LiveArc::shape_of_shard`).
#[derive(Clone, Copy, Debug)]
pub struct ShapeEntry {
    /// The record.
    pub key: RecordKey,
    /// DRAM it takes (or took, for a ghost).
    pub size_bytes: u64,
    /// Brought in by read-ahead and not yet demanded.
    pub prefetched: bool,
    /// The resident record's generation token (0 for a ghost).
    pub token: u64,
}

/// A shard's `p`, `c` and lists (MRU, MFU, MRU ghost, MFU ghost), each hot
/// to cold.
#[derive(Clone, Debug, Default)]
pub struct ShardShape {
    /// `p`.
    pub p_bytes: u64,
    /// `c`.
    pub c_bytes: u64,
    /// By `ListId`.
    pub lists: [Vec<ShapeEntry>; 4],
}

/// The prewarm's duty to fill one record (`LiveArc::claim_prewarm`).
/// Dropped without completing, it fails the fill as abandoned (waiters look
/// again and read for themselves).
pub struct PrewarmClaim<'a> {
    arc: &'a LiveArc,
    key: RecordKey,
    fill: Arc<Fill>,
    completed: bool,
}

impl PrewarmClaim<'_> {
    /// The record claimed.
    pub fn key(&self) -> RecordKey {
        debug_assert!(!self.completed);
        self.key
    }

    /// Publishes the read (`None`: no copy on flash): see
    /// `LiveArc::complete_prewarm`. True if the record went in.
    pub fn complete(mut self, record: Option<Arc<Record>>, list: ListId, prefetched: bool) -> bool {
        debug_assert!(!self.completed, "a claim completes once");
        self.completed = true;
        self.arc
            .complete_prewarm(self.key, &self.fill, record, list, prefetched)
    }
}

impl Drop for PrewarmClaim<'_> {
    fn drop(&mut self) {
        if !self.completed {
            self.completed = true;
            self.arc
                .complete_prewarm(self.key, &self.fill, None, ListId::Mru, false);
        }
        debug_assert!(self.fill.try_result().is_some(), "no waiter is stranded");
    }
}

struct Shard {
    policy: ArcPolicy<RecordKey, Arc<Record>>,
    fills: FastHashMap<RecordKey, Arc<Fill>>,
    /// Reused by every insert so eviction allocates nothing.
    evicted: Vec<Evicted<RecordKey, Arc<Record>>>,
    stats: ArcStats,
}

/// After an insert: ARC bytes <= arc_max, since the shard holds at most its
/// share (the shares sum to at most arc_max, `LiveArc::new`) whatever came
/// of the insert; and a record inserted is resident.
fn assert_inserted(shard: &Shard, key: &RecordKey, record: &Arc<Record>, outcome: &InsertOutcome) {
    assert!(
        shard.policy.resident_bytes() <= shard.policy.capacity_bytes(),
        "shard holds {} bytes over its {}",
        shard.policy.resident_bytes(),
        shard.policy.capacity_bytes()
    );
    debug_assert!(
        !matches!(outcome, InsertOutcome::Inserted { .. })
            || shard
                .policy
                .peek(key)
                .is_some_and(|r| Arc::ptr_eq(r, record))
    );
    if cfg!(feature = "invariants") {
        shard.policy.assert_bounds();
    }
}

/// Keeps each shard's lock on its own cache lines.
#[repr(align(128))]
struct PaddedShard(RankedMutex<Shard, { rank::LEAF }>);

/// Takes the records the ARC lets go (the L2ARC's write-back): called with
/// each batch of evictions outside the shard's lock.
pub trait EvictionSink: Send + Sync {
    fn evicted(&self, records: &mut dyn Iterator<Item = Evicted<RecordKey, Arc<Record>>>);
}

/// Evictions of one insert, moved out of the shard to be handed over (and
/// their buffers freed) after its lock is released.
type EvictedBatch = smallvec::SmallVec<[Evicted<RecordKey, Arc<Record>>; 4]>;

/// The DRAM tier: record buffers under the ARC policy, in independent shards.
pub struct LiveArc {
    shards: Box<[PaddedShard]>,
    config: ArcConfig,
    sink: std::sync::OnceLock<Box<dyn EvictionSink>>,
    /// The breathing ARC's bounds and counters (`breathe`).
    memory: super::memory::MemoryCounters,
}

/// Most bytes one shard evicts under its lock in one step of a shrink, so
/// that readers of the shard wait for a bounded eviction, not a whole one.
const SHRINK_STEP_BYTES: u64 = 16 << 20;

impl LiveArc {
    /// An empty ARC.
    pub fn new(config: ArcConfig) -> Self {
        assert!(config.shards >= 1, "at least one shard");
        assert!(
            config.arc_max_bytes >= config.shards as u64,
            "arc_max too small for {} shards",
            config.shards
        );
        let shard_bytes = config.arc_max_bytes / config.shards as u64;
        // The shards' capacities sum to at most arc_max (the remainder of
        // the division is never used): the bound every insert keeps.
        assert!(shard_bytes >= 1 && shard_bytes * config.shards as u64 <= config.arc_max_bytes);
        let shards = (0..config.shards)
            .map(|_| {
                PaddedShard(RankedMutex::new(Shard {
                    policy: ArcPolicy::with_policy(shard_bytes, config.dram_policy),
                    fills: FastHashMap::default(),
                    evicted: Vec::with_capacity(16),
                    stats: ArcStats::default(),
                }))
            })
            .collect();
        let memory = super::memory::MemoryCounters::default();
        memory.c_min.store(config.arc_max_bytes, Ordering::Relaxed);
        memory.c_max.store(config.arc_max_bytes, Ordering::Relaxed);
        Self {
            shards,
            config,
            sink: std::sync::OnceLock::new(),
            memory,
        }
    }

    /// The breathing ARC's counters (`breathe::apply` updates them).
    pub(crate) fn memory_counters(&self) -> &super::memory::MemoryCounters {
        debug_assert!(self.memory.c_max.load(Ordering::Relaxed) <= self.config.arc_max_bytes);
        &self.memory
    }

    /// Records the bounds `c` breathes within (`arc_max = auto`).
    pub fn set_breathing(&self, config: super::memory::BreatheConfig) {
        assert!(config.c_max_bytes <= self.config.arc_max_bytes);
        assert!(config.c_min_bytes <= config.c_max_bytes);
        let m = &self.memory;
        m.c_min.store(config.c_min_bytes, Ordering::Relaxed);
        m.c_max.store(config.c_max_bytes, Ordering::Relaxed);
        m.arc_sys_free
            .store(config.arc_sys_free_bytes, Ordering::Relaxed);
    }

    /// Sets the target `c` (summed over the shards, each taking an equal
    /// share) to `target_bytes`, within [one record per shard, `arc_max`].
    /// A shrink evicts, a step of at most `SHRINK_STEP_BYTES` per shard
    /// under its lock at a time, and hands what it evicted to the eviction
    /// sink as any eviction (so the L2ARC's write-back sees it first).
    /// Referenced records stay, and their shard's `c` with them. Returns
    /// the bytes evicted.
    pub fn set_target_bytes(&self, target_bytes: u64) -> u64 {
        let shards = self.shards.len() as u64;
        let share = (target_bytes.min(self.config.arc_max_bytes) / shards).max(1);
        assert!(share * shards <= self.config.arc_max_bytes);
        let mut evicted_bytes = 0u64;
        let mut batch = Vec::new();
        for padded in self.shards.iter() {
            loop {
                let done = {
                    let mut guard = padded.0.lock().expect("ARC shard lock poisoned");
                    let shard = &mut *guard;
                    let resident = shard.policy.resident_bytes();
                    let step = share.max(resident.saturating_sub(SHRINK_STEP_BYTES));
                    let set = shard.policy.set_capacity(
                        step,
                        |_, buffer| Arc::strong_count(buffer) == 1,
                        &mut shard.evicted,
                    );
                    for record in shard.evicted.drain(..) {
                        match record.from {
                            ListId::Mfu => shard.stats.evicted_mfu += 1,
                            _ => shard.stats.evicted_mru += 1,
                        }
                        evicted_bytes += record.size_bytes;
                        batch.push(record);
                    }
                    debug_assert!(shard.policy.resident_bytes() <= set);
                    // Done at the share, or stuck above it (referenced records).
                    step == share || set > step
                };
                if !batch.is_empty() {
                    match self.sink.get() {
                        Some(sink) => sink.evicted(&mut batch.drain(..)),
                        None => batch.clear(),
                    }
                }
                if done {
                    break;
                }
            }
        }
        evicted_bytes
    }

    /// Sets where evicted records go (once; later calls are ignored).
    pub fn set_eviction_sink(&self, sink: Box<dyn EvictionSink>) {
        let _ = self.sink.set(sink);
        debug_assert!(self.sink.get().is_some());
    }

    /// The configuration it was built with.
    pub fn config(&self) -> ArcConfig {
        debug_assert_eq!(self.shards.len(), self.config.shards);
        self.config
    }

    fn shard(&self, key: &RecordKey) -> RankedMutexGuard<'_, Shard, { rank::LEAF }> {
        let hash = hash_one(key);
        // Multiply-high maps the hash onto [0, shards) without a division.
        let index = (((hash >> 32) * self.shards.len() as u64) >> 32) as usize;
        debug_assert!(index < self.shards.len());
        self.shards[index]
            .0
            .lock()
            .expect("ARC shard lock poisoned")
    }

    /// A demand hit that is not a new access: the record if it is resident
    /// under `token`, counted as a demand hit, with the policy's lists left
    /// as they are (no refresh, no promotion to MFU). For a reader that
    /// reads on within the record its previous read ended in: one reader
    /// crossing a record in several reads uses it once, it does not reuse it
    /// (ZFS's `ARC_MINTIME` makes the same call by time).
    pub fn peek_hit(&self, key: RecordKey, token: u64) -> Option<Arc<Record>> {
        let mut guard = self.shard(&key);
        let shard = &mut *guard;
        let record = shard
            .policy
            .peek(&key)
            .filter(|r| r.generation_token == token)
            .map(Arc::clone)?;
        let list = shard.policy.list_of(&key);
        // A record with a value is on a resident list, never a ghost.
        debug_assert!(matches!(list, Some(ListId::Mru | ListId::Mfu)));
        let stats = &mut shard.stats;
        stats.hits += 1;
        stats.demand_data_hits += 1;
        match list {
            Some(ListId::Mfu) => stats.mfu_hits += 1,
            _ => stats.mru_hits += 1,
        }
        Some(record)
    }

    /// Whether a record is resident under `token` (not merely being
    /// filled): no statistics, no change to the policy's lists.
    pub fn resident(&self, key: RecordKey, token: u64) -> bool {
        let guard = self.shard(&key);
        let resident = guard
            .policy
            .peek(&key)
            .is_some_and(|r| r.generation_token == token);
        debug_assert!(!resident || guard.policy.list_of(&key).is_some_and(|l| !l.is_ghost()));
        resident
    }

    /// Whether a record is resident under `token` or being filled: no
    /// statistics, no change to the policy's lists.
    pub fn holds(&self, key: RecordKey, token: u64) -> bool {
        let guard = self.shard(&key);
        // Resident bytes within the shard's share of arc_max.
        debug_assert!(guard.policy.resident_bytes() <= guard.policy.capacity_bytes());
        guard
            .policy
            .peek(&key)
            .is_some_and(|r| r.generation_token == token)
            || guard.fills.contains_key(&key)
    }

    /// Looks a record up for a reader of an object whose current generation
    /// token is `token`.
    pub fn lookup(&self, key: RecordKey, token: u64, kind: AccessKind) -> Lookup<'_> {
        let found = self
            .lookup_or_claim(key, token, kind, true)
            .expect("a claiming lookup always finds something to return");
        debug_assert!(!matches!(&found, Lookup::Claimed(c) if c.key != key));
        found
    }

    /// As [`Self::lookup`], but a record that is neither resident nor being
    /// filled is `None`: nothing is claimed and no miss counted (the caller
    /// serves the read another way, or looks up again with a claim).
    pub fn lookup_resident(
        &self,
        key: RecordKey,
        token: u64,
        kind: AccessKind,
    ) -> Option<Lookup<'_>> {
        let found = self.lookup_or_claim(key, token, kind, false);
        // Negative space: a lookup that may not claim never claims.
        debug_assert!(!matches!(found, Some(Lookup::Claimed(_))));
        found
    }

    /// Counts a miss that was served without a fill (see
    /// [`Self::lookup_resident`]).
    pub fn note_miss(&self, key: RecordKey, kind: AccessKind) {
        let mut guard = self.shard(&key);
        let stats = &mut guard.stats;
        stats.misses += 1;
        match kind {
            AccessKind::Demand => stats.demand_data_misses += 1,
            AccessKind::Prefetch => stats.prefetch_data_misses += 1,
        }
        debug_assert_eq!(
            stats.misses,
            stats.demand_data_misses + stats.prefetch_data_misses
        );
    }

    fn lookup_or_claim(
        &self,
        key: RecordKey,
        token: u64,
        kind: AccessKind,
        claim: bool,
    ) -> Option<Lookup<'_>> {
        let mut guard = self.shard(&key);
        let shard = &mut *guard;
        match shard.policy.get(&key, kind) {
            Some((record, hit)) if record.generation_token == token => {
                let record = Arc::clone(record);
                let stats = &mut shard.stats;
                stats.hits += 1;
                match kind {
                    AccessKind::Demand => stats.demand_data_hits += 1,
                    AccessKind::Prefetch => stats.prefetch_data_hits += 1,
                }
                match hit.list {
                    ListId::Mfu => stats.mfu_hits += 1,
                    _ => stats.mru_hits += 1,
                }
                debug_assert_eq!(stats.hits, stats.mru_hits + stats.mfu_hits);
                return Some(Lookup::Hit(record));
            }
            Some(_) => {
                shard.policy.remove(&key);
                shard.stats.stale_drops += 1;
            }
            None => {}
        }
        if let Some(fill) = shard.fills.get(&key) {
            shard.stats.iohits += 1;
            if fill.prewarm {
                shard.stats.prewarm_joined += 1;
            }
            if kind == AccessKind::Demand && fill.prefetch {
                fill.demanded.store(true, Ordering::Relaxed);
                shard.stats.demand_iohit_predictive_prefetch += 1;
            }
            return Some(Lookup::InFlight(Arc::clone(fill)));
        }
        if !claim {
            return None;
        }
        shard.stats.misses += 1;
        match kind {
            AccessKind::Demand => shard.stats.demand_data_misses += 1,
            AccessKind::Prefetch => shard.stats.prefetch_data_misses += 1,
        }
        let fill = Arc::new(Fill {
            result: RankedMutex::new(None),
            ready: RankedCondvar::new(),
            doomed: AtomicBool::new(false),
            waiting: AtomicU32::new(0),
            prefetch: kind == AccessKind::Prefetch,
            demanded: AtomicBool::new(false),
            prewarm: false,
        });
        let raced = shard.fills.insert(key, Arc::clone(&fill));
        // Single flight: one fill per key (a second reader waits on it).
        debug_assert!(raced.is_none(), "two fills of one record");
        Some(Lookup::Claimed(FillClaim {
            arc: self,
            key,
            kind,
            fill,
            completed: false,
        }))
    }

    fn complete_fill(
        &self,
        key: RecordKey,
        kind: AccessKind,
        fill: &Arc<Fill>,
        result: FillResult,
    ) -> bool {
        let mut evicted = EvictedBatch::new();
        let mut ghost_hit = false;
        {
            let mut guard = self.shard(&key);
            let shard = &mut *guard;
            if shard.fills.get(&key).is_some_and(|f| Arc::ptr_eq(f, fill)) {
                shard.fills.remove(&key);
            }
            if let Ok(record) = &result
                && !fill.doomed.load(Ordering::Acquire)
            {
                let kind = if fill.demanded.load(Ordering::Relaxed) {
                    AccessKind::Demand
                } else {
                    kind
                };
                let outcome = shard.policy.insert(
                    key,
                    record.size_bytes(),
                    Arc::clone(record),
                    kind,
                    |_, buffer| Arc::strong_count(buffer) == 1,
                    &mut shard.evicted,
                );
                assert_inserted(shard, &key, record, &outcome);
                let stats = &mut shard.stats;
                ghost_hit = count_insert(stats, &outcome);
                if !matches!(outcome, InsertOutcome::Inserted { .. }) {
                    // Refused (every eviction candidate is being read): the
                    // ARC lets go of it at once, and the L2ARC's write-back
                    // must see it as it sees an eviction, or a burst of
                    // readers holding records would keep those it turns
                    // away off flash for good.
                    evicted.push(Evicted {
                        key,
                        value: Arc::clone(record),
                        size_bytes: record.size_bytes(),
                        from: ListId::Mru,
                        prefetched: kind == AccessKind::Prefetch,
                    });
                }
                for record in shard.evicted.drain(..) {
                    match record.from {
                        ListId::Mfu => stats.evicted_mfu += 1,
                        _ => stats.evicted_mru += 1,
                    }
                    evicted.push(record);
                }
            }
        }
        if !evicted.is_empty()
            && let Some(sink) = self.sink.get()
        {
            sink.evicted(&mut evicted.drain(..));
        }
        // A waiter registers under the lock before it sleeps, so one that
        // is not counted here will find the result when it takes the lock.
        let waiting = {
            let mut slot = fill.result.lock().expect("fill lock poisoned");
            assert!(slot.is_none(), "a fill completes once");
            *slot = Some(result);
            fill.waiting.load(Ordering::Relaxed) != 0
        };
        if waiting {
            fill.ready.notify_all();
        }
        ghost_hit
    }

    /// Drops a record and dooms any fill of it in flight: after this returns,
    /// no reader gets bytes read before the call from this cache.
    pub fn invalidate(&self, key: RecordKey) {
        let mut guard = self.shard(&key);
        let shard = &mut *guard;
        if shard.policy.remove(&key).is_some() {
            shard.stats.invalidated += 1;
        }
        if let Some(fill) = shard.fills.remove(&key) {
            fill.doomed.store(true, Ordering::Release);
        }
        // Postcondition: nothing of the record is left to find.
        debug_assert!(shard.policy.peek(&key).is_none() && !shard.fills.contains_key(&key));
    }

    /// Records near the eviction end of `list` in every shard, up to
    /// `bytes_per_shard` deep, coldest first: the L2ARC feeder's candidates.
    /// Each comes with its prefetch flag. The buffers are not copied, and
    /// not held either: a record referenced cannot be evicted, and a whole
    /// scan held while the feeder copies it one record at a time could fill
    /// a shard with records it cannot evict, refusing every insert
    /// meanwhile. The feeder upgrades one at a time; a record evicted
    /// since is gone (and on its way to the L2ARC by the write-back path).
    pub fn feed_candidates(
        &self,
        list: ListId,
        bytes_per_shard: u64,
        out: &mut Vec<(RecordKey, std::sync::Weak<Record>, bool)>,
    ) {
        for shard in self.shards.iter() {
            let shard = shard.0.lock().expect("ARC shard lock poisoned");
            let mut scanned_bytes = 0u64;
            let mut found = 0u64;
            for (key, size_bytes, record, prefetched) in shard.policy.iter_from_cold_end(list) {
                if scanned_bytes >= bytes_per_shard {
                    break;
                }
                scanned_bytes += size_bytes;
                found += 1;
                out.push((*key, Arc::downgrade(record), prefetched));
            }
            // Only resident records, each once, of the one list.
            debug_assert!(found <= shard.policy.list_len(list));
        }
    }

    /// Every resident record of `list`, hottest first: each shard's list
    /// from its most recently used end, the shards taken in turn (record
    /// 0 of each shard, then record 1 of each, ...), so that the order
    /// approximates one ARC's recency without a timestamp per record. Held
    /// weakly, as [`Self::feed_candidates`] does, and for the same reason.
    /// The stop flush's candidates: O(records), one shard locked at a time.
    pub fn resident_hot_first(
        &self,
        list: ListId,
        out: &mut Vec<(RecordKey, std::sync::Weak<Record>, bool)>,
    ) {
        debug_assert!(matches!(list, ListId::Mru | ListId::Mfu));
        type Candidate = (RecordKey, std::sync::Weak<Record>, bool);
        let per_shard: Vec<Vec<Candidate>> = self
            .shards
            .iter()
            .map(|shard| {
                let shard = shard.0.lock().expect("ARC shard lock poisoned");
                let mut records = Vec::with_capacity(shard.policy.list_len(list) as usize);
                for (key, _, record, prefetched) in shard.policy.iter_from_hot_end(list) {
                    records.push((*key, Arc::downgrade(record), prefetched));
                }
                records
            })
            .collect();
        let before = out.len();
        let total: usize = per_shard.iter().map(Vec::len).sum();
        out.reserve(total);
        let mut shards: Vec<std::vec::IntoIter<Candidate>> =
            per_shard.into_iter().map(Vec::into_iter).collect();
        while !shards.is_empty() {
            shards.retain_mut(|records| match records.next() {
                Some(candidate) => {
                    out.push(candidate);
                    true
                }
                None => false,
            });
        }
        // Every record of every shard's list, each once.
        debug_assert_eq!(out.len() - before, total);
    }

    /// Shards the key space is split into.
    pub fn shard_count(&self) -> usize {
        debug_assert_eq!(self.shards.len(), self.config.shards);
        self.shards.len()
    }

    /// One shard's shape (see `arc::shape`): `p`, `c` and every list's
    /// entries hot to cold, copied out under the shard's lock (keys, sizes,
    /// flags and tokens only: nothing is encoded or written under it).
    pub fn shape_of_shard(&self, shard: usize, out: &mut ShardShape) {
        assert!(shard < self.shards.len());
        let guard = self.shards[shard]
            .0
            .lock()
            .expect("ARC shard lock poisoned");
        let policy = &guard.policy;
        out.p_bytes = policy.target_mru_bytes();
        out.c_bytes = policy.capacity_bytes();
        for list in ListId::ALL {
            let entries = &mut out.lists[list as usize];
            entries.clear();
            entries.reserve(policy.list_len(list) as usize);
            entries.extend(policy.iter_entries_from_hot_end(list).map(
                |(key, size_bytes, record, prefetched)| ShapeEntry {
                    key: *key,
                    size_bytes,
                    prefetched,
                    token: record.map_or(0, |r| r.generation_token),
                },
            ));
            debug_assert_eq!(entries.len() as u64, policy.list_len(list));
        }
    }

    /// Which shard a key lives in.
    pub fn shard_of(&self, key: &RecordKey) -> usize {
        let hash = hash_one(key);
        let index = (((hash >> 32) * self.shards.len() as u64) >> 32) as usize;
        debug_assert!(index < self.shards.len());
        index
    }

    /// Sets one shard's `p` (a restored shape's; clipped to its `c`).
    pub fn restore_target_mru_bytes(&self, shard: usize, target_mru_bytes: u64) {
        assert!(shard < self.shards.len());
        let mut guard = self.shards[shard]
            .0
            .lock()
            .expect("ARC shard lock poisoned");
        guard.policy.set_target_mru_bytes(target_mru_bytes);
        debug_assert!(guard.policy.target_mru_bytes() <= guard.policy.capacity_bytes());
    }

    /// Appends a restored ghost at the cold end of its list, within the
    /// directory bounds (false: refused or known already).
    pub fn restore_ghost(&self, key: RecordKey, size_bytes: u64, list: ListId) -> bool {
        debug_assert!(list.is_ghost());
        let mut guard = self.shard(&key);
        guard.policy.push_ghost_cold(key, size_bytes, list)
    }

    /// Claims a record for the prewarm: `None` if it is resident already
    /// (under any token: a demand read got there first) or being filled.
    /// The claim is a fill like any other, so that a demand read of the
    /// record waits for this one read (single flight), and a record the
    /// prewarm has not reached is claimed by its reader as usual.
    pub fn claim_prewarm(&self, key: RecordKey) -> Option<PrewarmClaim<'_>> {
        let mut guard = self.shard(&key);
        let shard = &mut *guard;
        if shard.policy.peek(&key).is_some() || shard.fills.contains_key(&key) {
            return None;
        }
        let fill = Arc::new(Fill {
            result: RankedMutex::new(None),
            ready: RankedCondvar::new(),
            doomed: AtomicBool::new(false),
            waiting: AtomicU32::new(0),
            prefetch: false,
            demanded: AtomicBool::new(false),
            prewarm: true,
        });
        let raced = shard.fills.insert(key, Arc::clone(&fill));
        debug_assert!(raced.is_none(), "two fills of one record");
        Some(PrewarmClaim {
            arc: self,
            key,
            fill,
            completed: false,
        })
    }

    /// Publishes a prewarm's read: the record (if any, and unless a write
    /// doomed the fill) goes in at the cold end of `list` if it fits under
    /// `c` as the shard is; waiters get it, or look again if there is none
    /// (an abandoned fill). True if it was inserted.
    fn complete_prewarm(
        &self,
        key: RecordKey,
        fill: &Arc<Fill>,
        record: Option<Arc<Record>>,
        list: ListId,
        prefetched: bool,
    ) -> bool {
        let inserted = {
            let mut guard = self.shard(&key);
            let shard = &mut *guard;
            if shard.fills.get(&key).is_some_and(|f| Arc::ptr_eq(f, fill)) {
                shard.fills.remove(&key);
            }
            let inserted = match &record {
                Some(record) if !fill.doomed.load(Ordering::Acquire) => shard.policy.insert_cold(
                    key,
                    record.size_bytes(),
                    Arc::clone(record),
                    list,
                    prefetched,
                ),
                _ => false,
            };
            assert!(shard.policy.resident_bytes() <= shard.policy.capacity_bytes());
            inserted
        };
        let result = record.ok_or_else(|| FillError {
            kind: ABANDONED_KIND,
            message: "prewarm found no copy on flash".into(),
        });
        let waiting = {
            let mut slot = fill.result.lock().expect("fill lock poisoned");
            assert!(slot.is_none(), "a fill completes once");
            *slot = Some(result);
            fill.waiting.load(Ordering::Relaxed) != 0
        };
        if waiting {
            fill.ready.notify_all();
        }
        inserted
    }

    /// Sums the counters and sizes of every shard.
    pub fn stats(&self) -> ArcStats {
        let mut total = ArcStats::default();
        for shard in self.shards.iter() {
            let shard = shard.0.lock().expect("ARC shard lock poisoned");
            let mut s = shard.stats;
            let policy = &shard.policy;
            s.size = policy.resident_bytes();
            s.c = policy.capacity_bytes();
            s.p = policy.target_mru_bytes();
            s.mru_size = policy.list_bytes(ListId::Mru);
            s.mfu_size = policy.list_bytes(ListId::Mfu);
            s.mru_ghost_size = policy.list_bytes(ListId::MruGhost);
            s.mfu_ghost_size = policy.list_bytes(ListId::MfuGhost);
            s.entries = policy.resident_len();
            total.add(&s);
        }
        let m = &self.memory;
        total.c_min = m.c_min.load(Ordering::Relaxed);
        total.c_max = m.c_max.load(Ordering::Relaxed);
        total.arc_no_grow = m.arc_no_grow.load(Ordering::Relaxed);
        total.memory_throttle_count = m.memory_throttle_count.load(Ordering::Relaxed);
        total.memory_available_bytes = m.memory_available_bytes.load(Ordering::Relaxed);
        total.arc_sys_free = m.arc_sys_free.load(Ordering::Relaxed);
        total.arc_shrinks = m.arc_shrinks.load(Ordering::Relaxed);
        total.arc_shrunk_bytes = m.arc_shrunk_bytes.load(Ordering::Relaxed);
        assert!(
            total.c <= self.config.arc_max_bytes,
            "c {} over arc_max",
            total.c
        );
        // The ARC's bound: record bytes in DRAM never exceed arc_max.
        assert!(
            total.size <= self.config.arc_max_bytes,
            "ARC holds {} bytes over arc_max {}",
            total.size,
            self.config.arc_max_bytes
        );
        total
    }

    /// Checks every shard's policy invariants (for tests; O(entries)).
    pub fn assert_consistent(&self) {
        let mut resident_bytes = 0;
        for shard in self.shards.iter() {
            let shard = shard.0.lock().expect("ARC shard lock poisoned");
            shard.policy.assert_consistent();
            resident_bytes += shard.policy.resident_bytes();
        }
        assert!(resident_bytes <= self.config.arc_max_bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(byte: u8, len: usize, token: u64) -> Arc<Record> {
        let mut data = AlignedBuf::zeroed(len);
        data.as_mut_slice().fill(byte);
        Arc::new(Record {
            data,
            generation_token: token,
            fill_sequence: 0,
        })
    }

    fn key(record: u64) -> RecordKey {
        RecordKey {
            dataset: 0,
            object: 1,
            record,
        }
    }

    fn fill(arc: &LiveArc, k: RecordKey, token: u64, byte: u8) -> Arc<Record> {
        match arc.lookup(k, token, AccessKind::Demand) {
            Lookup::Claimed(claim) => {
                let r = record(byte, 4096, token);
                claim.complete(Ok(Arc::clone(&r)));
                r
            }
            Lookup::Hit(r) => r,
            Lookup::InFlight(f) => f.wait().unwrap(),
        }
    }

    #[test]
    fn miss_then_hit() {
        let arc = LiveArc::new(ArcConfig {
            arc_max_bytes: 1 << 20,
            shards: 4,
            dram_policy: DramPolicy::Arc,
        });
        fill(&arc, key(1), 7, 0xaa);
        match arc.lookup(key(1), 7, AccessKind::Demand) {
            Lookup::Hit(r) => assert!(r.data.iter().all(|&b| b == 0xaa)),
            _ => panic!("expected a hit"),
        }
        let s = arc.stats();
        assert_eq!((s.hits, s.misses, s.mfu_hits), (1, 1, 0));
        assert_eq!(s.size, 4096);
    }

    #[test]
    fn stale_token_is_a_miss() {
        let arc = LiveArc::new(ArcConfig {
            arc_max_bytes: 1 << 20,
            shards: 1,
            dram_policy: DramPolicy::Arc,
        });
        fill(&arc, key(1), 7, 1);
        assert!(matches!(
            arc.lookup(key(1), 8, AccessKind::Demand),
            Lookup::Claimed(_)
        ));
        assert_eq!(arc.stats().stale_drops, 1);
    }

    /// A demand reader that waits for a prefetch's fill makes the record a
    /// demanded one (not flagged prefetched, so the L2ARC feeds it under
    /// `l2arc_noprefetch`); a prefetch nobody waited for stays flagged.
    #[test]
    fn a_demand_read_waiting_on_a_prefetch_makes_it_demanded() {
        let arc = LiveArc::new(ArcConfig {
            arc_max_bytes: 1 << 20,
            shards: 1,
            dram_policy: DramPolicy::Arc,
        });
        for (k, demanded) in [(1, true), (2, false)] {
            let Lookup::Claimed(claim) = arc.lookup(key(k), 1, AccessKind::Prefetch) else {
                panic!("first lookup must claim");
            };
            if demanded {
                assert!(matches!(
                    arc.lookup(key(k), 1, AccessKind::Demand),
                    Lookup::InFlight(_)
                ));
            } else {
                // Another prefetch waiting changes nothing.
                assert!(matches!(
                    arc.lookup(key(k), 1, AccessKind::Prefetch),
                    Lookup::InFlight(_)
                ));
            }
            claim.complete(Ok(record(k as u8, 4096, 1)));
        }
        assert_eq!(arc.stats().demand_iohit_predictive_prefetch, 1);
        assert_eq!(arc.stats().iohits, 2);
        let mut out = Vec::new();
        arc.feed_candidates(ListId::Mru, u64::MAX, &mut out);
        let mut flags: Vec<(u64, bool)> = out.iter().map(|(k, _, p)| (k.record, *p)).collect();
        flags.sort_unstable();
        assert_eq!(flags, vec![(1, false), (2, true)]);
    }

    #[test]
    fn waiters_share_one_fill() {
        let arc = LiveArc::new(ArcConfig {
            arc_max_bytes: 1 << 20,
            shards: 1,
            dram_policy: DramPolicy::Arc,
        });
        let Lookup::Claimed(claim) = arc.lookup(key(5), 1, AccessKind::Demand) else {
            panic!("first lookup must claim");
        };
        std::thread::scope(|s| {
            let waiters: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| match arc.lookup(key(5), 1, AccessKind::Demand) {
                        Lookup::InFlight(f) => f.wait().unwrap().data[0],
                        Lookup::Hit(r) => r.data[0],
                        Lookup::Claimed(_) => panic!("second claim while a fill is in flight"),
                    })
                })
                .collect();
            std::thread::sleep(std::time::Duration::from_millis(20));
            claim.complete(Ok(record(9, 4096, 1)));
            for w in waiters {
                assert_eq!(w.join().unwrap(), 9);
            }
        });
        assert_eq!(arc.stats().misses, 1);
    }

    #[test]
    fn invalidation_dooms_a_fill_in_flight() {
        let arc = LiveArc::new(ArcConfig {
            arc_max_bytes: 1 << 20,
            shards: 1,
            dram_policy: DramPolicy::Arc,
        });
        let Lookup::Claimed(claim) = arc.lookup(key(5), 1, AccessKind::Demand) else {
            panic!("first lookup must claim");
        };
        arc.invalidate(key(5));
        // A reader after the invalidation must not join the doomed fill.
        let Lookup::Claimed(second) = arc.lookup(key(5), 1, AccessKind::Demand) else {
            panic!("a reader after invalidation must start a fresh fill");
        };
        claim.complete(Ok(record(1, 4096, 1))); // old bytes: not inserted
        second.complete(Ok(record(2, 4096, 1)));
        match arc.lookup(key(5), 1, AccessKind::Demand) {
            Lookup::Hit(r) => assert_eq!(r.data[0], 2),
            _ => panic!("expected the fresh record"),
        }
    }

    /// A reader of a record the prewarm is reading waits for that read
    /// (counted), gets its record, and the record goes in at the cold end;
    /// a prewarm read that found nothing lets the waiter claim it itself.
    #[test]
    fn a_reader_joins_a_prewarm_read_of_its_record() {
        let arc = LiveArc::new(ArcConfig {
            arc_max_bytes: 1 << 20,
            shards: 1,
            dram_policy: DramPolicy::Arc,
        });
        fill(&arc, key(9), 1, 9); // a demand read: MRU head
        let claim = arc
            .claim_prewarm(key(1))
            .expect("not resident, not in flight");
        assert!(arc.claim_prewarm(key(1)).is_none(), "one claim a record");
        assert!(arc.claim_prewarm(key(9)).is_none(), "resident already");
        let Lookup::InFlight(joined) = arc.lookup(key(1), 1, AccessKind::Demand) else {
            panic!("a reader of a record being prewarmed waits on it");
        };
        assert!(claim.complete(Some(record(1, 4096, 1)), ListId::Mru, false));
        assert_eq!(joined.wait().unwrap().data[0], 1);
        assert_eq!(arc.stats().prewarm_joined, 1);
        // Inserted at the cold end: behind the demand read's record.
        let mut out = Vec::new();
        arc.feed_candidates(ListId::Mru, u64::MAX, &mut out);
        let order: Vec<u64> = out.iter().map(|(k, ..)| k.record).collect();
        assert_eq!(order, [1, 9], "coldest first");
        // Nothing on flash: the waiter looks again and claims it itself.
        let claim = arc.claim_prewarm(key(2)).unwrap();
        let Lookup::InFlight(waiting) = arc.lookup(key(2), 1, AccessKind::Demand) else {
            panic!("in flight");
        };
        assert!(!claim.complete(None, ListId::Mru, false));
        assert!(waiting.wait().is_err_and(|e| e.is_abandoned()));
        assert!(matches!(
            arc.lookup(key(2), 1, AccessKind::Demand),
            Lookup::Claimed(_)
        ));
        arc.assert_consistent();
    }

    #[test]
    fn abandoned_claim_fails_waiters() {
        let arc = LiveArc::new(ArcConfig {
            arc_max_bytes: 1 << 20,
            shards: 1,
            dram_policy: DramPolicy::Arc,
        });
        let claim = arc.lookup(key(1), 1, AccessKind::Demand);
        let Lookup::InFlight(fill) = arc.lookup(key(1), 1, AccessKind::Demand) else {
            panic!("expected in flight");
        };
        drop(claim);
        assert!(fill.wait().is_err_and(|e| e.is_abandoned()));
    }

    #[test]
    fn referenced_buffers_stay_and_memory_stays_bounded() {
        let arc = LiveArc::new(ArcConfig {
            arc_max_bytes: 4 * 4096,
            shards: 1,
            dram_policy: DramPolicy::Arc,
        });
        let held: Vec<_> = (0..4).map(|i| fill(&arc, key(i), 1, i as u8)).collect();
        // Every buffer is referenced: a fifth record cannot get in.
        fill(&arc, key(100), 1, 100);
        let s = arc.stats();
        assert!(s.size <= 4 * 4096);
        assert_eq!(s.insert_no_room, 1);
        for (i, r) in held.iter().enumerate() {
            assert_eq!(r.data[0], i as u8);
        }
        drop(held);
        fill(&arc, key(101), 1, 101);
        let s = arc.stats();
        assert!(s.size <= 4 * 4096);
        assert_eq!(s.entries, 4);
        arc.assert_consistent();
    }
}
