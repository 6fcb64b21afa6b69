//! The warm L2ARC hit path against fio on the same cache file.
//!
//! An L2ARC hit is an index lookup, one O_DIRECT read of the record's blocks
//! from the cache device, a CRC-32C of them, and the ARC insert of the
//! result. The device read should be nearly all of it, so the baseline is the
//! device itself: fio reading the same blocks of the same cache file, with
//! the same request size, O_DIRECT, in the same run.
//!
//! Measurements are paired: each of ours runs right next to its fio
//! counterpart, in `--rounds` rounds (the order within a pair alternates
//! between rounds), and the report gives medians, with the ratio being the
//! median of the rounds' ratios: the machines this runs on are shared, and
//! a neighbour's burst lands on one measurement, not on the ratio.
//!
//! For each record size (4 KiB, then 8 KiB; `recordsize` = read size and
//! compression off, so one read is one device read of that size), a dataset
//! of three quarters of the cache file is read once through a small ARC
//! while the feeder writes every record to the L2ARC, which is then checked
//! to hold them all. Then, against the warm L2ARC:
//!
//! - ours at queue depth 1 (one thread) against fio `psync`, one job;
//! - ours at queue depth 32 as 32 threads, each a synchronous read at a
//!   time (`Cache::read`), against fio `psync` with 32 jobs (the same shape);
//! - ours at queue depth 32 as one thread with a read queue of depth 32
//!   (`Cache::read_queue`: flash read through io_uring) against fio
//!   `io_uring` at iodepth 32 (one thread, 32 reads in flight): the same
//!   shape again, and the device's best.
//!
//! A third measurement, `pread`, reads the same region with bare O_DIRECT
//! preads from our own threads and harness (a reused buffer per thread, no
//! cache): ours over it is what the cache's own work costs, and it over fio
//! is what our harness (and the moment) costs, so a shortfall against fio can
//! be told apart from noise.
//!
//! fio reads exactly the region the records were written to (the cache file
//! is sparse beyond it, and a hole reads as zeros without touching the disk).
//! With `--queue-only`, a round is the read-queue phase and fio io_uring
//! alone, so that many pairs of the shape that matters most on flash run
//! back to back with nothing between them (21 rounds take ~2.5 minutes per
//! record size): the tool for judging a change to the read queue.
//!
//! Each of our reads checks the first and last word of the record against
//! the generator (the fill pass checked every byte, and every L2ARC read is
//! checked by its CRC); the ARC and L2ARC hit ratios of each measured phase
//! are reported, and the run fails if fewer than 95% of reads were L2 hits.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use l2arc::internals::AlignedBuf;
use l2arc::internals::format::{Compression, DATA_START_BYTES};
use l2arc::primary::Primary;
use l2arc::primary::dir::DirPrimary;
use l2arc::{Cache, CacheConfig, DatasetConfig, ObjectHandle, ReadCompletion, ReadQueue};
use l2arc::{DeviceIo, FileDevice};
use l2arc::{DeviceOpen, L2ArcConfig};
use serde::Serialize;

use crate::BenchArgs;

use super::{Goal, Headline, Outcome, Scenario};
use crate::dataset::DatasetSpec;
use crate::fio::{FioJob, FioRead, FioTarget};
use crate::runner::{self, Phase, PhaseResult, Until, Worker};

const RECORD_SIZES: [u64; 2] = [4 << 10, 8 << 10];
const QUEUE_DEPTH: usize = 32;
/// Longest measured phase (each of ours and each fio run).
const PHASE_SECS_MAX: f64 = 3.0;

#[derive(Clone, Debug, Serialize)]
struct Side {
    iops: f64,
    mib_per_sec: f64,
    latency_us_p50: f64,
    latency_us_p99: f64,
    /// CPU time (user + system) per read, microseconds (0: not measured).
    cpu_us_per_read: f64,
}

#[derive(Clone, Debug, Serialize)]
struct Ours {
    #[serde(flatten)]
    side: Side,
    arc_hit_ratio: f64,
    l2_hit_ratio: f64,
    primary_reads: u64,
}

/// One round's measurements of one row, taken back to back.
#[derive(Clone, Debug)]
struct Trio {
    ours: Ours,
    /// None with `--queue-only` (no bare preads are measured).
    pread: Option<Side>,
    fio: Side,
}

#[derive(Clone, Debug, Serialize)]
struct Row {
    /// Which of ours against which fio job (the table's headline).
    #[serde(skip)]
    shape: Shape,
    record_bytes: u64,
    queue_depth: usize,
    ours: Ours,
    /// Bare O_DIRECT preads of the same blocks from our own threads and
    /// harness: the device as our code sees it, without the cache (None
    /// with `--queue-only`).
    pread: Option<Side>,
    fio_job: String,
    fio: Side,
    /// Our IOPS over fio's: the median of the rounds' ratios, and their range.
    ratio: f64,
    ratio_min: f64,
    ratio_max: f64,
    /// Our IOPS over the bare preads' (median of the rounds): what the
    /// cache's own work costs.
    ours_over_pread: Option<f64>,
    /// Each round's figures, in the order measured (its ratio is
    /// [`RoundFigures::ratio`]).
    round_figures: Vec<RoundFigures>,
    rounds: usize,
}

/// One round's IOPS and CPU per read of both sides: whether a low ratio
/// came with a slow device (fio's IOPS down too) or with our CPU per read.
#[derive(Clone, Debug, Serialize)]
struct RoundFigures {
    ours_iops: f64,
    fio_iops: f64,
    ours_cpu_us_per_read: f64,
    fio_cpu_us_per_read: f64,
}

impl RoundFigures {
    /// The round's ours/fio.
    fn ratio(&self) -> f64 {
        self.ours_iops / self.fio_iops
    }
}

