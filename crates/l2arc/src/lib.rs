//! l2arc: the read-cache hierarchy of ZFS — the ARC in DRAM and the L2ARC on
//! flash — as a library that puts DRAM and SSDs in front of any slow storage.
//!
//! The API, from the top of the read path:
//! - [`Cache`] with [`CacheConfig`] and [`DatasetConfig`]: open objects of a
//!   dataset ([`ObjectHandle`]), read ([`Cache::read`], [`Cache::read_view`]
//!   for zero-copy [`ReadView`]s), write through, discard;
//! - [`ReadQueue`]: many reads in flight from one thread (io_uring);
//! - cache devices: [`Cache::add_cache_path`], or any [`DeviceIo`] through
//!   [`Cache::add_cache_device`], tuned by [`L2ArcConfig`];
//! - [`primary`]: the slow storage behind the cache (a directory, an image or
//!   block device, an emulated HDD array), or your own [`primary::Primary`];
//! - a tier a fleet shares in an S3 bucket, below the L2ARC (feature
//!   `object-store`): [`Cache::add_shared_tier`] with [`SharedTierConfig`];
//! - [`CacheStats`] under ZFS's arcstats names, and [`analytics`] /
//!   [`latency`]: latency histograms by the tier that served a read;
//! - [`arc`]: the pure ARC policy, for simulators; [`hash`]: the key hash;
//! - [`prelude`]: the names a program needs, in one `use`.
//!
//! The API is closed: configs, stats and errors are `#[non_exhaustive]`
//! (configs are built from `default()` with a setter per field), test
//! hooks are behind the `test-utils` feature, and the device format and
//! index behind `internals`.
//!
//! Inside (private): `cache/` is the read path that ties the tiers
//! together, `arc::live` holds the DRAM buffers, `tier` is the interface
//! of the tiers below the ARC, `l2arc/` the flash tier (device format,
//! index, feeder, writer, rebuild), `lock_order` the ranked locks, `buf`
//! aligned buffers, `stats` the counters.

// The public surface is what a program that puts a cache in front of its
// storage needs: the cache and its configs, read views and queues, stats and
// analytics, the primary-storage and cache-device traits, and the pure ARC
// policy for simulators. Everything else is private; the workspace's
// benchmarks, fuzzers and engine tests reach the device format, the index
// and the device doubles through `internals` (feature `internals`), whose
// API may change with any commit.
// Without `internals`, the items only it re-exports are unused and
// crate-visible; they are checked in every build that enables it (the
// workspace's).
#![cfg_attr(not(feature = "internals"), allow(dead_code, unreachable_pub))]

pub mod analytics;
pub mod arc;
mod buf;
mod cache;
pub mod hash;
mod l2arc;
pub mod latency;
mod lock_order;
mod pace;
pub mod primary;
mod settings;
#[cfg(feature = "object-store")]
mod shared;
mod stats;
mod tier;
mod top_objects;

pub use crate::l2arc::tunables::{TUNABLE_NAMES, TunableError};

/// The engine's cargo features compiled in, by name (`l2arc --version`
/// lists them): a build with `invariants` runs O(n) checks on every
/// change, one without `object-store` cannot read `s3://` sources.
pub const FEATURES: [(&str, bool); 4] = [
    ("object-store", cfg!(feature = "object-store")),
    ("invariants", cfg!(feature = "invariants")),
    ("internals", cfg!(feature = "internals")),
    ("test-utils", cfg!(feature = "test-utils")),
];
pub use cache::prefetch::{ClaimedSpan, PREFETCH_SPAN_BYTES_MAX};
pub use cache::properties::PropertyError;
pub use cache::{
    ARC_MAX_AUTO, ArcCheckpointer, Cache, CacheConfig, CacheMode, ConfigError, DatasetConfig,
    DatasetId, ObjectHandle, RECORDSIZE_DEFAULT_BYTES, RECORDSIZE_MAX_BYTES, RECORDSIZE_MIN_BYTES,
    ReadCompletion, ReadQueue, ReadView, RestoreError, RestoredShape, SavedShapeSummary,
    ShapeStats, validate_recordsize,
};
pub use l2arc::device::{DeviceIdentity, DeviceIo, FileDevice};
pub use l2arc::format::{Compression, FormatError};
pub use l2arc::{
    DeviceOpen, DeviceStats, FeedOutcome, IoEngine, L2ArcConfig, L2Stats, StopFlush, StopFlushCut,
};
pub use pace::Pace;
#[cfg(feature = "object-store")]
pub use shared::{
    SHARED_KSTATS, SHARED_PUT_TIMEOUT_DEFAULT_MS, SHARED_QUEUE_BYTES_DEFAULT,
    SHARED_QUEUE_RECORDS_DEFAULT, SHARED_TIMEOUT_DEFAULT_MS, SHARED_WRITERS_DEFAULT, SharedAdmit,
    SharedTierConfig,
};
pub use stats::{ArcStats, CacheStats, KstatKind, kstat_kind};

/// What a program that puts a cache in front of its storage uses:
/// `use l2arc::prelude::*;`.
///
/// ```no_run
/// use std::sync::Arc;
/// use l2arc::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cache = Cache::new(CacheConfig::default().arc_max_bytes(4 << 30))?;
/// let data = cache.add_dataset(
///     "data",
///     Arc::new(DirPrimary::new("/srv/data")?),
///     DatasetConfig::default().recordsize_bytes(64 << 10),
/// )?;
/// cache.add_cache_path("/var/cache/l2arc.img", Some(64 << 30))?;
/// let file = cache.open(data, "images/disk0.raw", false)?;
/// let mut buf = vec![0u8; 8192];
/// let n = cache.read(&file, 1 << 20, &mut buf)?; // pread semantics
/// let view: ReadView = cache.read_view(&file, 0, 1 << 20)?; // no copy
/// assert!(n <= buf.len() && view.len() <= 1 << 20);
/// for (name, value) in cache.stats().kstats() {
///     println!("{name} {value}");
/// }
/// # Ok(())
/// # }
/// ```
pub mod prelude {
    pub use crate::primary::dir::DirPrimary;
    pub use crate::primary::image::ImagePrimary;
    pub use crate::primary::{Primary, PrimaryObject};
    pub use crate::{
        Cache, CacheConfig, CacheMode, CacheStats, Compression, ConfigError, DatasetConfig,
        DatasetId, DeviceIo, FileDevice, L2ArcConfig, ObjectHandle, ReadCompletion, ReadQueue,
        ReadView,
    };
}

/// Engine internals for the workspace's benchmarks, fuzzers and tests: the
/// device format, the L2ARC index and log, aligned buffers, the live ARC's
/// records, and (feature `test-utils`) a cache device that fails on command.
/// Not a stable API.
#[cfg(feature = "internals")]
pub mod internals {
    pub use crate::arc::live::{ArcConfig, LiveArc, Lookup, Record, RecordKey};
    pub use crate::buf::AlignedBuf;
    pub use crate::cache::OBJECT_STATES_MAX;
    #[cfg(feature = "test-utils")]
    pub use crate::l2arc::faulty_device::{Faults, FaultyDevice};
    pub use crate::l2arc::{
        BATCH_BYTES_MAX, DEVICE_ERRORS_MAX, FeedRecord, L2Arc, LogOnlyRecord,
        REBUILD_BUFFER_BYTES_MAX, format, index,
    };
}
