//! `--scenario fuse`: what the FUSE mount costs on hits.
//!
//! The mount exists to put RAM (and flash) in front of slow storage, but
//! every read that reaches the daemon crosses the kernel twice more than a
//! read of a local file. Two paths are measured on the same hot files:
//!
//! - **buffered**, as programs read: the mount keeps the kernel's pages of
//!   a file across opens (FOPEN_KEEP_CACHE) until the source changes, so a
//!   hot file is read from the page cache without reaching the daemon.
//!   Compared with the source read warm from the page cache (the best any
//!   file read can do here), with one reader and with 32, mean and the
//!   minimum over one-second intervals (a steady rate, not a burst);
//! - **O_DIRECT**, which always reaches the daemon: the ARC hit path through
//!   FUSE, compared with the source read uncached (page cache dropped,
//!   O_DIRECT): what a reader pays without a cache in RAM (on a fast local
//!   disk; a real slow source costs far more).
//!
//! fio with psync reads, random 4 KiB and sequential 128 KiB.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use l2arc::primary::dir::DirPrimary;
use l2arc::{Cache, CacheConfig, DatasetConfig};
use l2arc_fuse::{CachedFs, FsOptions, MountOptions};
use serde::Serialize;

use crate::BenchArgs;

use super::{Goal, Headline, Outcome, Scenario};
use crate::fio::{FioJob, FioTarget};

/// Files and their size: 128 MiB in all, small enough to stay in the ARC.
const FILES: usize = 4;
const FILE_BYTES: u64 = 32 << 20;
/// Default measured seconds per fio run (--measure-secs overrides).
const DEFAULT_RUN_SECS: f64 = 8.0;

#[derive(Serialize, Clone)]
struct Side {
    iops: f64,
    /// The lowest IOPS of any whole second of the run.
    iops_min_1s: f64,
    mib_per_sec: f64,
    latency_us_p50: f64,
    latency_us_p99: f64,
}

#[derive(Serialize)]
struct Row {
    workload: String,
    jobs: u32,
    /// "buffered" (page cache) or "O_DIRECT" (every read reaches the daemon).
    path: &'static str,
    mount: Side,
    /// What the source is compared as: warm page cache, or uncached.
    source_reader: &'static str,
    source: Side,
    mount_over_source: f64,
    mount_over_source_min_1s: f64,
    /// ARC hit ratio of the reads the daemon served during the mount's run
    /// (None: none reached it, the page cache served them all).
    mount_arc_hit_ratio: Option<f64>,
}

#[derive(Serialize)]
struct Report {
    machine: super::l2_hit::Machine,
    load_average: String,
    data_bytes: u64,
    files: usize,
    recordsize_bytes: u32,
    run_secs: f64,
    page_cache_dropped: bool,
    fio_version: String,
    rows: Vec<Row>,
}

/// How a row's reads go: through the page cache, or around it.
#[derive(Clone, Copy)]
enum ReadPath {
    Buffered,
    Direct,
}

impl ReadPath {
    fn name(self) -> &'static str {
        match self {
            ReadPath::Buffered => "buffered",
            ReadPath::Direct => "O_DIRECT",
        }
    }

    /// What the source is compared as.
    fn source_reader(self) -> &'static str {
        match self {
            ReadPath::Buffered => "page cache warm",
            ReadPath::Direct => "uncached",
        }
    }
}

/// One fio run: `jobs` psync readers of `rw` in `block_bytes`.
struct FioRun {
    rw: &'static str,
    block_bytes: u64,
    path: ReadPath,
    jobs: u32,
    secs: f64,
}

impl FioRun {
    fn new(rw: &'static str, block_bytes: u64, jobs: u32, path: ReadPath, secs: f64) -> Self {
        Self {
            rw,
            block_bytes,
            path,
            jobs,
            secs,
        }
    }

    /// Runs over `files`.
    fn run(&self, files: &[PathBuf]) -> Result<Side> {
        let read = FioJob::new(
            "fuse",
            "psync",
            FioTarget::Files(files.to_vec()),
            self.rw,
            self.block_bytes,
            self.secs.ceil().max(2.0) as u64,
        )
        .readonly()
        .direct(matches!(self.path, ReadPath::Direct))
        .keep_page_cache()
        .numjobs(self.jobs as usize)
        .iops_log()
        .run(None)?;
        Ok(Side {
            iops: read.iops,
            iops_min_1s: read
                .iops_per_second
                .iter()
                .copied()
                .fold(f64::INFINITY, f64::min)
                .min(read.iops),
            mib_per_sec: read.mib_per_sec,
            latency_us_p50: read.latency_us_p50,
            latency_us_p99: read.latency_us_p99,
        })
    }
}

