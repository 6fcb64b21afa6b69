//! The ARC's shape saved, checkpointed and brought back: a restart that
//! comes back hot.
//!
//! Why. After a restart the L2ARC is rebuilt in seconds, but every record
//! that was in DRAM is read from flash again one demand miss at a time,
//! and the ARC has forgotten what it had learnt (MFU against MRU, the
//! ghosts, `p`): for minutes the hit ratio and the latency are those of a
//! cache that never saw the workload. ZFS users live with it; CacheLib
//! keeps its DRAM cache across restarts by saving it. We save only the
//! shape (keys, sizes, order, ghosts, `p`: `arc::shape`), because the
//! bytes are on flash already (a clean stop writes what was only in DRAM
//! first), and read the records back from flash at the device's rate.
//!
//! Save. Each shard's lists are copied out under its lock, briefly (keys,
//! sizes, tokens); names and dataset uids are looked up after, and the
//! file is encoded and written with no ARC lock held: to a temporary file
//! in the same directory, synced, renamed over the old one, and the
//! directory synced, so a crash leaves the old checkpoint or the new one,
//! never a mixture. Records of objects whose name the cache does not know
//! (an object opened by descriptor and never named) cannot be reopened at
//! start: they are left out and counted. A save while a prewarm is still
//! running is skipped: the ARC then holds only part of the saved shape,
//! and saving it would forget the rest.
//!
//! Restore. `p` per shard (clipped to the shard's `c`; scaled by `c` if
//! the shard count changed) and the ghosts, in order at the cold ends,
//! within the directory bounds, at once; then the prewarm starts in the
//! background and the cache serves meanwhile.
//!
//! Prewarm. It waits for the L2ARC's rebuild, reopens each object by name
//! and compares its generation token now with the saved one: an object
//! that changed while the service was stopped (a rewrite, even one of the
//! same size with its mtime put back, moves ctime; an S3 overwrite moves
//! the ETag) is never prewarmed. Then it walks the saved records hottest
//! first (MFU hot to cold across shards, then MRU): each record is
//! claimed through the ARC's fill table (so a demand read of it waits for
//! that read, and a demand read of a record not claimed reads it itself,
//! never waiting behind the queue), read from flash only (never from
//! primary storage: a record not on flash is skipped) by several readers
//! that always have reads queued (`PREWARM_IN_FLIGHT` claimed ahead, in
//! batches: records of a batch that lie back to back on flash, as the
//! stop flush writes the ARC hottest first, are read in one device read
//! of up to 1 MiB, as a sequential reader would, and each is checked on
//! its own blocks), and published in the saved order at the COLD end of its saved list, so that the lists come back in the saved order while demand reads
//! meanwhile land at the hot ends. It stops at the bytes the ARC held when
//! the shape was saved, and an insert that does not fit under the shard's
//! `c` as it is now is refused: the prewarm never evicts and never takes
//! the ARC past `c`.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::Cache;
use super::objects::DatasetId;
use crate::arc::live::{Record, RecordKey, ShardShape};
use crate::arc::policy::ListId;
use crate::arc::shape::{
    self, SHAPE_BYTES_MAX, SHAPE_GHOST_ENTRY_BYTES, SHAPE_NAME_BYTES_MAX, SHAPE_RECORD_BYTES_MAX,
    SHAPE_RECORD_ENTRY_BYTES, SHAPE_REJECT_REASONS, SavedGhost, SavedObject, SavedRecord,
    SavedShape, SavedShard, ShapeRejected,
};
use crate::buf::AlignedBuf;
use crate::hash::FastHashMap;
use crate::l2arc::RunRead;
use crate::lock_order::{RankedMutex, rank};
pub use crate::stats::ShapeStats;
use crate::tier::{Tier, record_key_hash};

/// Records the prewarm has claimed and not yet published: a demand read of
/// one waits at most for the reads ahead of it (they are published in the
/// saved order). Bounds the buffers held too (128 records of at most 1 MiB).
const PREWARM_IN_FLIGHT: usize = 128;
/// Threads reading from flash for the prewarm: reads in flight on the
/// device (blocking reads; a device needs several queued for its rate).
const PREWARM_READERS: usize = 32;
/// Claims wait until this many records are published, so that a batch is
/// large enough to find records back to back on flash to read together.
const PREWARM_CLAIM_BATCH: usize = 32;
const _: () = assert!(PREWARM_CLAIM_BATCH <= PREWARM_IN_FLIGHT && PREWARM_READERS >= 1);
/// The longest the prewarm waits for the L2ARC's rebuild.
const PREWARM_REBUILD_WAIT: Duration = Duration::from_secs(600);

/// The shape's and the prewarm's counters (`CacheStats::shape`).
#[derive(Default)]
pub(crate) struct ShapeCounters {
    prewarm_records: AtomicU64,
    prewarm_bytes: AtomicU64,
    prewarm_ms: AtomicU64,
    prewarm_reads: AtomicU64,
    prewarm_stale: AtomicU64,
    prewarm_missing: AtomicU64,
    prewarm_active: AtomicU64,
    prewarm_queued: AtomicU64,
    checkpoints: AtomicU64,
    checkpoint_bytes: AtomicU64,
    checkpoint_records: AtomicU64,
    checkpoint_unix_secs: AtomicU64,
    checkpoint_unnamed: AtomicU64,
    checkpoint_dropped: AtomicU64,
    rejected: [AtomicU64; SHAPE_REJECT_REASONS.len()],
    /// A save is writing the checkpoint.
    saving: AtomicBool,
}

