//! `--scenario nbd-reread`: an image read whole four times over the NBD
//! export with nbdcopy, through an ARC an eighth of its size.
//!
//! The engine's `feed-capture` measures the feeder against the read path
//! alone; this is the same question asked the way a user meets it: a
//! real client (nbdcopy, 4 connections of 1 MiB requests by default)
//! against the real server (`l2arc serve-nbd`, its read-ahead and worker
//! pool, `l2arc_noprefetch` at its default), with the counters read from
//! the running server by `l2arc ctl stats` after every pass. The image is
//! in the page cache, so the ARC turns over at hundreds of MB/s, far
//! faster than a timer-driven feeder wakes: whatever the feeder does not
//! take while the ARC lets go of it is read from primary storage again on
//! the next pass. The goal (issue 11): at least 90% of the ARC's misses of
//! the second pass are L2ARC hits.

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use l2arc::internals::AlignedBuf;

use crate::BenchArgs;

use super::nbd::{
    require_tools, scenario_image, server_stats, shell_words, spawn, wait_for_socket,
};
use super::{Goal, Headline, Outcome, Scenario};

const PASSES: usize = 4;
/// The device write measured: writes of a feed batch's size (the most a
/// 512 MiB cache file's batch holds), this many bytes in all.
const DEVICE_WRITE_BYTES: usize = 8 << 20;
const DEVICE_WRITE_TOTAL_BYTES: u64 = 256 << 20;
/// The counters printed per pass (deltas, but `l2_size` as it stands).
const COUNTERS: [&str; 11] = [
    "misses",
    "prefetch_data_misses",
    "l2_hits",
    "l2_feeds",
    "evict_l2_eligible",
    "evict_l2_queued",
    "evict_l2_skip",
    "evict_l2_cached",
    "evict_l2_ineligible",
    "demand_iohit_predictive_prefetch",
    "l2_write_bytes",
];