#[derive(Serialize)]
struct Report {
    machine: Machine,
    cache_file: String,
    cache_file_bytes: u64,
    arc_max_bytes: u64,
    phase_secs: f64,
    rounds: usize,
    fio_version: String,
    records_written: Vec<(u64, u64)>,
    rows: Vec<Row>,
    /// Per record size: fio io_uring at iodepth 32 over fio psync with 32
    /// jobs (empty with `--queue-only`).
    io_uring_over_psync: Vec<(u64, f64)>,
    queue_only: bool,
}

#[derive(Serialize)]
pub(crate) struct Machine {
    pub cpus: usize,
    pub ram_gib: f64,
    pub kernel: String,
    pub fs: String,
}

/// The machine, for reports: CPUs, RAM, kernel, and the file system of `dir`.
pub(crate) fn machine(dir: &Path) -> Machine {
    let ram_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "unknown".into(), |s| s.trim().to_string());
    let (fs, source) = file_system(dir).unwrap_or_else(|| ("unknown".into(), String::new()));
    Machine {
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        ram_gib: ram_kib as f64 / (1 << 20) as f64,
        kernel,
        fs: if source.is_empty() || source == fs {
            fs
        } else {
            format!("{fs} on {source}")
        },
    }
}

/// The type and source of the file system holding `dir` (longest matching
/// mount point in /proc/self/mounts).
fn file_system(dir: &Path) -> Option<(String, String)> {
    // The nearest ancestor that exists (the directory may not yet).
    let dir = dir.ancestors().find_map(|d| d.canonicalize().ok())?;
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (source, point, fs) = (fields.next()?, fields.next()?, fields.next()?);
            let point = point.replace("\\040", " ");
            dir.starts_with(&point)
                .then(|| (point.len(), fs.to_string(), source.to_string()))
        })
        .max_by_key(|(len, _, _)| *len)
        .map(|(_, fs, source)| (fs, source))
}

impl From<FioRead> for Side {
    fn from(read: FioRead) -> Self {
        Side {
            iops: read.iops,
            mib_per_sec: read.mib_per_sec,
            latency_us_p50: read.latency_us_p50,
            latency_us_p99: read.latency_us_p99,
            cpu_us_per_read: read.cpu_us_per_read,
        }
    }
}

pub(crate) fn run(args: &BenchArgs) -> Result<Outcome> {
    let fio_version = crate::fio::version()?;
    let place = Place::prepare(args)?;
    let mut rows = Vec::new();
    let mut records_written = Vec::new();
    let mut io_uring_over_psync = Vec::new();
    for record_bytes in RECORD_SIZES {
        let measured = measure_record_size(args, &place, record_bytes)?;
        rows.extend(measured.rows);
        records_written.push((record_bytes, measured.records));
        if let Some(ratio) = measured.io_uring_over_psync {
            io_uring_over_psync.push((record_bytes, ratio));
        }
    }
    if place.owned_cache_file {
        let _ = std::fs::remove_file(&place.cache_path);
    }
    let report = Report {
        cache_file: place.cache_path.display().to_string(),
        machine: place.machine,
        cache_file_bytes: args.cache_size,
        arc_max_bytes: args.arc_max,
        phase_secs: place.secs,
        rounds: args.rounds,
        fio_version,
        records_written,
        rows,
        io_uring_over_psync,
        queue_only: args.queue_only,
    };
    let headline = report.rows.iter().map(headline).collect();
    Outcome::new(report, headline, print_report)
}

/// A row's ratio to its fio job, with each round's.
fn headline(row: &Row) -> Headline {
    let kib = row.record_bytes >> 10;
    let (key, what, baseline, goal) = match row.shape {
        Shape::Blocking1 => (
            "qd1",
            "QD1, one thread of Cache::read",
            "fio psync, 1 job",
            Goal::ratio_at_least(0.95),
        ),
        Shape::Blocking32 => (
            "qd32_threads",
            "QD32, 32 threads of Cache::read",
            "fio psync, 32 jobs",
            None,
        ),
        Shape::Queue32 => (
            "qd32_queue",
            "QD32, one thread's read queue (io_uring)",
            "fio io_uring QD32",
            Goal::ratio_at_least(0.95),
        ),
        Shape::Queue32Checked => (
            "qd32_queue_crc",
            "QD32, read queue, against a checking fio",
            "fio io_uring QD32 checking crc32c",
            None,
        ),
    };
    Headline::versus(
        &format!("{key}_{kib}k"),
        &format!("L2ARC hit, random {kib} KiB, {what}"),
        "IOPS",
        (
            row.ours.side.iops,
            &format!("{baseline}, same file"),
            row.fio.iops,
        ),
        goal,
    )
    .ratio_is(row.ratio, "ours / baseline")
    .rounds(row.round_figures.iter().map(RoundFigures::ratio).collect())
}

/// Where the scenario works: the dataset's directory, the cache file, the
/// machine, and how long each measurement runs.
struct Place {
    dir: PathBuf,
    /// The temporary directory `dir` is, without `--data` (removed on drop).
    _temp: Option<tempfile::TempDir>,
    cache_path: PathBuf,
    /// The cache file is ours to remove (no `--cache`).
    owned_cache_file: bool,
    machine: Machine,
    spec: DatasetSpec,
    secs: f64,
}