/// What a save wrote.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct SavedShapeSummary {
    /// Resident records in the checkpoint.
    pub records: u64,
    /// Their bytes (what the ARC held of them).
    pub resident_bytes: u64,
    /// Ghost keys in it.
    pub ghosts: u64,
    /// Size of the file, bytes.
    pub file_bytes: u64,
    /// Resident records left out: their object has no known name.
    pub unnamed_records: u64,
    /// Entries left out by the size bound.
    pub dropped_records: u64,
}

/// What a restore found.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct RestoredShape {
    /// Resident records in the checkpoint (the prewarm's candidates).
    pub records: u64,
    /// Their bytes.
    pub resident_bytes: u64,
    /// Ghost keys put back.
    pub ghosts: u64,
    /// How old the checkpoint is, seconds.
    pub age_secs: u64,
    /// Whether a prewarm was started.
    pub prewarm_started: bool,
}

/// Why nothing was restored.
#[derive(Debug)]
pub enum RestoreError {
    /// No checkpoint at the path.
    Missing,
    /// A checkpoint that failed its checks (counted by reason).
    Rejected(ShapeRejected),
    /// It could not be read.
    Io(io::Error),
}

impl std::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestoreError::Missing => write!(f, "no checkpoint"),
            RestoreError::Rejected(why) => write!(f, "rejected: {why}"),
            RestoreError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for RestoreError {}

fn unix_secs_now() -> u64 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // 0 marks "never" in the checkpoint time (a clock before 1970 too).
    debug_assert!(secs < u64::MAX / 2);
    secs
}

/// One saved record in the prewarm's queue.
#[derive(Clone, Copy)]
struct Planned {
    object: u32,
    record: u64,
    list: ListId,
    prefetched: bool,
}

/// The object table of a shape being saved, and the names looked up.
#[derive(Default)]
struct ObjectTables {
    /// (dataset, object, token) -> index in `SavedShape::objects`.
    objects: FastHashMap<(u32, u64, u64), u32>,
    names: FastHashMap<(u32, u64), Option<Arc<str>>>,
}

/// What the prewarm works from.
struct PrewarmPlan {
    objects: Vec<SavedObject>,
    /// Saved dataset index -> current dataset (None: no longer there).
    datasets: Vec<Option<(DatasetId, u64)>>,
    queue: Vec<Planned>,
    target_bytes: u64,
}

impl Cache {
    /// The ARC's shape as a checkpoint (nothing written), and the counts
    /// of what was left out (unnamed records, dropped entries).
    fn snapshot_shape(&self) -> (SavedShape, u64, u64) {
        let datasets: Vec<u64> = self
            .datasets
            .read()
            .expect("dataset lock poisoned")
            .iter()
            .map(|d| d.uid)
            .collect();
        let mut shape = SavedShape {
            created_unix_secs: unix_secs_now(),
            datasets,
            ..SavedShape::default()
        };
        let mut tables = ObjectTables::default();
        let mut unnamed = 0u64;
        let mut copied = ShardShape::default();
        for index in 0..self.arc.shard_count() {
            self.arc.shape_of_shard(index, &mut copied);
            let mut saved = SavedShard {
                p_bytes: copied.p_bytes,
                c_bytes: copied.c_bytes,
                ..SavedShard::default()
            };
            unnamed += self.save_residents(&copied, &mut shape, &mut saved, &mut tables);
            for list in [ListId::MruGhost, ListId::MfuGhost] {
                let ghosts = copied.lists[list as usize].iter().map(|e| SavedGhost {
                    dataset: e.key.dataset,
                    object: e.key.object,
                    record: e.key.record,
                    size_bytes: e.size_bytes.clamp(1, u64::from(SHAPE_RECORD_BYTES_MAX)) as u32,
                });
                match list {
                    ListId::MruGhost => saved.mru_ghost.extend(ghosts),
                    _ => saved.mfu_ghost.extend(ghosts),
                }
            }
            shape.shards.push(saved);
        }
        let dropped = bound_shape(&mut shape, SHAPE_BYTES_MAX);
        // Every index points into its table (decode checks it again).
        debug_assert!(
            shape
                .objects
                .iter()
                .all(|o| (o.dataset as usize) < shape.datasets.len())
        );
        (shape, unnamed, dropped)
    }

