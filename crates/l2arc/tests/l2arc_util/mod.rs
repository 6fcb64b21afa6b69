//! Helpers shared by the L2ARC integrity tests (`l2arc_integrity.rs`,
//! `l2arc_headers.rs`, `l2arc_online.rs`): real files in a tempdir, a small
//! ARC so that reads go to the L2ARC, deterministic feeding, byte checks
//! against primary, and decoding of the on-device format.

#![allow(dead_code)]

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use l2arc::DeviceIo;
use l2arc::internals::format::{
    self, BLOCK_BYTES, Compression, DeviceHeader, HEADER_COPY_OFFSETS, LogBlockHeader, LogEntry,
    LogPointer,
};
use l2arc::primary::dir::DirPrimary;
use l2arc::{Cache, CacheConfig, DatasetConfig, DatasetId, ObjectHandle};
use l2arc::{DeviceOpen, L2ArcConfig, L2Stats};

/// Record size of every test dataset.
pub(crate) const RS: usize = 64 << 10;
/// Size of the cache device files (sparse).
pub(crate) const DEVICE_BYTES: u64 = 32 << 20;

/// Object contents: per 4 KiB block alternately text (compressible) and
/// pseudo-random bytes, both depending on `seed`, so two seeds differ in
/// every block.
pub(crate) fn content(len: usize, seed: u64) -> Vec<u8> {
    let text = format!("{seed:016x} the quick brown fox jumps over the lazy dog. ");
    let text = text.as_bytes();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|i| {
            if (i / 4096) % 2 == 0 {
                text[i % text.len()]
            } else {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            }
        })
        .collect()
}

/// A small xorshift generator: deterministic, no dependency.
pub(crate) struct Rng(pub u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// L2ARC settings that keep the background feeder out of the way: it feeds
/// once shortly after each device is added, then sleeps for an hour.
/// The tests feed explicitly with `Cache::feed_l2arc`.
pub(crate) fn quiet_l2() -> L2ArcConfig {
    L2ArcConfig::default()
        .l2arc_feed_secs(3600.0)
        .l2arc_feed_min_ms(3_600_000)
        .l2arc_feed_again(false)
        // Evictions would wake the feeder too: the tests feed themselves.
        .l2arc_writeback_max_bytes(0)
        .l2arc_ioengine(test_ioengine())
}

/// The suite runs once per read path (`scripts/test.sh`): the blocking
/// `Cache::read` (default) or read queues (`L2ARC_TEST_READ_PATH=queue`),
/// reading flash through io_uring or psync (`L2ARC_TEST_IOENGINE`).
fn reads_through_queue() -> bool {
    match std::env::var("L2ARC_TEST_READ_PATH").as_deref() {
        Err(_) | Ok("blocking") => false,
        Ok("queue") => true,
        Ok(other) => panic!("L2ARC_TEST_READ_PATH must be blocking or queue, not {other:?}"),
    }
}

pub(crate) fn test_ioengine() -> l2arc::IoEngine {
    match std::env::var("L2ARC_TEST_IOENGINE") {
        Err(_) => l2arc::IoEngine::Auto,
        Ok(name) => name.parse().unwrap(),
    }
}

/// Raises every flag when dropped: created first thing in a
/// `thread::scope` body, it stops the scope's looping threads even when
/// the body panics, so that a failed assertion fails the test instead of
/// hanging it.
pub(crate) struct StopOnDrop<'a>(pub Vec<&'a std::sync::atomic::AtomicBool>);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        for flag in &self.0 {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// A tempdir with a primary directory `src` and some files in it.
pub(crate) struct World {
    pub tmp: tempfile::TempDir,
    pub src: PathBuf,
    /// (name, content) of every file written by `add_file`.
    pub files: Vec<(String, Vec<u8>)>,
}

impl World {
    pub(crate) fn new() -> World {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        std::fs::create_dir(&src).unwrap();
        World {
            tmp,
            src,
            files: Vec::new(),
        }
    }

    pub(crate) fn add_file(&mut self, name: &str, len: usize, seed: u64) -> Vec<u8> {
        let data = content(len, seed);
        std::fs::write(self.src.join(name), &data).unwrap();
        self.files.push((name.to_string(), data.clone()));
        data
    }

