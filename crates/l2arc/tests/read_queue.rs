//! Read queues: many reads in flight from one thread, flash read through
//! io_uring (or psync), the same bytes and the same rules as `Cache::read`.

mod l2arc_util;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use l2arc::Compression;
use l2arc::FileDevice;
use l2arc::L2ArcConfig;
use l2arc::internals::FaultyDevice;
use l2arc::{Cache, IoEngine, ObjectHandle, ReadCompletion};
use l2arc_util::*;

fn config(engine: IoEngine) -> L2ArcConfig {
    quiet_l2().l2arc_ioengine(engine)
}

/// Submits every `(offset, len)` with up to `depth` in flight and returns
/// the bytes of each, in submission order.
fn read_all(
    cache: &Cache,
    handle: &ObjectHandle,
    reads: &[(u64, usize)],
    depth: usize,
) -> Vec<Vec<u8>> {
    let mut queue = cache.read_queue(depth).unwrap();
    let mut out = vec![None; reads.len()];
    let mut done: Vec<ReadCompletion> = Vec::new();
    let mut next = 0;
    while out.iter().any(Option::is_none) {
        while next < reads.len() && queue.has_room() {
            let (offset, len) = reads[next];
            queue.submit(handle, offset, len, next as u64).unwrap();
            next += 1;
        }
        queue.wait(1, &mut done).unwrap();
        for completion in done.drain(..) {
            let view = completion.result.unwrap();
            let mut bytes = vec![0u8; view.len()];
            assert_eq!(view.copy_to(&mut bytes), view.len());
            let slot = &mut out[completion.tag as usize];
            assert!(slot.is_none(), "tag {} completed twice", completion.tag);
            *slot = Some(bytes);
        }
    }
    assert_eq!(queue.pending(), 0);
    out.into_iter().map(Option::unwrap).collect()
}

/// A cache reading flash through io_uring, with one device, and the file
/// "f" of `len` bytes (content `seed`) open: the world (kept for its
/// directories), the cache, the handle and the file's bytes.
fn cache_with_file(
    len: usize,
    seed: u64,
    compression: Compression,
) -> (World, Arc<Cache>, ObjectHandle, Vec<u8>) {
    let mut world = World::new();
    let data = world.add_file("f", len, seed);
    let (cache, ds) = new_cache(&world.src, compression, config(IoEngine::IoUring));
    add_path(&cache, &world.device_path("cache.dev"), Some(DEVICE_BYTES)).unwrap();
    let f = cache.open(ds, "f", false).unwrap();
    (world, cache, f, data)
}

fn expected(data: &[u8], offset: u64, len: usize) -> &[u8] {
    let start = (offset as usize).min(data.len());
    &data[start..(start + len).min(data.len())]
}

/// Reads of every shape — within a record, across records, unaligned, at
/// and past the end, empty — cold, from flash and from the ARC, through
/// both engines, return the file's bytes; warm reads come from flash.
#[test]
fn queued_reads_return_the_files_bytes_through_both_engines() {
    for engine in [IoEngine::IoUring, IoEngine::Psync] {
        let mut world = World::new();
        let len = 3 * (1 << 20) + 12_345;
        let data = world.add_file("f", len, 7);
        let device = world.device_path("cache.dev");
        let (cache, ds) = new_cache(&world.src, Compression::Lz4, config(engine));
        assert_eq!(cache.ioengine(), engine);
        add_path(&cache, &device, Some(DEVICE_BYTES)).unwrap();
        let f = cache.open(ds, "f", false).unwrap();
        // Everything onto flash (blocking reads), then read back queued.
        fill(&cache, &f, &data);
        let before = cache.stats();
        let whole: Vec<(u64, usize)> = (0..records(&data)).map(|i| ((i * RS) as u64, RS)).collect();
        for (got, &(offset, n)) in read_all(&cache, &f, &whole, 32).iter().zip(&whole) {
            assert_eq!(
                got.as_slice(),
                expected(&data, offset, n),
                "warm {offset}+{n}"
            );
        }
        let after = cache.stats();
        let l2_hits =
            after.l2.as_ref().unwrap().get("l2_hits") - before.l2.as_ref().unwrap().get("l2_hits");
        // The ARC holds at most 16 of the 49 records; the rest are on flash.
        assert!(
            l2_hits as usize >= records(&data) / 3,
            "{engine:?}: only {l2_hits} of {} records came from flash",
            records(&data)
        );
        assert_eq!(
            after.primary_reads, before.primary_reads,
            "{engine:?}: warm reads hit primary"
        );
        assert_eq!(
            after.reads - before.reads,
            whole.len() as u64,
            "every queued read is counted"
        );
        let mut rng = Rng(11);
        let mut reads: Vec<(u64, usize)> = (0..400)
            .map(|_| {
                let offset = rng.below(len as u64 + 2 * RS as u64);
                let len = rng.below(3 * RS as u64) as usize;
                (offset, len)
            })
            .collect();
        reads.extend([(0, 0), (len as u64, 10), (len as u64 - 1, 10), (0, len + 5)]);
        // Cold: another file, from primary through the queue.
        let other = world.add_file("g", len, 8);
        let g = cache.open(ds, "g", false).unwrap();
        let before = cache.stats().primary_reads;
        for (got, &(offset, n)) in read_all(&cache, &g, &reads, 32).iter().zip(&reads) {
            assert_eq!(
                got.as_slice(),
                expected(&other, offset, n),
                "cold {offset}+{n}"
            );
        }
        assert!(cache.stats().primary_reads >= before + records(&other) as u64 / 2);
        // Random shapes again, now mostly from flash and the ARC.
        for (got, &(offset, n)) in read_all(&cache, &f, &reads, 7).iter().zip(&reads) {
            assert_eq!(
                got.as_slice(),
                expected(&data, offset, n),
                "warm {offset}+{n}"
            );
        }
        cache.assert_consistent();
        drop((f, g));
        shutdown(cache);
    }
}

