//! `--scenario fleet`: N nodes reading one bucket, with the shared cache
//! tier (issue 34) against N rclone mounts.
//!
//! What a fleet pays for a bucket read by every node: each node's cold
//! start, and the GETs (each costs 20-100 ms and money). Without a tier
//! the nodes share, both are paid N times. With `--shared-cache`, the
//! first node to read a record writes it behind the reader to a cache
//! bucket; the others read it there instead of from the data bucket. So
//! one versitygw server holds both buckets, the data path goes through
//! the delay proxy of `--scenario s3` (20-50 ms added to each request),
//! the cache bucket is reached directly (the fast store near the fleet:
//! S3 Express One Zone, a MinIO in the rack), and we measure, for
//! `l2arc mount` (`--shared-cache`) and `rclone mount --vfs-cache-mode
//! full` (its cache is per node: the baseline the tier is against):
//!
//! - node 1 reads every object once in order (cold, cp-like): MiB/s and
//!   the GETs of objects on the data bucket (listings apart: every node
//!   lists the bucket once, with or without a tier);
//! - a fresh node 2 (nothing in its own caches) reads random 4 KiB
//!   (fio, psync, 4 jobs, O_DIRECT) for the measured seconds: IOPS;
//! - nodes 2..N, each fresh, read everything once: MiB/s and GETs;
//! - the fleet's data GETs over node 1's: 1.0 when the fleet reads the
//!   bucket once, N for per-node caches.
//!
//! Each node is its own process (`l2arc mount`, `rclone mount`) with its
//! own cache file or directory, as on N machines; on one machine they
//! share the page cache, so it is dropped before every cold pass, and a
//! node's cache is removed once it has stopped (each holds the bucket).
//!
//! The bucket is 4 GiB by default: the random reads are to be those of a
//! node "before its own cache is warm", and a smaller bucket is not that
//! for rclone, whose fresh node pulls some 5 GiB through the delay proxy
//! in its 8 s window (at 1 GiB it read from a warm cache by the second
//! second).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use l2arc_testkit::s3::{FaultProxy, S3Server};
use serde::Serialize;

use super::{Goal, Headline, Outcome, Scenario};
use crate::BenchArgs;
use crate::fio::{FioJob, FioTarget};

const DATA_BUCKET: &str = "fleet";
const CACHE_BUCKET: &str = "fleet-cache";
const CACHE_PREFIX: &str = "bench";
const DELAY_MS: (u64, u64) = (20, 50);
const DEFAULT_RANDOM_SECS: f64 = 8.0;
/// Longest wait for node 1's writes behind the reader to reach the cache
/// bucket before the other nodes start.
const SETTLE_SECS_MAX: u64 = 120;
/// Most nodes (each a mount process with its own cache file).
const NODES_MAX: usize = 16;

/// One node's cold pass.
#[derive(Clone, Debug, Serialize)]
struct ColdPass {
    node: usize,
    mib_per_sec: f64,
    /// GETs of objects on the data bucket (listings apart).
    data_gets: u64,
    /// Listings of the data bucket.
    lists: u64,
    /// The node's shared-tier hits and misses (l2arc only).
    shared_hits: Option<u64>,
    shared_misses: Option<u64>,
    /// GETs of the shared tier past its timeout, and records its backoff
    /// sent to the data bucket instead (l2arc only).
    shared_timeouts: Option<u64>,
    shared_skips: Option<u64>,
    /// Records read back from the node's own L2ARC during its cold pass
    /// (read ahead, evicted before the reader came, fed to flash).
    l2_hits: Option<u64>,
}

/// One system's figures.
#[derive(Clone, Debug, Serialize)]
struct Fleet {
    system: String,
    cold: Vec<ColdPass>,
    /// Random 4 KiB reads on a fresh node 2.
    random_iops: f64,
    random_p99_us: f64,
    /// GETs of objects on the data bucket during node 2's random reads.
    random_data_gets: u64,
    /// Bytes from the data bucket during them: what of the bucket the
    /// fresh node fetched in its window (a system that pulls most of it
    /// is warm before the window ends).
    random_data_bytes: u64,
}