    pub(crate) fn device_path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// Every file in `src` still holds what the test wrote (primary is
    /// never harmed by anything the cache does).
    pub(crate) fn assert_primary_intact(&self) {
        for (name, data) in &self.files {
            let on_disk = std::fs::read(self.src.join(name)).unwrap();
            assert!(on_disk == *data, "primary file {name} changed");
        }
    }
}

/// A cache with a 1 MiB ARC (16 records of 64 KiB) over `src`.
pub(crate) fn new_cache(
    src: &Path,
    compression: Compression,
    l2: L2ArcConfig,
) -> (Arc<Cache>, DatasetId) {
    let cache = Cache::new(
        CacheConfig::default()
            .arc_max_bytes(1 << 20)
            .arc_shards(2)
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

/// A device's background feeder feeds it once 10 ms after it is added
/// (and with `quiet_l2` then sleeps for an hour). Give it that feed before
/// the test goes on, so that it never races with the test's feeds.
fn settle_feeder(added: bool) {
    if added {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `Cache::add_cache_path`, then lets the background feeder settle.
pub(crate) fn add_path(
    cache: &Arc<Cache>,
    path: &Path,
    create_size_bytes: Option<u64>,
) -> std::io::Result<(u8, DeviceOpen)> {
    let added = cache.add_cache_path(path, create_size_bytes);
    settle_feeder(added.is_ok());
    added
}

/// `Cache::add_cache_device`, then lets the background feeder settle.
pub(crate) fn add_device(
    cache: &Arc<Cache>,
    device: Box<dyn DeviceIo>,
) -> std::io::Result<(u8, DeviceOpen)> {
    let added = cache.add_cache_device(device);
    settle_feeder(added.is_ok());
    added
}

/// Drops the cache and waits until no thread holds it any more (the
/// feeder holds it while it feeds), so that nothing writes to its devices
/// after this returns.
pub(crate) fn shutdown(cache: Arc<Cache>) {
    let weak = Arc::downgrade(&cache);
    drop(cache);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while weak.strong_count() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "cache still held after 10 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub(crate) fn records(data: &[u8]) -> usize {
    data.len().div_ceil(RS)
}

/// Reads record `index` through the cache and checks every byte.
pub(crate) fn check_record(
    cache: &Cache,
    handle: &ObjectHandle,
    data: &[u8],
    index: usize,
    what: &str,
) {
    let mut buf = vec![0u8; RS];
    let start = index * RS;
    let expected = &data[start..data.len().min(start + RS)];
    let n = if reads_through_queue() {
        let mut queue = cache.read_queue(1).unwrap();
        queue
            .submit(handle, start as u64, RS, index as u64)
            .unwrap();
        let mut done = Vec::new();
        queue.wait(1, &mut done).unwrap();
        assert_eq!(done.len(), 1);
        let view = done.pop().unwrap().result;
        let view = view.unwrap_or_else(|e| panic!("{what}: read of record {index} failed: {e}"));
        view.copy_to(&mut buf)
    } else {
        cache
            .read(handle, start as u64, &mut buf)
            .unwrap_or_else(|e| panic!("{what}: read of record {index} failed: {e}"))
    };
    assert_eq!(n, expected.len(), "{what}: short read of record {index}");
    if buf[..n] != *expected {
        let first = (0..n).find(|&i| buf[i] != expected[i]).unwrap();
        panic!("{what}: record {index} differs from primary at byte {first}");
    }
}

/// Reads the whole object, record by record, checking every byte.
pub(crate) fn check_all(cache: &Cache, handle: &ObjectHandle, data: &[u8], what: &str) {
    if !reads_through_queue() {
        for index in 0..records(data) {
            check_record(cache, handle, data, index, what);
        }
        return;
    }
    // Every record in flight at once, completions in any order.
    let mut queue = cache.read_queue(32).unwrap();
    let mut done = Vec::new();
    let mut next = 0;
    let mut seen = 0;
    while seen < records(data) {
        while next < records(data) && queue.has_room() {
            queue
                .submit(handle, (next * RS) as u64, RS, next as u64)
                .unwrap();
            next += 1;
        }
        queue.wait(1, &mut done).unwrap();
        for completion in done.drain(..) {
            let index = completion.tag as usize;
            let view = completion
                .result
                .unwrap_or_else(|e| panic!("{what}: read of record {index} failed: {e}"));
            let start = index * RS;
            let expected = &data[start..data.len().min(start + RS)];
            let mut buf = vec![0u8; RS];
            let n = view.copy_to(&mut buf);
            assert_eq!(n, expected.len(), "{what}: short read of record {index}");
            if buf[..n] != *expected {
                let first = (0..n).find(|&i| buf[i] != expected[i]).unwrap();
                panic!("{what}: record {index} differs from primary at byte {first}");
            }
            seen += 1;
        }
    }
}

/// Reads the whole object in order and feeds the L2ARC every four records
/// (the ARC holds at least that many per shard, so every record read is
/// still there at the next feed): afterwards every record is on flash.
pub(crate) fn fill(cache: &Cache, handle: &ObjectHandle, data: &[u8]) {
    for index in 0..records(data) {
        check_record(cache, handle, data, index, "fill");
        if index % 4 == 3 {
            cache.feed_l2arc();
        }
    }
    cache.feed_l2arc();
}

pub(crate) fn l2(cache: &Cache) -> L2Stats {
    cache.stats().l2.expect("cache has an L2ARC")
}

/// Per-device kstat value.
pub(crate) fn dev_stat(stats: &L2Stats, slot: u8, name: &str) -> u64 {
    let device = stats
        .devices
        .iter()
        .find(|d| d.slot == slot)
        .unwrap_or_else(|| panic!("no device in slot {slot}: {stats:?}"));
    device
        .kstats
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, v)| *v)
}

pub(crate) fn dev_state(stats: &L2Stats, slot: u8) -> &'static str {
    stats
        .devices
        .iter()
        .find(|d| d.slot == slot)
        .unwrap_or_else(|| panic!("no device in slot {slot}: {stats:?}"))
        .state
}

pub(crate) fn wait_rebuild(cache: &Cache) {
    assert!(
        cache
            .l2arc()
            .unwrap()
            .wait_for_rebuild(Duration::from_secs(20)),
        "rebuild did not finish"
    );
}

// ---------------------------------------------------------------------------
// The on-device format, read and patched with ordinary (buffered) file I/O.

pub(crate) fn read_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let file = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, offset).unwrap();
    buf
}