    /// A shard's resident entries into `saved`, their objects into the
    /// shape's table; returns the records left out for want of a name.
    fn save_residents(
        &self,
        copied: &ShardShape,
        shape: &mut SavedShape,
        saved: &mut SavedShard,
        tables: &mut ObjectTables,
    ) -> u64 {
        let mut unnamed = 0u64;
        for list in [ListId::Mru, ListId::Mfu] {
            for e in &copied.lists[list as usize] {
                let name = tables
                    .names
                    .entry((e.key.dataset, e.key.object))
                    .or_insert_with(|| self.object_name(e.key.dataset, e.key.object));
                let Some(name) = name.as_ref().filter(|n| n.len() <= SHAPE_NAME_BYTES_MAX) else {
                    unnamed += 1;
                    continue;
                };
                let next = shape.objects.len() as u32;
                let object = *tables
                    .objects
                    .entry((e.key.dataset, e.key.object, e.token))
                    .or_insert_with(|| {
                        shape.objects.push(SavedObject {
                            dataset: e.key.dataset,
                            object: e.key.object,
                            token: e.token,
                            name: name.to_string(),
                        });
                        next
                    });
                let entry = SavedRecord {
                    object,
                    record: e.key.record,
                    size_bytes: e.size_bytes.clamp(1, u64::from(SHAPE_RECORD_BYTES_MAX)) as u32,
                    prefetched: e.prefetched,
                };
                match list {
                    ListId::Mru => saved.mru.push(entry),
                    _ => saved.mfu.push(entry),
                }
            }
        }
        debug_assert!(unnamed as usize <= copied.lists[0].len() + copied.lists[1].len());
        unnamed
    }

    /// The name the object `(dataset, object)` was last opened or named
    /// by, if the cache still holds its state.
    fn object_name(&self, dataset: u32, object: u64) -> Option<Arc<str>> {
        let state = self
            .objects
            .lock()
            .expect("object table poisoned")
            .get(&(dataset, object))
            .cloned()?;
        debug_assert_eq!(state.id, object);
        state.name()
    }

    /// Saves the ARC's shape (its lists hot to cold, the ghosts, `p` and
    /// `c` of each shard) to `path`, atomically (see the module comment).
    /// For embedders: call it at a clean stop, after the ARC's records
    /// were written to flash, and [`Cache::restore_arc_shape`] at start.
    /// Skipped (`Ok(None)`) while a prewarm runs.
    pub fn save_arc_shape(&self, path: impl AsRef<Path>) -> io::Result<Option<SavedShapeSummary>> {
        let path = path.as_ref();
        if self.shape.prewarm_active.load(Ordering::Acquire) != 0 {
            return Ok(None);
        }
        // One save at a time (they share the temporary file's name).
        while self
            .shape
            .saving
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        let (shape, unnamed, dropped) = self.snapshot_shape();
        let bytes = shape::encode(&shape);
        let written = write_atomically(path, &bytes);
        self.shape.saving.store(false, Ordering::Release);
        written?;
        let summary = SavedShapeSummary {
            records: shape.records(),
            resident_bytes: shape.resident_bytes(),
            ghosts: shape
                .shards
                .iter()
                .map(|s| (s.mru_ghost.len() + s.mfu_ghost.len()) as u64)
                .sum(),
            file_bytes: bytes.len() as u64,
            unnamed_records: unnamed,
            dropped_records: dropped,
        };
        let c = &self.shape;
        c.checkpoints.fetch_add(1, Ordering::Relaxed);
        c.checkpoint_bytes
            .store(summary.file_bytes, Ordering::Relaxed);
        c.checkpoint_records
            .store(summary.records, Ordering::Relaxed);
        c.checkpoint_unix_secs
            .store(shape.created_unix_secs.max(1), Ordering::Relaxed);
        c.checkpoint_unnamed.fetch_add(unnamed, Ordering::Relaxed);
        c.checkpoint_dropped.fetch_add(dropped, Ordering::Relaxed);
        assert!(summary.file_bytes <= SHAPE_BYTES_MAX + shape::SHAPE_HEADER_BYTES as u64);
        Ok(Some(summary))
    }

