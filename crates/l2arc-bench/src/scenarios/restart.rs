//! `--scenario restart`: how fast the NBD export is warm again after a
//! restart, three ways in one run (issue 33).
//!
//! Why this scenario. A persistent L2ARC (OpenZFS 2.0, ours) comes back
//! after a restart, but the ARC starts empty: the hot records that lived
//! only in DRAM at the stop are read from the disks again, and every hot
//! read pays a flash read instead of a DRAM copy until the ARC has refilled
//! by demand. The stop flush (the ARC's eligible records written to flash
//! at SIGTERM), the checkpoint of the ARC's shape (written every
//! `--l2arc-arc-checkpoint-secs`) and the prewarm (the ARC refilled from
//! the L2ARC in the saved order while the export already serves) are what
//! should close that gap; this measures it from the user's side.
//!
//! The workload is the seed's experiment 2 at this machine's scale: random
//! 8 KiB reads, 80% of them to 20% of the image (fio's `zoned`
//! distribution), 20 in flight (the seed's 20 clients as a queue depth),
//! through `l2arc serve-nbd` with fio's nbd engine, over an image on an
//! emulated 4-spindle HDD (4-12 ms a positioning, in the server), the image
//! larger than the ARC (`--arc-max`, fixed) and within the cache file.
//!
//! The run: warm from an empty cache in bounded chunks until two chunks'
//! IOPS agree (the warm IOPS, the yardstick of every restart), then
//! (a) SIGTERM and start again with the prewarm on, (b) SIGKILL after a
//! checkpoint is due and start again with the prewarm on, (c) SIGTERM and
//! start again with the prewarm off (what OpenZFS does). After each start,
//! `--measure-secs` (60 by default) of the same reads from the ready line
//! (the socket accepting): IOPS per second, the ARC hit ratio of the first
//! 10 s, the first second at 90% of the warm IOPS, and the primary reads
//! of the window (`l2arc ctl stats`, polled each second). Right after the
//! first clean stop, fio reads the cache file sequentially (io_uring,
//! 1 MiB, O_DIRECT) over the part the feeder wrote: the rate the prewarm's
//! own (`arc_prewarm_bytes` over `arc_prewarm_ms`) is set against.
//!
//! A binary without the prewarm flags (a tree before the feature) still
//! runs every phase, without them: the plumbing is measured, and the report
//! says the prewarm was not available.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use l2arc::primary::emulated_hdd::HddConfig;

use crate::BenchArgs;
use crate::fio::{FioJob, FioTarget};

use super::nbd::{ServerProcess, require_tools, scenario_image, shell_words, spawn};
use super::nbd_reread::{ctl_stats, get};
use super::{Goal, Headline, Outcome, Scenario};

/// The seed's 20 clients, as reads in flight on one connection.
const QUEUE_DEPTH: usize = 20;
const READ_BYTES: u64 = 8 << 10;
const RECORDSIZE_BYTES: u64 = 128 << 10;
/// 80% of the reads to the first 20% of the image.
const DISTRIBUTION: &str = "zoned:80/20:20/80";
/// Warm-up: fio runs of this length until two agree within
/// `WARM_SETTLED_SHARE`, at least `WARM_SECS_MIN` (or `--warm-secs` if
/// less) and at most `--warm-secs` (default `WARM_SECS_MAX`).
const WARM_CHUNK_SECS: u64 = 10;
const WARM_SECS_MIN: f64 = 30.0;
const WARM_SECS_MAX: f64 = 150.0;
const WARM_SETTLED_SHARE: f64 = 0.05;
/// Seconds measured after each restart (`--measure-secs` overrides).
const AFTER_SECS_DEFAULT: f64 = 60.0;
/// Seconds whose mean must hold 90% of the warm IOPS (fewer at the end of
/// the window).
const SUSTAINED_SECS: usize = 3;
/// The hit ratio is of this many first seconds.
const HIT_WINDOW_SECS: f64 = 10.0;
/// `--l2arc-arc-checkpoint-secs`: short, so that (b) has one to restart
/// from; the kill waits past it.
const CHECKPOINT_SECS: u64 = 5;
/// fio's sequential read of the cache file.
const SEQ_SECS: u64 = 5;
const SEQ_BLOCK_BYTES: u64 = 1 << 20;
const SEQ_QUEUE_DEPTH: usize = 8;
/// The counters polled each second after a start.
const POLLED: [&str; 9] = [
    "hits",
    "misses",
    "primary_reads",
    "size",
    "arc_prewarm_records",
    "arc_prewarm_bytes",
    "arc_prewarm_ms",
    "arc_prewarm_active",
    "arc_prewarm_reads",
];
/// Polls at most this many times per restart (one a second).
const SAMPLES_MAX: usize = 600;

