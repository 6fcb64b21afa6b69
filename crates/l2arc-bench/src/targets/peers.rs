//! The peers: foyer's hybrid cache, and our L2ARC under an LRU
//! DRAM tier.
//!
//! A figure such as "l2arc serves N times the IOPS of X" is only worth
//! printing if X is what a user of X would actually run. So each peer is set
//! up the way its authors recommend, with the same resources as ours, and
//! everything that differs is named here.
//!
//! `l2arc_lru` is our own `Cache` (same L2ARC, same feeder, same record size,
//! same cache file) with the DRAM tier switched from ARC to plain LRU
//! (`DramPolicy::Lru`). It isolates what the ARC itself buys: any difference
//! from `l2arc` is the replacement policy's, nothing else's.
//!
//! `foyer` is foyer 0.22's `HybridCache`, a DRAM cache in front of a
//! block-structured flash cache, driven from the scenario's synchronous
//! threads through a tokio runtime the target owns (two worker threads: the
//! machine's cores; the scenario threads block in `block_on`, so its workers
//! only run foyer's own tasks). The configuration:
//!
//! - The memory tier holds `dram_budget_bytes`, weighed as we weigh ARC
//!   buffers (each record's page-rounded allocation), split into as many
//!   shards as our ARC has, with foyer's default eviction (see
//!   `FOYER_EVICTION` for the choice).
//! - The flash tier is foyer's block engine on an `FsDevice` (foyer's
//!   recommended device within a file system; its `FileDevice` is meant for
//!   raw block devices and logs a warning on a regular file) of
//!   `cache_size_bytes`, in a directory beside the cache file, with O_DIRECT as
//!   ours. A block device given as the cache goes to a `FileDevice`. Records
//!   go to flash as they leave DRAM (`WriteOnEviction`, foyer's default and
//!   what the L2ARC feeder approximates), admitted unconditionally (foyer's
//!   default), LZ4 when the scenario compresses, none otherwise. Flash I/O
//!   goes through foyer's default `PsyncIoEngine` (pread/pwrite on tokio's
//!   blocking pool): its io_uring engine (one thread, depth 64) served
//!   about half the warm IOPS on the latency scenario here.
//! - Keys are (file, record); values are whole records of `recordsize`, as
//!   ours. A DRAM miss goes through `get_or_fetch`, foyer's single-flight
//!   path: concurrent misses on one record wait on one flash read or one disk
//!   read, as ours do. The disk read runs on tokio's blocking pool (it sleeps
//!   for the emulated seek), never on a worker.
//!
//! Counting. DRAM hits are memory-tier hits plus reads that waited on another
//! reader's disk read (our `iohits` count as DRAM hits too); flash hits are
//! reads served from foyer's disk tier; misses are disk reads, taken from the
//! emulated array as for every target. Flash bytes are what foyer has
//! written to the device, capped at its capacity: foyer does not expose its
//! live size.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use anyhow::{Context, Result, bail};
use foyer::{
    BlockEngineConfig, Code, DeviceBuilder, FileDeviceBuilder, FsDeviceBuilder, HybridCache,
    HybridCacheBuilder, HybridCachePolicy, LruConfig, Source,
};
use l2arc::arc::DramPolicy;
use l2arc::internals::AlignedBuf;
use l2arc::primary::emulated_hdd::EmulatedHdd;
use l2arc::primary::{Primary, PrimaryObject};

use super::ours::L2arcTarget;
use super::{ReadTarget, TargetCounters, TargetKind, TargetSpec};

/// Builds a peer target (`TargetKind::Foyer` or `TargetKind::L2arcLru`).
pub(super) fn build(kind: TargetKind, spec: &TargetSpec) -> Result<Box<dyn ReadTarget>> {
    match kind {
        TargetKind::L2arcLru => {
            let spec = TargetSpec {
                dram_policy: DramPolicy::Lru,
                ..spec.clone()
            };
            Ok(Box::new(L2arcTarget::with_name(&spec, "l2arc_lru")?))
        }
        TargetKind::Foyer => Ok(Box::new(FoyerTarget::new(spec)?)),
        TargetKind::NoCache | TargetKind::L2arc => bail!("{} is not a peer", kind.name()),
    }
}

/// foyer's DRAM eviction policy. foyer's default is LRU with a 90% high
/// priority pool.
fn foyer_eviction() -> LruConfig {
    LruConfig::default()
}

