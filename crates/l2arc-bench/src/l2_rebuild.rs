//! Index rebuild from a warm cache device: records restored per second.
//!
//! A restart should not cost the L2ARC its contents: the index is rebuilt
//! from the device's log (`docs/format.md`, "Rebuild"). This measures how
//! fast. For 4 KiB and 8 KiB records, a cache file (in a temporary directory,
//! or `--cache`) is filled through the real write path (`L2Arc::write_batch`,
//! the feeder's batches of up to 16 MiB, each with its log block and header
//! update) until it holds `--records` records (default 262,144: 1 GiB and
//! 2 GiB devices), without wrapping. Then the page cache is dropped
//! (`/proc/sys/vm/drop_caches`; cache devices are opened O_DIRECT anyway,
//! which the report shows) and a fresh `L2Arc` opens the device and rebuilds
//! its index, timed from `add_device` until the rebuild thread is done; once
//! into an index pre-sized for the records, once into one grown from empty.
//! Every record written must come back (`l2_rebuild_bufs`), with no log
//! block failing its checks, and a sample of records is read back and
//! checked byte for byte.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use l2arc::hash::mix64;
use l2arc::internals::format::{self, Compression, DATA_START_BYTES};
use l2arc::internals::{BATCH_BYTES_MAX, FeedRecord, L2Arc};
use l2arc::{DeviceIo, FileDevice};
use l2arc::{DeviceOpen, L2ArcConfig};
use serde::Serialize;

use super::BenchArgs;

const RECORD_SIZES: [u64; 2] = [4 << 10, 8 << 10];
const DEFAULT_RECORDS: u64 = 262_144;
const GOAL_RECORDS_PER_SEC: f64 = 2e6;
const SAMPLE_READS: u64 = 2000;
/// Rebuilds per index mode; the median is reported (the machine is shared).
const REPEATS: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Index {
    /// `L2Arc::new(config, records)`.
    PreSized,
    /// `L2Arc::new(config, 0)`: the index grows during the rebuild.
    GrownFromEmpty,
}

#[derive(Serialize)]
struct Row {
    record_bytes: u64,
    device_bytes: u64,
    records_written: u64,
    log_blocks: u64,
    fill_mib_per_sec: f64,
    index: Index,
    page_cache_dropped: bool,
    direct_io: bool,
    records_restored: u64,
    /// The median of `REPEATS` rebuilds, and the fastest and slowest.
    rebuild_secs: f64,
    rebuild_secs_min: f64,
    rebuild_secs_max: f64,
    /// The rebuild thread's own timing (`l2_rebuild_time_us`).
    rebuild_thread_secs: f64,
    records_per_sec: f64,
    /// Rebuild time scaled to a 1 TiB device of these records.
    secs_per_tib: f64,
    meets_goal: bool,
}

#[derive(Serialize)]
struct Report {
    goal_records_per_sec: f64,
    rows: Vec<Row>,
}

/// The identity of record `n` of the run for `record_bytes`.
fn key(record_bytes: u64, n: u64) -> u64 {
    mix64(n ^ (record_bytes << 40) ^ 0x7265_6275_696c_6400).max(1)
}

/// The bytes of a record: its key, then a fixed pattern.
fn fill_record(key: u64, out: &mut [u8]) {
    for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&(key ^ mix64(i as u64)).to_le_bytes());
    }
    out[..8].copy_from_slice(&key.to_le_bytes());
}

/// Writes `records` records through `L2Arc::write_batch`; returns log blocks
/// written and seconds taken.
fn fill(l2: &L2Arc, record_bytes: u64, records: u64) -> Result<(u64, f64)> {
    let started = Instant::now();
    let per_batch = (BATCH_BYTES_MAX / record_bytes) as usize;
    let mut buf = vec![0u8; per_batch * record_bytes as usize];
    let mut next = 0u64;
    let mut batches = 0u64;
    while next < records {
        let n = per_batch.min((records - next) as usize);
        for (i, chunk) in buf
            .chunks_exact_mut(record_bytes as usize)
            .take(n)
            .enumerate()
        {
            fill_record(key(record_bytes, next + i as u64), chunk);
        }
        let batch: Vec<FeedRecord<'_>> = buf
            .chunks_exact(record_bytes as usize)
            .take(n)
            .enumerate()
            .map(|(i, data)| FeedRecord {
                key_hash: key(record_bytes, next + i as u64),
                data,
                compression: Compression::Off,
            })
            .collect();
        let (_, written) = l2.write_batch(&batch).context("writing the warm device")?;
        if written == 0 {
            bail!("the cache device took no records (offline?)");
        }
        next += written as u64;
        batches += 1;
    }
    Ok((batches, started.elapsed().as_secs_f64()))
}

