//! What a benchmark reads through: our cache, or a peer, behind one trait.
//!
//! Side-by-side figures are only honest when every system sees the same
//! workload, the same DRAM budget, the same cache file and the same emulated
//! disk. So the scenarios never talk to a cache directly: they read files of
//! the dataset through a `ReadTarget`, and each system (no cache, l2arc,
//! l2arc with an LRU DRAM tier, foyer's hybrid cache) is one implementation.
//! The scenario checks every byte it gets against the dataset's truth, so a
//! fast peer that returns wrong bytes fails the run instead of winning it.
//!
//! Every seed-experiment scenario compares systems that see the same dataset, the
//! same emulated disks, the same DRAM budget and the same cache file. That
//! sameness lives in one value, [`TargetSpec`], from which each target is
//! built: ours (no cache, l2arc) in `ours.rs`, the peers (foyer's hybrid cache,
//! our L2ARC under an LRU DRAM tier) in `peers.rs`. A scenario builds a fresh target per cell (a cold
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

mod ours;
mod peers;

pub(crate) use ours::L2arcTarget;

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use l2arc::primary::Primary;
use l2arc::primary::dir::DirPrimary;
use l2arc::primary::emulated_hdd::{EmulatedHdd, HddConfig};

use serde::Serialize;

/// Cumulative counters of a target since it was built.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub(crate) struct TargetCounters {
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
    pub(crate) fn hit_ratio(&self) -> f64 {
        let total = self.dram_hits + self.flash_hits + self.misses;
        if total == 0 {
            0.0
        } else {
            (self.dram_hits + self.flash_hits) as f64 / total as f64
        }
    }

    /// Counters accumulated between `earlier` and `self` (sizes are taken from `self`).
    pub(crate) fn since(&self, earlier: &TargetCounters) -> TargetCounters {
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
pub(crate) trait ReadTarget: Send + Sync {
    /// Short name used in tables and JSON (`no_cache`, `l2arc`, `foyer`, ...).
    fn name(&self) -> &str;

    /// Reads `buf.len()` bytes of dataset file `file` at `offset`; returns the
    /// bytes read (fewer only at the end of the file).
    fn read(&self, file: u32, offset: u64, buf: &mut [u8]) -> io::Result<usize>;

    /// Counters since the target was built.
    fn counters(&self) -> TargetCounters;
}

/// Which system a scenario reads through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum TargetKind {
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
    pub(crate) fn in_run(peers: bool) -> Vec<TargetKind> {
        let mut kinds = vec![TargetKind::NoCache, TargetKind::L2arc];
        if peers {
            kinds.extend([TargetKind::Foyer, TargetKind::L2arcLru]);
        }
        kinds
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            TargetKind::NoCache => "no_cache",
            TargetKind::L2arc => "l2arc",
            TargetKind::Foyer => "foyer",
            TargetKind::L2arcLru => "l2arc_lru",
        }
    }

    /// Whether the target has a flash tier (and so needs a cache file).
    pub(crate) fn has_flash(self) -> bool {
        self != TargetKind::NoCache
    }
}

/// Everything a target needs to be built; the same for every target of a
/// cell. Stable: peers.rs builds against it.
#[derive(Clone, Debug)]
pub(crate) struct TargetSpec {
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
    pub(crate) fn total_bytes(&self) -> u64 {
        self.file_sizes_bytes.iter().sum()
    }

    /// The emulated array over the dataset directory (a fresh one: new
    /// spindle queues and counters).
    pub(crate) fn hdd_primary(&self) -> Result<Arc<EmulatedHdd>> {
        let dir: Arc<dyn Primary> = Arc::new(DirPrimary::new(&self.data_dir)?);
        Ok(Arc::new(EmulatedHdd::new(dir, self.hdd.clone())?))
    }

    /// Removes the cache file so that a target starts cold (see the module
    /// comment). Only a regular file: a block device is refused, not wiped.
    pub(crate) fn remove_cache_file(&self) -> Result<()> {
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
        l2arc::validate_recordsize(u64::from(self.recordsize_bytes))?;
        Ok(())
    }
}

/// Builds one of our targets; the peers come from `peers::build`.
pub(crate) fn build(kind: TargetKind, spec: &TargetSpec) -> Result<Box<dyn ReadTarget>> {
    spec.check()?;
    match kind {
        TargetKind::NoCache => Ok(Box::new(ours::NoCacheTarget::new(spec)?)),
        TargetKind::L2arc => Ok(Box::new(ours::L2arcTarget::new(spec)?)),
        // The peers live in peers.rs (foyer's HybridCache, l2arc under LRU).
        TargetKind::Foyer | TargetKind::L2arcLru => peers::build(kind, spec),
    }
}

/// What the scenarios share: the dataset on disk and how to build targets over it.
pub(crate) struct Bench {
    pub dir: PathBuf,
    pub dataset: crate::dataset::MixedSizeDataset,
    pub lz4_ratio: f64,
    pub hdd: HddConfig,
    // Keeps a temporary data directory alive for the run.
    _temp: Option<tempfile::TempDir>,
}

impl Bench {
    /// One line describing the emulated disks, for reports.
    pub(crate) fn describe_hdd(&self) -> String {
        let c = &self.hdd;
        format!(
            "emulated HDD: {} spindles, seek {}-{} ms, {} MiB/s",
            c.spindles, c.seek_ms_min, c.seek_ms_max, c.transfer_mib_per_sec
        )
    }

    /// The emulation's mean service time of a read of `bytes`, in ms.
    pub(crate) fn hdd_service_ms(&self, bytes: u64) -> f64 {
        self.hdd.mean_service_ms(bytes)
    }

    /// Generates (or reuses) the mixed-size dataset in `--data` or a
    /// temporary directory, and prints its LZ4 ratio. One dataset serves
    /// every scenario (each reads a prefix of its files), so `--scenario all`
    /// and later runs with the same `--data` generate it once: its size is
    /// the largest the throughput scenario needs (the largest of
    /// `--multiples`, at least 1, times `--cache-size`).
    pub(crate) fn prepare(args: &super::BenchArgs) -> Result<Self> {
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
        let dataset = crate::dataset::MixedSizeDataset::new(
            total_bytes.div_ceil(crate::dataset::SIZE_UNIT_BYTES) * crate::dataset::SIZE_UNIT_BYTES,
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
    pub(crate) fn files_for(&self, bytes: u64) -> usize {
        self.dataset.prefix_files(bytes)
    }

    /// A spec over the first `files` files of the dataset.
    pub(crate) fn spec(
        &self,
        args: &super::BenchArgs,
        files: usize,
        compression: bool,
    ) -> TargetSpec {
        assert!(files >= 1 && files <= self.dataset.file_sizes_bytes.len());
        let cache_dir = args.cache.first().cloned();
        TargetSpec {
            data_dir: self.dir.clone(),
            file_names: (0..files as u32)
                .map(crate::dataset::DatasetSpec::file_name)
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

/// Each of `kinds` in turn: built over `spec`, measured by `measure`, then
/// dropped and its cache file removed (the seed experiments' loop).
pub(crate) fn each_target<T>(
    kinds: &[TargetKind],
    spec: &TargetSpec,
    mut measure: impl FnMut(TargetKind, &dyn ReadTarget) -> Result<T>,
) -> Result<Vec<T>> {
    let mut measured = Vec::new();
    for &kind in kinds {
        let target = build(kind, spec)?;
        measured.push(measure(kind, target.as_ref())?);
        drop(target);
        spec.remove_cache_file()?;
    }
    Ok(measured)
}
