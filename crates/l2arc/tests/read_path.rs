//! The read path end to end: `Cache` over real files in a tempdir (through
//! `DirPrimary`) and over an image file (through `ImagePrimary`, O_DIRECT).
//!
//! Every byte a test reads is checked against the bytes on disk, and every
//! claim about caching is checked in the counters (`stats().arc.hits`,
//! `primary_reads`, ...), so a read path that returned the right bytes for
//! the wrong reason (no caching at all, or one primary read per reader) fails.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, RwLock, mpsc};
use std::time::{Duration, Instant, SystemTime};

use l2arc::primary::dir::DirPrimary;
use l2arc::primary::image::ImagePrimary;
use l2arc::primary::{ObjectInfo, Primary, PrimaryObject};
use l2arc::validate_recordsize;
use l2arc::{Cache, CacheConfig, CacheMode, ConfigError, DatasetConfig, DatasetId, ObjectHandle};

const KIB: u32 = 1024;
const MIB: u32 = 1024 * 1024;
const RECORDSIZES: [u32; 4] = [4 * KIB, 8 * KIB, 128 * KIB, MIB];

/// Position-dependent bytes, so a read from the wrong offset never matches.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = (i ^ seed.rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            (x >> 56) as u8 ^ (i >> 12) as u8
        })
        .collect()
}

/// No read-ahead: these tests count primary reads record by record
/// (read-ahead has its own, `read_ahead.rs`).
fn cache(arc_max_bytes: u64, arc_shards: usize) -> Arc<Cache> {
    Cache::new(
        CacheConfig::default()
            .arc_max_bytes(arc_max_bytes)
            .arc_shards(arc_shards)
            .zfs_prefetch_disable(true),
    )
    .expect("valid cache config")
}

fn dataset(
    cache: &Cache,
    primary: Arc<dyn Primary>,
    recordsize: u32,
    mode: CacheMode,
) -> DatasetId {
    cache
        .add_dataset(
            "ds",
            primary,
            DatasetConfig::default()
                .recordsize_bytes(recordsize)
                .primarycache(mode)
                .secondarycache(CacheMode::All)
                .compression(l2arc::Compression::Off),
        )
        .expect("valid dataset config")
}

fn dir(root: &Path) -> Arc<dyn Primary> {
    Arc::new(DirPrimary::new(root).expect("tempdir is a directory"))
}

/// What `pread(fd, len, offset)` returns on a file holding `file`.
fn expected(file: &[u8], offset: u64, len: usize) -> &[u8] {
    let start = offset.min(file.len() as u64) as usize;
    let end = offset.saturating_add(len as u64).min(file.len() as u64) as usize;
    &file[start..end]
}

/// Reads `len` bytes at `offset` through `read` and through `read_view`, and
/// checks both against the file's bytes.
fn check_read(cache: &Cache, h: &ObjectHandle, file: &[u8], offset: u64, len: usize, what: &str) {
    let want = expected(file, offset, len);
    // A guard byte after the buffer: pread must not write past `len`.
    let mut buf = vec![0xA5u8; len + 1];
    let n = cache
        .read(h, offset, &mut buf[..len])
        .unwrap_or_else(|e| panic!("{what}: read {offset}+{len}: {e}"));
    assert_eq!(n, want.len(), "{what}: read {offset}+{len} returned {n}");
    assert!(
        buf[..n] == *want,
        "{what}: read {offset}+{len}: wrong bytes"
    );
    assert_eq!(
        buf[len], 0xA5,
        "{what}: read {offset}+{len} wrote past the buffer"
    );

    let view = cache
        .read_view(h, offset, len)
        .unwrap_or_else(|e| panic!("{what}: read_view {offset}+{len}: {e}"));
    assert_eq!(
        view.len(),
        want.len(),
        "{what}: read_view {offset}+{len} length"
    );
    assert_eq!(view.is_empty(), want.is_empty());
    let mut copy = vec![0u8; view.len()];
    assert_eq!(view.copy_to(&mut copy), want.len());
    assert!(
        copy == *want,
        "{what}: read_view {offset}+{len}: wrong bytes"
    );
}

/// The pread cases for one object of `file` bytes at recordsize `rs`.
fn pread_cases(cache: &Cache, h: &ObjectHandle, file: &[u8], rs: u64, what: &str) {
    let size = file.len() as u64;
    assert_eq!(h.size_bytes(), size, "{what}: size");
    let rsz = rs as usize;
    let cases: Vec<(u64, usize)> = vec![
        (0, file.len()),                // everything, in one read
        (0, file.len() + 3 * rsz + 7),  // asking for more than there is
        (0, 1),                         // first byte
        (1, rsz),                       // one record's worth, straddling two
        (rs - 1, 2),                    // two bytes across a record boundary
        (rs / 2, 2 * rsz + 100),        // spans three or four records
        (rs, rsz),                      // exactly the second record
        (size.saturating_sub(10), 100), // short read at the end
        (size.saturating_sub(1), 1),    // last byte
        (size, 1),                      // at EOF: 0
        (size, rsz),                    // at EOF: 0
        (size + 1, 10),                 // past EOF: 0
        (size + 10 * rs, 10),           // far past EOF: 0
        (u64::MAX - 5, 10),             // at the end of the address space: 0
        (7, 0),                         // zero-length
        (size, 0),                      // zero-length at EOF
        (size / 3, file.len() / 2 + 1), // somewhere in the middle
    ];
    // Twice: the first pass fills the ARC, the second reads it.
    for pass in 0..2 {
        for &(offset, len) in &cases {
            check_read(cache, h, file, offset, len, &format!("{what} pass {pass}"));
        }
    }
    // Record by record, whole and in pieces.
    for index in 0..size.div_ceil(rs) {
        check_read(cache, h, file, index * rs, rsz, what);
        check_read(cache, h, file, index * rs + 3, rsz / 2, what);
    }
    cache.assert_consistent();
}

/// Files of several shapes through DirPrimary, at every recordsize.
#[test]
fn pread_semantics_on_files() {
    for rs in RECORDSIZES {
        let tmp = tempfile::tempdir().unwrap();
        let r = rs as usize;
        let files: Vec<(&str, Vec<u8>)> = vec![
            ("odd", pattern(3 * r + 1234, 1)), // not a multiple of recordsize
            ("exact", pattern(2 * r, 2)),      // a multiple of recordsize
            ("small", pattern(100, 3)),        // shorter than one record
            ("one-short", pattern(r - 1, 4)),  // one byte short of a record
            ("one-long", pattern(r + 1, 5)),   // one byte into the second
            ("empty", Vec::new()),
        ];
        for (name, data) in &files {
            fs::write(tmp.path().join(name), data).unwrap();
        }
        let c = cache(64 << 20, 4);
        let ds = dataset(&c, dir(tmp.path()), rs, CacheMode::All);
        for (name, data) in &files {
            let h = c.open(ds, name, false).unwrap();
            assert_eq!(h.recordsize_bytes(), rs);
            pread_cases(&c, &h, data, u64::from(rs), &format!("rs={rs} {name}"));
        }
        // The empty file never reached the primary; the others did.
        let s = c.stats();
        assert!(s.arc.hits > 0 && s.arc.misses > 0, "rs={rs}: {s:?}");
        assert_eq!(s.primary_errors, 0);
        // Every record was read from primary exactly once (64 MiB holds all).
        let records: u64 = files
            .iter()
            .map(|(_, d)| (d.len() as u64).div_ceil(u64::from(rs)))
            .sum();
        assert_eq!(
            s.primary_reads, records,
            "rs={rs}: one primary read per record"
        );
        assert_eq!(s.arc.misses, records, "rs={rs}");
    }
}