/// How the server was stopped and started again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
enum Kind {
    /// SIGTERM, then start with the prewarm on.
    #[serde(rename = "clean_prewarm")]
    Clean,
    /// SIGKILL past a checkpoint, then start with the prewarm on.
    #[serde(rename = "kill_prewarm")]
    Killed,
    /// SIGTERM, then start with the prewarm off (OpenZFS's behaviour).
    #[serde(rename = "clean_no_prewarm")]
    Cold,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Clean, Kind::Killed, Kind::Cold];

    fn name(self) -> &'static str {
        match self {
            Kind::Clean => "(a) SIGTERM, prewarm on",
            Kind::Killed => "(b) SIGKILL, prewarm on",
            Kind::Cold => "(c) SIGTERM, prewarm off",
        }
    }

    fn prewarm(self) -> bool {
        self != Kind::Cold
    }

    fn killed(self) -> bool {
        self == Kind::Killed
    }
}

/// What the `l2arc` binary supports (a tree before the features lacks the
/// flags: the scenario then measures without them and says so).
#[derive(Clone, Copy, Debug, Serialize)]
struct Features {
    prewarm_flag: bool,
    checkpoint_flag: bool,
}

impl Features {
    fn probe(binary: &Path) -> Result<Features> {
        let out = Command::new(binary)
            .args(["serve-nbd", "--help"])
            .output()
            .context("l2arc serve-nbd --help")?;
        let help = String::from_utf8_lossy(&out.stdout);
        Ok(Features {
            prewarm_flag: help.contains("--l2arc-prewarm"),
            checkpoint_flag: help.contains("--l2arc-arc-checkpoint-secs"),
        })
    }
}

/// One counter sample, seconds after the ready line.
#[derive(Clone, Debug, Serialize)]
struct Sample {
    secs: f64,
    counters: Vec<(String, u64)>,
}

impl Sample {
    fn get(&self, name: &str) -> u64 {
        get(&self.counters, name)
    }
}

/// The prewarm's own figures at the end of the window.
#[derive(Debug, Serialize)]
struct Prewarm {
    records: u64,
    bytes: u64,
    ms: u64,
    /// Device reads it issued (records back to back on flash are read
    /// together; 0 from a server without `arc_prewarm_reads`).
    reads: u64,
    mib_per_sec: Option<f64>,
}

/// One restart's figures.
#[derive(Serialize)]
struct Restarted {
    kind: Kind,
    /// Whether the prewarm flag was passed (`--l2arc-prewarm`), and its value.
    prewarm_flag: Option<bool>,
    /// The server's last lines at the stop (its stop line and the stop
    /// flush's), empty after SIGKILL.
    stop_lines: Vec<String>,
    stop_secs: f64,
    /// From the start of the process to its socket accepting.
    ready_secs: f64,
    /// From the ready line to fio's start.
    fio_start_secs: f64,
    iops_per_second: Vec<f64>,
    hit_ratio_first_10s: Option<f64>,
    /// The same in the first second: how much of the ARC was back at once.
    hit_ratio_first_1s: Option<f64>,
    /// The end of the first second at 90% of the warm IOPS, counted from
    /// the ready line.
    secs_to_90pct: Option<f64>,
    primary_reads_in_window: u64,
    prewarm: Option<Prewarm>,
    samples: Vec<Sample>,
}

/// fio's sequential read of the cache file right after the first clean
/// stop.
#[derive(Debug, Serialize)]
struct SeqRead {
    size_bytes: u64,
    mib_per_sec: f64,
    command: String,
}

#[derive(Serialize)]
struct Report {
    image_bytes: u64,
    arc_max_bytes: u64,
    cache_bytes: u64,
    recordsize_bytes: u64,
    read_bytes: u64,
    queue_depth: usize,
    distribution: &'static str,
    #[serde(skip)]
    hdd: HddConfig,
    features: Features,
    command: String,
    fio_command: String,
    load_before: String,
    load_after: String,
    warm_secs: f64,
    warm_iops_per_second: Vec<f64>,
    warm_iops: f64,
    /// The ARC's hits over hits and misses in the last warm-up chunk.
    warm_hit_ratio: Option<f64>,
    after_secs: f64,
    seq_read: Option<SeqRead>,
    restarts: Vec<Restarted>,
    /// Where the full series were written (JSON).
    series_path: Option<PathBuf>,
}

/// The run's fixed parts: where things are, how the server is started.
struct Place {
    dir: PathBuf,
    binary: PathBuf,
    image: PathBuf,
    image_bytes: u64,
    cache: PathBuf,
    cache_bytes: u64,
    arc_max_bytes: u64,
    hdd: HddConfig,
    features: Features,
    seed: u64,
}

