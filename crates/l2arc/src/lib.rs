//! l2arc: the read-cache hierarchy of ZFS — the ARC in DRAM and (next) the
//! L2ARC on flash — as a library that puts DRAM and SSDs in front of any slow
//! storage.
//!
//! Layout follows the read path from the top:
//! - [`read_path`]: [`Cache`], datasets, object handles and generations; splits
//!   reads into records and ties the tiers together;
//! - [`read_queue`]: many reads in flight from one thread ([`ReadQueue`]);
//! - [`arc`]: the DRAM tier (pure policy + live sharded buffers);
//! - [`l2arc`]: the flash tier (device format, index, feeder, rebuild);
//! - [`primary`]: slow storage back ends (directory, image, emulated HDD);
//! - [`stats`]: counters under ZFS's arcstats names; [`analytics`] and
//!   [`latency`]: latency histograms by the tier that served a read;
//! - [`buf`], [`hash`]: aligned buffers and the cache's key hash.

pub mod analytics;
pub mod arc;
pub mod buf;
pub mod hash;
pub mod l2arc;
pub mod latency;
pub mod primary;
pub mod properties;
pub mod read_path;
pub mod read_queue;
pub mod stats;
pub mod top_objects;

pub use l2arc::IoEngine;
pub use read_path::{
    Cache, CacheConfig, CacheMode, ConfigError, DatasetConfig, DatasetId, ObjectHandle, ReadView,
};
pub use read_queue::{ReadCompletion, ReadQueue};
pub use stats::CacheStats;
