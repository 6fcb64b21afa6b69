//! The default benchmark: the cache against no cache over an emulated HDD.
//!
//! A deterministic dataset sits on an emulated array of hard disks. Reader
//! threads issue random reads, most of them to a hot part of the data, first
//! straight to the disks (`primarycache=none`), then through the ARC from
//! cold. Every byte read is checked against the generator. The report gives
//! IOPS, throughput and latency percentiles for both and the ratio between
//! them, and the IOPS curve as the cache warms.
//!
//! Warm-up. The report gives the time until the cache's IOPS first reach 90%
//! of their warm level (the mean of the last quarter of the phase) and sets it
//! against the time it takes to read the whole dataset (the working set)
//! once from the emulated disks: in whole records, from the emulation's mean
//! service time (mean positioning time plus transfer, spindles in parallel),
//! and at the throughput the no-cache phase measured. A cache cannot be warm
//! sooner than the first; how much longer it takes is what skewed random
//! reads, ARC evictions before the feeder copies a record to the L2ARC, and
//! the last cold records cost. If IOPS were still climbing at the end of the
//! phase, the report says so (the warm level is then underestimated: run
//! with a longer `--seconds`).
//!
//! Compression. The dataset's LZ4 ratio (`--content mixed` is about 2:1,
//! `random` does not compress) is measured on a sample of records, and the
//! cache phase reports the logical and allocated bytes of the L2ARC.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use l2arc::primary::Primary;
use l2arc::primary::dir::DirPrimary;
use l2arc::primary::emulated_hdd::{EmulatedHdd, HddConfig};
use l2arc::{Cache, CacheConfig, CacheMode, DatasetConfig, ObjectHandle};
use serde::Serialize;

use crate::dataset::{Content, DatasetSpec};
use crate::runner;
use crate::runner::{Phase, PhaseResult, Until};
use crate::{BenchArgs, OnOff};

use super::{Headline, Outcome, Scenario};

#[derive(Serialize)]
struct PhaseReport {
    setting: &'static str,
    ops: u64,
    seconds: f64,
    iops: f64,
    warm_iops: f64,
    mib_per_sec: f64,
    latency_us_p50: f64,
    latency_us_p99: f64,
    latency_us_p999: f64,
    latency_us_max: f64,
    arc_hit_ratio: f64,
    l2_hit_ratio: f64,
    l2_size_bytes: u64,
    l2_asize_bytes: u64,
    hdd_reads: u64,
    intervals: Vec<IntervalIops>,
}

/// The IOPS of one interval of a phase (a point of the warm-up curve).
#[derive(Serialize)]
struct IntervalIops {
    end_secs: f64,
    iops: f64,
}

