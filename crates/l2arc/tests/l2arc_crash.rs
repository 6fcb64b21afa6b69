//! The L2ARC under `kill -9`: a feeding process dies at random points, many
//! times in a row, on the same cache device.
//!
//! Design. The test binary re-executes itself as the child (the same test,
//! selected with `--exact`, with `L2ARC_CRASH_CHILD` set). The child opens the
//! cache device (a rebuild, from the second round on), reads the dataset
//! through a small ARC from a random starting record, checks every byte it
//! reads, and calls `feed_l2arc()` every 16 records. After every
//! feed it prints `fed <l2_bufs>` and flushes: `l2_bufs` counts index entries,
//! and an entry enters the index only after its batch's log block and the
//! device header that points at it were written, so the number printed is a
//! count of records in the completed log. The parent kills the child with
//! SIGKILL after a random 10 to 300 ms (seeded; `L2ARC_CRASH_SEED` replays a
//! run), then opens a `Cache` on the device in-process, waits for the
//! rebuild, and reads the whole dataset through it (its L2ARC cannot write:
//! no endurance budget). The next round's child starts from the device as
//! this round left it, so damage would accumulate. 20 rounds per test (at
//! least 10, then as many as fit in 22 s).
//!
//! What is asserted each round:
//! - every byte read, by the child and by the parent, equals primary;
//! - no log block fails its checks (`l2_rebuild_cksum_lb_errors`,
//!   `l2_rebuild_io_errors` and `l2_rebuild_dh_errors` are 0) and no record
//!   fails its checksum (`l2_cksum_bad` is 0) — a batch in flight when the
//!   child died is not in the chain (the header still points at the previous
//!   log block), so it cannot fail a check;
//! - every restored record is served from flash: in the parent's single pass
//!   over the dataset, `l2_hits == l2_rebuild_bufs`;
//! - the bound on what survives. Without wrap (`kill9_while_feeding_keeps_
//!   the_completed_log`: the device holds the whole dataset twice over, so
//!   the write hand never laps; the child sleeps 4 ms after each feed so
//!   that most rounds still find records to write): `reported <=
//!   l2_rebuild_bufs <= reported +
//!   U`, where `reported` is the last number the child printed. A
//!   process kill loses no completed `pwrite`, and the child prints only after
//!   `write_header` returned, so not one record of the last reported log
//!   block may be lost, not even the records of that batch (the "minus one
//!   batch" allowance is for a machine crash, where the header write may not
//!   be durable; it does not apply here). The upper bound allows the feeds
//!   that can complete between the last print and the kill: they can only
//!   write records that were in the ARC at the print or were read after it,
//!   `U = arc_max / recordsize + records read between two feeds`.
//!   With wrap (`kill9_while_feeding_with_wrap...`: a 16 MiB data area under
//!   a 48 MiB dataset, so the hand laps many times): the rebuild keeps the
//!   records of the newest log blocks up to the invalid margin (one maximal
//!   batch, `B` blocks, ahead of the hand), and the end of the previous lap
//!   may waste less than one batch, so the newest `D - 2B` blocks of the `D`
//!   data blocks are always restorable; a record with its share of a log
//!   block takes at most 5 blocks (16 KiB records), so the bound asserted is
//!   `l2_rebuild_bufs >= min(reported, (D - 2B) / 5)`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use l2arc::Compression;
use l2arc::primary::dir::DirPrimary;
use l2arc::{Cache, CacheConfig, DatasetConfig};
use l2arc::{DeviceOpen, L2ArcConfig};
use rand::{Rng, SeedableRng};

const CHILD_ENV: &str = "L2ARC_CRASH_CHILD";
const RECORD_BYTES: usize = 16 << 10;
/// Records between two feeds in the child.
const FEED_EVERY_RECORDS: u64 = 16;
const ROUNDS: u32 = 20;
const ARC_BYTES: u64 = 2 << 20;
/// Time for all rounds of one test; a round is not started after it.
const ROUNDS_SECONDS_MAX: f64 = 22.0;
const ROUNDS_MIN: u32 = 10;

