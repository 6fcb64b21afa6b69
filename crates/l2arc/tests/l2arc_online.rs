//! Cache devices added and removed while readers read: no reader error, no
//! wrong byte, the statistics follow, and a removed device added back
//! rebuilds its log.

mod l2arc_util;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use l2arc::Compression;
use l2arc::DeviceOpen;
use l2arc_util::*;

const FILES: usize = 4;
const READERS: u64 = 4;

/// Feeds in a loop until `stop`; while `pause` is set it feeds nothing and
/// says so in `paused`, so that the test can read exact statistics.
fn feeder(cache: &l2arc::Cache, stop: &AtomicBool, pause: &AtomicBool, paused: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        if pause.load(Ordering::SeqCst) {
            paused.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        paused.store(false, Ordering::SeqCst);
        cache.feed_l2arc();
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn run_for(duration: Duration, reads: &AtomicUsize, at_least: usize) {
    let start = reads.load(Ordering::Relaxed);
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline || reads.load(Ordering::Relaxed) < start + at_least {
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn devices_come_and_go_under_readers() {
    let mut world = World::new();
    let mut files = Vec::new();
    for i in 0..FILES {
        let name = format!("f{i}");
        let data = world.add_file(&name, 2 << 20, 3000 + i as u64);
        files.push((name, data));
    }
    let path_a = world.device_path("a.dev");
    let path_b = world.device_path("b.dev");
    let (cache, ds) = new_cache(&world.src, Compression::Lz4, quiet_l2());
    let (slot_a, open) = add_path(&cache, &path_a, Some(DEVICE_BYTES)).unwrap();
    assert_eq!(open, DeviceOpen::Initialised);
    let handles: Vec<_> = files
        .iter()
        .map(|(name, _)| cache.open(ds, name, false).unwrap())
        .collect();
    // Half the data goes to device A now; the readers bring in the rest,
    // which the feeder spreads over both devices once B is there.
    for (h, (_, data)) in handles.iter().zip(&files).take(FILES / 2) {
        fill(&cache, h, data);
    }
    let prefilled: usize = files.iter().take(FILES / 2).map(|(_, d)| records(d)).sum();
    assert!(l2(&cache).get("l2_bufs") as usize >= prefilled * 9 / 10);

    let stop_readers = AtomicBool::new(false);
    let (stop_feeder, pause, paused) = (
        AtomicBool::new(false),
        AtomicBool::new(false),
        AtomicBool::new(false),
    );
    let reads = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(vec![&stop_readers, &stop_feeder]);
        for t in 0..READERS {
            let (cache, handles, files, stop, reads) =
                (&cache, &handles, &files, &stop_readers, &reads);
            s.spawn(move || {
                let mut rng = Rng(0xABCD + t);
                while !stop.load(Ordering::Relaxed) {
                    let file = rng.below(FILES as u64) as usize;
                    let data = &files[file].1;
                    let index = rng.below(records(data) as u64) as usize;
                    check_record(cache, &handles[file], data, index, "reader");
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        {
            let (cache, stop, pause, paused) = (&cache, &stop_feeder, &pause, &paused);
            s.spawn(move || feeder(cache, stop, pause, paused));
        }
        // A second device joins; the rotor sends batches to both.
        let (slot_b, open) = cache.add_cache_path(&path_b, Some(DEVICE_BYTES)).unwrap();
        assert_eq!(open, DeviceOpen::Initialised);
        assert_ne!(slot_b, slot_a);
        let deadline = Instant::now() + Duration::from_secs(10);
        while dev_stat(&l2(&cache), slot_b, "l2_bufs") < 8 {
            assert!(Instant::now() < deadline, "nothing fed to the new device");
            std::thread::sleep(Duration::from_millis(10));
        }
        run_for(Duration::from_millis(200), &reads, 200);

        // Feeding paused, so the counts hold still: remove device A.
        pause.store(true, Ordering::SeqCst);
        while !paused.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let before = l2(&cache);
        let a_bufs = dev_stat(&before, slot_a, "l2_bufs");
        let b_bufs = dev_stat(&before, slot_b, "l2_bufs");
        assert!(a_bufs > 0 && b_bufs > 0, "{before:?}");
        assert_eq!(before.get("l2_bufs"), a_bufs + b_bufs);
        assert_eq!(before.get("l2_devices"), 2);
        cache.remove_cache_device(slot_a).unwrap();
        let after = l2(&cache);
        assert!(
            after.devices.iter().all(|d| d.slot != slot_a),
            "removed device still listed: {after:?}"
        );
        assert_eq!(after.get("l2_devices"), 1);
        assert_eq!(after.get("l2_bufs"), b_bufs, "{after:?}");
        assert_eq!(cache.l2arc().unwrap().len() as u64, b_bufs);
        let removed_again = cache.remove_cache_device(slot_a).unwrap_err();
        assert_eq!(removed_again.kind(), std::io::ErrorKind::NotFound);

        // Readers go on with device B alone (and primary for what was on
        // A; the feeder stays paused so that B does not take it over).
        run_for(Duration::from_millis(200), &reads, 200);
        assert_eq!(l2(&cache).get("l2_bufs"), b_bufs);

        // Device A comes back: its log is rebuilt and its entries come back.
        let (slot, open) = cache.add_cache_path(&path_a, None).unwrap();
        assert_eq!(open, DeviceOpen::Rebuilding);
        assert_eq!(slot, slot_a, "the freed slot is reused");
        wait_rebuild(&cache);
        let back = l2(&cache);
        let restored = dev_stat(&back, slot_a, "l2_rebuild_bufs");
        let precached = dev_stat(&back, slot_a, "l2_rebuild_bufs_precached");
        assert_eq!(restored + precached, a_bufs, "{back:?}");
        assert!(restored >= a_bufs * 9 / 10, "{back:?}");
        assert_eq!(dev_stat(&back, slot_a, "l2_bufs"), restored);
        assert_eq!(back.get("l2_bufs"), restored + b_bufs);
        assert_eq!(dev_stat(&back, slot_a, "l2_rebuild_cksum_lb_errors"), 0);
        assert_eq!(dev_state(&back, slot_a), "online");
        pause.store(false, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(10);
        while dev_stat(&l2(&cache), slot_a, "l2_hits") == 0 {
            assert!(Instant::now() < deadline, "no hits on the re-added device");
            std::thread::sleep(Duration::from_millis(10));
        }
        run_for(Duration::from_millis(100), &reads, 100);

        // The last devices go; the cache reads on from primary.
        cache.remove_cache_device(slot_b).unwrap();
        cache.remove_cache_device(slot_a).unwrap();
        let none = l2(&cache);
        assert_eq!(none.get("l2_devices"), 0);
        assert_eq!(cache.l2arc().unwrap().len(), 0);
        run_for(Duration::from_millis(100), &reads, 100);
        stop_feeder.store(true, Ordering::SeqCst);
        stop_readers.store(true, Ordering::SeqCst);
    });
    for (h, (_, data)) in handles.iter().zip(&files) {
        check_all(&cache, h, data, "after the devices left");
    }
    let stats = cache.stats();
    let l2 = stats.l2.clone().unwrap();
    eprintln!(
        "{} reads; l2_hits {}, primary reads {}",
        reads.load(Ordering::Relaxed),
        l2.get("l2_hits"),
        stats.primary_reads
    );
    assert_eq!(stats.primary_errors, 0);
    drop(handles);
    shutdown(cache);
    world.assert_primary_intact();
}

/// A device removed while its rebuild runs: nothing of it stays indexed,
/// and a device added to the freed slot is not confused with it.
#[test]
fn device_removed_during_its_rebuild_leaves_nothing_behind() {
    let mut world = World::new();
    let data = world.add_file("f", 8 << 20, 3100);
    let path_a = world.device_path("a.dev");
    let path_b = world.device_path("b.dev");
    {
        let (cache, ds) = new_cache(&world.src, Compression::Off, quiet_l2());
        add_path(&cache, &path_a, Some(DEVICE_BYTES)).unwrap();
        let f = cache.open(ds, "f", false).unwrap();
        fill(&cache, &f, &data);
        drop(f);
        shutdown(cache);
    }
    for round in 0..5 {
        let (cache, ds) = new_cache(&world.src, Compression::Off, quiet_l2());
        let (slot, open) = cache.add_cache_path(&path_a, None).unwrap();
        assert_eq!(open, DeviceOpen::Rebuilding);
        if round > 0 {
            std::thread::sleep(Duration::from_micros(200 * round));
        }
        cache.remove_cache_device(slot).unwrap();
        // Let any rebuild still walking the log finish.
        std::thread::sleep(Duration::from_millis(50));
        let gone = l2(&cache);
        assert_eq!(gone.get("l2_devices"), 0);
        assert_eq!(
            cache.l2arc().unwrap().len(),
            0,
            "round {round}: entries of a removed device stayed indexed"
        );
        // A new device in the same slot serves only its own records.
        let (slot_b, _) = add_path(&cache, &path_b, Some(DEVICE_BYTES)).unwrap();
        assert_eq!(slot_b, slot);
        let f = cache.open(ds, "f", false).unwrap();
        check_all(&cache, &f, &data, "after the removed rebuild");
        let stats = l2(&cache);
        assert_eq!(stats.get("l2_cksum_bad"), 0, "round {round}: {stats:?}");
        assert_eq!(
            stats.get("l2_bufs"),
            cache.l2arc().unwrap().len() as u64,
            "round {round}: {stats:?}"
        );
        drop(f);
        shutdown(cache);
        std::fs::remove_file(&path_b).unwrap();
    }
    world.assert_primary_intact();
}
