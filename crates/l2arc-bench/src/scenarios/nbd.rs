//! `l2arc bench --scenario nbd`: our NBD export against nbdkit's cache
//! filter, side by side, over the same image and the same slow disk.
//!
//! Both servers export one image (random content) to fio's nbd engine,
//! which reads random 4 KiB blocks (the demo's skew: by default 80% of the
//! reads go to 20% of the image, fio's `zoned` distribution), first cold
//! and then warm, for `--seconds` each, with the same random seeds on both
//! sides. Reported: IOPS and p50/p99 latency of each phase, and ours over
//! nbdkit.
//!
//! The same slow disk on both sides:
//! - nbdkit: `--filter=cache --filter=delay file IMAGE delay-read=X`: the
//!   cache filter sits above the delay filter (the first filter named is the
//!   outermost), so only its misses pay the delay; `cache-on-read=true`
//!   (it caches only writes otherwise), `cache-min-block-size=4K` (it reads
//!   4 KiB from below per miss, as we do with `recordsize=4K`), and
//!   `cache-max-size` = our `arc_max` + cache file size, the same capacity.
//!   Its cache is a temporary file in `$TMPDIR`, which we point at the
//!   bench directory, the disk our cache file is on (that file goes through
//!   the page cache, ours uses O_DIRECT: a difference of design, not set-up).
//! - ours: `--emulate-hdd-seek-ms-min X --emulate-hdd-seek-ms-max X` (a
//!   fixed X ms per primary read, the delay filter's model) plus the
//!   emulated media transfer at 150 MiB/s (26 µs per 4 KiB, 0.3% of 8 ms).
//!   The emulator serialises requests per spindle, which nbdkit's delay
//!   filter does not: we give it one spindle per 1 MiB stripe of the image,
//!   so two reads share a disk only when they fall in the same MiB.
//! - parallelism: fio keeps `--threads` requests in flight on one
//!   connection; nbdkit runs `--threads` worker threads and ours as many
//!   workers per connection.
//!
//! `X` is the middle of `--seek-ms-min` and `--seek-ms-max` (8 ms by
//! default).
//!
//! A third measurement, nbdkit with the delay filter alone (no cache, one
//! cold phase), is the disk's own parallel rate: it shows what the cache
//! adds on each side. (nbdkit's cache filter serialises requests under one
//! lock, so with it a queue of misses is served one delay at a time; that
//! is most of the cold-phase difference, and it is nbdkit's design, not
//! this set-up: the delay filter alone serves the queue in parallel.)
//! The default run takes about 5 × `--seconds` plus set-up.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::BenchArgs;
use crate::fio::{FioJob, FioTarget};

use super::{Goal, Headline, Outcome, Scenario};

const BLOCK_BYTES: u64 = 4096;
const STRIPE_BYTES: u64 = 1 << 20;

#[derive(Serialize, Clone, Copy, Debug)]
struct Phase {
    iops: f64,
    latency_us_p50: f64,
    latency_us_p99: f64,
}

#[derive(Serialize)]
struct Row {
    phase: &'static str,
    ours: Phase,
    nbdkit: Phase,
    iops_ratio: f64,
    p50_ratio: f64,
    p99_ratio: f64,
}

#[derive(Serialize)]
struct Report {
    scenario: &'static str,
    image_bytes: u64,
    block_bytes: u64,
    delay_ms: f64,
    queue_depth: usize,
    seconds_per_phase: f64,
    arc_max_bytes: u64,
    cache_bytes: u64,
    distribution: String,
    ours_command: String,
    nbdkit_command: String,
    fio_command: String,
    rows: Vec<Row>,
    /// nbdkit with the delay filter only: the uncached disk, for reference.
    nbdkit_no_cache: Phase,
    /// Our cache's statistics after the run (arcstats names).
    ours_stats: Vec<(String, u64)>,
}

/// Fails with a clear message unless every one of `tools` runs.
pub(crate) fn require_tools(scenario: &str, tools: &[&str]) -> Result<()> {
    for tool in tools {
        match Command::new(tool).arg("--version").output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => bail!(
                "{tool} --version failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(_) => bail!(
                "{tool} is not installed: --scenario {scenario} needs {} (scripts/setup.sh installs them)",
                tools.join(", ")
            ),
        }
    }
    Ok(())
}