/// One crash scenario: the dataset and the device.
#[derive(Clone, Copy, Debug)]
struct Setup {
    dataset_bytes: usize,
    device_bytes: u64,
    /// A different dataset seed per scenario, so that the data differs.
    seed: u64,
    /// The child sleeps this long after each feed, so that the rounds keep
    /// finding records to write (without it, two rounds write everything).
    pace_us: u64,
}

const NO_WRAP: Setup = Setup {
    dataset_bytes: 64 << 20,
    device_bytes: (1 << 20) + (128 << 20),
    seed: 11,
    pace_us: 4000,
};

const WRAP: Setup = Setup {
    dataset_bytes: 48 << 20,
    device_bytes: (1 << 20) + (16 << 20),
    seed: 23,
    pace_us: 0,
};

/// The dataset: alternate 4 KiB blocks of text (compressible) and noise, so
/// that some records are stored lz4-compressed and some are not.
fn content(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let text = b"the quick brown fox jumps over the lazy dog ";
    (0..len)
        .map(|i| {
            if (i / 4096) % 3 != 2 {
                text[(i + i / 4096) % text.len()]
            } else {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            }
        })
        .collect()
}

fn open_cache(dir: &Path, passive: bool) -> (Arc<Cache>, l2arc::DatasetId) {
    let l2arc = if passive {
        // The checker must not write: an endurance budget of nothing, and
        // only MFU records (it reads each record once, so it has none).
        L2ArcConfig::default().l2arc_dwpd(1e-12).l2arc_mfuonly(true)
    } else {
        L2ArcConfig::default()
            .l2arc_feed_min_ms(5)
            .l2arc_feed_secs(0.05)
    };
    let cache = Cache::new(
        CacheConfig::default()
            .arc_max_bytes(ARC_BYTES)
            .arc_shards(2)
            .l2arc(l2arc),
    )
    .unwrap();
    let ds = cache
        .add_dataset(
            "data",
            Arc::new(DirPrimary::new(dir.join("src")).unwrap()),
            DatasetConfig::default()
                .recordsize_bytes(RECORD_BYTES as u32)
                .compression(Compression::Lz4),
        )
        .unwrap();
    (cache, ds)
}

/// The child: rebuild, read from `start`, feed, report, until killed.
fn child(dir: &Path, setup: Setup, start: u64) -> ! {
    let data = std::fs::read(dir.join("src/f")).unwrap();
    assert_eq!(data.len(), setup.dataset_bytes);
    let (cache, ds) = open_cache(dir, false);
    cache.add_cache_path(dir.join("cache.dev"), None).unwrap();
    let l2 = Arc::clone(cache.l2arc().unwrap());
    assert!(l2.wait_for_rebuild(Duration::from_secs(20)));
    let mut out = std::io::stdout().lock();
    writeln!(out, "rebuilt {}", l2.stats().get("l2_rebuild_bufs")).unwrap();
    out.flush().unwrap();
    let f = cache.open(ds, "f", false).unwrap();
    let records = (setup.dataset_bytes / RECORD_BYTES) as u64;
    let mut buf = vec![0u8; RECORD_BYTES];
    for i in 0.. {
        let record = (start + i) % records;
        let offset = record as usize * RECORD_BYTES;
        let n = cache.read(&f, offset as u64, &mut buf).unwrap();
        if buf[..n] != data[offset..offset + RECORD_BYTES] {
            writeln!(out, "mismatch {record}").unwrap();
            out.flush().unwrap();
            std::process::exit(3);
        }
        if i % FEED_EVERY_RECORDS == FEED_EVERY_RECORDS - 1 {
            cache.feed_l2arc();
            writeln!(out, "fed {}", l2.stats().get("l2_bufs")).unwrap();
            out.flush().unwrap();
            std::thread::sleep(Duration::from_micros(setup.pace_us));
        }
    }
    unreachable!()
}

/// What the child printed before it died.
#[derive(Debug, Default)]
struct ChildReport {
    rebuilt: Option<u64>,
    /// The last `l2_bufs` printed after a feed.
    reported: Option<u64>,
    feeds: u64,
    mismatches: Vec<String>,
}