/// A flash device that corrupts, then fails, every read: queued reads
/// still return primary's bytes, and the damage is counted as it is for
/// blocking reads.
#[test]
fn flash_failures_under_a_queue_fall_back_to_primary() {
    let mut world = World::new();
    let data = world.add_file("f", 2 << 20, 21);
    let (cache, ds) = new_cache(&world.src, Compression::Off, config(IoEngine::IoUring));
    let device = FaultyDevice::new(Box::new(
        FileDevice::open(world.device_path("cache.dev"), Some(DEVICE_BYTES)).unwrap(),
    ));
    let faults = Arc::clone(&device.faults);
    add_device(&cache, Box::new(device)).unwrap();
    let f = cache.open(ds, "f", false).unwrap();
    fill(&cache, &f, &data);
    let whole: Vec<(u64, usize)> = (0..records(&data)).map(|i| ((i * RS) as u64, RS)).collect();

    faults.corrupt_reads.store(true, Ordering::SeqCst);
    for (got, &(offset, n)) in read_all(&cache, &f, &whole, 16).iter().zip(&whole) {
        assert_eq!(got.as_slice(), expected(&data, offset, n));
    }
    let corrupted = l2(&cache);
    assert!(corrupted.get("l2_cksum_bad") >= 16, "{corrupted:?}");
    faults.corrupt_reads.store(false, Ordering::SeqCst);

    // Back onto flash, then every read fails: io errors, device faulted.
    cache.invalidate_object(&f);
    fill(&cache, &f, &data);
    faults.fail_reads.store(true, Ordering::SeqCst);
    for (got, &(offset, n)) in read_all(&cache, &f, &whole, 16).iter().zip(&whole) {
        assert_eq!(got.as_slice(), expected(&data, offset, n));
    }
    let failed = l2(&cache);
    assert!(failed.get("l2_io_error") >= 1, "{failed:?}");
    assert_eq!(dev_state(&failed, 0), "faulted", "{failed:?}");
    drop(f);
    shutdown(cache);
    world.assert_primary_intact();
}

/// Two threads, each with a queue, read the same records at the same time,
/// cold and then warm: each record is read from primary once (single
/// flight across queues), nobody deadlocks, every byte is right.
#[test]
fn queues_on_two_threads_share_fills_and_never_deadlock() {
    let (_world, cache, f, data) = cache_with_file(4 << 20, 5, Compression::Lz4);
    let n = records(&data);
    for round in 0..3 {
        let before = cache.stats().primary_reads;
        std::thread::scope(|scope| {
            for t in 0..2u64 {
                let (cache, f, data) = (&cache, &f, &data);
                scope.spawn(move || {
                    // Opposite orders, so each meets the other's fills.
                    let mut order: Vec<usize> = (0..n).collect();
                    if t == 1 {
                        order.reverse();
                    }
                    let reads: Vec<(u64, usize)> =
                        order.iter().map(|&i| ((i * RS) as u64, RS)).collect();
                    for (got, &(offset, len)) in read_all(cache, f, &reads, 8).iter().zip(&reads) {
                        assert_eq!(got.as_slice(), expected(data, offset, len));
                    }
                });
            }
        });
        let primary = cache.stats().primary_reads - before;
        if round == 0 {
            // 1 MiB ARC, 4 MiB file: a record may be evicted before the
            // other thread reaches it, but never read twice at once.
            assert!(
                primary as usize >= n && primary as usize <= 2 * n,
                "{primary}"
            );
        }
        cache.feed_l2arc();
    }
    cache.assert_consistent();
    drop(f);
    shutdown(cache);
}