impl Place {
    fn socket(&self) -> PathBuf {
        self.dir.join("restart.sock")
    }

    fn control(&self) -> PathBuf {
        self.dir.join("restart.ctl")
    }

    /// The ARC checkpoint's default path: the cache file's with `.arc`.
    fn checkpoint(&self) -> PathBuf {
        let mut path = self.cache.clone().into_os_string();
        path.push(".arc");
        PathBuf::from(path)
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket().display())
    }

    /// `l2arc serve-nbd` with the prewarm on or off (when the binary has
    /// the flag) and a short checkpoint interval (when it has that one).
    fn command(&self, prewarm: bool) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("serve-nbd")
            .arg(&self.image)
            .arg("--listen")
            .arg(format!("unix:{}", self.socket().display()))
            .arg("--control")
            .arg(self.control())
            .arg(format!("--arc-max={}", self.arc_max_bytes))
            .arg(format!("--recordsize={RECORDSIZE_BYTES}"))
            .arg(format!("--cache={}", self.cache.display()))
            .arg(format!("--cache-size={}", self.cache_bytes))
            .arg(format!("--emulate-hdd-spindles={}", self.hdd.spindles))
            .arg(format!(
                "--emulate-hdd-seek-ms-min={}",
                self.hdd.seek_ms_min
            ))
            .arg(format!(
                "--emulate-hdd-seek-ms-max={}",
                self.hdd.seek_ms_max
            ));
        if self.features.checkpoint_flag {
            cmd.arg(format!("--l2arc-arc-checkpoint-secs={CHECKPOINT_SECS}"));
        }
        if self.features.prewarm_flag {
            cmd.arg(format!("--l2arc-prewarm={prewarm}"));
        }
        cmd
    }

    /// Starts the server; returns it with the seconds to its socket
    /// accepting (the ready line) and the instant of it.
    fn start(&self, prewarm: bool) -> Result<(ServerProcess, f64, Instant)> {
        let _ = std::fs::remove_file(self.socket());
        let _ = std::fs::remove_file(self.control());
        let started = Instant::now();
        let mut server = spawn(self.command(prewarm))?;
        wait_ready(&mut server, &self.socket())?;
        let ready = Instant::now();
        Ok((server, (ready - started).as_secs_f64(), ready))
    }

    /// fio's reads for `secs` with an IOPS log.
    fn job(&self, secs: u64, seed: u64) -> FioJob {
        FioJob::new(
            "restart",
            "nbd",
            FioTarget::NbdUri(self.uri()),
            "randread",
            READ_BYTES,
            secs,
        )
        .size_bytes(self.image_bytes)
        .iodepth(QUEUE_DEPTH)
        .random_distribution(DISTRIBUTION)
        .seed(seed)
        .iops_log()
    }
}

impl Place {
    /// The image (made or found in `--data`), the cache file beside it
    /// (removed first, with its checkpoint), and the server's settings.
    fn new(args: &BenchArgs, tmp: &Path, binary: PathBuf, features: Features) -> Result<Place> {
        let (image, image_bytes) =
            scenario_image(args, tmp, "restart", "restart.img", RECORDSIZE_BYTES)?;
        let cache = image.with_file_name("restart-cache.img");
        let checkpoint = image.with_file_name("restart-cache.img.arc");
        let _ = std::fs::remove_file(&cache);
        let _ = std::fs::remove_file(&checkpoint);
        if args.arc_max >= image_bytes {
            bail!(
                "--arc-max ({} MiB) must be below the image ({} MiB): the working set is bigger than the ARC",
                args.arc_max >> 20,
                image_bytes >> 20
            );
        }
        let cache_bytes = args.cache_size.max(image_bytes + image_bytes / 4);
        Ok(Place {
            dir: tmp.to_path_buf(),
            binary,
            image,
            image_bytes,
            cache,
            cache_bytes,
            arc_max_bytes: args.arc_max,
            hdd: HddConfig::default(),
            features,
            seed: args.seed,
        })
    }
}

/// Waits for the socket to accept; a bounded wait (a rebuild of a large
/// device may take seconds, never minutes here).
fn wait_ready(server: &mut ServerProcess, socket: &Path) -> Result<()> {
    super::nbd::wait_for_socket(server, socket)
}

