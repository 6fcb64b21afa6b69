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

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use super::BenchArgs;
use super::nbd::{
    require_tools, scenario_image, server_stats, shell_words, spawn, wait_for_socket,
};

const PASSES: usize = 4;
/// The counters printed per pass (deltas, but `l2_size` as it stands).
const COUNTERS: [&str; 10] = [
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
];

pub(crate) fn run(args: &BenchArgs) -> Result<()> {
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
    print_report(image_bytes, &command, &load_before, &rows);
    Ok(())
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

fn print_report(image_bytes: u64, command: &str, load_before: &str, rows: &[PassRow]) {
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
        "pass   secs  ARC misses (read-ahead)  L2 hits of them  l2_size MiB  feeds  eligible MiB  queued MiB  skip MiB  cached MiB  ineligible MiB  demand iohits on read-ahead"
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
        ] = d;
        let ratio = if misses == 0 {
            0.0
        } else {
            100.0 * l2_hits as f64 / misses as f64
        };
        println!(
            "{pass:>4} {secs:>6.2} {misses:>12} ({prefetch_misses:>7}) {ratio:>15.1}% {:>12} {feeds:>6} {:>13} {:>11} {:>9} {:>11} {:>15} {iohit:>28}",
            l2_size >> 20,
            eligible >> 20,
            queued >> 20,
            skip >> 20,
            cached >> 20,
            ineligible >> 20,
        );
    }
}

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