/// A queue takes `depth` requests, then says WouldBlock; a queue dropped
/// with reads in flight waits for them (the kernel writes into its
/// buffers); bad depths are refused.
#[test]
fn a_full_queue_refuses_and_a_dropped_queue_waits_for_its_reads() {
    let (_world, cache, f, data) = cache_with_file(2 << 20, 9, Compression::Off);
    fill(&cache, &f, &data);
    assert!(cache.read_queue(0).is_err());
    assert!(cache.read_queue(1 << 20).is_err());
    let mut queue = cache.read_queue(4).unwrap();
    for i in 0..4u64 {
        queue.submit(&f, i * RS as u64 * 5, RS, i).unwrap();
    }
    let refused = queue.submit(&f, 0, RS, 9).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::WouldBlock);
    assert_eq!(queue.pending(), 4);
    drop(queue);
    // The records those reads claimed are filled (not stranded): a
    // blocking read of each finishes.
    for i in 0..4 {
        check_record(&cache, &f, &data, i * 5, "after drop");
    }
    drop(f);
    shutdown(cache);
}

/// `l2arc_ioengine`: psync and io_uring are what they say; a cache built
/// with `auto` on this machine uses io_uring (the tests need it).
#[test]
fn the_io_engine_is_resolved_at_start() {
    let world = World::new();
    for (asked, got) in [
        (IoEngine::Auto, IoEngine::IoUring),
        (IoEngine::IoUring, IoEngine::IoUring),
        (IoEngine::Psync, IoEngine::Psync),
    ] {
        let (cache, _) = new_cache(&world.src, Compression::Off, config(asked));
        assert_eq!(cache.ioengine(), got, "asked {asked:?}");
        assert!(cache.ioengine_fallback_reason().is_none());
        assert_eq!(cache.read_queue(2).unwrap().ioengine(), got);
    }
}

/// `submit_if_cached` takes reads whose records are all in the ARC or on
/// flash and returns their bytes without touching primary storage; a read
/// of a record only primary storage has is refused and nothing of it is
/// taken, claimed or counted. `wait_timeout` returns when nothing is ready
/// and hands back what is.
#[test]
fn reads_of_cached_records_only_are_taken_when_asked() {
    let len = 2 * (1 << 20) + 4_321;
    let (_world, cache, f, data) = cache_with_file(len, 3, Compression::Off);
    let mut queue = cache.read_queue(8).unwrap();
    let mut done: Vec<ReadCompletion> = Vec::new();
    // Cold: refused, and nothing changed.
    let before = cache.stats();
    assert!(!queue.submit_if_cached(&f, 0, 4096, 1).unwrap());
    assert!(!queue.submit_if_cached(&f, RS as u64 - 10, 20, 2).unwrap());
    assert_eq!(queue.pending(), 0);
    let after = cache.stats();
    assert_eq!(after.primary_reads, before.primary_reads);
    assert_eq!(after.arc.misses, before.arc.misses);
    // Past the end there is nothing to read: taken, and empty.
    assert!(queue.submit_if_cached(&f, len as u64 + 1, 10, 3).unwrap());
    queue.wait(1, &mut done).unwrap();
    assert_eq!(done.pop().unwrap().result.unwrap().len(), 0);
    // Everything onto flash; then every shape is taken and right.
    fill(&cache, &f, &data);
    let primary_before = cache.stats().primary_reads;
    let mut rng = Rng(5);
    for round in 0..200u64 {
        let offset = rng.below(len as u64);
        let n = rng.below(2 * RS as u64) as usize + 1;
        assert!(
            queue.submit_if_cached(&f, offset, n, round).unwrap(),
            "{offset}+{n} is cached"
        );
        while queue.pending() > 0 {
            queue
                .wait_timeout(1, &mut done, std::time::Duration::from_micros(50))
                .unwrap();
        }
        let completion = done.pop().unwrap();
        assert!(done.is_empty());
        assert_eq!(completion.tag, round);
        let view = completion.result.unwrap();
        let mut bytes = vec![0u8; view.len()];
        view.copy_to(&mut bytes);
        assert_eq!(bytes, expected(&data, offset, n), "{offset}+{n}");
    }
    assert_eq!(cache.stats().primary_reads, primary_before);
    // Nothing in flight: a timed wait returns at once, with nothing.
    queue
        .wait_timeout(1, &mut done, std::time::Duration::from_secs(5))
        .unwrap();
    assert!(done.is_empty());
    drop(queue);
    drop(f);
    shutdown(cache);
}

