//! The L2ARC never returns bad bytes: corruption of the live device,
//! compressed records that fail to decompress, failing and vanishing
//! devices, objects changed while the cache was down, and writes through
//! the cache. Every byte a read returns is checked against primary.

mod l2arc_util;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use l2arc::DeviceOpen;
use l2arc::FileDevice;
use l2arc::internals::DEVICE_ERRORS_MAX;
use l2arc::internals::FaultyDevice;
use l2arc::internals::format::{self, BLOCK_BYTES, Compression, DATA_START_BYTES};
use l2arc_util::*;

// ---------------------------------------------------------------------------
// 1. Corruption

/// Bit flips and garbage written into the data area of the live device
/// while readers read through the cache: every read returns primary's
/// bytes, and the checksum catches the damage (`l2_cksum_bad`).
#[test]
#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn corruption_of_the_live_device_never_reaches_a_reader() {
    for (round, compression) in [Compression::Off, Compression::Lz4, Compression::Zstd]
        .into_iter()
        .enumerate()
    {
        let mut world = World::new();
        let data = world.add_file("f", 8 << 20, 100 + round as u64);
        let device = world.device_path("cache.dev");
        let (cache, ds) = new_cache(&world.src, compression, quiet_l2());
        add_path(&cache, &device, Some(DEVICE_BYTES)).unwrap();
        let f = cache.open(ds, "f", false).unwrap();
        fill(&cache, &f, &data);
        let filled = l2(&cache);
        let n = records(&data);
        assert!(
            filled.get("l2_bufs") as usize >= n * 9 / 10,
            "{compression}: L2ARC not filled: {filled:?}"
        );
        check_all(&cache, &f, &data, "warm");
        let warm = l2(&cache);
        assert!(
            warm.get("l2_hits") as usize >= n / 2,
            "{compression}: reads do not reach the L2ARC: {warm:?}"
        );
        assert_eq!(warm.get("l2_cksum_bad"), 0);
        // Everything written so far lies below this offset (no wrap yet).
        let written_end = DATA_START_BYTES + warm.get("l2_write_bytes");
        assert!(written_end < DEVICE_BYTES);

        let stop = AtomicBool::new(false);
        let reads = AtomicUsize::new(0);
        std::thread::scope(|s| {
            let _stop = StopOnDrop(vec![&stop]);
            for t in 0..2u64 {
                let (cache, f, data, stop, reads) = (&cache, &f, &data, &stop, &reads);
                s.spawn(move || {
                    let mut rng = Rng(0x1234_5678 + t);
                    while !stop.load(Ordering::Relaxed) {
                        let index = rng.below(n as u64) as usize;
                        check_record(cache, f, data, index, "reader under corruption");
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            // Corrupt the device under the readers: single bit flips, short
            // runs of garbage and whole zeroed blocks, at random offsets in
            // the data area, with the feeder re-feeding what was dropped.
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&device)
                .unwrap();
            use std::os::unix::fs::FileExt;
            let mut rng = Rng(0xC0FF_EE00 + round as u64);
            let span = written_end - DATA_START_BYTES;
            for i in 0..400 {
                let offset = DATA_START_BYTES + rng.below(span);
                match i % 3 {
                    0 => {
                        let mut byte = [0u8];
                        file.read_exact_at(&mut byte, offset).unwrap();
                        byte[0] ^= 1 << rng.below(8);
                        file.write_all_at(&byte, offset).unwrap();
                    }
                    1 => {
                        let len = 1 + rng.below(64) as usize;
                        let garbage: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                        let at = offset.min(written_end - len as u64);
                        file.write_all_at(&garbage, at).unwrap();
                    }
                    _ => {
                        let block = offset / BLOCK_BYTES * BLOCK_BYTES;
                        file.write_all_at(&[0u8; 4096], block).unwrap();
                    }
                }
                if i % 20 == 19 {
                    cache.feed_l2arc();
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            file.sync_all().unwrap();
            // Let the readers meet the last of it.
            std::thread::sleep(Duration::from_millis(100));
            stop.store(true, Ordering::Relaxed);
        });
        // Now deterministically: every record once more, twice.
        check_all(&cache, &f, &data, "after corruption");
        check_all(&cache, &f, &data, "after corruption, again");
        let after = l2(&cache);
        assert!(reads.load(Ordering::Relaxed) > 100);
        assert!(
            after.get("l2_cksum_bad") > 0,
            "{compression}: corruption not counted: {after:?}"
        );
        assert_eq!(after.get("l2_io_error"), 0);
        assert_eq!(dev_state(&after, 0), "online");
        eprintln!(
            "{compression}: {} reads under corruption, l2_cksum_bad {}, l2_hits {}",
            reads.load(Ordering::Relaxed),
            after.get("l2_cksum_bad"),
            after.get("l2_hits")
        );
        drop(f);
        shutdown(cache);
        world.assert_primary_intact();
    }
}

/// Compressed records whose checksum is good (recomputed and written into
/// the log, as if the damage had happened before the checksum was taken)
/// but whose frame or stream is broken: decompression fails, the read is a
/// miss counted in `l2_cksum_bad`, and primary's bytes are returned.
#[test]
#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn compressed_records_that_fail_to_decompress_are_misses() {
    for (round, compression) in [Compression::Lz4, Compression::Zstd]
        .into_iter()
        .enumerate()
    {
        let mut world = World::new();
        let data = world.add_file("f", 4 << 20, 200 + round as u64);
        let device = world.device_path("cache.dev");
        {
            let (cache, ds) = new_cache(&world.src, compression, quiet_l2());
            add_path(&cache, &device, Some(DEVICE_BYTES)).unwrap();
            let f = cache.open(ds, "f", false).unwrap();
            fill(&cache, &f, &data);
            drop(f);
            shutdown(cache);
        }
        let chain = log_chain(&device);
        // Distinct records in the log (the background feeder and ours may
        // both have written a record).
        let total_entries = chain
            .iter()
            .flat_map(|b| b.entries.iter().map(|e| e.key_hash))
            .collect::<std::collections::HashSet<u64>>()
            .len();
        assert!(total_entries >= records(&data) * 9 / 10, "log too short");
        // Forge the entries of the newest log block.
        let newest = &chain[0];
        let mut entries = newest.entries.clone();
        assert!(entries.len() >= 4, "newest log block has {}", entries.len());
        let mut forged = 0;
        for (kind, entry) in entries.iter_mut().enumerate().take(4) {
            let location = entry.location;
            assert_eq!(location.compression(), Some(compression));
            let stored_len = location.stored_bytes();
            let mut stored = read_at(&device, location.offset_bytes(), stored_len);
            let lsize = u32::from_le_bytes(stored[4..8].try_into().unwrap());
            match kind {
                // The logical size one short: the output does not fit.
                0 => stored[4..8].copy_from_slice(&(lsize - 1).to_le_bytes()),
                // One long: beyond the record size, the frame is refused.
                1 => stored[4..8].copy_from_slice(&(lsize + 1).to_le_bytes()),
                // psize disagrees with the stored length.
                2 => {
                    let psize = u32::from_le_bytes(stored[0..4].try_into().unwrap());
                    stored[0..4].copy_from_slice(&(psize - 1).to_le_bytes());
                }
                // The stream itself zeroed.
                _ => stored[8..].fill(0),
            }
            write_at(&device, location.offset_bytes(), &stored);
            entry.checksum = format::record_checksum(entry.key_hash, &stored);
            forged += 1;
        }
        let crc = rewrite_log_block(&device, newest, &entries);
        let (mut hdr, _) = header(&device);
        let mut pointer = hdr.newest_log.unwrap();
        assert_eq!(pointer.offset_bytes, newest.pointer.offset_bytes);
        pointer.crc = crc;
        hdr.newest_log = Some(pointer);
        write_header(&device, &hdr);

        let (cache, ds) = new_cache(&world.src, compression, quiet_l2());
        let (_, open) = add_path(&cache, &device, None).unwrap();
        assert_eq!(open, DeviceOpen::Rebuilding);
        wait_rebuild(&cache);
        let rebuilt = l2(&cache);
        // The forged log was accepted whole: the forgery is consistent.
        assert_eq!(rebuilt.get("l2_rebuild_bufs") as usize, total_entries);
        assert_eq!(rebuilt.get("l2_rebuild_cksum_lb_errors"), 0);
        let f = cache.open(ds, "f", false).unwrap();
        check_all(&cache, &f, &data, "forged compressed records");
        check_all(&cache, &f, &data, "forged compressed records, again");
        let after = l2(&cache);
        assert_eq!(
            after.get("l2_cksum_bad"),
            forged,
            "{compression}: {after:?}"
        );
        assert!(after.get("l2_hits") as usize >= total_entries - forged as usize - 16);
        drop(f);
        shutdown(cache);
        world.assert_primary_intact();
    }
}

// ---------------------------------------------------------------------------
// 2. Device failure

fn faulty_device(path: &std::path::Path) -> (FaultyDevice, Arc<l2arc::internals::Faults>) {
    let device = FaultyDevice::new(Box::new(
        FileDevice::open(path, Some(DEVICE_BYTES)).unwrap(),
    ));
    let faults = Arc::clone(&device.faults);
    (device, faults)
}

/// Reads fail: each failure is a miss served by primary, counted in
/// `l2_io_error`; after `DEVICE_ERRORS_MAX` in a row the device is faulted
/// and later reads do not touch it.
#[test]
fn failing_reads_fault_the_device_and_reads_go_on() {
    let mut world = World::new();
    let data = world.add_file("f", 4 << 20, 300);
    let (cache, ds) = new_cache(&world.src, Compression::Lz4, quiet_l2());
    let (device, faults) = faulty_device(&world.device_path("cache.dev"));
    let (slot, open) = add_device(&cache, Box::new(device)).unwrap();
    assert_eq!(open, DeviceOpen::Initialised);
    let f = cache.open(ds, "f", false).unwrap();
    fill(&cache, &f, &data);
    check_all(&cache, &f, &data, "warm");
    let warm = l2(&cache);
    assert!(warm.get("l2_hits") > 32, "{warm:?}");
    assert_eq!(dev_state(&warm, slot), "online");

    // Record by record: online while the errors in a row are fewer than
    // DEVICE_ERRORS_MAX, faulted at that many.
    faults.fail_reads.store(true, Ordering::SeqCst);
    for index in 0..records(&data) {
        check_record(&cache, &f, &data, index, "reads failing");
        let now = l2(&cache);
        let errors = now.get("l2_io_error");
        let expected = if errors < u64::from(DEVICE_ERRORS_MAX) {
            "online"
        } else {
            "faulted"
        };
        assert_eq!(dev_state(&now, slot), expected, "record {index}: {now:?}");
    }
    let failed = l2(&cache);
    assert_eq!(dev_state(&failed, slot), "faulted", "{failed:?}");
    let io_errors = failed.get("l2_io_error");
    assert_eq!(io_errors, u64::from(DEVICE_ERRORS_MAX), "{failed:?}");
    assert_eq!(
        failed.get("l2_bufs"),
        0,
        "a faulted device keeps no entries"
    );
    assert_eq!(failed.get("l2_hits"), warm.get("l2_hits"));

    // The faulted device is left alone: no reads, no writes.
    let touched = faults.reads_failed.load(Ordering::SeqCst);
    let writes = failed.get("l2_writes_sent");
    for _ in 0..2 {
        check_all(&cache, &f, &data, "device faulted");
        assert_eq!(cache.feed_l2arc().records, 0);
    }
    let later = l2(&cache);
    assert_eq!(faults.reads_failed.load(Ordering::SeqCst), touched);
    assert_eq!(later.get("l2_io_error"), io_errors);
    assert_eq!(later.get("l2_writes_sent"), writes);
    assert_eq!(dev_state(&later, slot), "faulted");
    drop(f);
    shutdown(cache);
    world.assert_primary_intact();
}

/// The device vanishes (ENXIO on everything) and its file is deleted while
/// the cache runs: reads go on, without errors, from primary.
#[test]
fn vanished_and_deleted_device_reads_go_on() {
    let mut world = World::new();
    let data = world.add_file("f", 4 << 20, 400);
    let path = world.device_path("cache.dev");
    let (cache, ds) = new_cache(&world.src, Compression::Zstd, quiet_l2());
    let (device, faults) = faulty_device(&path);
    let (slot, _) = add_device(&cache, Box::new(device)).unwrap();
    let f = cache.open(ds, "f", false).unwrap();
    fill(&cache, &f, &data);
    check_all(&cache, &f, &data, "warm");
    assert!(l2(&cache).get("l2_hits") > 32);

    faults.vanished.store(true, Ordering::SeqCst);
    std::fs::remove_file(&path).unwrap();
    for round in 0..3 {
        check_all(&cache, &f, &data, &format!("vanished, pass {round}"));
        cache.feed_l2arc();
    }
    let gone = l2(&cache);
    assert!(gone.get("l2_io_error") > 0, "{gone:?}");
    assert_eq!(dev_state(&gone, slot), "faulted", "{gone:?}");
    assert_eq!(gone.get("l2_bufs"), 0);
    drop(f);
    shutdown(cache);

    // A restart without the device: a clear error naming it, and the cache
    // works without an L2ARC.
    let (cache, ds) = new_cache(&world.src, Compression::Zstd, quiet_l2());
    let err = add_path(&cache, &path, None).unwrap_err();
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "error does not name the device: {err}"
    );
    let f = cache.open(ds, "f", false).unwrap();
    check_all(&cache, &f, &data, "restarted without the device");
    drop(f);
    shutdown(cache);
    world.assert_primary_intact();
}

/// A device file deleted under a plain `FileDevice`: the open descriptor
/// keeps the data, reads are served (from flash or primary) correctly.
#[test]
fn deleted_device_file_reads_go_on() {
    let mut world = World::new();
    let data = world.add_file("f", 2 << 20, 450);
    let path = world.device_path("cache.dev");
    let (cache, ds) = new_cache(&world.src, Compression::Off, quiet_l2());
    add_path(&cache, &path, Some(DEVICE_BYTES)).unwrap();
    let f = cache.open(ds, "f", false).unwrap();
    fill(&cache, &f, &data);
    std::fs::remove_file(&path).unwrap();
    let before = l2(&cache).get("l2_hits");
    check_all(&cache, &f, &data, "device file deleted");
    fill(&cache, &f, &data);
    check_all(&cache, &f, &data, "device file deleted, refilled");
    assert!(l2(&cache).get("l2_hits") > before);
    drop(f);
    shutdown(cache);
    world.assert_primary_intact();
}

/// Writes fail: feeds fail (`l2_writes_error`), nothing is indexed, reads
/// are right. After the failure clears, feeding works again and the log
/// stays a valid chain across the failed batches (a restart rebuilds it).
#[test]
#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn failing_writes_fail_feeds_and_reads_stay_right() {
    let mut world = World::new();
    let data = world.add_file("f", 4 << 20, 500);
    let path = world.device_path("cache.dev");
    let (cache, ds) = new_cache(&world.src, Compression::Lz4, quiet_l2());
    let (device, faults) = faulty_device(&path);
    let (slot, _) = add_device(&cache, Box::new(device)).unwrap();
    let f = cache.open(ds, "f", false).unwrap();

    // A few failed feeds, fewer than fault the device.
    faults.fail_writes.store(true, Ordering::SeqCst);
    let n = records(&data);
    let failing = 4 * (DEVICE_ERRORS_MAX as usize - 2);
    for index in 0..failing {
        check_record(&cache, &f, &data, index, "writes failing");
        if index % 4 == 3 {
            assert_eq!(cache.feed_l2arc().records, 0);
        }
    }
    let failed = l2(&cache);
    // One failed batch per feed (and maybe one of the background feeder).
    let errors = failed.get("l2_writes_error");
    assert!(
        (u64::from(DEVICE_ERRORS_MAX) - 2..u64::from(DEVICE_ERRORS_MAX)).contains(&errors),
        "{failed:?}"
    );
    assert_eq!(failed.get("l2_bufs"), 0);
    assert_eq!(dev_state(&failed, slot), "online");

    // The failure clears: the rest goes to flash and is served from it.
    faults.fail_writes.store(false, Ordering::SeqCst);
    for index in failing..n {
        check_record(&cache, &f, &data, index, "writes working");
        if index % 4 == 3 {
            cache.feed_l2arc();
        }
    }
    cache.feed_l2arc();
    let fed = l2(&cache).get("l2_bufs") as usize;
    assert!(fed >= (n - failing) * 9 / 10, "{fed} records on flash");
    check_all(&cache, &f, &data, "after write failures");
    assert!(l2(&cache).get("l2_hits") > 0);
    drop(f);
    shutdown(cache);

    // The log skips the failed batches cleanly: one unbroken chain from
    // the newest log block back to the first, holding every record fed.
    let chain = log_chain(&path);
    assert_eq!(chain.last().unwrap().header.sequence, 1);
    assert_eq!(chain[0].header.sequence as usize, chain.len());
    let logged: std::collections::HashSet<u64> = chain
        .iter()
        .flat_map(|b| b.entries.iter().map(|e| e.key_hash))
        .collect();
    assert_eq!(logged.len(), fed);
    let (cache, ds) = new_cache(&world.src, Compression::Lz4, quiet_l2());
    assert_eq!(
        add_path(&cache, &path, None).unwrap().1,
        DeviceOpen::Rebuilding
    );
    wait_rebuild(&cache);
    let rebuilt = l2(&cache);
    assert_eq!(rebuilt.get("l2_rebuild_bufs") as usize, fed, "{rebuilt:?}");
    assert_eq!(rebuilt.get("l2_rebuild_log_blks") as usize, chain.len());
    assert_eq!(rebuilt.get("l2_rebuild_cksum_lb_errors"), 0);
    assert_eq!(rebuilt.get("l2_rebuild_io_errors"), 0);
    let f = cache.open(ds, "f", false).unwrap();
    check_all(&cache, &f, &data, "rebuilt after write failures");
    drop(f);
    shutdown(cache);

    // Writes that keep failing fault the device; reads stay right.
    let (cache, ds) = new_cache(&world.src, Compression::Lz4, quiet_l2());
    let (device, faults) = faulty_device(&world.device_path("cache2.dev"));
    let (slot, _) = add_device(&cache, Box::new(device)).unwrap();
    faults.fail_writes.store(true, Ordering::SeqCst);
    let f = cache.open(ds, "f", false).unwrap();
    fill(&cache, &f, &data);
    let broken = l2(&cache);
    assert_eq!(dev_state(&broken, slot), "faulted", "{broken:?}");
    assert_eq!(
        broken.get("l2_writes_error"),
        u64::from(DEVICE_ERRORS_MAX),
        "{broken:?}"
    );
    check_all(&cache, &f, &data, "writes faulted the device");
    drop(f);
    shutdown(cache);
    world.assert_primary_intact();
}

// ---------------------------------------------------------------------------
// 4. Staleness across a restart

/// Objects changed while the cache was down (rewritten in place with a new
/// mtime; replaced by rename) are never served from the rebuilt L2ARC.
#[test]
fn objects_changed_while_down_are_never_served_stale() {
    let mut world = World::new();
    let len = 2 << 20;
    let a_old = world.add_file("a", len, 600);
    let b_old = world.add_file("b", len, 601);
    let c = world.add_file("c", len, 602);
    let device = world.device_path("cache.dev");
    {
        let (cache, ds) = new_cache(&world.src, Compression::Lz4, quiet_l2());
        add_path(&cache, &device, Some(DEVICE_BYTES)).unwrap();
        for (name, data) in [("a", &a_old), ("b", &b_old), ("c", &c)] {
            let h = cache.open(ds, name, false).unwrap();
            fill(&cache, &h, data);
        }
        let filled = l2(&cache);
        assert!(filled.get("l2_bufs") as usize >= 3 * records(&c) * 9 / 10);
        shutdown(cache);
    }

    // "a": rewritten in place, same size and inode, mtime moved explicitly.
    let a_new = content(len, 700);
    {
        use std::os::unix::fs::FileExt;
        let path = world.src.join("a");
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&a_new, 0).unwrap();
        file.set_modified(mtime + Duration::from_secs(7)).unwrap();
        file.sync_all().unwrap();
    }
    // "b": replaced by a new file renamed over it.
    let b_new = content(len, 701);
    std::fs::write(world.src.join("b.tmp"), &b_new).unwrap();
    std::fs::rename(world.src.join("b.tmp"), world.src.join("b")).unwrap();
    world.files[0].1 = a_new.clone();
    world.files[1].1 = b_new.clone();

    let (cache, ds) = new_cache(&world.src, Compression::Lz4, quiet_l2());
    assert_eq!(
        add_path(&cache, &device, None).unwrap().1,
        DeviceOpen::Rebuilding
    );
    wait_rebuild(&cache);
    let rebuilt = l2(&cache);
    assert!(rebuilt.get("l2_rebuild_bufs") as usize >= 3 * records(&c) * 9 / 10);
    for (name, data) in [("a", &a_new), ("b", &b_new)] {
        let h = cache.open(ds, name, false).unwrap();
        check_all(&cache, &h, data, &format!("{name} changed while down"));
    }
    let after_changed = l2(&cache);
    assert_eq!(
        after_changed.get("l2_hits"),
        0,
        "a changed object was served from the L2ARC: {after_changed:?}"
    );
    // The unchanged object still comes from flash.
    let h = cache.open(ds, "c", false).unwrap();
    check_all(&cache, &h, &c, "c unchanged");
    assert!(l2(&cache).get("l2_hits") as usize >= records(&c) / 2);
    drop(h);
    shutdown(cache);
    world.assert_primary_intact();
}

