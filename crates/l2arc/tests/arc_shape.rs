//! The ARC's shape across a restart: saved, restored, prewarmed from flash
//! (issue 33). Real files in a tempdir, a real cache file; the feeder is
//! quiet and the tests feed the ARC's records to flash themselves, so that
//! every record the ARC held is on flash at the "stop".

mod l2arc_util;

use std::sync::Arc;
use std::time::{Duration, Instant};

use l2arc::arc::shape::{self, ShapeRejected};
use l2arc::internals::{Faults, FaultyDevice};
use l2arc::primary::dir::DirPrimary;
use l2arc::{
    Cache, CacheConfig, CacheStats, DatasetConfig, DatasetId, FileDevice, IoEngine, RestoreError,
};
use l2arc_util::{RS, World, quiet_l2};

const DEVICE_BYTES: u64 = 64 << 20;

fn cache(world: &World, arc_max_bytes: u64, shards: usize) -> (Arc<Cache>, DatasetId) {
    cache_with_engine(world, arc_max_bytes, shards, IoEngine::Auto)
}

fn cache_with_engine(
    world: &World,
    arc_max_bytes: u64,
    shards: usize,
    engine: IoEngine,
) -> (Arc<Cache>, DatasetId) {
    let l2 = quiet_l2()
        .l2arc_ioengine(engine)
        .l2arc_write_max_bytes(16 << 20)
        .l2arc_noprefetch(false);
    let cache = Cache::new(
        CacheConfig::default()
            .arc_max_bytes(arc_max_bytes)
            .arc_shards(shards)
            .zfs_prefetch_disable(true)
            .l2arc(l2),
    )
    .unwrap();
    let ds = cache
        .add_dataset(
            "data",
            Arc::new(DirPrimary::new(&world.src).unwrap()),
            DatasetConfig::default().recordsize_bytes(RS as u32),
        )
        .unwrap();
    (cache, ds)
}

fn read_record(cache: &Cache, ds: DatasetId, name: &str, record: u64, expected: &[u8]) {
    let f = cache.open(ds, name, false).unwrap();
    let mut buf = vec![0u8; RS];
    let n = cache.read(&f, record * RS as u64, &mut buf).unwrap();
    let at = record as usize * RS;
    assert_eq!(&buf[..n], &expected[at..(at + RS).min(expected.len())]);
}

/// A workload that leaves all four lists non-empty: file `hot` read twice
/// (MFU), then more than the ARC of `cold*` once (MRU, evicting to the
/// ghosts), then part of `hot` again (MFU ghost hits).
fn warm(world: &World, cache: &Cache, ds: DatasetId) {
    let data = |name: &str| &world.files.iter().find(|f| f.0 == name).unwrap().1;
    for _ in 0..2 {
        for r in 0..6 {
            read_record(cache, ds, "hot", r, data("hot"));
        }
    }
    for name in ["cold1", "cold2"] {
        for r in 0..20 {
            read_record(cache, ds, name, r, data(name));
            if r % 4 == 3 {
                cache.feed_l2arc();
            }
        }
    }
    // Then a skewed random mix: reuse of evicted keys on both sides.
    let mut rng = l2arc_util::Rng(7);
    for i in 0..300 {
        let (name, r) = match rng.below(4) {
            0 => ("hot", rng.below(6)),
            1 => ("cold1", rng.below(8)),
            2 => ("cold2", rng.below(20)),
            _ => ("cold1", 8 + rng.below(12)),
        };
        read_record(cache, ds, name, r, data(name));
        if i % 8 == 7 {
            cache.feed_l2arc();
        }
    }
    // Everything resident is on flash now (a clean stop's flush).
    for _ in 0..4 {
        cache.feed_l2arc();
    }
}

fn world() -> World {
    let mut world = World::new();
    world.add_file("hot", 6 * RS, 1);
    world.add_file("cold1", 20 * RS, 2);
    world.add_file("cold2", 20 * RS, 3);
    world
}

fn start(
    world: &World,
    arc_max_bytes: u64,
    shards: usize,
    device: &std::path::Path,
) -> (Arc<Cache>, DatasetId) {
    let (cache, ds) = cache(world, arc_max_bytes, shards);
    cache.add_cache_path(device, Some(DEVICE_BYTES)).unwrap();
    assert!(
        cache
            .l2arc()
            .unwrap()
            .wait_for_rebuild(Duration::from_secs(30))
    );
    (cache, ds)
}

