//! The stop flush (`Cache::flush_arc_to_l2`): at a clean stop, what only
//! the ARC holds goes to the cache devices, so that a cache rebuilt on the
//! same device reads none of it from primary storage. The feeder is kept
//! quiet (`quiet_l2`), so that what is on flash is the flush's doing; read
//! ahead is off, so that every record in the ARC was asked for.

mod l2arc_util;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use l2arc::internals::{Faults, FaultyDevice};
use l2arc::primary::dir::DirPrimary;
use l2arc::{
    Cache, CacheConfig, CacheMode, Compression, DatasetConfig, DatasetId, DeviceOpen, FileDevice,
    L2ArcConfig, StopFlushCut,
};
use l2arc_util::*;

/// An ARC of 8 MiB (two shards of 4 MiB): every set below fits in it.
const ARC_BYTES: u64 = 8 << 20;

fn cache_over(src: &Path, compression: Compression, l2: L2ArcConfig) -> (Arc<Cache>, DatasetId) {
    let cache = Cache::new(
        CacheConfig::default()
            .arc_max_bytes(ARC_BYTES)
            .arc_shards(2)
            .zfs_prefetch_disable(true)
            .l2arc(l2),
    )
    .unwrap();
    let ds = cache
        .add_dataset(
            "data",
            Arc::new(DirPrimary::new(src).unwrap()),
            DatasetConfig::default()
                .recordsize_bytes(RS as u32)
                .compression(compression),
        )
        .unwrap();
    (cache, ds)
}

/// A cache on the same device, rebuilt, with nothing read yet.
fn restart(world: &World, device: &Path, compression: Compression) -> (Arc<Cache>, DatasetId) {
    let (cache, ds) = cache_over(&world.src, compression, quiet_l2());
    assert_eq!(
        add_path(&cache, device, None).unwrap().1,
        DeviceOpen::Rebuilding
    );
    wait_rebuild(&cache);
    (cache, ds)
}

/// Every record of `data` read once; all of them in the ARC, none on flash.
fn read_into_arc(cache: &Cache, ds: DatasetId, name: &str, data: &[u8]) {
    let h = cache.open(ds, name, false).unwrap();
    check_all(cache, &h, data, name);
}

/// What a clean stop wrote comes back from flash: a restart reads every
/// byte of the set that was only in DRAM without one read of primary
/// storage. A dataset with `secondarycache=none` is neither written nor
/// counted as left.
#[test]
fn a_clean_stop_writes_every_arc_only_record_to_flash() {
    let mut world = World::new();
    let data = world.add_file("a", 3 << 20, 41);
    let private = world.add_file("private", 1 << 20, 42);
    let device = world.device_path("cache.dev");
    {
        let (cache, ds) = cache_over(&world.src, Compression::Lz4, quiet_l2());
        add_path(&cache, &device, Some(DEVICE_BYTES)).unwrap();
        let none = cache
            .add_dataset(
                "private",
                Arc::new(DirPrimary::new(&world.src).unwrap()),
                DatasetConfig::default()
                    .recordsize_bytes(RS as u32)
                    .secondarycache(CacheMode::None),
            )
            .unwrap();
        read_into_arc(&cache, ds, "a", &data);
        read_into_arc(&cache, none, "private", &private);
        let before = cache.stats();
        assert_eq!(
            before.arc.entries as usize,
            records(&data) + records(&private)
        );
        assert_eq!(l2(&cache).get("l2_bufs"), 0, "the feeder wrote: {before:?}");

        let flushed = cache.flush_arc_to_l2(Duration::from_secs(30));
        assert_eq!(
            flushed.records_written as usize,
            records(&data),
            "{flushed:?}"
        );
        assert_eq!(flushed.bytes_written, data.len() as u64);
        assert_eq!((flushed.records_left, flushed.bytes_left), (0, 0));
        assert_eq!(flushed.cut, None);
        assert_eq!(flushed.budget, Duration::from_secs(30));
        let stats = l2(&cache);
        assert_eq!(stats.get("l2_bufs") as usize, records(&data));
        assert_eq!(stats.get("l2_stop_flush_records") as usize, records(&data));
        assert_eq!(stats.get("l2_stop_flush_bytes"), data.len() as u64);
        assert_eq!(stats.get("l2_stop_flush_left_records"), 0);
        // A second flush finds everything on flash already.
        let again = cache.flush_arc_to_l2(Duration::from_secs(30));
        assert_eq!((again.records_written, again.records_left), (0, 0));
        shutdown(cache);
    }
    let (cache, ds) = restart(&world, &device, Compression::Lz4);
    assert_eq!(l2(&cache).get("l2_rebuild_bufs") as usize, records(&data));
    read_into_arc(&cache, ds, "a", &data);
    let after = cache.stats();
    assert_eq!(
        after.primary_reads, 0,
        "records that were in DRAM at the stop came from primary: {after:?}"
    );
    assert_eq!(l2(&cache).get("l2_hits") as usize, records(&data));
    shutdown(cache);
    world.assert_primary_intact();
}