pub(crate) fn run(args: &BenchArgs) -> Result<Outcome> {
    require_tools("restart", &["fio"])?;
    let binary = crate::sibling_binary("l2arc")?;
    let features = Features::probe(&binary)?;
    let tmp = tempfile::Builder::new()
        .prefix("l2arc-bench-restart")
        .tempdir()?;
    let place = Place::new(args, tmp.path(), binary, features)?;
    let checkpoint = place.checkpoint();
    if !(features.prewarm_flag && features.checkpoint_flag) {
        eprintln!(
            "restart: this l2arc has no --l2arc-prewarm/--l2arc-arc-checkpoint-secs: every restart runs without them (today's behaviour)"
        );
    }
    let after_secs = args
        .measure_secs
        .unwrap_or(AFTER_SECS_DEFAULT)
        .clamp(HIT_WINDOW_SECS + 2.0, 600.0);
    let warm_secs_max = args
        .warm_secs
        .unwrap_or(WARM_SECS_MAX)
        .max(WARM_CHUNK_SECS as f64);
    let load_before = crate::load_average();
    let command = relative_to_cwd(shell_words(&place.command(true)));
    let fio_command = place.job(after_secs as u64, place.seed).command_line();
    let result = measure(&place, after_secs, warm_secs_max);
    let _ = std::fs::remove_file(&place.cache);
    let _ = std::fs::remove_file(&checkpoint);
    let (warm_iops_per_second, warm_iops, warm_hit_ratio, seq_read, restarts) = result?;
    let mut report = Report {
        image_bytes: place.image_bytes,
        arc_max_bytes: args.arc_max,
        cache_bytes: place.cache_bytes,
        recordsize_bytes: RECORDSIZE_BYTES,
        read_bytes: READ_BYTES,
        queue_depth: QUEUE_DEPTH,
        distribution: DISTRIBUTION,
        hdd: place.hdd.clone(),
        features,
        command,
        fio_command,
        load_before,
        load_after: crate::load_average(),
        warm_secs: warm_iops_per_second.len() as f64,
        warm_iops_per_second,
        warm_iops,
        warm_hit_ratio,
        after_secs,
        seq_read,
        restarts,
        series_path: None,
    };
    report.series_path = write_series(&report).ok();
    let headline = headline(&report);
    Outcome::new(report, headline, print_report)
}

type Measured = (Vec<f64>, f64, Option<f64>, Option<SeqRead>, Vec<Restarted>);

/// The warm-up, then the three restarts.
fn measure(place: &Place, after_secs: f64, warm_secs_max: f64) -> Result<Measured> {
    let (mut server, _, _) = place.start(true)?;
    eprintln!("restart: warming (chunks of {WARM_CHUNK_SECS} s, at most {warm_secs_max:.0} s)");
    let (warm_series, warm_iops, warm_hit_ratio) = warm(place, warm_secs_max)?;
    eprintln!("restart: warm at {warm_iops:.0} IOPS");
    let mut seq_read = None;
    let mut restarts = Vec::new();
    for (i, kind) in Kind::ALL.into_iter().enumerate() {
        let stopping = Instant::now();
        let stop_lines = if kind.killed() {
            if place.features.checkpoint_flag {
                // A checkpoint of the state the reads left: one is due
                // within an interval of the last read.
                std::thread::sleep(Duration::from_secs(CHECKPOINT_SECS + 2));
            }
            drop(server); // SIGKILL: ServerProcess's drop
            Vec::new()
        } else {
            server.stop()
        };
        let stop_secs = stopping.elapsed().as_secs_f64();
        if kind == Kind::Clean {
            seq_read = Some(seq_read_cache(place)?);
        }
        eprintln!("restart: {}", kind.name());
        let (next, restarted) = restart(
            place,
            kind,
            (stop_lines, stop_secs),
            (after_secs, warm_iops),
            i,
        )?;
        server = next;
        restarts.push(restarted);
    }
    drop(server.stop());
    Ok((warm_series, warm_iops, warm_hit_ratio, seq_read, restarts))
}

/// Reads until two chunks agree (and at least `WARM_SECS_MIN`); returns
/// every second's IOPS, the warm level (the last chunk's median second)
/// and the ARC's hit ratio in the last chunk.
fn warm(place: &Place, secs_max: f64) -> Result<(Vec<f64>, f64, Option<f64>)> {
    let mut series: Vec<f64> = Vec::new();
    let mut last_mean: Option<f64> = None;
    let mut chunk = 0u64;
    loop {
        let before = ctl_stats(&place.control())?;
        let read = place
            .job(WARM_CHUNK_SECS, place.seed.wrapping_add(100 + chunk))
            .run(Some(&place.dir))?;
        let after = ctl_stats(&place.control())?;
        let delta = |n: &str| get(&after, n).saturating_sub(get(&before, n));
        let (hits, misses) = (delta("hits"), delta("misses"));
        chunk += 1;
        let seconds = read.iops_per_second;
        if seconds.is_empty() {
            bail!("fio logged no IOPS in a warm-up chunk");
        }
        let mean = seconds.iter().sum::<f64>() / seconds.len() as f64;
        series.extend_from_slice(&seconds);
        let elapsed = series.len() as f64;
        let settled = last_mean.is_some_and(|m| (mean - m).abs() <= WARM_SETTLED_SHARE * m);
        eprintln!("restart: warm-up {elapsed:.0} s: {mean:.0} IOPS");
        if (settled && elapsed >= WARM_SECS_MIN.min(secs_max)) || elapsed >= secs_max {
            let hit_ratio = (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64);
            return Ok((series, super::median_of(&seconds), hit_ratio));
        }
        last_mean = Some(mean);
    }
}