/// The scenario's image, `name` in `--data` (reused when it has the right
/// size) or in `tmp`: `--dataset-size` in whole `unit_bytes`, at least
/// 16 MiB.
pub(crate) fn scenario_image(
    args: &BenchArgs,
    tmp: &Path,
    scenario: &str,
    name: &str,
    unit_bytes: u64,
) -> Result<(PathBuf, u64)> {
    let image_bytes = args.dataset_size / unit_bytes * unit_bytes;
    if image_bytes < 16 << 20 {
        bail!("--dataset-size must be at least 16 MiB for --scenario {scenario}");
    }
    let dir = args.data.as_deref().unwrap_or(tmp);
    std::fs::create_dir_all(dir)?;
    let image = dir.join(name);
    make_image(&image, image_bytes, args.seed)?;
    Ok((image, image_bytes))
}

/// The image: reused when `--data DIR` holds one of the right size.
pub(crate) fn make_image(path: &Path, size_bytes: u64, seed: u64) -> Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| m.len() == size_bytes) {
        return Ok(());
    }
    let mut file = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?,
    );
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut chunk = vec![0u8; 1 << 20];
    let mut written = 0u64;
    while written < size_bytes {
        for word in chunk.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word.copy_from_slice(&x.to_le_bytes());
        }
        let n = (size_bytes - written).min(chunk.len() as u64) as usize;
        file.write_all(&chunk[..n])?;
        written += n as u64;
    }
    // On disk before any pass: an image at rest, as a user's is. Left
    // dirty, the kernel wrote it back during the first pass, on the disk
    // that also holds the cache file, and the feeder's writes took twice
    // as long (the re-read's pass 2 fell from 97% to 51-65%).
    file.into_inner()?.sync_all()?;
    Ok(())
}

/// A server process, killed on drop.
pub(crate) struct ServerProcess {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ServerProcess {
    /// CPU time (user + system) the process has used so far, in seconds.
    pub(crate) fn cpu_secs(&self) -> Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))?;
        // Fields after the command name (which may hold spaces): state is
        // field 3, utime 14 and stime 15.
        let rest = stat.rsplit_once(") ").context("malformed /proc stat")?.1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| -> Result<f64> {
            Ok(fields
                .get(i - 3)
                .context("short /proc stat")?
                .parse::<f64>()?)
        };
        // SAFETY: sysconf has no preconditions.
        let ticks_per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        Ok((ticks(14)? + ticks(15)?) / ticks_per_sec)
    }

    /// Stops with SIGTERM (ours prints its statistics then).
    pub(crate) fn stop(mut self) -> Vec<String> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(50));
        self.lines.try_iter().collect()
    }
}

pub(crate) fn spawn(mut cmd: Command) -> Result<ServerProcess> {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("start {cmd:?}"))?;
    let stderr = child.stderr.take().context("no stderr")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    Ok(ServerProcess { child, lines: rx })
}