impl Place {
    /// Checks that the cache file is on a disk and writes the dataset.
    fn prepare(args: &BenchArgs) -> Result<Self> {
        if args.cache.len() > 1 {
            bail!(
                "--scenario l2-hit uses one cache file (--cache given {} times)",
                args.cache.len()
            );
        }
        let (dir, temp) = match &args.data {
            Some(dir) => (dir.clone(), None),
            None => {
                let temp = tempfile::tempdir().context("cannot make a temporary directory")?;
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        let (cache_path, owned_cache_file) = match args.cache.first() {
            Some(path) => (path.clone(), false),
            None => (dir.join("l2arc-hit-cache.img"), true),
        };
        let machine = machine(cache_path.parent().unwrap_or(&dir));
        if machine.fs.starts_with("tmpfs") || machine.fs.starts_with("ramfs") {
            bail!(
                "the cache file {} would be on {}: that is RAM, not a disk; give --data DIR (or \
                 --cache FILE) on the disk to measure",
                cache_path.display(),
                machine.fs
            );
        }
        if !dir.is_dir() {
            std::fs::create_dir(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let spec = dataset_spec(args)?;
        spec.materialise(&dir)?;
        if !args.json {
            eprintln!(
                "dataset: {} files x {} MiB in {}; cache file {} ({} MiB)",
                spec.files,
                spec.file_size_bytes >> 20,
                dir.display(),
                cache_path.display(),
                args.cache_size >> 20
            );
        }
        Ok(Self {
            dir,
            _temp: temp,
            cache_path,
            owned_cache_file,
            machine,
            spec,
            secs: args.seconds.min(PHASE_SECS_MAX),
        })
    }
}

/// The dataset: three quarters of the cache file's data area (the log
/// never wraps during the fill), in whole 64 KiB per file.
fn dataset_spec(args: &BenchArgs) -> Result<DatasetSpec> {
    let data_area = args.cache_size.saturating_sub(DATA_START_BYTES);
    let per_file = (data_area * 3 / 4 / u64::from(args.files)) / (64 << 10) * (64 << 10);
    if per_file < 64 << 10 {
        bail!(
            "--cache-size {} is too small for this benchmark",
            args.cache_size
        );
    }
    Ok(DatasetSpec {
        files: args.files,
        file_size_bytes: per_file,
        seed: args.seed,
        content: crate::dataset::Content::Random,
    })
}

/// What one record size contributes to the report.
struct RecordSizeResult {
    rows: Vec<Row>,
    records: u64,
    io_uring_over_psync: Option<f64>,
}

/// One record size: a fresh cache filled until its L2ARC holds every
/// record, then `--rounds` rounds of paired measurements.
fn measure_record_size(
    args: &BenchArgs,
    place: &Place,
    record_bytes: u64,
) -> Result<RecordSizeResult> {
    if place.owned_cache_file {
        let _ = std::fs::remove_file(&place.cache_path);
    }
    let (cache, handles) = open_cache(args, place, record_bytes)?;
    let records = fill(args, &place.spec, &cache, &handles, record_bytes)?;
    let written = cache
        .l2arc()
        .context("no L2ARC")?
        .stats()
        .get("l2_write_bytes");
    if !args.json {
        eprintln!(
            "{} KiB records: {records} in the L2ARC, {} MiB of the cache file written",
            record_bytes >> 10,
            written >> 20
        );
    }
    let warm = WarmL2 {
        json: args.json,
        spec: &place.spec,
        cache: &cache,
        handles: &handles,
        device: FileDevice::open(&place.cache_path, None)?,
        region: (DATA_START_BYTES, written),
        record_bytes,
        secs: place.secs,
    };
    let queue_only = args.queue_only;
    let verifiable = place
        .dir
        .join(format!("l2hit-verifiable-{}k.img", record_bytes >> 10));
    if !queue_only {
        crate::fio::write_verifiable(&verifiable, written, record_bytes)?;
    }
    let jobs = fio_jobs(place, record_bytes, written, &verifiable, queue_only);
    // rounds[round][job]
    let rounds = (0..args.rounds)
        .map(|round| warm.round(&jobs, round, args.seed))
        .collect::<Result<Vec<_>>>();
    let _ = std::fs::remove_file(&verifiable);
    let rounds = rounds?;
    let rows = jobs
        .iter()
        .enumerate()
        .map(|(i, (shape, job))| {
            let trios: Vec<&Trio> = rounds.iter().map(|r| &r[i]).collect();
            summarise(record_bytes, *shape, job.describe(), &trios)
        })
        .collect();
    let column = |wanted: Shape| jobs.iter().position(|(shape, _)| *shape == wanted);
    let io_uring_over_psync = match (column(Shape::Queue32), column(Shape::Blocking32)) {
        (Some(uring), Some(psync)) => Some(median(
            &rounds
                .iter()
                .map(|r| r[uring].fio.iops / r[psync].fio.iops)
                .collect::<Vec<_>>(),
        )),
        _ => None,
    };
    Ok(RecordSizeResult {
        rows,
        records,
        io_uring_over_psync,
    })
}

/// A cache over the dataset with `record_bytes` records and the cache file
/// as its L2ARC, and the dataset's files opened.
fn open_cache(
    args: &BenchArgs,
    place: &Place,
    record_bytes: u64,
) -> Result<(Arc<Cache>, Vec<ObjectHandle>)> {
    let mut config = CacheConfig::default()
        .arc_max_bytes(args.arc_max)
        // The fill feeds the L2ARC itself, between its reads: a feed in
        // the background holds references to every record it scans, so
        // an insert meanwhile can find nothing to evict and the record is
        // never cached (`insert_no_room`). The feeder thread's first pass
        // finds an empty ARC; then it sleeps for an hour.
        .l2arc(
            L2ArcConfig::default()
                .l2arc_rebuild_enabled(false)
                .l2arc_feed_secs(3600.0)
                .l2arc_feed_min_ms(3_600_000)
                .l2arc_feed_again(false),
        );
    if let Some(shards) = args.arc_shards {
        config.arc_shards = shards;
    }
    let cache = Cache::new(config)?;
    let primary: Arc<dyn Primary> = Arc::new(DirPrimary::new(&place.dir)?);
    let dataset = cache.add_dataset(
        "l2hit",
        primary,
        DatasetConfig::default()
            .recordsize_bytes(record_bytes as u32)
            .compression(Compression::Off),
    )?;
    let device = FileDevice::open(&place.cache_path, Some(args.cache_size))?;
    if !device.is_direct() {
        bail!(
            "the cache file {} refuses O_DIRECT: the comparison with fio --direct=1 would be meaningless",
            place.cache_path.display()
        );
    }
    let (_, open) = cache.add_cache_device(Box::new(device))?;
    debug_assert_ne!(open, DeviceOpen::Rebuilding);
    std::thread::sleep(Duration::from_millis(100));
    let handles = (0..place.spec.files)
        .map(|f| cache.open(dataset, &DatasetSpec::file_name(f), false))
        .collect::<std::io::Result<_>>()?;
    Ok((cache, handles))
}

/// What one row of the report measures: ours in one shape, against the
/// fio job of the same shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// One thread of blocking reads, against fio psync with one job.
    Blocking1,
    /// 32 threads of blocking reads, against fio psync with 32 jobs.
    Blocking32,
    /// One thread with a read queue of depth 32, against fio's one thread
    /// with an io_uring of depth 32.
    Queue32,
    /// The same read-queue phase, against fio io_uring at depth 32 checking
    /// a CRC-32C of every block it reads.
    Queue32Checked,
}

impl Shape {
    fn queue_depth(self) -> usize {
        match self {
            Shape::Blocking1 => 1,
            Shape::Blocking32 | Shape::Queue32 | Shape::Queue32Checked => QUEUE_DEPTH,
        }
    }
}

/// The fio jobs of a record size, one per row: QD1 psync, QD32 psync,
/// QD32 io_uring on the cache file, and QD32 io_uring checking a CRC-32C
/// of every block it reads from `verifiable` (a file of the same size fio
/// wrote with its verify headers): a reader that, as the cache does,
/// trusts no byte it has not checked. With `queue_only`, the QD32
/// io_uring row alone.
fn fio_jobs(
    place: &Place,
    record_bytes: u64,
    written: u64,
    verifiable: &Path,
    queue_only: bool,
) -> Vec<(Shape, FioJob)> {
    let fio = |engine: &'static str, iodepth: usize, jobs: usize| {
        FioJob::new(
            "l2hit",
            engine,
            FioTarget::Files(vec![place.cache_path.clone()]),
            "randread",
            record_bytes,
            place.secs.ceil().max(1.0) as u64,
        )
        .readonly()
        .direct(true)
        .offset_bytes(DATA_START_BYTES)
        .size_bytes(written)
        .iodepth(iodepth)
        .numjobs(jobs)
        .threads()
    };
    let uring = (Shape::Queue32, fio("io_uring", QUEUE_DEPTH, 1));
    if queue_only {
        return vec![uring];
    }
    let checking = FioJob::new(
        "l2hit-verify",
        "io_uring",
        FioTarget::Files(vec![verifiable.to_path_buf()]),
        "randread",
        record_bytes,
        place.secs.ceil().max(1.0) as u64,
    )
    .readonly()
    .direct(true)
    .size_bytes(written)
    .iodepth(QUEUE_DEPTH)
    .verify_crc32c();
    vec![
        (Shape::Blocking1, fio("psync", 1, 1)),
        (Shape::Blocking32, fio("psync", 1, QUEUE_DEPTH)),
        uring,
        (Shape::Queue32Checked, checking),
    ]
}

/// A warm L2ARC at one record size, and what is measured against it.
struct WarmL2<'a> {
    json: bool,
    spec: &'a DatasetSpec,
    cache: &'a Cache,
    handles: &'a [ObjectHandle],
    /// The cache file, for the bare preads.
    device: FileDevice,
    /// The part of the cache file the records were written to (offset, length).
    region: (u64, u64),
    record_bytes: u64,
    secs: f64,
}

impl WarmL2<'_> {
    /// One round: each fio job paired with ours and the bare preads at its
    /// queue depth, the order within a pair reversed every other round.
    /// The bare preads at QD32 are measured once a round (beside the
    /// blocking readers) and the read-queue phase once (beside plain fio
    /// io_uring), each paired with every fio job of its shape.
    fn round(&self, jobs: &[(Shape, FioJob)], round: usize, seed: u64) -> Result<Vec<Trio>> {
        let reverse = round % 2 == 1;
        // A fresh random sequence for every phase (as fio's randrepeat=0),
        // so that no phase replays records another read.
        let seed_for = |qd: usize, salt: u64| {
            seed ^ l2arc::hash::mix64(
                (self.record_bytes << 20) ^ ((round as u64) << 8) ^ qd as u64 ^ salt,
            )
        };
        let fio = |job: &FioJob| job.run(None).map(Side::from);
        let mut trios: Vec<Trio> = Vec::new();
        let mut pread_qd32: Option<Side> = None;
        let mut queue_phase: Option<Ours> = None;
        for (shape, job) in jobs {
            let qd = shape.queue_depth();
            let trio = match shape {
                Shape::Queue32Checked => Trio {
                    ours: queue_phase
                        .clone()
                        .context("the read-queue phase comes first")?,
                    pread: pread_qd32.clone(),
                    fio: fio(job)?,
                },
                Shape::Queue32 => {
                    let queue = || self.measure_queue(qd, seed_for(qd, 1 << 41));
                    let (ours, fio) = if reverse {
                        let fio = fio(job)?;
                        (queue()?, fio)
                    } else {
                        (queue()?, fio(job)?)
                    };
                    queue_phase = Some(ours.clone());
                    Trio {
                        ours,
                        pread: pread_qd32.clone(),
                        fio,
                    }
                }
                Shape::Blocking1 | Shape::Blocking32 => {
                    let pread = || self.measure_pread(qd, seed_for(qd, 1 << 40));
                    let ours = || self.measure(qd, seed_for(qd, 0));
                    let (ours, pread, fio) = if reverse {
                        let fio = fio(job)?;
                        let pread = pread()?;
                        (ours()?, pread, fio)
                    } else {
                        let ours = ours()?;
                        (ours, pread()?, fio(job)?)
                    };
                    if *shape == Shape::Blocking32 {
                        pread_qd32 = Some(pread.clone());
                    }
                    Trio {
                        ours,
                        pread: Some(pread),
                        fio,
                    }
                }
            };
            trios.push(trio);
        }
        Ok(trios)
    }