/// The same through an image file, which ImagePrimary opens with O_DIRECT.
#[test]
fn pread_semantics_on_an_image() {
    for rs in RECORDSIZES {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("disk.img");
        let data = pattern(3 * rs as usize + 1234, u64::from(rs));
        fs::write(&path, &data).unwrap();
        let img = ImagePrimary::open(&path, false).unwrap();
        assert!(
            img.is_direct(),
            "{} does not support O_DIRECT: this test wants to exercise it",
            tmp.path().display()
        );
        let c = cache(64 << 20, 4);
        let ds = dataset(&c, Arc::new(img), rs, CacheMode::All);
        let h = c.open(ds, "", false).unwrap();
        pread_cases(&c, &h, &data, u64::from(rs), &format!("image rs={rs}"));
        assert_eq!(
            c.stats().primary_reads,
            4,
            "image rs={rs}: 4 records, 4 reads"
        );
    }
}

#[test]
fn second_read_of_a_record_is_a_hit() {
    let tmp = tempfile::tempdir().unwrap();
    let data = pattern(4 * 4096 + 10, 9);
    fs::write(tmp.path().join("f"), &data).unwrap();
    let c = cache(1 << 20, 2);
    let ds = dataset(&c, dir(tmp.path()), 4 * KIB, CacheMode::All);
    let h = c.open(ds, "f", false).unwrap();

    let counts = |c: &Cache| {
        let s = c.stats();
        (s.arc.hits, s.arc.misses, s.primary_reads)
    };
    assert_eq!(counts(&c), (0, 0, 0));
    check_read(&c, &h, &data, 100, 50, "first"); // read + read_view
    // read: miss; read_view: hit.
    assert_eq!(counts(&c), (1, 1, 1));
    let mut buf = [0u8; 10];
    assert_eq!(c.read(&h, 4000, &mut buf).unwrap(), 10);
    assert_eq!(
        counts(&c),
        (2, 1, 1),
        "same record again: a hit, no primary read"
    );
    assert_eq!(c.stats().arc.demand_data_hits, 2);
    // Across records 0 and 1: one hit, one miss.
    assert_eq!(c.read(&h, 4090, &mut buf).unwrap(), 10);
    assert_eq!(&buf, &data[4090..4100]);
    assert_eq!(counts(&c), (3, 2, 2));
    // The last, short record: a miss, then a hit.
    assert_eq!(c.read(&h, 4 * 4096, &mut buf).unwrap(), 10);
    assert_eq!(c.read(&h, 4 * 4096 + 5, &mut buf).unwrap(), 5);
    assert_eq!(&buf[..5], &data[4 * 4096 + 5..]);
    assert_eq!(counts(&c), (4, 3, 3));
    // A second handle of the same file shares the records.
    let h2 = c.open(ds, "f", false).unwrap();
    assert_eq!(h2.object_id(), h.object_id());
    assert_eq!(c.read(&h2, 0, &mut buf).unwrap(), 10);
    assert_eq!(
        counts(&c),
        (5, 3, 3),
        "another handle of the same file hits"
    );
    let s = c.stats();
    assert_eq!(s.arc.entries, 3);
    assert_eq!(s.arc.size, 3 * 4096);
    assert_eq!(s.arc.mfu_hits + s.arc.mru_hits, 5);
}

#[test]
fn recordsize_is_validated() {
    let tmp = tempfile::tempdir().unwrap();
    let c = cache(1 << 20, 1);
    for bad in [0u32, 512, 3000, 2 * MIB, 6 * KIB, 4095, MIB + 4096] {
        let config = DatasetConfig::default().recordsize_bytes(bad);
        let e = c
            .add_dataset(&format!("bad{bad}"), dir(tmp.path()), config)
            .expect_err(&format!("recordsize {bad} must be refused"));
        assert!(matches!(e, ConfigError::RecordSize(n) if n == u64::from(bad)));
        let msg = e.to_string();
        for needle in ["recordsize", &bad.to_string(), "power of two", "4K", "1M"] {
            assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}");
        }
        assert!(!msg.contains('\n'), "one-line message: {msg:?}");
        assert!(validate_recordsize(u64::from(bad)).is_err());
    }
    for shift in 12..=20 {
        let rs = 1u32 << shift;
        let config = DatasetConfig::default().recordsize_bytes(rs);
        c.add_dataset(&format!("ok{rs}"), dir(tmp.path()), config)
            .unwrap_or_else(|e| panic!("recordsize {rs} refused: {e}"));
        assert_eq!(validate_recordsize(u64::from(rs)).unwrap(), rs);
    }
    // Beyond u32, as from a command line.
    assert!(validate_recordsize(1 << 40).is_err());
    // Duplicate names and bad cache settings are refused too.
    let e = c
        .add_dataset("ok4096", dir(tmp.path()), DatasetConfig::default())
        .unwrap_err();
    assert!(e.to_string().contains("ok4096"), "{e}");
    assert!(matches!(
        Cache::new(CacheConfig::default().arc_max_bytes(1 << 20).arc_shards(0)),
        Err(ConfigError::Shards(0))
    ));
    assert!(matches!(
        Cache::new(CacheConfig::default().arc_max_bytes(4096 * 3).arc_shards(4)),
        Err(ConfigError::ArcMax(_))
    ));
}

/// Rewrites `path` in place (same inode): new content, mtime set explicitly.
fn rewrite_in_place(path: &Path, data: &[u8], mtime: SystemTime) {
    let ino = fs::metadata(path).unwrap().ino();
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(0).unwrap();
    f.write_all_at(data, 0).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    let meta = fs::metadata(path).unwrap();
    assert_eq!(meta.ino(), ino, "rewrite kept the inode");
    assert_eq!(meta.modified().unwrap(), mtime);
}

