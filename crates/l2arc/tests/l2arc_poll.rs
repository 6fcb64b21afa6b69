//! Polled blocking reads (`l2arc_read_poll_us`): a lone `Cache::read` of a
//! record on flash polls the completion of its io_uring read, returns
//! primary's bytes when the device returns bad ones or fails, and is
//! counted (`l2_read_polled`, `l2_read_poll_slept`); a zero bound and the
//! psync engine never poll.
//!
//! One test in this file, on purpose: whether a read may poll depends on
//! how many blocking flash reads the whole process has in flight, so no
//! other test may read beside it.

mod l2arc_util;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use l2arc::internals::FaultyDevice;
use l2arc::internals::format::Compression;
use l2arc::{FileDevice, IoEngine, L2ArcConfig};
use l2arc_util::*;

/// Reads the whole object through the blocking path twice, warm from
/// flash; returns how many reads that was which reached flash, and the
/// polls counted meanwhile (polled, of them slept).
fn warm_reads(cache: &l2arc::Cache, f: &l2arc::ObjectHandle, data: &[u8]) -> (u64, u64, u64) {
    let before = l2(cache);
    for _ in 0..2 {
        for index in 0..records(data) {
            check_record(cache, f, data, index, "warm");
        }
    }
    let after = l2(cache);
    let delta = |name| after.get(name) - before.get(name);
    (
        delta("l2_hits") + delta("l2_io_error") + delta("l2_cksum_bad"),
        delta("l2_read_polled"),
        delta("l2_read_poll_slept"),
    )
}

fn config(engine: IoEngine, poll_us: u64) -> L2ArcConfig {
    quiet_l2()
        .l2arc_ioengine(engine)
        .l2arc_read_poll_us(poll_us)
}

#[test]
#[allow(clippy::too_many_lines, reason = "one scenario per engine setting")]
fn lone_reads_poll_for_flash_and_return_primarys_bytes_when_it_fails() {
    let cores = std::thread::available_parallelism().unwrap().get();
    assert!(
        cores >= 2,
        "polling needs a spare core; this machine has {cores}"
    );
    let mut world = World::new();
    let data = world.add_file("f", 2 << 20, 77);

    // io_uring, the default bound: every read that reaches flash polls,
    // and on a real device none outlasts 100 ms.
    let path = world.device_path("polled.dev");
    let (cache, ds) = new_cache(
        &world.src,
        Compression::Off,
        config(IoEngine::IoUring, 100_000),
    );
    let device = FaultyDevice::new(Box::new(
        FileDevice::open(&path, Some(DEVICE_BYTES)).unwrap(),
    ));
    let faults = Arc::clone(&device.faults);
    add_device(&cache, Box::new(device)).unwrap();
    let f = cache.open(ds, "f", false).unwrap();
    fill(&cache, &f, &data);
    let (flash_reads, polled, slept) = warm_reads(&cache, &f, &data);
    assert!(
        flash_reads >= records(&data) as u64,
        "{flash_reads} flash reads"
    );
    assert_eq!(polled, flash_reads, "every lone flash read polls");
    assert_eq!(slept, 0, "no read outlasted a 100 ms poll");

    // The device returns flipped bytes, then fails: each polled read is a
    // miss, counted, and the reader gets primary's bytes (warm_reads
    // checks every byte).
    fill(&cache, &f, &data);
    faults.corrupt_reads.store(true, Ordering::SeqCst);
    let before = l2(&cache);
    let (flash_reads, polled, _) = warm_reads(&cache, &f, &data);
    let bad = l2(&cache).get("l2_cksum_bad") - before.get("l2_cksum_bad");
    assert!(
        bad > 0 && bad == flash_reads,
        "{bad} of {flash_reads} caught"
    );
    assert_eq!(polled, flash_reads);
    faults.corrupt_reads.store(false, Ordering::SeqCst);
    fill(&cache, &f, &data);
    faults.fail_reads.store(true, Ordering::SeqCst);
    let (flash_reads, polled, _) = warm_reads(&cache, &f, &data);
    assert!(flash_reads > 0);
    assert_eq!(polled, flash_reads);
    assert!(faults.reads_failed.load(Ordering::SeqCst) >= flash_reads);
    drop(f);
    shutdown(cache);

    // A bound of 1 us: an O_DIRECT read takes longer, so a read polls,
    // then sleeps until its completion (and still returns the bytes).
    let path = world.device_path("slept.dev");
    let device = FileDevice::open(&path, Some(DEVICE_BYTES)).unwrap();
    assert!(
        device.is_direct(),
        "the test directory must take O_DIRECT, or reads finish at submission"
    );
    let (cache, ds) = new_cache(&world.src, Compression::Off, config(IoEngine::IoUring, 1));
    add_device(&cache, Box::new(device)).unwrap();
    let f = cache.open(ds, "f", false).unwrap();
    fill(&cache, &f, &data);
    let (flash_reads, polled, slept) = warm_reads(&cache, &f, &data);
    assert_eq!(polled, flash_reads);
    assert!(
        slept * 2 >= polled,
        "{slept} of {polled} reads slept past a 1 us poll"
    );
    drop(f);
    shutdown(cache);

    // Never with a bound of 0, nor with psync.
    for (engine, poll_us) in [(IoEngine::IoUring, 0), (IoEngine::Psync, 100)] {
        let path = world.device_path(&format!("{}-{poll_us}.dev", engine.name()));
        let (cache, ds) = new_cache(&world.src, Compression::Off, config(engine, poll_us));
        add_path(&cache, &path, Some(DEVICE_BYTES)).unwrap();
        let f = cache.open(ds, "f", false).unwrap();
        fill(&cache, &f, &data);
        let (flash_reads, polled, slept) = warm_reads(&cache, &f, &data);
        assert!(flash_reads > 0);
        assert_eq!((polled, slept), (0, 0), "{engine:?}, {poll_us} us");
        drop(f);
        shutdown(cache);
    }
    world.assert_primary_intact();
}