pub(crate) fn drop_page_cache() -> bool {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

fn read_all(files: &[PathBuf]) -> Result<()> {
    for f in files {
        let mut file = std::fs::File::open(f).with_context(|| format!("{}", f.display()))?;
        std::io::copy(&mut file, &mut std::io::sink())?;
    }
    Ok(())
}

pub(crate) fn run(args: &BenchArgs) -> Result<Outcome> {
    let fio_version = crate::fio::version()?;
    let secs = args.measure_secs.unwrap_or(DEFAULT_RUN_SECS);
    if !(secs > 0.0 && secs <= 3600.0) {
        bail!("--measure-secs must be from 0 to 3600, not {secs}");
    }
    let tmp = super::work_dir(args.data.as_deref())?;
    let src = tmp.path().join("src");
    let mnt = tmp.path().join("mnt");
    write_source_files(&src, args.seed)?;
    std::fs::create_dir(&mnt)?;
    let recordsize_bytes = l2arc::validate_recordsize(args.recordsize)?;
    let (cache, mounted) = mount(&src, &mnt, recordsize_bytes)?;
    let bench = FuseBench::new(cache, &src, &mnt)?;
    let mut rows = Vec::new();
    let mut dropped_all = true;
    // Buffered: the mount's kept pages against the source's page cache.
    read_all(&bench.source)?;
    for (workload, rw, block_bytes, jobs) in [
        ("random 4 KiB", "randread", 4096u64, 1u32),
        ("random 4 KiB", "randread", 4096, 32),
        ("sequential 128 KiB", "read", 128 << 10, 1),
    ] {
        let job = FioRun::new(rw, block_bytes, jobs, ReadPath::Buffered, secs);
        rows.push(bench.row(workload, &job)?.0);
    }
    // O_DIRECT: the daemon's ARC hit path against the uncached source.
    for (workload, rw, block_bytes) in [
        ("random 4 KiB", "randread", 4096u64),
        ("sequential 128 KiB", "read", 128 << 10),
    ] {
        let job = FioRun::new(rw, block_bytes, 1, ReadPath::Direct, secs);
        let (row, dropped) = bench.row(workload, &job)?;
        dropped_all &= dropped;
        rows.push(row);
    }
    drop(mounted);
    let report = Report {
        machine: super::l2_hit::machine(tmp.path()),
        load_average: crate::load_average(),
        data_bytes: FILES as u64 * FILE_BYTES,
        files: FILES,
        recordsize_bytes,
        run_secs: secs,
        page_cache_dropped: dropped_all,
        fio_version,
        rows,
    };
    let headline = headline(&report);
    Outcome::new(report, headline, print_table)
}

/// The mount against the page cache, per buffered row.
fn headline(report: &Report) -> Vec<Headline> {
    report
        .rows
        .iter()
        .filter(|r| r.path == "buffered")
        .map(|r| {
            Headline::versus(
                &format!("{}_{}", r.workload.replace([' ', '-'], "_"), r.jobs),
                &format!(
                    "FUSE mount, hot files, {} ({} reader{})",
                    r.workload,
                    r.jobs,
                    if r.jobs == 1 { "" } else { "s" }
                ),
                "MiB/s",
                (
                    r.mount.mib_per_sec,
                    "the source in the page cache",
                    r.source.mib_per_sec,
                ),
                Goal::ratio_at_least(0.8),
            )
        })
        .collect()
}

/// `FILES` files of random bytes in `src` (made).
fn write_source_files(src: &Path, seed: u64) -> Result<()> {
    std::fs::create_dir(src)?;
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for i in 0..FILES {
        let data: Vec<u8> = (0..FILE_BYTES / 8)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect();
        std::fs::write(src.join(format!("f{i}")), data)?;
    }
    Ok(())
}

/// A cache over `src` (an ARC twice the data) mounted at `mnt`.
fn mount(
    src: &Path,
    mnt: &Path,
    recordsize_bytes: u32,
) -> Result<(Arc<Cache>, l2arc_fuse::MountGuard)> {
    let cache: Arc<Cache> =
        Cache::new(CacheConfig::default().arc_max_bytes(2 * FILES as u64 * FILE_BYTES))?;
    let primary = Arc::new(DirPrimary::new(src)?);
    let dataset = cache.add_dataset(
        "bench-fuse",
        Arc::clone(&primary) as Arc<dyn l2arc::primary::Primary>,
        DatasetConfig::default().recordsize_bytes(recordsize_bytes),
    )?;
    let fs = CachedFs::new(Arc::clone(&cache), dataset, primary, FsOptions::default())?;
    let mounted = l2arc_fuse::MountGuard::mount(fs, mnt, &MountOptions::default())
        .context("mount (is fusermount3 installed? scripts/setup.sh installs it)")?;
    Ok((cache, mounted))
}

/// The same files through the mount and at the source.
struct FuseBench {
    cache: Arc<Cache>,
    through: Vec<PathBuf>,
    source: Vec<PathBuf>,
}

impl FuseBench {
    /// Warms the ARC through the mount (twice: the second pass must be all hits).
    fn new(cache: Arc<Cache>, src: &Path, mnt: &Path) -> Result<Self> {
        let names: Vec<String> = (0..FILES).map(|i| format!("f{i}")).collect();
        let bench = Self {
            cache,
            through: names.iter().map(|n| mnt.join(n)).collect(),
            source: names.iter().map(|n| src.join(n)).collect(),
        };
        let start = Instant::now();
        read_all(&bench.through)?;
        read_all(&bench.through)?;
        eprintln!(
            "fuse: {} MiB in {FILES} files warmed through the mount in {:.1} s",
            (FILES as u64 * FILE_BYTES) >> 20,
            start.elapsed().as_secs_f64()
        );
        Ok(bench)
    }

    /// `job` through the mount, then at the source (uncached for O_DIRECT:
    /// the page cache is dropped first; false if it could not be).
    fn row(&self, workload: &str, job: &FioRun) -> Result<(Row, bool)> {
        let ratio = |a: f64, b: f64| a / b.max(f64::MIN_POSITIVE);
        let before = self.cache.stats();
        let mount_side = job.run(&self.through)?;
        let hit_ratio = arc_hit_ratio(&before, &self.cache.stats());
        let dropped = match job.path {
            ReadPath::Buffered => true,
            ReadPath::Direct => drop_page_cache(),
        };
        let source = job.run(&self.source)?;
        let row = Row {
            workload: workload.to_string(),
            jobs: job.jobs,
            path: job.path.name(),
            mount_over_source: ratio(mount_side.iops, source.iops),
            mount_over_source_min_1s: ratio(mount_side.iops_min_1s, source.iops_min_1s),
            mount_arc_hit_ratio: hit_ratio,
            mount: mount_side,
            source_reader: job.path.source_reader(),
            source,
        };
        Ok((row, dropped))
    }
}

fn arc_hit_ratio(before: &l2arc::CacheStats, after: &l2arc::CacheStats) -> Option<f64> {
    let hits = after.arc.hits - before.arc.hits;
    let lookups = hits + (after.arc.misses - before.arc.misses);
    (lookups > 0).then(|| hits as f64 / lookups as f64)
}

fn print_table(r: &Report) {
    println!(
        "FUSE mount on hot files: {} MiB in {} files, recordsize {} KiB, fio psync, {} s per run",
        r.data_bytes >> 20,
        r.files,
        r.recordsize_bytes >> 10,
        r.run_secs
    );
    println!(
        "machine: {} CPUs, {:.1} GiB RAM, kernel {}, {}; {}; load average {}",
        r.machine.cpus,
        r.machine.ram_gib,
        r.machine.kernel,
        r.machine.fs,
        r.fio_version,
        r.load_average
    );
    if !r.page_cache_dropped {
        println!("note: could not drop the page cache (not root?) before the uncached runs");
    }
    println!(
        "{:<20} {:>4} {:<9} {:<26} {:>10} {:>10} {:>9} {:>8} {:>8}",
        "workload", "jobs", "path", "reader", "IOPS", "min 1s", "MiB/s", "p50 us", "p99 us"
    );
    for row in &r.rows {
        let source = format!("SRC, {}", row.source_reader);
        for (name, side) in [("mount", &row.mount), (source.as_str(), &row.source)] {
            println!(
                "{:<20} {:>4} {:<9} {:<26} {:>10.0} {:>10.0} {:>9.1} {:>8.1} {:>8.1}",
                row.workload,
                row.jobs,
                row.path,
                name,
                side.iops,
                side.iops_min_1s,
                side.mib_per_sec,
                side.latency_us_p50,
                side.latency_us_p99
            );
        }
        let daemon = match row.mount_arc_hit_ratio {
            Some(ratio) => format!("ARC hit ratio of the daemon's reads {ratio:.4}"),
            None => "no read reached the daemon".to_string(),
        };
        println!(
            "{:<36} mount/source {:.2}x (min 1s {:.2}x), {daemon}",
            "", row.mount_over_source, row.mount_over_source_min_1s
        );
    }
}

/// `--scenario fuse`.
pub(crate) struct Fuse;

impl Scenario for Fuse {
    fn name(&self) -> &'static str {
        "fuse"
    }
    fn measures(&self) -> &'static str {
        "FUSE mount on hot files: fio through the mount vs the source in the page cache, and the daemon's hit path vs the uncached source."
    }
    fn run(&self, args: &BenchArgs) -> Result<Outcome> {
        run(args)
    }
}