fn read_all(c: &Cache, h: &ObjectHandle, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len + 4096];
    let n = c.read(h, 0, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

#[test]
#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn rewritten_file_is_never_served_stale_after_revalidate() {
    let epoch = SystemTime::UNIX_EPOCH;
    for rs in [4 * KIB, 128 * KIB] {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        let old = pattern(40_000, 1);
        fs::write(&path, &old).unwrap();
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(epoch + Duration::from_secs(1_000_000))
            .unwrap();
        let c = cache(16 << 20, 4);
        let ds = dataset(&c, dir(tmp.path()), rs, CacheMode::All);
        let h = c.open(ds, "f", false).unwrap();
        assert_eq!(read_all(&c, &h, old.len()), old);
        assert_eq!(read_all(&c, &h, old.len()), old);
        assert!(c.stats().arc.hits > 0);

        // Same size, new bytes, new mtime: only the mtime gives it away.
        let new = pattern(40_000, 2);
        rewrite_in_place(&path, &new, epoch + Duration::from_secs(2_000_000));
        let info = c.revalidate(&h).unwrap();
        assert_eq!(info.size_bytes(), new.len() as u64);
        let misses = c.stats().arc.misses;
        assert_eq!(
            read_all(&c, &h, new.len()),
            new,
            "rs={rs}: stale bytes after revalidate"
        );
        assert!(
            c.stats().arc.misses > misses,
            "the old records must be misses"
        );
        assert!(c.stats().arc.stale_drops > 0);
        // And the new records are cached in turn.
        let hits = c.stats().arc.hits;
        assert_eq!(read_all(&c, &h, new.len()), new);
        assert!(c.stats().arc.hits > hits);

        // Only the nanoseconds of the mtime differ.
        let newer = pattern(40_000, 3);
        rewrite_in_place(
            &path,
            &newer,
            epoch + Duration::from_secs(2_000_000) + Duration::from_nanos(1),
        );
        c.revalidate(&h).unwrap();
        assert_eq!(
            read_all(&c, &h, newer.len()),
            newer,
            "rs={rs}: mtime nanoseconds"
        );

        // Shorter, with the same mtime as before it was shortened: the size
        // gives it away.
        let shorter = pattern(5000, 4);
        rewrite_in_place(
            &path,
            &shorter,
            epoch + Duration::from_secs(2_000_000) + Duration::from_nanos(1),
        );
        c.revalidate(&h).unwrap();
        assert_eq!(h.size_bytes(), 5000);
        assert_eq!(read_all(&c, &h, 40_000), shorter, "rs={rs}: shrunk file");
        let mut buf = [0u8; 16];
        assert_eq!(c.read(&h, 5000, &mut buf).unwrap(), 0);
        assert_eq!(c.read(&h, 30_000, &mut buf).unwrap(), 0);

        // Opening again (a new handle) revalidates too.
        let longer = pattern(70_000, 5);
        rewrite_in_place(&path, &longer, epoch + Duration::from_secs(3_000_000));
        let h2 = c.open(ds, "f", false).unwrap();
        assert_eq!(read_all(&c, &h2, 70_000), longer, "rs={rs}: reopen");
        // The old handle shares the object state, so it sees the new
        // generation as well.
        assert_eq!(
            read_all(&c, &h, 70_000),
            longer,
            "rs={rs}: old handle after reopen"
        );
        c.assert_consistent();
    }
}

#[test]
fn file_replaced_by_rename_reads_new_bytes_when_reopened() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("f");
    let old = pattern(20_000, 1);
    fs::write(&path, &old).unwrap();
    let c = cache(16 << 20, 4);
    let ds = dataset(&c, dir(tmp.path()), 4 * KIB, CacheMode::All);
    let h = c.open(ds, "f", false).unwrap();
    assert_eq!(read_all(&c, &h, old.len()), old);
    assert_eq!(read_all(&c, &h, old.len()), old);

    // Same size, and the same mtime on purpose: only the inode differs.
    let mtime = fs::metadata(&path).unwrap().modified().unwrap();
    let new = pattern(20_000, 2);
    let tmp_path = tmp.path().join("f.tmp");
    fs::write(&tmp_path, &new).unwrap();
    File::options()
        .write(true)
        .open(&tmp_path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    fs::rename(&tmp_path, &path).unwrap();

    let h2 = c.open(ds, "f", false).unwrap();
    assert_ne!(h2.object_id(), h.object_id(), "a new inode is a new object");
    assert_eq!(
        read_all(&c, &h2, new.len()),
        new,
        "reopened by name: new bytes"
    );
    // The old handle still reads its own (now unlinked) file, as an open fd does.
    assert_eq!(read_all(&c, &h, old.len()), old);
    assert_eq!(read_all(&c, &h2, new.len()), new);
}

#[test]
fn invalidate_object_turns_the_next_read_into_a_miss() {
    let tmp = tempfile::tempdir().unwrap();
    let data = pattern(3 * 8192, 1);
    fs::write(tmp.path().join("f"), &data).unwrap();
    let c = cache(1 << 20, 2);
    let ds = dataset(&c, dir(tmp.path()), 8 * KIB, CacheMode::All);
    let h = c.open(ds, "f", false).unwrap();
    let mut buf = [0u8; 100];
    c.read(&h, 8192, &mut buf).unwrap();
    c.read(&h, 8192, &mut buf).unwrap();
    let s = c.stats();
    assert_eq!((s.arc.hits, s.arc.misses, s.primary_reads), (1, 1, 1));

    c.invalidate_object(&h);
    assert_eq!(c.read(&h, 8192, &mut buf).unwrap(), 100);
    assert_eq!(&buf[..], &data[8192..8292]);
    let s = c.stats();
    assert_eq!(
        (s.arc.hits, s.arc.misses, s.primary_reads),
        (1, 2, 2),
        "a miss after invalidate"
    );
    c.read(&h, 8200, &mut buf).unwrap();
    assert_eq!(c.stats().arc.hits, 2, "and a hit again after that");
    // Through another handle of the same object as well.
    let h2 = c.open(ds, "f", false).unwrap();
    c.invalidate_object(&h2);
    c.read(&h, 8192, &mut buf).unwrap();
    let s = c.stats();
    assert_eq!((s.arc.hits, s.arc.misses), (2, 3));
}

#[test]
fn write_through_drops_only_the_records_it_touches() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("f");
    let mut file = pattern(4 * 4096, 1);
    fs::write(&path, &file).unwrap();
    let c = cache(1 << 20, 2);
    let ds = dataset(&c, dir(tmp.path()), 4 * KIB, CacheMode::All);
    let h = c.open(ds, "f", true).unwrap();
    assert_eq!(read_all(&c, &h, file.len()), file);
    assert_eq!(c.stats().arc.misses, 4);

    // Inside record 1.
    let data = pattern(100, 2);
    c.write(&h, 4096 + 50, &data).unwrap();
    file[4146..4246].copy_from_slice(&data);
    assert_eq!(
        fs::read(&path).unwrap(),
        file,
        "written through to the file"
    );
    let hits = c.stats().arc.hits;
    let mut buf = vec![0u8; 4096];
    for record in [0u64, 2, 3] {
        assert_eq!(c.read(&h, record * 4096, &mut buf).unwrap(), 4096);
        assert!(buf[..] == file[record as usize * 4096..][..4096]);
    }
    let s = c.stats();
    assert_eq!(s.arc.hits, hits + 3, "untouched records are still hits");
    assert_eq!(s.arc.misses, 4);
    assert_eq!(s.arc.invalidated, 1);
    assert_eq!(c.read(&h, 4096, &mut buf).unwrap(), 4096);
    assert!(
        buf[..] == file[4096..8192],
        "the written record reads back new bytes"
    );
    assert_eq!(c.stats().arc.misses, 5);
    assert_eq!((c.stats().writes, c.stats().write_bytes), (1, 100));

    // Across records 1 and 2; 0 and 3 stay.
    let data = pattern(3000, 3);
    c.write(&h, 2 * 4096 - 1000, &data).unwrap();
    file[7192..10192].copy_from_slice(&data);
    let hits = c.stats().arc.hits;
    assert_eq!(read_all(&c, &h, file.len()), file);
    let s = c.stats();
    assert_eq!((s.arc.hits, s.arc.misses), (hits + 2, 7));
    assert_eq!(h.size_bytes(), 4 * 4096, "an inner write keeps the size");

    // Extending from a full last record: the old records stay valid.
    let data = pattern(5000, 4);
    c.write(&h, 20_000, &data).unwrap();
    file.resize(20_000, 0);
    file.extend_from_slice(&data);
    assert_eq!(h.size_bytes(), 25_000);
    let hits = c.stats().arc.hits;
    assert_eq!(read_all(&c, &h, file.len()), file);
    assert_eq!(
        c.stats().arc.hits,
        hits + 4,
        "records 0-3 survive an append"
    );
    assert_eq!(fs::read(&path).unwrap(), file);
    c.assert_consistent();
}

