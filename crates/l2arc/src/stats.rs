//! Statistics under the names ZFS users know.
//!
//! The ARC counts its own events per shard (see `arc::live`), under its shard
//! locks; the read path counts reads, writes and primary I/O in relaxed
//! atomics. A snapshot sums them, and `kstats` lists every value by its
//! arcstats name in a fixed order, so that the CLI, the exporters and the
//! tests all speak of `hits`, `misses`, `mru_ghost_hits` and `size` exactly as
//! `arc_summary` does.
//!
//! Counters touched on every read are striped: each thread adds to one of
//! `COUNTER_STRIPES` cache-line-sized slots, so two cores reading at once do
//! not fight over one line; a snapshot sums the slots.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

pub use crate::arc::live::ArcStats;

/// Counters of the read path itself (the ARC keeps its own).
#[derive(Default)]
pub(crate) struct ReadPathCounters {
    pub(crate) reads: Counter,
    pub(crate) read_bytes: Counter,
    pub(crate) writes: Counter,
    pub(crate) write_bytes: Counter,
    pub(crate) primary_reads: Counter,
    pub(crate) primary_read_bytes: Counter,
    pub(crate) primary_errors: Counter,
    pub(crate) primary_stale: Counter,
    pub(crate) zfetch_hits: Counter,
    pub(crate) zfetch_io_issued: Counter,
}

/// A snapshot of every statistic, under ZFS's names where one exists.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CacheStats {
    /// The ARC's counters and sizes.
    pub arc: ArcStats,
    /// Read queues read flash through io_uring (else psync).
    pub ioengine_uring: bool,
    /// `arc_max`, bytes.
    pub arc_max: u64,
    /// Reads asked of the cache.
    pub reads: u64,
    /// Bytes asked of the cache.
    pub read_bytes: u64,
    /// Writes through the cache.
    pub writes: u64,
    /// Bytes written through the cache.
    pub write_bytes: u64,
    /// Reads of primary storage.
    pub primary_reads: u64,
    /// Bytes read from primary storage.
    pub primary_read_bytes: u64,
    /// Failed reads of primary storage.
    pub primary_errors: u64,
    /// Primary reads refused because the object changed under them
    /// (a conditional GET answered 412): each was re-stated and read again.
    pub primary_stale: u64,
    /// Demand misses found to continue a sequential stream, each starting
    /// a read-ahead (`read_ahead`; zfetchstats' `hits`).
    pub zfetch_hits: u64,
    /// Records read ahead by them (zfetchstats' `io_issued`).
    pub zfetch_io_issued: u64,
    /// The L2ARC's statistics, when cache devices were added.
    pub l2: Option<crate::l2arc::L2Stats>,
    /// The ARC's checkpoints and the prewarm (`arc_prewarm_*`,
    /// `arc_checkpoint*`).
    pub shape: ShapeStats,
    /// The counters of the tiers below the ARC other than the L2ARC (the
    /// shared tier's `shared_*`), empty without one.
    pub shared: Vec<(&'static str, u64)>,
}

impl CacheStats {
    /// Every counter as (arcstats name, value), for `ctl stats` and metrics.
    pub fn kstats(&self) -> Vec<(&'static str, u64)> {
        let mut all = self.arc.kstats();
        all.extend([
            ("c_max", self.arc_max),
            ("reads", self.reads),
            ("read_bytes", self.read_bytes),
            ("writes", self.writes),
            ("write_bytes", self.write_bytes),
            ("primary_reads", self.primary_reads),
            ("primary_read_bytes", self.primary_read_bytes),
            ("primary_errors", self.primary_errors),
            ("primary_stale", self.primary_stale),
            ("zfetch_hits", self.zfetch_hits),
            ("zfetch_io_issued", self.zfetch_io_issued),
            ("l2_ioengine_uring", u64::from(self.ioengine_uring)),
        ]);
        all.extend(self.shape.kstats());
        if let Some(l2) = &self.l2 {
            all.extend(l2.kstats.iter().copied());
        }
        all.extend(self.shared.iter().copied());
        all
    }

    /// ARC hits over all lookups, 0 when there were none.
    pub fn arc_hit_ratio(&self) -> f64 {
        let total = self.arc.hits + self.arc.misses + self.arc.iohits;
        if total == 0 {
            0.0
        } else {
            self.arc.hits as f64 / total as f64
        }
    }
}

/// The shape's and the prewarm's statistics.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct ShapeStats {
    /// Records the prewarm brought into the ARC from flash.
    pub prewarm_records: u64,
    /// Their bytes.
    pub prewarm_bytes: u64,
    /// How long the last prewarm took, ms (set when it ends).
    pub prewarm_ms: u64,
    /// Device reads the prewarm issued (records back to back on flash are
    /// read together: records over reads is how well they merged).
    pub prewarm_reads: u64,
    /// Reads that found a prewarm's read of their record in flight and
    /// waited for it (the ARC counts them).
    pub prewarm_joined: u64,
    /// Saved records not prewarmed: their object changed (or is gone).
    pub prewarm_stale: u64,
    /// Saved records not prewarmed: not on flash.
    pub prewarm_missing: u64,
    /// 1 while a prewarm runs.
    pub prewarm_active: u64,
    /// Saved records the running prewarm has still to consider.
    pub prewarm_queued_records: u64,
    /// Checkpoints saved.
    pub checkpoints: u64,
    /// Size of the last checkpoint saved (or restored), bytes.
    pub checkpoint_bytes: u64,
    /// Resident records in it.
    pub checkpoint_records: u64,
    /// Seconds since it was made (0: none).
    pub checkpoint_age_secs: u64,
    /// Resident records left out of checkpoints: their object's name is
    /// unknown (counted at each save).
    pub checkpoint_unnamed_records: u64,
    /// Entries left out of checkpoints by the size bound, coldest first.
    pub checkpoint_dropped_records: u64,
    /// Checkpoints rejected at start, by reason (`crate::arc::shape::SHAPE_REJECT_REASONS`).
    pub rejected: [u64; crate::arc::shape::SHAPE_REJECT_REASONS.len()],
}

