//! The l2arc benchmarks (`l2arc-bench`, which `l2arc bench` runs): measured
//! figures, always side by side in one run.
//!
//! The machine this runs on is shared and noisy, so no benchmark reports an
//! absolute number alone: each one measures the cache and its baseline (no
//! cache, a plain locked hash map, fio on the same device, the page cache,
//! foyer, nbdkit) in the same run and reports the ratio.
//!
//! Why a crate of its own: the peers (foyer and its tokio runtime) and the
//! benchmark machinery (progress bars, histograms, report writers) are
//! heavy and are nobody's business but the benchmarks'. The engine and the
//! shipped `l2arc` binary do not link them; `l2arc bench` execs the
//! `l2arc-bench` binary installed beside it.
//!
//! Layout: `lib.rs` the flags and the dispatch; one module per scenario
//! (`demo`, `hit_path`, `l2_hit`, `l2_index`, `l2_rebuild`, `fuse`, `nbd`,
//! `throughput`, `latency`, `warmup`, `feed_capture`); the systems under
//! test behind one trait (`targets`, with `targets/ours.rs` and
//! `targets/peers.rs`); the one phase runner every timed phase goes
//! through (`runner`) and the verified reads through a target on top of it
//! (`workload`), the generated datasets (`dataset`), fio (`fio`) and the
//! report writers (`report`).

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};

mod dataset;
mod demo;
mod feed_capture;
mod fio;
mod fuse;
mod hit_path;
mod l2_hit;
mod l2_index;
mod l2_rebuild;
mod latency;
mod nbd;
mod nbd_client;
mod nbd_connections;
mod nbd_l2_hit;
mod nbd_reread;
mod nbd_warmup;

mod report;
mod runner;
mod s3;

mod targets;
mod throughput;
mod warmup;
mod workload;

/// A report page with one chart of each kind (bars, lines, heat map) over
/// fixed data, drawn by the shared chart code: what the browser test of the
/// reports opens.
#[doc(hidden)]
pub fn sample_report_html() -> String {
    report::sample_page()
}

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Random reads from several threads over an emulated HDD: cache against no cache.
    Demo,
    /// ARC hit path: 8 KiB hits per second, against a Mutex<HashMap> of the same buffers.
    ArcHit,
    /// Warm L2ARC hit path: random 4 KiB and 8 KiB reads at queue depth 1 and 32, against fio on the same cache file.
    L2Hit,
    /// DRAM per cached L2ARC record at 1 and 10 million records.
    L2Index,
    /// Index rebuild from a warm device: records restored per second.
    L2Rebuild,
    /// FUSE mount on hot files: fio through the mount vs the source in the page cache, and the daemon's hit path vs the uncached source.
    Fuse,
    /// NBD export: l2arc serve-nbd against nbdkit's cache filter over the same delayed image (needs fio, nbdkit).
    Nbd,
    /// Seed experiment 1: 50 threads of eight 128 KiB reads, datasets 0.5x to 3x the L2ARC: no_l2arc, l2arc, l2arc_lz4.
    Throughput,
    /// Seed experiment 2: 20 clients of random 8 KiB reads over a working set between ARC and L2ARC: cold vs warm.
    Latency,
    /// Seed experiment 3: random 4 KiB reads at queue depth 32: IOPS and L2ARC fill per interval.
    Warmup,
    /// The three seed experiments (throughput, latency, warmup) in one run.
    All,
    /// Feeder capture: an image read whole four times through an ARC an eighth its size; L2 hits per pass and the evict_l2_* counters, write-back vs intake wake vs timer.
    FeedCapture,
    /// Feeder capture over NBD: an image read whole four times with nbdcopy through `l2arc serve-nbd`, ARC an eighth of it; L2 hits per pass and the evict_l2_* counters (needs nbdcopy).
    NbdReread,
    /// NBD export warm from the L2ARC: random 4 KiB reads at queue depth 32 with fio's nbd engine, read queue vs workers only, against nbdkit's file plugin on the cache file (flash and page cache), with the servers' CPU per request (needs fio, nbdkit, nbdcopy).
    NbdL2Hit,
    /// Many clients on one export: 16 to 256 connections of fio's nbd engine at queue depth 1, random 4 KiB reads verified, IOPS, p99, slowest read and CPU per request per step, ours (ARC, L2ARC) against nbdkit's file plugin (needs fio, nbdkit, nbdcopy).
    NbdConnections,
    /// Warm-up through the NBD export: the seed workload (random 4 KiB, queue depth 32, 1 GiB on an emulated 4-spindle HDD) from an empty cache; seconds to 90% of the warm rate against one pass over the image from the disks (needs fio).
    NbdWarmup,
    /// Object storage: l2arc mount against rclone mount --vfs-cache-mode full over one versitygw bucket behind a 20-50 ms delay proxy: cold MiB/s, GETs per GiB, warm random 4 KiB IOPS and p99, restart warm-up.
    S3,
}

