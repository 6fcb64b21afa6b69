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

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use smallvec::SmallVec;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use crate::arc::live::{ArcConfig, LiveArc, Lookup, Record, RecordKey};
use crate::arc::policy::{AccessKind, DramPolicy};
use crate::buf::AlignedBuf;
use crate::hash::{FastHashMap, hash_one};
use crate::l2arc::device::{DeviceIo, FileDevice};
use crate::l2arc::format::{
    Compression, SECTOR_TABLE_RECORD_BYTES_FLOOR, SECTOR_TABLE_RECORD_BYTES_MIN,
};
use crate::l2arc::ring::IoEngine;
use crate::l2arc::{DeviceOpen, L2Arc, L2ArcConfig};
use crate::primary::{Generation, ObjectInfo, Primary, PrimaryObject};
use crate::stats::{CacheStats, ReadPathCounters};

/// Smallest recordsize (ZFS: 512 B; here one 4 KiB block, the device's unit).
pub const RECORDSIZE_MIN_BYTES: u32 = 4 * 1024;
/// Largest recordsize (ZFS's default `zfs_max_recordsize`).
pub const RECORDSIZE_MAX_BYTES: u32 = 1024 * 1024;
/// Default recordsize (ZFS's).
pub const RECORDSIZE_DEFAULT_BYTES: u32 = 128 * 1024;

/// Errors in configuration: always a one-line message naming the setting.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "recordsize {0} is out of range: it must be a power of two from 4K to 1M (4096 to 1048576 bytes)"
    )]
    /// A recordsize that is not a power of two in range.
    RecordSize(u64),
    #[error("arc_max {0} bytes is too small: it must hold at least one 4 KiB record per shard")]
    /// An arc_max too small to hold a record per shard.
    ArcMax(u64),
    #[error("arc_shards must be from 1 to 1024, not {0}")]
    /// A shard count out of range.
    Shards(usize),
    #[error("dataset {0:?} already exists")]
    /// Two datasets of one name.
    DuplicateDataset(String),
    #[error("l2arc_ioengine=io_uring: {0}")]
    /// An `l2arc_ioengine` the kernel refuses.
    IoEngine(String),
    #[error("sector_table_min {0} bytes is too small: it must be at least 64K (65536 bytes)")]
    /// A sector table threshold under `SECTOR_TABLE_RECORD_BYTES_FLOOR`.
    SectorTableMin(u32),
}

/// ZFS's `primarycache` / `secondarycache` property values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CacheMode {
    /// Cache all records.
    #[default]
    All,
    /// Cache nothing: reads go straight to the tier below.
    None,
}

/// Per-dataset properties.
#[derive(Clone, Copy, Debug)]
pub struct DatasetConfig {
    /// Bytes per record: the unit of caching and of primary reads.
    pub recordsize_bytes: u32,
    /// What the ARC keeps of this dataset (ZFS `primarycache`).
    pub primarycache: CacheMode,
    /// What the L2ARC keeps of this dataset (ZFS `secondarycache`).
    pub secondarycache: CacheMode,
    /// How records are stored on the L2ARC (`compression=lz4|zstd|off`).
    pub compression: Compression,
    /// Records stored plain on flash and at least this long carry a sector
    /// table (a checksum per 4 KiB block, in one more block), so that a
    /// read of a small piece of one that only flash holds reads that piece,
    /// not the whole record: 1/32 of the flash bandwidth for a 4 KiB read
    /// of a 128 KiB record. The table costs a block per record on flash:
    /// 3.1% at 128 KiB, 1.6% at 256 KiB (the default). At least
    /// `SECTOR_TABLE_RECORD_BYTES_FLOOR` (64 KiB).
    pub sector_table_min_bytes: u32,
}

impl Default for DatasetConfig {
    fn default() -> Self {
        Self {
            recordsize_bytes: RECORDSIZE_DEFAULT_BYTES,
            primarycache: CacheMode::All,
            secondarycache: CacheMode::All,
            compression: Compression::Lz4,
            sector_table_min_bytes: SECTOR_TABLE_RECORD_BYTES_MIN as u32,
        }
    }
}

impl DatasetConfig {
    /// Checks the recordsize and the sector table threshold.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_recordsize(u64::from(self.recordsize_bytes))?;
        if (self.sector_table_min_bytes as usize) < SECTOR_TABLE_RECORD_BYTES_FLOOR {
            return Err(ConfigError::SectorTableMin(self.sector_table_min_bytes));
        }
        Ok(())
    }
}

/// Checks a `recordsize` value as ZFS does.
pub fn validate_recordsize(bytes: u64) -> Result<u32, ConfigError> {
    let ok = bytes.is_power_of_two()
        && (u64::from(RECORDSIZE_MIN_BYTES)..=u64::from(RECORDSIZE_MAX_BYTES)).contains(&bytes);
    if ok {
        Ok(bytes as u32)
    } else {
        Err(ConfigError::RecordSize(bytes))
    }
}

/// Whole-cache settings.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// `arc_max`: DRAM for record buffers.
    pub arc_max_bytes: u64,
    /// Independent ARC shards (locks). Default: 4 per core, at least 1.
    pub arc_shards: usize,
    /// DRAM replacement: ARC (default), or LRU as a benchmark baseline.
    pub dram_policy: DramPolicy,
    /// L2ARC tunables, used once a cache device is added.
    pub l2arc: L2ArcConfig,
    /// `zfs_prefetch_disable`: no read-ahead of sequential streams
    /// (`read_ahead`).
    pub zfs_prefetch_disable: bool,
    /// `zfetch_max_distance`: most bytes one read-ahead reads beyond the
    /// record asked for.
    pub zfetch_max_distance_bytes: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            arc_max_bytes: 1 << 30,
            arc_shards: (cores * 4).clamp(1, 1024),
            dram_policy: DramPolicy::Arc,
            l2arc: L2ArcConfig::default(),
            zfs_prefetch_disable: false,
            zfetch_max_distance_bytes: 8 << 20,
        }
    }
}

/// Identifies a dataset within one [`Cache`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DatasetId(pub(crate) u32);

pub(crate) struct Dataset {
    name: String,
    /// Stable identity across restarts (name and primary), so that L2ARC
    /// records survive a restart and can never be matched to another store.
    pub(crate) uid: u64,
    primary: Arc<dyn Primary>,
    /// Some: sequential readers are read ahead in spans of this many bytes
    /// (whole records; `Primary::read_ahead_span_bytes`, `zstream`).
    span_window_bytes: Option<u64>,
    pub(crate) config: DatasetConfig,
    /// The properties that may change while running (see `properties`).
    pub(crate) props: crate::properties::LiveProperties,
}

