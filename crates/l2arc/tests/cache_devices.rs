//! Cache devices as an operator handles them: the same device is never
//! attached twice (whatever the path's spelling), the cache-wide counters
//! never fall when a device leaves, and a device's allocated size never
//! exceeds its data area, however many laps its write hand has made.

mod l2arc_util;

use std::sync::{Arc, Barrier};

use l2arc::internals::FaultyDevice;
use l2arc::{Cache, Compression, DatasetConfig, FileDevice, KstatKind, L2Stats, kstat_kind};
use l2arc_util::*;

// ---------------------------------------------------------------------------
// 1. The same device twice

/// The error of an add that must be refused as a second attach of slot 0.
fn assert_refused_as_attached(added: std::io::Result<(u8, l2arc::DeviceOpen)>, what: &str) {
    let err = added.expect_err(&format!(
        "{what}: a second attach of one device was accepted"
    ));
    let text = err.to_string();
    assert_eq!(
        err.kind(),
        std::io::ErrorKind::AlreadyExists,
        "{what}: {text}"
    );
    assert!(
        text.contains("is already attached as cache device 0"),
        "{what}: the refusal names the slot holding it: {text}"
    );
    assert!(!text.contains('\n'), "{what}: one line: {text:?}");
}

#[test]
fn the_same_device_by_another_path_is_refused() {
    let world = World::new();
    let path = world.device_path("d.img");
    let (cache, _ds) = new_cache(&world.src, Compression::Off, quiet_l2());
    let (slot, _) = add_path(&cache, &path, Some(DEVICE_BYTES)).unwrap();
    assert_eq!(slot, 0);

    // The same path, a symlink to it, and another spelling of it.
    let link = world.device_path("link.img");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    std::fs::create_dir(world.device_path("sub")).unwrap();
    let dotted = world.tmp.path().join("sub/../d.img");
    for (other, what) in [
        (&path, "same path"),
        (&link, "symlink"),
        (&dotted, "sub/.."),
    ] {
        assert_refused_as_attached(cache.add_cache_path(other, Some(DEVICE_BYTES)), what);
    }
    // Through the device API too (the identity is the opened file's).
    let device = FileDevice::open(&link, None).unwrap();
    assert_refused_as_attached(cache.add_cache_device(Box::new(device)), "add_cache_device");
    // Wrapped, it is still the same device.
    let wrapped = FaultyDevice::new(Box::new(FileDevice::open(&path, None).unwrap()));
    assert_refused_as_attached(cache.add_cache_device(Box::new(wrapped)), "wrapped");

    let stats = l2(&cache);
    assert_eq!(stats.get("l2_devices"), 1, "{stats:?}");
    // Another file is another device.
    let (slot, _) = add_path(&cache, &world.device_path("e.img"), Some(DEVICE_BYTES)).unwrap();
    assert_eq!(slot, 1);
    // Once removed, the device may be attached again.
    cache.remove_cache_device(0).unwrap();
    let (slot, _) = add_path(&cache, &link, None).unwrap();
    assert_eq!(slot, 0);
    shutdown(cache);
}

#[test]
fn racing_adds_of_one_device_attach_it_once() {
    const THREADS: usize = 6;
    for round in 0..4 {
        let world = World::new();
        let path = world.device_path("d.img");
        // Created up front: the race is over attaching, not creating.
        drop(FileDevice::open(&path, Some(DEVICE_BYTES)).unwrap());
        let (cache, _ds) = new_cache(&world.src, Compression::Off, quiet_l2());
        let barrier = Barrier::new(THREADS);
        let results: Vec<_> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        cache.add_cache_path(&path, None)
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let won = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(won, 1, "round {round}: {results:?}");
        for result in results.into_iter().filter(Result::is_err) {
            assert_refused_as_attached(result, "racing add");
        }
        assert_eq!(l2(&cache).get("l2_devices"), 1);
        shutdown(cache);
    }
}

// ---------------------------------------------------------------------------
// 2. Counters never fall

/// Every counter of `before` that is a count since start is at least as
/// large in `after` (gauges may fall). Names come from the stats
/// themselves, so a counter added later is checked too.
fn assert_counters_kept(before: &[(&'static str, u64)], after: &[(&'static str, u64)]) {
    let mut checked = 0;
    for &(name, was) in before {
        if kstat_kind(name) != KstatKind::Counter {
            continue;
        }
        let now = after
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("counter {name} vanished: {after:?}"))
            .1;
        assert!(now >= was, "counter {name} fell from {was} to {now}");
        checked += 1;
    }
    assert!(checked > 20, "only {checked} counters checked");
}

fn device_counter(stats: &L2Stats, slot: u8, name: &str) -> u64 {
    assert_eq!(kstat_kind(name), KstatKind::Counter, "{name}");
    dev_stat(stats, slot, name)
}