    fn records(&self) -> (u64, u64) {
        let per_file = self.spec.file_size_bytes / self.record_bytes;
        (per_file, per_file * u64::from(self.spec.files))
    }

    fn phase<'l>(&self, label: &'l str, threads: usize, seed: u64) -> Phase<'l> {
        Phase::new(
            label,
            threads,
            Until::Elapsed(Duration::from_secs_f64(self.secs)),
        )
        .seed(seed)
    }

    /// Random reads of whole records from `threads` threads against the
    /// warm L2ARC; the ARC and L2ARC hit ratios are those of this phase alone.
    fn measure(&self, threads: usize, seed: u64) -> Result<Ours> {
        let record_bytes = self.record_bytes;
        let (per_file, total) = self.records();
        let before = self.cache.stats();
        let label = format!("ours {}K QD{threads}", record_bytes >> 10);
        let result = runner::run(
            &self.phase(&label, threads, seed).progress(!self.json),
            &mut (),
            |_| Ok(AlignedBuf::zeroed(record_bytes as usize)),
            |out, worker| {
                worker.timed(|rng| {
                    let r = rng.below(total);
                    let (file, offset) = ((r / per_file) as u32, (r % per_file) * record_bytes);
                    let n = self.cache.read(
                        &self.handles[file as usize],
                        offset,
                        out.as_mut_slice(),
                    )?;
                    check_record(self.spec, file, offset, record_bytes, &out[..n])?;
                    Ok(n as u64)
                })
            },
        )?;
        self.ours(&before, &result)
    }

    /// Our figures of a measured phase that began at `before`.
    fn ours(&self, before: &l2arc::CacheStats, result: &PhaseResult) -> Result<Ours> {
        let after = self.cache.stats();
        let (arc_hit_ratio, l2_hit_ratio) = warm_hit_ratios(before, &after)?;
        Ok(Ours {
            side: Side {
                iops: result.iops(),
                mib_per_sec: result.mib_per_sec(),
                latency_us_p50: result.latency_us(0.5),
                latency_us_p99: result.latency_us(0.99),
                cpu_us_per_read: 0.0,
            },
            arc_hit_ratio,
            l2_hit_ratio,
            primary_reads: after.primary_reads - before.primary_reads,
        })
    }

    /// Bare O_DIRECT preads of whole records at random in the written
    /// region of the cache file, from `threads` threads of our own harness,
    /// each into its own reused buffer.
    fn measure_pread(&self, threads: usize, seed: u64) -> Result<Side> {
        let (record_bytes, region) = (self.record_bytes, self.region);
        let blocks = (region.1 / record_bytes).max(1);
        let label = format!("pread {}K QD{threads}", record_bytes >> 10);
        let result = runner::run(
            &self.phase(&label, threads, seed).progress(!self.json),
            &mut (),
            |_| Ok(AlignedBuf::zeroed(record_bytes as usize)),
            |out, worker| {
                worker.timed(|rng| {
                    let offset = region.0 + rng.below(blocks) * record_bytes;
                    self.device.read_at(offset, out.as_mut_slice())?;
                    Ok(record_bytes)
                })
            },
        )?;
        Ok(Side {
            iops: result.iops(),
            mib_per_sec: result.mib_per_sec(),
            latency_us_p50: result.latency_us(0.5),
            latency_us_p99: result.latency_us(0.99),
            cpu_us_per_read: 0.0,
        })
    }

    /// Random reads of whole records from one thread with a read queue
    /// (the engine's many-in-flight API, flash read through io_uring) of
    /// `depth`, as fio's one thread with an io_uring of that depth; latency
    /// is from submit to completion. The queue fills for a quarter of the
    /// phase (at most a quarter second) before anything is counted.
    ///
    /// One thread, not one per core: measured side by side (2026-11-24),
    /// two threads of 16 each reached 0.85-0.91x of fio at 4 KiB where one
    /// of 32 reached 0.98-1.18x; the second thread's finishing work (a CRC,
    /// an ARC insert) competes with the device's completions for the cores
    /// and the ARC's locks, and gains nothing the first lacks.
    fn measure_queue(&self, depth: usize, seed: u64) -> Result<Ours> {
        let phase = self
            .phase("queue", 1, seed)
            .warmup(Duration::from_secs_f64(self.secs.min(1.0) / 4.0));
        let mut watch = StatsAtStart {
            cache: self.cache,
            before: None,
        };
        let result = runner::run(
            &phase,
            &mut watch,
            |_| QueueReader::new(self.cache, depth),
            |queue, worker| queue.step(self, worker),
        )?;
        let before = watch.before.context("the measured phase never started")?;
        let mut ours = self.ours(&before, &result)?;
        ours.side.cpu_us_per_read = result.cpu_secs * 1e6 / result.ops.max(1) as f64;
        Ok(ours)
    }
}