/// A write past a short last record: the cached short record must go, and
/// the gap reads as zeros.
#[test]
fn write_that_extends_past_a_short_last_record() {
    for rs in [4 * KIB, 128 * KIB] {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        let mut file = pattern(1000, 1);
        fs::write(&path, &file).unwrap();
        let c = cache(4 << 20, 2);
        let ds = dataset(&c, dir(tmp.path()), rs, CacheMode::All);
        let h = c.open(ds, "f", true).unwrap();
        assert_eq!(read_all(&c, &h, 1000), file); // record 0 cached, 1000 bytes
        assert_eq!(read_all(&c, &h, 1000), file);

        let data = pattern(3000, 2);
        c.write(&h, 200_000, &data).unwrap();
        file.resize(200_000, 0);
        file.extend_from_slice(&data);
        assert_eq!(h.size_bytes(), 203_000, "rs={rs}: the size grows");

        let rsz = rs as usize;
        let mut buf = vec![0xEEu8; rsz];
        assert_eq!(
            c.read(&h, 0, &mut buf).unwrap(),
            rsz,
            "rs={rs}: record 0 is whole now"
        );
        assert!(buf[..1000] == file[..1000], "rs={rs}: old bytes kept");
        assert!(
            buf[1000..].iter().all(|&b| b == 0),
            "rs={rs}: zeros after the old end"
        );
        assert_eq!(read_all(&c, &h, file.len()), file, "rs={rs}: whole file");
        let mut tail = vec![0u8; 5000];
        assert_eq!(c.read(&h, 199_000, &mut tail).unwrap(), 4000);
        assert!(tail[..4000] == file[199_000..]);
        assert_eq!(fs::read(&path).unwrap(), file);

        // Growing within the last record.
        let more = pattern(500, 3);
        c.write(&h, 203_000, &more).unwrap();
        file.extend_from_slice(&more);
        assert_eq!(
            read_all(&c, &h, file.len()),
            file,
            "rs={rs}: append in place"
        );
        c.assert_consistent();
    }
}

/// Write-through to an O_DIRECT image: unaligned writes read back.
#[test]
fn write_through_an_image() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("disk.img");
    let mut file = pattern(50_000, 1);
    fs::write(&path, &file).unwrap();
    let img = ImagePrimary::open(&path, true).unwrap();
    assert!(img.is_direct(), "{} lacks O_DIRECT", tmp.path().display());
    let c = cache(4 << 20, 2);
    let ds = dataset(&c, Arc::new(img), 8 * KIB, CacheMode::All);
    let h = c.open(ds, "", true).unwrap();
    assert_eq!(read_all(&c, &h, file.len()), file);
    for (i, (offset, len)) in [(3usize, 10usize), (8190, 5), (20_000, 9000), (49_990, 100)]
        .into_iter()
        .enumerate()
    {
        let data = pattern(len, 10 + i as u64);
        c.write(&h, offset as u64, &data).unwrap();
        if file.len() < offset + len {
            file.resize(offset + len, 0);
        }
        file[offset..offset + len].copy_from_slice(&data);
        assert_eq!(h.size_bytes(), file.len() as u64);
        assert_eq!(
            read_all(&c, &h, file.len()),
            file,
            "after write {offset}+{len}"
        );
    }
    assert_eq!(fs::read(&path).unwrap(), file);
}

/// A primary that counts reads, sleeps in each, and can be made to fail or
/// held at a gate.
struct TestPrimary {
    inner: DirPrimary,
    state: Arc<TestState>,
}

#[derive(Default)]
struct TestState {
    reads: AtomicUsize,
    fail: AtomicBool,
    /// Writes land half their bytes, then fail (a disk filling up).
    fail_writes_halfway: AtomicBool,
    delay: Duration,
    /// Reads wait while a writer holds this.
    gate: RwLock<()>,
}

struct TestObject {
    inner: Arc<dyn PrimaryObject>,
    state: Arc<TestState>,
}

impl Primary for TestPrimary {
    fn open(&self, name: &str, writable: bool) -> io::Result<Arc<dyn PrimaryObject>> {
        Ok(Arc::new(TestObject {
            inner: self.inner.open(name, writable)?,
            state: Arc::clone(&self.state),
        }))
    }

    fn describe(&self) -> String {
        format!("test {}", self.inner.describe())
    }
}

impl PrimaryObject for TestObject {
    fn info(&self) -> io::Result<ObjectInfo> {
        self.inner.info()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.state.reads.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.state.delay);
        drop(self.state.gate.read().unwrap());
        if self.state.fail.load(Ordering::SeqCst) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("injected failure at {offset}"),
            ));
        }
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        if self.state.fail_writes_halfway.load(Ordering::SeqCst) {
            self.inner.write_at(offset, &data[..data.len() / 2])?;
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!("injected ENOSPC after {} bytes", data.len() / 2),
            ));
        }
        self.inner.write_at(offset, data)
    }

    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
}

fn test_primary(root: &Path, delay: Duration) -> (Arc<TestPrimary>, Arc<TestState>) {
    let state = Arc::new(TestState {
        delay,
        ..TestState::default()
    });
    let primary = Arc::new(TestPrimary {
        inner: DirPrimary::new(root).unwrap(),
        state: Arc::clone(&state),
    });
    (primary, state)
}

