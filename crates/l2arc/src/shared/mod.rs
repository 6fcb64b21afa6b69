//! The shared tier: records a fleet of nodes keeps in one S3-compatible
//! bucket, read after the L2ARC and before primary storage.
//!
//! Why. N nodes that read the same bucket each warm their own ARC and
//! L2ARC from it: N times the GETs and N cold starts. With a tier they
//! share, the first node to read a record from primary storage puts it in
//! the cache bucket, and every other node finds it there, in a bucket
//! chosen to be near and cheap (S3 Express One Zone, a MinIO or Ceph next
//! to the fleet) while the data bucket is far and billed per request. It
//! is a tier like the L2ARC (`crate::tier`), not a branch of the read path:
//! read order ARC, L2ARC, shared, primary.
//!
//! Names and trust (`block`). Blocks are found by a key that digests
//! everything naming the record's bytes (the object's endpoint, bucket
//! and key, its ETag, the recordsize and compression), so a changed object
//! is never served from an old block; each block repeats that name, a
//! CRC-32C, and with a fleet key an HMAC-SHA256, all checked on every
//! read. A block that fails any check is a miss, counted by reason.
//!
//! Reads in flight together. A GET is a round trip; a sequential reader's
//! read-ahead span, read one record at a time, would cost one a record
//! and leave the fleet's second node slower than the first, which
//! streams spans from the source. So the read path hands the tiers a
//! span's records in batches (`Tier::read_many`), and this tier has their
//! GETs in flight at once on its runtime (measured: a 20 ms cache bucket
//! read at 70-83 MiB/s in batches, 31 MiB/s one by one).
//!
//! Writes behind the reader. A record filled from primary storage is
//! offered here after its readers were woken (`offer_primary_fill`): it
//! is copied into a bounded queue (records and bytes) and put by a small
//! pool of writer tasks on the tier's own tokio runtime. A full queue, or
//! a tier backing off, drops the record (counted): a read never waits for
//! a write. A record read from this tier fills the ARC as a primary read
//! would, and is never written back (it is here already).
//!
//! Admission (`SharedAdmit`). `all` writes every primary fill. `mfu`
//! writes only records the local ARC saw twice, from the two places the
//! ARC says so: a fill whose insert was a ghost hit (read, evicted, read
//! again: written at the fill), and a record evicted from the MFU list
//! (read twice while resident, so promoted: written when it leaves the
//! ARC, with the bytes the eviction hands over). For the second, a record
//! filled from primary and not yet seen twice leaves its block name in a
//! small bounded table (`PENDING_NAMES_MAX`, oldest forgotten first): an
//! eviction carries only the ARC's key, not the object's identity. That
//! is the simplest hook that is exact about "seen twice" without a new
//! callback in the ARC's hit path, whose cost is counted in nanoseconds.
//!
//! Faults. Every GET has the tier's own timeout (well under the
//! primary's); a GET past it is a miss, and its record comes from primary
//! storage. After an error, or `TIMEOUTS_BEFORE_BACKOFF` timeouts in a row,
//! the tier is skipped (reads go straight to primary storage, writes are
//! dropped) for a backoff that doubles up to `BACKOFF_MAX_MS` and resets
//! at the first answer; the first request after a backoff is the probe.
//! Why not at the first timeout: one slow GET is a tail (a disk's queue, a
//! store's p99.9), not a store that is down, and a backoff sends a
//! read-ahead span's whole rest to the far source: measured on a node
//! reading the tier while its own flash wrote, one 200 ms GET in 4096 cost
//! 31 records from the source and a third of the pass's rate. A store
//! that is down or hung fails every GET, so three in a row come at once.
//! None of it is an error to a reader. A PUT has a longer bound of its
//! own (`put_timeout_ms`): it carries a whole block up, which on a slow
//! link outlasts a read's timeout without the store being unwell, and it
//! delays no reader; so a PUT past its bound is counted
//! (`shared_write_timeouts`) and dropped, and only a PUT the store refuses
//! puts the tier into backoff. Reads judge the store's latency by their
//! own GETs: a PUT that succeeds does not end a run of read timeouts.