pub(crate) fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Medians over the rounds: of each figure, and of the per-round ratios
/// (each ours/fio pair was measured back to back, so its ratio is the least
/// disturbed by whatever else the machine was doing).
fn summarise(record_bytes: u64, shape: Shape, fio_job: String, trios: &[&Trio]) -> Row {
    let med = |f: &dyn Fn(&Trio) -> f64| median(&trios.iter().map(|t| f(t)).collect::<Vec<_>>());
    let side = |sides: &[&Side]| {
        let med = |f: fn(&Side) -> f64| median(&sides.iter().map(|s| f(s)).collect::<Vec<_>>());
        Side {
            iops: med(|s| s.iops),
            mib_per_sec: med(|s| s.mib_per_sec),
            latency_us_p50: med(|s| s.latency_us_p50),
            latency_us_p99: med(|s| s.latency_us_p99),
            cpu_us_per_read: med(|s| s.cpu_us_per_read),
        }
    };
    let ours: Vec<&Side> = trios.iter().map(|t| &t.ours.side).collect();
    let fio: Vec<&Side> = trios.iter().map(|t| &t.fio).collect();
    // Every round's bare preads, or none (`--queue-only`).
    let preads: Option<Vec<&Side>> = trios.iter().map(|t| t.pread.as_ref()).collect();
    let over = |a: &[&Side], b: &[&Side]| -> Vec<f64> {
        a.iter().zip(b).map(|(a, b)| a.iops / b.iops).collect()
    };
    let ratios = over(&ours, &fio);
    Row {
        shape,
        record_bytes,
        queue_depth: shape.queue_depth(),
        ours: Ours {
            side: side(&ours),
            arc_hit_ratio: med(&|t| t.ours.arc_hit_ratio),
            l2_hit_ratio: med(&|t| t.ours.l2_hit_ratio),
            primary_reads: trios.iter().map(|t| t.ours.primary_reads).sum(),
        },
        pread: preads.as_deref().map(side),
        fio_job,
        fio: side(&fio),
        ratio: median(&ratios),
        ratio_min: ratios.iter().copied().fold(f64::INFINITY, f64::min),
        ratio_max: ratios.iter().copied().fold(0.0, f64::max),
        ours_over_pread: preads.map(|p| median(&over(&ours, &p))),
        round_figures: trios
            .iter()
            .map(|t| RoundFigures {
                ours_iops: t.ours.side.iops,
                fio_iops: t.fio.iops,
                ours_cpu_us_per_read: t.ours.side.cpu_us_per_read,
                fio_cpu_us_per_read: t.fio.cpu_us_per_read,
            })
            .collect(),
        rounds: trios.len(),
    }
}

