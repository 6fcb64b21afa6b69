//! Concurrency stress: readers and a writer through one `Cache`, with an ARC
//! small enough that records are evicted all the time.
//!
//! The file is `BLOCKS` blocks of 4 KiB. The writer repeatedly writes a new
//! version of a block (or a short run of blocks) through `Cache::write`; every
//! byte of a block encodes its (block, version), and the version is published
//! in `committed[block]` once the write has returned. A reader notes
//! `lo = committed[b]` before its read and `hi = committed[b] + 1` after it,
//! and every block it got back must be exactly the bytes of one
//! (b, version) with `lo <= version <= hi`: older than `lo` is stale data
//! served after a write completed, a mix of versions is a torn record.
//!
//! Primary storage is the file through `DirPrimary`, wrapped so that one
//! `write_at` is atomic against `read_at` (a reader-writer lock): buffered
//! reads on Linux file systems may see a page half-copied by a concurrent
//! write, and that is the file system's business, not the cache's. What is
//! checked is the cache: single-flight fills, doomed fills, eviction of
//! referenced buffers, and invalidation on write.
//!
//! A watchdog aborts the process if a run takes far longer than planned
//! (a deadlock). `L2ARC_STRESS_SECS` sets the run time (default 4 s per
//! variant; the variants run in parallel).

use std::fs;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use l2arc::primary::dir::DirPrimary;
use l2arc::primary::{ObjectInfo, Primary, PrimaryObject};
use l2arc::{Cache, CacheConfig, CacheMode, DatasetConfig, ObjectHandle};
use rand::Rng;

const BLOCK: usize = 4096;
const BLOCKS: usize = 256;
const READERS: usize = 8;
/// Longest read, in blocks.
const MAX_READ_BLOCKS: usize = 6;
/// Longest write, in blocks.
const MAX_WRITE_BLOCKS: usize = 3;
const WATCHDOG: Duration = Duration::from_secs(60);
const WORDS: usize = BLOCK / 8;

fn word(block: u64, version: u64, index: usize) -> u64 {
    match index {
        0 => block,
        1 => version,
        _ => {
            let mut x = block
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(version.wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
                .wrapping_add(index as u64);
            x ^= x >> 31;
            x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x ^ (x >> 29)
        }
    }
}

fn fill_block(out: &mut [u8], block: u64, version: u64) {
    for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&word(block, version, i).to_le_bytes());
    }
}

/// The (block, version) a block holds, if all of its bytes agree on one.
fn parse_block(data: &[u8]) -> Result<(u64, u64), String> {
    let w = |i: usize| u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().unwrap());
    let (block, version) = (w(0), w(1));
    if let Some(i) = (2..WORDS).find(|&i| w(i) != word(block, version, i)) {
        return Err(format!(
            "header says (block {block}, version {version}) but byte {} disagrees",
            i * 8
        ));
    }
    Ok((block, version))
}

/// `DirPrimary` with each `write_at` atomic against `read_at`.
struct AtomicPrimary {
    inner: DirPrimary,
    lock: Arc<RwLock<()>>,
}

struct AtomicObject {
    inner: Arc<dyn PrimaryObject>,
    lock: Arc<RwLock<()>>,
}

impl Primary for AtomicPrimary {
    fn open(&self, name: &str, writable: bool) -> io::Result<Arc<dyn PrimaryObject>> {
        Ok(Arc::new(AtomicObject {
            inner: self.inner.open(name, writable)?,
            lock: Arc::clone(&self.lock),
        }))
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

impl PrimaryObject for AtomicObject {
    fn info(&self) -> io::Result<ObjectInfo> {
        self.inner.info()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let _shared = self.lock.read().unwrap();
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let _exclusive = self.lock.write().unwrap();
        self.inner.write_at(offset, data)
    }

    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
}

#[derive(Default)]
struct Counts {
    reads: AtomicU64,
    blocks_checked: AtomicU64,
    /// Blocks whose version was newer than `lo` (a write overlapped the read).
    overlapped: AtomicU64,
    prefetches: AtomicU64,
    writes: AtomicU64,
}

struct Run<'a> {
    cache: &'a Cache,
    handle: &'a ObjectHandle,
    committed: &'a [AtomicU64],
    stop: &'a AtomicBool,
    failures: &'a Mutex<Vec<String>>,
    counts: &'a Counts,
}

impl Run<'_> {
    fn fail(&self, message: String) {
        let mut failures = self.failures.lock().unwrap();
        if failures.len() < 20 {
            failures.push(message);
        }
        self.stop.store(true, Ordering::Relaxed);
    }