#[test]
fn counters_never_fall_when_a_device_leaves() {
    let mut world = World::new();
    let data = world.add_file("f", 6 << 20, 11);
    let (cache, ds) = new_cache(&world.src, Compression::Lz4, quiet_l2());
    let faulty = FaultyDevice::new(Box::new(
        FileDevice::open(world.device_path("a.img"), Some(DEVICE_BYTES)).unwrap(),
    ));
    let faults = Arc::clone(&faulty.faults);
    let (slot_a, _) = add_device(&cache, Box::new(faulty)).unwrap();
    let (slot_b, _) = add_path(&cache, &world.device_path("b.img"), Some(DEVICE_BYTES)).unwrap();
    let handle = cache.open(ds, "f", false).unwrap();
    // Onto both devices, then read back from flash (the ARC holds 1 MiB).
    fill(&cache, &handle, &data);
    check_all(&cache, &handle, &data, "from flash");
    // Corrupt reads of device A: checksum errors, served by primary.
    faults
        .corrupt_reads
        .store(true, std::sync::atomic::Ordering::SeqCst);
    check_all(&cache, &handle, &data, "under corruption");
    let before = cache.stats();
    let l2_before = before.l2.as_ref().unwrap();
    for name in [
        "l2_write_bytes",
        "l2_read_bytes",
        "l2_cksum_bad",
        "l2_feeds",
    ] {
        assert!(
            device_counter(l2_before, slot_a, name) > 0,
            "device A has no {name}: {l2_before:?}"
        );
    }
    assert!(device_counter(l2_before, slot_b, "l2_write_bytes") > 0);

    cache.remove_cache_device(slot_a).unwrap();
    let after = cache.stats();
    assert_counters_kept(&before.kstats(), &after.kstats());
    // Gauges do fall: A's records are gone from the sizes.
    let l2_after = after.l2.as_ref().unwrap();
    assert_eq!(l2_after.get("l2_devices"), 1);
    assert_eq!(
        l2_after.get("l2_asize"),
        dev_stat(l2_after, slot_b, "l2_asize")
    );

    // A device added afterwards adds to what the removed one left.
    let (slot_c, _) = add_path(&cache, &world.device_path("c.img"), Some(DEVICE_BYTES)).unwrap();
    fill(&cache, &handle, &data);
    let later = cache.stats();
    assert!(device_counter(later.l2.as_ref().unwrap(), slot_c, "l2_write_bytes") > 0);
    assert_counters_kept(&after.kstats(), &later.kstats());
    shutdown(cache);
}

// ---------------------------------------------------------------------------
// 3. l2_asize within the data area

/// Per device: `l2_asize` (and `l2_size` of plain records) at most the
/// capacity of its data area.
fn assert_within_capacity(cache: &Cache, step: &str) -> u64 {
    let stats = l2(cache);
    let mut most = 0;
    for device in &stats.devices {
        let asize = dev_stat(&stats, device.slot, "l2_asize");
        assert!(
            asize <= device.size_bytes,
            "{step}: device {} holds l2_asize {asize} over its capacity {}",
            device.slot,
            device.size_bytes
        );
        most = most.max(asize);
    }
    most
}

#[test]
fn allocated_size_stays_within_the_device_under_eviction() {
    // A 64 MiB device, filled about six times over with records of mixed
    // sizes (whole 64 KiB records, and each file's shorter tail) stored
    // plain and compressed (lz4 halves this content).
    let mut world = World::new();
    let device_bytes = 64 << 20;
    let mut files = Vec::new();
    for i in 0..24u64 {
        let len = (16 << 20) + (i as usize * 37_000) % RS;
        files.push((
            format!("f{i}"),
            world.add_file(&format!("f{i}"), len, 500 + i),
        ));
    }
    let (cache, plain) = new_cache(&world.src, Compression::Off, quiet_l2());
    let compressed = cache
        .add_dataset(
            "lz4",
            Arc::new(l2arc::primary::dir::DirPrimary::new(&world.src).unwrap()),
            DatasetConfig::default()
                .recordsize_bytes(RS as u32)
                .compression(Compression::Lz4),
        )
        .unwrap();
    add_path(&cache, &world.device_path("d.img"), Some(device_bytes)).unwrap();
    let mut most = 0;
    let mut feeds = 0;
    for (i, (name, data)) in files.iter().enumerate() {
        let ds = if i % 2 == 0 { plain } else { compressed };
        let handle = cache.open(ds, name, false).unwrap();
        for index in 0..records(data) {
            check_record(&cache, &handle, data, index, "fill");
            if index % 4 == 3 {
                cache.feed_l2arc();
                feeds += 1;
                most = most.max(assert_within_capacity(&cache, &format!("feed {feeds}")));
            }
        }
    }
    let stats = l2(&cache);
    let device = &stats.devices[0];
    // The hand went round several times, and the device was near full.
    assert!(
        dev_stat(&stats, 0, "l2_write_bytes") > 4 * device.size_bytes,
        "{stats:?}"
    );
    assert!(most > device.size_bytes / 2, "at most {most}: {stats:?}");
    shutdown(cache);
}