/// A budget of 0 is no flush: nothing is written and every eligible
/// record is reported left, with the stop budget as the reason.
#[test]
fn a_zero_budget_writes_nothing_and_reports_everything_left() {
    let mut world = World::new();
    let data = world.add_file("a", 2 << 20, 43);
    let device = world.device_path("cache.dev");
    let (cache, ds) = cache_over(&world.src, Compression::Lz4, quiet_l2());
    add_path(&cache, &device, Some(DEVICE_BYTES)).unwrap();
    read_into_arc(&cache, ds, "a", &data);
    let flushed = cache.flush_arc_to_l2(Duration::ZERO);
    assert_eq!((flushed.records_written, flushed.bytes_written), (0, 0));
    assert_eq!(flushed.records_left as usize, records(&data), "{flushed:?}");
    assert_eq!(flushed.bytes_left, data.len() as u64);
    assert_eq!(flushed.cut, Some(StopFlushCut::Budget));
    let stats = l2(&cache);
    assert_eq!(stats.get("l2_bufs"), 0);
    assert_eq!(
        stats.get("l2_stop_flush_left_records") as usize,
        records(&data)
    );
    assert_eq!(stats.get("l2_stop_flush_left_bytes"), data.len() as u64);
    assert_eq!(stats.get("l2_stop_flush_records"), 0);
    shutdown(cache);
}

/// The endurance budget holds at a stop too: with no credit, nothing is
/// written and the reason is `l2arc_dwpd`.
#[test]
fn the_endurance_budget_bounds_the_flush() {
    let mut world = World::new();
    let data = world.add_file("a", 1 << 20, 44);
    let device = world.device_path("cache.dev");
    // A millionth of the device a day: no credit in the test's lifetime.
    let config = quiet_l2().l2arc_dwpd(1e-6);
    let (cache, ds) = cache_over(&world.src, Compression::Lz4, config);
    add_path(&cache, &device, Some(DEVICE_BYTES)).unwrap();
    read_into_arc(&cache, ds, "a", &data);
    let flushed = cache.flush_arc_to_l2(Duration::from_secs(30));
    assert_eq!(flushed.records_written, 0, "{flushed:?}");
    assert_eq!(flushed.records_left as usize, records(&data));
    assert_eq!(flushed.cut, Some(StopFlushCut::Dwpd));
    assert_eq!(l2(&cache).get("l2_bufs"), 0);
    shutdown(cache);
}

/// The hottest go first: with a budget too short for more than one batch
/// (a budget above 0 always writes one), that batch is MFU records only,
/// although the MRU records were read last. A restart reads every MRU
/// record from primary and fewer MFU records than there are.
#[test]
fn a_tiny_budget_writes_mfu_before_mru() {
    let mut world = World::new();
    // Uncompressed: a batch of this device (about 1 MiB) holds 16 records.
    let hot = world.add_file("hot", 2 << 20, 45);
    let cold = world.add_file("cold", 2 << 20, 46);
    let device = world.device_path("cache.dev");
    let written = {
        let (cache, ds) = cache_over(&world.src, Compression::Off, quiet_l2());
        add_path(&cache, &device, Some(DEVICE_BYTES)).unwrap();
        read_into_arc(&cache, ds, "hot", &hot);
        read_into_arc(&cache, ds, "hot", &hot);
        read_into_arc(&cache, ds, "cold", &cold);
        let arc = cache.stats().arc;
        assert_eq!(arc.mfu_size, hot.len() as u64, "{arc:?}");
        assert_eq!(arc.mru_size, cold.len() as u64, "{arc:?}");

        let flushed = cache.flush_arc_to_l2(Duration::from_nanos(1));
        assert_eq!(flushed.cut, Some(StopFlushCut::Budget), "{flushed:?}");
        let written = flushed.records_written as usize;
        assert!(
            (1..records(&hot)).contains(&written),
            "one batch, of MFU records only: {flushed:?}"
        );
        assert_eq!(
            flushed.records_left as usize,
            records(&hot) + records(&cold) - written
        );
        shutdown(cache);
        written
    };
    let (cache, ds) = restart(&world, &device, Compression::Off);
    read_into_arc(&cache, ds, "cold", &cold);
    assert_eq!(
        cache.stats().primary_reads as usize,
        records(&cold),
        "an MRU record was written before the MFU ones"
    );
    read_into_arc(&cache, ds, "hot", &hot);
    assert_eq!(
        cache.stats().primary_reads as usize,
        records(&cold) + records(&hot) - written,
        "the batch written was not the MFU records"
    );
    shutdown(cache);
}