#[test]
fn concurrent_readers_of_one_record_share_one_primary_read() {
    const THREADS: usize = 8;
    let tmp = tempfile::tempdir().unwrap();
    let data = pattern(3 * 16384, 1);
    fs::write(tmp.path().join("f"), &data).unwrap();
    let (primary, state) = test_primary(tmp.path(), Duration::from_millis(50));
    let c = cache(1 << 20, 4);
    let ds = dataset(&c, primary, 16 * KIB, CacheMode::All);
    let h = c.open(ds, "f", false).unwrap();

    // Hold the gate until every other reader is waiting on the fill, so the
    // count does not depend on how fast threads start.
    let gate = state.gate.write().unwrap();
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..THREADS)
            .map(|i| {
                let (c, h, barrier, data) = (&c, &h, &barrier, &data);
                s.spawn(move || {
                    barrier.wait();
                    let offset = 16384 + 100 * i as u64;
                    let mut buf = vec![0u8; 1000];
                    assert_eq!(c.read(h, offset, &mut buf).unwrap(), 1000);
                    assert!(buf[..] == data[offset as usize..][..1000], "reader {i}");
                })
            })
            .collect();
        let start = Instant::now();
        while c.stats().arc.iohits < (THREADS - 1) as u64 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "readers never queued on the fill: {:?}",
                c.stats().arc
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(gate);
        for r in readers {
            r.join().unwrap();
        }
    });
    let s = c.stats();
    assert_eq!(
        state.reads.load(Ordering::SeqCst),
        1,
        "one primary read for {THREADS} readers"
    );
    assert_eq!(s.primary_reads, 1);
    assert_eq!(s.arc.misses, 1);
    assert_eq!(
        s.arc.iohits,
        (THREADS - 1) as u64,
        "every other reader waited on the fill"
    );
    assert_eq!(s.arc.hits, 0);
    assert_eq!(s.reads, THREADS as u64);

    // Without the gate, with only the 50 ms sleep: still one read per record.
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for i in 0..THREADS {
            let (c, h, barrier, data) = (&c, &h, &barrier, &data);
            s.spawn(move || {
                barrier.wait();
                let mut buf = vec![0u8; 16384];
                assert_eq!(c.read(h, 2 * 16384, &mut buf).unwrap(), 16384);
                assert!(buf[..] == data[2 * 16384..], "reader {i}");
            });
        }
    });
    assert_eq!(state.reads.load(Ordering::SeqCst), 2);
    let s = c.stats();
    assert_eq!(s.arc.misses, 2);
    assert_eq!(s.arc.iohits + s.arc.hits, 2 * (THREADS - 1) as u64);
}

#[test]
fn failed_primary_reads_are_reported_and_not_cached() {
    let tmp = tempfile::tempdir().unwrap();
    let data = pattern(3 * 4096, 1);
    fs::write(tmp.path().join("f"), &data).unwrap();
    let (primary, state) = test_primary(tmp.path(), Duration::ZERO);
    let c = cache(1 << 20, 2);
    let ds = dataset(&c, primary, 4 * KIB, CacheMode::All);
    let h = c.open(ds, "f", false).unwrap();

    state.fail.store(true, Ordering::SeqCst);
    let mut buf = vec![0u8; 5000];
    for _ in 0..2 {
        let e = c.read(&h, 100, &mut buf).expect_err("the primary fails");
        assert!(e.to_string().contains("injected failure"), "{e}");
        let e = c.read_view(&h, 0, 9000).err().expect("read_view fails too");
        assert!(e.to_string().contains("injected failure"), "{e}");
        assert!(c.prefetch(&h, 0, 4096).is_err());
    }
    let s = c.stats();
    assert_eq!(s.arc.size, 0, "nothing cached after failures");
    assert_eq!(s.arc.entries, 0);
    assert_eq!(s.arc.hits, 0);
    assert_eq!(s.primary_reads, 0);
    assert_eq!(s.primary_errors, 6);

    // The primary recovers: the next read goes to it and gets the right bytes.
    state.fail.store(false, Ordering::SeqCst);
    let reads = state.reads.load(Ordering::SeqCst);
    assert_eq!(c.read(&h, 100, &mut buf).unwrap(), 5000);
    assert!(buf[..] == data[100..5100]);
    assert_eq!(state.reads.load(Ordering::SeqCst), reads + 2);
    assert_eq!(c.read(&h, 100, &mut buf).unwrap(), 5000);
    assert_eq!(
        state.reads.load(Ordering::SeqCst),
        reads + 2,
        "cached after recovery"
    );
    assert!(c.stats().arc.hits >= 2);
    c.assert_consistent();
}

/// Waiters on a fill that fails get the error too, and the next reader retries.
#[test]
fn waiters_on_a_failed_fill_see_the_error_and_its_kind() {
    let tmp = tempfile::tempdir().unwrap();
    let data = pattern(4096, 1);
    fs::write(tmp.path().join("f"), &data).unwrap();
    let (primary, state) = test_primary(tmp.path(), Duration::ZERO);
    let c = cache(1 << 20, 1);
    let ds = dataset(&c, primary, 4 * KIB, CacheMode::All);
    let h = c.open(ds, "f", false).unwrap();
    state.fail.store(true, Ordering::SeqCst);
    let gate = state.gate.write().unwrap();
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut buf = [0u8; 10];
                    c.read(&h, 0, &mut buf)
                })
            })
            .collect();
        let start = Instant::now();
        while c.stats().arc.iohits < 3 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "readers never queued"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(gate);
        for r in readers {
            let e = r
                .join()
                .unwrap()
                .expect_err("every reader sees the failure");
            assert!(e.to_string().contains("injected failure"), "{e}");
            // The claimant and every waiter keep the error's kind, which
            // front ends turn into errno (NBD error, FUSE reply).
            assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        }
    });
    assert_eq!(state.reads.load(Ordering::SeqCst), 1);
    state.fail.store(false, Ordering::SeqCst);
    let mut buf = [0u8; 10];
    assert_eq!(c.read(&h, 0, &mut buf).unwrap(), 10);
    assert_eq!(&buf[..], &data[..10]);
}

fn uncached_cases(c: &Cache, h: &ObjectHandle, file: &[u8], what: &str) {
    let size = file.len() as u64;
    for (offset, len) in [
        (0u64, file.len()),
        (1, 100),
        (4095, 2),
        (4096, 4096),
        (5000, 10_000),
        (size - 3, 100),
        (size - 4096, 4096),
        (size, 10),
        (size + 5000, 10),
        (7, 0),
        (size / 2 + 1, file.len()),
    ] {
        let want = expected(file, offset, len);
        // Unaligned destination too: one byte into the vector.
        let mut v = vec![0x5Au8; len + 2];
        let n = c
            .read(h, offset, &mut v[1..len + 1])
            .unwrap_or_else(|e| panic!("{what}: read {offset}+{len}: {e}"));
        assert_eq!(n, want.len(), "{what}: read {offset}+{len}");
        assert!(
            v[1..1 + n] == *want,
            "{what}: read {offset}+{len}: wrong bytes"
        );
        assert_eq!(
            (v[0], v[len + 1]),
            (0x5A, 0x5A),
            "{what}: wrote outside the buffer"
        );
    }
}

#[test]
fn primarycache_none_bypasses_the_arc() {
    let tmp = tempfile::tempdir().unwrap();
    let file = pattern(3 * 131072 + 777, 1);
    fs::write(tmp.path().join("f"), &file).unwrap();
    let path = tmp.path().join("disk.img");
    fs::write(&path, &file).unwrap();
    let img = ImagePrimary::open(&path, false).unwrap();
    assert!(img.is_direct(), "{} lacks O_DIRECT", tmp.path().display());

    for (name, primary, object) in [
        ("dir", dir(tmp.path()), "f"),
        ("O_DIRECT image", Arc::new(img) as Arc<dyn Primary>, ""),
    ] {
        let c = cache(1 << 20, 2);
        let ds = dataset(&c, primary, 128 * KIB, CacheMode::None);
        let h = c.open(ds, object, false).unwrap();
        for _ in 0..2 {
            uncached_cases(&c, &h, &file, name);
        }
        c.prefetch(&h, 0, 1 << 20).unwrap();
        let s = c.stats();
        assert_eq!(
            (s.arc.hits, s.arc.misses, s.arc.size, s.arc.entries),
            (0, 0, 0, 0),
            "{name}: the ARC was used: {:?}",
            s.arc
        );
        assert_eq!(s.primary_reads, 22, "{name}: every read goes to primary");
        assert_eq!(s.reads, 22);
        // Far past the end of everything: no panic, no bytes.
        let mut buf = [0u8; 100];
        let r = c.read(&h, u64::MAX - 10, &mut buf);
        assert!(
            matches!(&r, Err(e) if e.kind() == io::ErrorKind::InvalidInput),
            "{name}: read at the end of the address space: {r:?}"
        );
    }
}