    /// Restores the ARC's shape saved at `path` (see the module comment):
    /// `p` and the ghosts at once, then, with `prewarm`, the records from
    /// flash in the background. Call it after the datasets and cache
    /// devices are added. A checkpoint that fails any check is counted by
    /// reason and nothing is restored (the cache starts cold).
    pub fn restore_arc_shape(
        self: &Arc<Self>,
        path: impl AsRef<Path>,
        prewarm: bool,
    ) -> Result<RestoredShape, RestoreError> {
        let path = path.as_ref();
        if self.shape.prewarm_active.load(Ordering::Acquire) != 0 {
            return Err(RestoreError::Io(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a prewarm runs already",
            )));
        }
        let bytes = match read_bounded(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(RestoreError::Missing),
            Err(e) => return Err(RestoreError::Io(e)),
        };
        let shape = match shape::decode(&bytes) {
            Ok(shape) => shape,
            Err(why) => {
                let at = SHAPE_REJECT_REASONS
                    .iter()
                    .position(|&r| r == why.reason())
                    .expect("a listed reason");
                self.shape.rejected[at].fetch_add(1, Ordering::Relaxed);
                log::warn!(
                    "ARC checkpoint {} {why}: ignored, the ARC starts cold",
                    path.display()
                );
                return Err(RestoreError::Rejected(why));
            }
        };
        let current: FastHashMap<u64, u32> = self
            .datasets
            .read()
            .expect("dataset lock poisoned")
            .iter()
            .zip(0u32..)
            .map(|(d, i)| (d.uid, i))
            .collect();
        let datasets: Vec<Option<(DatasetId, u64)>> = shape
            .datasets
            .iter()
            .map(|uid| current.get(uid).map(|&i| (DatasetId(i), *uid)))
            .collect();
        self.restore_p(&shape);
        let ghosts = self.restore_ghosts(&shape, &datasets);
        let c = &self.shape;
        c.checkpoint_bytes
            .store(bytes.len() as u64, Ordering::Relaxed);
        c.checkpoint_records
            .store(shape.records(), Ordering::Relaxed);
        c.checkpoint_unix_secs
            .store(shape.created_unix_secs.max(1), Ordering::Relaxed);
        let restored = RestoredShape {
            records: shape.records(),
            resident_bytes: shape.resident_bytes(),
            ghosts,
            age_secs: unix_secs_now().saturating_sub(shape.created_unix_secs),
            prewarm_started: prewarm && shape.records() > 0,
        };
        debug_assert!(restored.ghosts <= shape.encoded_bytes() / SHAPE_GHOST_ENTRY_BYTES);
        if restored.prewarm_started {
            self.start_prewarm(PrewarmPlan {
                queue: plan_queue(&shape),
                target_bytes: shape.resident_bytes(),
                objects: shape.objects,
                datasets,
            })
            .map_err(RestoreError::Io)?;
        }
        Ok(restored)
    }

    /// Starts the prewarm's thread (see the module comment).
    fn start_prewarm(&self, plan: PrewarmPlan) -> io::Result<()> {
        let c = &self.shape;
        c.prewarm_queued
            .store(plan.queue.len() as u64, Ordering::Relaxed);
        c.prewarm_active.store(1, Ordering::Release);
        let weak = self.me.clone();
        let spawned = std::thread::Builder::new()
            .name("l2arc-prewarm".into())
            .spawn(move || run_prewarm(weak, plan));
        if let Err(e) = spawned {
            c.prewarm_active.store(0, Ordering::Release);
            c.prewarm_queued.store(0, Ordering::Relaxed);
            return Err(e);
        }
        debug_assert!(c.prewarm_active.load(Ordering::Acquire) <= 1);
        Ok(())
    }

    /// Each shard's `p` from the checkpoint: its own when the shard count
    /// is the same (clipped to `c`), else the saved fraction of `c`.
    fn restore_p(&self, shape: &SavedShape) {
        let shards = self.arc.shard_count();
        if shape.shards.len() == shards {
            for (i, s) in shape.shards.iter().enumerate() {
                self.arc.restore_target_mru_bytes(i, s.p_bytes);
            }
            return;
        }
        let p: u64 = shape.shards.iter().map(|s| s.p_bytes).sum();
        let c: u64 = shape.shards.iter().map(|s| s.c_bytes).sum();
        let fraction = if c == 0 { 0.0 } else { p as f64 / c as f64 };
        debug_assert!((0.0..=1.0).contains(&fraction), "p <= c in every shard");
        let shard_c = self.config.arc_max_bytes / shards as u64;
        for i in 0..shards {
            self.arc
                .restore_target_mru_bytes(i, (shard_c as f64 * fraction) as u64);
        }
    }

    /// The ghosts, each list hot to cold at its cold end, within the
    /// directory bounds; those of datasets no longer here are left out.
    fn restore_ghosts(&self, shape: &SavedShape, datasets: &[Option<(DatasetId, u64)>]) -> u64 {
        let mut restored = 0u64;
        for s in &shape.shards {
            for (list, ghosts) in [
                (ListId::MruGhost, &s.mru_ghost),
                (ListId::MfuGhost, &s.mfu_ghost),
            ] {
                for g in ghosts {
                    let Some(Some((dataset, _))) = datasets.get(g.dataset as usize) else {
                        continue;
                    };
                    let key = RecordKey {
                        dataset: dataset.0,
                        object: g.object,
                        record: g.record,
                    };
                    restored +=
                        u64::from(self.arc.restore_ghost(key, u64::from(g.size_bytes), list));
                }
            }
        }
        debug_assert!(
            restored
                <= shape
                    .shards
                    .iter()
                    .map(|s| (s.mru_ghost.len() + s.mfu_ghost.len()) as u64)
                    .sum()
        );
        restored
    }

    /// The shape's and the prewarm's statistics now.
    pub(crate) fn shape_stats(&self, prewarm_joined: u64) -> ShapeStats {
        let c = &self.shape;
        let at = c.checkpoint_unix_secs.load(Ordering::Relaxed);
        let stats = ShapeStats {
            prewarm_records: c.prewarm_records.load(Ordering::Relaxed),
            prewarm_bytes: c.prewarm_bytes.load(Ordering::Relaxed),
            prewarm_ms: c.prewarm_ms.load(Ordering::Relaxed),
            prewarm_reads: c.prewarm_reads.load(Ordering::Relaxed),
            prewarm_joined,
            prewarm_stale: c.prewarm_stale.load(Ordering::Relaxed),
            prewarm_missing: c.prewarm_missing.load(Ordering::Relaxed),
            prewarm_active: c.prewarm_active.load(Ordering::Acquire),
            prewarm_queued_records: c.prewarm_queued.load(Ordering::Relaxed),
            checkpoints: c.checkpoints.load(Ordering::Relaxed),
            checkpoint_bytes: c.checkpoint_bytes.load(Ordering::Relaxed),
            checkpoint_records: c.checkpoint_records.load(Ordering::Relaxed),
            checkpoint_age_secs: if at == 0 {
                0
            } else {
                unix_secs_now().saturating_sub(at)
            },
            checkpoint_unnamed_records: c.checkpoint_unnamed.load(Ordering::Relaxed),
            checkpoint_dropped_records: c.checkpoint_dropped.load(Ordering::Relaxed),
            rejected: std::array::from_fn(|i| c.rejected[i].load(Ordering::Relaxed)),
        };
        debug_assert!(stats.prewarm_active <= 1);
        stats
    }

    /// Waits (bounded) until no prewarm runs; true if none does.
    pub fn wait_for_prewarm(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.shape.prewarm_active.load(Ordering::Acquire) != 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        debug_assert_eq!(self.shape.prewarm_active.load(Ordering::Acquire), 0);
        true
    }

    /// Saves the ARC's shape to `path` every `interval_secs` (0: never;
    /// only explicit saves) until the returned handle is dropped. Errors
    /// are logged, and the last good checkpoint stays.
    pub fn start_arc_checkpoints(
        self: &Arc<Self>,
        path: impl Into<PathBuf>,
        interval_secs: u64,
    ) -> io::Result<ArcCheckpointer> {
        let path = path.into();
        if interval_secs == 0 {
            return Ok(ArcCheckpointer {
                stop: None,
                thread: None,
            });
        }
        let (stop, stopped) = mpsc::channel::<()>();
        let weak = self.me.clone();
        let interval = Duration::from_secs(interval_secs);
        let thread = std::thread::Builder::new()
            .name("l2arc-arc-ckpt".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    let Some(cache) = weak.upgrade() else { return };
                    if let Err(e) = cache.save_arc_shape(&path) {
                        log::warn!("ARC checkpoint {}: {e}", path.display());
                    }
                }
            })?;
        debug_assert!(!thread.is_finished() || interval_secs > 0);
        Ok(ArcCheckpointer {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

/// The checkpoint thread (`Cache::start_arc_checkpoints`): stops and is
/// joined when dropped.
pub struct ArcCheckpointer {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for ArcCheckpointer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        debug_assert!(self.thread.is_none());
    }
}

/// Leaves out the coldest entries until the encoded checkpoint is within
/// `max_bytes`: ghosts first, then MRU, then MFU, one from each shard's
/// cold end per round. Returns how many were left out.
fn bound_shape(shape: &mut SavedShape, max_bytes: u64) -> u64 {
    let mut bytes = shape.encoded_bytes();
    let mut dropped = 0u64;
    while bytes > max_bytes {
        let mut progress = false;
        for s in shape.shards.iter_mut() {
            if bytes <= max_bytes {
                break;
            }
            if s.mfu_ghost.pop().or_else(|| s.mru_ghost.pop()).is_some() {
                bytes -= SHAPE_GHOST_ENTRY_BYTES;
            } else if s.mru.pop().or_else(|| s.mfu.pop()).is_some() {
                bytes -= SHAPE_RECORD_ENTRY_BYTES;
            } else {
                continue;
            }
            dropped += 1;
            progress = true;
        }
        if !progress {
            break; // only the tables are left: within any sane bound
        }
    }
    debug_assert!(bytes == shape.encoded_bytes());
    dropped
}

/// The saved records, hottest first: MFU hot to cold, then MRU, each taken
/// across the shards in turn (a shard's own order is kept).
fn plan_queue(shape: &SavedShape) -> Vec<Planned> {
    let mut queue = Vec::with_capacity(shape.records() as usize);
    for list in [ListId::Mfu, ListId::Mru] {
        let lists: Vec<&Vec<SavedRecord>> = shape
            .shards
            .iter()
            .map(|s| if list == ListId::Mfu { &s.mfu } else { &s.mru })
            .collect();
        let longest = lists.iter().map(|l| l.len()).max().unwrap_or(0);
        for at in 0..longest {
            for l in &lists {
                if let Some(r) = l.get(at) {
                    queue.push(Planned {
                        object: r.object,
                        record: r.record,
                        list,
                        prefetched: r.prefetched,
                    });
                }
            }
        }
    }
    assert_eq!(queue.len() as u64, shape.records());
    queue
}

/// Reads a checkpoint, refusing one larger than any we write.
fn read_bounded(path: &Path) -> io::Result<Vec<u8>> {
    let len = std::fs::metadata(path)?.len();
    let max = SHAPE_BYTES_MAX + shape::SHAPE_HEADER_BYTES as u64;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{len} bytes, more than any checkpoint ({max})"),
        ));
    }
    let bytes = std::fs::read(path)?;
    debug_assert!(bytes.len() as u64 <= max || bytes.len() as u64 != len);
    Ok(bytes)
}