#[derive(Serialize)]
struct DemoReport {
    dataset_bytes: u64,
    arc_max_bytes: u64,
    recordsize_bytes: u64,
    read_size_bytes: u64,
    threads: usize,
    hot_read_fraction: f64,
    hot_data_fraction: f64,
    hdd: String,
    phases: Vec<PhaseReport>,
    iops_ratio: f64,
    warm_iops_ratio: f64,
    p50_latency_ratio: f64,
    bytes_verified: u64,
    content: Content,
    compression: String,
    dataset_lz4_ratio: f64,
    cache_device_bytes: u64,
    warmup: Warmup,
    arcstats: Vec<(&'static str, u64)>,
}

#[derive(Serialize)]
struct Warmup {
    /// Mean IOPS over the last quarter of the cache phase.
    warm_iops: f64,
    /// End of the first interval at 90% of `warm_iops` or more.
    secs_to_90pct: Option<f64>,
    /// The median IOPS of the second half of the last quarter is over 110%
    /// of the first half's.
    still_warming: bool,
    working_set_bytes: u64,
    /// The working set read once from the emulated disks in whole records.
    one_pass_records_secs: f64,
    /// The working set read once at the no-cache phase's throughput.
    one_pass_no_cache_secs: f64,
}

impl Warmup {
    fn new(
        cache: &PhaseReport,
        no_cache: &PhaseReport,
        dataset_bytes: u64,
        args: &BenchArgs,
        files: u32,
    ) -> Self {
        let warm_iops = cache.warm_iops;
        let secs_to_90pct = cache
            .intervals
            .iter()
            .find(|i| i.iops >= 0.9 * warm_iops)
            .map(|i| i.end_secs);
        let n = cache.intervals.len();
        let tail = &cache.intervals[n - n.div_ceil(4)..];
        let half = tail.len() / 2;
        // Medians of the two halves of the last quarter: one disturbed
        // interval on a shared machine should not read as a trend.
        let median = |s: &[IntervalIops]| {
            let mut v: Vec<f64> = s.iter().map(|i| i.iops).collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        };
        let still_warming = half > 0 && median(&tail[half..]) > 1.1 * median(&tail[..half]);
        // Whole records per file (the last one may be short).
        let per_file = dataset_bytes / u64::from(files);
        let records = per_file.div_ceil(args.recordsize) * u64::from(files);
        let seek_secs = (args.seek_ms_min + args.seek_ms_max) / 2.0 / 1000.0;
        let transfer_secs =
            args.recordsize.min(per_file) as f64 / (args.transfer_mib_per_sec * (1 << 20) as f64);
        let one_pass_records_secs =
            records as f64 * (seek_secs + transfer_secs) / args.spindles as f64;
        let no_cache_bytes_per_sec = no_cache.mib_per_sec * (1 << 20) as f64;
        Self {
            warm_iops,
            secs_to_90pct,
            still_warming,
            working_set_bytes: dataset_bytes,
            one_pass_records_secs,
            one_pass_no_cache_secs: dataset_bytes as f64 / no_cache_bytes_per_sec.max(1.0),
        }
    }
}

pub(crate) fn run(args: &BenchArgs) -> Result<Outcome> {
    let demo = Demo::prepare(args)?;
    let mut phases = Vec::new();
    let mut bytes_verified = 0u64;
    let mut arcstats = Vec::new();
    let mut hdd = String::new();
    for &(setting, primarycache, with_l2arc) in settings(args.l2arc) {
        let measured = demo.measure(setting, primarycache, with_l2arc)?;
        bytes_verified += measured.bytes_verified;
        if primarycache == CacheMode::All {
            arcstats = measured.arcstats;
        }
        hdd = measured.hdd;
        phases.push(measured.phase);
    }
    let report = demo.report(phases, bytes_verified, hdd, arcstats);
    let headline = headline(&report);
    Outcome::new(report, headline, print_report)
}

/// The cache's IOPS against no cache's.
fn headline(r: &DemoReport) -> Vec<Headline> {
    let (Some(none), Some(cache)) = (r.phases.first(), r.phases.last()) else {
        return Vec::new();
    };
    vec![Headline::versus(
        "iops",
        &format!(
            "demo: random {} KiB reads, {} threads, {} MiB on an emulated HDD, ARC {} MiB + L2ARC",
            r.read_size_bytes >> 10,
            r.threads,
            r.dataset_bytes >> 20,
            r.arc_max_bytes >> 20
        ),
        "IOPS",
        (cache.iops, "no cache", none.iops),
        None,
    )]
}

/// The two settings measured, by name: no cache, then the ARC (and the
/// L2ARC unless `--l2arc off`).
fn settings(l2arc: OnOff) -> &'static [(&'static str, CacheMode, bool)] {
    if l2arc == OnOff::On {
        &[
            ("no_cache", CacheMode::None, false),
            ("arc_l2arc", CacheMode::All, true),
        ]
    } else {
        &[
            ("no_cache", CacheMode::None, false),
            ("arc", CacheMode::All, false),
        ]
    }
}

/// The demo's set-up: the dataset on disk, the emulated HDD's and the
/// cache's settings.
struct Demo<'a> {
    args: &'a BenchArgs,
    spec: DatasetSpec,
    dir: PathBuf,
    /// The temporary directory `dir` is, without `--data` (removed on drop).
    _temp: Option<tempfile::TempDir>,
    hdd_config: HddConfig,
    cache_config: CacheConfig,
    dataset_lz4_ratio: f64,
}

