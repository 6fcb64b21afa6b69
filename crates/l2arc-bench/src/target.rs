//! What a benchmark reads through: our cache, or a peer, behind one trait.
//!
//! Side-by-side figures are only honest when every system sees the same
//! workload, the same DRAM budget, the same cache file and the same emulated
//! disk. So the scenarios never talk to a cache directly: they read files of
//! the dataset through a `ReadTarget`, and each system (no cache, l2arc,
//! l2arc with an LRU DRAM tier, foyer's hybrid cache) is one implementation.
//! The scenario checks every byte it gets against the dataset's truth, so a
//! fast peer that returns wrong bytes fails the run instead of winning it.

use std::io;

use serde::Serialize;

/// Cumulative counters of a target since it was built.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct TargetCounters {
    /// Reads (of records, or of whatever unit the target caches) served from DRAM.
    pub dram_hits: u64,
    /// Served from the flash tier.
    pub flash_hits: u64,
    /// Went to the primary (the emulated HDD).
    pub misses: u64,
    /// Bytes of data the flash tier holds now (logical, before compression).
    pub flash_bytes: u64,
    /// Bytes of the cache device those occupy (after compression).
    pub flash_alloc_bytes: u64,
}

impl TargetCounters {
    /// Share of lookups served by either cache tier.
    pub fn hit_ratio(&self) -> f64 {
        let total = self.dram_hits + self.flash_hits + self.misses;
        if total == 0 {
            0.0
        } else {
            (self.dram_hits + self.flash_hits) as f64 / total as f64
        }
    }

    /// Counters accumulated between `earlier` and `self` (sizes are taken from `self`).
    pub fn since(&self, earlier: &TargetCounters) -> TargetCounters {
        TargetCounters {
            dram_hits: self.dram_hits - earlier.dram_hits,
            flash_hits: self.flash_hits - earlier.flash_hits,
            misses: self.misses - earlier.misses,
            flash_bytes: self.flash_bytes,
            flash_alloc_bytes: self.flash_alloc_bytes,
        }
    }
}

/// A system under test: reads bytes of dataset files, counts where they came from.
pub trait ReadTarget: Send + Sync {
    /// Short name used in tables and JSON (`no_cache`, `l2arc`, `foyer`, ...).
    fn name(&self) -> &str;

    /// Reads `buf.len()` bytes of dataset file `file` at `offset`; returns the
    /// bytes read (fewer only at the end of the file).
    fn read(&self, file: u32, offset: u64, buf: &mut [u8]) -> io::Result<usize>;

    /// Counters since the target was built.
    fn counters(&self) -> TargetCounters;
}