/// A record read from flash through a queue is published to the ARC by
/// the time the queue has handed it over: with the queue still alive and
/// idle, readers on another thread get every record from the ARC, without
/// waiting on the queue. The same record asked for three times in one
/// queue is read from flash once (the later requests wait on the queue's
/// own claim, which it completes).
#[test]
fn flash_hits_reach_the_arc_and_an_idle_queue_holds_no_claims() {
    // 64 records through a 16-record ARC: the first eight end on flash only.
    let (_world, cache, f, data) = cache_with_file(4 << 20, 31, Compression::Off);
    fill(&cache, &f, &data);
    let mut reads: Vec<(u64, usize)> = Vec::new();
    for i in 0..8 {
        let copies = if i < 4 { 3 } else { 1 };
        reads.extend(std::iter::repeat_n(((i * RS) as u64, RS), copies));
    }
    let before = cache.stats();
    let mut queue = cache.read_queue(32).unwrap();
    for (tag, &(offset, len)) in reads.iter().enumerate() {
        queue.submit(&f, offset, len, tag as u64).unwrap();
    }
    let mut done = Vec::new();
    queue.wait(reads.len(), &mut done).unwrap();
    assert_eq!(done.len(), reads.len());
    for completion in done {
        let (offset, len) = reads[completion.tag as usize];
        let view = completion.result.unwrap();
        let mut bytes = vec![0u8; view.len()];
        view.copy_to(&mut bytes);
        assert_eq!(bytes.as_slice(), expected(&data, offset, len), "{offset}");
    }
    let after = cache.stats();
    let flash_reads =
        after.l2.as_ref().unwrap().get("l2_hits") - before.l2.as_ref().unwrap().get("l2_hits");
    assert_eq!(flash_reads, 8, "each record is read from flash once");
    // The queue is alive and idle; readers elsewhere must not wait on it.
    let (sent, received) = std::sync::mpsc::channel();
    let reader = {
        let (cache, f, data) = (Arc::clone(&cache), f.clone(), data.clone());
        std::thread::spawn(move || {
            for i in 0..8 {
                let mut buf = vec![0u8; RS];
                let n = cache.read(&f, (i * RS) as u64, &mut buf).unwrap();
                assert_eq!(&buf[..n], expected(&data, (i * RS) as u64, RS));
            }
            sent.send(()).unwrap();
        })
    };
    received
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("a blocking reader waited on the idle queue's claims");
    reader.join().unwrap();
    let later = cache.stats();
    assert_eq!(
        later.arc.hits - after.arc.hits,
        8,
        "all eight were in the ARC"
    );
    assert_eq!(
        later.l2.as_ref().unwrap().get("l2_hits"),
        after.l2.as_ref().unwrap().get("l2_hits")
    );
    drop(queue);
    drop(f);
    shutdown(cache);
}

/// A queue that watches a socket sleeps until its flash reads complete or
/// the socket has input, whichever is first, and says which: the reads in
/// flight all come back, input is seen while reads are in flight (also
/// input that was there before the wait), and with nothing in flight the
/// wait returns at once without watching.
#[test]
fn a_wait_watching_a_socket_wakes_for_reads_and_for_input() {
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;
    // 64 records through a 16-record ARC: the first eight end on flash only.
    let (_world, cache, f, data) = cache_with_file(4 << 20, 37, Compression::Off);
    fill(&cache, &f, &data);
    let (mut client, server) = UnixStream::pair().unwrap();
    let mut queue = cache.read_queue(16).unwrap();
    let mut done = Vec::new();
    assert!(
        !queue
            .wait_or_readable(1, &mut done, server.as_fd())
            .unwrap(),
        "nothing in flight: no watch"
    );
    // Flash reads in flight, no input: the reads come back, no input seen.
    for i in 0..4u64 {
        queue.submit(&f, i * RS as u64, RS, i).unwrap();
    }
    while done.len() < 4 {
        let readable = queue
            .wait_or_readable(1, &mut done, server.as_fd())
            .unwrap();
        assert!(!readable, "no input was sent");
    }
    for completion in done.drain(..) {
        let view = completion.result.unwrap();
        let mut bytes = vec![0u8; view.len()];
        view.copy_to(&mut bytes);
        let offset = completion.tag * RS as u64;
        assert_eq!(bytes.as_slice(), expected(&data, offset, RS));
    }
    // Input before the wait, reads in flight: the input is seen.
    client.write_all(b"x").unwrap();
    for i in 4..8u64 {
        queue.submit(&f, i * RS as u64, RS, i).unwrap();
    }
    let mut seen = false;
    while queue.pending() > 0 {
        seen |= queue
            .wait_or_readable(1, &mut done, server.as_fd())
            .unwrap();
    }
    assert!(seen, "input present during the wait was reported");
    assert_eq!(done.len(), 4);
    let mut byte = [0u8; 1];
    (&server).read_exact(&mut byte).unwrap();
    assert_eq!(&byte, b"x");
    drop(queue);
    drop(f);
    shutdown(cache);
}