impl Fleet {
    fn node1(&self) -> &ColdPass {
        &self.cold[0]
    }

    /// The mean cold rate of nodes 2..N.
    fn others_mib_per_sec(&self) -> f64 {
        let others = &self.cold[1..];
        others.iter().map(|c| c.mib_per_sec).sum::<f64>() / others.len().max(1) as f64
    }

    /// Data GETs of every cold pass.
    fn fleet_data_gets(&self) -> u64 {
        self.cold.iter().map(|c| c.data_gets).sum()
    }
}

#[derive(Serialize)]
struct Report {
    nodes: usize,
    objects: u64,
    data_bytes: u64,
    delay_ms: (u64, u64),
    /// The data bucket's link cap, MiB/s (0: none).
    data_link_mib_per_sec: f64,
    load_before: String,
    load_after: String,
    results: Vec<Fleet>,
}

/// How to start a node of one system.
enum System {
    L2arc {
        binary: PathBuf,
        data_endpoint: String,
        cache_endpoint: String,
        arc_max_bytes: u64,
        cache_bytes: u64,
    },
    Rclone {
        data_endpoint: String,
    },
}

impl System {
    fn name(&self) -> String {
        match self {
            System::L2arc {
                arc_max_bytes,
                cache_bytes,
                ..
            } => format!(
                "l2arc mount --shared-cache (arc_max {} MiB, L2ARC {} MiB)",
                arc_max_bytes >> 20,
                cache_bytes >> 20
            ),
            System::Rclone { .. } => "rclone mount --vfs-cache-mode full".to_string(),
        }
    }

    /// Removes what node `node` kept under `dir` (its cache file and ARC
    /// checkpoint, or its cache directory) once it has stopped: a node's
    /// cache holds the whole working set, and N of them side by side would
    /// fill the disk the buckets are on.
    fn remove_caches(&self, dir: &Path, node: &str) {
        match self {
            System::L2arc { .. } => {
                let cache = dir.join(format!("{node}.cache"));
                let _ = std::fs::remove_file(cache.with_extension("cache.arc"));
                let _ = std::fs::remove_file(&cache);
            }
            System::Rclone { .. } => {
                let _ = std::fs::remove_dir_all(dir.join(format!("{node}.rclone")));
            }
        }
    }

    /// Node `node`'s mount at `mnt`, with its own (empty) cache under `dir`.
    fn start(&self, dir: &Path, node: &str, mnt: &Path, server: &S3Server) -> Result<Node> {
        let log_path = dir.join(format!("{node}.log"));
        let log = std::fs::File::create(&log_path)?;
        let (mut cmd, control) = match self {
            System::L2arc {
                binary,
                data_endpoint,
                cache_endpoint,
                arc_max_bytes,
                cache_bytes,
            } => {
                let cache = dir.join(format!("{node}.cache"));
                let _ = std::fs::remove_file(&cache);
                let _ = std::fs::remove_file(cache.with_extension("cache.arc"));
                let control = dir.join(format!("{node}.ctl"));
                let mut cmd = Command::new(binary);
                cmd.arg("mount")
                    .arg(format!("s3://{DATA_BUCKET}"))
                    .arg(mnt)
                    .args(["--s3-endpoint", data_endpoint])
                    .args(["--arc-max", &arc_max_bytes.to_string()])
                    .arg("--cache")
                    .arg(&cache)
                    .args(["--cache-size", &cache_bytes.to_string()])
                    .arg("--control")
                    .arg(&control)
                    .args([
                        "--shared-cache",
                        &format!("s3://{CACHE_BUCKET}/{CACHE_PREFIX}"),
                    ])
                    .args(["--shared-cache-endpoint", cache_endpoint])
                    .env_remove("AWS_PROFILE")
                    .env("HOME", "/nonexistent-l2arc-bench-home");
                for (k, v) in server.aws_env() {
                    cmd.env(k, v);
                }
                (cmd, Some(control))
            }
            System::Rclone { data_endpoint } => {
                let cache_dir = dir.join(format!("{node}.rclone"));
                let _ = std::fs::remove_dir_all(&cache_dir);
                let mut cmd = Command::new("rclone");
                cmd.args(["mount", &format!("bench:{DATA_BUCKET}")])
                    .arg(mnt)
                    .args(["--vfs-cache-mode", "full", "--read-only"])
                    .arg("--cache-dir")
                    .arg(&cache_dir);
                super::s3::rclone_remote(&mut cmd, data_endpoint);
                (cmd, None)
            }
        };
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("{}: cannot start node {node}", self.name()))?;
        let mut node = Node {
            child: Some(child),
            mnt: mnt.to_path_buf(),
            control,
            log_path,
        };
        node.wait_mounted(Duration::from_secs(60))?;
        Ok(node)
    }
}