fn kstat(stats: &CacheStats, name: &str) -> u64 {
    stats
        .kstats()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no kstat {name}"))
        .1
}

/// Saves, stops, starts on the same cache file, restores and prewarms:
/// `p`, every list's size and the ghosts' equal those at the stop, and a
/// second save lists the same records in the same order.
#[test]
fn a_restart_brings_back_the_lists_the_ghosts_and_p() {
    let world = world();
    let device = world.device_path("cache.dev");
    let saved_path = world.tmp.path().join("arc.shape");
    let before = {
        let (cache, ds) = start(&world, 16 * RS as u64, 2, &device);
        warm(&world, &cache, ds);
        let stats = cache.stats().arc;
        assert!(stats.mru_size > 0 && stats.mfu_size > 0, "{stats:?}");
        assert!(
            stats.mru_ghost_size > 0 && stats.mfu_ghost_size > 0,
            "{stats:?}"
        );
        let saved = cache.save_arc_shape(&saved_path).unwrap().unwrap();
        assert_eq!(saved.records, stats.entries);
        assert_eq!(saved.unnamed_records, 0);
        assert_eq!(kstat(&cache.stats(), "arc_checkpoints"), 1);
        stats
    };
    let (cache, ds) = start(&world, 16 * RS as u64, 2, &device);
    let restored = cache.restore_arc_shape(&saved_path, true).unwrap();
    assert_eq!(restored.records, before.entries);
    assert!(restored.prewarm_started);
    assert!(cache.wait_for_prewarm(Duration::from_secs(60)));
    let after = cache.stats();
    let primary_reads = after.primary_reads;
    let a = after.arc;
    let one = RS as u64;
    for (what, x, y) in [
        ("p", before.p, a.p),
        ("mru_size", before.mru_size, a.mru_size),
        ("mfu_size", before.mfu_size, a.mfu_size),
        ("mru_ghost_size", before.mru_ghost_size, a.mru_ghost_size),
        ("mfu_ghost_size", before.mfu_ghost_size, a.mfu_ghost_size),
    ] {
        assert!(
            x.abs_diff(y) <= one,
            "{what}: {x} at the stop, {y} after: {a:?}"
        );
    }
    assert_eq!(kstat(&after, "arc_prewarm_records"), before.entries);
    assert_eq!(kstat(&after, "arc_prewarm_stale"), 0);
    assert_eq!(kstat(&after, "arc_prewarm_missing"), 0);
    assert_eq!(kstat(&after, "arc_prewarm_active"), 0);
    assert_eq!(primary_reads, 0, "the prewarm reads flash only");
    // The same records in the same order, hot to cold.
    let again = world.tmp.path().join("again.shape");
    cache.save_arc_shape(&again).unwrap().unwrap();
    let first = shape::decode(&std::fs::read(&saved_path).unwrap()).unwrap();
    let second = shape::decode(&std::fs::read(&again).unwrap()).unwrap();
    assert_eq!(first.shards, second.shards);
    assert_eq!(first.objects, second.objects);
    // And they are hits: what was in DRAM at the stop is read from DRAM.
    let hits = cache.stats().arc.hits;
    let mut resident = 0;
    for s in &first.shards {
        for r in s.mru.iter().chain(&s.mfu) {
            let name = &first.objects[r.object as usize].name;
            let data = &world.files.iter().find(|f| &f.0 == name).unwrap().1;
            read_record(&cache, ds, name, r.record, data);
            resident += 1;
        }
    }
    assert_eq!(resident, before.entries);
    assert_eq!(cache.stats().arc.hits, hits + resident);
    assert_eq!(cache.stats().primary_reads, 0);
    cache.assert_consistent();
}

/// Without the shape, the same restart starts empty (what main did).
#[test]
fn without_a_restore_the_arc_starts_empty() {
    let world = world();
    let device = world.device_path("cache.dev");
    {
        let (cache, ds) = start(&world, 16 * RS as u64, 2, &device);
        warm(&world, &cache, ds);
    }
    let (cache, _) = start(&world, 16 * RS as u64, 2, &device);
    let missing = world.tmp.path().join("none.shape");
    assert!(matches!(
        cache.restore_arc_shape(&missing, true),
        Err(RestoreError::Missing)
    ));
    assert_eq!(cache.stats().arc.size, 0);
}