#[test]
fn memory_stays_within_arc_max() {
    const ARC_MAX: u64 = 1 << 20;
    let tmp = tempfile::tempdir().unwrap();
    let file = pattern(16 << 20, 1);
    fs::write(tmp.path().join("f"), &file).unwrap();
    let c = cache(ARC_MAX, 4);
    let ds = dataset(&c, dir(tmp.path()), 128 * KIB, CacheMode::All);
    let h = c.open(ds, "f", false).unwrap();
    let mut max_seen = 0;
    let mut buf = vec![0u8; 300_000];
    for pass in 0..2 {
        // Mixed read sizes, some spanning records.
        let mut offset = 0usize;
        let mut step = 0;
        while offset < file.len() {
            let len = [4096, 131072, 300_000, 77][step % 4];
            step += 1;
            let n = c.read(&h, offset as u64, &mut buf[..len]).unwrap();
            let want = expected(&file, offset as u64, len);
            assert_eq!(n, want.len());
            assert!(buf[..n] == *want, "pass {pass} at {offset}");
            let size = c.stats().arc.size;
            assert!(
                size <= ARC_MAX,
                "pass {pass} at {offset}: size {size} > arc_max {ARC_MAX}"
            );
            max_seen = max_seen.max(size);
            offset += n;
        }
        c.assert_consistent();
    }
    let s = c.stats();
    println!("arc size peaked at {max_seen} of {ARC_MAX}: {:?}", s.arc);
    assert!(
        max_seen >= ARC_MAX / 2,
        "the cache was barely used: {max_seen}"
    );
    assert!(
        s.arc.evicted_mru + s.arc.evicted_mfu > 100,
        "eviction happened"
    );
    assert!(s.arc.entries <= ARC_MAX / 131072);
    assert!(
        s.primary_reads >= 2 * 128,
        "16 MiB twice through 1 MiB: mostly misses"
    );
}

/// A record larger than a shard's share of arc_max is read but never kept.
#[test]
fn records_larger_than_a_shard_are_read_but_not_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let file = pattern(3 * MIB as usize, 1);
    fs::write(tmp.path().join("f"), &file).unwrap();
    // 8 shards of 128 KiB each, records of 1 MiB.
    let c = cache(1 << 20, 8);
    let ds = dataset(&c, dir(tmp.path()), MIB, CacheMode::All);
    let h = c.open(ds, "f", false).unwrap();
    for _ in 0..2 {
        assert_eq!(read_all(&c, &h, file.len()), file);
    }
    let s = c.stats();
    assert_eq!((s.arc.size, s.arc.entries, s.arc.hits), (0, 0, 0));
    assert_eq!(s.arc.insert_no_room, 6);
    assert_eq!(s.primary_reads, 6);
}

/// A write that fails after part of it reached primary storage (ENOSPC,
/// EIO, the end of a block device) must still drop the records it touched:
/// the cache may not go on serving the bytes that were overwritten.
#[test]
fn a_write_that_fails_halfway_leaves_no_stale_records() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("f");
    let old = pattern(4 * 4096, 1);
    fs::write(&path, &old).unwrap();
    let (primary, state) = test_primary(tmp.path(), Duration::ZERO);
    let c = cache(1 << 20, 2);
    let ds = dataset(&c, primary, 4 * KIB, CacheMode::All);
    let h = c.open(ds, "f", true).unwrap();
    assert_eq!(read_all(&c, &h, old.len()), old);

    state.fail_writes_halfway.store(true, Ordering::SeqCst);
    // Records 1 and 2 change on disk; then the write fails.
    let e = c
        .write(&h, 4096, &pattern(4 * 4096, 2)[..2 * 4096 + 4096])
        .expect_err("the write fails");
    assert!(e.to_string().contains("injected ENOSPC"), "{e}");
    // A write that extends the file and then fails.
    let e = c
        .write(&h, 3 * 4096 + 100, &pattern(8192, 3))
        .expect_err("the write fails");
    assert!(e.to_string().contains("injected ENOSPC"), "{e}");
    state.fail_writes_halfway.store(false, Ordering::SeqCst);

    let disk = fs::read(&path).unwrap();
    assert_ne!(disk, old, "the failed writes changed the file");
    assert_eq!(disk.len(), 3 * 4096 + 100 + 4096);
    let got = read_all(&c, &h, disk.len());
    assert!(
        got[..] == disk[..old.len()],
        "stale records served after a failed write"
    );
    // The size the cache knows may lag (the write failed), but what it does
    // read must be the file's bytes; revalidating catches up with the rest.
    c.revalidate(&h).unwrap();
    assert_eq!(read_all(&c, &h, disk.len()), disk);
}

/// Writes the primary refuses (beyond the largest offset) fail cleanly: no
/// panic on the record arithmetic, nothing cached goes stale.
#[test]
fn writes_at_impossible_offsets_fail_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let data = pattern(10_000, 1);
    fs::write(tmp.path().join("f"), &data).unwrap();
    let path = tmp.path().join("disk.img");
    fs::write(&path, &data).unwrap();
    let img = ImagePrimary::open(&path, true).unwrap();
    for (name, primary, object) in [
        ("dir", dir(tmp.path()), "f"),
        ("image", Arc::new(img) as Arc<dyn Primary>, ""),
    ] {
        let c = cache(1 << 20, 2);
        let ds = dataset(&c, primary, 4 * KIB, CacheMode::All);
        let h = c.open(ds, object, true).unwrap();
        assert_eq!(read_all(&c, &h, data.len()), data);
        for offset in [u64::MAX - 1, u64::MAX / 2, i64::MAX as u64] {
            let started = Instant::now();
            assert!(
                c.write(&h, offset, b"abc").is_err(),
                "{name}: write at {offset}"
            );
            assert!(
                started.elapsed() < Duration::from_secs(1),
                "{name}: slow failure"
            );
        }
        assert_eq!(h.size_bytes(), 10_000);
        assert_eq!(read_all(&c, &h, data.len()), data, "{name}");
    }
}