/// Writes `bytes` to `path` so that a crash leaves the old file or the new
/// one: a temporary file beside it, synced, renamed, the directory synced.
fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()?;
    debug_assert!(!tmp.exists());
    Ok(())
}

/// An object of the plan, reopened: its handle and key of the dataset now,
/// or why its records are skipped.
enum Reopened {
    Current {
        handle: super::ObjectHandle,
        uid: u64,
    },
    Stale,
}

/// The prewarm's worker (see the module comment). Holds the cache weakly:
/// a cache dropped meanwhile ends it.
fn run_prewarm(weak: Weak<Cache>, plan: PrewarmPlan) {
    let started = Instant::now();
    debug_assert!(
        plan.queue.len() as u64 <= plan.target_bytes,
        "every record is a byte or more"
    );
    // `arc_prewarm_ms` is the reading's time, from the rebuild's end: the
    // rebuild has its own (`l2_rebuild_time`), and the rate of the
    // prewarm is its bytes over this.
    let finish = |weak: &Weak<Cache>, reading: Instant| {
        if let Some(cache) = weak.upgrade() {
            let c = &cache.shape;
            // A counter: a later prewarm (a second restore) adds to it.
            c.prewarm_ms
                .fetch_add(reading.elapsed().as_millis() as u64, Ordering::Relaxed);
            c.prewarm_queued.store(0, Ordering::Relaxed);
            c.prewarm_active.store(0, Ordering::Release);
        }
    };
    // The L2ARC's index first: a record is found on flash only once rebuilt.
    let rebuilt = loop {
        let Some(cache) = weak.upgrade() else { return };
        match cache.l2.get() {
            None => break false,
            Some(l2) if !l2.rebuilding() => break true,
            Some(_) if started.elapsed() > PREWARM_REBUILD_WAIT => break false,
            Some(_) => {}
        }
        drop(cache);
        std::thread::sleep(Duration::from_millis(5));
    };
    if !rebuilt {
        if let Some(cache) = weak.upgrade() {
            cache
                .shape
                .prewarm_missing
                .fetch_add(plan.queue.len() as u64, Ordering::Relaxed);
        }
        finish(&weak, Instant::now());
        return;
    }
    let reading = Instant::now();
    if let Some(cache) = weak.upgrade() {
        cache.prewarm_in_order(&plan);
    }
    finish(&weak, reading);
}

