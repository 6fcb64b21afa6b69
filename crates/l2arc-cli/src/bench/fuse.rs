//! `--scenario fuse`: what the FUSE mount costs on hits.
//!
//! The mount exists to put RAM (and flash) in front of slow storage, but
//! every read through it crosses the kernel twice more than a read of a
//! local file. This measures that toll where it is largest: on hits. The
//! same files are read by fio three ways, one after the other:
//!
//! - through the mount, warm: every record is in the ARC, and fio opens with
//!   O_DIRECT so that each read reaches our daemon (buffered reads would be
//!   served by the kernel's page cache over FUSE and measure that instead);
//! - the source directly with its page cache dropped first
//!   (`echo 3 > /proc/sys/vm/drop_caches`) and O_DIRECT (buffered reads
//!   would warm the page cache within seconds): what a reader pays without
//!   a cache in RAM (on a fast local disk; a real slow source costs far more);
//! - the source directly, warm in the page cache: the best any file read
//!   can do on this machine.
//!
//! For random 4 KiB and sequential 128 KiB psync reads at queue depth 1 it
//! reports IOPS, MiB/s, p50/p99 latency and the mount's ratios to both.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use l2arc::primary::dir::DirPrimary;
use l2arc::{Cache, CacheConfig, DatasetConfig};
use l2arc_fuse::{CachedFs, FsOptions, MountOptions};
use serde::Serialize;

use super::BenchArgs;

/// Files and their size: 128 MiB in all, small enough to stay in the ARC.
const FILES: usize = 4;
const FILE_BYTES: u64 = 32 << 20;
/// Default measured seconds per fio run (--measure-secs overrides).
const DEFAULT_RUN_SECS: f64 = 8.0;

#[derive(Serialize, Clone)]
struct Side {
    iops: f64,
    mib_per_sec: f64,
    latency_us_p50: f64,
    latency_us_p99: f64,
}

#[derive(Serialize)]
struct Row {
    workload: String,
    block_bytes: u64,
    mount_arc_hits: Side,
    src_uncached: Side,
    src_page_cache_warm: Side,
    /// Mount IOPS over the source's, uncached (page cache dropped, O_DIRECT).
    mount_over_uncached: f64,
    /// Mount IOPS over the source's, warm in the page cache.
    mount_over_warm: f64,
    /// ARC hit ratio of the reads the mount served during its run.
    mount_arc_hit_ratio: f64,
}

#[derive(Serialize)]
struct Report {
    machine: super::l2_hit::Machine,
    data_bytes: u64,
    files: usize,
    recordsize_bytes: u32,
    run_secs: f64,
    page_cache_dropped: bool,
    fio_version: String,
    rows: Vec<Row>,
}

fn fio(files: &[PathBuf], rw: &str, block_bytes: u64, direct: bool, secs: f64) -> Result<Side> {
    let names: Vec<String> = files
        .iter()
        .map(|f| f.display().to_string().replace(':', "\\:"))
        .collect();
    let args = [
        "--name=fuse".to_string(),
        format!("--filename={}", names.join(":")),
        "--readonly".into(),
        format!("--direct={}", u8::from(direct)),
        "--invalidate=0".into(),
        format!("--rw={rw}"),
        format!("--bs={block_bytes}"),
        "--ioengine=psync".into(),
        "--numjobs=1".into(),
        "--time_based".into(),
        format!("--runtime={}", secs.ceil().max(1.0) as u64),
        "--norandommap".into(),
        "--randrepeat=0".into(),
        "--lat_percentiles=1".into(),
        "--output-format=json".into(),
    ];
    let read = super::fio::run_json(None, &args)?;
    Ok(Side {
        iops: read.iops,
        mib_per_sec: read.mib_per_sec,
        latency_us_p50: read.latency_us_p50,
        latency_us_p99: read.latency_us_p99,
    })
}