/// `l2arc bench` (and `l2arc-bench`): the benchmark suite's options.
#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    /// The benchmark to run.
    #[arg(long, value_enum, default_value = "demo")]
    pub scenario: Scenario,
    /// Directory for the generated dataset (reused when it matches); default: a temporary directory.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Dataset size (split over --files files).
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    pub dataset_size: u64,
    /// Files the dataset is split into.
    #[arg(long, default_value_t = 16)]
    pub files: u32,
    /// `arc_max`: DRAM for cached records (default 8 MiB with --scenario l2-hit, so that reads reach the L2ARC).
    #[arg(long, default_value = "64MiB", default_value_ifs = SEED_ARC_MAX, value_parser = parse_size)]
    pub arc_max: u64,
    /// ARC shards (locks); default: 4 per core.
    #[arg(long)]
    pub arc_shards: Option<usize>,
    /// `recordsize` of the dataset (4K to 1M, a power of two).
    #[arg(long, default_value = "128K", value_parser = parse_size)]
    pub recordsize: u64,
    /// Size of each random read.
    #[arg(long, default_value = "8K", value_parser = parse_size)]
    pub read_size: u64,
    /// Reader threads.
    #[arg(long, default_value_t = 16)]
    pub threads: usize,
    /// Seconds per measured phase.
    #[arg(long, default_value_t = 20.0)]
    pub seconds: f64,
    /// Share of reads that go to the hot part of the dataset.
    #[arg(long, default_value_t = 0.8)]
    pub hot_read_fraction: f64,
    /// Share of the dataset that is hot.
    #[arg(long, default_value_t = 0.2)]
    pub hot_data_fraction: f64,
    /// Emulated HDD: disks, each serving one request at a time.
    #[arg(long, default_value_t = 4)]
    pub spindles: usize,
    /// Emulated HDD: shortest and longest positioning time, ms.
    #[arg(long, default_value_t = 4.0)]
    pub seek_ms_min: f64,
    /// Emulated HDD: longest positioning time, ms.
    #[arg(long, default_value_t = 12.0)]
    pub seek_ms_max: f64,
    /// Emulated HDD: media transfer rate per disk.
    #[arg(long, default_value_t = 150.0)]
    pub transfer_mib_per_sec: f64,
    /// Dataset and workload seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// L2ARC on the demo: a cache file in the temporary directory (or --cache).
    #[arg(long, value_enum, default_value = "on")]
    pub l2arc: OnOff,
    /// Cache device (file or block device); repeatable. Default: a file in the temporary directory.
    #[arg(long)]
    pub cache: Vec<PathBuf>,
    /// Size of the cache file made when --cache is not given (or does not exist); 1 GiB with --scenario l2-hit.
    #[arg(long, default_value = "512MiB", default_value_ifs = SEED_CACHE_SIZE, value_parser = parse_size)]
    pub cache_size: u64,
    /// How records are stored on the L2ARC: lz4, zstd or off.
    #[arg(long, default_value = "lz4", value_parser = parse_compression)]
    pub compression: l2arc::Compression,
    /// Rounds of paired measurements (ours, then fio, alternating which goes first) in --scenario l2-hit; the medians are reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// --scenario l2-hit: measure only the read queue against fio io_uring at QD32 (no blocking readers, bare preads or checking fio), so that many rounds of that one pair run back to back.
    #[arg(long)]
    pub queue_only: bool,
    /// Dataset content: random (incompressible) or mixed (about 2:1 with LZ4: text lines and random bytes).
    #[arg(long, value_enum, default_value = "random", default_value_ifs = SEED_CONTENT)]
    pub content: dataset::Content,
    /// Record counts, comma-separated (k, M, G are powers of 1000). --scenario l2-index: index sizes (default 1M,10M); --scenario l2-rebuild: records per warm device (default 262144: a 1 GiB device of 4 KiB records and a 2 GiB one of 8 KiB records; above 1048576 the device is a sparse file holding only its log).
    #[arg(long, value_parser = parse_count, value_delimiter = ',')]
    pub records: Vec<u64>,
    /// --scenario nbd-connections: the numbers of connections to step through, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "16,32,64,128,256")]
    pub connections: Vec<usize>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Throughput scenario: dataset sizes as multiples of --cache-size, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0.5,1,1.5,2,3")]
    pub multiples: Vec<f64>,
    /// Where throughput/latency/warmup write their JSON and HTML reports.
    #[arg(long, default_value = "bench-reports")]
    pub report_dir: PathBuf,
    /// Also measure the peers (foyer, l2arc_lru) in throughput/latency/warmup.
    #[arg(long)]
    pub peers: bool,
    /// Measured seconds per cell in throughput/latency/warmup (default per scenario).
    #[arg(long)]
    pub measure_secs: Option<f64>,
    /// Longest warm-up per cell in throughput/latency, seconds (default per scenario).
    #[arg(long)]
    pub warm_secs: Option<f64>,
    /// Mixed-size datasets (throughput/latency/warmup): smallest and largest file.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    pub min_file_size: u64,
    /// Mixed-size datasets: largest file.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    pub max_file_size: u64,
}

