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
//! Layout: `lib.rs` the flags and the one table the scenarios are
//! dispatched from (`SCENARIOS`), printing and stamping every report alike
//! (`stamp`); the scenarios under `scenarios/`, one module each behind one
//! trait (`scenarios::Scenario`); the systems under test behind one trait
//! (`targets`, with `targets/ours.rs` and `targets/peers.rs`); the one
//! phase runner every timed phase goes through (`runner`) and the verified
//! reads through a target on top of it (`workload`), the generated
//! datasets (`dataset`), fio (`fio`), the report writers (`report`) and
//! the benchmarks table made from the committed reports (`table`).

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};

mod dataset;
mod fio;
mod nbd_client;
mod report;
mod runner;
pub mod scenarios;
mod stamp;
pub mod table;
mod targets;
mod workload;

use scenarios::{Outcome, Scenario};

/// A report page with one chart of each kind (bars, lines, heat map) over
/// fixed data, drawn by the shared chart code: what the browser test of the
/// reports opens.
#[doc(hidden)]
pub fn sample_report_html() -> String {
    report::sample_page()
}

/// Every scenario, in `--help` order: the one table `--scenario NAME` is
/// looked up in.
static SCENARIOS: [&dyn Scenario; 20] = [
    &scenarios::demo::DemoScenario,
    &scenarios::hit_path::ArcHit,
    &scenarios::l2_hit::L2Hit,
    &scenarios::l2_index::L2IndexScenario,
    &scenarios::l2_rebuild::L2Rebuild,
    &scenarios::fuse::Fuse,
    &scenarios::nbd::Nbd,
    &scenarios::throughput::Throughput,
    &scenarios::latency::Latency,
    &scenarios::warmup::Warmup,
    &scenarios::All,
    &scenarios::feed_capture::FeedCapture,
    &scenarios::nbd_reread::NbdReread,
    &scenarios::nbd_l2_hit::NbdL2Hit,
    &scenarios::nbd_connections::NbdConnections,
    &scenarios::nbd_warmup::NbdWarmup,
    &scenarios::s3::S3,
    &scenarios::s3::S3Defaults,
    &scenarios::restart::Restart,
    &scenarios::fleet::FleetScenario,
];

/// The scenarios' names, in table order (what `table` orders its rows by).
pub fn scenario_names() -> Vec<&'static str> {
    SCENARIOS.iter().map(|s| s.name()).collect()
}

/// What to measure: one of the scenarios, by its name.
#[derive(Clone, Copy)]
pub struct ScenarioName(&'static dyn Scenario);

impl ScenarioName {
    /// The `--scenario` value.
    pub fn name(&self) -> &'static str {
        self.0.name()
    }
}

impl std::fmt::Debug for ScenarioName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl PartialEq for ScenarioName {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl ValueEnum for ScenarioName {
    fn value_variants<'a>() -> &'a [Self] {
        static NAMES: std::sync::LazyLock<Vec<ScenarioName>> =
            std::sync::LazyLock::new(|| SCENARIOS.iter().map(|s| ScenarioName(*s)).collect());
        &NAMES
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()).help(self.0.measures()))
    }
}