/// What the cache remembers of an object, shared by all its handles.
struct ObjectState {
    id: u64,
    /// Records must carry this token to be hits.
    token: AtomicU64,
    size_bytes: AtomicU64,
    /// Last generation seen, and a count of explicit invalidations.
    generation: Mutex<GenerationState>,
    /// Writes and hole punches through the cache between their change to
    /// primary storage and their adoption of the new generation: while
    /// any is, a generation that moved may be ours, and `revalidate` does
    /// not take it for an outside change.
    writes_in_flight: AtomicU64,
    /// Its sequential streams (`zstream`), made on the first read through
    /// a dataset that reads ahead in spans.
    streams: OnceLock<Box<crate::zstream::Streams>>,
}

/// Counts a write through the cache in `ObjectState::writes_in_flight`
/// for as long as it lives.
struct WriteInFlight<'a>(&'a ObjectState);

impl<'a> WriteInFlight<'a> {
    fn new(state: &'a ObjectState) -> Self {
        state.writes_in_flight.fetch_add(1, Ordering::AcqRel);
        Self(state)
    }
}

impl Drop for WriteInFlight<'_> {
    fn drop(&mut self) {
        let before = self.0.writes_in_flight.fetch_sub(1, Ordering::AcqRel);
        assert!(before > 0, "a write left that never came in");
    }
}

/// What `ObjectState::generation` guards.
struct GenerationState {
    /// The generation last seen (our own writes adopt theirs here without
    /// a new token).
    current: Generation,
    /// Explicit invalidations so far.
    epoch: u64,
    /// The generation the current token was derived from: the version a
    /// conditional primary read must ask for (`Primary::read_at_generation`).
    of_token: Generation,
}

impl ObjectState {
    /// The generation that `token` stands for, if it is still the object's
    /// token (`None`: the token moved on since the caller loaded it).
    fn generation_of(&self, token: u64) -> Option<Generation> {
        let generation = self.generation.lock().expect("object state poisoned");
        (self.token.load(Ordering::Acquire) == token).then_some(generation.of_token)
    }
}

fn generation_token(generation: &Generation, epoch: u64) -> u64 {
    if generation.version_hash == 0 {
        // Files: the token as it was before objects had versions, so that
        // persistent caches written then keep matching.
        return hash_one(&(
            generation.ino,
            generation.size_bytes,
            generation.mtime_ns,
            generation.ctime_ns,
            epoch,
        ));
    }
    hash_one(&(
        generation.ino,
        generation.size_bytes,
        generation.mtime_ns,
        generation.ctime_ns,
        generation.version_hash,
        epoch,
    ))
}

/// How many times a read re-stats and tries again when the object changed
/// under a conditional primary read (412): each try follows a fresh stat,
/// so only an object rewritten faster than we can read one record loses.
const STALE_RETRIES_MAX: u32 = 4;

fn is_stale(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StaleNetworkFileHandle
}

/// An open object, ready for reads and writes through the cache. Clones
/// share the object.
#[derive(Clone)]
pub struct ObjectHandle {
    dataset_id: DatasetId,
    dataset: Arc<Dataset>,
    object: Arc<dyn PrimaryObject>,
    state: Arc<ObjectState>,
    /// The caller reads ahead itself: its reads feed no stream.
    reads_ahead_itself: bool,
}

impl ObjectHandle {
    /// The handle of a caller that reads ahead itself (a front end with a
    /// window of its own, as the object mount's): its reads feed none of
    /// the engine's sequential streams (`zstream`), so that two read-aheads
    /// do not race for the same records.
    #[must_use]
    pub fn reads_ahead_itself(mut self) -> Self {
        self.reads_ahead_itself = true;
        self
    }

    /// The span a sequential reader of this object is read ahead in, if
    /// its dataset reads ahead in spans and this handle lets it.
    pub(crate) fn span_window_bytes(&self) -> Option<u64> {
        self.dataset
            .span_window_bytes
            .filter(|_| !self.reads_ahead_itself)
    }

    /// The object's sequential streams.
    pub(crate) fn streams(&self) -> &crate::zstream::Streams {
        self.state.streams.get_or_init(Box::default)
    }

    /// The object's size as last seen (at open, revalidate or our own write).
    pub fn size_bytes(&self) -> u64 {
        self.state.size_bytes.load(Ordering::Acquire)
    }

    /// The object's identity within its dataset.
    pub fn object_id(&self) -> u64 {
        self.state.id
    }

    /// The dataset the object belongs to.
    pub fn dataset(&self) -> DatasetId {
        self.dataset_id
    }

    /// The dataset's recordsize when the object was opened.
    pub fn recordsize_bytes(&self) -> u32 {
        self.dataset.config.recordsize_bytes
    }

    /// The object's generation token now: it changes exactly when the
    /// cache stops trusting what it holds of the object (a change behind
    /// it, an invalidation), so a front end can tell when pages it handed
    /// out belong to an older version.
    pub fn generation_token(&self) -> u64 {
        self.token()
    }

    /// The object's current generation token (records must carry it).
    pub(crate) fn token(&self) -> u64 {
        self.state.token.load(Ordering::Acquire)
    }

    /// The ARC key of the object's `index`-th record.
    pub(crate) fn record_key(&self, index: u64) -> RecordKey {
        RecordKey {
            dataset: self.dataset_id.0,
            object: self.state.id,
            record: index,
        }
    }

    pub(crate) fn caches_in_arc(&self) -> bool {
        self.dataset.props.primarycache() == CacheMode::All
    }

    /// Whether the dataset caches nothing of its data (`primarycache=none`):
    /// read-ahead would only read for nothing.
    pub(crate) fn caches_nothing(&self) -> bool {
        self.dataset.props.primarycache() == CacheMode::None
    }
}

/// Bytes of a read, as shared record buffers (no copy).
pub struct ReadView {
    /// Inline for reads within one or two records: no allocation on a hit.
    pub segments: SmallVec<[(Arc<Record>, Range<usize>); 2]>,
}

impl ReadView {
    pub(crate) fn empty() -> Self {
        ReadView {
            segments: SmallVec::new(),
        }
    }

    pub(crate) fn push(&mut self, record: Arc<Record>, range: Range<usize>) {
        self.segments.push((record, range));
    }

