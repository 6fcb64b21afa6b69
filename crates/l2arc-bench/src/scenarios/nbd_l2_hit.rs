//! `--scenario nbd-l2-hit`: random 4 KiB reads at queue depth 32 over the
//! NBD export, warm from the L2ARC, against nbdkit's `file` plugin serving
//! the cache file itself.
//!
//! Why this baseline. The L2ARC's flash reads are ours to make fast; the
//! NBD protocol (a socket, a request and a reply per read, the client's
//! own work) costs what it costs for any server. nbdkit reading the very
//! file our L2ARC lives in, with `cache=none fadvise=random` so that every
//! read reaches the flash as ours do, is what the protocol allows on this
//! device: at 1.0x we add nothing to it. nbdkit with the page cache (the
//! file's bytes in DRAM) is printed too, as the ceiling of the protocol
//! alone. Ours is measured twice: reads through the connection's read
//! queue (`--read-queue-depth 64`, the default) and through the worker
//! threads only (`--read-queue-depth 0`), with the CPU time of each
//! server per request (its user and system time over the run's reads).
//!
//! The export's ARC is a sixteenth of the image, so nearly every read is
//! an ARC miss and an L2ARC hit: records are the read size (4 KiB) and
//! uncompressed, as in `--scenario l2-hit`. The first server warms the
//! cache file with nbdcopy; later ones find it warm again at start
//! (persistent L2ARC), so every side reads the same flash.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};

use crate::BenchArgs;

use super::l2_hit::median;
use super::nbd::{
    ServerProcess, nbd_randread, require_tools, scenario_image, shell_words, spawn, wait_for_socket,
};
use super::nbd_reread::{ctl_stats, get};
use super::{Goal, Headline, Outcome, Scenario};

const QUEUE_DEPTH: usize = 32;
/// Seconds per measurement at most (`--seconds` caps it lower).
const PHASE_SECS_MAX: f64 = 8.0;
/// Whole reads of the image with nbdcopy that warm the cache file.
const WARM_PASSES: usize = 3;

/// One side of a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum Side {
    OursReadQueue,
    OursWorkers,
    NbdkitFlash,
    NbdkitPageCache,
}

impl Side {
    const ALL: [Side; 4] = [
        Side::OursReadQueue,
        Side::OursWorkers,
        Side::NbdkitFlash,
        Side::NbdkitPageCache,
    ];

    fn name(self) -> &'static str {
        match self {
            Side::OursReadQueue => "l2arc serve-nbd, read queue",
            Side::OursWorkers => "l2arc serve-nbd, workers only",
            Side::NbdkitFlash => "nbdkit file cache=none (flash)",
            Side::NbdkitPageCache => "nbdkit file (page cache)",
        }
    }
}

#[derive(serde::Serialize)]
struct Measured {
    iops: f64,
    latency_us_p50: f64,
    latency_us_p99: f64,
    cpu_us_per_request: f64,
    /// L2 hits over ARC misses in the phase (ours only).
    l2_hit_ratio: Option<f64>,
}

struct Place {
    dir: PathBuf,
    image: PathBuf,
    image_bytes: u64,
    cache: PathBuf,
    secs: f64,
}