/// The device size that holds `records` records and their log blocks
/// without the hand wrapping.
fn device_bytes_for(record_bytes: u64, records: u64) -> u64 {
    let per_batch = BATCH_BYTES_MAX / record_bytes;
    let batches = records.div_ceil(per_batch - 64);
    let log_bytes = format::log_block_size_bytes(per_batch as usize) as u64;
    let data = records * record_bytes + batches * log_bytes + 2 * BATCH_BYTES_MAX;
    // At least four batches of room, so that batches are full size.
    (DATA_START_BYTES + data.max(4 * BATCH_BYTES_MAX)).next_multiple_of(1 << 20)
}

/// Drops the page cache (needs root); false if it could not.
fn drop_page_cache() -> bool {
    let _ = std::process::Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

pub(crate) fn run(args: &BenchArgs) -> Result<()> {
    let counts = if args.records.is_empty() {
        vec![DEFAULT_RECORDS]
    } else {
        args.records.clone()
    };
    let temp = tempfile::tempdir().context("cannot make a temporary directory")?;
    let mut rows = Vec::new();
    for &records in &counts {
        for record_bytes in RECORD_SIZES {
            rows.extend(one_device(args, temp.path(), record_bytes, records)?);
        }
    }
    let report = Report {
        goal_records_per_sec: GOAL_RECORDS_PER_SEC,
        rows,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "L2ARC rebuild: index restored from a warm device's log (goal {:.0} M records/s)",
        GOAL_RECORDS_PER_SEC / 1e6
    );
    println!(
        "{:>6} {:>9} {:>9} {:>6} {:>8} {:<15} {:>6} {:>9} {:>9} {:>11} {:>9} {:>6}",
        "record",
        "device",
        "records",
        "logs",
        "fill",
        "index",
        "direct",
        "restored",
        "rebuild",
        "records/s",
        "per TiB",
        "goal"
    );
    for r in &report.rows {
        println!(
            "{:>4}K {:>5} MiB {:>9} {:>6} {:>4.0}MB/s {:<15} {:>6} {:>9} {:>7.3} s {:>9.2} M {:>7.1} s {:>6}",
            r.record_bytes >> 10,
            r.device_bytes >> 20,
            r.records_written,
            r.log_blocks,
            r.fill_mib_per_sec * 1.048_576,
            format!("{:?}", r.index),
            if r.direct_io { "yes" } else { "no" },
            r.records_restored,
            r.rebuild_secs,
            r.records_per_sec / 1e6,
            r.secs_per_tib,
            if r.meets_goal { "met" } else { "MISSED" },
        );
    }
    if report.rows.iter().any(|r| !r.page_cache_dropped) {
        println!("(the page cache could not be dropped: not root?)");
    }
    Ok(())
}

fn one_device(
    args: &BenchArgs,
    dir: &std::path::Path,
    record_bytes: u64,
    records: u64,
) -> Result<Vec<Row>> {
    let path = match args.cache.first() {
        Some(path) => path.clone(),
        None => dir.join(format!("rebuild-{}k.cache", record_bytes >> 10)),
    };
    let device_bytes = device_bytes_for(record_bytes, records);
    if !args.json {
        eprintln!(
            "filling {} ({} MiB) with {records} records of {} KiB...",
            path.display(),
            device_bytes >> 20,
            record_bytes >> 10
        );
    }
    let config = L2ArcConfig::default();
    let (log_blocks, fill_secs, direct) =
        warm_device(&config, &path, device_bytes, record_bytes, records)?;

    let mut rows = Vec::new();
    let dropped_once = drop_page_cache();
    for index in [Index::PreSized, Index::GrownFromEmpty] {
        let mut runs: Vec<(f64, f64, bool)> = (0..REPEATS)
            .map(|i| {
                // Dropped before the first rebuild. O_DIRECT reads bypass
                // the page cache, so only a buffered device needs it dropped
                // again before every rebuild.
                let dropped = if direct || (i == 0 && index == Index::PreSized) {
                    dropped_once
                } else {
                    drop_page_cache()
                };
                rebuild_once(&config, &path, index, record_bytes, records)
                    .map(|(secs, thread_secs)| (secs, thread_secs, dropped))
            })
            .collect::<Result<_>>()?;
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (rebuild_secs, rebuild_thread_secs, dropped) = runs[runs.len() / 2];
        let records_per_sec = records as f64 / rebuild_secs;
        rows.push(Row {
            record_bytes,
            device_bytes,
            records_written: records,
            log_blocks,
            fill_mib_per_sec: (records * record_bytes) as f64 / fill_secs / (1 << 20) as f64,
            index,
            page_cache_dropped: dropped,
            direct_io: direct,
            records_restored: records,
            rebuild_secs,
            rebuild_secs_min: runs[0].0,
            rebuild_secs_max: runs[runs.len() - 1].0,
            rebuild_thread_secs,
            records_per_sec,
            secs_per_tib: rebuild_secs * (1u64 << 40) as f64 / device_bytes as f64,
            meets_goal: records_per_sec >= GOAL_RECORDS_PER_SEC,
        });
    }
    if args.cache.is_empty() {
        std::fs::remove_file(&path).ok();
    }
    Ok(rows)
}

/// Fills a device of `device_bytes` at `path` with `records` records
/// through the write path; returns the log blocks written, the seconds
/// taken, and whether the device is opened O_DIRECT.
fn warm_device(
    config: &L2ArcConfig,
    path: &std::path::Path,
    device_bytes: u64,
    record_bytes: u64,
    records: u64,
) -> Result<(u64, f64, bool)> {
    let device = FileDevice::open(path, Some(device_bytes))?;
    if device.size_bytes() < device_bytes {
        bail!(
            "{}: {} bytes, {device_bytes} needed for {records} records of {record_bytes} bytes",
            path.display(),
            device.size_bytes()
        );
    }
    let direct = device.is_direct();
    // Start empty: an l2arc log left by an earlier run is reused, not
    // rebuilt (anything else on the device is refused).
    let fill_config = L2ArcConfig {
        l2arc_rebuild_enabled: false,
        ..config.clone()
    };
    let l2 = Arc::new(L2Arc::new(fill_config, records as usize));
    l2.add_device(Box::new(device))?;
    let (log_blocks, secs) = fill(&l2, record_bytes, records)?;
    let bufs = l2.stats().get("l2_bufs");
    if bufs != records {
        bail!("the warm device holds {bufs} records, not {records}");
    }
    l2.stop();
    Ok((log_blocks, secs, direct))
}

/// Rebuilds the device into a fresh L2Arc and checks that every record came
/// back; returns the seconds from `add_device` to the end of the rebuild
/// and the rebuild thread's own seconds.
fn rebuild_once(
    config: &L2ArcConfig,
    path: &std::path::Path,
    index: Index,
    record_bytes: u64,
    records: u64,
) -> Result<(f64, f64)> {
    let l2 = Arc::new(L2Arc::new(
        config.clone(),
        match index {
            Index::PreSized => records as usize,
            Index::GrownFromEmpty => 0,
        },
    ));
    let device = FileDevice::open(path, None)?;
    let started = Instant::now();
    let (_, opened) = l2.add_device(Box::new(device))?;
    if opened != DeviceOpen::Rebuilding {
        bail!("{}: opened as {opened:?}, not rebuilt", path.display());
    }
    if !l2.wait_for_rebuild(Duration::from_secs(3600)) {
        bail!("the rebuild took over an hour");
    }
    let rebuild_secs = started.elapsed().as_secs_f64();
    let stats = l2.stats();
    for name in [
        "l2_rebuild_cksum_lb_errors",
        "l2_rebuild_io_errors",
        "l2_rebuild_dh_errors",
    ] {
        if stats.get(name) != 0 {
            bail!("rebuild: {name} = {}", stats.get(name));
        }
    }
    let restored = stats.get("l2_rebuild_bufs");
    if restored != records {
        bail!("the rebuild restored {restored} of {records} records");
    }
    // A sample of records comes back whole.
    let mut expected = vec![0u8; record_bytes as usize];
    for n in (0..records).step_by((records / SAMPLE_READS).max(1) as usize) {
        let k = key(record_bytes, n);
        fill_record(k, &mut expected);
        match l2.read(k, record_bytes as u32) {
            Some(data) if *data == *expected => {}
            Some(_) => bail!("record {n}: wrong bytes after the rebuild"),
            None => bail!("record {n}: not served after the rebuild"),
        }
    }
    l2.stop();
    Ok((rebuild_secs, stats.get("l2_rebuild_time_us") as f64 / 1e6))
}