fn run_child(test: &str, dir: &Path, round: u32, start: u64, kill_after: Duration) -> ChildReport {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, "1")
        .env("L2ARC_CRASH_DIR", dir)
        .env("L2ARC_CRASH_START", start.to_string())
        .env_remove("RUST_BACKTRACE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let report = Arc::new(Mutex::new(ChildReport::default()));
    let stdout = child.stdout.take().unwrap();
    let reader = {
        let report = Arc::clone(&report);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut r = report.lock().unwrap();
                let mut words = line.split_whitespace();
                match (
                    words.next(),
                    words.next().and_then(|w| w.parse::<u64>().ok()),
                ) {
                    (Some("rebuilt"), Some(n)) => r.rebuilt = Some(n),
                    (Some("fed"), Some(n)) => {
                        r.reported = Some(n);
                        r.feeds += 1;
                    }
                    (Some("mismatch"), _) => r.mismatches.push(line.clone()),
                    _ => {}
                }
            }
        })
    };
    let stderr = child.stderr.take().unwrap();
    let stderr_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut text);
        text
    });
    std::thread::sleep(kill_after);
    let early_exit = child.try_wait().unwrap();
    // `Child::kill` is SIGKILL on Unix.
    let _ = child.kill();
    child.wait().unwrap();
    reader.join().unwrap();
    let stderr = stderr_reader.join().unwrap();
    assert!(
        early_exit.is_none(),
        "round {round}: the child exited by itself ({early_exit:?}) before the kill: {stderr}"
    );
    Arc::try_unwrap(report).unwrap().into_inner().unwrap()
}

struct Checked {
    rebuilt: u64,
    log_blocks: u64,
}

/// Opens the device in-process, waits for the rebuild, reads every record.
fn check(dir: &Path, data: &[u8], round: u32) -> Checked {
    let (cache, ds) = open_cache(dir, true);
    let (_, opened) = cache.add_cache_path(dir.join("cache.dev"), None).unwrap();
    let l2 = Arc::clone(cache.l2arc().unwrap());
    assert!(l2.wait_for_rebuild(Duration::from_secs(20)));
    let rebuilt_stats = l2.stats();
    let f = cache.open(ds, "f", false).unwrap();
    let mut buf = vec![0u8; RECORD_BYTES];
    for (record, expected) in data.chunks(RECORD_BYTES).enumerate() {
        let n = cache
            .read(&f, (record * RECORD_BYTES) as u64, &mut buf)
            .unwrap();
        assert!(
            buf[..n] == *expected,
            "round {round}: record {record} read through the cache differs from primary"
        );
    }
    let stats = l2.stats();
    for name in [
        "l2_rebuild_cksum_lb_errors",
        "l2_rebuild_io_errors",
        "l2_rebuild_dh_errors",
        "l2_rebuild_unsupported",
        "l2_cksum_bad",
        "l2_io_error",
        "l2_evict_reading",
        "l2_write_bytes",
    ] {
        assert_eq!(stats.get(name), 0, "round {round}: {name}: {stats:?}");
    }
    let rebuilt = stats.get("l2_rebuild_bufs");
    // Blank only if no child got as far as initialising the device.
    assert_eq!(
        rebuilt_stats.get("l2_rebuild_success"),
        u64::from(opened == DeviceOpen::Rebuilding),
        "round {round}: opened {opened:?}"
    );
    assert_eq!(
        stats.get("l2_hits"),
        rebuilt,
        "round {round}: every restored record is served from flash: {stats:?}"
    );
    Checked {
        rebuilt,
        log_blocks: stats.get("l2_rebuild_log_blks"),
    }
}