/// Waits until something accepts connections on `socket`.
pub(crate) fn wait_for_socket(server: &mut ServerProcess, socket: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Ok(());
        }
        if let Some(status) = server.child.try_wait()? {
            let lines: Vec<String> = server.lines.try_iter().collect();
            bail!("server exited ({status}): {}", lines.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("no server on {} after 30 s", socket.display())
}

/// The fio job both servers are read with (the same on each side but
/// for the export's address).
struct Fio {
    size_bytes: u64,
    queue_depth: usize,
    secs: f64,
    distribution: String,
}

/// fio's nbd engine reading the export at `uri` at random, 4 KiB a read,
/// over its first `size_bytes`, `queue_depth` in flight, for `secs` (the
/// job every NBD scenario measures with).
pub(crate) fn nbd_randread(
    name: &'static str,
    uri: &str,
    (size_bytes, queue_depth): (u64, usize),
    secs: f64,
    seed: u64,
) -> FioJob {
    FioJob::new(
        name,
        "nbd",
        FioTarget::NbdUri(uri.to_string()),
        "randread",
        BLOCK_BYTES,
        secs.ceil().max(1.0) as u64,
    )
    .size_bytes(size_bytes)
    .iodepth(queue_depth)
    .seed(seed)
}

impl Fio {
    fn job(&self, uri: &str, seed: u64) -> FioJob {
        nbd_randread(
            "nbd",
            uri,
            (self.size_bytes, self.queue_depth),
            self.secs,
            seed,
        )
        .random_distribution(&self.distribution)
    }

    fn run(&self, dir: &Path, uri: &str, seed: u64) -> Result<Phase> {
        let read = self.job(uri, seed).run(Some(dir))?;
        Ok(Phase {
            iops: read.iops,
            latency_us_p50: read.latency_us_p50,
            latency_us_p99: read.latency_us_p99,
        })
    }
}

pub(crate) fn shell_words(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) fn run(args: &BenchArgs) -> Result<Outcome> {
    require_tools("nbd", &["fio", "nbdkit"])?;
    let bench = NbdBench::prepare(args)?;
    let ours = bench.measure_ours(args)?;
    let nbdkit = bench.measure_nbdkit(args)?;
    let nbdkit_no_cache = bench.measure_uncached_nbdkit()?;
    let row = |phase, ours: Phase, nbdkit: Phase| Row {
        phase,
        ours,
        nbdkit,
        iops_ratio: ours.iops / nbdkit.iops.max(f64::MIN_POSITIVE),
        p50_ratio: ours.latency_us_p50 / nbdkit.latency_us_p50.max(f64::MIN_POSITIVE),
        p99_ratio: ours.latency_us_p99 / nbdkit.latency_us_p99.max(f64::MIN_POSITIVE),
    };
    let report = Report {
        scenario: "nbd",
        image_bytes: bench.image_bytes,
        block_bytes: BLOCK_BYTES,
        delay_ms: bench.delay_ms,
        queue_depth: bench.queue_depth,
        seconds_per_phase: args.seconds,
        arc_max_bytes: args.arc_max,
        cache_bytes: args.cache_size,
        distribution: bench.fio.distribution.clone(),
        ours_command: ours.command,
        nbdkit_command: nbdkit.command,
        fio_command: bench.fio.job("URI", bench.seeds[0]).command_line(),
        rows: vec![
            row("cold", ours.cold, nbdkit.cold),
            row("warm", ours.warm, nbdkit.warm),
        ],
        nbdkit_no_cache,
        ours_stats: ours.stats,
    };
    let headline = report
        .rows
        .iter()
        .filter(|r| r.phase == "warm")
        .map(|r| {
            Headline::versus(
                "warm_iops",
                &format!(
                    "NBD export over a delayed disk, warm, random 4 KiB QD{}",
                    report.queue_depth
                ),
                "IOPS",
                (
                    r.ours.iops,
                    "nbdkit cache filter, same delayed disk",
                    r.nbdkit.iops,
                ),
                Goal::ratio_at_least(1.0),
            )
        })
        .collect();
    Outcome::new(report, headline, print_report)
}

/// The run's set-up: the image, the emulated disk's delay, the fio job.
struct NbdBench {
    /// Sockets, our cache file and nbdkit's cache live here.
    tmp: tempfile::TempDir,
    image: PathBuf,
    image_bytes: u64,
    delay_ms: f64,
    queue_depth: usize,
    fio: Fio,
    /// The cold phase's, then the warm phase's (the same on both sides).
    seeds: [u64; 2],
}

/// One server measured cold, then warm.
struct Measured {
    cold: Phase,
    warm: Phase,
    /// How the server was started.
    command: String,
    /// Its statistics when it stopped (ours only).
    stats: Vec<(String, u64)>,
}

impl NbdBench {
    /// Checks the flags and writes the image (or finds it in `--data`).
    fn prepare(args: &BenchArgs) -> Result<Self> {
        let delay_ms = (args.seek_ms_min + args.seek_ms_max) / 2.0;
        if !(delay_ms.is_finite() && delay_ms >= 0.0) {
            bail!("--seek-ms-min/--seek-ms-max must give a delay of at least 0 ms");
        }
        let image_bytes = args.dataset_size / BLOCK_BYTES * BLOCK_BYTES;
        if image_bytes < 16 * STRIPE_BYTES {
            bail!("--dataset-size must be at least 16 MiB for --scenario nbd");
        }
        let tmp = tempfile::Builder::new()
            .prefix("l2arc-bench-nbd")
            .tempdir()?;
        let image: PathBuf = match &args.data {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                dir.join("nbd-bench.img")
            }
            None => tmp.path().join("nbd-bench.img"),
        };
        eprintln!(
            "l2arc bench nbd: image {} ({} MiB)",
            image.display(),
            image_bytes >> 20
        );
        make_image(&image, image_bytes, args.seed)?;
        let fio = Fio {
            size_bytes: image_bytes,
            queue_depth: args.threads,
            secs: args.seconds,
            distribution: distribution(args.hot_read_fraction, args.hot_data_fraction),
        };
        Ok(Self {
            tmp,
            image,
            image_bytes,
            delay_ms,
            queue_depth: args.threads,
            fio,
            seeds: [args.seed, args.seed.wrapping_add(1)],
        })
    }

    /// `l2arc serve-nbd` over the image on the emulated disk.
    fn measure_ours(&self, args: &BenchArgs) -> Result<Measured> {
        let socket = self.tmp.path().join("l2arc.sock");
        let cache_file = match args.cache.first() {
            Some(p) => p.clone(),
            None => self.tmp.path().join("l2arc-cache.bin"),
        };
        let cmd = self.ours_command(args, &socket, &cache_file)?;
        let command = shell_words(&cmd);
        let mut server = spawn(cmd)?;
        wait_for_socket(&mut server, &socket)?;
        let (cold, warm) = self.cold_then_warm("ours", &socket, args.seconds)?;
        let stats = server_stats(&server.stop());
        if args.cache.is_empty() {
            let _ = std::fs::remove_file(&cache_file);
        }
        Ok(Measured {
            cold,
            warm,
            command,
            stats,
        })
    }

    fn ours_command(&self, args: &BenchArgs, socket: &Path, cache_file: &Path) -> Result<Command> {
        let spindles = (self.image_bytes / STRIPE_BYTES).clamp(1, 65_536);
        let delay_ms = self.delay_ms;
        let mut cmd = Command::new(crate::sibling_binary("l2arc")?);
        cmd.arg("serve-nbd")
            .arg(&self.image)
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .args(["--recordsize", "4K"])
            .arg(format!("--arc-max={}", args.arc_max))
            .arg(format!("--cache={}", cache_file.display()))
            .arg(format!("--cache-size={}", args.cache_size))
            .arg(format!("--compression={}", args.compression))
            .arg(format!("--workers={}", self.queue_depth))
            .arg(format!("--emulate-hdd-spindles={spindles}"))
            .arg(format!("--emulate-hdd-seek-ms-min={delay_ms}"))
            .arg(format!("--emulate-hdd-seek-ms-max={delay_ms}"));
        if let Some(shards) = args.arc_shards {
            cmd.arg(format!("--arc-shards={shards}"));
        }
        Ok(cmd)
    }

    /// nbdkit's cache filter over its delay filter, with our capacity.
    fn measure_nbdkit(&self, args: &BenchArgs) -> Result<Measured> {
        let socket = self.tmp.path().join("nbdkit.sock");
        let kit_tmp = self.tmp.path().join("nbdkit-tmp");
        std::fs::create_dir_all(&kit_tmp)?;
        let cmd = self.nbdkit_command(&socket, Some((&kit_tmp, args.arc_max + args.cache_size)));
        let command = shell_words(&cmd);
        let mut server = spawn(cmd)?;
        wait_for_socket(&mut server, &socket)?;
        let (cold, warm) = self.cold_then_warm("nbdkit", &socket, args.seconds)?;
        server.stop();
        Ok(Measured {
            cold,
            warm,
            command,
            stats: Vec::new(),
        })
    }

    /// nbdkit without its cache: the delayed disk alone, one cold phase.
    fn measure_uncached_nbdkit(&self) -> Result<Phase> {
        let socket = self.tmp.path().join("nbdkit-plain.sock");
        let mut server = spawn(self.nbdkit_command(&socket, None))?;
        wait_for_socket(&mut server, &socket)?;
        eprintln!(
            "l2arc bench nbd: nbdkit without cache ({} s)",
            self.fio.secs
        );
        let phase = self
            .fio
            .run(self.tmp.path(), &nbd_uri(&socket), self.seeds[0])?;
        server.stop();
        Ok(phase)
    }

    /// nbdkit's file plugin under its delay filter; with `cache` (its
    /// temporary directory and `cache-max-size`), under the cache filter too.
    fn nbdkit_command(&self, socket: &Path, cache: Option<(&Path, u64)>) -> Command {
        let mut cmd = Command::new("nbdkit");
        if let Some((kit_tmp, _)) = cache {
            cmd.env("TMPDIR", kit_tmp);
        }
        cmd.args(["-f", "-U"])
            .arg(socket)
            .arg(format!("--threads={}", self.queue_depth));
        if cache.is_some() {
            cmd.arg("--filter=cache");
        }
        cmd.args(["--filter=delay", "file"])
            .arg(format!("file={}", self.image.display()));
        if let Some((_, max_size_bytes)) = cache {
            cmd.arg("cache-on-read=true")
                .arg(format!("cache-min-block-size={BLOCK_BYTES}"))
                .arg(format!("cache-max-size={max_size_bytes}"));
        }
        cmd.arg(if self.delay_ms.fract() == 0.0 {
            format!("delay-read={}ms", self.delay_ms as u64)
        } else {
            format!("delay-read={}", self.delay_ms / 1000.0)
        });
        cmd
    }

    /// fio against the server on `socket`: cold, then warm.
    fn cold_then_warm(&self, name: &str, socket: &Path, seconds: f64) -> Result<(Phase, Phase)> {
        let uri = nbd_uri(socket);
        eprintln!("l2arc bench nbd: {name}, cold ({seconds} s)");
        let cold = self.fio.run(self.tmp.path(), &uri, self.seeds[0])?;
        eprintln!("l2arc bench nbd: {name}, warm ({seconds} s)");
        let warm = self.fio.run(self.tmp.path(), &uri, self.seeds[1])?;
        Ok((cold, warm))
    }
}

