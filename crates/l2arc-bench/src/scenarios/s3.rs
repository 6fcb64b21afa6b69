//! `--scenario s3`: l2arc mount against rclone mount --vfs-cache-mode full
//! (and mountpoint-s3 when its binary is given) over the same bucket.
//!
//! What a cache in front of a bucket is for: fewer GETs (each costs 20-100
//! ms and money), fast warm reads, and no cold start after a restart. So
//! every system reads the same objects from one versitygw server through
//! one delay proxy (l2arc-testkit: 20-50 ms added to every request), with
//! the same budgets (DRAM: `--arc-max` for l2arc, the same for rclone's
//! read buffers; disk: `--cache-size` for the L2ARC device and rclone's
//! `--vfs-cache-max-size`), and we measure, one system after the other:
//!
//! - cold: every object read once in order (cp-like), MiB/s, page cache
//!   dropped first;
//! - GETs per GiB served in that pass, counted by the proxy (the same
//!   counter for every system);
//! - warm: random 4 KiB reads (fio, psync, 4 jobs, O_DIRECT so that the
//!   page cache does not stand in for either cache): IOPS and p99;
//! - restart: unmount, mount again with the same cache device or cache
//!   directory, and read everything once: seconds from the start of the
//!   mount to the last byte, and GETs during it.
//!
//! `--scenario s3-defaults` is the comparison a new user makes (issue 33):
//! both systems at their default settings, l2arc with no `arc_max` (its
//! default: `auto` where the tree has it, the ARC growing into free
//! memory) and rclone with no `--buffer-size` or `--vfs-cache-max-size`,
//! over a working set larger than the old fixed `arc_max` (4 GiB by
//! default, well within this machine's free memory), and the page cache
//! left warm before the warm reads on both sides (rclone's cache file is
//! read through the page cache; dropping it first measured rclone from
//! its disk, which no user of it sees). Cold, GETs and warm are measured;
//! the restart is `--scenario restart`'s business and is left out (a
//! second 4 GiB pass per system). The L2ARC device is the working set
//! plus a quarter (a sparse file: only what the feeder writes takes
//! space).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use l2arc::primary::object_store::{ObjectStoreConfig, ObjectStorePrimary, S3Location};
use l2arc::{Cache, CacheConfig, DatasetConfig};
use l2arc_fuse::{MountOptions, ObjectFs, ObjectFsOptions};
use l2arc_testkit::s3::{ACCESS_KEY, FaultProxy, S3Server, SECRET_KEY};

use crate::BenchArgs;

use super::{Goal, Headline, Outcome, Scenario};
use crate::fio::{FioJob, FioTarget};

const BUCKET: &str = "bench";
const DELAY_MS: (u64, u64) = (20, 50);
const DEFAULT_RUN_SECS: f64 = 8.0;
/// Seconds left to the feeder (l2arc) or the cache writer (rclone) after
/// the cold pass, before the restart.
const SETTLE_SECS: u64 = 3;

#[derive(serde::Serialize)]
struct Measured {
    system: String,
    cold_mib_per_sec: f64,
    cold_gets_per_gib: f64,
    warm_iops: f64,
    warm_p99_us: f64,
    /// Not measured by `s3-defaults`.
    restart_secs: Option<f64>,
    restart_gets: Option<u64>,
}

/// Which comparison: the fixed budgets of `s3`, or both systems at their
/// defaults (`s3-defaults`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Mode {
    /// The same DRAM and disk budgets on both sides, page cache dropped
    /// before the warm reads, restart measured.
    Budgets,
    /// Default settings on both sides, page cache warm, no restart.
    Defaults,
}

/// A mounted system under test.
trait System {
    fn name(&self) -> String;
    fn mount(&mut self, mnt: &Path) -> Result<()>;
    fn unmount(&mut self, mnt: &Path) -> Result<()>;
}

struct L2arcSystem {
    endpoint: String,
    device: PathBuf,
    /// None: the library's default (`auto` where the tree has it).
    arc_max_bytes: Option<u64>,
    cache_bytes: u64,
    recordsize_bytes: u32,
    mounted: Option<(l2arc_fuse::MountGuard, Arc<Cache>)>,
}

impl System for L2arcSystem {
    fn name(&self) -> String {
        let arc_max = match self.arc_max_bytes {
            Some(bytes) => format!("{} MiB", bytes >> 20),
            None => "default".to_string(),
        };
        format!(
            "l2arc (arc_max {arc_max}, L2ARC {} MiB, recordsize {} KiB)",
            self.cache_bytes >> 20,
            self.recordsize_bytes >> 10
        )
    }