// ---------------------------------------------------------------------------
// 6. Writes through the cache

/// A write drops the L2ARC copies of the records it touches: once the ARC
/// has let them go, a read returns the new bytes, not the old flash copy.
/// Untouched records of the object stay valid on flash.
#[test]
fn writes_through_the_cache_invalidate_flash_copies() {
    for compression in [Compression::Off, Compression::Zstd] {
        let mut world = World::new();
        let mut data = world.add_file("f", 4 << 20, 800);
        let device = world.device_path("cache.dev");
        let (cache, ds) = new_cache(&world.src, compression, quiet_l2());
        add_path(&cache, &device, Some(DEVICE_BYTES)).unwrap();
        let f = cache.open(ds, "f", true).unwrap();
        fill(&cache, &f, &data);
        let n = records(&data);
        assert!(l2(&cache).get("l2_bufs") as usize >= n * 9 / 10);

        // A whole record, part of another, and a write across a boundary.
        let whole = content(RS, 900);
        let part = content(1000, 901);
        let across = content(RS, 902);
        let writes: [(usize, &[u8]); 3] = [
            (5 * RS, &whole),
            (9 * RS + 100, &part),
            (20 * RS + RS / 2, &across),
        ];
        for (offset, bytes) in writes {
            cache.write(&f, offset as u64, bytes).unwrap();
            data[offset..offset + bytes.len()].copy_from_slice(bytes);
        }
        world.files[0].1 = data.clone();
        let touched = [5usize, 9, 20, 21];

        // Push everything out of the ARC with the other records (which
        // still come from flash), then read the written ones.
        let hits_before = l2(&cache).get("l2_hits");
        for index in (0..n).filter(|i| !touched.contains(i)) {
            check_record(&cache, &f, &data, index, "untouched after write");
        }
        assert!(
            l2(&cache).get("l2_hits") - hits_before >= (n as u64) / 2,
            "untouched records lost their flash copies"
        );
        for &index in &touched {
            check_record(&cache, &f, &data, index, "written record");
        }
        // Once more after a feed (the new bytes go to flash) and a sweep
        // of the ARC.
        cache.feed_l2arc();
        check_all(&cache, &f, &data, "after refeed");
        check_all(&cache, &f, &data, "after refeed, again");
        assert_eq!(l2(&cache).get("l2_cksum_bad"), 0);
        drop(f);
        shutdown(cache);
        world.assert_primary_intact();
        // A restart sees the written object as it is now.
        let (cache, ds) = new_cache(&world.src, compression, quiet_l2());
        add_path(&cache, &device, None).unwrap();
        wait_rebuild(&cache);
        let f = cache.open(ds, "f", false).unwrap();
        check_all(&cache, &f, &data, "after restart");
        drop(f);
        shutdown(cache);
    }
}