impl Cache {
    /// Reopens a saved object by name; stale if it is gone, is another
    /// object now, or its generation moved since the save.
    fn reopen(&self, plan: &PrewarmPlan, object: u32) -> Reopened {
        let saved = &plan.objects[object as usize];
        let Some(Some((dataset, uid))) = plan.datasets.get(saved.dataset as usize) else {
            return Reopened::Stale;
        };
        match self.open(*dataset, &saved.name, false) {
            Ok(handle) if handle.object_id() == saved.object && handle.token() == saved.token => {
                debug_assert_eq!(handle.dataset(), *dataset);
                Reopened::Current { handle, uid: *uid }
            }
            _ => Reopened::Stale,
        }
    }

    /// The prewarm's walk: claims the saved records in order, keeps
    /// `PREWARM_IN_FLIGHT` of them being read by `PREWARM_READERS`
    /// threads, and publishes each, in the saved order, as soon as it and
    /// every record before it have been read (a reorder buffer). So the
    /// device always has reads queued (no window that waits for its
    /// slowest read), the lists come back in order, and a demand read of
    /// a claimed record waits for at most the reads ahead of it in flight.
    /// Stops claiming at the saved bytes, once the ARC refuses a run of
    /// records (full at its `c`), or when only the prewarm still holds the
    /// cache (it is being dropped).
    fn prewarm_in_order(self: &Arc<Self>, plan: &PrewarmPlan) {
        let Some(l2) = self.l2.get() else {
            return;
        };
        let l2: &crate::l2arc::L2Arc = l2;
        let fill_sequence = self.invalidation_sequence.load(Ordering::Acquire);
        let mut walk = PrewarmWalk {
            reopened: (0..plan.objects.len()).map(|_| None).collect(),
            at: 0,
            claiming: true,
            refused_run: 0,
            done_bytes: 0,
        };
        let mut reads = PrewarmReads {
            pending: VecDeque::with_capacity(PREWARM_IN_FLIGHT),
            landed: Vec::with_capacity(PREWARM_IN_FLIGHT),
            wanted: Vec::with_capacity(PREWARM_IN_FLIGHT),
            runs: Vec::with_capacity(PREWARM_IN_FLIGHT),
            next_seq: 0,
            front_seq: 0,
        };
        // Every job and every result is one or more claimed records, and at
        // most `PREWARM_IN_FLIGHT` are claimed: no send below ever waits.
        let (job_tx, job_rx) = mpsc::sync_channel::<(RunRead, usize)>(PREWARM_IN_FLIGHT);
        // Held only while a reader waits for its next run.
        let job_rx: RankedMutex<_, { rank::LEAF }> = RankedMutex::new(job_rx);
        let (done_tx, done_rx) =
            mpsc::sync_channel::<(usize, Option<AlignedBuf>)>(PREWARM_IN_FLIGHT);
        std::thread::scope(|s| {
            for _ in 0..PREWARM_READERS {
                let (job_rx, done_tx) = (&job_rx, done_tx.clone());
                s.spawn(move || prewarm_reader(l2, job_rx, &done_tx));
            }
            let mut io = PrewarmIo {
                jobs: job_tx,
                done: done_rx,
            };
            loop {
                let claimed = self.prewarm_claim_batch(plan, &mut walk, &mut reads, &mut io);
                self.prewarm_land(&mut reads, fill_sequence, plan, &mut walk);
                if reads.pending.is_empty() {
                    if claimed == 0 {
                        break; // the queue's end, or done claiming
                    }
                    continue;
                }
                if reads.pending.front().is_none_or(|p| p.data.is_none()) {
                    io.wait(&mut reads.landed);
                }
                self.prewarm_land(&mut reads, fill_sequence, plan, &mut walk);
                if Arc::strong_count(self) == 1 {
                    walk.claiming = false; // only the prewarm holds the cache
                }
                self.shape
                    .prewarm_queued
                    .store((plan.queue.len() - walk.at) as u64, Ordering::Relaxed);
            }
            // Dropping `io` ends the readers (their queue closes).
        });
        drop(done_tx);
        debug_assert!(reads.pending.is_empty(), "every claim published");
    }