mod block;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::arc::live::Record;
use crate::arc::policy::ListId;
use crate::buf::AlignedBuf;
use crate::latency::{HistogramSnapshot, LatencyHistogram};
use crate::lock_order::{RankedMutex, rank};
use crate::primary::object_store::ObjectStoreConfig;
use crate::tier::{BelowKey, EvictedRecord, Tier};
use block::{BAD_KSTATS, BAD_REASONS, BadReason, BlockName};

pub(crate) use block::FLEET_KEY_BYTES_MIN;

/// The default timeout of one GET of the shared tier.
pub const SHARED_TIMEOUT_DEFAULT_MS: u64 = 200;
/// The default bound of one PUT (a block carried up, behind the reader).
pub const SHARED_PUT_TIMEOUT_DEFAULT_MS: u64 = 5_000;
/// Records the write queue holds at most (by default).
pub const SHARED_QUEUE_RECORDS_DEFAULT: usize = 256;
/// Bytes the write queue holds at most (by default).
pub const SHARED_QUEUE_BYTES_DEFAULT: u64 = 64 << 20;
/// Writer tasks (PUTs in flight at most), by default.
pub const SHARED_WRITERS_DEFAULT: usize = 4;
/// The first backoff after a failure.
const BACKOFF_BASE_MS: u64 = 100;
/// The longest backoff.
const BACKOFF_MAX_MS: u64 = 5_000;
/// GETs past their timeout in a row that put the tier into backoff.
const TIMEOUTS_BEFORE_BACKOFF: u64 = 3;
/// Block names kept for `mfu` admission of records still resident.
const PENDING_NAMES_MAX: usize = 1 << 16;
const _: () = assert!(SHARED_QUEUE_RECORDS_DEFAULT > 0 && SHARED_WRITERS_DEFAULT > 0);
const _: () = assert!(BACKOFF_BASE_MS <= BACKOFF_MAX_MS);

/// Which records a node writes to the shared tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SharedAdmit {
    /// Every record filled from primary storage.
    #[default]
    All,
    /// Only records the local ARC saw twice (see the module comment).
    Mfu,
}

impl std::str::FromStr for SharedAdmit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        debug_assert!(Self::default() == Self::All);
        match s {
            "all" => Ok(Self::All),
            "mfu" => Ok(Self::Mfu),
            _ => Err(format!("shared cache admission is all or mfu, not {s:?}")),
        }
    }
}

impl std::fmt::Display for SharedAdmit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug_assert!(matches!(self, Self::All | Self::Mfu));
        f.write_str(match self {
            Self::All => "all",
            Self::Mfu => "mfu",
        })
    }
}

/// How to reach a shared tier's bucket and what to do with it.
#[derive(Clone)]
#[non_exhaustive]
pub struct SharedTierConfig {
    /// The cache bucket (its `root` option is the key prefix). Only the
    /// scheme and options are used.
    pub store: ObjectStoreConfig,
    /// The fleet's secret (at least 32 bytes): blocks are signed with it
    /// and only signed blocks are taken. Never printed.
    pub fleet_key: Option<Vec<u8>>,
    /// Which records this node writes.
    pub admit: SharedAdmit,
    /// Timeout of one GET.
    pub timeout_ms: u64,
    /// Bound of one PUT.
    pub put_timeout_ms: u64,
    /// Bounds of the write queue.
    pub queue_records_max: usize,
    /// Bounds of the write queue, bytes.
    pub queue_bytes_max: u64,
    /// PUTs in flight at most.
    pub writers: usize,
}

impl SharedTierConfig {
    /// A tier in `store`'s bucket with the defaults.
    pub fn new(store: ObjectStoreConfig) -> Self {
        debug_assert!(!store.scheme.is_empty());
        Self {
            store,
            fleet_key: None,
            admit: SharedAdmit::All,
            timeout_ms: SHARED_TIMEOUT_DEFAULT_MS,
            put_timeout_ms: SHARED_PUT_TIMEOUT_DEFAULT_MS,
            queue_records_max: SHARED_QUEUE_RECORDS_DEFAULT,
            queue_bytes_max: SHARED_QUEUE_BYTES_DEFAULT,
            writers: SHARED_WRITERS_DEFAULT,
        }
    }
}