pub(crate) fn run(args: &BenchArgs) -> Result<Outcome> {
    require_tools("nbd-l2-hit", &["fio", "nbdkit", "nbdcopy"])?;
    let tmp = tempfile::Builder::new()
        .prefix("l2arc-bench-nbd-l2")
        .tempdir()?;
    let (image, image_bytes) =
        scenario_image(args, tmp.path(), "nbd-l2-hit", "nbd-l2-hit.img", 1 << 20)?;
    let cache = image.with_file_name("nbd-l2-hit-cache.img");
    let _ = std::fs::remove_file(&cache);
    let machine = super::l2_hit::machine(cache.parent().unwrap_or(tmp.path()));
    let fs = &machine.fs;
    if fs.starts_with("tmpfs") || fs.starts_with("ramfs") {
        bail!(
            "the cache file {} would be on {fs}: that is RAM, not a disk; give --data DIR on the disk",
            cache.display()
        );
    }
    let place = Place {
        dir: tmp.path().to_path_buf(),
        image,
        image_bytes,
        cache,
        secs: args.seconds.min(PHASE_SECS_MAX),
    };
    if !args.json {
        println!(
            "machine: {} CPUs, {:.1} GiB RAM, Linux {}, cache file on {fs}",
            machine.cpus, machine.ram_gib, machine.kernel
        );
    }
    let load_before = crate::load_average();
    let mut rounds: Vec<Vec<(Side, Measured)>> = Vec::new();
    let mut command = String::new();
    for round in 0..args.rounds {
        let mut sides = Side::ALL.to_vec();
        if round % 2 == 1 {
            sides.reverse();
        }
        let mut measured = Vec::new();
        for side in sides {
            let seed = args.seed ^ ((round as u64) << 8) ^ side as u64;
            let m = match side {
                Side::OursReadQueue => place.ours(64, round == 0, seed, &mut command)?,
                Side::OursWorkers => place.ours(0, false, seed, &mut command)?,
                Side::NbdkitFlash => place.nbdkit(&["cache=none", "fadvise=random"], seed)?,
                Side::NbdkitPageCache => place.nbdkit(&[], seed)?,
            };
            measured.push((side, m));
        }
        rounds.push(measured);
    }
    let _ = std::fs::remove_file(&place.cache);
    let report = Report {
        image_bytes: place.image_bytes,
        secs: place.secs,
        command,
        load_before,
        rounds,
    };
    let headline = headline(&report);
    Outcome::new(report, headline, |r: &Report| {
        print_report(
            (r.image_bytes, r.secs),
            &r.command,
            &r.load_before,
            &r.rounds,
        );
    })
}

/// What a run measured: every side of every round.
#[derive(serde::Serialize)]
struct Report {
    image_bytes: u64,
    secs: f64,
    command: String,
    load_before: String,
    rounds: Vec<Vec<(Side, Measured)>>,
}

/// Ours (read queue) against nbdkit on the same flash, round by round.
fn headline(r: &Report) -> Vec<Headline> {
    let of = |round: &[(Side, Measured)], side: Side| {
        round
            .iter()
            .find(|(s, _)| *s == side)
            .map_or(0.0, |(_, m)| m.iops)
    };
    let ratios: Vec<f64> = r
        .rounds
        .iter()
        .map(|round| of(round, Side::OursReadQueue) / of(round, Side::NbdkitFlash).max(1.0))
        .collect();
    let med = |side: Side| {
        median(
            &r.rounds
                .iter()
                .map(|round| of(round, side))
                .collect::<Vec<_>>(),
        )
    };
    vec![
        Headline::versus(
            "read_queue_vs_flash",
            &format!("NBD export warm from the L2ARC, random 4 KiB QD{QUEUE_DEPTH}, read queue"),
            "IOPS",
            (
                med(Side::OursReadQueue),
                "nbdkit file plugin on the cache file, cache=none (flash)",
                med(Side::NbdkitFlash),
            ),
            Goal::ratio_at_least(1.0),
        )
        .ratio_is(median(&ratios), "ours / baseline")
        .rounds(ratios),
    ]
}