    /// A view of bytes that belong to no cached record.
    pub(crate) fn owned(bytes: Vec<u8>) -> Self {
        let len = bytes.len();
        let record = Record {
            data: AlignedBuf::copy_from(&bytes),
            generation_token: 0,
            fill_sequence: 0,
        };
        let mut view = Self::empty();
        if len > 0 {
            view.push(Arc::new(record), 0..len);
        }
        view
    }

    /// Bytes in the view.
    pub fn len(&self) -> usize {
        self.segments.iter().map(|(_, r)| r.len()).sum()
    }

    /// Whether the view is empty (at or past the end of the object).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of the view, one slice per record it spans, in order.
    pub fn slices(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.segments
            .iter()
            .map(|(record, range)| &record.data[range.clone()])
    }

    /// The view as one slice when it lies within one record (no copy).
    pub fn as_single_slice(&self) -> Option<&[u8]> {
        match self.segments.as_slice() {
            [] => Some(&[]),
            [(record, range)] => Some(&record.data[range.clone()]),
            _ => None,
        }
    }

    /// Copies the view into `out` (which must be at least `len()` long).
    pub fn copy_to(&self, out: &mut [u8]) -> usize {
        let mut at = 0;
        for (record, range) in &self.segments {
            let n = range.len();
            out[at..at + n].copy_from_slice(&record.data[range.clone()]);
            at += n;
        }
        at
    }
}

/// A small read is tried as a sector read when it is at most this
/// fraction of its record (see `Cache::get_piece`): 64 KiB of a 1 MiB
/// record. Below the kernel's 128 KiB FUSE reads, so a sequential reader
/// (whose read-ahead fetches whole records) does not also read pieces.
const SECTOR_READ_FRACTION: usize = 16;

/// Whether a demand read of bytes `piece` of one record of `handle`'s
/// dataset may be tried as a sector read: its records large enough to
/// carry sector tables, the piece small, and not at the record's start. A
/// reader that starts a record is taken to read on through it (a
/// sequential reader of small pieces), so it gets the whole record into
/// the ARC, and the rest of its pieces are hits; a random reader starts a
/// record once in `recordsize / len` reads.
fn sector_read_fits(handle: &ObjectHandle, piece: &Range<usize>) -> bool {
    let config = &handle.dataset.config;
    let recordsize = config.recordsize_bytes as usize;
    recordsize >= config.sector_table_min_bytes as usize
        && piece.start > 0
        && piece.len() * SECTOR_READ_FRACTION <= recordsize
}

/// `wanted` of a whole record, cut at its end, and whether it is short.
fn piece_of(
    record: Arc<Record>,
    wanted: Range<usize>,
    recordsize: usize,
) -> (Arc<Record>, Range<usize>, bool) {
    let len = record.data.len();
    let to = wanted.end.min(len);
    let from = wanted.start.min(to);
    (record, from..to, len < recordsize)
}

/// Object states kept beyond those open handles hold: each is ~100 bytes,
/// so the table stays under ~30 MiB however many objects pass through.
pub const OBJECT_STATES_MAX: usize = 1 << 18;

/// How many recent invalidations a feed can look back on.
const INVALIDATIONS_KEPT: usize = 4096;

/// One write (or hole) through the cache, as feeds see it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Invalidation {
    pub(crate) sequence: u64,
    /// Hash of (dataset, object).
    pub(crate) object_hash: u64,
    /// The records it dropped, first and last (inclusive).
    pub(crate) records: (u64, u64),
}

/// Recent writes, for feeds that raced with them (see the module comment).
#[derive(Default)]
pub(crate) struct Invalidations {
    pub(crate) sequence: u64,
    /// Recent writes, oldest first.
    pub(crate) recent: VecDeque<Invalidation>,
}

/// Logs a write to records `first..=last` of an object for feeds in flight
/// (see `feed_l2arc`), and publishes the new sequence.
fn note_invalidation(
    invalidations: &mut Invalidations,
    published: &AtomicU64,
    handle: &ObjectHandle,
    records: (u64, u64),
) {
    let object_hash = hash_one(&(handle.dataset_id.0, handle.state.id));
    invalidations.sequence += 1;
    let sequence = invalidations.sequence;
    if invalidations.recent.len() == INVALIDATIONS_KEPT {
        invalidations.recent.pop_front();
    }
    invalidations.recent.push_back(Invalidation {
        sequence,
        object_hash,
        records,
    });
    published.store(sequence, Ordering::Release);
}

/// The L2 identity of a record: dataset uid, object, record, generation.
pub(crate) fn l2_key_hash(dataset_uid: u64, object: u64, record: u64, token: u64) -> u64 {
    hash_one(&(dataset_uid, object, record, token)).max(1)
}

/// The cache: datasets over primary storage, with the ARC (and, once cache
/// devices are added, the L2ARC) in front.
pub struct Cache {
    /// Itself, for what must outlive a call (spans filled by the pool).
    pub(crate) me: std::sync::Weak<Cache>,
    /// The threads that fill sequential streams' spans (`zstream`),
    /// started with the first span; None inside if none could start.
    span_pool: OnceLock<Option<crate::zstream::SpanPool>>,
    pub(crate) config: CacheConfig,
    pub(crate) arc: LiveArc,
    pub(crate) datasets: RwLock<Vec<Arc<Dataset>>>,
    objects: Mutex<FastHashMap<(u32, u64), Arc<ObjectState>>>,
    /// Set once unheld object states were dropped (see `object_state`).
    object_states_dropped: std::sync::atomic::AtomicBool,
    /// Blocks of 2^32 invalidation epochs handed to object states made
    /// after a drop, so no state ever reuses an epoch of an earlier one.
    next_epoch: AtomicU64,
    pub(crate) counters: ReadPathCounters,
    pub(crate) l2: OnceLock<Arc<L2Arc>>,
    pub(crate) invalidations: Mutex<Invalidations>,
    /// `invalidations.sequence`, readable without the lock: a fill notes it
    /// before it reads, so a write-back of its record can tell which writes
    /// came after (`Record::fill_sequence`).
    pub(crate) invalidation_sequence: AtomicU64,
    /// Wakes the feeder under eviction pressure (see `l2arc::feeder`).
    pub(crate) feed_wake: Arc<crate::l2arc::feeder::FeedWake>,
    /// How read queues read flash (`l2arc_ioengine`, resolved at start),
    /// and why `auto` fell back to psync, if it did.
    ioengine: (IoEngine, Option<String>),
    /// Latency by tier (see `analytics`).
    pub(crate) analytics: crate::analytics::Analytics,
}