/// Defaults of the seed experiments' scenarios: a deliberately small ARC, an L2ARC the
/// datasets are sized against, content that LZ4 halves (like Silesia).
const SEED_ARC_MAX: [(&str, &str, &str); 5] = [
    ("scenario", "l2-hit", "8MiB"),
    ("scenario", "throughput", "16MiB"),
    ("scenario", "latency", "16MiB"),
    ("scenario", "warmup", "16MiB"),
    ("scenario", "all", "16MiB"),
];
const SEED_CACHE_SIZE: [(&str, &str, &str); 5] = [
    ("scenario", "l2-hit", "1GiB"),
    ("scenario", "throughput", "128MiB"),
    ("scenario", "latency", "128MiB"),
    ("scenario", "warmup", "128MiB"),
    ("scenario", "all", "128MiB"),
];
const SEED_CONTENT: [(&str, &str, &str); 4] = [
    ("scenario", "throughput", "mixed"),
    ("scenario", "latency", "mixed"),
    ("scenario", "warmup", "mixed"),
    ("scenario", "all", "mixed"),
];

/// A switch on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    /// Switched on.
    On,
    /// Switched off.
    Off,
}

fn parse_compression(s: &str) -> Result<l2arc::Compression, String> {
    s.parse().map_err(|e: l2arc::FormatError| e.to_string())
}

/// Prints a scenario's report: JSON with `--json`, otherwise the table.
fn emit<T: serde::Serialize>(json: bool, report: &T, print_table: impl FnOnce(&T)) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print_table(report);
    }
    Ok(())
}