#[test]
fn object_states_are_bounded_and_a_dropped_state_never_revives_stale_records() {
    use l2arc::internals::OBJECT_STATES_MAX;
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::new(CacheConfig::default().arc_max_bytes(64 << 20)).unwrap();
    std::fs::write(dir.path().join("victim"), vec![1u8; 8192]).unwrap();
    let ds = cache
        .add_dataset(
            "t",
            Arc::new(DirPrimary::new(dir.path()).unwrap()),
            DatasetConfig::default().recordsize_bytes(4096),
        )
        .unwrap();
    // Cache the victim's records, then invalidate them without changing the
    // file (as a discard does): its token moves to a new epoch.
    let victim = cache.open(ds, "victim", false).unwrap();
    let mut buf = vec![0u8; 8192];
    cache.read(&victim, 0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 1));
    cache.invalidate_object(&victim);
    drop(victim);
    // Fill the table past its bound with other objects: the victim's state,
    // held by nothing, is dropped.
    let many = OBJECT_STATES_MAX + 10;
    for i in 0..many {
        let name = format!("o{i}");
        std::fs::write(dir.path().join(&name), b"x").unwrap();
        drop(cache.open(ds, &name, false).unwrap());
    }
    assert!(
        cache.object_states() <= OBJECT_STATES_MAX + 1,
        "{} object states",
        cache.object_states()
    );
    // Reopened, the victim gets a fresh epoch: its records from before the
    // invalidation are misses, never hits.
    let before = cache.stats().arc.hits;
    let victim = cache.open(ds, "victim", false).unwrap();
    cache.read(&victim, 0, &mut buf).unwrap();
    assert_eq!(cache.stats().arc.hits, before, "a retired record was hit");
}

#[test]
fn a_prefetch_span_reads_each_run_of_uncached_records_in_one_read() {
    let tmp = tempfile::tempdir().unwrap();
    let rs = 16 * u64::from(KIB);
    let data = pattern(20 * rs as usize + 777, 3); // 21 records, the last short
    fs::write(tmp.path().join("f"), &data).unwrap();
    let (primary, state) = test_primary(tmp.path(), Duration::ZERO);
    let c = cache(8 << 20, 2);
    let ds = dataset(&c, primary, rs as u32, CacheMode::All);
    let h = c.open(ds, "f", false).unwrap();
    let reads = || state.reads.load(Ordering::SeqCst);

    // Record 5 is cached: the span reads 0-4 and 6-20, once each.
    let mut buf = vec![0u8; rs as usize];
    c.read(&h, 5 * rs, &mut buf).unwrap();
    let before = reads();
    c.prefetch_span(&h, 0, 21 * rs).unwrap();
    assert_eq!(reads() - before, 2, "one read per run of uncached records");
    let s = c.stats();
    assert_eq!(s.primary_reads, 3);
    assert_eq!(s.arc.prefetch_data_misses, 20);
    // Every record is right, the short last one too, and all are hits.
    let before = reads();
    assert!(read_all(&c, &h, data.len()) == data);
    assert_eq!(reads(), before, "the span cached every record");

    // A failed span read is returned, caches nothing, and the records are
    // read again (and right) once the primary is back.
    c.invalidate_object(&h);
    state.fail.store(true, Ordering::SeqCst);
    let e = c.prefetch_span(&h, 0, 4 * rs).unwrap_err();
    assert!(e.to_string().contains("injected failure"), "{e}");
    state.fail.store(false, Ordering::SeqCst);
    let before = reads();
    assert!(read_all(&c, &h, data.len()) == data);
    assert!(reads() > before, "nothing of the failed span was cached");

    // A run longer than one read may be is read in pieces of that size:
    // 65 records of 1 MiB, two reads.
    let mib = 1u64 << 20;
    let pieces = l2arc::PREFETCH_SPAN_BYTES_MAX / mib + 1;
    fs::write(tmp.path().join("big"), pattern((pieces * mib) as usize, 4)).unwrap();
    let (primary, state) = test_primary(tmp.path(), Duration::ZERO);
    let c = cache(8 << 20, 2);
    let ds = dataset(&c, primary, mib as u32, CacheMode::All);
    let h = c.open(ds, "big", false).unwrap();
    c.prefetch_span(&h, 0, pieces * mib).unwrap();
    assert_eq!(
        state.reads.load(Ordering::SeqCst),
        2,
        "one read per PREFETCH_SPAN_BYTES_MAX"
    );

    // primarycache=none: read-ahead reads nothing.
    let (primary, state) = test_primary(tmp.path(), Duration::ZERO);
    let c = cache(8 << 20, 2);
    let ds = dataset(&c, primary, rs as u32, CacheMode::None);
    let h = c.open(ds, "f", false).unwrap();
    c.prefetch_span(&h, 0, 21 * rs).unwrap();
    assert_eq!(state.reads.load(Ordering::SeqCst), 0);
}

/// Bytes after which a span tells the test (first) and waits for it.
type Hold = (usize, mpsc::Sender<()>, mpsc::Receiver<()>);

/// An object store in miniature: versions (a hash and bytes), conditional
/// reads, and spans streamed in pieces that do not line up with records. A
/// span can be held after some bytes (until the test lets it go), or the
/// object can change after some bytes (the span then fails as a 412 would).
struct VersionedObject {
    /// (version hash, bytes) of the current version.
    current: Mutex<(u64, Vec<u8>)>,
    hold: Mutex<Option<Hold>>,
    /// Bytes after which the object becomes this version mid-span.
    change: Mutex<Option<(usize, Vec<u8>)>>,
    span_reads: AtomicUsize,
    record_reads: AtomicUsize,
}

const PIECE_BYTES: usize = 100_000;

impl VersionedObject {
    fn new(data: Vec<u8>) -> Arc<Self> {
        Arc::new(Self {
            current: Mutex::new((1, data)),
            hold: Mutex::new(None),
            change: Mutex::new(None),
            span_reads: AtomicUsize::new(0),
            record_reads: AtomicUsize::new(0),
        })
    }

    /// The bytes of the version `expected` names, or a 412.
    fn bytes_of(&self, expected: Option<&l2arc::primary::Generation>) -> io::Result<Vec<u8>> {
        let current = self.current.lock().unwrap();
        if expected.map(|g| g.version_hash) != Some(current.0) {
            return Err(io::Error::new(
                io::ErrorKind::StaleNetworkFileHandle,
                "precondition failed",
            ));
        }
        Ok(current.1.clone())
    }
}

struct VersionedPrimary(Arc<VersionedObject>);

impl Primary for VersionedPrimary {
    fn open(&self, _name: &str, _writable: bool) -> io::Result<Arc<dyn PrimaryObject>> {
        Ok(Arc::clone(&self.0) as Arc<dyn PrimaryObject>)
    }

    fn describe(&self) -> String {
        "versioned".into()
    }
}

impl PrimaryObject for VersionedObject {
    fn info(&self) -> io::Result<ObjectInfo> {
        let current = self.current.lock().unwrap();
        Ok(ObjectInfo {
            id: 1,
            generation: l2arc::primary::Generation {
                ino: 1,
                size_bytes: current.1.len() as u64,
                version_hash: current.0,
                ..Default::default()
            },
        })
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let generation = self.info()?.generation;
        self.read_at_generation(offset, buf, Some(&generation))
    }

    fn read_at_generation(
        &self,
        offset: u64,
        buf: &mut [u8],
        expected: Option<&l2arc::primary::Generation>,
    ) -> io::Result<usize> {
        self.record_reads.fetch_add(1, Ordering::SeqCst);
        let bytes = self.bytes_of(expected)?;
        let from = (offset as usize).min(bytes.len());
        let n = buf.len().min(bytes.len() - from);
        buf[..n].copy_from_slice(&bytes[from..from + n]);
        Ok(n)
    }