    /// Claims the next records of the queue, up to the room in flight, in
    /// one batch once at least `PREWARM_CLAIM_BATCH` are free (so that
    /// records back to back on flash are read together: `begin_runs`),
    /// and starts their reads. Returns how many it claimed.
    fn prewarm_claim_batch<'a>(
        &'a self,
        plan: &PrewarmPlan,
        walk: &mut PrewarmWalk,
        reads: &mut PrewarmReads<'a>,
        io: &mut PrewarmIo,
    ) -> usize {
        let room = PREWARM_IN_FLIGHT - reads.pending.len();
        if !walk.claiming || (room < PREWARM_CLAIM_BATCH && !reads.pending.is_empty()) {
            return 0;
        }
        let l2 = self.l2.get().expect("a prewarm has an L2ARC");
        let first_seq = reads.next_seq;
        reads.wanted.clear();
        while reads.wanted.len() < room {
            let Some(claimed) = self.prewarm_claim_next(plan, walk) else {
                break;
            };
            reads.wanted.push((claimed.key_hash, claimed.recordsize));
            reads.pending.push_back(claimed);
            reads.next_seq += 1;
        }
        // Records flash no longer holds have no run: missed.
        let landed = &mut reads.landed;
        l2.begin_runs(&reads.wanted, &mut reads.runs, &mut |i| {
            landed.push((first_seq + i, None));
        });
        for run in reads.runs.drain(..) {
            self.shape.prewarm_reads.fetch_add(1, Ordering::Relaxed);
            io.start(run, first_seq);
        }
        debug_assert!(reads.pending.len() <= PREWARM_IN_FLIGHT);
        reads.wanted.len()
    }

    /// Puts the reads that landed in their places, and publishes, in the
    /// claim order, every record whose read and predecessors' reads landed.
    fn prewarm_land(
        &self,
        reads: &mut PrewarmReads<'_>,
        fill_sequence: u64,
        plan: &PrewarmPlan,
        walk: &mut PrewarmWalk,
    ) {
        let front_seq = reads.front_seq;
        for (seq, data) in reads.landed.drain(..) {
            assert!(seq >= front_seq && seq - front_seq < reads.pending.len());
            let slot = &mut reads.pending[seq - front_seq].data;
            debug_assert!(slot.is_none(), "a record's read lands once");
            *slot = Some(data);
        }
        while reads.pending.front().is_some_and(|p| p.data.is_some()) {
            let done = reads.pending.pop_front().expect("checked");
            reads.front_seq += 1;
            self.prewarm_publish(done, fill_sequence, plan, walk);
        }
    }

    /// The next record of the queue that can be claimed: its object is
    /// current, flash holds it, and no reader has it or is filling it.
    /// Counts what it passes over. `None` at the end of the queue.
    fn prewarm_claim_next<'a>(
        &'a self,
        plan: &PrewarmPlan,
        walk: &mut PrewarmWalk,
    ) -> Option<Pending<'a>> {
        let l2 = self.l2.get()?;
        while walk.at < plan.queue.len() {
            let item = plan.queue[walk.at];
            walk.at += 1;
            let slot = &mut walk.reopened[item.object as usize];
            if slot.is_none() {
                *slot = Some(self.reopen(plan, item.object));
            }
            let Some(Reopened::Current { handle, uid }) = slot.as_ref() else {
                self.shape.prewarm_stale.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let token = handle.token();
            let key_hash = record_key_hash(*uid, handle.object_id(), item.record, token);
            if Tier::holds(&**l2, key_hash).is_none() {
                self.shape.prewarm_missing.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let recordsize = handle.recordsize_bytes();
            if let Some(claim) = self.arc.claim_prewarm(handle.record_key(item.record)) {
                return Some(Pending {
                    claim,
                    item,
                    key_hash,
                    recordsize,
                    token,
                    data: None,
                });
            }
        }
        debug_assert_eq!(walk.at, plan.queue.len());
        None
    }

    /// Publishes one read record at the cold end of its list (or lets its
    /// waiters read it themselves if flash had no copy), and counts it.
    fn prewarm_publish(
        &self,
        done: Pending<'_>,
        fill_sequence: u64,
        plan: &PrewarmPlan,
        walk: &mut PrewarmWalk,
    ) {
        let Pending {
            claim,
            item,
            recordsize,
            token,
            data,
            ..
        } = done;
        let Some(data) = data.expect("published once read") else {
            self.shape.prewarm_missing.fetch_add(1, Ordering::Relaxed);
            drop(claim); // waiters read it themselves
            return;
        };
        assert!(
            data.len() <= recordsize as usize,
            "a tier returns at most a record"
        );
        let record = Arc::new(Record {
            data,
            generation_token: token,
            fill_sequence,
        });
        let size = record.size_bytes();
        if claim.complete(Some(record), item.list, item.prefetched) {
            self.shape.prewarm_records.fetch_add(1, Ordering::Relaxed);
            self.shape.prewarm_bytes.fetch_add(size, Ordering::Relaxed);
            walk.done_bytes += size;
            walk.refused_run = 0;
        } else {
            walk.refused_run += 1;
        }
        if walk.done_bytes >= plan.target_bytes || walk.refused_run >= PREWARM_IN_FLIGHT {
            walk.claiming = false; // the bytes saved, or the ARC is full at its c
        }
    }
}