/// Writes a scenario's JSON and HTML report into `--report-dir`, then
/// prints it (JSON or table) and where the report went.
fn emit_with_report<T: serde::Serialize>(
    args: &BenchArgs,
    name: &str,
    report: &T,
    html: &str,
    print_table: impl FnOnce(&T),
) -> Result<()> {
    let json = serde_json::to_string_pretty(report)?;
    let path = report::write_report(&args.report_dir, name, &json, html)?;
    emit(args.json, report, print_table)?;
    if !args.json {
        println!("report: {}", path.display());
    }
    Ok(())
}

/// `/proc/loadavg`, trimmed, for reports (empty where there is none).
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// A program built into the same directory as this one (the `l2arc`
/// binary, whose `serve-nbd` the nbd scenario measures).
pub(crate) fn sibling_binary(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe
        .parent()
        .map(|dir| dir.join(name))
        .filter(|p| p.is_file());
    match path {
        Some(path) => Ok(path),
        None => bail!(
            "the {name} binary is not beside {}: cargo build --release -p l2arc-cli",
            exe.display()
        ),
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    l2arc_sim::parse_size(s)
}

/// A positive count: digits with an optional k, M or G (powers of 1000).
pub(crate) fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, multiplier) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1_000),
        Some((i, 'm' | 'M')) => (&t[..i], 1_000_000),
        Some((i, 'g' | 'G')) => (&t[..i], 1_000_000_000),
        _ => (t, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            format!("invalid count `{s}`: expected a positive whole number such as 1000000 or 1M")
        })
}

/// Runs the chosen scenario and prints its report.
pub fn run(args: BenchArgs) -> Result<()> {
    l2arc::validate_recordsize(args.recordsize)?;
    if args.threads == 0 || args.threads > 4096 {
        bail!("--threads must be from 1 to 4096, not {}", args.threads);
    }
    if !(args.seconds > 0.0 && args.seconds <= 86_400.0) {
        bail!(
            "--seconds must be positive (and at most a day), not {}",
            args.seconds
        );
    }
    if args.rounds == 0 || args.rounds > 100 {
        bail!("--rounds must be from 1 to 100, not {}", args.rounds);
    }
    if args.files == 0 {
        bail!("--files must be at least 1");
    }
    if args.queue_only && args.scenario != Scenario::L2Hit {
        bail!("--queue-only belongs to --scenario l2-hit");
    }
    if args.read_size == 0 || args.read_size > 16 << 20 {
        bail!("--read-size must be from 1 byte to 16 MiB");
    }
    for (name, value) in [
        ("--hot-read-fraction", args.hot_read_fraction),
        ("--hot-data-fraction", args.hot_data_fraction),
    ] {
        if !(0.0..=1.0).contains(&value) {
            bail!("{name} must be between 0 and 1, not {value}");
        }
    }
    if let Some(dir) = &args.data
        && dir.exists()
        && !dir.is_dir()
    {
        bail!("--data {}: not a directory", dir.display());
    }
    match args.scenario {
        Scenario::Demo => demo::run(&args),
        Scenario::ArcHit => hit_path::run(&args),
        Scenario::L2Hit => l2_hit::run(&args),
        Scenario::L2Index => l2_index::run(&args),
        Scenario::L2Rebuild => l2_rebuild::run(&args),
        Scenario::Fuse => fuse::run(&args),
        Scenario::Nbd => nbd::run(&args),
        Scenario::Throughput => throughput::run(&args),
        Scenario::Latency => latency::run(&args),
        Scenario::Warmup => warmup::run(&args),
        Scenario::FeedCapture => feed_capture::run(&args),
        Scenario::S3 => s3::run(&args),
        Scenario::NbdReread => nbd_reread::run(&args),
        Scenario::NbdL2Hit => nbd_l2_hit::run(&args),
        Scenario::NbdConnections => nbd_connections::run(&args),
        Scenario::NbdWarmup => nbd_warmup::run(&args),
        Scenario::All => {
            throughput::run(&args)?;
            latency::run(&args)?;
            warmup::run(&args)
        }
    }
}