/// One setting's phase and what the report takes from it.
struct Measured {
    phase: PhaseReport,
    bytes_verified: u64,
    hdd: String,
    arcstats: Vec<(&'static str, u64)>,
}

impl<'a> Demo<'a> {
    /// Checks the settings, then writes the dataset (or finds it in `--data`).
    fn prepare(args: &'a BenchArgs) -> Result<Self> {
        let file_size_bytes = (args.dataset_size / u64::from(args.files)).max(args.read_size);
        let spec = DatasetSpec {
            files: args.files,
            file_size_bytes,
            seed: args.seed,
            content: args.content,
        };
        let (dir, temp) = match &args.data {
            Some(dir) => (dir.clone(), None),
            None => {
                let temp = tempfile::tempdir().context("cannot make a temporary directory")?;
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        let hdd_config = HddConfig {
            spindles: args.spindles,
            seek_ms_min: args.seek_ms_min,
            seek_ms_max: args.seek_ms_max,
            transfer_mib_per_sec: args.transfer_mib_per_sec,
            ..HddConfig::default()
        };
        hdd_config.validate()?;
        let mut cache_config = CacheConfig::default().arc_max_bytes(args.arc_max);
        if let Some(shards) = args.arc_shards {
            cache_config.arc_shards = shards;
        }
        Cache::new(cache_config.clone())?; // check the settings before writing a dataset
        spec.materialise(&dir)?;
        let demo = Self {
            args,
            dataset_lz4_ratio: spec.lz4_ratio(args.recordsize, 64),
            spec,
            dir,
            _temp: temp,
            hdd_config,
            cache_config,
        };
        demo.describe_dataset();
        Ok(demo)
    }

    fn describe_dataset(&self) {
        if !self.args.json {
            eprintln!(
                "dataset: {} files x {} MiB in {}, content {} (LZ4 ratio {:.2} in {} KiB records)",
                self.spec.files,
                self.spec.file_size_bytes >> 20,
                self.dir.display(),
                format!("{:?}", self.spec.content).to_lowercase(),
                self.dataset_lz4_ratio,
                self.args.recordsize >> 10
            );
        }
    }

    /// A fresh cache over fresh emulated disks, with the L2ARC or without,
    /// and the dataset's files opened.
    fn open(
        &self,
        primarycache: CacheMode,
        with_l2arc: bool,
    ) -> Result<(Arc<Cache>, Arc<EmulatedHdd>, Vec<ObjectHandle>)> {
        let args = self.args;
        let dir_primary: Arc<dyn Primary> = Arc::new(DirPrimary::new(&self.dir)?);
        let hdd = Arc::new(EmulatedHdd::new(dir_primary, self.hdd_config.clone())?);
        let cache = Cache::new(self.cache_config.clone())?;
        let dataset = cache.add_dataset(
            "bench",
            Arc::clone(&hdd) as Arc<dyn Primary>,
            DatasetConfig::default()
                .recordsize_bytes(args.recordsize as u32)
                .primarycache(primarycache)
                .compression(args.compression),
        )?;
        if with_l2arc {
            if args.cache.is_empty() {
                cache.add_cache_path(self.dir.join("l2arc-cache.img"), Some(args.cache_size))?;
            } else {
                for path in &args.cache {
                    cache.add_cache_path(path, Some(args.cache_size))?;
                }
            }
        }
        let handles = (0..self.spec.files)
            .map(|f| cache.open(dataset, &DatasetSpec::file_name(f), false))
            .collect::<std::io::Result<_>>()?;
        Ok((cache, hdd, handles))
    }

    /// One setting's phase from a cold cache.
    fn measure(
        &self,
        setting: &'static str,
        primarycache: CacheMode,
        with_l2arc: bool,
    ) -> Result<Measured> {
        let (cache, hdd, handles) = self.open(primarycache, with_l2arc)?;
        let result = run_reads(self.args, &self.spec, &cache, &handles, setting)?;
        let stats = cache.stats();
        let measured = Measured {
            bytes_verified: result.bytes,
            phase: PhaseReport::new(setting, &result, &stats, hdd.stats().reads),
            hdd: hdd.describe(),
            arcstats: stats.kstats(),
        };
        if with_l2arc && self.args.cache.is_empty() {
            drop(handles);
            drop(cache);
            let _ = std::fs::remove_file(self.dir.join("l2arc-cache.img"));
        }
        Ok(measured)
    }

    fn report(
        &self,
        phases: Vec<PhaseReport>,
        bytes_verified: u64,
        hdd: String,
        arcstats: Vec<(&'static str, u64)>,
    ) -> DemoReport {
        let args = self.args;
        let (base, ours) = (&phases[0], &phases[1]);
        let dataset_bytes = self.spec.total_bytes();
        DemoReport {
            dataset_bytes,
            arc_max_bytes: args.arc_max,
            recordsize_bytes: args.recordsize,
            read_size_bytes: args.read_size,
            threads: args.threads,
            hot_read_fraction: args.hot_read_fraction,
            hot_data_fraction: args.hot_data_fraction,
            hdd,
            iops_ratio: ours.iops / base.iops,
            warm_iops_ratio: ours.warm_iops / base.warm_iops,
            p50_latency_ratio: base.latency_us_p50 / ours.latency_us_p50,
            bytes_verified,
            content: self.spec.content,
            compression: format!("{:?}", args.compression).to_lowercase(),
            dataset_lz4_ratio: self.dataset_lz4_ratio,
            cache_device_bytes: if args.l2arc == OnOff::On {
                args.cache_size
            } else {
                0
            },
            warmup: Warmup::new(ours, base, dataset_bytes, args, self.spec.files),
            arcstats,
            phases,
        }
    }
}

impl PhaseReport {
    fn new(
        setting: &'static str,
        result: &PhaseResult,
        stats: &l2arc::CacheStats,
        hdd_reads: u64,
    ) -> Self {
        let l2 = |name| stats.l2.as_ref().map_or(0, |l2| l2.get(name));
        let (l2_hits, l2_misses) = (l2("l2_hits"), l2("l2_misses"));
        Self {
            setting,
            ops: result.ops,
            seconds: result.elapsed_secs,
            iops: result.iops(),
            warm_iops: result.tail_iops(),
            mib_per_sec: result.mib_per_sec(),
            latency_us_p50: result.latency_us(0.5),
            latency_us_p99: result.latency_us(0.99),
            latency_us_p999: result.latency_us(0.999),
            latency_us_max: result.latency_ns.max() as f64 / 1000.0,
            arc_hit_ratio: stats.arc_hit_ratio(),
            l2_hit_ratio: if l2_hits + l2_misses == 0 {
                0.0
            } else {
                l2_hits as f64 / (l2_hits + l2_misses) as f64
            },
            l2_size_bytes: l2("l2_size"),
            l2_asize_bytes: l2("l2_asize"),
            hdd_reads,
            intervals: result
                .intervals
                .iter()
                .map(|i| IntervalIops {
                    end_secs: i.end_secs,
                    iops: i.iops(),
                })
                .collect(),
        }
    }
}

fn run_reads(
    args: &BenchArgs,
    spec: &DatasetSpec,
    cache: &Cache,
    handles: &[ObjectHandle],
    label: &str,
) -> Result<PhaseResult> {
    let read_size = args.read_size as usize;
    let blocks_per_file = spec.file_size_bytes / args.read_size;
    let total_blocks = blocks_per_file * u64::from(spec.files);
    let hot_blocks = ((total_blocks as f64 * args.hot_data_fraction) as u64).max(1);
    let phase = Phase::new(
        label,
        args.threads,
        Until::Elapsed(Duration::from_secs_f64(args.seconds)),
    )
    .interval(Duration::from_secs(1))
    .seed(args.seed)
    .progress(!args.json);
    runner::run_timed(&phase, |rng| {
        // The hot blocks are a contiguous stretch at the start of the
        // dataset's address space: whole records, a few files.
        let block = if rng.chance(args.hot_read_fraction) {
            rng.below(hot_blocks)
        } else {
            rng.below(total_blocks)
        };
        let file = (block / blocks_per_file) as u32;
        let offset = (block % blocks_per_file) * args.read_size;
        let mut buf = vec![0u8; read_size];
        let n = cache.read(&handles[file as usize], offset, &mut buf)?;
        if n != read_size || !spec.verify(file, offset, &buf) {
            bail!(
                "wrong bytes: file {file} offset {offset}: read {n} bytes that do not match the dataset"
            );
        }
        Ok(n as u64)
    })
}

fn print_report(r: &DemoReport) {
    print_setup(r);
    println!();
    print_phases(r);
    println!();
    print_ratios(r);
    print_warmup(r);
}

fn print_setup(r: &DemoReport) {
    println!(
        "l2arc bench: {} threads, random {} KiB reads, {:.0}% of them to {:.0}% of {} MiB; arc_max {} MiB, recordsize {} KiB",
        r.threads,
        r.read_size_bytes >> 10,
        100.0 * r.hot_read_fraction,
        100.0 * r.hot_data_fraction,
        r.dataset_bytes >> 20,
        r.arc_max_bytes >> 20,
        r.recordsize_bytes >> 10
    );
    println!("primary: {}", r.hdd);
    println!(
        "content: {} (LZ4 ratio {:.2}, sampled in {} KiB records); L2ARC: {}, compression {}",
        format!("{:?}", r.content).to_lowercase(),
        r.dataset_lz4_ratio,
        r.recordsize_bytes >> 10,
        if r.cache_device_bytes == 0 {
            "off".to_string()
        } else {
            format!("{} MiB cache file", r.cache_device_bytes >> 20)
        },
        r.compression
    );
}

fn print_phases(r: &DemoReport) {
    println!(
        "{:<10} {:>10} {:>10} {:>9} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9}",
        "setting",
        "IOPS",
        "warm IOPS",
        "MiB/s",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "ARC hit",
        "L2 hit",
        "L2 MiB"
    );
    for p in &r.phases {
        println!(
            "{:<10} {:>10.0} {:>10.0} {:>9.1} {:>10.0} {:>10.0} {:>10.0} {:>7.1}% {:>7.1}% {:>9}",
            p.setting,
            p.iops,
            p.warm_iops,
            p.mib_per_sec,
            p.latency_us_p50,
            p.latency_us_p99,
            p.latency_us_p999,
            100.0 * p.arc_hit_ratio,
            100.0 * p.l2_hit_ratio,
            p.l2_size_bytes >> 20
        );
    }
}

fn print_ratios(r: &DemoReport) {
    println!(
        "cache / no cache: {:.1}x IOPS over the run, {:.1}x once warm, {:.1}x lower median latency",
        r.iops_ratio, r.warm_iops_ratio, r.p50_latency_ratio
    );
    println!(
        "every byte checked: {} MiB read, all matching the dataset",
        r.bytes_verified >> 20
    );
    if let Some(p) = r.phases.last()
        && p.l2_asize_bytes > 0
    {
        println!(
            "L2ARC at the end: {} MiB of records in {} MiB of flash ({:.2}:1)",
            p.l2_size_bytes >> 20,
            p.l2_asize_bytes >> 20,
            p.l2_size_bytes as f64 / p.l2_asize_bytes as f64
        );
    }
}

/// Where the working set stands against the ARC and the L2ARC.
fn working_set_fit(r: &DemoReport) -> String {
    if r.cache_device_bytes == 0 {
        return "no L2ARC".to_string();
    }
    let working_set_bytes = r.warmup.working_set_bytes;
    format!(
        "{} arc_max {} MiB, {} the {} MiB L2ARC",
        if working_set_bytes > r.arc_max_bytes {
            "over"
        } else {
            "within"
        },
        r.arc_max_bytes >> 20,
        if working_set_bytes < r.cache_device_bytes {
            "within"
        } else {
            "over"
        },
        r.cache_device_bytes >> 20
    )
}

fn print_warmup(r: &DemoReport) {
    let w = &r.warmup;
    match w.secs_to_90pct {
        Some(secs) => {
            println!(
                "warm-up: 90% of the warm {:.0} IOPS after {secs:.0} s (working set {} MiB: {}){}",
                w.warm_iops,
                w.working_set_bytes >> 20,
                working_set_fit(r),
                if w.still_warming {
                    "; IOPS were still climbing at the end: run longer for the warm level"
                } else {
                    ""
                }
            );
            println!(
                "one pass over the working set from the HDD: {:.1} s in {} KiB records (mean service time), \
                 {:.0} s at the no-cache throughput; warm-up / one pass = {:.1}x and {:.2}x",
                w.one_pass_records_secs,
                r.recordsize_bytes >> 10,
                w.one_pass_no_cache_secs,
                secs / w.one_pass_records_secs,
                secs / w.one_pass_no_cache_secs,
            );
        }
        None => println!("warm-up: no interval reached 90% of the warm level"),
    }
    if let Some(p) = r.phases.last() {
        let curve: Vec<String> = p
            .intervals
            .iter()
            .map(|i| format!("{:.0}", i.iops))
            .collect();
        println!(
            "warm-up, IOPS per second with the cache: {}",
            curve.join(" ")
        );
    }
}

/// `--scenario demo`.
pub(crate) struct DemoScenario;

impl Scenario for DemoScenario {
    fn name(&self) -> &'static str {
        "demo"
    }
    fn measures(&self) -> &'static str {
        "Random reads from several threads over an emulated HDD: cache against no cache."
    }
    fn run(&self, args: &BenchArgs) -> Result<Outcome> {
        run(args)
    }
}
