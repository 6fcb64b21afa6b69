//! Statistics under the names ZFS users know.
//!
//! The ARC counts its own events per shard (see `arc::live`), under its shard
//! locks; the read path counts reads, writes and primary I/O in relaxed
//! atomics. A snapshot sums them, and `kstats` lists every value by its
//! arcstats name in a fixed order, so that the CLI, the exporters and the
//! tests all speak of `hits`, `misses`, `mru_ghost_hits` and `size` exactly as
//! `arc_summary` does.

use std::sync::atomic::AtomicU64;

pub use crate::arc::live::ArcStats;

/// Counters of the read path itself (the ARC keeps its own).
#[derive(Default)]
pub(crate) struct ReadPathCounters {
    pub(crate) reads: AtomicU64,
    pub(crate) read_bytes: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) write_bytes: AtomicU64,
    pub(crate) primary_reads: AtomicU64,
    pub(crate) primary_read_bytes: AtomicU64,
    pub(crate) primary_errors: AtomicU64,
}

/// A snapshot of every statistic, under ZFS's names where one exists.
#[derive(Clone, Debug)]
pub struct CacheStats {
    pub arc: ArcStats,
    pub arc_max: u64,
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub primary_reads: u64,
    pub primary_read_bytes: u64,
    pub primary_errors: u64,
}

impl CacheStats {
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
        ]);
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