/// A running node.
struct Node {
    child: Option<Child>,
    mnt: PathBuf,
    control: Option<PathBuf>,
    log_path: PathBuf,
}

impl Node {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    fn wait_mounted(&mut self, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        while !l2arc_fuse::is_mounted(&self.mnt).unwrap_or(false) {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("the node exited ({status}): {}", self.log().trim());
            }
            if Instant::now() > deadline {
                bail!("not mounted within {limit:?}: {}", self.log().trim());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// A kstat of an l2arc node (`ctl stats`), if it has it.
    fn kstat(&self, binary: &Path, name: &str) -> Option<u64> {
        let control = self.control.as_ref()?;
        let out = Command::new(binary)
            .args(["ctl", "--socket"])
            .arg(control)
            .arg("stats")
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some(name))
                .then(|| words.next()?.parse().ok())
                .flatten()
        })
    }

    /// Stops the node: SIGTERM for l2arc (its clean stop), an unmount for
    /// rclone; waits for it (bounded), then kills what is left.
    fn stop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            if self.control.is_some() {
                // SAFETY: a signal to our own child's pid.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            } else {
                let _ = Command::new("fusermount3")
                    .arg("-u")
                    .arg(&self.mnt)
                    .status();
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            while matches!(child.try_wait(), Ok(None)) {
                if Instant::now() > deadline {
                    let _ = child.kill();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.child = None;
        if l2arc_fuse::is_mounted(&self.mnt).unwrap_or(false) {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.mnt)
                .status();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until node 1's writes to the shared tier stop moving (its write
/// queue drained), bounded.
fn settle_shared_writes(node: &Node, binary: &Path) {
    let written = || {
        node.kstat(binary, "shared_writes").unwrap_or(0)
            + node.kstat(binary, "shared_write_drops").unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(SETTLE_SECS_MAX);
    let mut last = written();
    let mut still = 0;
    while still < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        let now = written();
        if now == last {
            still += 1;
        } else {
            (last, still) = (now, 0);
        }
    }
    eprintln!(
        "fleet: node 1 wrote {} records to the shared tier ({} dropped)",
        node.kstat(binary, "shared_writes").unwrap_or(0),
        node.kstat(binary, "shared_write_drops").unwrap_or(0)
    );
}

struct Place<'a> {
    dir: &'a Path,
    mnt: &'a Path,
    files: &'a [PathBuf],
    data_bytes: u64,
    server: &'a S3Server,
    proxy: &'a FaultProxy,
}

/// One node's cold pass over every object.
fn cold_pass(system: &System, place: &Place<'_>, node_no: usize) -> Result<ColdPass> {
    let node = system.start(
        place.dir,
        &format!("node{node_no}"),
        place.mnt,
        place.server,
    )?;
    super::fuse::drop_page_cache();
    let before = place.proxy.counts();
    let started = Instant::now();
    let read = super::s3::read_all(place.files)?;
    let secs = started.elapsed().as_secs_f64();
    let after = place.proxy.counts();
    if read != place.data_bytes {
        bail!(
            "node {node_no}: short read ({read} of {} bytes)",
            place.data_bytes
        );
    }
    let binary = match system {
        System::L2arc { binary, .. } => Some(binary.as_path()),
        System::Rclone { .. } => None,
    };
    if let (Some(binary), 1) = (binary, node_no) {
        settle_shared_writes(&node, binary);
    }
    let pass = ColdPass {
        node: node_no,
        mib_per_sec: read as f64 / secs / (1 << 20) as f64,
        data_gets: (after.gets - after.lists) - (before.gets - before.lists),
        lists: after.lists - before.lists,
        shared_hits: binary.and_then(|b| node.kstat(b, "shared_hits")),
        shared_misses: binary.and_then(|b| node.kstat(b, "shared_misses")),
        shared_timeouts: binary.and_then(|b| node.kstat(b, "shared_timeouts")),
        shared_skips: binary.and_then(|b| node.kstat(b, "shared_skips")),
        l2_hits: binary.and_then(|b| node.kstat(b, "l2_hits")),
    };
    eprintln!(
        "fleet: {} node {node_no}: {:.1} MiB/s, {} data GETs, {} listings",
        system.name(),
        pass.mib_per_sec,
        pass.data_gets,
        pass.lists
    );
    drop(node);
    system.remove_caches(place.dir, &format!("node{node_no}"));
    Ok(pass)
}

/// Random 4 KiB reads on a fresh node 2 (its own caches empty).
fn random_on_fresh_node(
    system: &System,
    place: &Place<'_>,
    secs: f64,
) -> Result<(f64, f64, u64, u64)> {
    let node = system.start(place.dir, "node2-random", place.mnt, place.server)?;
    super::fuse::drop_page_cache();
    let before = place.proxy.counts();
    let read = FioJob::new(
        "fleet-random",
        "psync",
        FioTarget::Files(place.files.to_vec()),
        "randread",
        4096,
        secs.ceil().max(2.0) as u64,
    )
    .readonly()
    .direct(true)
    .numjobs(4)
    .run(None)?;
    let after = place.proxy.counts();
    drop(node);
    system.remove_caches(place.dir, "node2-random");
    Ok((
        read.iops,
        read.latency_us_p99,
        (after.gets - after.lists) - (before.gets - before.lists),
        after.bytes_down - before.bytes_down,
    ))
}

/// Node 1 cold, a fresh node 2's random reads, nodes 2..N cold.
fn measure(system: &System, place: &Place<'_>, nodes: usize, secs: f64) -> Result<Fleet> {
    eprintln!("fleet: {}", system.name());
    let mut cold = vec![cold_pass(system, place, 1)?];
    let (random_iops, random_p99_us, random_data_gets, random_data_bytes) =
        random_on_fresh_node(system, place, secs)?;
    eprintln!(
        "fleet: {} fresh node 2, random 4 KiB: {random_iops:.0} IOPS, p99 {random_p99_us:.0} us, {random_data_gets} data GETs, {} MiB from the data bucket ({:.0}% of it)",
        system.name(),
        random_data_bytes >> 20,
        100.0 * random_data_bytes as f64 / place.data_bytes as f64
    );
    for node_no in 2..=nodes {
        cold.push(cold_pass(system, place, node_no)?);
    }
    Ok(Fleet {
        system: system.name(),
        cold,
        random_iops,
        random_p99_us,
        random_data_gets,
        random_data_bytes,
    })
}

fn run(args: &BenchArgs) -> Result<Outcome> {
    crate::fio::version()?;
    let nodes = args.nodes;
    if !(2..=NODES_MAX).contains(&nodes) {
        bail!("--nodes must be from 2 to {NODES_MAX}, not {nodes}");
    }
    let binary = crate::sibling_binary("l2arc")?;
    let secs = args.measure_secs.unwrap_or(DEFAULT_RANDOM_SECS);
    let tmp = super::work_dir(args.data.as_deref())?;
    let load_before = crate::load_average();
    let server = S3Server::start();
    server.create_bucket(DATA_BUCKET);
    server.create_bucket(CACHE_BUCKET);
    let files_n = u64::from(args.files.max(1));
    let file_bytes = (args.dataset_size / files_n).max(1);
    let data_bytes = file_bytes * files_n;
    super::s3::fill_bucket(&server, DATA_BUCKET, (files_n, file_bytes), args.seed);
    let link_mib_per_sec = args.data_link_mib_per_sec;
    if !(link_mib_per_sec >= 0.0 && link_mib_per_sec.is_finite()) {
        bail!(
            "--data-link-mib-per-sec must be 0 (no cap) or a positive number of MiB/s, not {link_mib_per_sec}"
        );
    }
    let proxy = FaultProxy::start(server.addr());
    proxy.set_delay_ms(DELAY_MS.0, DELAY_MS.1);
    proxy.set_link_mib_per_sec(link_mib_per_sec);
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt)?;
    let files: Vec<PathBuf> = (0..files_n).map(|i| mnt.join(format!("f{i}"))).collect();
    let place = Place {
        dir: tmp.path(),
        mnt: &mnt,
        files: &files,
        data_bytes,
        server: &server,
        proxy: &proxy,
    };
    // Room for the whole working set on each node's flash, in whole MiB.
    let cache_bytes = (data_bytes + data_bytes / 4).div_ceil(1 << 20).max(64) << 20;
    let systems = [
        System::L2arc {
            binary,
            data_endpoint: proxy.endpoint(),
            cache_endpoint: server.endpoint(),
            arc_max_bytes: args.arc_max,
            cache_bytes,
        },
        System::Rclone {
            data_endpoint: proxy.endpoint(),
        },
    ];
    let mut results = Vec::new();
    for system in &systems {
        results.push(measure(system, &place, nodes, secs)?);
    }
    let report = Report {
        nodes,
        objects: files_n,
        data_bytes,
        delay_ms: DELAY_MS,
        data_link_mib_per_sec: link_mib_per_sec,
        load_before,
        load_after: crate::load_average(),
        results,
    };
    let headline = headline(&report);
    Outcome::new(report, headline, print_report)
}

fn print_report(r: &Report) {
    println!(
        "fleet: {} nodes, {} objects, {} MiB in one bucket on versitygw behind a {}-{} ms delay proxy{}, the cache bucket on the same server without it; load average before: {}, after: {}",
        r.nodes,
        r.objects,
        r.data_bytes >> 20,
        r.delay_ms.0,
        r.delay_ms.1,
        link(r),
        r.load_before,
        r.load_after
    );
    println!(
        "{:<56} {:>12} {:>14} {:>10} {:>12} {:>9} {:>13} {:>9}",
        "system",
        "node 1 MiB/s",
        "nodes 2.. MiB/s",
        "node 1 GETs",
        "fleet GETs",
        "x node 1",
        "fresh rnd IOPS",
        "p99 us"
    );
    for f in &r.results {
        println!(
            "{:<56} {:>12.1} {:>14.1} {:>10} {:>12} {:>9.2} {:>13.0} {:>9.0}",
            f.system,
            f.node1().mib_per_sec,
            f.others_mib_per_sec(),
            f.node1().data_gets,
            f.fleet_data_gets(),
            f.fleet_data_gets() as f64 / f.node1().data_gets.max(1) as f64,
            f.random_iops,
            f.random_p99_us
        );
    }
    for f in &r.results {
        println!(
            "{}: fresh node 2 fetched {} MiB ({:.0}% of the bucket) from the data bucket in its random-read window",
            f.system,
            f.random_data_bytes >> 20,
            100.0 * f.random_data_bytes as f64 / r.data_bytes.max(1) as f64
        );
    }
    for f in &r.results {
        for c in &f.cold {
            if let (Some(hits), Some(misses)) = (c.shared_hits, c.shared_misses) {
                println!(
                    "{} node {}: shared tier {hits} hits, {misses} misses, {} timeouts, {} records skipped in backoff, {} L2ARC hits; {} data GETs, {} listings",
                    f.system,
                    c.node,
                    c.shared_timeouts.unwrap_or(0),
                    c.shared_skips.unwrap_or(0),
                    c.l2_hits.unwrap_or(0),
                    c.data_gets,
                    c.lists
                );
            }
        }
    }
    println!(
        "GETs: GETs of objects on the data bucket (listings apart), counted by the proxy; x node 1: the fleet's over node 1's (1.00: the fleet read the bucket once)"
    );
}

/// The data bucket's link cap as the report says it ("" when none).
fn link(r: &Report) -> String {
    if r.data_link_mib_per_sec > 0.0 {
        format!(" and a {} MiB/s link", r.data_link_mib_per_sec)
    } else {
        String::new()
    }
}

/// The three goals: the fleet's data GETs at node 1's, nodes 2..N
/// at 3x node 1's cold rate, and a fresh node's random reads at 3x
/// rclone's.
fn headline(r: &Report) -> Vec<Headline> {
    let find = |prefix: &str| r.results.iter().find(|f| f.system.starts_with(prefix));
    let (Some(ours), Some(rclone)) = (find("l2arc"), find("rclone")) else {
        return Vec::new();
    };
    let peer = "rclone mount --vfs-cache-mode full (a cache per node)";
    let fleet = |f: &Fleet| f.fleet_data_gets() as f64 / f.node1().data_gets.max(1) as f64;
    let scale = format!(
        "{} nodes, {} MiB, data bucket behind 20–50 ms{}",
        r.nodes,
        r.data_bytes >> 20,
        link(r)
    );
    // A capped link is another configuration: rows of its own.
    let key = |name: &str| {
        if r.data_link_mib_per_sec > 0.0 {
            format!("{name}_link")
        } else {
            name.to_string()
        }
    };
    vec![
        Headline::versus(
            &key("fleet_gets_over_node1"),
            &format!(
                "fleet: data-bucket GETs of all the nodes' cold passes over node 1's ({scale})"
            ),
            "x",
            (fleet(ours), peer, fleet(rclone)),
            Goal::ours(false, 1.0),
        ),
        Headline::versus(
            &key("others_over_node1_cold"),
            &format!("fleet: cold MiB/s of nodes 2..N over node 1's ({scale})"),
            "x",
            (
                ours.others_mib_per_sec() / ours.node1().mib_per_sec,
                peer,
                rclone.others_mib_per_sec() / rclone.node1().mib_per_sec,
            ),
            Goal::ours(true, 3.0),
        ),
        Headline::versus(
            &key("fresh_node_random_iops"),
            &format!(
                "fleet: random 4 KiB O_DIRECT on a fresh node 2 after node 1 read everything ({scale})"
            ),
            "IOPS",
            (ours.random_iops, peer, rclone.random_iops),
            Goal::ratio_at_least(3.0),
        ),
    ]
}

/// `--scenario fleet`.
pub(crate) struct FleetScenario;

impl Scenario for FleetScenario {
    fn name(&self) -> &'static str {
        "fleet"
    }
    fn measures(&self) -> &'static str {
        "A fleet on one bucket: N l2arc mounts sharing a cache bucket (--shared-cache) against N rclone mounts --vfs-cache-mode full, data bucket behind a 20-50 ms delay proxy: cold MiB/s of node 1 and of nodes 2..N, the fleet's data GETs over node 1's, random 4 KiB IOPS on a fresh node (needs fio, rclone)."
    }
    fn run(&self, args: &BenchArgs) -> Result<Outcome> {
        run(args)
    }
}