impl std::fmt::Debug for SharedTierConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The fleet key is a secret: only whether there is one.
        debug_assert!(self.fleet_key.as_ref().is_none_or(|k| !k.is_empty()));
        f.debug_struct("SharedTierConfig")
            .field("store", &self.store)
            .field("keyed", &self.fleet_key.is_some())
            .field("admit", &self.admit)
            .field("timeout_ms", &self.timeout_ms)
            .field("put_timeout_ms", &self.put_timeout_ms)
            .field("queue_records_max", &self.queue_records_max)
            .field("queue_bytes_max", &self.queue_bytes_max)
            .field("writers", &self.writers)
            .finish()
    }
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    writes: AtomicU64,
    write_drops: AtomicU64,
    errors: AtomicU64,
    timeouts: AtomicU64,
    write_timeouts: AtomicU64,
    skips: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    bad: [AtomicU64; BAD_REASONS.len()],
}

/// Skip the tier after a failure, for a backoff that doubles.
struct Backoff {
    start: Instant,
    /// Ms since `start` before which the tier is skipped.
    skip_until_ms: AtomicU64,
    backoff_ms: AtomicU64,
    /// GETs past their timeout since the last one that was answered.
    timeouts_in_a_row: AtomicU64,
}

impl Backoff {
    fn now_ms(&self) -> u64 {
        let ms = self.start.elapsed().as_millis() as u64;
        debug_assert!(ms < u64::MAX / 2);
        ms
    }

    fn usable(&self) -> bool {
        let until = self.skip_until_ms.load(Ordering::Relaxed);
        debug_assert!(self.backoff_ms.load(Ordering::Relaxed) <= BACKOFF_MAX_MS);
        self.now_ms() >= until
    }

    fn failed(&self) {
        let backoff = self.backoff_ms.load(Ordering::Relaxed);
        self.skip_until_ms
            .store(self.now_ms() + backoff, Ordering::Relaxed);
        let next = (backoff * 2).min(BACKOFF_MAX_MS);
        self.backoff_ms.store(next, Ordering::Relaxed);
        debug_assert!(next >= BACKOFF_BASE_MS);
    }

    /// A GET past its timeout: a miss for its record, and a backoff once
    /// `TIMEOUTS_BEFORE_BACKOFF` come in a row (see the module comment).
    fn timed_out(&self) {
        let in_a_row = self.timeouts_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        if in_a_row >= TIMEOUTS_BEFORE_BACKOFF {
            self.failed();
        }
        debug_assert!(in_a_row > 0);
    }

    /// A request the store took (a PUT): the backoff starts small again.
    fn succeeded(&self) {
        self.backoff_ms.store(BACKOFF_BASE_MS, Ordering::Relaxed);
        debug_assert!(self.now_ms() < u64::MAX / 2);
    }

    /// A GET the store answered in time: it also ends a run of timeouts
    /// (only GETs do: reads judge the store by their own latency).
    fn answered(&self) {
        self.succeeded();
        self.timeouts_in_a_row.store(0, Ordering::Relaxed);
    }
}

/// A record waiting for its PUT.
struct Job {
    name: BlockName,
    data: AlignedBuf,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    bytes: u64,
}

/// Block names of records filled once and still resident (`mfu`).
#[derive(Default)]
struct PendingNames {
    names: HashMap<u64, BlockName>,
    order: VecDeque<u64>,
}

/// What the writer tasks share with the tier.
struct Inner {
    op: opendal::Operator,
    /// Shared with the GET tasks, which check blocks as they arrive.
    fleet_key: Option<Arc<[u8]>>,
    timeout: Duration,
    put_timeout: Duration,
    queue_records_max: usize,
    queue_bytes_max: u64,
    queue: RankedMutex<Queue, { rank::LEAF }>,
    wake: tokio::sync::Notify,
    stopping: AtomicBool,
    backoff: Backoff,
    counters: Counters,
}

/// The shared tier (see the module comment).
pub(crate) struct SharedTier {
    inner: Arc<Inner>,
    admit: SharedAdmit,
    pending: RankedMutex<PendingNames, { rank::LEAF }>,
    latency: LatencyHistogram,
    /// Last: dropped after everything its tasks use is unreachable.
    runtime: tokio::runtime::Runtime,
}

