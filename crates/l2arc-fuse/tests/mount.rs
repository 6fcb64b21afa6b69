//! The file system mounted in-process: read-ahead and the table bounds,
//! observed through the cache's counters and real system calls.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use l2arc::primary::dir::DirPrimary;
use l2arc::{Cache, CacheConfig, DatasetConfig};
use l2arc_fuse::{CachedFs, FsOptions, MountOptions};
use l2arc_testkit::mapping::SharedMapping;
use l2arc_testkit::within;

struct Mounted {
    mnt: PathBuf,
    _mount: l2arc_fuse::MountGuard,
    cache: Arc<Cache>,
    _dir: tempfile::TempDir,
}

fn mount(options: FsOptions, populate: impl FnOnce(&Path)) -> Mounted {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    populate(&src);
    let cache = Cache::new(CacheConfig::default().arc_max_bytes(64 << 20)).unwrap();
    let primary = Arc::new(DirPrimary::new(&src).unwrap());
    let dataset = cache
        .add_dataset(
            "t",
            Arc::clone(&primary) as Arc<dyn l2arc::primary::Primary>,
            DatasetConfig::default(),
        )
        .unwrap();
    let fs = CachedFs::new(Arc::clone(&cache), dataset, primary, options).unwrap();
    let guard = l2arc_fuse::MountGuard::mount(fs, &mnt, &MountOptions::default())
        .unwrap_or_else(|e| panic!("mount failed ({e}): run scripts/setup.sh (fuse3)"));
    // Fields drop in order: unmount first, then the cache, then the tree.
    Mounted {
        mnt,
        _mount: guard,
        cache,
        _dir: dir,
    }
}

fn stat(cache: &Cache, name: &str) -> u64 {
    cache
        .stats()
        .kstats()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no kstat {name}"))
        .1
}

#[test]
fn sequential_reader_is_read_ahead() {
    const RECORDS: u64 = 64; // 8 MiB of 128 KiB records
    let m = mount(FsOptions::default(), |src| {
        let data: Vec<u8> = (0..RECORDS * (128 << 10))
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(src.join("seq"), data).unwrap();
    });
    let mut f = std::fs::File::open(m.mnt.join("seq")).unwrap();
    let mut buf = vec![0u8; 128 << 10];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        assert!(
            buf[..n]
                .iter()
                .enumerate()
                .all(|(k, &b)| b == ((total + k as u64) % 251) as u8)
        );
        total += n as u64;
        // Give the background read-ahead a moment, as a consumer would.
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert_eq!(total, RECORDS * (128 << 10));
    let prefetched = stat(&m.cache, "prefetch_data_misses");
    let demand_misses = stat(&m.cache, "demand_data_misses");
    assert!(prefetched > 0, "no read-ahead for a sequential reader");
    assert!(
        prefetched + demand_misses >= RECORDS && demand_misses < RECORDS / 2,
        "read-ahead should fetch most records first: {prefetched} prefetched, {demand_misses} demand misses"
    );
}