/// Reads every record once through the ARC, feeding the L2ARC as it goes
/// (half an ARC at a time, so nothing falls out before it is written), and
/// checks every byte. Returns the records the L2ARC then holds (all of them,
/// or an error).
fn fill(
    args: &BenchArgs,
    spec: &DatasetSpec,
    cache: &Cache,
    handles: &[ObjectHandle],
    record_bytes: u64,
) -> Result<u64> {
    let per_file = spec.file_size_bytes / record_bytes;
    let total = per_file * u64::from(spec.files);
    let chunk = (args.arc_max / 2 / record_bytes).max(1);
    let mut buf = AlignedBuf::zeroed(record_bytes as usize);
    let feed = || {
        while cache.feed_l2arc().records > 0 {}
    };
    for r in 0..total {
        let (file, offset) = ((r / per_file) as u32, (r % per_file) * record_bytes);
        let n = cache.read(&handles[file as usize], offset, buf.as_mut_slice())?;
        if n as u64 != record_bytes || !spec.verify(file, offset, &buf) {
            bail!("wrong bytes while filling: file {file} offset {offset}");
        }
        if (r + 1) % chunk == 0 {
            feed();
        }
    }
    feed();
    let l2 = cache.l2arc().context("no L2ARC")?;
    let held = l2.len() as u64;
    if held < total {
        bail!(
            "the L2ARC holds {held} of {total} records after the fill: the cache file is too \
             small or the feeder fell behind"
        );
    }
    Ok(held)
}

/// The ARC hit ratio and the L2 hit ratio (hits over the ARC's misses) of
/// a measured phase; an error unless at least 95% of the ARC's misses were
/// L2 hits (otherwise the phase did not measure the warm L2ARC hit path).
fn warm_hit_ratios(before: &l2arc::CacheStats, after: &l2arc::CacheStats) -> Result<(f64, f64)> {
    let arc_hits = after.arc.hits - before.arc.hits;
    let arc_lookups =
        arc_hits + (after.arc.misses - before.arc.misses) + (after.arc.iohits - before.arc.iohits);
    let l2 = |s: &l2arc::CacheStats, name| s.l2.as_ref().map_or(0, |l2| l2.get(name));
    let l2_hits = l2(after, "l2_hits") - l2(before, "l2_hits");
    let l2_lookups = l2_hits + l2(after, "l2_misses") - l2(before, "l2_misses");
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let l2_hit_ratio = ratio(l2_hits, l2_lookups);
    if l2_hit_ratio < 0.95 {
        bail!(
            "only {:.1}% of the ARC's misses were L2ARC hits: this is not the warm L2ARC hit path",
            100.0 * l2_hit_ratio
        );
    }
    Ok((ratio(arc_hits, arc_lookups), l2_hit_ratio))
}

/// Takes the cache's statistics when the measured part of a phase begins.
struct StatsAtStart<'a> {
    cache: &'a Cache,
    before: Option<l2arc::CacheStats>,
}

impl runner::Watch for StatsAtStart<'_> {
    fn started(&mut self) {
        self.before = Some(self.cache.stats());
    }
}

/// One thread of `measure_queue`: a read queue kept full, and what each of
/// its tags is reading.
struct QueueReader<'c> {
    queue: ReadQueue<'c>,
    /// Per tag: when it was submitted, and which record it reads.
    started: Vec<(Instant, u32, u64)>,
    free: Vec<u64>,
    done: Vec<ReadCompletion>,
}

impl<'c> QueueReader<'c> {
    fn new(cache: &'c Cache, depth: usize) -> Result<Self> {
        let queue = cache.read_queue(depth)?;
        if queue.ioengine() != l2arc::IoEngine::IoUring {
            bail!(
                "the read queue reads flash with {} here, not io_uring ({})",
                queue.ioengine().name(),
                cache.ioengine_fallback_reason().unwrap_or("forced")
            );
        }
        Ok(Self {
            queue,
            started: vec![(Instant::now(), 0u32, 0u64); depth],
            free: (0..depth as u64).collect(),
            done: Vec::with_capacity(depth),
        })
    }