/// A flipped byte and a torn file are rejected, each counted by reason,
/// and the ARC starts cold.
#[test]
fn a_corrupt_or_torn_checkpoint_is_rejected_and_counted() {
    let world = world();
    let device = world.device_path("cache.dev");
    let saved_path = world.tmp.path().join("arc.shape");
    {
        let (cache, ds) = start(&world, 16 * RS as u64, 2, &device);
        warm(&world, &cache, ds);
        cache.save_arc_shape(&saved_path).unwrap().unwrap();
    }
    let good = std::fs::read(&saved_path).unwrap();
    let mut flipped = good.clone();
    let at = good.len() / 2;
    flipped[at] ^= 0x01;
    let torn = &good[..good.len() - 100];
    for (bytes, reason, expected) in [
        (
            &flipped[..],
            "arc_checkpoint_rejected_checksum",
            ShapeRejected::Checksum,
        ),
        (
            torn,
            "arc_checkpoint_rejected_truncated",
            ShapeRejected::Truncated,
        ),
        (
            b"not a checkpoint at all".as_slice(),
            "arc_checkpoint_rejected_magic",
            ShapeRejected::Magic,
        ),
    ] {
        std::fs::write(&saved_path, bytes).unwrap();
        let (cache, _) = start(&world, 16 * RS as u64, 2, &device);
        match cache.restore_arc_shape(&saved_path, true) {
            Err(RestoreError::Rejected(why)) => assert_eq!(why, expected),
            other => panic!("{reason}: {other:?}"),
        }
        let stats = cache.stats();
        assert_eq!(kstat(&stats, reason), 1);
        assert_eq!(kstat(&stats, "arc_prewarm_active"), 0);
        assert_eq!(stats.arc.size, 0, "started cold");
        assert_eq!(stats.arc.mru_ghost_size + stats.arc.mfu_ghost_size, 0);
        assert_eq!(stats.arc.p, 0);
    }
}

/// A file rewritten while the service was stopped, same size, its mtime
/// put back: its records are not prewarmed and a read gets its new bytes.
#[test]
fn an_object_changed_while_stopped_is_not_prewarmed() {
    let mut world = world();
    let device = world.device_path("cache.dev");
    let saved_path = world.tmp.path().join("arc.shape");
    let hot_records_resident = {
        let (cache, ds) = start(&world, 16 * RS as u64, 2, &device);
        warm(&world, &cache, ds);
        cache.save_arc_shape(&saved_path).unwrap().unwrap();
        let saved = shape::decode(&std::fs::read(&saved_path).unwrap()).unwrap();
        let hot = saved.objects.iter().position(|o| o.name == "hot").unwrap() as u32;
        saved
            .shards
            .iter()
            .flat_map(|s| s.mru.iter().chain(&s.mfu))
            .filter(|r| r.object == hot)
            .count() as u64
    };
    assert!(hot_records_resident > 0);
    let path = world.src.join("hot");
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    std::thread::sleep(Duration::from_millis(20)); // a ctime that moves
    let new = world.add_file("hot", 6 * RS, 99);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), mtime);
    let (cache, ds) = start(&world, 16 * RS as u64, 2, &device);
    cache.restore_arc_shape(&saved_path, true).unwrap();
    assert!(cache.wait_for_prewarm(Duration::from_secs(60)));
    let stats = cache.stats();
    assert_eq!(kstat(&stats, "arc_prewarm_stale"), hot_records_resident);
    assert!(
        kstat(&stats, "arc_prewarm_records") > 0,
        "the other files are prewarmed"
    );
    for r in 0..6 {
        read_record(&cache, ds, "hot", r, &new);
    }
}

/// Restarted with a smaller ARC than saved: the prewarm fills it up to its
/// `c` and never past it.
#[test]
fn the_prewarm_never_takes_the_arc_past_its_size() {
    let world = world();
    let device = world.device_path("cache.dev");
    let saved_path = world.tmp.path().join("arc.shape");
    {
        let (cache, ds) = start(&world, 16 * RS as u64, 2, &device);
        warm(&world, &cache, ds);
        cache.save_arc_shape(&saved_path).unwrap().unwrap();
    }
    let small = 6 * RS as u64;
    let (cache, _) = start(&world, small, 2, &device);
    let restored = cache.restore_arc_shape(&saved_path, true).unwrap();
    assert!(restored.resident_bytes > small);
    assert!(cache.wait_for_prewarm(Duration::from_secs(60)));
    let stats = cache.stats();
    assert!(stats.arc.size <= small, "{} > {small}", stats.arc.size);
    assert!(
        kstat(&stats, "arc_prewarm_records") >= 4,
        "it did fill: {:?}",
        stats.arc
    );
    assert!(stats.arc.p <= stats.arc.c);
    cache.assert_consistent();
}