fn faulty_device(path: &Path) -> (FaultyDevice, Arc<Faults>) {
    let device = FaultyDevice::new(Box::new(
        FileDevice::open(path, Some(DEVICE_BYTES)).unwrap(),
    ));
    let faults = Arc::clone(&device.faults);
    (device, faults)
}

/// Two devices are written side by side (each slow enough that one
/// cannot take every batch before the other starts), and a restart with
/// both reads nothing from primary.
#[test]
fn the_flush_spreads_over_every_online_device() {
    let mut world = World::new();
    let data = world.add_file("a", 3 << 20, 47);
    let paths = [world.device_path("c0.dev"), world.device_path("c1.dev")];
    {
        let (cache, ds) = cache_over(&world.src, Compression::Off, quiet_l2());
        for path in &paths {
            let (device, faults) = faulty_device(path);
            faults.write_delay_us.store(300_000, Ordering::Relaxed);
            add_device(&cache, Box::new(device)).unwrap();
        }
        read_into_arc(&cache, ds, "a", &data);
        let flushed = cache.flush_arc_to_l2(Duration::from_secs(60));
        assert_eq!(
            flushed.records_written as usize,
            records(&data),
            "{flushed:?}"
        );
        assert_eq!((flushed.records_left, flushed.cut), (0, None));
        let stats = l2(&cache);
        for slot in [0, 1] {
            assert!(
                dev_stat(&stats, slot, "l2_bufs") > 0,
                "device {slot} took no batch: {stats:?}"
            );
        }
        shutdown(cache);
    }
    let (cache, ds) = cache_over(&world.src, Compression::Off, quiet_l2());
    for path in &paths {
        add_path(&cache, path, None).unwrap();
    }
    wait_rebuild(&cache);
    read_into_arc(&cache, ds, "a", &data);
    assert_eq!(cache.stats().primary_reads, 0, "{:?}", cache.stats());
    shutdown(cache);
}

/// A device whose writes fail gives its records back: the other device
/// takes them, and nothing is left.
#[test]
fn a_failing_device_leaves_its_records_to_another() {
    let mut world = World::new();
    let data = world.add_file("a", 3 << 20, 48);
    let (cache, ds) = cache_over(&world.src, Compression::Off, quiet_l2());
    let (failing, failing_faults) = faulty_device(&world.device_path("c0.dev"));
    let (slow, slow_faults) = faulty_device(&world.device_path("c1.dev"));
    add_device(&cache, Box::new(failing)).unwrap();
    // Slow: the failing device's worker always finds a batch to try.
    slow_faults.write_delay_us.store(100_000, Ordering::Relaxed);
    add_device(&cache, Box::new(slow)).unwrap();
    failing_faults.fail_writes.store(true, Ordering::Relaxed);
    read_into_arc(&cache, ds, "a", &data);
    let flushed = cache.flush_arc_to_l2(Duration::from_secs(60));
    assert_eq!(
        flushed.records_written as usize,
        records(&data),
        "{flushed:?}"
    );
    assert_eq!((flushed.records_left, flushed.cut), (0, None));
    let stats = l2(&cache);
    assert!(dev_stat(&stats, 0, "l2_writes_error") >= 1, "{stats:?}");
    assert_eq!(dev_stat(&stats, 0, "l2_bufs"), 0);
    assert_eq!(dev_stat(&stats, 1, "l2_bufs") as usize, records(&data));
    shutdown(cache);
}

/// With every device failing, every record is left, and the reason says
/// no device took writes.
#[test]
fn no_device_taking_writes_leaves_everything() {
    let mut world = World::new();
    let data = world.add_file("a", 2 << 20, 49);
    let (cache, ds) = cache_over(&world.src, Compression::Lz4, quiet_l2());
    let (device, faults) = faulty_device(&world.device_path("c0.dev"));
    add_device(&cache, Box::new(device)).unwrap();
    faults.fail_writes.store(true, Ordering::Relaxed);
    read_into_arc(&cache, ds, "a", &data);
    let flushed = cache.flush_arc_to_l2(Duration::from_secs(60));
    assert_eq!(flushed.records_written, 0, "{flushed:?}");
    assert_eq!(flushed.records_left as usize, records(&data));
    assert_eq!(flushed.cut, Some(StopFlushCut::NoDevice));
    shutdown(cache);
}