#[test]
fn random_reader_is_not_read_ahead_and_handles_are_bounded() {
    let m = mount(
        FsOptions {
            max_open_handles: 3,
            ..FsOptions::default()
        },
        |src| {
            std::fs::write(src.join("r"), vec![7u8; 4 << 20]).unwrap();
        },
    );
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(m.mnt.join("r")).unwrap();
    let mut buf = [0u8; 4096];
    for i in [17u64, 3, 25, 9, 30, 1] {
        f.read_exact_at(&mut buf, i * (128 << 10) + 4096).unwrap();
        assert!(buf.iter().all(|&b| b == 7));
    }
    assert_eq!(
        stat(&m.cache, "prefetch_data_misses"),
        0,
        "random reads prefetched"
    );
    // Three handles at most: the fourth open is EMFILE.
    let _a = std::fs::File::open(m.mnt.join("r")).unwrap();
    let _b = std::fs::File::open(m.mnt.join("r")).unwrap();
    let e = std::fs::File::open(m.mnt.join("r")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
    let e = std::fs::read_dir(&m.mnt).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
}

/// Calls `f` until it stops failing with ENFILE (the node table full while
/// the kernel's forgets are on their way), for at most `limit`.
fn retry_enfile<T>(limit: Duration, f: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    retry_on(libc::ENFILE, limit, f)
}

/// Calls `f` until it fails with anything but `errno`, or `limit` passes.
fn retry_on<T>(
    errno: i32,
    limit: Duration,
    mut f: impl FnMut() -> std::io::Result<T>,
) -> std::io::Result<T> {
    let give_up = std::time::Instant::now() + limit;
    loop {
        match f() {
            Err(e) if e.raw_os_error() == Some(errno) && std::time::Instant::now() < give_up => {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

#[test]
fn inode_table_is_bounded_and_drains_without_memory_pressure() {
    const MAX_NODES: usize = 64;
    const NAMES: usize = 2000;
    let m = mount(
        FsOptions {
            max_nodes: MAX_NODES,
            ..FsOptions::default()
        },
        |src| {
            for i in 0..NAMES {
                std::fs::write(src.join(format!("f{i}")), i.to_string()).unwrap();
            }
        },
    );
    // A client stats 30 times as many names as the table holds. The kernel
    // would keep every dentry (and so every node) until memory runs short;
    // the mount asks it to drop idle ones near the bound, so every name
    // gets in after at most a short wait.
    let started = std::time::Instant::now();
    for i in 0..NAMES {
        let path = m.mnt.join(format!("f{i}"));
        let meta = retry_enfile(Duration::from_secs(10), || std::fs::metadata(&path))
            .unwrap_or_else(|e| {
                panic!("stat {} after {:?}: {e}", path.display(), started.elapsed())
            });
        assert_eq!(meta.len(), i.to_string().len() as u64);
    }
    // Nodes that open files pin cannot be forgotten: with the root and 63
    // files held open the table is full for good, and a new name gets
    // ENFILE however long it waits.
    let mut held = Vec::new();
    for i in 0..MAX_NODES - 1 {
        let path = m.mnt.join(format!("f{i}"));
        let file = retry_enfile(Duration::from_secs(10), || std::fs::File::open(&path))
            .unwrap_or_else(|e| panic!("open {} with {} held: {e}", path.display(), held.len()));
        held.push(file);
    }
    let path = m.mnt.join(format!("f{}", NAMES - 1));
    let e = retry_enfile(Duration::from_secs(1), || std::fs::File::open(&path)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENFILE), "{e}");
    let mut first = String::new();
    held[0].read_to_string(&mut first).unwrap();
    assert_eq!(first, "0", "held files still read right");
    // Closed, they are idle nodes like any other: new names get in again.
    drop(held);
    let text = retry_enfile(Duration::from_secs(10), || std::fs::read_to_string(&path)).unwrap();
    assert_eq!(text, (NAMES - 1).to_string());
}

#[test]
fn directory_listings_held_open_are_bounded_in_bytes() {
    // 100 entries with 21-byte names cost about 7 KiB (a 40-byte slot and
    // a 32-byte allocation each); allow two such listings at once.
    let m = mount(
        FsOptions {
            max_dir_listing_bytes: 16 << 10,
            ..FsOptions::default()
        },
        |src| {
            for d in 0..3 {
                let dir = src.join(format!("d{d}"));
                std::fs::create_dir(&dir).unwrap();
                for i in 0..100 {
                    std::fs::write(dir.join(format!("entry-number-{i:08}")), b"x").unwrap();
                }
            }
        },
    );
    let open = |d: usize| std::fs::read_dir(m.mnt.join(format!("d{d}")));
    let first = open(0).unwrap();
    let second = open(1).unwrap();
    let e = open(2).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOMEM), "{e}");
    // Closing gives the budget back; a listing is read whole. The kernel
    // sends the release after close returns, so the budget comes back
    // soon after, not at once.
    drop(first);
    let third = retry_on(libc::ENOMEM, Duration::from_secs(10), || open(2)).unwrap();
    assert_eq!(third.count(), 100);
    assert_eq!(second.count(), 100);
    let again = retry_on(libc::ENOMEM, Duration::from_secs(10), || open(0)).unwrap();
    assert_eq!(again.count(), 100);
}

#[test]
fn hot_files_are_served_by_the_page_cache_until_the_source_changes() {
    const LEN: usize = 4 << 20;
    let m = mount(FsOptions::default(), |src| {
        std::fs::write(src.join("hot"), vec![1u8; LEN]).unwrap();
    });
    let src = m._dir.path().join("src/hot");
    assert!(std::fs::read(m.mnt.join("hot")).unwrap() == vec![1u8; LEN]);
    let reads = stat(&m.cache, "reads");
    for _ in 0..3 {
        // Each a new open: the kernel keeps its pages (FOPEN_KEEP_CACHE).
        assert!(std::fs::read(m.mnt.join("hot")).unwrap() == vec![1u8; LEN]);
    }
    assert_eq!(
        stat(&m.cache, "reads"),
        reads,
        "re-reading a hot file reached the daemon instead of the page cache"
    );

    // Rewritten behind the mount, same size, mtime set back: the next open
    // must not keep the old pages.
    use std::os::unix::fs::FileExt;
    let before = std::fs::metadata(&src).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&src).unwrap();
    f.write_all_at(&vec![2u8; LEN], 0).unwrap();
    f.set_times(
        std::fs::FileTimes::new()
            .set_accessed(before.accessed().unwrap())
            .set_modified(before.modified().unwrap()),
    )
    .unwrap();
    drop(f);
    std::thread::sleep(std::time::Duration::from_millis(1200)); // the name's TTL
    assert!(
        std::fs::read(m.mnt.join("hot")).unwrap() == vec![2u8; LEN],
        "old bytes from the page cache after a change behind the mount"
    );
    assert!(stat(&m.cache, "reads") > reads);
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .collect()
}

/// Opens `path` read-only with the kernel's read-ahead off (a random
/// reader's hint), so that every page the page cache gains comes from a
/// read of ours or a store.
fn open_random(path: &Path) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: an open descriptor; advice only.
    let ret = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    assert_eq!(ret, 0);
    f
}