impl ShapeStats {
    /// `(name, value)` pairs for `CacheStats::kstats`.
    pub fn kstats(&self) -> Vec<(&'static str, u64)> {
        const REJECTED: [&str; crate::arc::shape::SHAPE_REJECT_REASONS.len()] = [
            "arc_checkpoint_rejected_magic",
            "arc_checkpoint_rejected_version",
            "arc_checkpoint_rejected_checksum",
            "arc_checkpoint_rejected_truncated",
            "arc_checkpoint_rejected_invalid",
        ];
        debug_assert!(
            REJECTED
                .iter()
                .zip(crate::arc::shape::SHAPE_REJECT_REASONS)
                .all(|(name, reason)| name.ends_with(reason))
        );
        let mut all = vec![
            ("arc_prewarm_records", self.prewarm_records),
            ("arc_prewarm_bytes", self.prewarm_bytes),
            ("arc_prewarm_ms", self.prewarm_ms),
            ("arc_prewarm_reads", self.prewarm_reads),
            ("arc_prewarm_joined", self.prewarm_joined),
            ("arc_prewarm_stale", self.prewarm_stale),
            ("arc_prewarm_missing", self.prewarm_missing),
            ("arc_prewarm_active", self.prewarm_active),
            ("arc_prewarm_queued_records", self.prewarm_queued_records),
            ("arc_checkpoints", self.checkpoints),
            ("arc_checkpoint_bytes", self.checkpoint_bytes),
            ("arc_checkpoint_records", self.checkpoint_records),
            ("arc_checkpoint_age_secs", self.checkpoint_age_secs),
            (
                "arc_checkpoint_unnamed_records",
                self.checkpoint_unnamed_records,
            ),
            (
                "arc_checkpoint_dropped_records",
                self.checkpoint_dropped_records,
            ),
        ];
        all.extend(REJECTED.iter().copied().zip(self.rejected));
        all
    }
}

/// What a kstat measures: a count since the process started, or a level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KstatKind {
    /// Counted since start: never falls for the life of the process (a
    /// removed cache device's counts stay in the cache-wide totals).
    Counter,
    /// A level now (a size, a count of what is held, a limit, a flag): may
    /// fall, and does when a cache device leaves.
    Gauge,
}

/// Whether a kstat (of [`CacheStats::kstats`] or a device's) is a counter
/// or a gauge. The one place that says so: anything not named a gauge
/// here is a counter, so a counter added later is kept monotonic (and
/// exported as one) without being listed.
pub fn kstat_kind(name: &str) -> KstatKind {
    const GAUGES: [&str; 22] = [
        "arc_prewarm_active",
        "arc_prewarm_queued_records",
        "arc_checkpoint_bytes",
        "arc_checkpoint_records",
        "arc_checkpoint_age_secs",
        "c",
        "p",
        "c_max",
        "c_min",
        "arc_no_grow",
        "memory_available_bytes",
        "arc_sys_free",
        "entries",
        "l2_ioengine_uring",
        "l2_devices",
        "l2_bufs",
        "l2_dwpd_limit",
        "l2_dwpd_credit",
        "l2_asize",
        "l2_size",
        "l2_hdr_size",
        "l2_writeback_size",
    ];
    // `size`, `mru_size`, `l2_hdr_size`...: bytes held now.
    if GAUGES.contains(&name) || name == "size" || name.ends_with("_size") {
        KstatKind::Gauge
    } else {
        KstatKind::Counter
    }
}

/// Slots per striped counter: enough that threads rarely share one.
const COUNTER_STRIPES: usize = 16;

#[repr(align(128))]
#[derive(Default)]
struct Stripe(AtomicU64);

/// A relaxed event counter striped across cache lines.
#[derive(Default)]
pub(crate) struct Counter {
    stripes: [Stripe; COUNTER_STRIPES],
}

thread_local! {
    static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
}

pub(crate) fn stripe_index() -> usize {
    STRIPE.with(|slot| {
        let mut index = slot.get();
        if index == usize::MAX {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            index = NEXT.fetch_add(1, Ordering::Relaxed) as usize % COUNTER_STRIPES;
            slot.set(index);
        }
        index
    })
}

impl Counter {
    #[inline]
    pub(crate) fn add(&self, value: u64) {
        self.stripes[stripe_index()]
            .0
            .fetch_add(value, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn striped_counter_sums_all_threads() {
        let counter = Counter::default();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        counter.add(3);
                    }
                });
            }
        });
        assert_eq!(counter.get(), 8 * 1000 * 3);
    }
}
