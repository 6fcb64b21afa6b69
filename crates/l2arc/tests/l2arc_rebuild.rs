//! The rebuild's bulk path at a scale where it restores in several runs:
//! the newest entry of a record wins over older ones (across runs and
//! within one), entries the hand has overwritten stay out, and readers
//! racing the rebuild never get a wrong entry (a miss is fine).
//!
//! The device is written log only (`write_log_only_batch`) on a sparse
//! file, so that millions of entries cost seconds: records are holes, read
//! as zeros, and each entry's checksum is that of zeros, except where a test
//! needs a wrong one. The expected outcome is computed independently from
//! the log on the device and the rule of `docs/format.md` ("Data area").

mod l2arc_util;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use l2arc::internals::format::{self, BLOCK_BYTES, DATA_START_BYTES, Location};
use l2arc::internals::{L2Arc, LogOnlyRecord};
use l2arc::{DeviceOpen, FileDevice};
use l2arc_util::*;

const RECORD_BYTES: usize = 4096;
/// More than one run of the rebuild (2 Mi entries): three runs' worth of
/// entries written, the hand past the end of the data area once.
const RECORDS: u64 = 3_300_000;
/// Data area: room for about 2.4 M single-block records.
const DATA_BYTES: u64 = 2_400_000 * BLOCK_BYTES;
/// The first keys of each batch are written again in the next one.
const REWRITTEN_PER_BATCH: u64 = 40;

fn key(n: u64) -> u64 {
    l2arc::hash::mix64(n ^ 0x0072_6562_7569_6c64).max(1)
}

/// Whether a block written in `lap_mod32` is intact for the header's hand
/// (`docs/format.md`, "Data area").
fn holds(h: &format::DeviceHeader, block: u32, lap_mod32: u32) -> bool {
    let start = (h.data_start_bytes / BLOCK_BYTES) as u32;
    let end = (h.data_end_bytes / BLOCK_BYTES) as u32;
    if block < start || block >= end {
        return false;
    }
    if lap_mod32 == h.lap % 32 {
        block < h.hand_block
    } else if lap_mod32 == h.lap.wrapping_sub(1) % 32 {
        block >= h.hand_block + h.batch_blocks_max
    } else {
        false
    }
}

/// Where log blocks were written: `(lap, first block, blocks)`. Records are
/// never written here, so a record of a later lap whose block an older log
/// block took reads that log block's bytes (and fails its checksum): the
/// test reads only records clear of them.
type LogRanges = Vec<(u32, u32, u32)>;

/// Whether the record at `location` reads zeros: no log block of another
/// lap was ever written over it. `logs` is sorted by first block.
fn clean(location: Location, logs: &LogRanges) -> bool {
    let (first, last) = (
        location.block(),
        location.block() + u32::from(location.asize_blocks()) - 1,
    );
    let after = logs.partition_point(|&(_, block, _)| block <= last);
    // A log block spans at most 21 blocks (4096 entries).
    logs[..after]
        .iter()
        .rev()
        .take_while(|&&(_, block, _)| block + 64 > first)
        .all(|&(lap, block, blocks)| {
            lap % 32 == u32::from(location.lap_mod32()) || first >= block + blocks
        })
}