/// Reads the part of the cache file the feeder wrote, sequentially, as
/// fast as fio can: the device's own rate for the prewarm's.
fn seq_read_cache(place: &Place) -> Result<SeqRead> {
    // The log fills the device from its start and the file is sparse: its
    // allocated bytes are the part written (holes would read as fast as
    // memory).
    let allocated = std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&place.cache)?) * 512;
    let size_bytes =
        allocated.clamp(SEQ_BLOCK_BYTES, place.cache_bytes) / SEQ_BLOCK_BYTES * SEQ_BLOCK_BYTES;
    let job = FioJob::new(
        "restart-seq",
        "io_uring",
        // Absolute: fio runs in the scenario's directory, and `--data` may
        // be relative to where the bench was started.
        FioTarget::Files(vec![std::fs::canonicalize(&place.cache)?]),
        "read",
        SEQ_BLOCK_BYTES,
        SEQ_SECS,
    )
    .readonly()
    .direct(true)
    .size_bytes(size_bytes)
    .iodepth(SEQ_QUEUE_DEPTH);
    let read = job.run(Some(&place.dir))?;
    Ok(SeqRead {
        size_bytes,
        mib_per_sec: read.mib_per_sec,
        command: relative_to_cwd(job.command_line()),
    })
}

/// A command line as the report shows it: paths under the directory the
/// bench runs in are written relative to it (no machine's paths in a
/// committed report).
fn relative_to_cwd(command: String) -> String {
    match std::env::current_dir() {
        Ok(dir) => command.replace(&format!("{}/", dir.display()), ""),
        Err(_) => command,
    }
}

/// Starts the server again after a stop of `kind` and reads for
/// `after_secs` from its ready line, polling its counters each second.
fn restart(
    place: &Place,
    kind: Kind,
    (stop_lines, stop_secs): (Vec<String>, f64),
    (after_secs, warm_iops): (f64, f64),
    index: usize,
) -> Result<(ServerProcess, Restarted)> {
    let (server, ready_secs, ready) = place.start(kind.prewarm())?;
    let done = AtomicBool::new(false);
    let control = place.control();
    let (read, fio_start_secs, samples) = std::thread::scope(|scope| {
        let poller = scope.spawn(|| poll(&control, ready, &done));
        let fio_start_secs = ready.elapsed().as_secs_f64();
        let read = place
            .job(
                after_secs.ceil() as u64,
                // fio keeps the low 32 bits of a seed: each window its own.
                place.seed.wrapping_add(1000 * (index as u64 + 1)),
            )
            .run(Some(&place.dir));
        done.store(true, Ordering::Relaxed);
        let samples = poller.join().expect("poller panicked");
        (read, fio_start_secs, samples)
    });
    let read = read?;
    let samples = samples?;
    let mut restarted = Restarted {
        kind,
        prewarm_flag: place.features.prewarm_flag.then_some(kind.prewarm()),
        stop_lines: stop_lines
            .into_iter()
            .filter(|l| l.starts_with("l2arc:") && (l.contains("stop") || l.contains("flush")))
            .collect(),
        stop_secs,
        ready_secs,
        fio_start_secs,
        hit_ratio_first_10s: hit_ratio(&samples, HIT_WINDOW_SECS),
        hit_ratio_first_1s: hit_ratio(&samples, 1.0),
        secs_to_90pct: None,
        primary_reads_in_window: samples.last().map_or(0, |s| s.get("primary_reads")),
        prewarm: samples.last().and_then(prewarm_of),
        iops_per_second: read.iops_per_second,
        samples,
    };
    restarted.secs_to_90pct = secs_to_90pct(&restarted, warm_iops);
    Ok((server, restarted))
}

