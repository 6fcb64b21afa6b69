//! The cache's configuration: whole-cache settings and per-dataset
//! properties, with the checks that keep them in range.
//!
//! Why here and not in the front ends: every front end (CLI flags, TOML,
//! the library) builds the same two structs, so a value out of range is
//! refused with the same one-line message naming the setting, whichever
//! way it came in. Sizes carry their unit in the name (`_bytes`).

use crate::arc::policy::DramPolicy;
use crate::l2arc::L2ArcConfig;
use crate::l2arc::format::{
    Compression, SECTOR_TABLE_RECORD_BYTES_FLOOR, SECTOR_TABLE_RECORD_BYTES_MIN,
};

/// Smallest recordsize (ZFS: 512 B; here one 4 KiB block, the device's unit).
pub const RECORDSIZE_MIN_BYTES: u32 = 4 * 1024;
/// Largest recordsize (ZFS's default `zfs_max_recordsize`).
pub const RECORDSIZE_MAX_BYTES: u32 = 1024 * 1024;
/// Default recordsize (ZFS's).
pub const RECORDSIZE_DEFAULT_BYTES: u32 = 128 * 1024;

/// `arc_max_bytes` of `arc_max = auto` (ZFS's `zfs_arc_max=0`).
pub const ARC_MAX_AUTO: u64 = 0;

/// Errors in configuration: always a one-line message naming the setting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error(
        "recordsize {0} is out of range: it must be a power of two from 4K to 1M (4096 to 1048576 bytes)"
    )]
    /// A recordsize that is not a power of two in range.
    RecordSize(u64),
    #[error("arc_max {0} bytes is too small: it must hold at least one 4 KiB record per shard")]
    /// An arc_max too small to hold a record per shard.
    ArcMax(u64),
    #[error("arc_max auto: cannot read the system's memory: {0}")]
    /// `arc_max = auto` found no /proc/meminfo to size itself from.
    Memory(String),
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
    #[error("{0}")]
    /// An L2ARC tunable out of range (`l2arc_feed_secs`, ...).
    Tunable(String),
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

crate::settings::settings! {
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
}

impl Default for DatasetConfig {
    fn default() -> Self {
        let config = Self {
            recordsize_bytes: RECORDSIZE_DEFAULT_BYTES,
            primarycache: CacheMode::All,
            secondarycache: CacheMode::All,
            compression: Compression::Lz4,
            sector_table_min_bytes: SECTOR_TABLE_RECORD_BYTES_MIN as u32,
        };
        debug_assert!(config.validate().is_ok(), "the defaults are in range");
        config
    }
}

impl DatasetConfig {
    /// Checks the recordsize and the sector table threshold.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let recordsize = validate_recordsize(u64::from(self.recordsize_bytes))?;
        assert_eq!(recordsize, self.recordsize_bytes);
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
        assert!(bytes.count_ones() == 1 && bytes <= u64::from(u32::MAX));
        Ok(bytes as u32)
    } else {
        Err(ConfigError::RecordSize(bytes))
    }
}

crate::settings::settings! {
/// Whole-cache settings.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// `arc_max`: DRAM for record buffers. 0 is `auto` (the default, as
    /// ZFS's `zfs_arc_max=0`): `c` breathes between `arc_min` and a ceiling
    /// resolved from the host's memory and the memory cgroup's limit, with
    /// `arc_sys_free` kept free (`arc::breathe`). A size fixes it.
    pub arc_max_bytes: u64,
    /// `arc_min`: the floor of `c` with `arc_max = auto` (0 = 64 MiB;
    /// never above the ceiling). Ignored with a fixed `arc_max`.
    pub arc_min_bytes: u64,
    /// `arc_sys_free`: memory the ARC leaves free for others with
    /// `arc_max = auto` (0 = 1/32 of the memory limit, at least 256 MiB).
    pub arc_sys_free_bytes: u64,
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
}

impl Default for CacheConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let config = Self {
            arc_max_bytes: ARC_MAX_AUTO,
            arc_min_bytes: 0,
            arc_sys_free_bytes: 0,
            arc_shards: (cores * 4).clamp(1, 1024),
            dram_policy: DramPolicy::Arc,
            l2arc: L2ArcConfig::default(),
            zfs_prefetch_disable: false,
            zfetch_max_distance_bytes: 8 << 20,
        };
        // What `Cache::new` checks: the defaults always pass.
        debug_assert!((1..=1024).contains(&config.arc_shards));
        debug_assert!(config.arc_max_bytes == ARC_MAX_AUTO);
        config
    }
}