impl SharedTier {
    /// Builds the tier and starts its writers. Checks nothing on the
    /// network (a tier that is down at start is one that is down).
    pub(crate) fn new(config: SharedTierConfig) -> io::Result<Self> {
        if let Some(key) = &config.fleet_key
            && key.len() < FLEET_KEY_BYTES_MIN
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a shared cache key holds at least {FLEET_KEY_BYTES_MIN} bytes, not {}",
                    key.len()
                ),
            ));
        }
        if config.timeout_ms == 0
            || config.put_timeout_ms == 0
            || config.writers == 0
            || config.queue_records_max == 0
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{config:?}: timeouts, writers and queue must be positive"),
            ));
        }
        opendal::install_default();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("l2arc-shared")
            .enable_all()
            .build()?;
        let op = {
            let _guard = runtime.enter();
            opendal::Operator::via_iter(&config.store.scheme, config.store.options.clone())
                .map_err(|e| io::Error::other(format!("{}: {e}", config.store.display_name)))?
        };
        let inner = Arc::new(Inner {
            op,
            fleet_key: config.fleet_key.map(Arc::from),
            timeout: Duration::from_millis(config.timeout_ms),
            put_timeout: Duration::from_millis(config.put_timeout_ms),
            queue_records_max: config.queue_records_max,
            queue_bytes_max: config.queue_bytes_max,
            queue: RankedMutex::new(Queue::default()),
            wake: tokio::sync::Notify::new(),
            stopping: AtomicBool::new(false),
            backoff: Backoff {
                start: Instant::now(),
                skip_until_ms: AtomicU64::new(0),
                backoff_ms: AtomicU64::new(BACKOFF_BASE_MS),
                timeouts_in_a_row: AtomicU64::new(0),
            },
            counters: Counters::default(),
        });
        for _ in 0..config.writers {
            runtime.spawn(writer(Arc::clone(&inner)));
        }
        assert!(inner.queue_records_max > 0 && !inner.timeout.is_zero());
        Ok(Self {
            inner,
            admit: config.admit,
            pending: RankedMutex::new(PendingNames::default()),
            latency: LatencyHistogram::default(),
            runtime,
        })
    }

    /// Latency of the tier's reads that found a block (hits and bad blocks).
    pub(crate) fn read_latency(&self) -> HistogramSnapshot {
        let snapshot = self.latency.snapshot();
        debug_assert!(
            snapshot.count() <= self.counters().hits.load(Ordering::Relaxed) + self.bad_total()
        );
        snapshot
    }

    fn counters(&self) -> &Counters {
        debug_assert!(self.inner.queue_records_max > 0);
        &self.inner.counters
    }

    fn bad_total(&self) -> u64 {
        let total = self
            .counters()
            .bad
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum();
        debug_assert!(total < u64::MAX);
        total
    }

    /// The block name of a record, if its object has an identity beyond
    /// this node (an object store's object at a version it remembers).
    fn name_of(key: &BelowKey<'_>) -> Option<BlockName> {
        let generation = (key.generation)()?;
        let source = key.object.source_identity(&generation)?;
        let name = BlockName::new(&source, key.index, key.recordsize_bytes, key.compression);
        debug_assert!(name.as_ref().is_none_or(|n| n.index == key.index));
        name
    }

    /// One GET of a block, bounded by the tier's timeout, checked as it
    /// arrives (`block::Decoder`). Counts what went wrong.
    fn get(&self, name: &BlockName, started: Instant) -> Option<AlignedBuf> {
        debug_assert!(name.recordsize_bytes > 0);
        let inner = &*self.inner;
        let fetched = self.runtime.block_on(fetch(
            inner.op.clone(),
            name.clone(),
            inner.fleet_key.clone(),
            inner.timeout,
        ));
        self.note_get(name, fetched, started)
    }

    /// Counts how a GET ended, and moves the backoff: the record, if its
    /// block came and passed every check.
    fn note_get(&self, name: &BlockName, fetched: Fetched, started: Instant) -> Option<AlignedBuf> {
        let inner = &*self.inner;
        let c = &inner.counters;
        let decoded = match fetched {
            Err(_) => {
                c.timeouts.fetch_add(1, Ordering::Relaxed);
                inner.backoff.timed_out();
                return None;
            }
            Ok(Err(e)) if e.kind() == opendal::ErrorKind::NotFound => {
                inner.backoff.answered();
                c.misses.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            Ok(Err(e)) => {
                log::debug!("shared cache: GET {}: {e}", name.object_key(""));
                c.errors.fetch_add(1, Ordering::Relaxed);
                inner.backoff.failed();
                return None;
            }
            Ok(Ok(decoded)) => {
                inner.backoff.answered();
                decoded
            }
        };
        self.latency.record(started.elapsed().as_nanos() as u64);
        match decoded {
            Err(reason) => {
                c.misses.fetch_add(1, Ordering::Relaxed);
                c.bad[reason.index()].fetch_add(1, Ordering::Relaxed);
                None
            }
            Ok(out) => {
                assert!(out.len() <= name.recordsize_bytes as usize);
                c.hits.fetch_add(1, Ordering::Relaxed);
                c.read_bytes.fetch_add(out.len() as u64, Ordering::Relaxed);
                Some(out)
            }
        }
    }

    /// Queues a record's PUT, or drops it (queue full, tier backing off).
    fn enqueue(&self, name: BlockName, data: &[u8]) {
        let inner = &*self.inner;
        let c = &inner.counters;
        let len = data.len() as u64;
        let room = |q: &Queue| {
            q.jobs.len() < inner.queue_records_max && q.bytes + len <= inner.queue_bytes_max
        };
        // Checked before the copy (a full queue costs no copy), and again
        // when the copy goes in.
        if !inner.backoff.usable() || !room(&inner.queue.lock().expect("queue poisoned")) {
            c.write_drops.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let data = AlignedBuf::copy_from(data);
        {
            let mut queue = inner.queue.lock().expect("queue poisoned");
            if !room(&queue) {
                drop(queue);
                c.write_drops.fetch_add(1, Ordering::Relaxed);
                return;
            }
            queue.bytes += len;
            queue.jobs.push_back(Job { name, data });
            debug_assert!(queue.jobs.len() <= inner.queue_records_max);
        }
        inner.wake.notify_one();
    }

    /// Remembers a record filled once (`mfu`): its name, for when it
    /// leaves the ARC's MFU list.
    fn remember_pending(&self, key_hash: u64, name: BlockName) {
        let mut pending = self.pending.lock().expect("pending poisoned");
        if pending.names.insert(key_hash, name).is_none() {
            pending.order.push_back(key_hash);
        }
        while pending.order.len() > PENDING_NAMES_MAX {
            let oldest = pending.order.pop_front().expect("longer than the bound");
            pending.names.remove(&oldest);
        }
        debug_assert!(pending.names.len() <= pending.order.len());
    }
}

/// How one GET ended: past the timeout, or the store's answer (a block
/// decoded, or refused by its reason).
type Fetched = Result<opendal::Result<Result<AlignedBuf, BadReason>>, tokio::time::error::Elapsed>;

/// One GET of `name`'s block within `timeout` (owned arguments: it may run
/// as a task of its own).
async fn fetch(
    op: opendal::Operator,
    name: BlockName,
    fleet_key: Option<Arc<[u8]>>,
    timeout: Duration,
) -> Fetched {
    debug_assert!(!timeout.is_zero());
    tokio::time::timeout(timeout, get_decoded(&op, &name, fleet_key.as_deref())).await
}

/// The block of `name`, streamed through its decoder: the body's pieces
/// go straight where they belong, and a block its first bytes already
/// refuse (longer than it says, not a block) is not read further.
async fn get_decoded(
    op: &opendal::Operator,
    name: &BlockName,
    fleet_key: Option<&[u8]>,
) -> opendal::Result<Result<AlignedBuf, BadReason>> {
    use futures_core::Stream;
    let stream = op
        .reader(&name.object_key(""))
        .await?
        .into_stream(..)
        .await?;
    let mut stream = std::pin::pin!(stream);
    let mut decoder = block::Decoder::new(name, fleet_key);
    while let Some(buffer) = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
        for chunk in buffer? {
            if let Err(reason) = decoder.feed(&chunk) {
                return Ok(Err(reason));
            }
        }
    }
    let decoded = decoder.finish();
    // A block's record is never longer than the record it names.
    debug_assert!(
        decoded
            .as_ref()
            .is_ok_and(|r| r.len() <= name.recordsize_bytes as usize)
            || decoded.is_err()
    );
    Ok(decoded)
}