/// What one feed did.
#[derive(Clone, Copy, Debug, Default)]
pub struct FeedOutcome {
    /// Records written to cache devices.
    pub records: usize,
    /// Bytes written to cache devices.
    pub bytes: u64,
    /// The feed wrote as much as it was allowed: feed again soon.
    pub full: bool,
}

impl Drop for Cache {
    fn drop(&mut self) {
        if let Some(l2) = self.l2.get() {
            l2.stop();
        }
    }
}

impl Cache {
    /// Builds a cache with no datasets and no cache device.
    pub fn new(config: CacheConfig) -> Result<Arc<Self>, ConfigError> {
        // Wake the feeder after a quarter of the ARC, at most half a batch.
        let feed_wake = Arc::new(crate::l2arc::feeder::FeedWake::new(
            (config.arc_max_bytes / 8).clamp(1, crate::l2arc::BATCH_BYTES_MAX / 4),
        ));
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
            datasets: RwLock::new(Vec::new()),
            objects: Mutex::new(FastHashMap::default()),
            object_states_dropped: std::sync::atomic::AtomicBool::new(false),
            next_epoch: AtomicU64::new(1),
            counters: ReadPathCounters::default(),
            l2: OnceLock::new(),
            invalidations: Mutex::new(Invalidations::default()),
            invalidation_sequence: AtomicU64::new(0),
            feed_wake,
            ioengine,
            analytics: crate::analytics::Analytics::default(),
        }))
    }

    /// The span fillers of sequential streams, started on first use.
    pub(crate) fn span_pool(&self) -> Option<&crate::zstream::SpanPool> {
        self.span_pool
            .get_or_init(crate::zstream::SpanPool::start)
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

    /// The datasets, in the order they were added, with their names and properties.
    pub fn dataset_list(&self) -> Vec<(DatasetId, String, DatasetConfig)> {
        let datasets = self.datasets.read().expect("dataset lock poisoned");
        (0u32..)
            .zip(datasets.iter())
            .map(|(i, d)| (DatasetId(i), d.name.clone(), d.props.current(&d.config)))
            .collect()
    }

    /// Sets `primarycache`, `secondarycache` or `compression` of the
    /// dataset `name` while running (see `properties`).
    pub fn set_dataset_property(
        &self,
        name: &str,
        property: &str,
        value: &str,
    ) -> Result<(), crate::properties::PropertyError> {
        let datasets = self.datasets.read().expect("dataset lock poisoned");
        let dataset = datasets
            .iter()
            .find(|d| d.name == name)
            .ok_or_else(|| crate::properties::PropertyError::NoDataset(name.to_string()))?;
        dataset.props.set(property, value)
    }

    /// The L2ARC, once a cache device has been added.
    #[cfg(feature = "internals")]
    pub fn l2arc(&self) -> Option<&Arc<L2Arc>> {
        self.l2.get()
    }

    /// Adds a cache device (L2ARC): reused and rebuilt if it holds an L2ARC
    /// log, initialised if blank, refused if it holds anything else. Starts
    /// the feeder with the first device.
    pub fn add_cache_device(
        self: &Arc<Self>,
        io: Box<dyn DeviceIo>,
    ) -> io::Result<(u8, DeviceOpen)> {
        let l2 = self.l2.get_or_init(|| {
            let expected_records =
                (self.config.arc_max_bytes / u64::from(RECORDSIZE_MIN_BYTES)) as usize;
            let mut config = self.config.l2arc.clone();
            if self.ioengine() != IoEngine::IoUring {
                // Polling is through io_uring too: psync means no ring.
                config.l2arc_read_poll_us = 0;
            }
            Arc::new(L2Arc::new(config, expected_records.min(1 << 20)))
        });
        self.arc
            .set_eviction_sink(Box::new(crate::l2arc::writeback::CacheEvictionSink(
                Arc::downgrade(self),
            )));
        let added = l2.add_device(io)?;
        crate::l2arc::feeder::spawn_device_feeder(
            Arc::downgrade(self),
            Arc::clone(&self.feed_wake),
            l2,
            added.0,
        )?;
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
        self.add_cache_device(Box::new(device))
    }

    /// Removes a cache device; waits for reads in flight on it.
    pub fn remove_cache_device(&self, slot: u8) -> io::Result<()> {
        match self.l2.get() {
            Some(l2) => l2.remove_device(slot),
            None => Err(io::Error::new(io::ErrorKind::NotFound, "no cache devices")),
        }
    }

    /// Adds a dataset: a primary store with its own properties.
    pub fn add_dataset(
        &self,
        name: &str,
        primary: Arc<dyn Primary>,
        config: DatasetConfig,
    ) -> Result<DatasetId, ConfigError> {
        config.validate()?;
        let mut datasets = self.datasets.write().expect("dataset lock poisoned");
        if datasets.iter().any(|d| d.name == name) {
            return Err(ConfigError::DuplicateDataset(name.to_string()));
        }
        let id = DatasetId(u32::try_from(datasets.len()).expect("fewer than 2^32 datasets"));
        let uid = hash_one(&(name, primary.describe()));
        let recordsize = u64::from(config.recordsize_bytes);
        let span_window_bytes = primary.read_ahead_span_bytes().map(|bytes| {
            (bytes.min(crate::PREFETCH_SPAN_BYTES_MAX) / recordsize).max(1) * recordsize
        });
        datasets.push(Arc::new(Dataset {
            name: name.to_string(),
            uid,
            primary,
            span_window_bytes,
            props: crate::properties::LiveProperties::new(&config),
            config,
        }));
        Ok(id)
    }

    fn dataset(&self, id: DatasetId) -> io::Result<Arc<Dataset>> {
        let datasets = self.datasets.read().expect("dataset lock poisoned");
        datasets
            .get(id.0 as usize)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such dataset"))
    }

    /// Opens an object and revalidates what the cache knows of it.
    pub fn open(
        &self,
        dataset_id: DatasetId,
        name: &str,
        writable: bool,
    ) -> io::Result<ObjectHandle> {
        let dataset = self.dataset(dataset_id)?;
        let object = dataset.primary.open(name, writable)?;
        let handle = self.open_object(dataset_id, dataset, object)?;
        self.analytics
            .name_object(dataset_id.0, handle.state.id, name);
        Ok(handle)
    }

    /// Opens an object from a file the caller already opened in the
    /// dataset's tree (`Primary::open_file`), and revalidates what the cache
    /// knows of it. Hard links share one object: the identity is the inode.
    pub fn open_file(
        &self,
        dataset_id: DatasetId,
        file: std::fs::File,
        writable: bool,
    ) -> io::Result<ObjectHandle> {
        let dataset = self.dataset(dataset_id)?;
        let object = dataset.primary.open_file(file, writable)?;
        self.open_object(dataset_id, dataset, object)
    }

    /// Names an object for the analytics' drill-down: for front ends that
    /// open by descriptor ([`Cache::open_file`]) and know a path.
    pub fn name_object(&self, handle: &ObjectHandle, name: &str) {
        self.analytics
            .name_object(handle.dataset_id.0, handle.state.id, name);
    }

    fn open_object(
        &self,
        dataset_id: DatasetId,
        dataset: Arc<Dataset>,
        object: Arc<dyn PrimaryObject>,
    ) -> io::Result<ObjectHandle> {
        let info = object.info()?;
        let state = self.object_state(dataset_id, &info);
        let handle = ObjectHandle {
            dataset_id,
            dataset,
            object,
            state,
            reads_ahead_itself: false,
        };
        self.adopt(&handle, info, true);
        Ok(handle)
    }

    /// The shared state of an object, made on its first open.
    ///
    /// The table is bounded: past `OBJECT_STATES_MAX` the states no handle
    /// holds are dropped. A dropped state's invalidation epoch is lost, so
    /// from the first drop on, new states start at an epoch never used
    /// before (not 0): a record cached under an epoch that an invalidation
    /// retired can never match again. The price is that objects first
    /// opened after a drop miss their records from before it (and from
    /// before a restart) once.
    fn object_state(&self, dataset_id: DatasetId, info: &ObjectInfo) -> Arc<ObjectState> {
        let mut objects = self.objects.lock().expect("object table poisoned");
        if let Some(state) = objects.get(&(dataset_id.0, info.id)) {
            return Arc::clone(state);
        }
        if objects.len() >= OBJECT_STATES_MAX {
            objects.retain(|_, state| Arc::strong_count(state) > 1);
            self.object_states_dropped.store(true, Ordering::Relaxed);
        }
        let epoch = if self.object_states_dropped.load(Ordering::Relaxed) {
            // Each new state gets 2^32 epochs of its own for its invalidations.
            self.next_epoch.fetch_add(1, Ordering::Relaxed) << 32
        } else {
            0
        };
        let state = Arc::new(ObjectState {
            id: info.id,
            token: AtomicU64::new(generation_token(&info.generation, epoch)),
            size_bytes: AtomicU64::new(info.size_bytes()),
            generation: Mutex::new(GenerationState {
                current: info.generation,
                epoch,
                of_token: info.generation,
            }),
            writes_in_flight: AtomicU64::new(0),
            streams: OnceLock::new(),
        });
        objects.insert((dataset_id.0, info.id), Arc::clone(&state));
        state
    }

    /// Objects whose state the cache holds (bounded by `OBJECT_STATES_MAX`
    /// plus those open handles hold).
    pub fn object_states(&self) -> usize {
        self.objects.lock().expect("object table poisoned").len()
    }

    /// Re-reads the object's generation; if it changed behind the cache,
    /// every record cached for it becomes a miss. While a write through the
    /// cache is between primary storage and its own re-stat, a moved
    /// generation may be that write's, so it is left for the write to
    /// adopt (the window in the module comment, as wide as the writes): a
    /// watcher that calls this on every change event never drops the whole
    /// object for the cache's own writes.
    pub fn revalidate(&self, handle: &ObjectHandle) -> io::Result<ObjectInfo> {
        let info = handle.object.info()?;
        if handle.state.writes_in_flight.load(Ordering::Acquire) == 0 {
            self.adopt(handle, info, true);
        }
        Ok(info)
    }

    /// Records `info` as the object's generation. `outside_change` says a
    /// difference means someone else changed the object (new token).
    fn adopt(&self, handle: &ObjectHandle, info: ObjectInfo, outside_change: bool) {
        let state = &handle.state;
        let mut generation = state.generation.lock().expect("object state poisoned");
        if generation.current != info.generation {
            generation.current = info.generation;
            if outside_change {
                generation.of_token = info.generation;
                state.token.store(
                    generation_token(&generation.current, generation.epoch),
                    Ordering::Release,
                );
            }
        }
        state.size_bytes.store(info.size_bytes(), Ordering::Release);
    }

    /// Drops every cached record of the object (O(1): a new token).
    pub fn invalidate_object(&self, handle: &ObjectHandle) {
        let state = &handle.state;
        let mut generation = state.generation.lock().expect("object state poisoned");
        generation.epoch += 1;
        generation.of_token = generation.current;
        state.token.store(
            generation_token(&generation.current, generation.epoch),
            Ordering::Release,
        );
    }

    /// Reads like `pread`: fills `buf` from `offset`, short at end of object.
    pub fn read(&self, handle: &ObjectHandle, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        if handle.caches_nothing() {
            return self.read_uncached(handle, offset, buf);
        }
        let recordsize = u64::from(handle.dataset.config.recordsize_bytes);
        let size_bytes = handle.size_bytes();
        let end = offset.saturating_add(buf.len() as u64).min(size_bytes);
        if offset < end && offset / recordsize == (end - 1) / recordsize {
            // Within one record: copy straight out of the record buffer.
            let continues = self.note_stream_read(handle, offset, buf.len());
            let timer = self.analytics.start_read();
            let index = offset / recordsize;
            let from = (offset - index * recordsize) as usize;
            let to = (end - index * recordsize) as usize;
            let peeked = (continues == Some(index))
                .then(|| self.arc.peek_hit(handle.record_key(index), handle.token()))
                .flatten();
            let (record, range, _) = match peeked {
                Some(record) => piece_of(record, from..to, recordsize as usize),
                None => self.get_piece(handle, index, AccessKind::Demand, from..to)?,
            };
            let n = range.len();
            buf[..n].copy_from_slice(&record.data[range]);
            self.counters.reads.add(1);
            self.counters.read_bytes.add(n as u64);
            self.analytics
                .finish_read(timer, handle.dataset_id.0, handle.state.id);
            return Ok(n);
        }
        let view = self.read_view(handle, offset, buf.len(), AccessKind::Demand)?;
        Ok(view.copy_to(buf))
    }

    /// Warms the cache with the records under a range (read-ahead): they are
    /// flagged as prefetched and do not count as reuse.
    pub fn prefetch(&self, handle: &ObjectHandle, offset: u64, len: usize) -> io::Result<()> {
        if handle.caches_nothing() {
            return Ok(());
        }
        self.read_view(handle, offset, len, AccessKind::Prefetch)
            .map(|_| ())
    }

    /// Reads a range as shared record buffers, without copying.
    pub fn read_view(
        &self,
        handle: &ObjectHandle,
        offset: u64,
        len: usize,
        kind: AccessKind,
    ) -> io::Result<ReadView> {
        self.read_view_continuing(handle, offset, len, kind, None)
    }

    /// As [`Self::read_view`], for a reader whose previous read ended in
    /// record `continues`: a hit on that record is counted, but is not a new
    /// access for the ARC's policy (`LiveArc::peek_hit`). Without it a
    /// sequential reader that reads a record in several reads (the kernel's
    /// 128 KiB) would promote every record it reads to MFU, as if it were
    /// reused, and the records read ahead of it would be evicted first.
    pub fn read_view_continuing(
        &self,
        handle: &ObjectHandle,
        offset: u64,
        len: usize,
        kind: AccessKind,
        continues: Option<u64>,
    ) -> io::Result<ReadView> {
        let size_bytes = handle.size_bytes();
        let mut segments = SmallVec::new();
        if len == 0 || offset >= size_bytes {
            return Ok(ReadView { segments });
        }
        let end = offset.saturating_add(len as u64).min(size_bytes);
        let recordsize = u64::from(handle.dataset.config.recordsize_bytes);
        // A record the caller's previous read ended in, or one an earlier
        // read of the object's sequential stream touched: not a new access.
        let continues = match kind {
            AccessKind::Demand => self.note_stream_read(handle, offset, len).or(continues),
            _ => continues,
        };
        let timer = self.analytics.start_read_if(kind == AccessKind::Demand);
        for index in offset / recordsize..=(end - 1) / recordsize {
            let record_start = index * recordsize;
            let from = (offset.max(record_start) - record_start) as usize;
            let to = ((end - record_start) as usize).min(recordsize as usize);
            let peeked = (kind == AccessKind::Demand && continues == Some(index))
                .then(|| self.arc.peek_hit(handle.record_key(index), handle.token()))
                .flatten();
            let (record, range, short) = match peeked {
                Some(record) => piece_of(record, from..to, recordsize as usize),
                None => self.get_piece(handle, index, kind, from..to)?,
            };
            if !range.is_empty() {
                segments.push((record, range));
            }
            if short {
                break; // end of object as the primary saw it
            }
        }
        if kind == AccessKind::Demand {
            let view = ReadView { segments };
            self.counters.reads.add(1);
            self.counters.read_bytes.add(view.len() as u64);
            self.analytics
                .finish_read(timer, handle.dataset_id.0, handle.state.id);
            return Ok(view);
        }
        Ok(ReadView { segments })
    }

    /// Bytes `wanted` of record `index` (cut at the record's end): a
    /// buffer, the range of it that holds them, and whether the record is
    /// short (the object's last).
    ///
    /// A small demand read (at most 1/`SECTOR_READ_FRACTION` of a record,
    /// not at its start: `sector_read_fits`) of a record the ARC neither
    /// holds nor is filling is first tried as a sector read from the L2ARC
    /// (`L2Arc::read_sectors`): the 4 KiB blocks under it and the record's
    /// sector table, not the whole record, and no ARC fill. Reading a 1 MiB record from flash to serve
    /// 4 KiB is 256 times the I/O, and filling the ARC with it evicts a
    /// megabyte of DRAM for every random read that misses it. A record
    /// read this way is still counted as an ARC miss and an L2ARC hit.
    fn get_piece(
        &self,
        handle: &ObjectHandle,
        index: u64,
        kind: AccessKind,
        wanted: Range<usize>,
    ) -> io::Result<(Arc<Record>, Range<usize>, bool)> {
        let recordsize = handle.dataset.config.recordsize_bytes as usize;
        if kind == AccessKind::Demand && sector_read_fits(handle, &wanted) {
            let token = handle.token();
            let key = handle.record_key(index);
            match self.arc.lookup_resident(key, token, kind) {
                Some(Lookup::Hit(record)) => return Ok(piece_of(record, wanted, recordsize)),
                Some(_) => {} // being filled: wait for it below
                None => {
                    if let Some((l2, key_hash)) = self.l2_source(handle, index, token) {
                        let timer = self.analytics.start();
                        if let Some((data, range, record_bytes)) =
                            l2.read_sectors(key_hash, wanted.clone())
                        {
                            self.arc.note_miss(key, kind);
                            self.note_l2_hit(handle, timer, range.len() as u64);
                            let record = Arc::new(Record {
                                data,
                                generation_token: token,
                                fill_sequence: 0,
                            });
                            return Ok((record, range, record_bytes < recordsize));
                        }
                    }
                }
            }
        }
        let record = self.get_record(handle, index, kind)?;
        Ok(piece_of(record, wanted, recordsize))
    }

    fn get_record(
        &self,
        handle: &ObjectHandle,
        index: u64,
        kind: AccessKind,
    ) -> io::Result<Arc<Record>> {
        let key = handle.record_key(index);
        let mut stale_tries = 0u32;
        loop {
            let token = handle.token();
            let result = match self.arc.lookup(key, token, kind) {
                Lookup::Hit(record) => return Ok(record),
                Lookup::InFlight(fill) => {
                    self.analytics.note_below();
                    match fill.wait() {
                        Ok(record) if record.generation_token == token => return Ok(record),
                        // Filled under another generation, or the claim
                        // was dropped unfilled: look again.
                        Ok(_) => continue,
                        Err(e) if e.is_abandoned() => continue,
                        Err(e) => Err(io::Error::from(e)),
                    }
                }
                Lookup::Claimed(claim) => {
                    let fill_sequence = self.invalidation_sequence.load(Ordering::Acquire);
                    match self.read_l2(handle, index, token) {
                        Some(data) => self.publish_fill(claim, Ok(data), token, fill_sequence),
                        None => self.fill_from_primary(handle, index, token, kind, claim),
                    }
                }
            };
            match result {
                // The object is no longer the version the token stands for
                // (a conditional read saw 412): learn the new one and read
                // again under its token. Nothing of the old version was
                // returned or cached under the new token.
                Err(e) if is_stale(&e) && stale_tries < STALE_RETRIES_MAX => {
                    stale_tries += 1;
                    self.counters.primary_stale.add(1);
                    self.revalidate(handle)?;
                }
                Err(e) if is_stale(&e) => {
                    return Err(io::Error::other(format!(
                        "the object kept changing while record {index} was read ({STALE_RETRIES_MAX} tries)"
                    )));
                }
                other => return other,
            }
        }
    }

    /// Completes a fill this reader claimed: inserts the record (the ARC
    /// decides) and hands it, or the error, to every reader waiting on it.
    pub(crate) fn publish_fill(
        &self,
        claim: crate::arc::live::FillClaim<'_>,
        result: io::Result<AlignedBuf>,
        token: u64,
        fill_sequence: u64,
    ) -> io::Result<Arc<Record>> {
        match result {
            Ok(data) => {
                let record = Arc::new(Record {
                    data,
                    generation_token: token,
                    fill_sequence,
                });
                claim.complete(Ok(Arc::clone(&record)));
                if self.l2.get().is_some_and(|l2| l2.config().l2arc_feed_again) {
                    self.feed_wake.note_insert(record.data.len() as u64);
                }
                Ok(record)
            }
            Err(e) => {
                // The waiters get the error as `Fill` keeps it; the
                // claimant keeps its kind too.
                let failed = io::Error::new(e.kind(), e.to_string());
                claim.complete(Err(e));
                Err(failed)
            }
        }
    }

    /// Produces a record's bytes from below the ARC.
    ///
    /// The L2ARC first (a miss or any failure there falls through), then
    /// primary storage.
    pub(crate) fn fill_record(
        &self,
        handle: &ObjectHandle,
        index: u64,
        token: u64,
    ) -> io::Result<AlignedBuf> {
        if let Some(data) = self.read_l2(handle, index, token) {
            return Ok(data);
        }
        self.read_primary(handle, index, token)
    }

    /// A record's bytes from the L2ARC, if it holds them under `token` (a
    /// miss or any failure there is `None`).
    pub(crate) fn read_l2(
        &self,
        handle: &ObjectHandle,
        index: u64,
        token: u64,
    ) -> Option<AlignedBuf> {
        let recordsize = handle.dataset.config.recordsize_bytes as usize;
        let (l2, key_hash) = self.l2_source(handle, index, token)?;
        let timer = self.analytics.start();
        let data = l2
            .read(key_hash, recordsize as u32)
            .filter(|data| data.len() <= recordsize)?;
        self.note_l2_hit(handle, timer, data.len() as u64);
        Some(data)
    }

    /// Counts an L2ARC hit of `bytes` for the analytics (latency from `timer`).
    pub(crate) fn note_l2_hit(
        &self,
        handle: &ObjectHandle,
        timer: crate::analytics::Timer,
        bytes: u64,
    ) {
        let dataset = handle.dataset_id.0 as usize;
        self.analytics
            .l2_hit_done(timer, dataset, handle.state.id, bytes);
    }

    /// Whether a read queue should take a read of `len` bytes at `offset`:
    /// every record under it is in the ARC (resident or being filled) or on
    /// flash, so it needs nothing from primary storage (unless a record
    /// leaves both before it is read), and it is not a small piece of a
    /// record that only flash holds with a sector table, which
    /// [`Cache::read`] reads alone (`get_piece`) where a queue reads the
    /// whole record. One ARC and at most one index lookup a record; no
    /// statistics.
    pub(crate) fn queue_takes(&self, handle: &ObjectHandle, offset: u64, len: usize) -> bool {
        if !handle.caches_in_arc() {
            return false;
        }
        let end = offset.saturating_add(len as u64).min(handle.size_bytes());
        if offset >= end {
            return true;
        }
        let recordsize = u64::from(handle.recordsize_bytes());
        let token = handle.token();
        let records = offset / recordsize..=(end - 1) / recordsize;
        // The piece of the record when the read is within one.
        let piece = (records.start() == records.end()).then(|| {
            let start = records.start() * recordsize;
            (offset - start) as usize..(end - start) as usize
        });
        records.clone().all(|index| {
            if self.arc.holds(handle.record_key(index), token) {
                return true;
            }
            let Some((l2, key_hash)) = self.l2_source(handle, index, token) else {
                return false;
            };
            match l2.sector_table_of(key_hash) {
                None => false,
                Some(sectored) => {
                    !(sectored && piece.as_ref().is_some_and(|p| sector_read_fits(handle, p)))
                }
            }
        })
    }

    /// The L2ARC and the record's key there, if the record may be on flash.
    pub(crate) fn l2_source(
        &self,
        handle: &ObjectHandle,
        index: u64,
        token: u64,
    ) -> Option<(&Arc<L2Arc>, u64)> {
        let l2 = self.l2.get()?;
        (handle.dataset.props.secondarycache() == CacheMode::All).then(|| {
            (
                l2,
                l2_key_hash(handle.dataset.uid, handle.state.id, index, token),
            )
        })
    }

    /// Reads a whole record from primary storage.
    /// `token` is the one the record will carry: the read asks primary
    /// storage for the version it stands for.
    pub(crate) fn read_primary(
        &self,
        handle: &ObjectHandle,
        index: u64,
        token: u64,
    ) -> io::Result<AlignedBuf> {
        self.read_primary_span(handle, index, 1, token)
    }

    /// Reads `records` whole records from `first` on from primary storage
    /// in one read (one GET from an object store), as [`Self::read_primary`]
    /// does one; short at the end of the object.
    pub(crate) fn read_primary_span(
        &self,
        handle: &ObjectHandle,
        first: u64,
        records: usize,
        token: u64,
    ) -> io::Result<AlignedBuf> {
        assert!(records > 0);
        let recordsize = handle.dataset.config.recordsize_bytes as usize;
        let mut data = AlignedBuf::zeroed(recordsize * records);
        let offset = first * recordsize as u64;
        let expected = handle.state.generation_of(token);
        let timer = self.analytics.start();
        match handle
            .object
            .read_at_generation(offset, data.as_mut_slice(), expected.as_ref())
        {
            Ok(n) => {
                data.set_len(n);
                self.counters.primary_reads.add(1);
                self.counters.primary_read_bytes.add(n as u64);
                let dataset = handle.dataset_id.0 as usize;
                self.analytics
                    .primary_done(timer, dataset, handle.state.id, n as u64);
                Ok(data)
            }
            Err(e) => {
                if !is_stale(&e) {
                    self.counters.primary_errors.add(1);
                }
                Err(e)
            }
        }
    }

    /// Reads `records` whole records from `first` on from primary storage
    /// as one stream (`PrimaryObject::read_span_at_generation`), handing
    /// the bytes to `sink` as they arrive; counted as one read, as
    /// [`Self::read_primary_span`] is. `token` is the one the records will
    /// carry.
    pub(crate) fn read_primary_stream(
        &self,
        handle: &ObjectHandle,
        first: u64,
        records: usize,
        token: u64,
        sink: &mut dyn FnMut(&[u8]) -> bool,
    ) -> io::Result<usize> {
        let recordsize = handle.dataset.config.recordsize_bytes as usize;
        let expected = handle.state.generation_of(token);
        let timer = self.analytics.start();
        let result = handle.object.read_span_at_generation(
            first * recordsize as u64,
            recordsize * records,
            expected.as_ref(),
            sink,
        );
        match &result {
            Ok(n) => {
                self.counters.primary_reads.add(1);
                self.counters.primary_read_bytes.add(*n as u64);
                let dataset = handle.dataset_id.0 as usize;
                self.analytics
                    .primary_done(timer, dataset, handle.state.id, *n as u64);
            }
            Err(e) if !is_stale(e) => self.counters.primary_errors.add(1),
            Err(_) => {}
        }
        result
    }

    /// `arc_max`: the most DRAM record buffers may take.
    pub fn arc_max_bytes(&self) -> u64 {
        self.config.arc_max_bytes
    }

    fn read_uncached(
        &self,
        handle: &ObjectHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<usize> {
        let align = handle.object.read_alignment_bytes() as u64;
        let timer = self.analytics.start();
        let n = if align <= 1 {
            handle.object.read_at(offset, buf)?
        } else {
            // O_DIRECT below: read whole aligned blocks, then copy out.
            let start = offset / align * align;
            let end = offset
                .checked_add(buf.len() as u64)
                .and_then(|end| end.checked_next_multiple_of(align))
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("read {offset}+{} is beyond the largest offset", buf.len()),
                    )
                })?;
            let mut bounce = AlignedBuf::zeroed((end - start) as usize);
            let got = handle.object.read_at(start, bounce.as_mut_slice())?;
            let skip = (offset - start) as usize;
            let n = got.saturating_sub(skip).min(buf.len());
            buf[..n].copy_from_slice(&bounce[skip..skip + n]);
            n
        };
        self.counters.primary_reads.add(1);
        self.counters.primary_read_bytes.add(n as u64);
        let dataset = handle.dataset_id.0 as usize;
        self.analytics
            .primary_done(timer, dataset, handle.state.id, n as u64);
        self.counters.reads.add(1);
        self.counters.read_bytes.add(n as u64);
        Ok(n)
    }

    /// Writes through to primary storage, then drops every cached record the
    /// write touched (and the old last record, whose short length the write
    /// may have made wrong).
    pub fn write(&self, handle: &ObjectHandle, offset: u64, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let _in_flight = WriteInFlight::new(&handle.state);
        let old_size_bytes = handle.size_bytes();
        if let Err(e) = handle.object.write_at(offset, data) {
            // Part of it may have landed (ENOSPC, EIO, end of a device):
            // drop every record of the object rather than serve old bytes.
            self.invalidate_object(handle);
            return Err(e);
        }
        self.drop_changed_range(handle, offset, data.len() as u64, old_size_bytes)?;
        self.counters.writes.add(1);
        self.counters.write_bytes.add(data.len() as u64);
        Ok(())
    }

    /// Punches a hole in primary storage (TRIM, discard: the range then
    /// reads as zeros, the size stays), then drops every cached record the
    /// hole touched, exactly as [`Self::write`] does. A primary that cannot
    /// punch holes returns `ErrorKind::Unsupported` and nothing changes.
    pub fn discard(&self, handle: &ObjectHandle, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        if offset.checked_add(len).is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("discard {offset}+{len} is beyond the largest offset"),
            ));
        }
        let _in_flight = WriteInFlight::new(&handle.state);
        let old_size_bytes = handle.size_bytes();
        if let Err(e) = handle.object.punch_hole(offset, len) {
            if e.kind() != io::ErrorKind::Unsupported {
                // Part of the range may be gone already: trust no record.
                self.invalidate_object(handle);
            }
            return Err(e);
        }
        self.drop_changed_range(handle, offset, len, old_size_bytes)
    }

    /// After primary storage changed `len` bytes at `offset` (a write or a
    /// hole; `len` > 0): drops the records that cover them from both tiers
    /// and adopts the object's new generation without a new token.
    fn drop_changed_range(
        &self,
        handle: &ObjectHandle,
        offset: u64,
        len: u64,
        old_size_bytes: u64,
    ) -> io::Result<()> {
        debug_assert!(len > 0);
        let recordsize = u64::from(handle.dataset.config.recordsize_bytes);
        let end = offset.saturating_add(len);
        let first = offset / recordsize;
        let last = (end - 1) / recordsize;
        // A short old last record grows with a write past the old end: its
        // cached copies are wrong then. Records beyond the old end were
        // never cached.
        let old_last = (end > old_size_bytes && !old_size_bytes.is_multiple_of(recordsize))
            .then(|| old_size_bytes / recordsize);
        let token = handle.state.token.load(Ordering::Acquire);
        {
            // Under the lock a feed holds while it indexes a batch: a feed
            // either indexed its copies before (and they are dropped here) or
            // sees this write and indexes none of this object's records.
            let mut invalidations = self.invalidations.lock().expect("invalidations poisoned");
            let dropped = (
                old_last.unwrap_or(first).min(first),
                last.max(old_last.unwrap_or(last)),
            );
            note_invalidation(
                &mut invalidations,
                &self.invalidation_sequence,
                handle,
                dropped,
            );
            for record in old_last.into_iter().chain(first..=last) {
                self.drop_record(handle, record, token);
            }
        }
        let info = handle.object.info()?;
        self.adopt(handle, info, false);
        Ok(())
    }

    /// Drops one record from the L2ARC and the ARC. In that order: a fill
    /// that read the flash copy before it was dropped was claimed before
    /// the ARC invalidation, which dooms it, so it never enters the ARC.
    fn drop_record(&self, handle: &ObjectHandle, record: u64, token: u64) {
        if let Some(l2) = self.l2.get() {
            l2.invalidate(l2_key_hash(
                handle.dataset.uid,
                handle.state.id,
                record,
                token,
            ));
        }
        self.arc.invalidate(RecordKey {
            dataset: handle.dataset_id.0,
            object: handle.state.id,
            record,
        });
    }

    /// Makes written data durable on primary storage.
    pub fn sync(&self, handle: &ObjectHandle) -> io::Result<()> {
        handle.object.sync()
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
