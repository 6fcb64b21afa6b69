//! Our systems under test: no cache (the baseline every ratio is taken
//! against: the emulated disks, one request per read) and l2arc (the
//! engine's `Cache`, ARC capped at the DRAM budget, one cache file).

use std::io;
use std::sync::Arc;

use anyhow::{Context, Result};
use l2arc::Compression;
use l2arc::primary::emulated_hdd::EmulatedHdd;
use l2arc::primary::{Primary, PrimaryObject};
use l2arc::{Cache, CacheConfig, CacheMode, DatasetConfig, ObjectHandle};

use super::{ReadTarget, TargetCounters, TargetSpec};

/// The emulated disks with nothing in front.
pub(super) struct NoCacheTarget {
    hdd: Arc<EmulatedHdd>,
    objects: Vec<Arc<dyn PrimaryObject>>,
}

impl NoCacheTarget {
    pub(super) fn new(spec: &TargetSpec) -> Result<Self> {
        let hdd = spec.hdd_primary()?;
        let objects = spec
            .file_names
            .iter()
            .map(|name| hdd.open(name, false))
            .collect::<io::Result<_>>()?;
        Ok(Self { hdd, objects })
    }
}

impl ReadTarget for NoCacheTarget {
    fn name(&self) -> &str {
        "no_cache"
    }

    fn read(&self, file: u32, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.objects[file as usize].read_at(offset, buf)
    }

    fn counters(&self) -> TargetCounters {
        TargetCounters {
            misses: self.hdd.stats().reads,
            ..TargetCounters::default()
        }
    }
}

/// Our cache: the ARC in `dram_budget_bytes`, the L2ARC on the cache file.
pub(crate) struct L2arcTarget {
    name: &'static str,
    // Handles before the cache: they hold records of it.
    handles: Vec<ObjectHandle>,
    cache: Arc<Cache>,
    hdd: Arc<EmulatedHdd>,
}

impl L2arcTarget {
    pub(crate) fn new(spec: &TargetSpec) -> Result<Self> {
        Self::with_name(
            spec,
            if spec.compression {
                "l2arc_lz4"
            } else {
                "l2arc"
            },
        )
    }

    /// `name` labels the target in tables (e.g. `l2arc_lz4`).
    pub(crate) fn with_name(spec: &TargetSpec, name: &'static str) -> Result<Self> {
        spec.check()?;
        let hdd = spec.hdd_primary()?;
        let mut config = CacheConfig::default()
            .arc_max_bytes(spec.dram_budget_bytes)
            .dram_policy(spec.dram_policy);
        if let Some(shards) = spec.arc_shards {
            config.arc_shards = shards;
        }
        let cache = Cache::new(config)?;
        let dataset = cache.add_dataset(
            "bench",
            Arc::clone(&hdd) as Arc<dyn Primary>,
            DatasetConfig::default()
                .recordsize_bytes(spec.recordsize_bytes)
                .primarycache(CacheMode::All)
                .secondarycache(CacheMode::All)
                .compression(if spec.compression {
                    Compression::Lz4
                } else {
                    Compression::Off
                }),
        )?;
        // A cache size of 0 is the ARC alone (the `no_l2arc` setting).
        if spec.cache_size_bytes > 0 {
            spec.remove_cache_file()?;
            cache
                .add_cache_path(&spec.cache_path, Some(spec.cache_size_bytes))
                .with_context(|| format!("cannot add cache file {}", spec.cache_path.display()))?;
        }
        let handles = spec
            .file_names
            .iter()
            .map(|name| cache.open(dataset, name, false))
            .collect::<io::Result<_>>()?;
        Ok(Self {
            name,
            handles,
            cache,
            hdd,
        })
    }
}

impl ReadTarget for L2arcTarget {
    fn name(&self) -> &str {
        self.name
    }

    fn read(&self, file: u32, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.cache.read(&self.handles[file as usize], offset, buf)
    }

    fn counters(&self) -> TargetCounters {
        let stats = self.cache.stats();
        let l2 = |name: &str| stats.l2.as_ref().map_or(0, |l2| l2.get(name));
        TargetCounters {
            // iohits waited for a fill in flight: served from DRAM.
            dram_hits: stats.arc.hits + stats.arc.iohits,
            flash_hits: l2("l2_hits"),
            // Records read from the disks (ARC misses the L2ARC did not serve).
            misses: self.hdd.stats().reads,
            flash_bytes: l2("l2_size"),
            flash_alloc_bytes: l2("l2_asize"),
        }
    }
}