/// One writer task: takes jobs off the queue and puts their blocks.
async fn writer(inner: Arc<Inner>) {
    loop {
        let job = {
            let mut queue = inner.queue.lock().expect("queue poisoned");
            let job = queue.jobs.pop_front();
            if let Some(job) = &job {
                queue.bytes -= job.data.len() as u64;
            }
            job
        };
        debug_assert!(
            job.as_ref()
                .is_none_or(|j| j.data.len() <= crate::RECORDSIZE_MAX_BYTES as usize)
        );
        let Some(job) = job else {
            if inner.stopping.load(Ordering::Acquire) {
                return;
            }
            inner.wake.notified().await;
            continue;
        };
        let c = &inner.counters;
        if !inner.backoff.usable() {
            c.write_drops.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let block = block::encode(&job.name, &job.data, inner.fleet_key.as_deref());
        let len = block.len() as u64;
        let key = job.name.object_key("");
        match tokio::time::timeout(inner.put_timeout, inner.op.write(&key, block)).await {
            Err(_) => {
                // Slow, not refused: the block is dropped, reads go on.
                c.write_timeouts.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(e)) => {
                log::debug!("shared cache: PUT {key}: {e}");
                c.errors.fetch_add(1, Ordering::Relaxed);
                inner.backoff.failed();
            }
            Ok(Ok(_)) => {
                inner.backoff.succeeded();
                c.writes.fetch_add(1, Ordering::Relaxed);
                c.write_bytes.fetch_add(len, Ordering::Relaxed);
            }
        }
    }
}

impl Tier for SharedTier {
    fn read(&self, key: &BelowKey<'_>) -> Option<AlignedBuf> {
        if !self.inner.backoff.usable() {
            self.counters().skips.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let name = Self::name_of(key)?;
        let started = Instant::now();
        self.get(&name, started)
    }

    fn read_many(&self, keys: &[BelowKey<'_>], out: &mut [Option<AlignedBuf>]) {
        debug_assert_eq!(keys.len(), out.len());
        let inner = &*self.inner;
        let wanted = out.iter().filter(|s| s.is_none()).count() as u64;
        if !inner.backoff.usable() {
            self.counters().skips.fetch_add(wanted, Ordering::Relaxed);
            return;
        }
        // Every GET of the batch in flight at once (a batch is bounded by
        // the read path's `BELOW_BATCH_RECORDS`), then checked in order.
        let started = Instant::now();
        let mut pending = Vec::with_capacity(keys.len());
        for (slot, key) in keys.iter().enumerate() {
            if out[slot].is_some() {
                continue;
            }
            let Some(name) = Self::name_of(key) else {
                continue;
            };
            let get = fetch(
                inner.op.clone(),
                name.clone(),
                inner.fleet_key.clone(),
                inner.timeout,
            );
            pending.push((slot, name, self.runtime.spawn(get)));
        }
        for (slot, name, task) in pending {
            // A task that panicked is a failed GET (an error, a miss).
            let fetched = self.runtime.block_on(task).unwrap_or_else(|e| {
                Ok(Err(opendal::Error::new(
                    opendal::ErrorKind::Unexpected,
                    e.to_string(),
                )))
            });
            out[slot] = self.note_get(&name, fetched, started);
        }
    }

    fn read_piece(
        &self,
        key: &BelowKey<'_>,
        wanted: std::ops::Range<usize>,
    ) -> Option<(AlignedBuf, std::ops::Range<usize>, usize)> {
        // A block is read whole (it is one object): a piece read would
        // cost the whole GET and fill nothing; the read path then reads
        // the record whole (`read`) and fills the ARC with it.
        debug_assert!(key.hash != 0 && wanted.start <= wanted.end);
        None
    }

    fn holds(&self, key_hash: u64) -> Option<bool> {
        // Unknown without a request (no I/O here).
        debug_assert_ne!(key_hash, 0);
        None
    }

    fn offer_fill(&self, bytes: u64) {
        // Only fills from primary storage are written (`offer_primary_fill`).
        debug_assert!(bytes <= u64::from(crate::RECORDSIZE_MAX_BYTES));
    }

    fn offer_primary_fill(&self, key: &BelowKey<'_>, record: &Record, seen_before: bool) {
        debug_assert!(record.data.len() <= key.recordsize_bytes as usize);
        if record.data.is_empty() || self.inner.stopping.load(Ordering::Relaxed) {
            return;
        }
        let Some(name) = Self::name_of(key) else {
            return;
        };
        if self.admit == SharedAdmit::Mfu {
            if !seen_before {
                self.remember_pending(key.hash, name);
                return;
            }
            // Seen twice: written now, never again at its MFU eviction.
            self.pending
                .lock()
                .expect("pending poisoned")
                .names
                .remove(&key.hash);
        }
        self.enqueue(name, record.data.as_slice());
    }

    fn offer_evicted(&self, evicted: &mut dyn Iterator<Item = EvictedRecord>) {
        if self.admit != SharedAdmit::Mfu {
            return;
        }
        for e in evicted {
            debug_assert!(matches!(e.from, ListId::Mru | ListId::Mfu));
            // Read twice while resident (promoted) is what leaves from MFU;
            // one that leaves MRU keeps its name: it may come back (a ghost
            // hit, from the L2ARC) and leave MFU later.
            if e.from != ListId::Mfu || !e.keeping.below_arc || e.record.data.is_empty() {
                continue;
            }
            let key_hash = e.keeping.key_hash(&e.key, e.record.generation_token);
            let name = self
                .pending
                .lock()
                .expect("pending poisoned")
                .names
                .remove(&key_hash);
            // (Its entry in `order` goes when it comes up: the bound holds.)
            if let Some(name) = name {
                self.enqueue(name, e.record.data.as_slice());
            }
        }
    }

    fn drop_record(&self, key_hash: u64) {
        // An object store primary is read-only: a write through the cache
        // never makes a block stale (a changed object has a new key).
        debug_assert_ne!(key_hash, 0);
        self.pending
            .lock()
            .expect("pending poisoned")
            .names
            .remove(&key_hash);
    }

    fn band(&self) -> crate::top_objects::Below {
        // A round trip, not a device read: a heat map of its own.
        debug_assert!(self.inner.queue_records_max > 0);
        crate::top_objects::Below::Shared
    }

    fn stop(&self) {
        self.inner.stopping.store(true, Ordering::Release);
        self.inner.wake.notify_waiters();
        debug_assert!(self.inner.stopping.load(Ordering::Relaxed));
    }

    fn kstats(&self, out: &mut Vec<(&'static str, u64)>) {
        let c = self.counters();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let queued = self.inner.queue.lock().expect("queue poisoned").bytes;
        out.extend([
            ("shared_hits", get(&c.hits)),
            ("shared_misses", get(&c.misses)),
            ("shared_writes", get(&c.writes)),
            ("shared_write_drops", get(&c.write_drops)),
            ("shared_errors", get(&c.errors)),
            ("shared_timeouts", get(&c.timeouts)),
            ("shared_write_timeouts", get(&c.write_timeouts)),
            ("shared_skips", get(&c.skips)),
            ("shared_read_bytes", get(&c.read_bytes)),
            ("shared_write_bytes", get(&c.write_bytes)),
            ("shared_bad", self.bad_total()),
            ("shared_writeq_size", queued),
        ]);
        out.extend(BAD_KSTATS.iter().copied().zip(c.bad.iter().map(get)));
        debug_assert!(out.len() >= BAD_KSTATS.len());
    }
}

/// Every kstat of a shared tier, named even when none is attached (for
/// `/metrics` help lines and `l2arc stat`).
pub const SHARED_KSTATS: [&str; 19] = [
    "shared_hits",
    "shared_misses",
    "shared_writes",
    "shared_write_drops",
    "shared_errors",
    "shared_timeouts",
    "shared_write_timeouts",
    "shared_skips",
    "shared_read_bytes",
    "shared_write_bytes",
    "shared_bad",
    "shared_writeq_size",
    BAD_KSTATS[0],
    BAD_KSTATS[1],
    BAD_KSTATS[2],
    BAD_KSTATS[3],
    BAD_KSTATS[4],
    BAD_KSTATS[5],
    BAD_KSTATS[6],
];
