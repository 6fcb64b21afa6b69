//! The emulated HDD delivers the service times it claims.
//!
//! Every figure of the seed-experiment scenarios is a ratio against these disks, and
//! the throughput scenario's expected floor is computed from their
//! configuration, so the emulation must really take (seek_min + seek_max) / 2
//! plus size / transfer per request on average, alone and under load.

use std::sync::Arc;
use std::time::Instant;

use l2arc::primary::Primary;
use l2arc::primary::dir::DirPrimary;
use l2arc::primary::emulated_hdd::{EmulatedHdd, HddConfig};

const READ_BYTES: usize = 128 << 10;
const FILE_BYTES: u64 = 64 << 20;

fn setup(config: HddConfig) -> (tempfile::TempDir, Arc<EmulatedHdd>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data"), vec![7u8; FILE_BYTES as usize]).unwrap();
    let inner: Arc<dyn Primary> = Arc::new(DirPrimary::new(dir.path()).unwrap());
    (dir, Arc::new(EmulatedHdd::new(inner, config).unwrap()))
}

fn config() -> HddConfig {
    HddConfig {
        spindles: 4,
        seek_ms_min: 1.0,
        seek_ms_max: 3.0,
        transfer_mib_per_sec: 150.0,
        ..HddConfig::default()
    }
}

fn model_ms(c: &HddConfig) -> f64 {
    (c.seek_ms_min + c.seek_ms_max) / 2.0
        + READ_BYTES as f64 / (c.transfer_mib_per_sec * 1024.0 * 1024.0) * 1000.0
}

fn offsets(n: usize, seed: u64) -> Vec<u64> {
    let slots = FILE_BYTES / READ_BYTES as u64;
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % slots * READ_BYTES as u64
        })
        .collect()
}

#[test]
fn one_reader_sees_the_mean_service_time() {
    let c = config();
    let (_dir, hdd) = setup(c.clone());
    let object = hdd.open("data", false).unwrap();
    let mut buf = vec![0u8; READ_BYTES];
    let reads = 400;
    let began = Instant::now();
    for offset in offsets(reads, 1) {
        assert_eq!(object.read_at(offset, &mut buf).unwrap(), READ_BYTES);
    }
    let mean_ms = began.elapsed().as_secs_f64() * 1000.0 / reads as f64;
    let model = model_ms(&c);
    assert!(
        (mean_ms - model).abs() <= 0.15 * model,
        "mean latency {mean_ms:.3} ms, model {model:.3} ms"
    );
    let stats = hdd.stats();
    assert_eq!(stats.reads, reads as u64);
    let busy_ms = stats.busy_ns as f64 / 1e6 / reads as f64;
    assert!(
        (busy_ms - model).abs() <= 0.15 * model,
        "busy per read {busy_ms:.3} ms, model {model:.3} ms"
    );
}

#[test]
fn four_spindles_under_load_keep_the_service_time_and_no_more_parallelism() {
    let c = config();
    let (_dir, hdd) = setup(c.clone());
    let object = hdd.open("data", false).unwrap();
    let (threads, per_thread) = (8, 50);
    let began = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let object = &object;
            scope.spawn(move || {
                let mut buf = vec![0u8; READ_BYTES];
                for offset in offsets(per_thread, 100 + t as u64) {
                    assert_eq!(object.read_at(offset, &mut buf).unwrap(), READ_BYTES);
                }
            });
        }
    });
    let wall_ms = began.elapsed().as_secs_f64() * 1000.0;
    let stats = hdd.stats();
    let reads = (threads * per_thread) as f64;
    assert_eq!(stats.reads as f64, reads);
    let model = model_ms(&c);
    let service_ms = stats.busy_ns as f64 / 1e6 / reads;
    assert!(
        (service_ms - model).abs() <= 0.15 * model,
        "mean service time {service_ms:.3} ms under load, model {model:.3} ms"
    );
    // Four disks cannot serve faster than four requests at a time.
    let floor_ms = reads * model / c.spindles as f64;
    assert!(
        wall_ms >= 0.85 * floor_ms,
        "{reads} reads in {wall_ms:.0} ms, faster than 4 spindles allow ({floor_ms:.0} ms)"
    );
    // And they do work in parallel: far faster than one disk.
    assert!(
        wall_ms <= 0.6 * reads * model,
        "{reads} reads in {wall_ms:.0} ms: the spindles did not overlap"
    );
}