#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn crash_rounds(test: &str, setup: Setup) {
    if std::env::var_os(CHILD_ENV).is_some() {
        let dir = PathBuf::from(std::env::var_os("L2ARC_CRASH_DIR").unwrap());
        let start = std::env::var("L2ARC_CRASH_START").unwrap().parse().unwrap();
        child(&dir, setup, start);
    }
    let seed = std::env::var("L2ARC_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("{test}: L2ARC_CRASH_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir(dir.join("src")).unwrap();
    let data = content(setup.dataset_bytes, setup.seed);
    std::fs::write(dir.join("src/f"), &data).unwrap();
    let device = std::fs::File::create(dir.join("cache.dev")).unwrap();
    device.set_len(setup.device_bytes).unwrap();
    drop(device);
    let records = (setup.dataset_bytes / RECORD_BYTES) as u64;
    let data_blocks = (setup.device_bytes - (1 << 20)) / 4096;
    let batch_blocks = (data_blocks / 4).min(4096);
    let wraps = setup.device_bytes - (1 << 20) < 2 * setup.dataset_bytes as u64;
    let floor = (data_blocks - 2 * batch_blocks) / 5;

    let began = Instant::now();
    let mut previous = 0;
    let mut rounds = 0;
    let (mut feeds_total, mut max_rebuilt) = (0, 0);
    while rounds < ROUNDS
        && (rounds < ROUNDS_MIN || began.elapsed().as_secs_f64() < ROUNDS_SECONDS_MAX)
    {
        let round = rounds;
        rounds += 1;
        let kill_after = Duration::from_millis(rng.random_range(10..=300));
        let start = rng.random_range(0..records);
        let report = run_child(test, dir, round, start, kill_after);
        assert!(
            report.mismatches.is_empty(),
            "round {round}: the child read wrong bytes: {:?}",
            report.mismatches
        );
        if let Some(rebuilt) = report.rebuilt {
            // The child's own rebuild found what the last check found.
            assert_eq!(rebuilt, previous, "round {round}: child rebuild");
        }
        let checked = check(dir, &data, round);
        let reported = report.reported.or(report.rebuilt).unwrap_or(previous);
        eprintln!(
            "round {round:2}: killed after {:3} ms, {} feeds, reported {reported}, \
             rebuilt {} records from {} log blocks",
            kill_after.as_millis(),
            report.feeds,
            checked.rebuilt,
            checked.log_blocks,
        );
        if wraps {
            assert!(
                checked.rebuilt >= reported.min(floor),
                "round {round}: rebuilt {} < min(reported {reported}, floor {floor})",
                checked.rebuilt
            );
        } else {
            assert!(
                checked.rebuilt >= reported,
                "round {round}: rebuilt {} < {reported} records the child saw in the completed log",
                checked.rebuilt
            );
            // Between the last print and the kill, feeds can only have
            // written records that were in the ARC then or read since.
            let unreported_max = ARC_BYTES / RECORD_BYTES as u64 + FEED_EVERY_RECORDS;
            assert!(
                checked.rebuilt <= reported + unreported_max,
                "round {round}: rebuilt {} > {reported} reported + one batch",
                checked.rebuilt
            );
            assert!(checked.rebuilt <= records);
        }
        previous = checked.rebuilt;
        feeds_total += report.feeds;
        max_rebuilt = max_rebuilt.max(checked.rebuilt);
    }
    eprintln!(
        "{test}: {rounds} rounds in {:.1} s, {feeds_total} feeds, up to {max_rebuilt} records restored",
        began.elapsed().as_secs_f64()
    );
    assert!(feeds_total > 0, "no round got as far as a feed");
    assert!(max_rebuilt > 0, "nothing was ever restored");
}

#[test]
fn kill9_while_feeding_keeps_the_completed_log() {
    crash_rounds("kill9_while_feeding_keeps_the_completed_log", NO_WRAP);
}

#[test]
fn kill9_while_feeding_with_wrap_serves_only_good_bytes() {
    crash_rounds("kill9_while_feeding_with_wrap_serves_only_good_bytes", WRAP);
}

// ---------------------------------------------------------------------------
// Every crash point, deterministically.
//
// A process killed mid-feed leaves the device as its completed writes left
// it, plus possibly a prefix of the write in progress. The test below replays
// one deterministic feed (200 batches of 1 to 11 records of 8 KiB, every fifth
// of 100 to 119, on a 4 MiB data area: 11 laps) on an in-memory device and
// crashes it at every write in turn: writes before the crash point land
// whole, the write at the crash point lands torn (none, one block, half, or
// all but one block of it), later writes are lost. After each crash, a fresh L2Arc rebuilds the
// device, and the records it restores must be exactly those the format's
// rule keeps: walking the completed batches from the newest (the one the
// header names) back, a batch's records count while its log block is valid
// at the header's hand and lap (`docs/format.md`, "Data area"), and each
// record counts if it is valid itself. Every restored record must read back
// its own bytes, no log block may fail a check, and the device must keep
// working: more batches written after the rebuild come back after another.