    /// Fills the queue with random records, waits for at least one
    /// completion, checks and records every completion.
    fn step(&mut self, warm: &WarmL2, worker: &mut Worker) -> Result<()> {
        let (spec, handles, record_bytes) = (warm.spec, warm.handles, warm.record_bytes);
        let (per_file, total) = warm.records();
        while let Some(tag) = self.free.pop() {
            let r = worker.rng.below(total);
            let (file, offset) = ((r / per_file) as u32, (r % per_file) * record_bytes);
            self.started[tag as usize] = (Instant::now(), file, offset);
            self.queue
                .submit(&handles[file as usize], offset, record_bytes as usize, tag)?;
        }
        self.queue.wait(1, &mut self.done)?;
        let now = Instant::now();
        for completion in self.done.drain(..) {
            let (at, file, offset) = self.started[completion.tag as usize];
            let view = completion.result?;
            let bytes = view
                .as_single_slice()
                .context("a whole-record read spans one record")?;
            check_record(spec, file, offset, record_bytes, bytes)?;
            worker.record(at, now, record_bytes);
            self.free.push(completion.tag);
        }
        Ok(())
    }
}

impl Drop for QueueReader<'_> {
    /// Drains what is still in flight (not counted).
    fn drop(&mut self) {
        while self.queue.pending() > 0 {
            if self
                .queue
                .wait(self.queue.pending(), &mut self.done)
                .is_err()
            {
                return;
            }
            self.done.clear();
        }
    }
}

/// Checks the first and last word of a whole record read at `offset`.
fn check_record(
    spec: &DatasetSpec,
    file: u32,
    offset: u64,
    record_bytes: u64,
    bytes: &[u8],
) -> Result<()> {
    let last = (offset + record_bytes) / 8 - 1;
    if bytes.len() as u64 != record_bytes
        || bytes[..8] != spec.word(file, offset / 8).to_le_bytes()
        || bytes[bytes.len() - 8..] != spec.word(file, last).to_le_bytes()
    {
        bail!("wrong bytes: file {file} offset {offset}");
    }
    Ok(())
}

fn print_report(r: &Report) {
    print_setup(r);
    println!();
    print_rows(&r.rows);
    println!();
    print_notes(r);
    if r.rounds > 1 {
        print_round_ratios(&r.rows);
    }
}

fn print_setup(r: &Report) {
    let m = &r.machine;
    println!(
        "L2ARC hit path: random whole-record reads from a warm L2ARC, against fio on the same cache file (O_DIRECT)"
    );
    println!(
        "machine: {} CPUs, {:.1} GiB RAM, Linux {}, cache file on {}; {}",
        m.cpus, m.ram_gib, m.kernel, m.fs, r.fio_version
    );
    println!(
        "cache file {} MiB, arc_max {} MiB, recordsize = read size, compression off; \
         {:.0} s per measurement, medians of {} rounds",
        r.cache_file_bytes >> 20,
        r.arc_max_bytes >> 20,
        r.phase_secs,
        r.rounds
    );
}

fn print_rows(rows: &[Row]) {
    println!(
        "{:>6} {:>3} {:>9} {:>7} {:>7} {:>5} {:>6}  {:>9} {:>7}  {:<26} {:>9} {:>7} {:>7}  {:>8} {:>9}  {:>10}",
        "record",
        "QD",
        "ours IOPS",
        "p50 us",
        "p99 us",
        "ARC",
        "L2",
        "pread/s",
        "p50 us",
        "fio job",
        "fio IOPS",
        "p50 us",
        "p99 us",
        "ours/fio",
        "(rounds)",
        "ours/pread"
    );
    for row in rows {
        let (o, f) = (&row.ours, &row.fio);
        let (pread_iops, pread_p50) = row.pread.as_ref().map_or_else(
            || ("-".to_string(), "-".to_string()),
            |p| (format!("{:.0}", p.iops), format!("{:.1}", p.latency_us_p50)),
        );
        let ours_over_pread = row
            .ours_over_pread
            .map_or_else(|| "-".to_string(), |r| format!("{:.1}%", 100.0 * r));
        println!(
            "{:>4} K {:>3} {:>9.0} {:>7.1} {:>7.1} {:>4.1}% {:>5.1}%  {:>9} {:>7}  {:<26} {:>9.0} {:>7.1} {:>7.1}  {:>7.1}% {:>9}  {:>10}",
            row.record_bytes >> 10,
            row.queue_depth,
            o.side.iops,
            o.side.latency_us_p50,
            o.side.latency_us_p99,
            100.0 * o.arc_hit_ratio,
            100.0 * o.l2_hit_ratio,
            pread_iops,
            pread_p50,
            row.fio_job,
            f.iops,
            f.latency_us_p50,
            f.latency_us_p99,
            100.0 * row.ratio,
            format!("{:.0}-{:.0}%", 100.0 * row.ratio_min, 100.0 * row.ratio_max),
            ours_over_pread
        );
    }
}

/// Each round's ours/fio of the read-queue rows, in the order measured:
/// the spread the median was taken over; with each round's fio IOPS and
/// both sides' CPU per read, and the ratio split by the device's speed in
/// the round (fio at or above its median IOPS, or below): on a shared
/// machine the device's speed moves from round to round, and a low ratio
/// that comes only with a slow device is the machine, not the code.
fn print_round_ratios(rows: &[Row]) {
    for row in rows
        .iter()
        .filter(|row| row.ours.side.cpu_us_per_read > 0.0)
    {
        let line = |what: &str, values: Vec<String>| {
            println!(
                "{what} per round, {} KiB QD{} ({}): {}",
                row.record_bytes >> 10,
                row.queue_depth,
                row.fio_job,
                values.join(" ")
            );
        };
        let figures = &row.round_figures;
        line(
            "ours/fio",
            figures
                .iter()
                .map(|f| format!("{:.2}", f.ratio()))
                .collect(),
        );
        line(
            "fio k IOPS",
            figures
                .iter()
                .map(|f| format!("{:.0}", f.fio_iops / 1e3))
                .collect(),
        );
        line(
            "CPU us per read ours/fio",
            figures
                .iter()
                .map(|f| format!("{:.1}/{:.1}", f.ours_cpu_us_per_read, f.fio_cpu_us_per_read))
                .collect(),
        );
        let (fio_median, fast, slow) = ratios_by_device_speed(figures);
        let split = |half: RatioOverRounds| match half {
            Some((ratio, rounds)) => format!("{ratio:.2} ({rounds} rounds)"),
            None => "- (no rounds)".to_string(),
        };
        println!(
            "ours/fio by device speed, {} KiB QD{}: fio at or above its median {:.0}k IOPS {}, below it {}",
            row.record_bytes >> 10,
            row.queue_depth,
            fio_median / 1e3,
            split(fast),
            split(slow)
        );
    }
}

