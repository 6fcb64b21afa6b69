//! Index rebuild from a warm cache device: records restored per second.
//!
//! A restart should not cost the L2ARC its contents: the index is rebuilt
//! from the device's log (`docs/format.md`, "Rebuild"). This measures how
//! fast, for 4 KiB and 8 KiB records, on a cache file (in a temporary
//! directory, or `--cache`) warmed in one of two ways:
//!
//! - Up to `FILLED_RECORDS_MAX` records (default 262,144: 1 GiB and 2 GiB
//!   devices), filled through the real write path (`L2Arc::write_batch`,
//!   the feeder's batches of up to 16 MiB, each with its log block and
//!   header update), records and all.
//! - Above it (`--records 100M` would need a 400 GB device for 4 KiB
//!   records), log only: a sparse file of the full size, where
//!   `L2Arc::write_log_only_batch` lays every batch out as the writer does
//!   and writes its real log block (real CRCs, real pointers, the header
//!   after each batch) but leaves the records' blocks as holes. A rebuild
//!   reads log blocks only, never a record, so it reads exactly the same
//!   bytes at the same offsets either way; only the records' contents differ
//!   (zeros, which the entries' checksums are computed for, so sampled
//!   reads still come back verified). Only the log takes disk space (~20
//!   bytes a record); the free space is checked first.
//!
//! Then the page cache is dropped (`/proc/sys/vm/drop_caches`; cache devices
//! are opened O_DIRECT anyway, which the report shows), and a fresh `L2Arc`
//! opens the device and rebuilds its index, timed from `add_device` until
//! the rebuild is done; once into an index pre-sized for the records, once
//! into one grown from empty (the rebuild sizes it from the log). Every
//! record written must come back (`l2_rebuild_bufs`), with no log block
//! failing its checks, and a sample of records is read back and checked
//! byte for byte. The report gives the log bytes read and their rate, DRAM
//! per record of the index (`l2_hdr_size`), and the load average before and
//! after each row's rebuilds (the machine is shared).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use l2arc::hash::mix64;
use l2arc::internals::format::{self, Compression, DATA_START_BYTES};
use l2arc::internals::{
    BATCH_BYTES_MAX, FeedRecord, L2Arc, LogOnlyRecord, REBUILD_BUFFER_BYTES_MAX,
};
use l2arc::{DeviceIo, FileDevice};
use l2arc::{DeviceOpen, L2ArcConfig};
use serde::Serialize;

use crate::BenchArgs;

use super::{Goal, Headline, Outcome, Scenario};

const RECORD_SIZES: [u64; 2] = [4 << 10, 8 << 10];
const DEFAULT_RECORDS: u64 = 262_144;
/// Devices of more records are written log only, on a sparse file.
const FILLED_RECORDS_MAX: u64 = 1 << 20;
/// Disk space kept free beyond a log-only device's log.
const FREE_MARGIN_BYTES: u64 = 1 << 30;
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

/// How the warm device was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Warm {
    /// Records and log, through `write_batch`.
    Filled,
    /// Log blocks only, on a sparse file (records are holes).
    LogOnly,
}

#[derive(Serialize)]
struct Row {
    record_bytes: u64,
    device_bytes: u64,
    warm: Warm,
    records_written: u64,
    log_blocks: u64,
    /// Bytes of log blocks on the device: what a rebuild reads.
    log_bytes: u64,
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
    /// Log bytes read per second of rebuild (median run).
    log_mib_per_sec: f64,
    /// DRAM of the index per record restored (`l2_hdr_size`).
    index_bytes_per_record: f64,
    /// Rebuild time scaled to a 1 TiB device of these records.
    secs_per_tib: f64,
    meets_goal: bool,
    /// `/proc/loadavg` before the row's first rebuild and after its last.
    load_before: String,
    load_after: String,
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
/// and log bytes written and the seconds taken.
fn fill(l2: &L2Arc, record_bytes: u64, records: u64) -> Result<(u64, u64, f64)> {
    let started = Instant::now();
    let per_batch = (BATCH_BYTES_MAX / record_bytes) as usize;
    let mut buf = vec![0u8; per_batch * record_bytes as usize];
    let (mut next, mut batches, mut log_bytes) = (0u64, 0u64, 0u64);
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
                sector_table_min_bytes: l2arc::internals::format::SECTOR_TABLE_RECORD_BYTES_MIN
                    as u32,
            })
            .collect();
        let (_, written) = l2.write_batch(&batch).context("writing the warm device")?;
        if written == 0 {
            bail!("the cache device took no records (offline?)");
        }
        next += written as u64;
        batches += 1;
        log_bytes += format::log_block_size_bytes(written) as u64;
    }
    Ok((batches, log_bytes, started.elapsed().as_secs_f64()))
}

