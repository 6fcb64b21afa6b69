//! The systems under test that are ours: no cache, and l2arc (ARC + L2ARC).
//!
//! Every seed-experiment scenario compares systems that see the same dataset, the
//! same emulated disks, the same DRAM budget and the same cache file. That
//! sameness lives in one value, [`TargetSpec`], from which each target is
//! built: ours here, the peers (foyer's hybrid cache, our L2ARC under an LRU
//! DRAM tier) in `peers.rs`. A scenario builds a fresh target per cell (a cold
//! cache, a new cache file, new disks) so that no cell inherits another's
//! warmth.
//!
//! `no_cache` reads the files through the emulated HDD directly, one request
//! per read, as a box without any cache would; it is the baseline every
//! ratio is taken against. `l2arc` is the engine's `Cache` with the ARC
//! capped at the DRAM budget and one cache file of the given size; each read
//! goes through the ARC, then the L2ARC, then the disks.
//!
//! The cache file is deleted before it is opened: the engine rebuilds a warm
//! L2ARC from a device that holds one (that is the point of a persistent
//! L2ARC), and a benchmark cell that started warm would measure nothing.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use l2arc::l2arc::format::Compression;
use l2arc::primary::dir::DirPrimary;
use l2arc::primary::emulated_hdd::{EmulatedHdd, HddConfig};
use l2arc::primary::{Primary, PrimaryObject};
use l2arc::{Cache, CacheConfig, CacheMode, DatasetConfig, ObjectHandle};

use super::target::{ReadTarget, TargetCounters};

/// Which system a scenario reads through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TargetKind {
    /// The emulated disks alone (the baseline).
    NoCache,
    /// Our ARC + L2ARC (compression per `TargetSpec::compression`).
    L2arc,
    /// foyer's HybridCache (peers.rs).
    Foyer,
    /// Our L2ARC under an LRU DRAM tier (peers.rs).
    L2arcLru,
}

impl TargetKind {
    /// The baseline, ours, and with `--peers` the peers: the systems a
    /// scenario runs, in report order (no_cache first, ours second).
    pub fn in_run(peers: bool) -> Vec<TargetKind> {
        let mut kinds = vec![TargetKind::NoCache, TargetKind::L2arc];
        if peers {
            kinds.extend([TargetKind::Foyer, TargetKind::L2arcLru]);
        }
        kinds
    }

    pub fn name(self) -> &'static str {
        match self {
            TargetKind::NoCache => "no_cache",
            TargetKind::L2arc => "l2arc",
            TargetKind::Foyer => "foyer",
            TargetKind::L2arcLru => "l2arc_lru",
        }
    }

    /// Whether the target has a flash tier (and so needs a cache file).
    pub fn has_flash(self) -> bool {
        self != TargetKind::NoCache
    }
}

/// Everything a target needs to be built; the same for every target of a
/// cell. Stable: peers.rs builds against it.
#[derive(Clone, Debug)]
pub struct TargetSpec {
    /// Directory holding the dataset files.
    pub data_dir: PathBuf,
    /// Names of the dataset files in `data_dir`, indexed by the `file`
    /// argument of `ReadTarget::read`.
    pub file_names: Vec<String>,
    /// Size of each file, same order as `file_names`.
    pub file_sizes_bytes: Vec<u64>,
    /// The emulated disk array every target reads its misses from.
    pub hdd: HddConfig,
    /// DRAM for cached data (`arc_max` for l2arc; the memory tier's
    /// capacity for the peers).
    pub dram_budget_bytes: u64,
    /// The cache file of the flash tier (deleted and made afresh by build).
    pub cache_path: PathBuf,
    /// Size of the cache file; 0: no flash tier (our `no_l2arc` setting).
    pub cache_size_bytes: u64,
    /// LZ4 on the flash tier (`compression=lz4`) or stored as is (`off`).
    pub compression: bool,
    /// Unit of caching: ZFS `recordsize` (a power of two, 4 KiB to 1 MiB).
    pub recordsize_bytes: u32,
    /// ARC shards (locks); `None`: the engine's default.
    pub arc_shards: Option<usize>,
    /// DRAM replacement of the l2arc targets: ARC, or LRU for `l2arc_lru`
    /// (peers.rs sets it; scenarios leave it at `DramPolicy::Arc`).
    pub dram_policy: l2arc::arc::DramPolicy,
}