fn nbd_uri(socket: &Path) -> String {
    format!("nbd+unix:///?socket={}", socket.display())
}

/// fio's `--random_distribution` for the demo's skew: `zoned` with
/// `hot_read` of the reads to `hot_data` of the image (uniform when either
/// share is 0 or 1).
fn distribution(hot_read_fraction: f64, hot_data_fraction: f64) -> String {
    let hot_read = (hot_read_fraction * 100.0).round() as u32;
    let hot_data = (hot_data_fraction * 100.0).round() as u32;
    if hot_read == 0 || hot_data == 0 || hot_read >= 100 || hot_data >= 100 {
        "random".to_string()
    } else {
        format!(
            "zoned:{hot_read}/{hot_data}:{}/{}",
            100 - hot_read,
            100 - hot_data
        )
    }
}

/// Our server's statistics from the lines it printed when it stopped
/// (`name value`, arcstats names).
pub(crate) fn server_stats(lines: &[String]) -> Vec<(String, u64)> {
    lines
        .iter()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (name, value) = (it.next()?, it.next()?);
            if it.next().is_some() || name.starts_with("l2arc:") {
                return None;
            }
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

fn print_report(r: &Report) {
    println!(
        "NBD export: l2arc serve-nbd vs nbdkit --filter=cache --filter=delay; {} MiB image, random {} KiB reads ({}), queue depth {}, {} ms per disk read, {} s per phase",
        r.image_bytes >> 20,
        r.block_bytes >> 10,
        r.distribution,
        r.queue_depth,
        r.delay_ms,
        r.seconds_per_phase
    );
    println!(
        "cache: ARC {} MiB + cache file {} MiB (nbdkit: cache-max-size {} MiB)",
        r.arc_max_bytes >> 20,
        r.cache_bytes >> 20,
        (r.arc_max_bytes + r.cache_bytes) >> 20
    );
    println!();
    println!(
        "{:<6} {:>10} {:>10} {:>7}   {:>9} {:>9} {:>7}   {:>9} {:>9} {:>7}",
        "phase",
        "ours IOPS",
        "nbdkit",
        "ratio",
        "ours p50",
        "nbdkit",
        "ratio",
        "ours p99",
        "nbdkit",
        "ratio"
    );
    for row in &r.rows {
        println!(
            "{:<6} {:>10.0} {:>10.0} {:>6.2}x   {:>7.0}us {:>7.0}us {:>6.2}x   {:>7.0}us {:>7.0}us {:>6.2}x",
            row.phase,
            row.ours.iops,
            row.nbdkit.iops,
            row.iops_ratio,
            row.ours.latency_us_p50,
            row.nbdkit.latency_us_p50,
            row.p50_ratio,
            row.ours.latency_us_p99,
            row.nbdkit.latency_us_p99,
            row.p99_ratio
        );
    }
    let stat = |name: &str| {
        r.ours_stats
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| *v)
    };
    println!(
        "uncached disk (nbdkit --filter=delay alone): {:.0} IOPS, p50 {:.0}us, p99 {:.0}us",
        r.nbdkit_no_cache.iops, r.nbdkit_no_cache.latency_us_p50, r.nbdkit_no_cache.latency_us_p99
    );
    println!();
    println!(
        "ours: arc hits {} misses {}, l2 hits {} misses {}",
        stat("hits"),
        stat("misses"),
        stat("l2_hits"),
        stat("l2_misses")
    );
    println!("ours:   {}", r.ours_command);
    println!("nbdkit: {}", r.nbdkit_command);
    println!("fio:    {}", r.fio_command);
}

/// `--scenario nbd`.
pub(crate) struct Nbd;

impl Scenario for Nbd {
    fn name(&self) -> &'static str {
        "nbd"
    }
    fn measures(&self) -> &'static str {
        "NBD export: l2arc serve-nbd against nbdkit's cache filter over the same delayed image (needs fio, nbdkit)."
    }
    fn run(&self, args: &BenchArgs) -> Result<Outcome> {
        run(args)
    }
}