/// foyer's block engine evicts whole blocks; 16 MiB is its default. A small
/// cache (tests) gets smaller blocks so that it still has a few dozen.
const FOYER_BLOCK_BYTES_MAX: u64 = 16 << 20;
const FOYER_BLOCKS_MIN: u64 = 32;

/// One cached record: the bytes of one `recordsize` block of a file (shorter
/// at the end of a file), in a page-aligned buffer as our ARC holds them.
#[derive(Debug)]
pub(super) struct RecordBytes(AlignedBuf);

impl Code for RecordBytes {
    fn encode(&self, writer: &mut impl Write) -> foyer::Result<()> {
        let len = u32::try_from(self.0.len()).expect("a record is at most 1 MiB");
        writer
            .write_all(&len.to_le_bytes())
            .and_then(|()| writer.write_all(self.0.as_slice()))
            .map_err(foyer::Error::io_error)
    }

    fn decode(reader: &mut impl Read) -> foyer::Result<Self> {
        let mut len = [0u8; 4];
        reader
            .read_exact(&mut len)
            .map_err(foyer::Error::io_error)?;
        let mut buf = AlignedBuf::zeroed(u32::from_le_bytes(len) as usize);
        reader
            .read_exact(buf.as_mut_slice())
            .map_err(foyer::Error::io_error)?;
        Ok(Self(buf))
    }

    fn estimated_size(&self) -> usize {
        4 + self.0.len()
    }
}

/// A counter striped over cache lines, so that 20 reader threads on two
/// cores do not all bounce one line on every read (ours count under locks
/// they already hold).
struct StripedCounter([PaddedU64; STRIPES]);

const STRIPES: usize = 8;

#[repr(align(128))]
#[derive(Default)]
struct PaddedU64(AtomicU64);

impl StripedCounter {
    fn new() -> Self {
        Self(Default::default())
    }

    fn add(&self, n: u64) {
        thread_local! {
            static STRIPE: usize = {
                static NEXT: AtomicUsize = AtomicUsize::new(0);
                NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES
            };
        }
        let stripe = STRIPE.with(|s| *s);
        self.0[stripe].0.fetch_add(n, Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.iter().map(|c| c.0.load(Ordering::Relaxed)).sum()
    }
}

/// foyer's `HybridCache` over the emulated disks.
pub(super) struct FoyerTarget {
    // Dropped in this order: the cache, whose tasks run on the runtime,
    // before the runtime.
    hybrid: HybridCache<u64, RecordBytes>,
    runtime: tokio::runtime::Runtime,
    hdd: Arc<EmulatedHdd>,
    objects: Vec<Arc<dyn PrimaryObject>>,
    file_sizes_bytes: Vec<u64>,
    recordsize_bytes: u64,
    device_capacity_bytes: u64,
    /// The FsDevice directory, removed when the target is dropped.
    device_dir: Option<PathBuf>,
    memory_hits: StripedCounter,
    /// Reads of the flash tier that found the record.
    disk_hits: StripedCounter,
    /// `get_or_fetch` results that came from a disk read (this reader's or
    /// one it waited on).
    outer_results: StripedCounter,
    /// Disk reads foyer's fetch started (one per single-flight group).
    fetches: Arc<AtomicU64>,
}

/// Where foyer keeps its device for a cache file path: a directory beside it.
pub(super) fn foyer_device_dir(cache_path: &Path) -> PathBuf {
    let mut name = cache_path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "cache".into());
    name.push(".foyer");
    cache_path.with_file_name(name)
}

/// foyer's device for a cache path: the block device itself, or a
/// directory beside the cache file (emptied: a cold start, as for ours;
/// foyer would recover a warm device), which is returned to be removed.
fn foyer_device(
    cache_path: &Path,
    capacity_bytes: u64,
) -> Result<(Arc<dyn foyer::Device>, Option<PathBuf>)> {
    let is_block_device = fs::metadata(cache_path)
        .map(|m| m.file_type().is_block_device())
        .unwrap_or(false);
    if is_block_device {
        let device = FileDeviceBuilder::new(cache_path)
            .with_capacity(capacity_bytes as usize)
            .with_direct(true)
            .build()
            .with_context(|| format!("foyer device {}", cache_path.display()))?;
        return Ok((device, None));
    }
    let dir = foyer_device_dir(cache_path);
    match fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(e).with_context(|| format!("cannot remove {}", dir.display()));
        }
    }
    let device = FsDeviceBuilder::new(&dir)
        .with_capacity(capacity_bytes as usize)
        .with_direct(true)
        .build()
        .with_context(|| format!("foyer device {}", dir.display()))?;
    Ok((device, Some(dir)))
}