/// The prewarm's claimed records: read in flight (`pending`, in claim
/// order from `front_seq`), and reads that landed, to be put in place.
struct PrewarmReads<'a> {
    pending: VecDeque<Pending<'a>>,
    /// (claim order, the record's bytes or `None`: a miss).
    landed: Vec<(usize, Option<AlignedBuf>)>,
    /// The batch being claimed (scratch, kept for its capacity).
    wanted: Vec<(u64, u32)>,
    runs: Vec<RunRead>,
    next_seq: usize,
    front_seq: usize,
}

/// The prewarm's reads: runs queued to the reader threads, and what they
/// read coming back.
///
/// Why threads, not a ring of the prewarm's own. The prewarm runs while
/// the service serves, and on a small machine the demand reads keep every
/// core busy: a prewarm thread that keeps 128 reads in flight on one
/// io_uring gets one thread's share of the CPU for all of its checks and
/// inserts, and read at 0.3-0.4x fio's sequential rate where 32 blocking
/// readers read at 0.5-0.6x in the same runs (`--scenario restart`, load
/// 6-9, docs/notes/restart.md).
struct PrewarmIo {
    jobs: mpsc::SyncSender<(RunRead, usize)>,
    done: mpsc::Receiver<(usize, Option<AlignedBuf>)>,
}

impl PrewarmIo {
    /// Queues a run's read (the batch's first record is `first_seq`).
    fn start(&mut self, run: RunRead, first_seq: usize) {
        // Runs start on whole blocks (a device is read in 4 KiB blocks).
        debug_assert!(run.offset_bytes().is_multiple_of(4096));
        self.jobs
            .send((run, first_seq))
            .expect("the prewarm readers ended early");
    }

    /// Waits until at least one read in flight has landed.
    fn wait(&mut self, landed: &mut Vec<(usize, Option<AlignedBuf>)>) {
        landed.push(self.done.recv().expect("a prewarm reader ended early"));
        debug_assert!(landed.len() <= PREWARM_IN_FLIGHT, "at most every claim");
    }
}

/// A prewarm reader thread: reads runs with positioned reads until the
/// job queue closes (or the prewarm stopped listening).
fn prewarm_reader(
    l2: &crate::l2arc::L2Arc,
    jobs: &RankedMutex<mpsc::Receiver<(RunRead, usize)>, { rank::LEAF }>,
    done: &mpsc::SyncSender<(usize, Option<AlignedBuf>)>,
) {
    loop {
        let job = jobs.lock().expect("a prewarm reader panicked").recv();
        let Ok((mut run, first_seq)) = job else {
            return;
        };
        debug_assert!(run.offset_bytes().is_multiple_of(4096));
        let result = run.read_psync();
        let mut sent = true;
        l2.finish_run(run, result, &mut |i, data| {
            sent &= done.send((first_seq + i, data)).is_ok();
        });
        if !sent {
            return;
        }
    }
}

/// Where the prewarm's walk of its queue stands.
struct PrewarmWalk {
    /// Each saved object reopened once, on its first record.
    reopened: Vec<Option<Reopened>>,
    /// The next record of the queue to look at.
    at: usize,
    /// Still claiming (not at the bytes saved, the ARC not full).
    claiming: bool,
    /// Records the ARC refused in a row.
    refused_run: usize,
    /// Bytes inserted so far.
    done_bytes: u64,
}

/// A claimed record being read: its read (`data`, once it landed; inner
/// `None`: flash had no intact copy) waits here until every record
/// claimed before it is published.
struct Pending<'a> {
    claim: crate::arc::live::PrewarmClaim<'a>,
    item: Planned,
    key_hash: u64,
    recordsize: u32,
    token: u64,
    data: Option<Option<AlignedBuf>>,
}