/// Writes the log: batches of varying size (so that the wrapped hand
/// lands inside older batches), each starting with the first keys of the
/// batch before it. A key that a later batch writes again carries a wrong
/// checksum the first time, so a read that used the older entry would fail
/// its check. Returns every key written and where the log blocks went (as
/// the writer places batches: at the hand, or at the start of the data
/// area when a batch does not fit before its end).
fn write_log(l2: &L2Arc, path: &std::path::Path) -> (Vec<u64>, LogRanges) {
    let (h, _) = header(path);
    let start_block = (h.data_start_bytes / BLOCK_BYTES) as u32;
    let end_block = (h.data_end_bytes / BLOCK_BYTES) as u32;
    let (mut lap, mut hand) = (0u32, start_block);
    let mut logs = LogRanges::new();
    let zeros = [0u8; RECORD_BYTES];
    let checksum = |k: u64| format::record_checksum(k, &zeros);
    let mut keys = Vec::new();
    let mut next = 0u64;
    let mut previous_first: Vec<u64> = Vec::new();
    let mut batch_number = 0u64;
    while next < RECORDS {
        let fresh = (1000 + batch_number * 7919 % 3000).min(RECORDS - next);
        let mut batch: Vec<LogOnlyRecord> = previous_first
            .iter()
            .map(|&k| LogOnlyRecord {
                key_hash: k,
                stored_bytes: RECORD_BYTES as u32,
                checksum: checksum(k),
            })
            .collect();
        let first_fresh = batch.len();
        for n in next..next + fresh {
            let k = key(n);
            let rewritten = (n - next) < REWRITTEN_PER_BATCH && next + fresh < RECORDS;
            batch.push(LogOnlyRecord {
                key_hash: k,
                stored_bytes: RECORD_BYTES as u32,
                checksum: if rewritten {
                    checksum(k) ^ 1
                } else {
                    checksum(k)
                },
            });
            keys.push(k);
        }
        let (_, written) = l2.write_log_only_batch(&batch).unwrap();
        assert_eq!(written, batch.len(), "batch {batch_number} was cut");
        let log_blocks = (format::log_block_size_bytes(written) as u64 / BLOCK_BYTES) as u32;
        let total_blocks = written as u32 + log_blocks;
        if hand + total_blocks > end_block {
            lap += 1;
            hand = start_block;
        }
        logs.push((lap, hand + written as u32, log_blocks));
        hand += total_blocks;
        previous_first = batch[first_fresh..]
            .iter()
            .take(REWRITTEN_PER_BATCH as usize)
            .map(|r| r.key_hash)
            .collect();
        next += fresh;
        batch_number += 1;
    }
    l2.sync_devices().unwrap();
    let (h, _) = header(path);
    assert_eq!(
        (h.lap, h.hand_block),
        (lap, hand),
        "batches placed as the writer does"
    );
    (keys, logs)
}

/// What a rebuild must restore: walking the log newest first, up to the
/// first log block the hand has swept over, the first entry met of each
/// fingerprint (`fingerprint`: the bits of the key the index keeps; two
/// keys that share one share an entry), if its record is intact.
fn expected(path: &std::path::Path, fingerprint: impl Fn(u64) -> u64) -> HashMap<u64, Location> {
    let (h, _) = header(path);
    let mut restored = HashMap::new();
    let mut seen = std::collections::HashSet::new();
    for block in log_chain(path) {
        let first = (block.pointer.offset_bytes / BLOCK_BYTES) as u32;
        let last = first + block.pointer.size_bytes / BLOCK_BYTES as u32 - 1;
        if !holds(&h, first, block.header.lap % 32) || !holds(&h, last, block.header.lap % 32) {
            break;
        }
        for e in &block.entries {
            let l = e.location;
            let end = l.block() + u32::from(l.asize_blocks()) - 1;
            let intact = holds(&h, l.block(), u32::from(l.lap_mod32()))
                && holds(&h, end, u32::from(l.lap_mod32()));
            if intact && seen.insert(fingerprint(e.key_hash)) {
                restored.insert(e.key_hash, l);
            }
        }
    }
    restored
}