/// Which of the pages of `f` in `[offset, offset + len)` are in the page
/// cache (mincore of a shared mapping).
fn resident_pages(f: &std::fs::File, offset: usize, len: usize) -> Vec<bool> {
    use std::os::fd::AsRawFd;
    const PAGE: usize = 4096;
    // SAFETY: a fresh shared read-only mapping of an open file, unmapped
    // below; mincore writes one byte per page into `vec`.
    unsafe {
        let map = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            offset as libc::off_t,
        );
        assert_ne!(map, libc::MAP_FAILED);
        let mut vec = vec![0u8; len / PAGE];
        assert_eq!(libc::mincore(map, len, vec.as_mut_ptr()), 0);
        libc::munmap(map, len);
        vec.iter().map(|b| b & 1 == 1).collect()
    }
}

/// A small random read fills the page cache with the whole record under
/// it (128 KiB), so the next read of that record never reaches the daemon;
/// with `store_whole_records` off, only the pages read are there.
#[test]
fn a_small_read_fills_the_page_cache_with_its_whole_record() {
    use std::os::unix::fs::FileExt;
    const RECORD: usize = 128 << 10;
    for store in [true, false] {
        let data = pattern(8 * RECORD, 1);
        let m = mount(
            FsOptions {
                store_whole_records: store,
                ..FsOptions::default()
            },
            |src| std::fs::write(src.join("r"), &data).unwrap(),
        );
        let f = open_random(&m.mnt.join("r"));
        let mut page = vec![0u8; 4096];
        f.read_exact_at(&mut page, (RECORD + 8192) as u64).unwrap();
        assert_eq!(page, data[RECORD + 8192..][..4096]);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let whole = loop {
            let resident = resident_pages(&f, RECORD, RECORD);
            if resident.iter().all(|r| *r) || std::time::Instant::now() > deadline {
                break resident.iter().filter(|r| **r).count();
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let next = resident_pages(&f, 2 * RECORD, RECORD);
        assert!(next.iter().all(|r| !*r), "the next record was read too");
        if store {
            assert_eq!(
                whole,
                RECORD / 4096,
                "pages of the record in the page cache"
            );
            let reads = stat(&m.cache, "reads");
            f.read_exact_at(&mut page, (RECORD + 100 * 1024) as u64)
                .unwrap();
            assert_eq!(page, data[RECORD + 100 * 1024..][..4096]);
            assert_eq!(stat(&m.cache, "reads"), reads, "served by the page cache");
        } else {
            assert!(whole < 4, "{whole} pages without stores");
        }
    }
}

/// Small reads (each storing its record into the page cache) raced with
/// writes and truncates through the mount: every read after a write or
/// truncate returned sees it, whatever the stores were doing.
#[test]
fn stores_never_outlive_a_write_or_truncate_through_the_mount() {
    use std::os::unix::fs::FileExt;
    const RECORD: usize = 128 << 10;
    const LEN: usize = 4 * RECORD;
    let mut model = pattern(LEN, 2);
    let m = mount(FsOptions::default(), |src| {
        std::fs::write(src.join("w"), &model).unwrap();
    });
    let path = m.mnt.join("w");
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    let mut page = vec![0u8; 4096];
    for round in 0..1000u32 {
        let len = model.len();
        // A small read: its record goes to the page cache by a store.
        let at = next(len - 4096) / 4096 * 4096;
        let reader = open_random(&path);
        reader.read_exact_at(&mut page, at as u64).unwrap();
        assert_eq!(page, model[at..][..4096], "round {round}: read at {at}");
        if round % 10 == 9 {
            // Truncate into the record just read, then grow back by a write.
            let cut = at + next(4096);
            let w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            w.set_len(cut as u64).unwrap();
            model.truncate(cut);
            assert_eq!(std::fs::metadata(&path).unwrap().len(), cut as u64);
            let mut tail = Vec::new();
            open_random(&path).read_to_end(&mut tail).unwrap();
            assert!(tail == model, "round {round}: after truncating to {cut}");
            let fill = pattern(LEN - cut, round as u8);
            w.write_all_at(&fill, cut as u64).unwrap();
            model.extend_from_slice(&fill);
        } else {
            // A write into the same record, through a writer opened now.
            let into = at / RECORD * RECORD + next(RECORD - 512);
            let bytes = pattern(512, round as u8 ^ 0x5a);
            let w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            w.write_all_at(&bytes, into as u64).unwrap();
            model[into..into + 512].copy_from_slice(&bytes);
        }
        let mut back = vec![0u8; RECORD];
        let start = at / RECORD * RECORD;
        let fresh = open_random(&path);
        fresh.read_exact_at(&mut back, start as u64).unwrap();
        assert!(
            back == model[start..start + RECORD],
            "round {round}: the record at {start} after the change"
        );
        drop(reader);
    }
}

/// A mount of one file of `bytes` over an emulated array of 64 disks that
/// take 200 ms a read, served by `threads` threads, with our read-ahead and
/// record stores off: every read that misses waits on the disks.
fn mount_over_slow_disks(
    bytes: &[u8],
    threads: usize,
) -> (
    tempfile::TempDir,
    PathBuf,
    Arc<l2arc::primary::emulated_hdd::EmulatedHdd>,
    l2arc_fuse::MountGuard,
) {
    use l2arc::primary::emulated_hdd::{EmulatedHdd, HddConfig};
    let dir = tempfile::tempdir().unwrap();
    let (src, mnt) = (dir.path().join("src"), dir.path().join("mnt"));
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    std::fs::write(src.join("f"), bytes).unwrap();
    let cache = Cache::new(CacheConfig::default().arc_max_bytes(64 << 20)).unwrap();
    let primary = Arc::new(DirPrimary::new(&src).unwrap());
    let hdd = Arc::new(
        EmulatedHdd::new(
            Arc::clone(&primary) as Arc<dyn l2arc::primary::Primary>,
            HddConfig::constant(64, 200.0),
        )
        .unwrap(),
    );
    let dataset = cache
        .add_dataset(
            "t",
            Arc::clone(&hdd) as Arc<dyn l2arc::primary::Primary>,
            DatasetConfig::default(),
        )
        .unwrap();
    let options = FsOptions {
        readahead_max_records: 0,
        store_whole_records: false,
        ..FsOptions::default()
    };
    let fs = CachedFs::new(cache, dataset, primary, options).unwrap();
    let mount_options = MountOptions {
        threads,
        ..MountOptions::default()
    };
    let guard = l2arc_fuse::MountGuard::mount(fs, &mnt, &mount_options).unwrap();
    (dir, mnt, hdd, guard)
}

/// Readers whose reads all wait on primary storage (200 ms a read, 64
/// spindles), through the kernel's read-ahead (background reads) and
/// without it (`POSIX_FADV_RANDOM`, as fio's random readers): a read that
/// misses holds a session thread while the disks answer, and the kernel
/// sends at most `max_background` background reads at once, which the
/// mount sets to its thread count. So 32 readers of 32 records have all
/// their reads on the disks at once with 32 threads, and never more than
/// the threads with 8.
#[test]
fn reads_waiting_on_primary_storage_overlap_up_to_the_mounts_threads() {
    const READERS: usize = 32;
    const RECORD: usize = 128 << 10;
    for (threads, read_ahead) in [(32usize, true), (32, false), (8, true)] {
        let bytes = pattern(READERS * RECORD, 9);
        let (_dir, mnt, hdd, guard) = mount_over_slow_disks(&bytes, threads);
        let start = std::sync::Barrier::new(READERS);
        std::thread::scope(|s| {
            for reader in 0..READERS {
                let (mnt, bytes, start) = (&mnt, &bytes, &start);
                s.spawn(move || {
                    use std::os::unix::fs::FileExt;
                    let f = if read_ahead {
                        std::fs::File::open(mnt.join("f")).unwrap()
                    } else {
                        open_random(&mnt.join("f"))
                    };
                    let offset = reader * RECORD + 4096;
                    let mut buf = vec![0u8; 4096];
                    start.wait();
                    f.read_exact_at(&mut buf, offset as u64).unwrap();
                    assert!(buf == bytes[offset..offset + 4096], "reader {reader}");
                });
            }
        });
        drop(guard);
        let in_flight_max = hdd.stats().in_flight_max;
        eprintln!("{threads} threads, read-ahead {read_ahead}: {in_flight_max} reads at once");
        if threads == READERS {
            assert!(
                in_flight_max >= 24,
                "{threads} threads, read-ahead {read_ahead}: only {in_flight_max} of {READERS} reads on the disks at once"
            );
        } else {
            assert!(
                in_flight_max <= threads as u64,
                "{in_flight_max} reads on {threads} threads"
            );
        }
    }
}

/// A program that reads a file only through a shared mapping sees a
/// change made in the source within 2 s, by each of the watcher's two
/// ways alone: inotify (immediate), and the periodic generation check
/// that covers what inotify cannot see (another NFS client's writes).
#[test]
fn an_mmap_reader_sees_source_changes_by_inotify_and_by_polling_alone() {
    const LEN: usize = 1 << 20;
    for (inotify, poll_ms) in [(true, 0u64), (false, 500)] {
        let m = mount(
            FsOptions {
                attr_timeout: Duration::from_secs(60),
                source_inotify: inotify,
                source_poll_interval: Duration::from_millis(poll_ms),
                ..FsOptions::default()
            },
            |src| std::fs::write(src.join("f"), pattern(LEN, 1)).unwrap(),
        );
        let path = m._dir.path().join("src/f");
        let file = std::fs::File::open(m.mnt.join("f")).unwrap();
        let map = SharedMapping::new(&file, LEN, false);
        assert!(map.bytes() == pattern(LEN, 1));
        let mut took = Vec::new();
        for round in 2..5u8 {
            // Rewritten in place: same size, often the same mtime tick.
            use std::os::unix::fs::FileExt;
            let writer = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            writer.write_all_at(&pattern(LEN, round), 0).unwrap();
            drop(writer);
            let seen = within(Duration::from_secs(2), || {
                map.bytes() == pattern(LEN, round)
            });
            took.push(seen.unwrap_or_else(|| {
                panic!("inotify {inotify}, poll {poll_ms} ms: old bytes after 2 s (round {round})")
            }));
        }
        eprintln!("inotify {inotify}, poll {poll_ms} ms: seen after {took:?}");
    }
}

/// Writes through the mount are the mount's own: the watcher must not take
/// them for changes in the source and drop the file's other records. A
/// file is read whole, written through the mount many times, and read
/// again: every record but the one written is still in the ARC.
#[test]
fn writes_through_the_mount_keep_the_rest_of_the_file_cached() {
    use std::os::unix::fs::FileExt;
    const RECORD: usize = 128 << 10;
    const LEN: usize = 32 * RECORD;
    let m = mount(FsOptions::default(), |src| {
        std::fs::write(src.join("w"), pattern(LEN, 3)).unwrap();
    });
    let path = m.mnt.join("w");
    assert!(std::fs::read(&path).unwrap() == pattern(LEN, 3));
    for round in 0..20u8 {
        let w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        w.write_all_at(&pattern(4096, round), 0).unwrap();
        drop(w);
        // Time for the watcher to see each write's events.
        std::thread::sleep(Duration::from_millis(20));
    }
    // The writer's close is checked by generation after it: let it run.
    std::thread::sleep(Duration::from_millis(300));
    let misses =
        |cache: &Cache| stat(cache, "demand_data_misses") + stat(cache, "prefetch_data_misses");
    let (missed, reads) = (misses(&m.cache), stat(&m.cache, "reads"));
    // O_DIRECT-free way around the kernel's pages: the daemon is asked for
    // what the kernel dropped; records 1.. must be hits.
    let f = open_random(&path);
    let mut buf = vec![0u8; RECORD];
    for record in 1..LEN / RECORD {
        f.read_exact_at(&mut buf, (record * RECORD) as u64).unwrap();
        assert!(buf == pattern(LEN, 3)[record * RECORD..][..RECORD]);
    }
    assert_eq!(
        misses(&m.cache),
        missed,
        "records the mount did not write were dropped"
    );
    assert!(
        stat(&m.cache, "reads") > reads,
        "served by the kernel's pages: the ARC was not asked"
    );
}