/// A median ours/fio and the count of rounds it is taken over (None: no
/// such round).
type RatioOverRounds = Option<(f64, usize)>;

/// fio's median IOPS over the rounds, and the median ours/fio (with the
/// count of rounds) of the rounds where fio was at or above it, and of
/// those where it was below (None: no such round).
fn ratios_by_device_speed(figures: &[RoundFigures]) -> (f64, RatioOverRounds, RatioOverRounds) {
    let fio_median = median(&figures.iter().map(|f| f.fio_iops).collect::<Vec<_>>());
    let (fast, slow): (Vec<&RoundFigures>, Vec<_>) =
        figures.iter().partition(|f| f.fio_iops >= fio_median);
    let summary = |rounds: Vec<&RoundFigures>| {
        let ratios: Vec<f64> = rounds.iter().map(|f| f.ratio()).collect();
        (!ratios.is_empty()).then(|| (median(&ratios), ratios.len()))
    };
    (fio_median, summary(fast), summary(slow))
}

/// What the columns mean, CPU per read, and whether io_uring pays here.
fn print_notes(r: &Report) {
    if r.queue_only {
        println!(
            "--queue-only: ours is one thread with a read queue of depth {QUEUE_DEPTH} (Cache::read_queue, flash read \
             through io_uring) against fio io_uring at iodepth {QUEUE_DEPTH}, nothing else measured between the pairs;"
        );
    } else {
        println!(
            "ours at QD{QUEUE_DEPTH} is {QUEUE_DEPTH} reader threads, each one synchronous read at a time (Cache::read), \
             against fio psync; against fio io_uring it is one thread with a read queue of depth {QUEUE_DEPTH} \
             (Cache::read_queue, flash read through io_uring);"
        );
    }
    println!(
        "ARC and L2 are the hit ratios of our measured phases (L2: hits over the ARC's misses);"
    );
    if !r.queue_only {
        println!(
            "pread is bare O_DIRECT preads of the same blocks from the same threads and harness, without the cache;"
        );
        println!(
            "+crc32c: fio reads a file of the same size it wrote with verify headers and checks a CRC-32C of every block \
             (--verify=crc32c --verify_only=1), as the cache checks every record it reads from flash; ours is the read-queue phase above it"
        );
    }
    for row in r
        .rows
        .iter()
        .filter(|row| row.ours.side.cpu_us_per_read > 0.0)
    {
        println!(
            "CPU per read, {} KiB QD{}: ours {:.1} us (read queues) vs fio {:.1} us ({})",
            row.record_bytes >> 10,
            row.queue_depth,
            row.ours.side.cpu_us_per_read,
            row.fio.cpu_us_per_read,
            row.fio_job
        );
    }
    for (record_bytes, ratio) in &r.io_uring_over_psync {
        println!(
            "fio at QD{QUEUE_DEPTH}, {} KiB: io_uring (1 thread, iodepth {QUEUE_DEPTH}) / psync ({QUEUE_DEPTH} threads) = {ratio:.2}x{}",
            record_bytes >> 10,
            if *ratio > 1.1 {
                ": io_uring would pay on this device"
            } else {
                ": within 10%, io_uring would not pay on this device"
            }
        );
    }
}

/// `--scenario l2-hit`.
pub(crate) struct L2Hit;

impl Scenario for L2Hit {
    fn name(&self) -> &'static str {
        "l2-hit"
    }
    fn measures(&self) -> &'static str {
        "Warm L2ARC hit path: random 4 KiB and 8 KiB reads at queue depth 1 and 32, against fio on the same cache file."
    }
    fn run(&self, args: &BenchArgs) -> Result<Outcome> {
        run(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(fio_iops: f64, ratio: f64) -> RoundFigures {
        RoundFigures {
            ours_iops: fio_iops * ratio,
            fio_iops,
            ours_cpu_us_per_read: 4.0,
            fio_cpu_us_per_read: 2.5,
        }
    }

    #[test]
    fn ratios_split_at_the_median_device_speed() {
        let rounds = [
            (100e3, 0.97),
            (80e3, 0.80),
            (105e3, 0.99),
            (85e3, 0.84),
            (95e3, 0.93),
        ];
        let figures: Vec<RoundFigures> = rounds.iter().map(|&(f, r)| round(f, r)).collect();
        let (fio_median, fast, slow) = ratios_by_device_speed(&figures);
        assert_eq!(fio_median, 95e3);
        // At or above 95k: 0.97, 0.99, 0.93; below: 0.80, 0.84.
        let (fast_ratio, fast_rounds) = fast.unwrap();
        assert!((fast_ratio - 0.97).abs() < 1e-9 && fast_rounds == 3);
        let (slow_ratio, slow_rounds) = slow.unwrap();
        assert!((slow_ratio - 0.82).abs() < 1e-9 && slow_rounds == 2);
    }

    #[test]
    fn one_round_is_all_fast() {
        let (fio_median, fast, slow) = ratios_by_device_speed(&[round(90e3, 0.9)]);
        assert_eq!(fio_median, 90e3);
        let (fast_ratio, fast_rounds) = fast.unwrap();
        assert!((fast_ratio - 0.9).abs() < 1e-9 && fast_rounds == 1);
        assert_eq!(slow, None);
    }
}