/// `l2arc ctl stats` each second from the ready line until `done`.
fn poll(control: &Path, ready: Instant, done: &AtomicBool) -> Result<Vec<Sample>> {
    let mut samples = Vec::new();
    let mut next = Duration::ZERO;
    while !done.load(Ordering::Relaxed) && samples.len() < SAMPLES_MAX {
        let now = ready.elapsed();
        if now < next {
            std::thread::sleep((next - now).min(Duration::from_millis(100)));
            continue;
        }
        let secs = ready.elapsed().as_secs_f64();
        let stats = ctl_stats(control)?;
        samples.push(Sample {
            secs,
            counters: POLLED
                .iter()
                .map(|n| (n.to_string(), get(&stats, n)))
                .collect(),
        });
        next += Duration::from_secs(1);
    }
    // The counters at the end of the window (fio has finished).
    let stats = ctl_stats(control)?;
    samples.push(Sample {
        secs: ready.elapsed().as_secs_f64(),
        counters: POLLED
            .iter()
            .map(|n| (n.to_string(), get(&stats, n)))
            .collect(),
    });
    Ok(samples)
}

/// Hits over hits and misses, counted from the start, at the first sample
/// at or past `secs`.
fn hit_ratio(samples: &[Sample], secs: f64) -> Option<f64> {
    let s = samples.iter().find(|s| s.secs >= secs)?;
    let (hits, misses) = (s.get("hits"), s.get("misses"));
    (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64)
}

impl Prewarm {
    /// The table's cell: MiB, MiB/s, records per device read.
    fn cell(&self) -> String {
        format!(
            "{}, {}, {}",
            self.bytes >> 20,
            self.mib_per_sec.map_or("-".into(), |m| format!("{m:.0}")),
            match self.reads {
                0 => "-".to_string(),
                reads => format!("{:.1}", self.records as f64 / reads as f64),
            }
        )
    }
}

/// The prewarm's figures, when it ran.
fn prewarm_of(s: &Sample) -> Option<Prewarm> {
    let (records, bytes, ms) = (
        s.get("arc_prewarm_records"),
        s.get("arc_prewarm_bytes"),
        s.get("arc_prewarm_ms"),
    );
    (records > 0).then(|| Prewarm {
        records,
        bytes,
        ms,
        reads: s.get("arc_prewarm_reads"),
        mib_per_sec: (ms > 0).then(|| bytes as f64 / (1 << 20) as f64 / (ms as f64 / 1000.0)),
    })
}

/// The end of the first second from which `SUSTAINED_SECS` seconds hold
/// 90% of `warm_iops` on average, from the ready line: one second's spike
/// on a shared machine is not "warm".
fn secs_to_90pct(r: &Restarted, warm_iops: f64) -> Option<f64> {
    let iops = &r.iops_per_second;
    (0..iops.len())
        .find(|&i| {
            let window = &iops[i..(i + SUSTAINED_SECS).min(iops.len())];
            window.iter().sum::<f64>() / window.len() as f64 >= 0.9 * warm_iops
        })
        .map(|i| r.fio_start_secs + i as f64 + 1.0)
}