pub(crate) fn run(args: &BenchArgs) -> Result<Outcome> {
    require_tools("nbd-reread", &["nbdcopy"])?;
    let tmp = tempfile::Builder::new()
        .prefix("l2arc-bench-reread")
        .tempdir()?;
    let (image, image_bytes) = prepare_image(args, tmp.path())?;
    let arc_max_bytes = image_bytes / 8;
    let cache_bytes = image_bytes * 2;
    let socket = tmp.path().join("nbd.sock");
    let control = tmp.path().join("ctl.sock");
    let mut cmd = Command::new(crate::sibling_binary("l2arc")?);
    cmd.arg("serve-nbd")
        .arg(&image)
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .arg("--control")
        .arg(&control)
        .arg(format!("--arc-max={arc_max_bytes}"))
        .arg(format!(
            "--cache={}",
            tmp.path().join("cache.img").display()
        ))
        .arg(format!("--cache-size={cache_bytes}"))
        .arg(format!("--compression={}", args.compression));
    let command = shell_words(&cmd);
    let mut server = spawn(cmd)?;
    wait_for_socket(&mut server, &socket)?;
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    let device_bytes_per_sec = device_write_rate(tmp.path())?;
    let load_before = crate::load_average();
    let mut before = ctl_stats(&control)?;
    let mut rows = Vec::new();
    for pass in 1..=PASSES {
        let started = Instant::now();
        let out = Command::new("nbdcopy")
            .arg(&uri)
            .arg("null:")
            .output()
            .context("run nbdcopy")?;
        let secs = started.elapsed().as_secs_f64();
        if !out.status.success() {
            bail!("nbdcopy failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let after = ctl_stats(&control)?;
        let delta = |name: &str| get(&after, name).saturating_sub(get(&before, name));
        rows.push((pass, secs, COUNTERS.map(delta), get(&after, "l2_size")));
        before = after;
    }
    drop(server.stop());
    let report = Report {
        image_bytes,
        device_bytes_per_sec,
        command,
        load_before,
        counters: COUNTERS,
        passes: rows,
    };
    let headline = headline(&report);
    Outcome::new(report, headline, |r: &Report| {
        print_report(
            (r.image_bytes, r.device_bytes_per_sec),
            &r.command,
            &r.load_before,
            &r.passes,
        );
    })
}

/// What a run measured: each pass's seconds, counter deltas (named by
/// `counters`) and `l2_size`.
#[derive(serde::Serialize)]
struct Report {
    image_bytes: u64,
    device_bytes_per_sec: f64,
    command: String,
    load_before: String,
    counters: [&'static str; COUNTERS.len()],
    passes: Vec<PassRow>,
}

/// Pass 2's L2 hits over its ARC misses, and pass 1's eligible bytes kept.
fn headline(r: &Report) -> Vec<Headline> {
    let col = |name: &str| COUNTERS.iter().position(|c| *c == name).expect("a counter");
    let share = |row: &PassRow, a: &str, b: &str| {
        let (a, b) = (row.2[col(a)], row.2[col(b)]);
        if b == 0 {
            0.0
        } else {
            100.0 * a as f64 / b as f64
        }
    };
    let mut h = Vec::new();
    if let Some(pass2) = r.passes.get(1) {
        h.push(Headline {
            key: "pass2_l2_hits".to_string(),
            what: format!(
                "feeder capture over NBD: {} MiB image read 4x with nbdcopy, ARC 1/8, L2 hits of pass 2's misses",
                r.image_bytes >> 20
            ),
            unit: "%".to_string(),
            ours: share(pass2, "l2_hits", "misses"),
            baseline_name: "—".to_string(),
            baseline: None,
            ratio: None,
            ratio_is: String::new(),
            round_ratios: Vec::new(),
            goal: Goal::ours(true, 90.0),
        });
    }
    if let Some(pass1) = r.passes.first() {
        h.push(Headline {
            key: "pass1_kept".to_string(),
            what: "feeder capture over NBD: eligible evicted bytes kept in pass 1".to_string(),
            unit: "%".to_string(),
            ours: share(pass1, "evict_l2_queued", "evict_l2_eligible"),
            baseline_name: "—".to_string(),
            baseline: None,
            ratio: None,
            ratio_is: String::new(),
            round_ratios: Vec::new(),
            goal: Goal::ours(true, 95.0),
        });
    }
    h
}

/// Bytes a second the cache file's disk takes in durable writes of a feed
/// batch's size, as the feeder writes them (O_DIRECT, O_DSYNC), into a
/// scratch file in `dir` removed afterwards.
fn device_write_rate(dir: &Path) -> Result<f64> {
    let path = dir.join("device-write-rate.img");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
        .open(&path)
        .with_context(|| format!("create {} (O_DIRECT)", path.display()))?;
    let mut batch = AlignedBuf::zeroed(DEVICE_WRITE_BYTES);
    batch.as_mut_slice().fill(0x5a);
    let write_pass = || -> std::io::Result<()> {
        for offset in (0..DEVICE_WRITE_TOTAL_BYTES).step_by(DEVICE_WRITE_BYTES) {
            file.write_all_at(&batch, offset)?;
        }
        Ok(())
    };
    // The first pass allocates the file's blocks, so that the timed second
    // one allocates nothing.
    let timed = write_pass().and_then(|()| {
        let started = Instant::now();
        write_pass().map(|()| started.elapsed().as_secs_f64())
    });
    drop(file);
    std::fs::remove_file(&path)?;
    let secs = timed.with_context(|| format!("write {}", path.display()))?;
    Ok(DEVICE_WRITE_TOTAL_BYTES as f64 / secs)
}

/// The image (reused from `--data` when it has the right size), read once
/// into the page cache.
fn prepare_image(args: &BenchArgs, tmp: &Path) -> Result<(std::path::PathBuf, u64)> {
    let (image, image_bytes) = scenario_image(args, tmp, "nbd-reread", "nbd-reread.img", 1 << 20)?;
    // Into the page cache: primary reads are then as fast as they get.
    std::io::copy(&mut std::fs::File::open(&image)?, &mut std::io::sink())?;
    Ok((image, image_bytes))
}

/// One row per pass: its number, seconds, the `COUNTERS` deltas, `l2_size`.
type PassRow = (usize, f64, [u64; COUNTERS.len()], u64);

fn print_report(
    (image_bytes, device_bytes_per_sec): (u64, f64),
    command: &str,
    load_before: &str,
    rows: &[PassRow],
) {
    let (arc_max_bytes, cache_bytes) = (image_bytes / 8, image_bytes * 2);
    println!(
        "NBD re-read: a {} MiB image (page cache) read whole {PASSES} times with nbdcopy; arc_max {} MiB, cache file {} MiB; load before {load_before}, after {}",
        image_bytes >> 20,
        arc_max_bytes >> 20,
        cache_bytes >> 20,
        crate::load_average()
    );
    println!("server: {command}");
    println!(
        "cache device: {:.0} MiB/s of durable {} MiB writes (measured before pass 1)",
        device_bytes_per_sec / MIB,
        DEVICE_WRITE_BYTES >> 20
    );
    println!(
        "pass   secs  ARC misses (read-ahead)  L2 hits of them  l2_size MiB  feeds  eligible MiB  queued MiB  skip MiB  cached MiB  ineligible MiB  demand iohits on read-ahead  written MiB/s  kept of eligible  kept of what the device could take"
    );
    for &(pass, secs, d, l2_size) in rows {
        let [
            misses,
            prefetch_misses,
            l2_hits,
            feeds,
            eligible,
            queued,
            skip,
            cached,
            ineligible,
            iohit,
            written,
        ] = d;
        // The device could have taken at most its rate for the pass's time.
        let takeable = (eligible as f64).min(device_bytes_per_sec * secs);
        let share = |of: f64| {
            if of > 0.0 {
                format!("{:.1}%", 100.0 * queued as f64 / of)
            } else {
                "-".to_string()
            }
        };
        let ratio = if misses == 0 {
            0.0
        } else {
            100.0 * l2_hits as f64 / misses as f64
        };
        println!(
            "{pass:>4} {secs:>6.2} {misses:>12} ({prefetch_misses:>7}) {ratio:>15.1}% {:>12} {feeds:>6} {:>13} {:>11} {:>9} {:>11} {:>15} {iohit:>28} {:>14.0} {:>17} {:>35}",
            l2_size >> 20,
            eligible >> 20,
            queued >> 20,
            skip >> 20,
            cached >> 20,
            ineligible >> 20,
            written as f64 / MIB / secs,
            share(eligible as f64),
            share(takeable),
        );
    }
}

const MIB: f64 = (1 << 20) as f64;

/// `l2arc ctl --socket CONTROL stats`: `name value` lines.
pub(crate) fn ctl_stats(control: &Path) -> Result<Vec<(String, u64)>> {
    let out = Command::new(crate::sibling_binary("l2arc")?)
        .args(["ctl", "--socket"])
        .arg(control)
        .arg("stats")
        .output()
        .context("run l2arc ctl stats")?;
    if !out.status.success() {
        bail!("l2arc ctl stats: {}", String::from_utf8_lossy(&out.stderr));
    }
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    Ok(server_stats(&lines))
}

pub(crate) fn get(stats: &[(String, u64)], name: &str) -> u64 {
    stats.iter().find(|(n, _)| n == name).map_or(0, |(_, v)| *v)
}

/// `--scenario nbd-reread`.
pub(crate) struct NbdReread;

impl Scenario for NbdReread {
    fn name(&self) -> &'static str {
        "nbd-reread"
    }
    fn measures(&self) -> &'static str {
        "Feeder capture over NBD: an image read whole four times with nbdcopy through `l2arc serve-nbd`, ARC an eighth of it; L2 hits per pass and the evict_l2_* counters (needs nbdcopy)."
    }
    fn run(&self, args: &BenchArgs) -> Result<Outcome> {
        run(args)
    }
}