/// The device size that holds `records` records and their log blocks
/// without the hand wrapping.
fn device_bytes_for(record_bytes: u64, records: u64) -> u64 {
    let data = records * record_bytes + log_bytes_max(record_bytes, records) + 2 * BATCH_BYTES_MAX;
    // At least four batches of room, so that batches are full size.
    (DATA_START_BYTES + data.max(4 * BATCH_BYTES_MAX)).next_multiple_of(1 << 20)
}

/// At most the bytes of log blocks for `records` records in full batches
/// of 16 MiB (a device of more than 1 GiB has them: `batch_blocks_for`).
fn log_bytes_max(record_bytes: u64, records: u64) -> u64 {
    let per_batch = BATCH_BYTES_MAX / record_bytes;
    let batches = records.div_ceil(per_batch - 64);
    batches * format::log_block_size_bytes(per_batch as usize) as u64
}

/// `format::record_checksum(key, zeros)` for a fixed length of zeros and
/// any key, in O(1): CRC-32C is affine over GF(2), so for messages of one
/// length `crc(a ^ b) = crc(a) ^ crc(b) ^ crc(0)`, and the checksum of a key
/// is that of key 0 with one table entry per key byte xored in. (Computing
/// it over 4 KiB of zeros for each of 100 M records would take minutes.)
struct ZeroRecordChecksum {
    zero_key: u32,
    tables: Box<[[u32; 256]; 8]>,
}

impl ZeroRecordChecksum {
    fn new(stored_bytes: usize) -> Self {
        let zeros = vec![0u8; stored_bytes];
        let zero_key = format::record_checksum(0, &zeros);
        let mut tables = Box::new([[0u32; 256]; 8]);
        for (i, table) in tables.iter_mut().enumerate() {
            for (byte, slot) in table.iter_mut().enumerate() {
                *slot = format::record_checksum((byte as u64) << (8 * i), &zeros) ^ zero_key;
            }
        }
        Self { zero_key, tables }
    }

    fn checksum(&self, key: u64) -> u32 {
        self.tables
            .iter()
            .enumerate()
            .fold(self.zero_key, |c, (i, table)| {
                c ^ table[(key >> (8 * i)) as usize & 0xFF]
            })
    }
}

/// Writes the log of `records` records (no record bytes) through
/// `L2Arc::write_log_only_batch`; returns log blocks and log bytes written
/// and the seconds taken.
fn fill_log_only(l2: &L2Arc, record_bytes: u64, records: u64) -> Result<(u64, u64, f64)> {
    let started = Instant::now();
    let zero = ZeroRecordChecksum::new(record_bytes as usize);
    let per_batch = (BATCH_BYTES_MAX / record_bytes) as usize;
    let mut batch = Vec::with_capacity(per_batch);
    let (mut next, mut batches, mut log_bytes) = (0u64, 0u64, 0u64);
    while next < records {
        let n = per_batch.min((records - next) as usize);
        batch.clear();
        batch.extend((next..next + n as u64).map(|i| {
            let key_hash = key(record_bytes, i);
            LogOnlyRecord {
                key_hash,
                stored_bytes: record_bytes as u32,
                checksum: zero.checksum(key_hash),
            }
        }));
        let (_, written) = l2
            .write_log_only_batch(&batch)
            .context("writing the warm device's log")?;
        if written == 0 {
            bail!("the cache device took no records (offline?)");
        }
        next += written as u64;
        batches += 1;
        log_bytes += format::log_block_size_bytes(written) as u64;
    }
    l2.sync_devices().context("syncing the warm device")?;
    Ok((batches, log_bytes, started.elapsed().as_secs_f64()))
}