    fn writer(&self, deadline: Instant) {
        let mut rng = rand::rng();
        let mut data = vec![0u8; MAX_WRITE_BLOCKS * BLOCK];
        let mut version = vec![0u64; BLOCKS];
        while Instant::now() < deadline && !self.stop.load(Ordering::Relaxed) {
            let first = rng.random_range(0..BLOCKS);
            let n = rng.random_range(1..=MAX_WRITE_BLOCKS).min(BLOCKS - first);
            for (i, chunk) in data[..n * BLOCK].chunks_exact_mut(BLOCK).enumerate() {
                let b = first + i;
                version[b] += 1;
                fill_block(chunk, b as u64, version[b]);
            }
            if let Err(e) =
                self.cache
                    .write(self.handle, (first * BLOCK) as u64, &data[..n * BLOCK])
            {
                self.fail(format!("write of blocks {first}+{n}: {e}"));
                return;
            }
            for (committed, &v) in self.committed[first..first + n]
                .iter()
                .zip(&version[first..first + n])
            {
                committed.store(v, Ordering::Release);
            }
            self.counts.writes.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn reader(&self, id: usize, deadline: Instant) {
        let mut rng = rand::rng();
        let mut buf = vec![0u8; MAX_READ_BLOCKS * BLOCK];
        let mut lo = [0u64; MAX_READ_BLOCKS];
        let mut iteration = 0u64;
        while !self.stop.load(Ordering::Relaxed) {
            iteration += 1;
            if iteration.is_multiple_of(64) && Instant::now() >= deadline {
                break;
            }
            let first = rng.random_range(0..BLOCKS);
            let n = rng.random_range(1..=MAX_READ_BLOCKS).min(BLOCKS - first);
            let offset = (first * BLOCK) as u64;
            let len = n * BLOCK;
            if iteration.is_multiple_of(16) {
                // Read-ahead of the next few blocks goes through the same fills.
                let at = ((first + n) % BLOCKS * BLOCK) as u64;
                if let Err(e) = self.cache.prefetch(self.handle, at, 2 * BLOCK) {
                    self.fail(format!("reader {id}: prefetch at {at}: {e}"));
                    return;
                }
                self.counts.prefetches.fetch_add(1, Ordering::Relaxed);
            }
            for (i, l) in lo[..n].iter_mut().enumerate() {
                *l = self.committed[first + i].load(Ordering::Acquire);
            }
            let got = if iteration.is_multiple_of(3) {
                // Zero-copy view, copied out for checking.
                self.cache
                    .read_view(self.handle, offset, len)
                    .map(|view| view.copy_to(&mut buf[..len]))
            } else {
                self.cache.read(self.handle, offset, &mut buf[..len])
            };
            match got {
                Ok(got) if got == len => {}
                Ok(got) => {
                    self.fail(format!("reader {id}: read {offset}+{len} returned {got}"));
                    return;
                }
                Err(e) => {
                    self.fail(format!("reader {id}: read {offset}+{len}: {e}"));
                    return;
                }
            }
            for (i, chunk) in buf[..len].chunks_exact(BLOCK).enumerate() {
                let b = first + i;
                let hi = self.committed[b].load(Ordering::Acquire) + 1;
                match parse_block(chunk) {
                    Ok((block, v)) if block == b as u64 && (lo[i]..=hi).contains(&v) => {
                        if v > lo[i] {
                            self.counts.overlapped.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok((block, v)) => self.fail(format!(
                        "reader {id}: block {b} (read {offset}+{len}) holds (block {block}, \
                         version {v}); expected block {b} at a version in [{}, {hi}]{}",
                        lo[i],
                        if v < lo[i] { ": STALE" } else { "" }
                    )),
                    Err(e) => self.fail(format!(
                        "reader {id}: block {b} (read {offset}+{len}) is torn: {e}; \
                         versions allowed [{}, {hi}]",
                        lo[i]
                    )),
                }
            }
            self.counts.reads.fetch_add(1, Ordering::Relaxed);
            self.counts
                .blocks_checked
                .fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}

#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn stress(recordsize: u32, arc_max_bytes: u64, arc_shards: usize) {
    let secs: f64 = std::env::var("L2ARC_STRESS_SECS")
        .map(|s| {
            s.parse()
                .expect("L2ARC_STRESS_SECS must be a number of seconds")
        })
        .unwrap_or(4.0);
    let what = format!("recordsize {recordsize}, arc_max {arc_max_bytes}, {arc_shards} shards");

    // A deadlock must fail the run, not hang CI.
    let (alive, watchdog) = mpsc::channel::<()>();
    let label = what.clone();
    let limit = WATCHDOG.max(Duration::from_secs_f64(secs * 4.0));
    std::thread::spawn(move || {
        if let Err(RecvTimeoutError::Timeout) = watchdog.recv_timeout(limit) {
            eprintln!("stress ({label}): still running after {limit:?}: deadlock; aborting");
            std::process::abort();
        }
    });

    let tmp = tempfile::tempdir().unwrap();
    let mut file = vec![0u8; BLOCKS * BLOCK];
    for (b, chunk) in file.chunks_exact_mut(BLOCK).enumerate() {
        fill_block(chunk, b as u64, 0);
    }
    fs::write(tmp.path().join("data"), &file).unwrap();
    let primary = AtomicPrimary {
        inner: DirPrimary::new(tmp.path()).unwrap(),
        lock: Arc::new(RwLock::new(())),
    };
    let cache = Cache::new(
        CacheConfig::default()
            .arc_max_bytes(arc_max_bytes)
            .arc_shards(arc_shards),
    )
    .unwrap();
    let ds = cache
        .add_dataset(
            "stress",
            Arc::new(primary),
            DatasetConfig::default()
                .recordsize_bytes(recordsize)
                .primarycache(CacheMode::All)
                .secondarycache(CacheMode::All)
                .compression(l2arc::Compression::Off),
        )
        .unwrap();
    let handle = cache.open(ds, "data", true).unwrap();
    let committed: Vec<AtomicU64> = (0..BLOCKS).map(|_| AtomicU64::new(0)).collect();
    let stop = AtomicBool::new(false);
    let failures = Mutex::new(Vec::new());
    let counts = Counts::default();
    let run = Run {
        cache: &cache,
        handle: &handle,
        committed: &committed,
        stop: &stop,
        failures: &failures,
        counts: &counts,
    };

    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    std::thread::scope(|s| {
        for id in 0..READERS {
            let run = &run;
            s.spawn(move || run.reader(id, deadline));
        }
        run.writer(deadline);
    });
    let elapsed = start.elapsed();

    // At rest, every block reads back exactly its last committed version,
    // through the cache and in the file.
    let mut all = vec![0u8; BLOCKS * BLOCK];
    assert_eq!(cache.read(&handle, 0, &mut all).unwrap(), all.len());
    let on_disk = fs::read(tmp.path().join("data")).unwrap();
    for (b, (cached, disk)) in all
        .chunks_exact(BLOCK)
        .zip(on_disk.chunks_exact(BLOCK))
        .enumerate()
    {
        let want = (b as u64, committed[b].load(Ordering::Acquire));
        if parse_block(cached) != Ok(want) || parse_block(disk) != Ok(want) {
            run.fail(format!(
                "at rest, block {b}: cache {:?}, file {:?}, committed {want:?}",
                parse_block(cached),
                parse_block(disk)
            ));
        }
    }

    let stats = cache.stats();
    let reads = counts.reads.load(Ordering::Relaxed);
    let writes = counts.writes.load(Ordering::Relaxed);
    println!(
        "stress ({what}), {:.1} s: {reads} reads ({} blocks checked, {} overlapping a write), \
         {} prefetches, {writes} writes",
        elapsed.as_secs_f64(),
        counts.blocks_checked.load(Ordering::Relaxed),
        counts.overlapped.load(Ordering::Relaxed),
        counts.prefetches.load(Ordering::Relaxed),
    );
    let a = &stats.arc;
    println!(
        "  arc: {} hits, {} misses, {} iohits, {} stale drops, {} invalidated, \
         {} evicted, {} refused (no room), size {} of {}, primary reads {}",
        a.hits,
        a.misses,
        a.iohits,
        a.stale_drops,
        a.invalidated,
        a.evicted_mru + a.evicted_mfu,
        a.insert_no_room,
        a.size,
        stats.arc_max,
        stats.primary_reads
    );

    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "stress ({what}): {} violation(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
    drop(alive);
    cache.assert_consistent();
    assert!(a.size <= arc_max_bytes, "size {} over arc_max", a.size);
    // The run must have exercised what it claims to.
    let min_ops = (secs * 500.0) as u64;
    assert!(reads >= 10 * min_ops, "only {reads} reads in {elapsed:?}");
    assert!(writes >= min_ops, "only {writes} writes in {elapsed:?}");
    assert!(a.hits > 0 && a.misses > 0, "{a:?}");
    assert!(
        a.evicted_mru + a.evicted_mfu > 0,
        "nothing was evicted: {a:?}"
    );
    assert!(a.invalidated > 0, "no write found its record cached: {a:?}");
}

/// One record per block.
#[test]
fn readers_and_a_writer_4k_records() {
    // 32 records in 8 shards of 4 each: an eighth of the file.
    stress(4096, 32 * 4096, 8);
}

/// Four blocks per record: a block write invalidates a record that other
/// blocks share.
#[test]
fn readers_and_a_writer_16k_records() {
    // 16 records in 4 shards of 4 each: a quarter of the file.
    stress(16384, 16 * 16384, 4);
}