mod crash_points {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use l2arc::DeviceIo;
    use l2arc::L2ArcConfig;
    use l2arc::internals::format::{self, BLOCK_BYTES, Compression, DeviceHeader};
    use l2arc::internals::{FeedRecord, L2Arc};

    const DATA_START_BLOCKS: u32 = 256;
    const DATA_BLOCKS: u32 = 1024;
    const DEVICE_BYTES: u64 = (DATA_START_BLOCKS + DATA_BLOCKS) as u64 * BLOCK_BYTES;
    /// `batch_blocks_max`: a quarter of the data area.
    const MARGIN_BLOCKS: u32 = DATA_BLOCKS / 4;
    const RECORD_BYTES: usize = 8 << 10;
    const BATCHES: u64 = 200;

    /// A memory device that "crashes" at one write.
    struct CrashDevice {
        bytes: Arc<Mutex<Vec<u8>>>,
        writes: AtomicU64,
        crash_at: u64,
        torn: Torn,
        crashed: Arc<AtomicBool>,
    }

    #[derive(Clone, Copy, Debug)]
    enum Torn {
        Nothing,
        OneBlock,
        Half,
        AllButOneBlock,
    }

    impl DeviceIo for CrashDevice {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
            let bytes = self.bytes.lock().unwrap();
            buf.copy_from_slice(&bytes[offset as usize..offset as usize + buf.len()]);
            Ok(())
        }

        fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
            let k = self.writes.fetch_add(1, Ordering::SeqCst);
            let len = if k < self.crash_at {
                buf.len()
            } else if k == self.crash_at {
                let blocks = buf.len() / BLOCK_BYTES as usize;
                let torn_blocks = match self.torn {
                    Torn::Nothing => 0,
                    Torn::OneBlock => 1,
                    Torn::Half => blocks / 2,
                    Torn::AllButOneBlock => blocks.saturating_sub(1),
                };
                torn_blocks * BLOCK_BYTES as usize
            } else {
                0
            };
            // `crashed`: a write was lost, whole or in part (a one-block
            // write "torn" after its one block landed whole).
            if len < buf.len() {
                self.crashed.store(true, Ordering::SeqCst);
            }
            let mut bytes = self.bytes.lock().unwrap();
            bytes[offset as usize..offset as usize + len].copy_from_slice(&buf[..len]);
            Ok(())
        }

        fn sync(&self) -> std::io::Result<()> {
            Ok(())
        }

        fn size_bytes(&self) -> u64 {
            DEVICE_BYTES
        }

        fn describe(&self) -> String {
            "crash-device".into()
        }
    }

    fn key(batch: u64, record: u64) -> u64 {
        l2arc::hash::mix64(batch << 16 | record).max(1)
    }

    fn record_data(key: u64) -> Vec<u8> {
        let mut x = key;
        (0..RECORD_BYTES / 8)
            .flat_map(|_| {
                x = l2arc::hash::mix64(x);
                x.to_le_bytes()
            })
            .collect()
    }

    /// Mostly small batches, and every fifth one nearly as large as a batch
    /// may be (`MARGIN_BLOCKS`), which is what a crash can tear over the
    /// margin ahead of the hand.
    fn records_in(batch: u64) -> u64 {
        if batch % 5 == 4 {
            100 + batch * 3 % 20
        } else {
            1 + batch * 7 % 11
        }
    }

    fn batch_keys(batch: u64) -> Vec<u64> {
        (0..records_in(batch)).map(|r| key(batch, r)).collect()
    }

    /// Writes batches `from..to` (stops early once the device crashed);
    /// returns how many completed before the crash.
    fn write_batches(l2: &L2Arc, from: u64, to: u64, crashed: &AtomicBool) -> u64 {
        let mut completed = 0;
        for batch in from..to {
            if crashed.load(Ordering::SeqCst) {
                break;
            }
            let data: Vec<(u64, Vec<u8>)> = batch_keys(batch)
                .into_iter()
                .map(|k| (k, record_data(k)))
                .collect();
            let records: Vec<FeedRecord<'_>> = data
                .iter()
                .map(|(k, d)| FeedRecord {
                    key_hash: *k,
                    data: d,
                    compression: Compression::Off,
                    sector_table_min_bytes: l2arc::internals::format::SECTOR_TABLE_RECORD_BYTES_MIN
                        as u32,
                })
                .collect();
            let (_, written) = l2.write_batch(&records).unwrap();
            assert_eq!(written, records.len(), "batch {batch} did not fit");
            if !crashed.load(Ordering::SeqCst) {
                completed += 1;
            }
        }
        completed
    }

    fn open(
        bytes: &Arc<Mutex<Vec<u8>>>,
        crash_at: u64,
        torn: Torn,
    ) -> (Arc<L2Arc>, Arc<AtomicBool>, Arc<CrashDevice>) {
        let crashed = Arc::new(AtomicBool::new(false));
        let device = Arc::new(CrashDevice {
            bytes: Arc::clone(bytes),
            writes: AtomicU64::new(0),
            crash_at,
            torn,
            crashed: Arc::clone(&crashed),
        });
        let l2 = Arc::new(L2Arc::new(L2ArcConfig::default(), 4096));
        l2.add_device(Box::new(SharedDevice(Arc::clone(&device))))
            .unwrap();
        assert!(l2.wait_for_rebuild(Duration::from_secs(10)));
        (l2, crashed, device)
    }

    /// Lets the test keep a handle on the device it gave away.
    struct SharedDevice(Arc<CrashDevice>);

    impl DeviceIo for SharedDevice {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
            self.0.read_at(offset, buf)
        }
        fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
            self.0.write_at(offset, buf)
        }
        fn sync(&self) -> std::io::Result<()> {
            self.0.sync()
        }
        fn size_bytes(&self) -> u64 {
            self.0.size_bytes()
        }
        fn describe(&self) -> String {
            self.0.describe()
        }
    }

    fn header(bytes: &Arc<Mutex<Vec<u8>>>) -> DeviceHeader {
        let bytes = bytes.lock().unwrap();
        let block = BLOCK_BYTES as usize;
        DeviceHeader::choose(&bytes[..block], &bytes[block..2 * block])
            .unwrap()
            .0
    }

    /// Where batch `i` lies: its lap and blocks `[first, end)`.
    #[derive(Clone, Copy, Debug)]
    struct Placement {
        lap: u32,
        first: u32,
        end: u32,
        log_first: u32,
    }

    /// The format's validity rule (`docs/format.md`).
    fn valid(block: u32, lap: u32, at_lap: u32, hand: u32) -> bool {
        (lap == at_lap && block < hand)
            || (lap.wrapping_add(1) == at_lap && block >= hand + MARGIN_BLOCKS)
    }

    /// The records a rebuild must restore from `completed` batches, given
    /// the header's lap and hand.
    fn expected(placements: &[Placement], completed: u64, lap: u32, hand: u32) -> Vec<u64> {
        let mut keys = Vec::new();
        for batch in (0..completed).rev() {
            let p = placements[batch as usize];
            if !(valid(p.log_first, p.lap, lap, hand) && valid(p.end - 1, p.lap, lap, hand)) {
                break;
            }
            let mut at = p.first;
            for k in batch_keys(batch) {
                let blocks = (RECORD_BYTES as u64 / BLOCK_BYTES) as u32;
                if valid(at, p.lap, lap, hand) && valid(at + blocks - 1, p.lap, lap, hand) {
                    keys.push(k);
                }
                at += blocks;
            }
        }
        keys
    }

    fn check_restored(l2: &L2Arc, expected: &[u64], not_expected: &[u64], what: &str) {
        let stats = l2.stats();
        for name in [
            "l2_rebuild_cksum_lb_errors",
            "l2_rebuild_io_errors",
            "l2_rebuild_dh_errors",
        ] {
            assert_eq!(stats.get(name), 0, "{what}: {name}: {stats:?}");
        }
        assert_eq!(
            stats.get("l2_rebuild_bufs"),
            expected.len() as u64,
            "{what}: records restored"
        );
        for &k in expected {
            let data = l2
                .read(k, RECORD_BYTES as u32)
                .unwrap_or_else(|| panic!("{what}: record {k:#x} not served: {:?}", l2.stats()));
            assert!(
                *data == *record_data(k),
                "{what}: record {k:#x} has wrong bytes"
            );
        }
        for &k in not_expected {
            assert!(
                l2.read(k, RECORD_BYTES as u32).is_none(),
                "{what}: {k:#x} restored"
            );
        }
        assert_eq!(l2.stats().get("l2_cksum_bad"), 0, "{what}");
    }

    #[test]
    #[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
    fn every_crash_point_rebuilds_exactly_the_completed_log() {
        // The reference run: where every batch lands, and how many writes.
        let bytes = Arc::new(Mutex::new(vec![0u8; DEVICE_BYTES as usize]));
        let (l2, crashed, device) = open(&bytes, u64::MAX, Torn::Nothing);
        let mut placements = Vec::new();
        for batch in 0..BATCHES {
            write_batches(&l2, batch, batch + 1, &crashed);
            let h = header(&bytes);
            let n = records_in(batch) as u32;
            let log_blocks = (format::log_block_size_bytes(n as usize) as u64 / BLOCK_BYTES) as u32;
            let total = n * (RECORD_BYTES as u64 / BLOCK_BYTES) as u32 + log_blocks;
            placements.push(Placement {
                lap: h.lap,
                first: h.hand_block - total,
                end: h.hand_block,
                log_first: h.hand_block - log_blocks,
            });
        }
        let writes_total = device.writes.load(Ordering::SeqCst);
        let laps = placements.last().unwrap().lap;
        assert!(
            laps >= 2,
            "the feed should lap the device twice, lapped {laps}"
        );
        drop(l2);

        let torn_kinds = [
            Torn::Nothing,
            Torn::OneBlock,
            Torn::Half,
            Torn::AllButOneBlock,
        ];
        for crash_at in 1..writes_total {
            let torn = torn_kinds[crash_at as usize % torn_kinds.len()];
            let what = format!("crash at write {crash_at} ({torn:?})");
            let bytes = Arc::new(Mutex::new(vec![0u8; DEVICE_BYTES as usize]));
            let (l2, crashed, _) = open(&bytes, crash_at, torn);
            let completed = write_batches(&l2, 0, BATCHES, &crashed);
            drop(l2);

            // The header names the newest completed batch, or says the hand
            // wrapped (lap + 1 at the start) ahead of the next one.
            let h = header(&bytes);
            let (lap, hand) = (h.lap, h.hand_block);
            if completed > 0 {
                let last = placements[completed as usize - 1];
                assert!(
                    (lap, hand) == (last.lap, last.end)
                        || (lap, hand) == (last.lap + 1, DATA_START_BLOCKS),
                    "{what}: header at lap {lap} hand {hand}, last completed batch {last:?}"
                );
            }
            let keep = expected(&placements, completed, lap, hand);
            let lost: Vec<u64> = (completed..(completed + 1).min(BATCHES))
                .flat_map(batch_keys)
                .collect();
            let (l2, _, _) = open(&bytes, u64::MAX, Torn::Nothing);
            check_restored(&l2, &keep, &lost, &what);

            // The device goes on: ten more batches, another restart.
            if crash_at % 8 == 0 {
                let never = Arc::new(AtomicBool::new(false));
                write_batches(&l2, 1000, 1010, &never);
                drop(l2);
                let (l2, _, _) = open(&bytes, u64::MAX, Torn::Nothing);
                let newest: Vec<u64> = (1000..1010).flat_map(batch_keys).collect();
                let stats = l2.stats();
                assert_eq!(
                    stats.get("l2_rebuild_cksum_lb_errors"),
                    0,
                    "{what}, then 10 batches"
                );
                assert!(
                    stats.get("l2_rebuild_bufs") >= newest.len() as u64,
                    "{what}, then 10 batches: {stats:?}"
                );
                check_some(&l2, &newest, &what);
            }
        }
    }

    fn check_some(l2: &L2Arc, keys: &[u64], what: &str) {
        for &k in keys {
            let data = l2
                .read(k, RECORD_BYTES as u32)
                .unwrap_or_else(|| panic!("{what}, then 10 batches: {k:#x} lost"));
            assert!(*data == *record_data(k), "{what}: wrong bytes");
        }
    }
}