/// Free bytes of the file system holding `dir`.
fn free_bytes(dir: &std::path::Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: statvfs is plain data; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a pointer to a statvfs to fill.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error()).context(format!("statvfs {}", dir.display()));
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Drops the page cache (needs root); false if it could not.
fn drop_page_cache() -> bool {
    let _ = std::process::Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

pub(crate) fn run(args: &BenchArgs) -> Result<Outcome> {
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
    let headline = report
        .rows
        .iter()
        .filter(|r| r.index == Index::PreSized)
        .map(|r| Headline {
            key: format!("rebuild_{}k", r.record_bytes >> 10),
            what: format!(
                "index rebuild at start, {} records of {} KiB, pre-sized index",
                r.records_restored,
                r.record_bytes >> 10
            ),
            unit: "records/s".to_string(),
            ours: r.records_per_sec,
            baseline_name: "—".to_string(),
            baseline: None,
            ratio: None,
            ratio_is: String::new(),
            round_ratios: Vec::new(),
            goal: Goal::ours(true, GOAL_RECORDS_PER_SEC),
        })
        .collect();
    Outcome::new(report, headline, print_table)
}

fn print_table(report: &Report) {
    println!(
        "L2ARC rebuild: index restored from a warm device's log (goal {:.0} M records/s; \
         rebuild buffers at most {} MiB)",
        GOAL_RECORDS_PER_SEC / 1e6,
        REBUILD_BUFFER_BYTES_MAX >> 20
    );
    println!(
        "{:>6} {:>10} {:<8} {:>10} {:>6} {:>8} {:<15} {:>6} {:>10} {:>9} {:>9} {:>9} {:>7} {:>8} {:>6}  load before -> after",
        "record",
        "device",
        "warm",
        "records",
        "logs",
        "log MiB",
        "index",
        "direct",
        "restored",
        "rebuild",
        "records/s",
        "log MiB/s",
        "index B",
        "per TiB",
        "goal"
    );
    for r in &report.rows {
        println!(
            "{:>4}K {:>6} GiB {:<8} {:>10} {:>6} {:>8.0} {:<15} {:>6} {:>10} {:>7.3} s {:>7.2} M {:>9.0} {:>7.1} {:>6.1} s {:>6}  {} -> {}",
            r.record_bytes >> 10,
            r.device_bytes >> 30,
            format!("{:?}", r.warm),
            r.records_written,
            r.log_blocks,
            r.log_bytes as f64 / (1 << 20) as f64,
            format!("{:?}", r.index),
            if r.direct_io { "yes" } else { "no" },
            r.records_restored,
            r.rebuild_secs,
            r.records_per_sec / 1e6,
            r.log_mib_per_sec,
            r.index_bytes_per_record,
            r.secs_per_tib,
            if r.meets_goal { "met" } else { "MISSED" },
            r.load_before,
            r.load_after,
        );
    }
    if report.rows.iter().any(|r| r.warm == Warm::LogOnly) {
        println!(
            "LogOnly: the records' blocks are holes of a sparse file (their entries checksum zeros); \
             a rebuild reads only log blocks, the same bytes at the same offsets as on a filled device"
        );
    }
    if report.rows.iter().any(|r| !r.page_cache_dropped) {
        println!("(the page cache could not be dropped: not root?)");
    }
}

/// The first field of `/proc/loadavg`.
fn load_1min() -> String {
    crate::load_average()
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_string()
}

/// A warm device, as written.
struct Written {
    warm: Warm,
    log_blocks: u64,
    log_bytes: u64,
    fill_secs: f64,
    direct: bool,
}

/// MiB written per second of filling: records and log, or log only.
fn fill_mib_per_sec(written: &Written, records_bytes: u64) -> f64 {
    let bytes = match written.warm {
        Warm::Filled => records_bytes,
        Warm::LogOnly => written.log_bytes,
    };
    bytes as f64 / written.fill_secs / (1 << 20) as f64
}

/// Checks there is room for the warm device and says what is written.
fn announce(
    args: &BenchArgs,
    path: &std::path::Path,
    dir: &std::path::Path,
    (record_bytes, records): (u64, u64),
    device_bytes: u64,
    warm: Warm,
) -> Result<()> {
    let needed_bytes = match warm {
        Warm::Filled => device_bytes,
        Warm::LogOnly => log_bytes_max(record_bytes, records) + DATA_START_BYTES,
    };
    let parent = path.parent().unwrap_or(dir);
    let free = free_bytes(parent)?;
    if !path.exists() && free < needed_bytes + FREE_MARGIN_BYTES {
        bail!(
            "{}: {} MiB free, {} MiB needed for {records} records of {} KiB ({:?}, plus {} MiB kept free)",
            parent.display(),
            free >> 20,
            needed_bytes >> 20,
            record_bytes >> 10,
            warm,
            FREE_MARGIN_BYTES >> 20
        );
    }
    if !args.json {
        eprintln!(
            "writing {} ({} MiB{}) with {records} records of {} KiB{}...",
            path.display(),
            device_bytes >> 20,
            if warm == Warm::LogOnly {
                ", sparse"
            } else {
                ""
            },
            record_bytes >> 10,
            if warm == Warm::LogOnly {
                ": log blocks only, records left as holes"
            } else {
                ""
            }
        );
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
    let warm = if records > FILLED_RECORDS_MAX {
        Warm::LogOnly
    } else {
        Warm::Filled
    };
    let shape = (record_bytes, records);
    announce(args, &path, dir, shape, device_bytes, warm)?;
    let config = L2ArcConfig::default();
    let written = warm_device(&config, &path, device_bytes, record_bytes, records, warm)?;
    let direct = written.direct;

    let mut rows = Vec::new();
    let dropped_once = drop_page_cache();
    for index in [Index::PreSized, Index::GrownFromEmpty] {
        let load_before = load_1min();
        let mut runs: Vec<(f64, f64, bool, u64, u64)> = (0..REPEATS)
            .map(|i| {
                // Dropped before the first rebuild. O_DIRECT reads bypass
                // the page cache, so only a buffered device needs it dropped
                // again before every rebuild.
                let dropped = if direct || (i == 0 && index == Index::PreSized) {
                    dropped_once
                } else {
                    drop_page_cache()
                };
                rebuild_once(&config, &path, index, record_bytes, records, warm).map(
                    |(secs, thread_secs, index_bytes, restored)| {
                        (secs, thread_secs, dropped, index_bytes, restored)
                    },
                )
            })
            .collect::<Result<_>>()?;
        let load_after = load_1min();
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (rebuild_secs, rebuild_thread_secs, dropped, index_bytes, restored) =
            runs[runs.len() / 2];
        let records_per_sec = records as f64 / rebuild_secs;
        rows.push(Row {
            record_bytes,
            device_bytes,
            warm: written.warm,
            records_written: records,
            log_blocks: written.log_blocks,
            log_bytes: written.log_bytes,
            fill_mib_per_sec: fill_mib_per_sec(&written, records * record_bytes),
            index,
            page_cache_dropped: dropped,
            direct_io: direct,
            records_restored: restored,
            rebuild_secs,
            rebuild_secs_min: runs[0].0,
            rebuild_secs_max: runs[runs.len() - 1].0,
            rebuild_thread_secs,
            records_per_sec,
            log_mib_per_sec: written.log_bytes as f64 / rebuild_secs / (1 << 20) as f64,
            index_bytes_per_record: index_bytes as f64 / records as f64,
            secs_per_tib: rebuild_secs * (1u64 << 40) as f64 / device_bytes as f64,
            meets_goal: records_per_sec >= GOAL_RECORDS_PER_SEC,
            load_before,
            load_after,
        });
    }
    if args.cache.is_empty() {
        std::fs::remove_file(&path).ok();
    }
    Ok(rows)
}

/// Writes a device of `device_bytes` at `path` with `records` records, in
/// full (`Warm::Filled`) or log only on a sparse file (`Warm::LogOnly`).
fn warm_device(
    config: &L2ArcConfig,
    path: &std::path::Path,
    device_bytes: u64,
    record_bytes: u64,
    records: u64,
    warm: Warm,
) -> Result<Written> {
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
    let fill_config = config.clone().l2arc_rebuild_enabled(false);
    let (log_blocks, log_bytes, fill_secs) = match warm {
        Warm::Filled => {
            let l2 = Arc::new(L2Arc::new(fill_config, records as usize));
            l2.add_device(Box::new(device))?;
            let (log_blocks, log_bytes, secs) = fill(&l2, record_bytes, records)?;
            // All, but records that share the index's fingerprint with a
            // later one (each replaced the other's entry).
            let bufs = l2.stats().get("l2_bufs");
            let lost_max = super::l2_index::records_lost_max(records, l2.index_fingerprint_bits());
            if bufs > records || records - bufs > lost_max {
                bail!("the warm device holds {bufs} records, not {records}");
            }
            l2.stop();
            (log_blocks, log_bytes, secs)
        }
        Warm::LogOnly => {
            let l2 = Arc::new(L2Arc::new(fill_config, 0));
            l2.add_device(Box::new(device))?;
            let written = fill_log_only(&l2, record_bytes, records)?;
            l2.stop();
            written
        }
    };
    Ok(Written {
        warm,
        log_blocks,
        log_bytes,
        fill_secs,
        direct,
    })
}

/// Rebuilds the device into a fresh L2Arc and checks that every record came
/// back; returns the seconds from `add_device` to the end of the rebuild,
/// the rebuild thread's own seconds, and the index's DRAM bytes.
fn rebuild_once(
    config: &L2ArcConfig,
    path: &std::path::Path,
    index: Index,
    record_bytes: u64,
    records: u64,
    warm: Warm,
) -> Result<(f64, f64, u64, u64)> {
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
    // Every record, but those that share the index's fingerprint (the key
    // bits it keeps) with a newer one: the newest of them wins.
    let restored = stats.get("l2_rebuild_bufs");
    let lost = records.saturating_sub(restored);
    let lost_max = super::l2_index::records_lost_max(records, l2.index_fingerprint_bits());
    if restored > records || lost > lost_max {
        bail!("the rebuild restored {restored} of {records} records");
    }
    // A sample of records comes back whole (or, for a record lost to a
    // fingerprint collision, is a miss).
    let mut expected = vec![0u8; record_bytes as usize];
    let mut missed = 0;
    for n in (0..records).step_by((records / SAMPLE_READS).max(1) as usize) {
        let k = key(record_bytes, n);
        if warm == Warm::Filled {
            fill_record(k, &mut expected);
        }
        match l2.read(k, record_bytes as u32) {
            Some(data) if *data == *expected => {}
            Some(_) => bail!("record {n}: wrong bytes after the rebuild"),
            None if missed < lost => missed += 1,
            None => bail!("record {n}: not served after the rebuild"),
        }
    }
    l2.stop();
    Ok((
        rebuild_secs,
        stats.get("l2_rebuild_time_us") as f64 / 1e6,
        stats.get("l2_hdr_size"),
        restored,
    ))
}

/// `--scenario l2-rebuild`.
pub(crate) struct L2Rebuild;

impl Scenario for L2Rebuild {
    fn name(&self) -> &'static str {
        "l2-rebuild"
    }
    fn measures(&self) -> &'static str {
        "Index rebuild from a warm device: records restored per second."
    }
    fn run(&self, args: &BenchArgs) -> Result<Outcome> {
        run(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_record_checksum_matches_the_engine() {
        for stored_bytes in [4096usize, 8192, 100] {
            let zero = ZeroRecordChecksum::new(stored_bytes);
            let zeros = vec![0u8; stored_bytes];
            for n in 0..1000u64 {
                let k = key(stored_bytes as u64, n);
                assert_eq!(zero.checksum(k), format::record_checksum(k, &zeros));
            }
        }
    }

    #[test]
    fn log_only_device_rebuilds_and_serves_zeros() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log-only.cache");
        let (record_bytes, records) = (4096u64, 20_000u64);
        let config = L2ArcConfig::default();
        let device_bytes = device_bytes_for(record_bytes, records);
        let written = warm_device(
            &config,
            &path,
            device_bytes,
            record_bytes,
            records,
            Warm::LogOnly,
        )
        .expect("warm");
        assert!(written.log_blocks >= records / 4096);
        assert!(written.log_bytes >= records * 20);
        // Sparse: the file holds about its log, not its records.
        use std::os::unix::fs::MetadataExt;
        let allocated_bytes = std::fs::metadata(&path).expect("metadata").blocks() * 512;
        assert!(
            allocated_bytes < records * record_bytes / 4,
            "{allocated_bytes}"
        );
        for index in [Index::PreSized, Index::GrownFromEmpty] {
            let (_, _, index_bytes, restored) =
                rebuild_once(&config, &path, index, record_bytes, records, Warm::LogOnly)
                    .expect("rebuild");
            assert!(index_bytes as f64 / (records as f64) < 32.0);
            assert!(
                restored <= records && restored + 16 >= records,
                "{restored}"
            );
        }
    }
}