impl TargetSpec {
    pub fn total_bytes(&self) -> u64 {
        self.file_sizes_bytes.iter().sum()
    }

    /// The emulated array over the dataset directory (a fresh one: new
    /// spindle queues and counters).
    pub fn hdd_primary(&self) -> Result<Arc<EmulatedHdd>> {
        let dir: Arc<dyn Primary> = Arc::new(DirPrimary::new(&self.data_dir)?);
        Ok(Arc::new(EmulatedHdd::new(dir, self.hdd.clone())?))
    }

    /// Removes the cache file so that a target starts cold (see the module
    /// comment). Only a regular file: a block device is refused, not wiped.
    pub fn remove_cache_file(&self) -> Result<()> {
        if let Ok(meta) = std::fs::metadata(&self.cache_path)
            && !meta.is_file()
        {
            bail!(
                "{}: the benchmark scenarios need a cache file they may delete, not a device",
                self.cache_path.display()
            );
        }
        match std::fs::remove_file(&self.cache_path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => {
                Err(e).with_context(|| format!("cannot remove {}", self.cache_path.display()))
            }
        }
    }

    fn check(&self) -> Result<()> {
        assert_eq!(self.file_names.len(), self.file_sizes_bytes.len());
        if self.file_names.is_empty() {
            bail!("a target needs at least one dataset file");
        }
        l2arc::read_path::validate_recordsize(u64::from(self.recordsize_bytes))?;
        Ok(())
    }
}

/// Builds one of our targets; the peers come from `peers::build`.
pub fn build(kind: TargetKind, spec: &TargetSpec) -> Result<Box<dyn ReadTarget>> {
    spec.check()?;
    match kind {
        TargetKind::NoCache => Ok(Box::new(NoCacheTarget::new(spec)?)),
        TargetKind::L2arc => Ok(Box::new(L2arcTarget::new(spec)?)),
        // The peers live in peers.rs (foyer's HybridCache, l2arc under LRU).
        TargetKind::Foyer | TargetKind::L2arcLru => super::peers::build(kind, spec),
    }
}

/// The emulated disks with nothing in front.
pub struct NoCacheTarget {
    hdd: Arc<EmulatedHdd>,
    objects: Vec<Arc<dyn PrimaryObject>>,
}