/// Every 4 KiB block of a versioned record starts with (record, version,
/// block), ends with (record, version), and holds bytes derived from them.
fn versioned_record(record: u64, version: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(RS);
    for block in 0..(RS / 4096) as u64 {
        out.extend_from_slice(&record.to_le_bytes());
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&block.to_le_bytes());
        let fill = (record * 131 + version * 7 + block) as u8;
        out.extend((24..4080).map(|i| if i % 64 < 48 { fill } else { i as u8 }));
        out.extend_from_slice(&record.to_le_bytes());
        out.extend_from_slice(&version.to_le_bytes());
    }
    out
}

/// Writers, readers and the feeder at once: a read that starts after a
/// write returned never sees bytes older than that write, whichever tier
/// they come from (a feed that copied a record before the write must not
/// make it findable after it). A read that overlapped no write of its
/// record returns exactly the last version written.
#[test]
fn concurrent_writes_and_feeds_never_resurrect_old_bytes() {
    writes_racing_feeds(quiet_l2());
}

/// The same with the write-back on (evicted records queued for the
/// background feeder, woken by the queue): a record read before a write
/// and evicted around it must never reach the index.
#[test]
fn concurrent_writes_and_write_back_never_resurrect_old_bytes() {
    writes_racing_feeds(quiet_l2().l2arc_writeback_max_bytes(2 << 20));
}

