//! The file system mounted in-process: read-ahead and the table bounds,
//! observed through the cache's counters and real system calls.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use l2arc::primary::dir::DirPrimary;
use l2arc::{Cache, CacheConfig, DatasetConfig};
use l2arc_fuse::{CachedFs, FsOptions, MountOptions};

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
    let cache = Cache::new(CacheConfig {
        arc_max_bytes: 64 << 20,
        ..CacheConfig::default()
    })
    .unwrap();
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

#[test]
fn inode_table_is_bounded() {
    let m = mount(
        FsOptions {
            max_nodes: 4,
            ..FsOptions::default()
        },
        |src| {
            for i in 0..6 {
                std::fs::write(src.join(format!("f{i}")), b"x").unwrap();
            }
        },
    );
    // The root plus three names fit; the kernel holds them (TTL 1 s).
    let mut results = Vec::new();
    for i in 0..6 {
        results.push(std::fs::metadata(m.mnt.join(format!("f{i}"))).map(|_| ()));
    }
    assert!(results[..3].iter().all(|r| r.is_ok()), "{results:?}");
    let e = results[5].as_ref().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENFILE), "{e}");
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
    // Closing gives the budget back; a listing is read whole.
    drop(first);
    let third = open(2).unwrap();
    assert_eq!(third.count(), 100);
    assert_eq!(second.count(), 100);
    assert_eq!(open(0).unwrap().count(), 100);
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