/// On a slow cache device the prewarm takes seconds; a demand read of the
/// last record in its queue meanwhile is served from flash at once, not
/// after the queue.
#[test]
fn a_demand_read_never_waits_behind_the_prewarm_queue() {
    let mut world = World::new();
    world.add_file("a", 40 * RS, 5);
    let device = world.device_path("cache.dev");
    let saved_path = world.tmp.path().join("arc.shape");
    {
        let (cache, ds) = start(&world, 32 * RS as u64, 1, &device);
        for r in 0..32 {
            read_record(&cache, ds, "a", r, &world.files[0].1);
        }
        for _ in 0..4 {
            cache.feed_l2arc();
        }
        cache.save_arc_shape(&saved_path).unwrap().unwrap();
    }
    let saved = shape::decode(&std::fs::read(&saved_path).unwrap()).unwrap();
    // One shard, MRU only: the queue's last record is the coldest MRU one.
    assert!(saved.shards[0].mfu.is_empty());
    let last = *saved.shards[0].mru.last().unwrap();
    assert_eq!(saved.objects[last.object as usize].name, "a");

    let (cache, ds) = cache(&world, 32 * RS as u64, 1);
    let slow = FaultyDevice::new(Box::new(FileDevice::open(&device, None).unwrap()));
    let faults: Arc<Faults> = Arc::clone(&slow.faults);
    cache.add_cache_device(Box::new(slow)).unwrap();
    assert!(
        cache
            .l2arc()
            .unwrap()
            .wait_for_rebuild(Duration::from_secs(30))
    );
    // 32 reads, 8 at a time, 300 ms each: the prewarm takes over a second.
    faults
        .read_delay_us
        .store(300_000, std::sync::atomic::Ordering::Relaxed);
    cache.restore_arc_shape(&saved_path, true).unwrap();
    let started = Instant::now();
    read_record(&cache, ds, "a", last.record, &world.files[0].1);
    let read_ms = started.elapsed().as_millis();
    let stats = cache.stats();
    assert_eq!(
        kstat(&stats, "arc_prewarm_active"),
        1,
        "the read of the queue's last record ended after the prewarm ({read_ms} ms)"
    );
    assert_eq!(stats.primary_reads, 0, "served from flash");
    assert!(cache.wait_for_prewarm(Duration::from_secs(60)));
    let stats = cache.stats();
    assert_eq!(stats.arc.entries, 32);
    assert!(kstat(&stats, "arc_prewarm_records") >= 31);
    eprintln!(
        "demand read in {read_ms} ms; prewarm {} ms",
        kstat(&stats, "arc_prewarm_ms")
    );
}

/// Fills the ARC with `records` records of file "seq", flushes them to
/// flash as a clean stop does (hottest first: back to back on flash, in
/// the order the prewarm reads them), and saves the shape.
fn stop_with_records_back_to_back(
    world: &World,
    device: &std::path::Path,
    saved_path: &std::path::Path,
    records: u64,
) {
    let (cache, ds) = start(world, 2 * records * RS as u64, 1, device);
    for r in 0..records {
        read_record(&cache, ds, "seq", r, &world.files[0].1);
    }
    let flushed = cache.flush_arc_to_l2(Duration::from_secs(60));
    assert_eq!(flushed.records_written, records, "{flushed:?}");
    cache.save_arc_shape(saved_path).unwrap().unwrap();
}

/// Restarts on the cache file behind a `FaultyDevice`; the prewarm runs
/// with the faults the test sets once the rebuild is done (`set_faults`),
/// and is waited for.
fn restart_with_faults(
    world: &World,
    device: &std::path::Path,
    saved_path: &std::path::Path,
    (records, engine): (u64, IoEngine),
    set_faults: impl FnOnce(&Faults),
) -> (Arc<Cache>, DatasetId, CacheStats) {
    let (cache, ds) = cache_with_engine(world, 2 * records * RS as u64, 1, engine);
    assert_eq!(cache.ioengine(), engine);
    let faulty = FaultyDevice::new(Box::new(FileDevice::open(device, None).unwrap()));
    let faults = Arc::clone(&faulty.faults);
    cache.add_cache_device(Box::new(faulty)).unwrap();
    assert!(
        cache
            .l2arc()
            .unwrap()
            .wait_for_rebuild(Duration::from_secs(30))
    );
    // After the rebuild: the faults are the prewarm's, not the log's.
    set_faults(&faults);
    cache.restore_arc_shape(saved_path, true).unwrap();
    assert!(cache.wait_for_prewarm(Duration::from_secs(60)));
    let stats = cache.stats();
    (cache, ds, stats)
}