    fn read_span_at_generation(
        &self,
        offset: u64,
        len: usize,
        expected: Option<&l2arc::primary::Generation>,
        sink: &mut dyn FnMut(&[u8]) -> bool,
    ) -> io::Result<usize> {
        self.span_reads.fetch_add(1, Ordering::SeqCst);
        let bytes = self.bytes_of(expected)?;
        let from = (offset as usize).min(bytes.len());
        let end = (from + len).min(bytes.len());
        let mut at = from;
        while at < end {
            let handed = at - from;
            let hold = self
                .hold
                .lock()
                .unwrap()
                .take_if(|(after, ..)| handed >= *after);
            if let Some((_, tell, wait)) = hold {
                tell.send(()).unwrap();
                wait.recv().unwrap();
            }
            let change = self
                .change
                .lock()
                .unwrap()
                .take_if(|(after, _)| handed >= *after);
            if let Some((_, new)) = change {
                *self.current.lock().unwrap() = (2, new);
                return Err(io::Error::new(
                    io::ErrorKind::StaleNetworkFileHandle,
                    "precondition failed midway",
                ));
            }
            let n = PIECE_BYTES.min(end - at);
            let more = sink(&bytes[at..at + n]);
            at += n;
            if !more {
                break;
            }
        }
        Ok(at - from)
    }

    fn write_at(&self, _offset: u64, _data: &[u8]) -> io::Result<()> {
        Err(io::ErrorKind::ReadOnlyFilesystem.into())
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
}

fn versioned_cache(object: &Arc<VersionedObject>, rs: u32) -> (Arc<Cache>, ObjectHandle) {
    let c = cache(8 << 20, 2);
    let primary = Arc::new(VersionedPrimary(Arc::clone(object)));
    let ds = dataset(&c, primary, rs, CacheMode::All);
    let h = c.open(ds, "o", false).unwrap();
    (c, h)
}

/// Reads `len` bytes at `offset` on another thread; None if it does not
/// finish within a generous bound (it would wait for the span's end).
fn read_within(c: &Arc<Cache>, h: &ObjectHandle, offset: u64, len: usize) -> Option<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    let (c, h) = (Arc::clone(c), h.clone());
    std::thread::spawn(move || {
        let mut buf = vec![0u8; len];
        let n = c.read(&h, offset, &mut buf).unwrap();
        buf.truncate(n);
        let _ = tx.send(buf);
    });
    rx.recv_timeout(Duration::from_secs(30)).ok()
}

#[test]
fn a_streamed_span_serves_each_record_as_soon_as_its_bytes_are_in() {
    let rs = 64 * KIB as usize;
    let data = pattern(8 * rs + 999, 5); // 9 records, the last short
    let object = VersionedObject::new(data.clone());
    let (c, h) = versioned_cache(&object, rs as u32);
    // The span stops after two and a half records until told to go on.
    let (tell, told) = mpsc::channel();
    let (go, wait) = mpsc::channel();
    *object.hold.lock().unwrap() = Some((2 * rs + rs / 2, tell, wait));
    let span = c.claim_span(&h, 0, data.len() as u64).unwrap();
    assert_eq!(span.records(), 9);
    let filler = std::thread::spawn(move || span.fill());
    told.recv().unwrap();
    // Mid-span: the first two records are served, from the cache.
    let got = read_within(&c, &h, 0, 2 * rs).expect("records 0-1 served mid-span");
    assert!(got == data[..2 * rs]);
    assert_eq!(object.record_reads.load(Ordering::SeqCst), 0);
    go.send(()).unwrap();
    filler.join().unwrap().unwrap();
    // One read below for the whole span; every record right, all hits.
    assert!(read_all(&c, &h, data.len()) == data);
    assert_eq!(object.span_reads.load(Ordering::SeqCst), 1);
    assert_eq!(object.record_reads.load(Ordering::SeqCst), 0);
    assert_eq!(c.stats().primary_reads, 1);
}

#[test]
fn an_object_changed_mid_span_caches_nothing_of_its_new_version_under_the_old_token() {
    let rs = 64 * KIB as usize;
    let old = pattern(8 * rs, 6);
    let new = pattern(8 * rs, 7);
    let object = VersionedObject::new(old.clone());
    let (c, h) = versioned_cache(&object, rs as u32);
    // After two pieces (three records and a bit) the object changes: the
    // span's read fails as a conditional GET would (412).
    let cut = 2 * PIECE_BYTES;
    let (whole, partial) = (cut / rs, cut / rs); // records 0..3 whole, 3 cut
    assert!(!cut.is_multiple_of(rs), "a record is cut midway");
    *object.change.lock().unwrap() = Some((cut, new.clone()));
    let span = c.claim_span(&h, 0, old.len() as u64).unwrap();
    let e = span.fill().unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::StaleNetworkFileHandle);
    // The whole records are of the old version, under its token, and
    // served as such until the change is seen.
    let mut buf = vec![0u8; whole * rs];
    c.read(&h, 0, &mut buf).unwrap();
    assert!(buf == old[..whole * rs]);
    assert_eq!(object.record_reads.load(Ordering::SeqCst), 0, "hits");
    // The record cut midway was not published: read below, it is found
    // stale, the object is re-stated, and it reads as the new version,
    // as does every record after that.
    let mut buf = vec![0u8; rs];
    c.read(&h, (partial * rs) as u64, &mut buf).unwrap();
    assert!(
        buf == new[partial * rs..][..rs],
        "the cut record is all new"
    );
    assert!(object.record_reads.load(Ordering::SeqCst) >= 1);
    assert!(read_all(&c, &h, new.len()) == new, "all of the new version");
}

#[test]
fn a_paced_span_given_up_midway_lets_its_waiters_read_for_themselves() {
    let rs = 64 * KIB as usize;
    let data = pattern(8 * rs, 8);
    let object = VersionedObject::new(data.clone());
    let (c, h) = versioned_cache(&object, rs as u32);
    let span = c.claim_span(&h, 0, data.len() as u64).unwrap();
    // A demand reader of record 5 waits on the span's claim...
    let iohits = c.stats().arc.iohits;
    let reader = {
        let (c, h) = (Arc::clone(&c), h.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; rs];
            c.read(&h, 5 * rs as u64, &mut buf).map(|_| buf)
        })
    };
    while c.stats().arc.iohits == iohits {
        std::thread::yield_now();
    }
    // ...and the span gives up after three records (its reader went away).
    span.fill_paced(&|offset| offset < 3 * rs as u64).unwrap();
    let got = reader.join().unwrap().expect("the waiter reads for itself");
    assert!(got == data[5 * rs..6 * rs]);
    assert_eq!(
        object.record_reads.load(Ordering::SeqCst),
        1,
        "record 5 alone"
    );
    // Records 0-2 came from the span; 3-4 and 6-7 were never read.
    let before = object.record_reads.load(Ordering::SeqCst);
    let mut buf = vec![0u8; 3 * rs];
    c.read(&h, 0, &mut buf).unwrap();
    assert!(buf == data[..3 * rs]);
    assert_eq!(object.record_reads.load(Ordering::SeqCst), before);
}