/// The full series (warm-up, every restart's seconds and samples) under
/// `target/bench-data/`, for plotting.
fn write_series(report: &Report) -> Result<PathBuf> {
    let dir = PathBuf::from("target/bench-data");
    std::fs::create_dir_all(&dir)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let path = dir.join(format!("restart-{stamp}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(report)?)?;
    Ok(path)
}

fn of(r: &Report, kind: Kind) -> Option<&Restarted> {
    r.restarts.iter().find(|x| x.kind == kind)
}

/// Seconds to 90% after a clean stop (goal 5 s) against the prewarm off;
/// after SIGKILL against the clean stop (goal 2x); primary reads after a
/// clean stop; the prewarm's rate against fio's sequential read.
fn headline(r: &Report) -> Vec<Headline> {
    let mut lines = Vec::new();
    let (Some(a), Some(b), Some(c)) = (of(r, Kind::Clean), of(r, Kind::Killed), of(r, Kind::Cold))
    else {
        return lines;
    };
    // Never within the window: the window's length plus one second.
    let never = r.after_secs + 1.0;
    let t = |x: &Restarted| x.secs_to_90pct.unwrap_or(never);
    let scale = format!(
        "{} MiB image, ARC {} MiB, emulated {}-spindle HDD, fio nbd QD{QUEUE_DEPTH} random 8 KiB 80/20",
        r.image_bytes >> 20,
        r.arc_max_bytes >> 20,
        r.hdd.spindles
    );
    lines.push(Headline::versus(
        "clean_secs_to_90pct",
        &format!("restart after SIGTERM, prewarm on: seconds from ready to 90% of the warm IOPS ({scale}; {never:.0} = not within the window)"),
        "s",
        (t(a), "the same restart with the prewarm off (OpenZFS)", t(c)),
        Goal::ours(false, 5.0),
    ));
    lines.push(Headline::versus(
        "kill_secs_to_90pct",
        &format!("restart after SIGKILL past a checkpoint, prewarm on: seconds to 90% of the warm IOPS ({scale})"),
        "s",
        (t(b), "after SIGTERM, prewarm on", t(a)),
        Goal::ratio_at_most(2.0),
    ));
    lines.push(Headline::versus(
        "clean_primary_reads",
        &format!(
            "restart after SIGTERM, prewarm on: primary reads in the first {:.0} s ({scale})",
            r.after_secs
        ),
        "reads",
        (
            a.primary_reads_in_window as f64,
            "the same restart with the prewarm off",
            c.primary_reads_in_window as f64,
        ),
        Goal::ours(false, 0.0),
    ));
    if let (Some(seq), Some(rate)) = (&r.seq_read, a.prewarm.as_ref().and_then(|p| p.mib_per_sec)) {
        lines.push(Headline::versus(
            "prewarm_mib_per_sec",
            "prewarm after SIGTERM: arc_prewarm_bytes / arc_prewarm_ms",
            "MiB/s",
            (
                rate,
                "fio io_uring sequential 1 MiB O_DIRECT QD8 on the same cache file, right after the stop",
                seq.mib_per_sec,
            ),
            Goal::ratio_at_least(0.8),
        ));
    }
    lines
}

fn print_report(r: &Report) {
    println!(
        "restart: random {} KiB reads ({}), fio nbd engine, queue depth {QUEUE_DEPTH}, {} MiB image on an emulated {}-spindle HDD ({}-{} ms), ARC {} MiB, cache file {} MiB, recordsize {} KiB; load before {}, after {}",
        r.read_bytes >> 10,
        r.distribution,
        r.image_bytes >> 20,
        r.hdd.spindles,
        r.hdd.seek_ms_min,
        r.hdd.seek_ms_max,
        r.arc_max_bytes >> 20,
        r.cache_bytes >> 20,
        r.recordsize_bytes >> 10,
        r.load_before,
        r.load_after
    );
    println!("ours: {}", r.command);
    println!("fio: {}", r.fio_command);
    if !(r.features.prewarm_flag && r.features.checkpoint_flag) {
        println!(
            "this l2arc has no --l2arc-prewarm / --l2arc-arc-checkpoint-secs: all three restarts ran without them (today's behaviour)"
        );
    }
    println!(
        "warm-up: {:.0} s, IOPS per 10 s: {}; warm {:.0} IOPS (median second of the last chunk), ARC hit ratio {}",
        r.warm_secs,
        means(&r.warm_iops_per_second, 10),
        r.warm_iops,
        r.warm_hit_ratio
            .map_or("-".into(), |h| format!("{:.1}%", 100.0 * h))
    );
    if let Some(seq) = &r.seq_read {
        println!(
            "cache file read sequentially right after the SIGTERM: {:.0} MiB/s over {} MiB ({})",
            seq.mib_per_sec,
            seq.size_bytes >> 20,
            seq.command
        );
    }
    println!();
    print_restarts(r);
}

/// One row per restart, the stop lines, the prewarm's rate and the legend.
fn print_restarts(r: &Report) {
    println!(
        "{:<26} {:>7} {:>7} {:>8} {:>9} {:>10} {:>9} {:>10} {:>24}  IOPS per 5 s from the ready line",
        "restart",
        "stop s",
        "ready s",
        "hits 1s",
        "hits 10s",
        "ARC MiB 10s",
        "to 90% s",
        "prim reads",
        "prewarm MiB, MiB/s, rec/rd"
    );
    for x in &r.restarts {
        let prewarm = x.prewarm.as_ref().map_or("-".into(), Prewarm::cell);
        let arc_10s = x
            .samples
            .iter()
            .find(|s| s.secs >= HIT_WINDOW_SECS)
            .map_or("-".into(), |s| format!("{}", s.get("size") >> 20));
        let ratio = |r: Option<f64>| r.map_or("-".into(), |h| format!("{:.1}%", 100.0 * h));
        println!(
            "{:<26} {:>7.1} {:>7.2} {:>8} {:>9} {:>10} {:>9} {:>10} {:>24}  {}",
            x.kind.name(),
            x.stop_secs,
            x.ready_secs,
            ratio(x.hit_ratio_first_1s),
            ratio(x.hit_ratio_first_10s),
            arc_10s,
            x.secs_to_90pct
                .map_or("never".into(), |t| format!("{t:.0}")),
            x.primary_reads_in_window,
            prewarm,
            means(&x.iops_per_second, 5)
        );
    }
    for x in &r.restarts {
        for line in &x.stop_lines {
            if !line.contains("stopped:") || line.contains("flush") {
                println!("{} stop: {line}", x.kind.name());
            }
        }
    }
    if let (Some(seq), Some(rate)) = (
        &r.seq_read,
        of(r, Kind::Clean)
            .and_then(|a| a.prewarm.as_ref())
            .and_then(|p| p.mib_per_sec),
    ) {
        println!(
            "prewarm after SIGTERM: {rate:.0} MiB/s, {:.2}x fio's sequential read of the cache file (goal 0.8x)",
            rate / seq.mib_per_sec.max(f64::MIN_POSITIVE)
        );
    }
    println!(
        "hits 1s, 10s: the ARC's hits over hits and misses in the first second and the first {HIT_WINDOW_SECS:.0} s (counted from the start); ARC MiB 10s: its size then; to 90%: the end of the first second from which {SUSTAINED_SECS} s hold 90% of the warm IOPS on average, from the ready line (the socket accepting); prim reads: primary reads in the {:.0} s window",
        r.after_secs
    );
    if let Some(path) = &r.series_path {
        println!("series: {}", path.display());
    }
}

/// Means of `chunk` seconds each, as `0s N, 5s N, ...`.
fn means(series: &[f64], chunk: usize) -> String {
    series
        .chunks(chunk)
        .enumerate()
        .map(|(i, c)| {
            format!(
                "{}s {:.0}",
                i * chunk,
                c.iter().sum::<f64>() / c.len() as f64
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `--scenario restart`.
pub(crate) struct Restart;

impl Scenario for Restart {
    fn name(&self) -> &'static str {
        "restart"
    }
    fn measures(&self) -> &'static str {
        "Restart of the NBD export, warm, three ways (SIGTERM + prewarm, SIGKILL + checkpoint + prewarm, SIGTERM without prewarm): IOPS per second for 60 s from the ready line, hit ratio of the first 10 s, seconds to 90% of the warm IOPS, primary reads; the prewarm's rate against fio's sequential read of the cache file (random 8 KiB 80/20, QD20, emulated HDD; needs fio)."
    }
    fn run(&self, args: &BenchArgs) -> Result<Outcome> {
        run(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(secs: f64, hits: u64, misses: u64) -> Sample {
        Sample {
            secs,
            counters: vec![("hits".into(), hits), ("misses".into(), misses)],
        }
    }

    fn restarted(fio_start_secs: f64, iops: &[f64]) -> Restarted {
        Restarted {
            kind: Kind::Clean,
            prewarm_flag: Some(true),
            stop_lines: Vec::new(),
            stop_secs: 0.0,
            ready_secs: 0.0,
            fio_start_secs,
            iops_per_second: iops.to_vec(),
            hit_ratio_first_10s: None,
            hit_ratio_first_1s: None,
            secs_to_90pct: None,
            primary_reads_in_window: 0,
            prewarm: None,
            samples: Vec::new(),
        }
    }

    #[test]
    fn time_to_90pct_counts_from_the_ready_line_to_the_end_of_the_second() {
        let r = restarted(0.25, &[100.0, 800.0, 899.0, 900.0, 1000.0]);
        // From the third second the mean of 899, 900 and 1000 is 933.
        assert_eq!(secs_to_90pct(&r, 1000.0), Some(3.25));
        assert_eq!(secs_to_90pct(&r, 2000.0), None);
        assert_eq!(secs_to_90pct(&restarted(0.0, &[950.0]), 1000.0), Some(1.0));
        // A one-second spike is not warm.
        let spike = restarted(0.0, &[1000.0, 100.0, 100.0, 950.0, 950.0, 950.0]);
        assert_eq!(secs_to_90pct(&spike, 1000.0), Some(4.0));
    }

    #[test]
    fn hit_ratio_is_the_first_sample_at_or_past_the_window() {
        let samples = [
            sample(0.0, 0, 0),
            sample(9.9, 10, 90),
            sample(10.1, 30, 70),
            sample(20.0, 99, 1),
        ];
        assert_eq!(hit_ratio(&samples, 10.0), Some(0.3));
        assert_eq!(hit_ratio(&samples, 30.0), None);
        assert_eq!(hit_ratio(&[sample(11.0, 0, 0)], 10.0), None);
    }

    #[test]
    fn prewarm_rate_is_bytes_over_its_own_milliseconds() {
        let s = Sample {
            secs: 60.0,
            counters: vec![
                ("arc_prewarm_records".into(), 1024),
                ("arc_prewarm_bytes".into(), 128 << 20),
                ("arc_prewarm_ms".into(), 500),
            ],
        };
        let p = prewarm_of(&s).expect("the prewarm ran");
        assert_eq!(p.mib_per_sec, Some(256.0));
        assert!(
            prewarm_of(&sample(60.0, 1, 1)).is_none(),
            "no prewarm, no rate"
        );
    }

    #[test]
    fn means_group_the_seconds() {
        assert_eq!(means(&[1.0, 3.0, 5.0, 7.0, 9.0], 2), "0s 2, 2s 6, 4s 9");
    }
}