/// foyer's hybrid cache as `spec` sets it up: the DRAM budget, our shard
/// count, LZ4 or not, written to flash on eviction, psync reads.
async fn hybrid_cache(
    spec: &TargetSpec,
    device: Arc<dyn foyer::Device>,
    block_bytes: u64,
) -> foyer::Result<HybridCache<u64, RecordBytes>> {
    let shards = spec
        .arc_shards
        .unwrap_or_else(|| l2arc::CacheConfig::default().arc_shards);
    let compression = if spec.compression {
        foyer::Compression::Lz4
    } else {
        foyer::Compression::None
    };
    HybridCacheBuilder::new()
        .with_name("foyer")
        .with_policy(HybridCachePolicy::WriteOnEviction)
        // Teardown only: nothing is measured after the target is dropped.
        .with_flush_on_close(false)
        .memory(spec.dram_budget_bytes as usize)
        .with_shards(shards)
        .with_eviction_config(foyer_eviction())
        .with_weighter(|_key: &u64, value: &RecordBytes| value.0.capacity_bytes())
        .storage()
        .with_io_engine_config(foyer::PsyncIoEngineConfig::new())
        .with_engine_config(BlockEngineConfig::new(device).with_block_size(block_bytes as usize))
        .with_compression(compression)
        .build()
        .await
}