    fn mount(&mut self, mnt: &Path) -> Result<()> {
        let mut config = ObjectStoreConfig::s3(&S3Location {
            bucket: BUCKET.into(),
            endpoint: Some(self.endpoint.clone()),
            region: Some("us-east-1".into()),
            ..S3Location::default()
        });
        config.options.extend(
            [
                ("access_key_id", ACCESS_KEY),
                ("secret_access_key", SECRET_KEY),
                ("disable_config_load", "true"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        let store = Arc::new(ObjectStorePrimary::new(config)?);
        store.check()?;
        let mut cache_config = match self.arc_max_bytes {
            Some(bytes) => CacheConfig::default().arc_max_bytes(bytes),
            None => CacheConfig::default(),
        };
        // As `l2arc mount s3://` does: read-ahead records go to flash too.
        cache_config.l2arc.l2arc_noprefetch = false;
        let cache = Cache::new(cache_config)?;
        cache.add_cache_path(&self.device, Some(self.cache_bytes))?;
        let dataset = cache.add_dataset(
            "s3",
            Arc::clone(&store) as Arc<dyn l2arc::primary::Primary>,
            DatasetConfig::default().recordsize_bytes(self.recordsize_bytes),
        )?;
        let fs = ObjectFs::new(
            Arc::clone(&cache),
            dataset,
            store,
            ObjectFsOptions::default(),
        )?;
        let guard = l2arc_fuse::MountGuard::mount_objects(fs, mnt, &MountOptions::default())?;
        self.mounted = Some((guard, cache));
        Ok(())
    }

    fn unmount(&mut self, _mnt: &Path) -> Result<()> {
        if let Some((guard, cache)) = self.mounted.take() {
            drop(guard);
            let wanted = [
                "hits",
                "misses",
                "primary_reads",
                "l2_hits",
                "l2_sector_hits",
                "l2_misses",
                "l2_size",
                "l2_write_bytes",
                "size",
                "c",
                "c_max",
                "evict_l2_eligible",
                "evict_l2_queued",
            ];
            let shown: Vec<String> = cache
                .stats()
                .kstats()
                .into_iter()
                .filter(|(n, _)| wanted.contains(n))
                .map(|(n, v)| format!("{n}={v}"))
                .collect();
            eprintln!("s3: l2arc at unmount: {}", shown.join(" "));
            let weak = Arc::downgrade(&cache);
            drop(cache);
            let deadline = Instant::now() + Duration::from_secs(20);
            while weak.strong_count() > 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(())
    }
}

struct RcloneSystem {
    endpoint: String,
    cache_dir: PathBuf,
    /// `--buffer-size` and `--vfs-cache-max-size`; None: rclone's
    /// defaults.
    budgets: Option<(u64, u64)>,
    child: Option<Child>,
}

impl System for RcloneSystem {
    fn name(&self) -> String {
        match self.budgets {
            Some((buffer_bytes, cache_bytes)) => format!(
                "rclone mount --vfs-cache-mode full (buffer {} MiB, vfs cache {} MiB)",
                buffer_bytes >> 20,
                cache_bytes >> 20
            ),
            None => "rclone mount --vfs-cache-mode full (defaults otherwise)".to_string(),
        }
    }

    fn mount(&mut self, mnt: &Path) -> Result<()> {
        let mut cmd = Command::new("rclone");
        cmd.args(["mount", &format!("bench:{BUCKET}")])
            .arg(mnt)
            .args(["--vfs-cache-mode", "full", "--read-only"])
            .arg("--cache-dir")
            .arg(&self.cache_dir);
        if let Some((buffer_bytes, cache_bytes)) = self.budgets {
            cmd.args(["--vfs-cache-max-size", &format!("{cache_bytes}")])
                .args(["--buffer-size", &format!("{buffer_bytes}")])
                .args(["--vfs-cache-max-age", "24h", "--dir-cache-time", "60s"])
                .args(["--attr-timeout", "60s"]);
        }
        let child = rclone_remote(&mut cmd, &self.endpoint)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.cache_dir.with_extension("log"))?)
            .spawn()
            .context("rclone (scripts/setup.sh installs it)")?;
        self.child = Some(child);
        wait_mounted(mnt, Duration::from_secs(30)).map_err(|e| {
            let log =
                std::fs::read_to_string(self.cache_dir.with_extension("log")).unwrap_or_default();
            anyhow::anyhow!("rclone mount: {e}: {}", log.trim())
        })
    }

    fn unmount(&mut self, mnt: &Path) -> Result<()> {
        let _ = Command::new("fusermount3").arg("-u").arg(mnt).status();
        if let Some(mut child) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(20);
            while child.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }
}

impl Drop for RcloneSystem {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn is_mounted(mnt: &Path) -> bool {
    l2arc_fuse::is_mounted(mnt).unwrap_or(false)
}

fn wait_mounted(mnt: &Path, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    while !is_mounted(mnt) {
        if Instant::now() > deadline {
            bail!("{} not mounted within {limit:?}", mnt.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Configures rclone's remote `bench:` as the S3 server at `endpoint`
/// with the test server's credentials (no config file).
pub(super) fn rclone_remote<'c>(cmd: &'c mut Command, endpoint: &str) -> &'c mut Command {
    // A CA bundle from the environment makes rclone 1.60 refuse to start
    // over plain HTTP ("unsupported transport").
    cmd.env_remove("AWS_CA_BUNDLE")
        .env("RCLONE_CONFIG_BENCH_TYPE", "s3")
        .env("RCLONE_CONFIG_BENCH_PROVIDER", "Other")
        .env("RCLONE_CONFIG_BENCH_ENDPOINT", endpoint)
        .env("RCLONE_CONFIG_BENCH_ACCESS_KEY_ID", ACCESS_KEY)
        .env("RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("RCLONE_CONFIG_BENCH_REGION", "us-east-1")
}

/// Reads every file whole, in order; the bytes read.
pub(super) fn read_all(files: &[PathBuf]) -> Result<u64> {
    let mut total = 0;
    for f in files {
        let mut file = std::fs::File::open(f).with_context(|| format!("{}", f.display()))?;
        total += std::io::copy(&mut file, &mut std::io::sink())?;
    }
    Ok(total)
}

fn warm_fio(files: &[PathBuf], secs: f64) -> Result<(f64, f64)> {
    let runtime_secs = secs.ceil().max(2.0) as u64;
    let read = FioJob::new(
        "s3warm",
        "psync",
        FioTarget::Files(files.to_vec()),
        "randread",
        4096,
        runtime_secs,
    )
    .readonly()
    .direct(true)
    .numjobs(4)
    .run(None)?;
    Ok((read.iops, read.latency_us_p99))
}

fn measure(
    system: &mut dyn System,
    (mnt, files, data_bytes): (&Path, &[PathBuf], u64),
    proxy: &FaultProxy,
    secs: f64,
    mode: Mode,
) -> Result<Measured> {
    let name = system.name();
    eprintln!("s3: {name}: cold pass");
    system.mount(mnt)?;
    super::fuse::drop_page_cache();
    let before = proxy.counts();
    let started = Instant::now();
    let read = read_all(files)?;
    let cold_secs = started.elapsed().as_secs_f64();
    assert_eq!(read, data_bytes, "short read through {name}");
    let cold_gets = proxy.counts().gets - before.gets;
    eprintln!("s3: {name}: warm random 4 KiB");
    read_all(files)?; // the second pass: everything the system keeps is in
    if mode == Mode::Budgets {
        super::fuse::drop_page_cache();
    }
    let (warm_iops, warm_p99_us) = warm_fio(files, secs)?;
    if mode == Mode::Defaults {
        system.unmount(mnt)?;
        return Ok(Measured {
            system: name,
            cold_mib_per_sec: data_bytes as f64 / cold_secs / (1 << 20) as f64,
            cold_gets_per_gib: cold_gets as f64 / (data_bytes as f64 / (1u64 << 30) as f64),
            warm_iops,
            warm_p99_us,
            restart_secs: None,
            restart_gets: None,
        });
    }
    std::thread::sleep(Duration::from_secs(SETTLE_SECS));
    system.unmount(mnt)?;
    super::fuse::drop_page_cache();
    eprintln!("s3: {name}: restart");
    let before = proxy.counts();
    let started = Instant::now();
    system.mount(mnt)?;
    read_all(files)?;
    let restart_secs = started.elapsed().as_secs_f64();
    let restart_gets = proxy.counts().gets - before.gets;
    system.unmount(mnt)?;
    Ok(Measured {
        system: name,
        cold_mib_per_sec: data_bytes as f64 / cold_secs / (1 << 20) as f64,
        cold_gets_per_gib: cold_gets as f64 / (data_bytes as f64 / (1u64 << 30) as f64),
        warm_iops,
        warm_p99_us,
        restart_secs: Some(restart_secs),
        restart_gets: Some(restart_gets),
    })
}

pub(crate) fn run(args: &BenchArgs, mode: Mode) -> Result<Outcome> {
    crate::fio::version()?;
    let secs = args.measure_secs.unwrap_or(DEFAULT_RUN_SECS);
    let tmp = super::work_dir(args.data.as_deref())?;
    let load_before = crate::load_average();
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let files_n = args.files.max(1) as u64;
    let file_bytes = (args.dataset_size / files_n).max(1);
    let data_bytes = file_bytes * files_n;
    fill_bucket(&server, BUCKET, (files_n, file_bytes), args.seed);
    let proxy = FaultProxy::start(server.addr());
    proxy.set_delay_ms(DELAY_MS.0, DELAY_MS.1);
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt)?;
    let files: Vec<PathBuf> = (0..files_n).map(|i| mnt.join(format!("f{i}"))).collect();
    let mut results = Vec::new();
    for system in &mut systems_under_test(args, tmp.path(), &proxy, (mode, data_bytes))? {
        results.push(measure(
            system.as_mut(),
            (&mnt, &files, data_bytes),
            &proxy,
            secs,
            mode,
        )?);
    }
    // The data (the bucket's, both caches') goes with `tmp` and `server`.
    let report = Report {
        mode,
        objects: files_n,
        data_bytes,
        delay_ms: DELAY_MS,
        load_before,
        load_after: crate::load_average(),
        results,
    };
    let headline = headline(&report);
    Outcome::new(report, headline, |r: &Report| {
        println!(
            "S3 side by side{}: {} objects, {} MiB, versitygw behind a {}-{} ms delay proxy; load average before: {}, after: {}",
            match r.mode {
                Mode::Budgets => "",
                Mode::Defaults => " at default settings, page cache warm",
            },
            r.objects,
            r.data_bytes >> 20,
            r.delay_ms.0,
            r.delay_ms.1,
            r.load_before,
            r.load_after
        );
        print_results(&r.results);
        let find = |prefix: &str| r.results.iter().find(|m| m.system.starts_with(prefix));
        if let (Some(ours), Some(rclone)) = (find("l2arc"), find("rclone")) {
            println!(
                "warm random 4 KiB: l2arc / rclone {:.2}x IOPS (goal 1.0x), p99 {:.0} us against {:.0} us",
                ours.warm_iops / rclone.warm_iops.max(f64::MIN_POSITIVE),
                ours.warm_p99_us,
                rclone.warm_p99_us
            );
        }
    })
}

#[derive(serde::Serialize)]
struct Report {
    mode: Mode,
    objects: u64,
    data_bytes: u64,
    delay_ms: (u64, u64),
    load_before: String,
    load_after: String,
    results: Vec<Measured>,
}

/// Ours against rclone: cold MiB/s, GETs per GiB, warm IOPS, restart
/// (`s3`); warm IOPS and p99 at default settings (`s3-defaults`).
fn headline(r: &Report) -> Vec<Headline> {
    let find = |prefix: &str| r.results.iter().find(|m| m.system.starts_with(prefix));
    let (Some(ours), Some(rclone)) = (find("l2arc"), find("rclone")) else {
        return Vec::new();
    };
    let peer = "rclone mount --vfs-cache-mode full";
    if r.mode == Mode::Defaults {
        let what = format!(
            "S3 mount at default settings (no --arc-max), {} MiB working set, page cache warm, warm random 4 KiB O_DIRECT",
            r.data_bytes >> 20
        );
        let peer = "rclone mount --vfs-cache-mode full, defaults otherwise";
        return vec![
            Headline::versus(
                "defaults_warm_iops",
                &what,
                "IOPS",
                (ours.warm_iops, peer, rclone.warm_iops),
                Goal::ratio_at_least(1.0),
            ),
            Headline::versus(
                "defaults_warm_p99_us",
                &format!("{what}: p99 latency"),
                "us",
                (ours.warm_p99_us, peer, rclone.warm_p99_us),
                Goal::ratio_at_most(1.0),
            ),
        ];
    }
    let mut lines = vec![
        Headline::versus(
            "cold_mib_per_sec",
            "S3 mount (versitygw + 20–50 ms delay), cold sequential",
            "MiB/s",
            (ours.cold_mib_per_sec, peer, rclone.cold_mib_per_sec),
            Goal::ratio_at_least(1.0),
        ),
        Headline::versus(
            "cold_gets_per_gib",
            "S3 mount, GETs per GiB served, cold sequential",
            "GETs/GiB",
            (ours.cold_gets_per_gib, peer, rclone.cold_gets_per_gib),
            Goal::ratio_at_most(1.0),
        ),
        Headline::versus(
            "warm_iops",
            "S3 mount, warm random 4 KiB O_DIRECT",
            "IOPS",
            (ours.warm_iops, peer, rclone.warm_iops),
            Goal::ratio_at_least(1.0),
        ),
    ];
    if let (Some(ours_secs), Some(rclone_secs)) = (ours.restart_secs, rclone.restart_secs) {
        lines.push(Headline::versus(
            "restart_secs",
            "S3 mount, restart to the data read again",
            "s",
            (ours_secs, peer, rclone_secs),
            Goal::ratio_at_most(1.0),
        ));
    }
    lines
}

/// `files_n` objects `f0`.. of `file_bytes` pseudo-random bytes each
/// (incompressible, so neither system gains from compression) in `bucket`.
pub(super) fn fill_bucket(
    server: &S3Server,
    bucket: &str,
    (files_n, file_bytes): (u64, u64),
    seed: u64,
) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for i in 0..files_n {
        let data: Vec<u8> = (0..file_bytes)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        server.put(bucket, &format!("f{i}"), &data);
    }
}

/// l2arc and rclone with the same DRAM and disk budgets, behind one proxy.
fn systems_under_test(
    args: &BenchArgs,
    dir: &Path,
    proxy: &FaultProxy,
    (mode, data_bytes): (Mode, u64),
) -> Result<Vec<Box<dyn System>>> {
    let recordsize_bytes = l2arc::validate_recordsize(args.recordsize)?;
    let (arc_max_bytes, cache_bytes, budgets) = match mode {
        Mode::Budgets => (
            Some(args.arc_max),
            args.cache_size,
            Some((args.arc_max, args.cache_size)),
        ),
        // Room for the whole working set on flash, in whole MiB.
        Mode::Defaults => (
            None,
            (data_bytes + data_bytes / 4).div_ceil(1 << 20) << 20,
            None,
        ),
    };
    Ok(vec![
        Box::new(L2arcSystem {
            endpoint: proxy.endpoint(),
            device: dir.join("l2arc.cache"),
            arc_max_bytes,
            cache_bytes,
            recordsize_bytes,
            mounted: None,
        }),
        Box::new(RcloneSystem {
            endpoint: proxy.endpoint(),
            cache_dir: dir.join("rclone-cache"),
            budgets,
            child: None,
        }),
    ])
}

fn print_results(results: &[Measured]) {
    println!(
        "mountpoint-s3: not measured (not buildable here: docs/notes/s3.md says what was tried)"
    );
    println!(
        "{:<72} {:>10} {:>9} {:>10} {:>10} {:>11} {:>12}",
        "system", "cold MiB/s", "GETs/GiB", "warm IOPS", "p99 us", "restart s", "restart GETs"
    );
    for r in results {
        println!(
            "{:<72} {:>10.1} {:>9.0} {:>10.0} {:>10.0} {:>11} {:>12}",
            r.system,
            r.cold_mib_per_sec,
            r.cold_gets_per_gib,
            r.warm_iops,
            r.warm_p99_us,
            r.restart_secs.map_or("-".into(), |s| format!("{s:.2}")),
            r.restart_gets.map_or("-".into(), |g| g.to_string())
        );
    }
}

/// `--scenario s3`.
pub(crate) struct S3;

impl Scenario for S3 {
    fn name(&self) -> &'static str {
        "s3"
    }
    fn measures(&self) -> &'static str {
        "Object storage: l2arc mount against rclone mount --vfs-cache-mode full over one versitygw bucket behind a 20-50 ms delay proxy: cold MiB/s, GETs per GiB, warm random 4 KiB IOPS and p99, restart warm-up."
    }
    fn run(&self, args: &BenchArgs) -> Result<Outcome> {
        run(args, Mode::Budgets)
    }
}

/// `--scenario s3-defaults`.
pub(crate) struct S3Defaults;

impl Scenario for S3Defaults {
    fn name(&self) -> &'static str {
        "s3-defaults"
    }
    fn measures(&self) -> &'static str {
        "Object storage at default settings: l2arc mount with no --arc-max against rclone mount --vfs-cache-mode full with its defaults, 4 GiB working set, page cache warm on both sides: warm random 4 KiB IOPS and p99 (and the cold pass)."
    }
    fn run(&self, args: &BenchArgs) -> Result<Outcome> {
        run(args, Mode::Defaults)
    }
}
