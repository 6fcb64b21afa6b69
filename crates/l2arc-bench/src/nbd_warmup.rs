//! `--scenario nbd-warmup`: the seed workload's warm-up through the NBD
//! export, from an empty cache.
//!
//! The engine's `warmup` scenario times the cache alone; this is the time a
//! user of the export waits: fio's nbd engine, random 4 KiB reads at queue
//! depth 32 over a 1 GiB image on an emulated 4-spindle HDD (4–12 ms
//! positioning, 150 MiB/s), through `l2arc serve-nbd` with a 128 MiB ARC
//! and a 2 GiB cache file, IOPS logged every second. Warm is the median
//! second of the run's last quarter; the figure is the first second at 90%
//! of it, against the time one pass over the image takes from the disks
//! (whole records at the emulation's mean service time, the spindles in
//! parallel): no cache can be warm before it has read the working set once,
//! so the goal (issue 11) is 1.2x that pass.

use std::process::Command;

use anyhow::{Result, bail};

use super::BenchArgs;
use super::fio::{FioJob, FioTarget};
use super::nbd::{require_tools, scenario_image, shell_words, spawn, wait_for_socket};

const BLOCK_BYTES: u64 = 4 << 10;
const QUEUE_DEPTH: usize = 32;
const SPINDLES: u32 = 4;
const SEEK_MS_MIN: f64 = 4.0;
const SEEK_MS_MAX: f64 = 12.0;
/// The emulation's transfer rate (`EmulatedHdd`'s default).
const TRANSFER_MIB_PER_SEC: f64 = 150.0;
const RECORDSIZE_BYTES: u64 = 128 << 10;
const ARC_MAX_BYTES: u64 = 128 << 20;

pub(crate) fn run(args: &BenchArgs) -> Result<()> {
    require_tools("nbd-warmup", &["fio"])?;
    let tmp = tempfile::Builder::new()
        .prefix("l2arc-bench-nbd-warmup")
        .tempdir()?;
    let (image, image_bytes) = scenario_image(
        args,
        tmp.path(),
        "nbd-warmup",
        "nbd-warmup.img",
        RECORDSIZE_BYTES,
    )?;
    let cache = image.with_file_name("nbd-warmup-cache.img");
    let _ = std::fs::remove_file(&cache);
    let secs = args.measure_secs.unwrap_or(120.0).max(10.0);
    let socket = tmp.path().join("ours.sock");
    let mut cmd = Command::new(crate::sibling_binary("l2arc")?);
    cmd.arg("serve-nbd")
        .arg(&image)
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .arg(format!("--arc-max={ARC_MAX_BYTES}"))
        .arg(format!("--recordsize={RECORDSIZE_BYTES}"))
        .arg(format!("--cache={}", cache.display()))
        .arg(format!("--cache-size={}", image_bytes * 2))
        .arg(format!("--emulate-hdd-spindles={SPINDLES}"))
        .arg(format!("--emulate-hdd-seek-ms-min={SEEK_MS_MIN}"))
        .arg(format!("--emulate-hdd-seek-ms-max={SEEK_MS_MAX}"));
    let command = shell_words(&cmd);
    let mut server = spawn(cmd)?;
    wait_for_socket(&mut server, &socket)?;
    let load_before = crate::load_average();
    let read = FioJob::new(
        "nbd-warmup",
        "nbd",
        FioTarget::NbdUri(format!("nbd+unix:///?socket={}", socket.display())),
        "randread",
        BLOCK_BYTES,
        secs.ceil() as u64,
    )
    .size_bytes(image_bytes)
    .iodepth(QUEUE_DEPTH)
    .seed(args.seed)
    .iops_log()
    .run(Some(tmp.path()))?;
    let stopped = server.stop();
    let _ = std::fs::remove_file(&cache);
    print_report(
        image_bytes,
        secs,
        &command,
        &load_before,
        &read.iops_per_second,
    )?;
    if let Some(line) = stopped.iter().find(|l| l.contains("stopped:")) {
        println!("{line}");
    }
    Ok(())
}

/// The curve, the warm rate, the seconds to 90% of it and the one-pass
/// time.
fn print_report(
    image_bytes: u64,
    secs: f64,
    command: &str,
    load_before: &str,
    iops_per_second: &[f64],
) -> Result<()> {
    if iops_per_second.len() < 8 {
        bail!(
            "fio logged {} seconds of IOPS; too few",
            iops_per_second.len()
        );
    }
    let (warm_iops, first_warm) = super::warmup::warm_level(iops_per_second);
    let secs_to_90pct = first_warm.map(|i| i as f64 + 1.0);
    let records = image_bytes / RECORDSIZE_BYTES;
    let service_ms = (SEEK_MS_MIN + SEEK_MS_MAX) / 2.0
        + RECORDSIZE_BYTES as f64 / (TRANSFER_MIB_PER_SEC * (1 << 20) as f64) * 1000.0;
    let one_pass_secs = records as f64 * service_ms / 1000.0 / f64::from(SPINDLES);
    println!(
        "NBD warm-up: random 4 KiB reads, fio nbd engine, queue depth {QUEUE_DEPTH}, {} MiB image on an emulated {SPINDLES}-spindle HDD ({SEEK_MS_MIN}-{SEEK_MS_MAX} ms, {TRANSFER_MIB_PER_SEC} MiB/s), {secs:.0} s from an empty cache; load before {load_before}, after {}",
        image_bytes >> 20,
        crate::load_average()
    );
    println!("ours: {command}");
    let curve: Vec<String> = iops_per_second
        .chunks(5)
        .enumerate()
        .map(|(i, c)| format!("{}s {:.0}", i * 5, c.iter().sum::<f64>() / c.len() as f64))
        .collect();
    println!("IOPS, mean of each 5 s: {}", curve.join(", "));
    match secs_to_90pct {
        Some(t) => println!(
            "warm: {warm_iops:.0} IOPS (median second of the last quarter); 90% of it first at {t:.0} s; one pass over the image from the disks: {one_pass_secs:.1} s; ratio {:.2}x (goal 1.2x)",
            t / one_pass_secs
        ),
        None => println!("warm: {warm_iops:.0} IOPS; never at 90% of it"),
    }
    Ok(())
}
