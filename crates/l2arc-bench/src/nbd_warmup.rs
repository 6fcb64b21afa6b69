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

use l2arc::primary::emulated_hdd::HddConfig;

use super::BenchArgs;
use super::nbd::{
    nbd_randread, require_tools, scenario_image, shell_words, spawn, wait_for_socket,
};

const QUEUE_DEPTH: usize = 32;
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
    // The emulation's own defaults: what the one-pass time is computed for.
    let hdd = HddConfig::default();
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
        .arg(format!("--emulate-hdd-spindles={}", hdd.spindles))
        .arg(format!("--emulate-hdd-seek-ms-min={}", hdd.seek_ms_min))
        .arg(format!("--emulate-hdd-seek-ms-max={}", hdd.seek_ms_max));
    let command = shell_words(&cmd);
    let mut server = spawn(cmd)?;
    wait_for_socket(&mut server, &socket)?;
    let load_before = crate::load_average();
    let read = nbd_randread(
        "nbd-warmup",
        &format!("nbd+unix:///?socket={}", socket.display()),
        (image_bytes, QUEUE_DEPTH),
        secs,
        args.seed,
    )
    .iops_log()
    .run(Some(tmp.path()))?;
    let stopped = server.stop();
    let _ = std::fs::remove_file(&cache);
    print_report(
        (image_bytes, &hdd),
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
    (image_bytes, hdd): (u64, &HddConfig),
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
    let one_pass_secs =
        records as f64 * hdd.mean_service_ms(RECORDSIZE_BYTES) / 1000.0 / hdd.spindles as f64;
    println!(
        "NBD warm-up: random 4 KiB reads, fio nbd engine, queue depth {QUEUE_DEPTH}, {} MiB image on an emulated {}-spindle HDD ({}-{} ms, {} MiB/s), {secs:.0} s from an empty cache; load before {load_before}, after {}",
        image_bytes >> 20,
        hdd.spindles,
        hdd.seek_ms_min,
        hdd.seek_ms_max,
        hdd.transfer_mib_per_sec,
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