impl Place {
    /// Our export with `read_queue_depth`; warms the cache file first if
    /// `warm` (the first server), else finds it warm at start.
    fn ours(
        &self,
        read_queue_depth: usize,
        warm: bool,
        seed: u64,
        command: &mut String,
    ) -> Result<Measured> {
        let socket = self.dir.join("ours.sock");
        let control = self.dir.join("ours.ctl");
        let _ = std::fs::remove_file(&socket);
        let _ = std::fs::remove_file(&control);
        let cache_bytes = self.image_bytes * 2 + (64 << 20);
        let mut cmd = Command::new(crate::sibling_binary("l2arc")?);
        cmd.arg("serve-nbd")
            .arg(&self.image)
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .arg("--control")
            .arg(&control)
            .arg(format!("--arc-max={}", self.image_bytes / 16))
            .arg("--recordsize=4K")
            .arg("--compression=off")
            .arg(format!("--cache={}", self.cache.display()))
            .arg(format!("--cache-size={cache_bytes}"))
            .arg(format!("--read-queue-depth={read_queue_depth}"));
        if read_queue_depth > 0 {
            *command = shell_words(&cmd);
        }
        let mut server = spawn(cmd)?;
        wait_for_socket(&mut server, &socket)?;
        let uri = uri(&socket);
        if warm {
            for _ in 0..WARM_PASSES {
                let out = Command::new("nbdcopy").arg(&uri).arg("null:").output()?;
                if !out.status.success() {
                    bail!("nbdcopy failed: {}", String::from_utf8_lossy(&out.stderr));
                }
            }
        } else {
            // Restored from the device's log at start: wait until it is.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while get(&ctl_stats(&control)?, "l2_rebuild_success") == 0 {
                if std::time::Instant::now() > deadline {
                    bail!("the cache file was not restored within 60 s");
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
        let before = ctl_stats(&control)?;
        let m = self.measure(&server, &uri, seed)?;
        let after = ctl_stats(&control)?;
        let delta = |name: &str| get(&after, name).saturating_sub(get(&before, name));
        let misses = delta("misses");
        drop(server.stop());
        Ok(Measured {
            l2_hit_ratio: (misses > 0).then(|| delta("l2_hits") as f64 / misses as f64),
            ..m
        })
    }

    /// nbdkit's file plugin on our (warm) cache file, with `options`.
    fn nbdkit(&self, options: &[&str], seed: u64) -> Result<Measured> {
        let socket = self.dir.join("nbdkit.sock");
        let _ = std::fs::remove_file(&socket);
        let mut cmd = Command::new("nbdkit");
        cmd.args(["-f", "-U"])
            .arg(&socket)
            .arg("file")
            .arg(format!("file={}", self.cache.display()))
            .args(options);
        let file = std::fs::File::open(&self.cache)?;
        if options.is_empty() {
            // The page cache side: the file's bytes into DRAM first.
            std::io::copy(&mut &file, &mut std::io::sink())?;
        } else {
            // The flash side: none of them left there by a page cache side.
            // SAFETY: a valid descriptor; the call only advises the kernel.
            unsafe {
                libc::posix_fadvise(
                    std::os::fd::AsRawFd::as_raw_fd(&file),
                    0,
                    0,
                    libc::POSIX_FADV_DONTNEED,
                )
            };
        }
        let mut server = spawn(cmd)?;
        wait_for_socket(&mut server, &socket)?;
        let uri = uri(&socket);
        let m = self.measure(&server, &uri, seed)?;
        drop(server);
        Ok(m)
    }

    /// fio's nbd engine, random reads at queue depth 32 over the image's
    /// size, and the server's CPU time per request over the run.
    fn measure(&self, server: &ServerProcess, uri: &str, seed: u64) -> Result<Measured> {
        let job = nbd_randread(
            "nbd-l2-hit",
            uri,
            (self.image_bytes, QUEUE_DEPTH),
            self.secs,
            seed,
        );
        let cpu_before = server.cpu_secs()?;
        let read = job.run(Some(&self.dir))?;
        let cpu_secs = server.cpu_secs()? - cpu_before;
        let requests = read.iops * self.secs.ceil().max(1.0);
        Ok(Measured {
            iops: read.iops,
            latency_us_p50: read.latency_us_p50,
            latency_us_p99: read.latency_us_p99,
            cpu_us_per_request: cpu_secs * 1e6 / requests.max(1.0),
            l2_hit_ratio: None,
        })
    }
}

fn uri(socket: &Path) -> String {
    format!("nbd+unix:///?socket={}", socket.display())
}

fn print_report(
    (image_bytes, secs): (u64, f64),
    command: &str,
    load_before: &str,
    rounds: &[Vec<(Side, Measured)>],
) {
    println!(
        "NBD export warm from the L2ARC: random 4 KiB reads, fio nbd engine, queue depth {QUEUE_DEPTH}, {} MiB image, {:.0} s per measurement, medians of {} rounds; load before {load_before}, after {}",
        image_bytes >> 20,
        secs.ceil(),
        rounds.len(),
        crate::load_average()
    );
    println!("ours: {command}");
    println!("nbdkit: nbdkit -f -U SOCKET file file=CACHE_FILE [cache=none fadvise=random]");
    println!();
    println!(
        "{:<32} {:>9} {:>8} {:>8} {:>12} {:>8} {:>16}",
        "server", "IOPS", "p50 us", "p99 us", "CPU us/req", "L2 hits", "IOPS per round"
    );
    print_rows(rounds);
    // Ratios within each round, then their median.
    let ratio = |a: Side, b: Side| -> f64 {
        median(
            &rounds
                .iter()
                .map(|r| {
                    let iops =
                        |s: Side| r.iter().find(|(x, _)| *x == s).map_or(0.0, |(_, m)| m.iops);
                    iops(a) / iops(b).max(1.0)
                })
                .collect::<Vec<_>>(),
        )
    };
    println!();
    println!(
        "ours (read queue) / nbdkit on flash: {:.2}x; ours (workers only) / nbdkit on flash: {:.2}x; read queue / workers: {:.2}x; ours (read queue) / nbdkit from the page cache: {:.2}x",
        ratio(Side::OursReadQueue, Side::NbdkitFlash),
        ratio(Side::OursWorkers, Side::NbdkitFlash),
        ratio(Side::OursReadQueue, Side::OursWorkers),
        ratio(Side::OursReadQueue, Side::NbdkitPageCache),
    );
    println!(
        "CPU us/req: the server's user + system time over the requests of the run (fio's own CPU not counted); L2 hits: over the ARC's misses in the run"
    );
}

/// One row per side: medians over the rounds, and each round's IOPS.
fn print_rows(rounds: &[Vec<(Side, Measured)>]) {
    let of = |side: Side, f: &dyn Fn(&Measured) -> f64| -> f64 {
        median(
            &rounds
                .iter()
                .flat_map(|r| r.iter().filter(|(s, _)| *s == side).map(|(_, m)| f(m)))
                .collect::<Vec<_>>(),
        )
    };
    for side in Side::ALL {
        let per_round: Vec<String> = rounds
            .iter()
            .flat_map(|r| r.iter().filter(|(s, _)| *s == side))
            .map(|(_, m)| format!("{:.0}", m.iops))
            .collect();
        let l2 = rounds
            .iter()
            .flat_map(|r| r.iter().filter(|(s, _)| *s == side))
            .filter_map(|(_, m)| m.l2_hit_ratio)
            .collect::<Vec<_>>();
        let l2 = if l2.is_empty() {
            "-".to_string()
        } else {
            format!("{:.1}%", 100.0 * median(&l2))
        };
        println!(
            "{:<32} {:>9.0} {:>8.1} {:>8.1} {:>12.1} {:>8} {:>16}",
            side.name(),
            of(side, &|m| m.iops),
            of(side, &|m| m.latency_us_p50),
            of(side, &|m| m.latency_us_p99),
            of(side, &|m| m.cpu_us_per_request),
            l2,
            per_round.join(" ")
        );
    }
}

/// `--scenario nbd-l2-hit`.
pub(crate) struct NbdL2Hit;

impl Scenario for NbdL2Hit {
    fn name(&self) -> &'static str {
        "nbd-l2-hit"
    }
    fn measures(&self) -> &'static str {
        "NBD export warm from the L2ARC: random 4 KiB reads at queue depth 32 with fio's nbd engine, read queue vs workers only, against nbdkit's file plugin on the cache file (flash and page cache), with the servers' CPU per request (needs fio, nbdkit, nbdcopy)."
    }
    fn run(&self, args: &BenchArgs) -> Result<Outcome> {
        run(args)
    }
}