fn drop_page_cache() -> bool {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

fn read_all(files: &[PathBuf]) -> Result<()> {
    for f in files {
        let mut file = std::fs::File::open(f).with_context(|| format!("{}", f.display()))?;
        std::io::copy(&mut file, &mut std::io::sink())?;
    }
    Ok(())
}

/// Unmounts on drop, whatever happened.
struct Mounted {
    mnt: PathBuf,
    session: Option<l2arc_fuse::Session>,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            if l2arc_fuse::unmount(&self.mnt).is_err() {
                let _ = l2arc_fuse::detach_mount(&self.mnt);
            }
            let _ = session.join();
        }
    }
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let fio_version = match Command::new("fio").arg("--version").output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_string(),
        _ => bail!("fio is not installed: --scenario fuse measures with fio; run scripts/setup.sh"),
    };
    let secs = args.measure_secs.unwrap_or(DEFAULT_RUN_SECS);
    if !(secs > 0.0 && secs <= 3600.0) {
        bail!("--measure-secs must be from 0 to 3600, not {secs}");
    }
    let tmp = match &args.data {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            tempfile::tempdir_in(dir)?
        }
        None => tempfile::tempdir()?,
    };
    let src = tmp.path().join("src");
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&src)?;
    std::fs::create_dir(&mnt)?;
    let mut x = args.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for i in 0..FILES {
        let data: Vec<u8> = (0..FILE_BYTES / 8)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect();
        std::fs::write(src.join(format!("f{i}")), data)?;
    }
    let data_bytes = FILES as u64 * FILE_BYTES;

    let recordsize_bytes = l2arc::read_path::validate_recordsize(args.recordsize)?;
    let cache: Arc<Cache> = Cache::new(CacheConfig {
        arc_max_bytes: 2 * data_bytes,
        ..CacheConfig::default()
    })?;
    let primary = Arc::new(DirPrimary::new(&src)?);
    let dataset = cache.add_dataset(
        "bench-fuse",
        Arc::clone(&primary) as Arc<dyn l2arc::primary::Primary>,
        DatasetConfig {
            recordsize_bytes,
            ..DatasetConfig::default()
        },
    )?;
    let fs = CachedFs::new(Arc::clone(&cache), dataset, primary, FsOptions::default())?;
    let session = l2arc_fuse::mount(fs, &mnt, &MountOptions::default())
        .context("mount (is fusermount3 installed? scripts/setup.sh installs it)")?;
    let mounted = Mounted {
        mnt: mnt.clone(),
        session: Some(session),
    };
    let names: Vec<String> = (0..FILES).map(|i| format!("f{i}")).collect();
    let through: Vec<PathBuf> = names.iter().map(|n| mnt.join(n)).collect();
    let direct: Vec<PathBuf> = names.iter().map(|n| src.join(n)).collect();

    // Warm the ARC through the mount (twice: the second pass must be all hits).
    let start = Instant::now();
    read_all(&through)?;
    read_all(&through)?;
    eprintln!(
        "fuse: {} MiB in {FILES} files warmed through the mount in {:.1} s",
        data_bytes >> 20,
        start.elapsed().as_secs_f64()
    );

    let mut rows = Vec::new();
    let mut dropped_all = true;
    for (workload, rw, block_bytes) in [
        ("random 4 KiB", "randread", 4096u64),
        ("sequential 128 KiB", "read", 128 << 10),
    ] {
        let before = cache.stats();
        let mount_side = fio(&through, rw, block_bytes, true, secs)?;
        let after = cache.stats();
        let hits = after.arc.hits - before.arc.hits;
        let lookups = hits + (after.arc.misses - before.arc.misses);
        let dropped = drop_page_cache();
        dropped_all &= dropped;
        // O_DIRECT too: buffered reads would warm the page cache within the run.
        let cold = fio(&direct, rw, block_bytes, true, secs)?;
        read_all(&direct)?;
        let warm = fio(&direct, rw, block_bytes, false, secs)?;
        rows.push(Row {
            workload: workload.to_string(),
            block_bytes,
            mount_over_uncached: mount_side.iops / cold.iops.max(f64::MIN_POSITIVE),
            mount_over_warm: mount_side.iops / warm.iops.max(f64::MIN_POSITIVE),
            mount_arc_hit_ratio: if lookups == 0 {
                0.0
            } else {
                hits as f64 / lookups as f64
            },
            mount_arc_hits: mount_side,
            src_uncached: cold,
            src_page_cache_warm: warm,
        });
    }
    drop(mounted);

    let report = Report {
        machine: super::l2_hit::machine(tmp.path()),
        data_bytes,
        files: FILES,
        recordsize_bytes,
        run_secs: secs,
        page_cache_dropped: dropped_all,
        fio_version,
        rows,
    };
    super::emit(args.json, &report, print_table)
}

fn print_table(r: &Report) {
    println!(
        "FUSE mount overhead on hits: {} MiB in {} files, recordsize {} KiB, fio psync QD1, {} s per run",
        r.data_bytes >> 20,
        r.files,
        r.recordsize_bytes >> 10,
        r.run_secs
    );
    println!(
        "machine: {} CPUs, {:.1} GiB RAM, kernel {}, {}; {}",
        r.machine.cpus, r.machine.ram_gib, r.machine.kernel, r.machine.fs, r.fio_version
    );
    if !r.page_cache_dropped {
        println!("note: could not drop the page cache (not root?) before the uncached runs");
    }
    println!(
        "{:<20} {:<34} {:>10} {:>9} {:>9} {:>9}",
        "workload", "reader", "IOPS", "MiB/s", "p50 us", "p99 us"
    );
    for row in &r.rows {
        for (name, side) in [
            ("mount, ARC hits (O_DIRECT)", &row.mount_arc_hits),
            ("SRC, uncached (O_DIRECT)", &row.src_uncached),
            ("SRC, page cache warm", &row.src_page_cache_warm),
        ] {
            println!(
                "{:<20} {:<34} {:>10.0} {:>9.1} {:>9.1} {:>9.1}",
                row.workload,
                name,
                side.iops,
                side.mib_per_sec,
                side.latency_us_p50,
                side.latency_us_p99
            );
        }
        println!(
            "{:<20} mount/uncached {:.2}x, mount/warm {:.2}x, ARC hit ratio during the mount run {:.4}",
            "", row.mount_over_uncached, row.mount_over_warm, row.mount_arc_hit_ratio
        );
    }
}