#[test]
#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn bulk_rebuild_newest_wins_overwritten_stay_out_reads_never_wrong() {
    let world = World::new();
    let path = world.device_path("bulk.dev");
    let logs = {
        let config = quiet_l2().l2arc_rebuild_enabled(false);
        let l2 = Arc::new(L2Arc::new(config, 0));
        let device = FileDevice::open(&path, Some(DATA_START_BYTES + DATA_BYTES)).unwrap();
        l2.add_device(Box::new(device)).unwrap();
        let (keys, logs) = write_log(&l2, &path);
        assert_eq!(keys.len() as u64, RECORDS);
        l2.stop();
        let mut logs = logs;
        logs.sort_unstable_by_key(|&(_, block, _)| block);
        logs
    };
    let (h, _) = header(&path);
    assert!(h.lap >= 1, "the hand must have wrapped");
    // Keys that share a fingerprint share an entry: of 3.3 M keys and 38
    // kept bits (64 shards), ~20 pairs. A read of one may find the other's
    // entry (a miss, counted as a checksum failure, and the entry dropped):
    // they are left out of the reads, so that every read below has one
    // right answer.
    let fingerprints = L2Arc::new(quiet_l2(), 0);
    let fingerprint = |k| fingerprints.index_fingerprint(k);
    let expected = expected(&path, fingerprint);
    let all_keys: Vec<u64> = (0..RECORDS).map(key).collect();
    let mut keys_of: HashMap<u64, u32> = HashMap::new();
    for &k in &all_keys {
        *keys_of.entry(fingerprint(k)).or_default() += 1;
    }
    let shared = |k: &u64| keys_of[&fingerprint(*k)] > 1;
    let shared_count = all_keys.iter().filter(|k| shared(k)).count();
    println!("{shared_count} keys share their fingerprint with another");
    assert!(
        shared_count < 200,
        "{shared_count}: far more than 38 kept bits explain"
    );
    let overwritten = all_keys
        .iter()
        .filter(|k| !expected.contains_key(k))
        .count();
    // The keys read: every overwritten one, and the restored ones whose
    // record reads zeros.
    let read_keys: Vec<u64> = all_keys
        .iter()
        .copied()
        .filter(|k| expected.get(k).is_none_or(|&l| clean(l, &logs)))
        .filter(|k| !shared(k))
        .collect();
    assert!(read_keys.len() > all_keys.len() * 9 / 10);
    assert!(
        expected.len() > 2_100_000,
        "more than one run: {}",
        expected.len()
    );
    assert!(overwritten > 500_000, "{overwritten}");

    // Rebuild into an index sized for far fewer entries, with readers
    // racing it: every hit must be a record the rebuild may restore, and
    // no read may meet an entry whose checksum fails (an older duplicate).
    let l2 = Arc::new(L2Arc::new(quiet_l2(), 1000));
    let device = FileDevice::open(&path, None).unwrap();
    let (_, opened) = l2.add_device(Box::new(device)).unwrap();
    assert_eq!(opened, DeviceOpen::Rebuilding);
    let done = AtomicBool::new(false);
    let reads_during = AtomicU64::new(0);
    let hits_during = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for reader in 0..2u64 {
            let (l2, done, expected, read_keys) = (&l2, &done, &expected, &read_keys);
            let (reads_during, hits_during) = (&reads_during, &hits_during);
            scope.spawn(move || {
                let mut rng = Rng(reader + 1);
                while !done.load(Ordering::SeqCst) {
                    let k = read_keys[rng.below(read_keys.len() as u64) as usize];
                    let rebuilding = l2.rebuilding();
                    if let Some(data) = l2.read(k, RECORD_BYTES as u32) {
                        assert!(
                            expected.contains_key(&k),
                            "an overwritten record was served"
                        );
                        assert!(data.iter().all(|&b| b == 0));
                        if rebuilding {
                            hits_during.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if rebuilding {
                        reads_during.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        assert!(l2.wait_for_rebuild(Duration::from_secs(300)));
        done.store(true, Ordering::SeqCst);
    });
    let stats = l2.stats();
    println!(
        "bulk rebuild: {} restored, {} precached, {overwritten} overwritten; \
         {} reads during the rebuild, {} hits; {} us; {:.1} index B/entry",
        stats.get("l2_rebuild_bufs"),
        stats.get("l2_rebuild_bufs_precached"),
        reads_during.load(Ordering::Relaxed),
        hits_during.load(Ordering::Relaxed),
        stats.get("l2_rebuild_time_us"),
        stats.get("l2_hdr_size") as f64 / expected.len() as f64,
    );
    assert!(reads_during.load(Ordering::Relaxed) > 0);
    assert_eq!(stats.get("l2_cksum_bad"), 0, "a read met an older entry");
    assert_eq!(stats.get("l2_rebuild_cksum_lb_errors"), 0);
    assert_eq!(stats.get("l2_rebuild_bufs"), expected.len() as u64);
    assert_eq!(l2.len(), expected.len());
    // The index was sized from the log, not grown 1.25x at a time.
    let bytes_per_entry = stats.get("l2_hdr_size") as f64 / expected.len() as f64;
    assert!(bytes_per_entry < 24.0, "{bytes_per_entry}");
    // Restored records are served, from their newest entry; overwritten
    // ones are misses (a sample: each hit is a device read).
    for k in read_keys.iter().step_by(101) {
        let hit = l2.read(*k, RECORD_BYTES as u32).is_some();
        assert_eq!(hit, expected.contains_key(k));
    }
    assert_eq!(l2.stats().get("l2_cksum_bad"), 0, "an older entry won");
    l2.stop();
}