pub(crate) fn write_at(path: &Path, offset: u64, bytes: &[u8]) {
    let file = OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, offset).unwrap();
    file.sync_all().unwrap();
}

/// Both header copies, as stored.
pub(crate) fn header_blocks(path: &Path) -> (Vec<u8>, Vec<u8>) {
    let both = read_at(path, 0, 2 * BLOCK_BYTES as usize);
    let (a, b) = both.split_at(BLOCK_BYTES as usize);
    (a.to_vec(), b.to_vec())
}

/// The header the cache would choose, and which copy it is.
pub(crate) fn header(path: &Path) -> (DeviceHeader, usize) {
    let (a, b) = header_blocks(path);
    DeviceHeader::choose(&a, &b).unwrap()
}

/// Rewrites one header copy (the one `header.sequence % 2` names).
pub(crate) fn write_header(path: &Path, header: &DeviceHeader) {
    let mut block = [0u8; 4096];
    header.encode(&mut block);
    write_at(path, HEADER_COPY_OFFSETS[header.copy_index()], &block);
}

/// One log block as found on the device.
pub(crate) struct LogBlock {
    pub pointer: LogPointer,
    pub header: LogBlockHeader,
    pub entries: Vec<LogEntry>,
}

/// The log chain from the newest block back, following `prev` while the
/// blocks decode and match their pointers.
pub(crate) fn log_chain(path: &Path) -> Vec<LogBlock> {
    let (header, _) = header(path);
    let mut chain = Vec::new();
    let mut pointer = header.newest_log;
    while let Some(p) = pointer {
        let buf = read_at(path, p.offset_bytes, p.size_bytes as usize);
        if format::log_block_content_crc(&buf) != p.crc {
            break;
        }
        let Ok((lb, entries)) = format::decode_log_block(&buf, header.device_guid) else {
            break;
        };
        pointer = lb.prev;
        chain.push(LogBlock {
            pointer: p,
            header: lb,
            entries,
        });
    }
    chain
}

/// Rewrites a log block with `entries` (same header) and returns the
/// CRC of its new content, the value a pointer to it must carry.
pub(crate) fn rewrite_log_block(path: &Path, block: &LogBlock, entries: &[LogEntry]) -> u32 {
    let mut buf = vec![0u8; block.pointer.size_bytes as usize];
    let crc = format::encode_log_block(&block.header, entries, &mut buf);
    write_at(path, block.pointer.offset_bytes, &buf);
    crc
}

/// Contents of a file, for "untouched" checks.
pub(crate) fn file_bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}