impl FoyerTarget {
    pub(super) fn new(spec: &TargetSpec) -> Result<Self> {
        assert_eq!(spec.file_names.len(), spec.file_sizes_bytes.len());
        if spec.file_names.is_empty() {
            bail!("a target needs at least one dataset file");
        }
        l2arc::validate_recordsize(u64::from(spec.recordsize_bytes))?;
        assert!(
            spec.file_names.len() < 1 << 24,
            "file index must fit the key"
        );
        let recordsize_bytes = u64::from(spec.recordsize_bytes);
        let hdd = spec.hdd_primary()?;
        let objects = spec
            .file_names
            .iter()
            .map(|name| hdd.open(name, false))
            .collect::<io::Result<Vec<_>>>()?;

        let device_capacity_bytes = spec.cache_size_bytes / 4096 * 4096;
        let (device, device_dir) = foyer_device(&spec.cache_path, device_capacity_bytes)?;
        let block_bytes = (device_capacity_bytes / FOYER_BLOCKS_MIN)
            .clamp(4 * recordsize_bytes, FOYER_BLOCK_BYTES_MAX)
            .next_multiple_of(4096);
        if block_bytes * 2 > device_capacity_bytes {
            bail!(
                "cache size {} bytes is too small for foyer with {recordsize_bytes}-byte records",
                spec.cache_size_bytes
            );
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("foyer-worker")
            .enable_all()
            .build()?;
        let hybrid = runtime.block_on(hybrid_cache(spec, device, block_bytes))?;
        Ok(Self {
            hybrid,
            runtime,
            hdd,
            objects,
            file_sizes_bytes: spec.file_sizes_bytes.clone(),
            recordsize_bytes,
            device_capacity_bytes,
            device_dir,
            memory_hits: StripedCounter::new(),
            disk_hits: StripedCounter::new(),
            outer_results: StripedCounter::new(),
            fetches: Arc::new(AtomicU64::new(0)),
        })
    }

    fn key(file: u32, record: u64) -> u64 {
        debug_assert!(record < 1 << 40);
        (u64::from(file) << 40) | record
    }

    /// Looks one record up: DRAM, then foyer's flash tier, then the disks.
    fn record(
        &self,
        file: u32,
        record: u64,
    ) -> io::Result<foyer::HybridCacheEntry<u64, RecordBytes>> {
        let key = Self::key(file, record);
        // The memory tier first, on its own: a DRAM hit then costs what it
        // costs in foyer, without building the fetch future (two reference
        // counts shared by every reader) that `get_or_fetch` takes.
        if let Some(entry) = self.hybrid.memory().get(&key) {
            self.memory_hits.add(1);
            return Ok(entry);
        }
        let object = Arc::clone(&self.objects[file as usize]);
        let fetches = Arc::clone(&self.fetches);
        let offset = record * self.recordsize_bytes;
        let len_bytes = self.recordsize_bytes as usize;
        let get = self.hybrid.get_or_fetch(&key, move || async move {
            fetches.fetch_add(1, Ordering::Relaxed);
            tokio::task::spawn_blocking(move || -> io::Result<RecordBytes> {
                let mut buf = AlignedBuf::zeroed(len_bytes);
                let n = object.read_at(offset, buf.as_mut_slice())?;
                buf.set_len(n);
                Ok(RecordBytes(buf))
            })
            .await
            .map_err(io::Error::other)?
        });
        let entry = match get.try_unwrap() {
            Ok(entry) => Ok(entry),
            Err(get) => self.runtime.block_on(get),
        }
        .map_err(io::Error::other)?;
        match entry.source() {
            Source::Memory => self.memory_hits.add(1),
            Source::Disk => self.disk_hits.add(1),
            Source::Outer => self.outer_results.add(1),
        }
        Ok(entry)
    }
}

impl Drop for FoyerTarget {
    fn drop(&mut self) {
        if let Some(dir) = &self.device_dir {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

impl ReadTarget for FoyerTarget {
    fn name(&self) -> &str {
        "foyer"
    }

    fn read(&self, file: u32, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let size_bytes = self.file_sizes_bytes[file as usize];
        let end = size_bytes.min(offset.saturating_add(buf.len() as u64));
        let mut pos = offset;
        while pos < end {
            let record = pos / self.recordsize_bytes;
            let in_record = (pos - record * self.recordsize_bytes) as usize;
            let entry = self.record(file, record)?;
            let data = entry.value().0.as_slice();
            if in_record >= data.len() {
                break; // the file is shorter than it was
            }
            let n = data.len().min(in_record + (end - pos) as usize) - in_record;
            let done = (pos - offset) as usize;
            buf[done..done + n].copy_from_slice(&data[in_record..in_record + n]);
            pos += n as u64;
        }
        Ok((pos - offset) as usize)
    }

    fn counters(&self) -> TargetCounters {
        let fetches = self.fetches.load(Ordering::Relaxed);
        let written = self.hybrid.statistics().disk_write_bytes() as u64;
        let flash_bytes = written.min(self.device_capacity_bytes);
        TargetCounters {
            dram_hits: self.memory_hits.get() + self.outer_results.get().saturating_sub(fetches),
            flash_hits: self.disk_hits.get(),
            misses: self.hdd.stats().reads,
            flash_bytes,
            flash_alloc_bytes: flash_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::{Content, DatasetSpec};
    use l2arc::primary::emulated_hdd::HddConfig;

    const RECORD_BYTES: u32 = 64 * 1024;
    /// Not a whole number of records: the last record of each file is short.
    const FILE_BYTES: u64 = 1024 * 1024 + 12 * 1024;
    const FILES: u32 = 3;

    fn dataset() -> DatasetSpec {
        DatasetSpec {
            files: FILES,
            file_size_bytes: FILE_BYTES,
            seed: 7,
            content: Content::Mixed,
        }
    }

    fn spec(dir: &Path, dram_budget_bytes: u64, compression: bool) -> TargetSpec {
        let data = dataset();
        data.materialise(&dir.join("data")).unwrap();
        TargetSpec {
            data_dir: dir.join("data"),
            file_names: (0..FILES).map(DatasetSpec::file_name).collect(),
            file_sizes_bytes: vec![FILE_BYTES; FILES as usize],
            hdd: HddConfig {
                spindles: 4,
                seek_ms_min: 0.05,
                seek_ms_max: 0.1,
                transfer_mib_per_sec: 2000.0,
                ..HddConfig::default()
            },
            dram_budget_bytes,
            cache_path: dir.join("cache.bin"),
            cache_size_bytes: 16 << 20,
            compression,
            recordsize_bytes: RECORD_BYTES,
            arc_shards: Some(1),
            dram_policy: DramPolicy::Arc,
        }
    }

    /// Reads every file in 8 KiB pieces plus reads that straddle records
    /// and the end of the file, checking every byte.
    fn read_all(target: &dyn ReadTarget) {
        let data = dataset();
        let mut buf = vec![0u8; 8192];
        for file in 0..FILES {
            for offset in (0..FILE_BYTES).step_by(buf.len()) {
                let n = target.read(file, offset, &mut buf).unwrap();
                assert_eq!(n as u64, (FILE_BYTES - offset).min(buf.len() as u64));
                assert!(
                    data.verify(file, offset, &buf[..n]),
                    "{} file {file} at {offset}",
                    target.name()
                );
            }
            let mut odd = vec![0u8; 100_001];
            for offset in [u64::from(RECORD_BYTES) - 3, FILE_BYTES - 50_000] {
                let n = target.read(file, offset, &mut odd).unwrap();
                assert_eq!(n as u64, (FILE_BYTES - offset).min(odd.len() as u64));
                assert!(
                    data.verify(file, offset, &odd[..n]),
                    "{} file {file} at {offset}",
                    target.name()
                );
            }
            assert_eq!(target.read(file, FILE_BYTES, &mut buf).unwrap(), 0);
            assert_eq!(target.read(file, FILE_BYTES + 5, &mut buf).unwrap(), 0);
        }
    }

    /// Records per file, the last one short.
    const RECORDS: u64 = FILE_BYTES.div_ceil(RECORD_BYTES as u64);

    #[test]
    fn peers_return_the_dataset_bytes_and_hit_on_a_second_pass() {
        for kind in [TargetKind::Foyer, TargetKind::L2arcLru] {
            let dir = tempfile::tempdir().unwrap();
            // DRAM holds the whole dataset: the second pass is all DRAM hits.
            let target = build(kind, &spec(dir.path(), 8 << 20, false)).unwrap();
            assert_eq!(target.name(), kind.name());
            read_all(&*target);
            let first = target.counters();
            if kind == TargetKind::Foyer {
                assert_eq!(
                    first.misses,
                    u64::from(FILES) * RECORDS,
                    "foyer: one disk read per record"
                );
            } else {
                // Read-ahead reads the records after a sequential reader's
                // in the same disk read.
                assert!(
                    first.misses > 0 && first.misses < u64::from(FILES) * RECORDS,
                    "{}: {} disk reads for {} records",
                    kind.name(),
                    first.misses,
                    u64::from(FILES) * RECORDS
                );
            }
            read_all(&*target);
            let second = target.counters().since(&first);
            assert_eq!(second.misses, 0, "{}", kind.name());
            assert_eq!(second.flash_hits, 0, "{}", kind.name());
            assert!(
                second.dram_hits >= u64::from(FILES) * RECORDS,
                "{}: {second:?}",
                kind.name()
            );
        }
    }

    #[test]
    fn foyer_serves_from_flash_when_dram_is_smaller_than_the_working_set() {
        for compression in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            // Four records of DRAM for 51 records of data.
            let target =
                FoyerTarget::new(&spec(dir.path(), 4 * u64::from(RECORD_BYTES), compression))
                    .unwrap();
            read_all(&target);
            // Evicted records reach flash asynchronously.
            std::thread::sleep(std::time::Duration::from_millis(500));
            let first = target.counters();
            assert!(first.flash_bytes > 0, "{first:?}");
            read_all(&target);
            let second = target.counters().since(&first);
            assert!(
                second.flash_hits >= u64::from(FILES) * RECORDS / 2,
                "compression {compression}: {second:?}"
            );
            let device_dir = foyer_device_dir(&dir.path().join("cache.bin"));
            assert!(device_dir.is_dir());
            drop(target);
            assert!(
                !device_dir.exists(),
                "the device directory outlived the target"
            );
        }
    }

    #[test]
    fn concurrent_misses_on_one_record_read_the_disk_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = spec(dir.path(), 8 << 20, false);
        spec.hdd.seek_ms_min = 20.0;
        spec.hdd.seek_ms_max = 20.0;
        let target = FoyerTarget::new(&spec).unwrap();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let mut buf = vec![0u8; 4096];
                    assert_eq!(target.read(1, 8192, &mut buf).unwrap(), 4096);
                    assert!(dataset().verify(1, 8192, &buf));
                });
            }
        });
        let c = target.counters();
        assert_eq!(c.misses, 1, "{c:?}");
        assert_eq!(c.dram_hits, 7, "{c:?}");
    }
}