#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn writes_racing_feeds(l2_config: l2arc::L2ArcConfig) {
    let write_back = l2_config.l2arc_writeback_max_bytes > 0;
    const N: u64 = 40;
    let mut world = World::new();
    let mut initial = Vec::new();
    for record in 0..N {
        initial.extend(versioned_record(record, 0));
    }
    std::fs::write(world.src.join("v"), &initial).unwrap();
    let device = world.device_path("cache.dev");
    let (cache, ds) = new_cache(&world.src, Compression::Lz4, l2_config);
    add_path(&cache, &device, Some(DEVICE_BYTES)).unwrap();
    let f = cache.open(ds, "v", true).unwrap();
    fill(&cache, &f, &initial);
    // Per record: the version of the last write begun, and of the last
    // write returned.
    let started: Vec<AtomicU64> = (0..N).map(|_| AtomicU64::new(0)).collect();
    let latest: Vec<AtomicU64> = (0..N).map(|_| AtomicU64::new(0)).collect();
    let stop = AtomicBool::new(false);
    let (checked, exact) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_millis(2500);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(vec![&stop]);
        // One writer: whole records, rising versions.
        {
            let (cache, f, started, latest, stop) = (&cache, &f, &started, &latest, &stop);
            s.spawn(move || {
                let mut rng = Rng(77);
                let mut version = 0;
                while !stop.load(Ordering::Relaxed) {
                    version += 1;
                    let record = rng.below(N);
                    let bytes = versioned_record(record, version);
                    started[record as usize].store(version, Ordering::SeqCst);
                    cache.write(f, record * RS as u64, &bytes).unwrap();
                    latest[record as usize].store(version, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_micros(300));
                }
            });
        }
        for t in 0..2u64 {
            let (cache, f, started, latest, stop) = (&cache, &f, &started, &latest, &stop);
            let (checked, exact) = (&checked, &exact);
            s.spawn(move || {
                let mut rng = Rng(1000 + t);
                let mut buf = vec![0u8; RS];
                while !stop.load(Ordering::Relaxed) {
                    let record = rng.below(N);
                    let r = record as usize;
                    let begun = started[r].load(Ordering::SeqCst);
                    let floor = latest[r].load(Ordering::SeqCst);
                    let n = cache.read(f, record * RS as u64, &mut buf).unwrap();
                    assert_eq!(n, RS);
                    let quiet = begun == floor && started[r].load(Ordering::SeqCst) == begun;
                    if quiet {
                        // No write of this record overlapped the read.
                        if buf != versioned_record(record, floor) {
                            let v = u64::from_le_bytes(buf[8..16].try_into().unwrap());
                            panic!(
                                "record {record}: read {v} (first block stamp), \
                                 not {floor}, with no write in flight"
                            );
                        }
                        exact.fetch_add(1, Ordering::Relaxed);
                    } else {
                        // A read racing a write of its record may mix two
                        // versions, as pread does; never one older than the
                        // last write returned before the read began.
                        for (block, bytes) in buf.chunks(4096).enumerate() {
                            let word = |at: usize| {
                                u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
                            };
                            assert_eq!(word(0), record, "record {record} block {block}");
                            assert_eq!(word(4080), record, "record {record} block {block}");
                            let (head, tail) = (word(8), word(4088));
                            assert!(
                                head >= floor && tail >= floor,
                                "record {record} block {block}: versions {head}/{tail} \
                                 read after {floor} was written"
                            );
                        }
                    }
                    checked.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        while Instant::now() < deadline {
            cache.feed_l2arc();
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.store(true, Ordering::Relaxed);
    });
    // Quiet now: every record is exactly its latest version.
    let mut expected = Vec::new();
    for record in 0..N {
        expected.extend(versioned_record(
            record,
            latest[record as usize].load(Ordering::SeqCst),
        ));
    }
    cache.feed_l2arc();
    check_all(&cache, &f, &expected, "after concurrent writes");
    check_all(&cache, &f, &expected, "after concurrent writes, again");
    let stats = l2(&cache);
    eprintln!(
        "{} checked reads ({} exact); l2_hits {} l2_feeds {}",
        checked.load(Ordering::Relaxed),
        exact.load(Ordering::Relaxed),
        stats.get("l2_hits"),
        stats.get("l2_feeds")
    );
    assert!(checked.load(Ordering::Relaxed) > 100);
    assert!(exact.load(Ordering::Relaxed) > 50);
    assert!(stats.get("l2_hits") > 0);
    assert_eq!(stats.get("l2_cksum_bad"), 0);
    if write_back {
        assert!(
            stats.get("evict_l2_queued") > 0,
            "the write-back was never used: {stats:?}"
        );
    }
    assert_eq!(std::fs::read(world.src.join("v")).unwrap(), expected);
    world.files.clear();
    drop(f);
    shutdown(cache);
}

// ---------------------------------------------------------------------------
// 6. Sector reads

/// Small reads of 1 MiB records that the ARC does not hold take only the
/// 4 KiB blocks under them (and the record's sector table) from flash, and
/// return primary's bytes: across block boundaries, at the end of a short
/// last record, past the end of the object. A damaged block is caught by
/// its table entry: the read is a miss served from primary. Compressed
/// records have no table and are read whole.
#[test]
#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn small_reads_of_large_records_take_sectors_from_flash() {
    const RECORD: usize = 1 << 20;
    for compression in [Compression::Off, Compression::Lz4] {
        let mut world = World::new();
        // Eight whole records and a short ninth.
        let data = world.add_file("f", 8 * RECORD + 100_000, 77);
        let new_cache = || {
            let cache = l2arc::Cache::new(
                l2arc::CacheConfig::default()
                    .arc_max_bytes(2 << 20)
                    .arc_shards(2)
                    .l2arc(quiet_l2()),
            )
            .unwrap();
            let ds = cache
                .add_dataset(
                    "data",
                    Arc::new(l2arc::primary::dir::DirPrimary::new(&world.src).unwrap()),
                    l2arc::DatasetConfig::default()
                        .recordsize_bytes(RECORD as u32)
                        .compression(compression),
                )
                .unwrap();
            (cache, ds)
        };
        let (cache, ds) = new_cache();
        let device = world.device_path("cache.dev");
        add_path(&cache, &device, Some(DEVICE_BYTES)).unwrap();
        let f = cache.open(ds, "f", false).unwrap();
        let mut whole = vec![0u8; RECORD];
        for index in 0..data.len().div_ceil(RECORD) {
            let n = cache.read(&f, (index * RECORD) as u64, &mut whole).unwrap();
            assert_eq!(whole[..n], data[index * RECORD..(index * RECORD + n)]);
            cache.feed_l2arc();
        }
        cache.feed_l2arc();
        assert!(
            l2(&cache).get("l2_bufs") >= 8,
            "{compression}: {:?}",
            l2(&cache)
        );

        // Random small reads, some across a 4 KiB boundary, some at or past
        // the end of the object, through `read` and `read_view`.
        let before = l2(&cache);
        let arc_before = cache.stats().arc.misses;
        let mut rng = Rng(0x5EC7_0125);
        let reads = 400u64;
        // A read that runs into the next record reads on: that record is
        // read whole (`sector_read_fits`).
        let mut crossings = 0u64;
        for i in 0..reads {
            let len = [4096usize, 512, 6000, 1][(i % 4) as usize];
            let offset = match i % 50 {
                0 => data.len() as u64 - 10,
                1 => data.len() as u64 + 5,
                _ => rng.below(data.len() as u64),
            };
            let mut buf = vec![0u8; len];
            let n = if i % 2 == 0 {
                cache.read(&f, offset, &mut buf).unwrap()
            } else {
                let view = cache.read_view(&f, offset, len).unwrap();
                view.copy_to(&mut buf)
            };
            let start = (offset as usize).min(data.len());
            let end = (start + len).min(data.len());
            assert_eq!(n, end - start, "{compression}: length of {len} at {offset}");
            assert!(
                buf[..n] == data[start..end],
                "{compression}: bytes of {len} at {offset}"
            );
            crossings += u64::from(end > start && start / RECORD != (end - 1) / RECORD);
        }
        let after = l2(&cache);
        let sector_hits = after.get("l2_sector_hits") - before.get("l2_sector_hits");
        let read_bytes = after.get("l2_read_bytes") - before.get("l2_read_bytes");
        eprintln!("{compression}: {sector_hits} sector hits, {read_bytes} bytes read from flash");
        if compression == Compression::Off {
            // The ARC holds two of nine records: most reads go to flash.
            assert!(sector_hits >= reads / 2, "{compression}: {after:?}");
            assert!(
                cache.stats().arc.misses - arc_before >= sector_hits,
                "sector hits are ARC misses"
            );
            // A block or two per read, never the record (but those read
            // into); the table once a record (then it is kept in DRAM):
            // 1.6 blocks a read here, 2.6 if the table were read every time.
            assert!(
                read_bytes <= reads * 2 * BLOCK_BYTES + crossings * RECORD as u64,
                "{compression}: {read_bytes} bytes from flash for {reads} small reads"
            );
        } else {
            assert_eq!(sector_hits, 0, "compressed records have no sector table");
            assert!(after.get("l2_hits") > before.get("l2_hits"));
        }

        // Damage one block in the middle of every plain record on flash: a
        // small read of it is a miss (counted), served from primary.
        let chain = log_chain(&device);
        let mut damaged = Vec::new();
        for entry in chain.iter().flat_map(|b| &b.entries) {
            let location = entry.location;
            if !location.sectored() {
                continue;
            }
            let block_at = location.offset_bytes() + 100 * BLOCK_BYTES;
            let mut byte = read_at(&device, block_at + 7, 1);
            byte[0] ^= 0x10;
            write_at(&device, block_at + 7, &byte);
            damaged.push(location);
        }
        if compression == Compression::Off {
            assert!(
                damaged.len() >= 8,
                "records with a sector table: {}",
                damaged.len()
            );
        } else {
            assert!(damaged.is_empty());
        }
        let bad_before = l2(&cache).get("l2_cksum_bad");
        for index in 0..8 {
            let offset = (index * RECORD) as u64 + 100 * BLOCK_BYTES + 3;
            let mut buf = [0u8; 64];
            assert_eq!(cache.read(&f, offset, &mut buf).unwrap(), 64);
            assert!(buf[..] == data[offset as usize..offset as usize + 64]);
        }
        let bad = l2(&cache).get("l2_cksum_bad") - bad_before;
        if compression == Compression::Off {
            // The two records in the ARC are not read from flash.
            assert!(bad >= 6, "damaged blocks not caught: {bad}");
        }
        check_all_large(&cache, &f, &data, RECORD);
        drop(f);
        shutdown(cache);

        // After a restart the rebuilt index serves sector reads too.
        let (cache, ds) = new_cache();
        add_path(&cache, &device, None).unwrap();
        wait_rebuild(&cache);
        let f = cache.open(ds, "f", false).unwrap();
        for i in 0..64u64 {
            let offset = rng.below(data.len() as u64 - 4096);
            let mut buf = [0u8; 4096];
            assert_eq!(cache.read(&f, offset, &mut buf).unwrap(), 4096, "read {i}");
            assert!(buf[..] == data[offset as usize..offset as usize + 4096]);
        }
        let rebuilt = l2(&cache);
        if compression == Compression::Off {
            assert!(
                rebuilt.get("l2_sector_hits") >= 16,
                "after restart: {rebuilt:?}"
            );
        }
        drop(f);
        shutdown(cache);
        world.assert_primary_intact();
    }
}

/// A dataset may ask sector tables of smaller records
/// (`sector_table_min_bytes`, as serve-nbd does for 128 KiB): then 4 KiB
/// reads of 128 KiB records that only flash holds take a block or two from
/// flash, not the record, and a read queue leaves them to `Cache::read`
/// (`submit_if_cached` says no), while whole-record reads stay in the
/// queue. By default (256 KiB) such records have no table and are read
/// whole. A threshold under 64 KiB is refused.
#[test]
fn a_dataset_may_ask_sector_tables_of_smaller_records() {
    const RECORD: usize = 128 << 10;
    const RECORDS: usize = 32;
    for sector_table_min in [RECORD as u32, format::SECTOR_TABLE_RECORD_BYTES_MIN as u32] {
        let asked = sector_table_min as usize == RECORD;
        let mut world = World::new();
        let data = world.add_file("f", RECORDS * RECORD, 91);
        // The ARC holds two records at most: the rest only flash holds.
        let cache = l2arc::Cache::new(
            l2arc::CacheConfig::default()
                .arc_max_bytes(2 * RECORD as u64)
                .arc_shards(1)
                .l2arc(quiet_l2()),
        )
        .unwrap();
        let config = l2arc::DatasetConfig::default()
            .recordsize_bytes(RECORD as u32)
            .compression(Compression::Off)
            .sector_table_min_bytes(sector_table_min);
        let primary = Arc::new(l2arc::primary::dir::DirPrimary::new(&world.src).unwrap());
        let too_small = config.sector_table_min_bytes(32 << 10);
        let e = cache.add_dataset("small", primary.clone(), too_small);
        assert!(e.unwrap_err().to_string().contains("sector_table_min"));
        let ds = cache.add_dataset("data", primary, config).unwrap();
        add_path(&cache, &world.device_path("cache.dev"), Some(DEVICE_BYTES)).unwrap();
        let f = cache.open(ds, "f", false).unwrap();
        let mut whole = vec![0u8; RECORD];
        for index in 0..RECORDS {
            cache.read(&f, (index * RECORD) as u64, &mut whole).unwrap();
            cache.feed_l2arc();
        }
        cache.feed_l2arc();
        assert!(l2(&cache).get("l2_bufs") >= RECORDS as u64 - 2);

        let before = l2(&cache);
        let mut rng = Rng(0x5EC7_0128);
        let reads = 64u64;
        for _ in 0..reads {
            let offset = rng.below((RECORDS * RECORD - 4096) as u64);
            let mut buf = [0u8; 4096];
            assert_eq!(cache.read(&f, offset, &mut buf).unwrap(), 4096);
            assert!(buf[..] == data[offset as usize..offset as usize + 4096]);
        }
        let after = l2(&cache);
        let sector_hits = after.get("l2_sector_hits") - before.get("l2_sector_hits");
        let read_bytes = after.get("l2_read_bytes") - before.get("l2_read_bytes");
        eprintln!(
            "sector_table_min {sector_table_min}: {sector_hits} sector hits, {read_bytes} bytes from flash"
        );
        if asked {
            assert!(sector_hits >= reads / 2, "{after:?}");
            assert!(read_bytes <= reads * 3 * BLOCK_BYTES, "{read_bytes} bytes");
        } else {
            assert_eq!(sector_hits, 0, "no table under 256 KiB by default");
            assert!(
                read_bytes >= reads / 2 * RECORD as u64,
                "{read_bytes} bytes"
            );
        }

        let declined = read_through_a_queue(&cache, &f, &data, RECORD);
        if asked {
            assert!(declined >= RECORDS - 4, "{declined} of {RECORDS} declined");
        } else {
            assert_eq!(declined, 0, "whole records: the queue reads them");
        }
        drop(f);
        shutdown(cache);
    }
}

/// Per record of `f`: a 4 KiB read inside it, a 4 KiB read at its start
/// and a whole-record read, through `submit_if_cached`; checks the bytes
/// of every read taken, and returns how many were declined (only reads of
/// the first kind may be).
fn read_through_a_queue(
    cache: &l2arc::Cache,
    f: &l2arc::ObjectHandle,
    data: &[u8],
    record: usize,
) -> usize {
    let records = data.len() / record;
    // The read queue takes whole-record reads and small reads at a
    // record's start (a sequential reader's), and other small ones only
    // where no sector read serves them.
    let mut queue = cache.read_queue(3 * records).unwrap();
    let (mut declined, mut taken) = (0, 0);
    let reads_of = |index: usize| {
        let at = index * record;
        [(at + 8192, 4096), (at, 4096), (at, record)]
    };
    for index in 0..records {
        for (kind, (start, len)) in reads_of(index).into_iter().enumerate() {
            let tag = (kind * records + index) as u64;
            if queue.submit_if_cached(f, start as u64, len, tag).unwrap() {
                taken += 1;
            } else {
                assert_eq!(
                    kind, 0,
                    "record {index}: a read of {len} at {start} declined"
                );
                declined += 1;
            }
        }
    }
    let mut done = Vec::new();
    queue.wait(taken, &mut done).unwrap();
    for completion in done {
        let tag = completion.tag as usize;
        let (start, len) = reads_of(tag % records)[tag / records];
        let mut buf = vec![0u8; len];
        assert_eq!(completion.result.unwrap().copy_to(&mut buf), len);
        assert!(buf == data[start..start + len], "tag {}", completion.tag);
    }
    declined
}

fn check_all_large(cache: &l2arc::Cache, f: &l2arc::ObjectHandle, data: &[u8], record: usize) {
    let mut buf = vec![0u8; record];
    for index in 0..data.len().div_ceil(record) {
        let n = cache.read(f, (index * record) as u64, &mut buf).unwrap();
        assert!(buf[..n] == data[index * record..index * record + n]);
    }
}