/// After a clean stop the ARC's records lie back to back on flash in the
/// prewarm's order: the prewarm reads them in merged reads (far fewer
/// device reads than records), and every byte is right.
#[test]
fn records_back_to_back_on_flash_are_prewarmed_in_merged_reads() {
    const RECORDS: u64 = 64;
    let mut world = World::new();
    world.add_file("seq", RECORDS as usize * RS, 9);
    let device = world.device_path("cache.dev");
    let saved_path = world.tmp.path().join("arc.shape");
    stop_with_records_back_to_back(&world, &device, &saved_path, RECORDS);
    // The prewarm reads with blocking readers whatever the engine of the
    // demand reads: both give the same.
    for engine in [IoEngine::IoUring, IoEngine::Psync] {
        let (cache, ds, stats) =
            restart_with_faults(&world, &device, &saved_path, (RECORDS, engine), |_| {});
        assert_eq!(kstat(&stats, "arc_prewarm_records"), RECORDS, "{engine:?}");
        let reads = kstat(&stats, "arc_prewarm_reads");
        // 64 KiB records, 1 MiB reads: 16 a read when all lie back to back.
        assert!(
            (1..=RECORDS / 4).contains(&reads),
            "{engine:?}: {reads} device reads for {RECORDS} records"
        );
        for r in 0..RECORDS {
            read_record(&cache, ds, "seq", r, &world.files[0].1);
        }
        let after = cache.stats();
        assert_eq!(after.primary_reads, 0, "every record came from the prewarm");
        assert_eq!(after.arc.entries, RECORDS);
    }
}

/// A merged read the device fails is read again record by record (a
/// device that fails large reads only): every record is still prewarmed
/// and no error is counted against the device. A merged read whose bytes
/// are corrupt costs only the record the bad byte lies in: each record is
/// checked on its own blocks, and no wrong byte is ever handed out.
#[test]
fn a_failed_or_corrupt_merged_read_costs_only_its_bad_records() {
    const RECORDS: u64 = 64;
    let mut world = World::new();
    world.add_file("seq", RECORDS as usize * RS, 10);
    let device = world.device_path("cache.dev");
    let saved_path = world.tmp.path().join("arc.shape");
    stop_with_records_back_to_back(&world, &device, &saved_path, RECORDS);
    for engine in [IoEngine::IoUring, IoEngine::Psync] {
        let (cache, _ds, stats) =
            restart_with_faults(&world, &device, &saved_path, (RECORDS, engine), |f| {
                f.fail_reads_longer_than_bytes
                    .store(RS as u64 + 4096, std::sync::atomic::Ordering::Relaxed)
            });
        assert_eq!(kstat(&stats, "arc_prewarm_records"), RECORDS, "{engine:?}");
        assert!(kstat(&stats, "arc_prewarm_reads") <= RECORDS / 4);
        assert_eq!(kstat(&stats, "l2_io_error"), 0);
        assert_eq!(stats.primary_reads, 0);
        drop(cache);
    }
    let (cache, ds, stats) = restart_with_faults(
        &world,
        &device,
        &saved_path,
        (RECORDS, IoEngine::IoUring),
        |f| {
            f.corrupt_reads
                .store(true, std::sync::atomic::Ordering::Relaxed)
        },
    );
    let prewarmed = kstat(&stats, "arc_prewarm_records");
    let reads = kstat(&stats, "arc_prewarm_reads");
    // One byte flipped per device read: at most one bad record per read.
    assert!(
        prewarmed + reads >= RECORDS,
        "{prewarmed} of {RECORDS} records prewarmed in {reads} reads"
    );
    assert!(kstat(&stats, "l2_cksum_bad") >= 1);
    for r in 0..RECORDS {
        read_record(&cache, ds, "seq", r, &world.files[0].1);
    }
}