impl NoCacheTarget {
    pub fn new(spec: &TargetSpec) -> Result<Self> {
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
pub struct L2arcTarget {
    name: &'static str,
    // Handles before the cache: they hold records of it.
    handles: Vec<ObjectHandle>,
    cache: Arc<Cache>,
    hdd: Arc<EmulatedHdd>,
}

impl L2arcTarget {
    pub fn new(spec: &TargetSpec) -> Result<Self> {
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
    pub fn with_name(spec: &TargetSpec, name: &'static str) -> Result<Self> {
        spec.check()?;
        let hdd = spec.hdd_primary()?;
        let mut config = CacheConfig {
            arc_max_bytes: spec.dram_budget_bytes,
            dram_policy: spec.dram_policy,
            ..CacheConfig::default()
        };
        if let Some(shards) = spec.arc_shards {
            config.arc_shards = shards;
        }
        let cache = Cache::new(config)?;
        let dataset = cache.add_dataset(
            "bench",
            Arc::clone(&hdd) as Arc<dyn Primary>,
            DatasetConfig {
                recordsize_bytes: spec.recordsize_bytes,
                primarycache: CacheMode::All,
                secondarycache: CacheMode::All,
                compression: if spec.compression {
                    Compression::Lz4
                } else {
                    Compression::Off
                },
            },
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

/// What the scenarios share: the dataset on disk and how to build targets over it.
pub struct Bench {
    pub dir: PathBuf,
    pub dataset: super::dataset::MixedSizeDataset,
    pub lz4_ratio: f64,
    pub hdd: HddConfig,
    // Keeps a temporary data directory alive for the run.
    _temp: Option<tempfile::TempDir>,
}

impl Bench {
    /// Generates (or reuses) the mixed-size dataset in `--data` or a
    /// temporary directory, and prints its LZ4 ratio. One dataset serves
    /// every scenario (each reads a prefix of its files), so `--scenario all`
    /// and later runs with the same `--data` generate it once: its size is
    /// the largest the throughput scenario needs (the largest of
    /// `--multiples`, at least 1, times `--cache-size`).
    pub fn prepare(args: &super::BenchArgs) -> Result<Self> {
        let largest = args.multiples.iter().copied().fold(1.0, f64::max);
        let total_bytes = (largest * args.cache_size as f64) as u64;
        let hdd = HddConfig {
            spindles: args.spindles,
            seek_ms_min: args.seek_ms_min,
            seek_ms_max: args.seek_ms_max,
            transfer_mib_per_sec: args.transfer_mib_per_sec,
            ..HddConfig::default()
        };
        hdd.validate()?;
        let total_bytes = total_bytes.max(args.min_file_size);
        let max_file = args.max_file_size.max(args.min_file_size);
        let dataset = super::dataset::MixedSizeDataset::new(
            total_bytes.div_ceil(super::dataset::SIZE_UNIT_BYTES) * super::dataset::SIZE_UNIT_BYTES,
            args.min_file_size,
            max_file,
            args.seed,
            args.content,
        )?;
        let (dir, temp) = match &args.data {
            Some(dir) => (dir.clone(), None),
            None => {
                let temp = tempfile::tempdir().context("cannot make a temporary directory")?;
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        let began = std::time::Instant::now();
        dataset.materialise(&dir)?;
        let lz4_ratio = dataset.lz4_ratio(args.recordsize, 256);
        if !args.json {
            eprintln!(
                "dataset: {} files of {}-{} MiB, {} MiB in {} ({:.1} s), content {:?}: LZ4 ratio {:.2} on {} KiB records",
                dataset.files(),
                dataset.file_sizes_bytes.iter().min().copied().unwrap_or(0) >> 20,
                dataset.file_sizes_bytes.iter().max().copied().unwrap_or(0) >> 20,
                dataset.total_bytes >> 20,
                dir.display(),
                began.elapsed().as_secs_f64(),
                dataset.content,
                lz4_ratio,
                args.recordsize >> 10
            );
        }
        Ok(Self {
            dir,
            dataset,
            lz4_ratio,
            hdd,
            _temp: temp,
        })
    }

    /// How many of the first files make about `bytes` (see `prefix_files`).
    pub fn files_for(&self, bytes: u64) -> usize {
        self.dataset.prefix_files(bytes)
    }

    /// A spec over the first `files` files of the dataset.
    pub fn spec(&self, args: &super::BenchArgs, files: usize, compression: bool) -> TargetSpec {
        assert!(files >= 1 && files <= self.dataset.file_sizes_bytes.len());
        let cache_dir = args.cache.first().cloned();
        TargetSpec {
            data_dir: self.dir.clone(),
            file_names: (0..files as u32)
                .map(super::dataset::DatasetSpec::file_name)
                .collect(),
            file_sizes_bytes: self.dataset.file_sizes_bytes[..files].to_vec(),
            hdd: self.hdd.clone(),
            dram_budget_bytes: args.arc_max,
            cache_path: cache_dir.unwrap_or_else(|| self.dir.join("l2arc-bench-cache.img")),
            cache_size_bytes: args.cache_size,
            compression,
            recordsize_bytes: args.recordsize as u32,
            arc_shards: args.arc_shards,
            dram_policy: l2arc::arc::DramPolicy::Arc,
        }
    }
}