/// `l2arc bench` (and `l2arc-bench`): the benchmark suite's options.
#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    /// The benchmark to run.
    #[arg(long, value_enum, default_value = "demo")]
    pub scenario: ScenarioName,
    /// Directory for the generated dataset (reused when it matches); default: a temporary directory.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Dataset size (split over --files files); 1 GiB with --scenario restart, 4 GiB with --scenario s3-defaults and fleet.
    #[arg(long, default_value = "256MiB", default_value_ifs = DATASET_SIZE, value_parser = parse_size)]
    pub dataset_size: u64,
    /// Files the dataset is split into.
    #[arg(long, default_value_t = 16)]
    pub files: u32,
    /// `arc_max`: DRAM for cached records (default 8 MiB with --scenario l2-hit, so that reads reach the L2ARC; 128 MiB with --scenario restart; not used by --scenario s3-defaults, which runs l2arc's default).
    #[arg(long, default_value = "64MiB", default_value_ifs = SEED_ARC_MAX, value_parser = parse_size)]
    pub arc_max: u64,
    /// ARC shards (locks); default: 4 per core.
    #[arg(long)]
    pub arc_shards: Option<usize>,
    /// `recordsize` of the dataset (4K to 1M, a power of two); 1M with --scenario s3-defaults (the `s3://` mount's default).
    #[arg(long, default_value = "128K", default_value_ifs = [("scenario", "s3-defaults", "1M")], value_parser = parse_size)]
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
    /// --scenario fleet: nodes (mounts, each with its own cache) reading the bucket.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// --scenario fleet: a cap on the data bucket's link, MiB/s, all
    /// connections together (0: none, only the delay).
    #[arg(long, default_value_t = 0.0)]
    pub data_link_mib_per_sec: f64,
    /// Print JSON instead of tables: the report, stamped with the commit,
    /// the date, the load average before and after, and the arguments.
    #[arg(long)]
    pub json: bool,
    /// Also add the stamped report, as one more run, to DIR/<scenario>.json
    /// (the committed reports the benchmarks table is made from:
    /// docs/benchmarks/reports).
    #[arg(long, value_name = "DIR")]
    pub record: Option<PathBuf>,
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
/// `restart` (seed experiment 2 through the export): an image 8 times the
/// ARC, within the cache file; `s3-defaults`: a working set 4 times the
/// old fixed `arc_max` of 1 GiB; `fleet`: a bucket a fresh node cannot
/// make its own in its random-read window, as the goal says ("before its
/// own cache is warm"): at 1 GiB rclone's fresh node pulled 4-5 times the
/// bucket through the delay proxy in 8 s and read from a warm cache
/// (4.4-14 k IOPS); at 4 GiB it pulls 1.5 times it and is still cold
/// (43-108 IOPS).
const DATASET_SIZE: [(&str, &str, &str); 3] = [
    ("scenario", "restart", "1GiB"),
    ("scenario", "s3-defaults", "4GiB"),
    ("scenario", "fleet", "4GiB"),
];
const SEED_ARC_MAX: [(&str, &str, &str); 6] = [
    ("scenario", "restart", "128MiB"),
    ("scenario", "l2-hit", "8MiB"),
    ("scenario", "throughput", "16MiB"),
    ("scenario", "latency", "16MiB"),
    ("scenario", "warmup", "16MiB"),
    ("scenario", "all", "16MiB"),
];
const SEED_CACHE_SIZE: [(&str, &str, &str); 6] = [
    ("scenario", "restart", "2GiB"),
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
    if let Some(result) = scenarios::l2_index::child() {
        return result;
    }
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
    if args.queue_only && args.scenario.name() != "l2-hit" {
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
    let parts = args.scenario.0.parts();
    if parts.is_empty() {
        return run_one(args.scenario.0, &args);
    }
    for part in parts {
        run_one(*part, &args)?;
    }
    Ok(())
}

/// Runs one scenario and prints what it found: the table, or with
/// `--json` its report stamped (commit, date, load average, arguments) with
/// its headline figures; with `--record DIR` the stamped report is also
/// added to `DIR/<scenario>.json` as one more run. Scenarios with an HTML
/// page write it and the JSON into `--report-dir`.
fn run_one(scenario: &dyn Scenario, args: &BenchArgs) -> Result<()> {
    let before = stamp::Before::now();
    let Outcome {
        report,
        headline,
        print,
        html,
    } = scenario.run(args)?;
    let stamped = stamp::stamped(scenario.name(), &before, report, &headline)?;
    let json = serde_json::to_string_pretty(&stamped)?;
    let html_path = match &html {
        Some(html) => Some(report::write_report(
            &args.report_dir,
            scenario.name(),
            &json,
            html,
        )?),
        None => None,
    };
    if let Some(dir) = &args.record {
        let path = table::record_run(dir, scenario.name(), stamped)?;
        eprintln!("recorded in {}", path.display());
    }
    if args.json {
        println!("{json}");
    } else {
        print();
        if let Some(path) = html_path {
            println!("report: {}", path.display());
        }
    }
    Ok(())
}
