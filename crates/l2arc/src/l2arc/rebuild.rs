//! Rebuilding the index from a device's log at open (persistent L2ARC).
//!
//! The header points at the newest log block; each log block points at the
//! one before. The walk checks every block (checksum, device guid, sequence
//! strictly falling, location still intact for the hand) and stops at the
//! first that fails: what lies behind a bad block cannot be trusted to
//! belong to this log. Entries the hand has overwritten since are skipped,
//! and a newer entry for the same record wins over an older one. Reads go
//! on meanwhile and see what has been restored so far: an entry not
//! restored yet is a miss, never a wrong hit.
//!
//! Why runs, not one insert per entry. A device of 100 M records has 100 M
//! entries to restore into a 2.2 GB table. Inserted in log order, each
//! lands at a random slot: a DRAM miss and, in a VM, a TLB miss walked
//! through two levels of page tables, ~0.5 us each, so 100 M took ~45 s.
//! So the reader stages entries in a run (at most `REBUILD_RUN_ENTRIES_MAX`),
//! and a full run is ordered by shard and home slot (`L2Index::sort_run`, a
//! counting sort into buckets of a few pages of table) and inserted in that
//! order with the home slots of the next entries prefetched: the table is
//! then swept forwards, a few pages at a time, with many misses in flight
//! instead of one. The sort is stable and the walk goes from newest to
//! oldest, so within a run and across runs the first entry met for a key is
//! the newest, and `insert_if_absent` keeps it.
//!
//! Why three threads. The reader reads and checks log blocks (I/O, CRC,
//! decoding) and fills a run while the previous run is inserted; inserting
//! splits the shards between two threads (they are independent), so both
//! cores work. Buffers are bounded: `REBUILD_RUNS` runs and one sorted
//! copy, `REBUILD_BUFFER_BYTES_MAX` in all, whatever the device's size.
//!
//! Why pre-size. An index sized for fewer entries grows shard by shard
//! (1.25x a step, each a rehash); at 100 M entries that cost as much as the
//! inserts. The newest log block tells how many entries a batch of blocks
//! holds; times the blocks the log spans, that estimates the entries to
//! come, and the index makes room for them once, before the first insert
//! (`L2Index::reserve`). A wrong estimate costs memory or growth, never
//! correctness; an index left at under half the load it was sized for is
//! shrunk once the rebuild ends.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::time::Duration;

use super::cache_device::*;
use super::format::{self, BLOCK_BYTES, Compression, LogBlockHeader, LogEntry, LogPointer};
use super::index::IndexEntry;
use super::*;
use crate::buf::AlignedBuf;

/// Most entries staged in one run before it is inserted: 2 Mi entries
/// (48 MiB of `IndexEntry`).
const REBUILD_RUN_ENTRIES_MAX: usize = 1 << 21;
/// Runs in memory at once: one being filled by the reader, one inserted.
const REBUILD_RUNS: usize = 2;
/// Every buffer of a rebuild: the runs and the sorted copy of one, 144 MiB
/// at most (the log blocks in flight add 2 x 16 MiB at most).
pub const REBUILD_BUFFER_BYTES_MAX: usize =
    (REBUILD_RUNS + 1) * REBUILD_RUN_ENTRIES_MAX * size_of::<IndexEntry>();
/// Threads that insert a run, the shards split between them.
const REBUILD_INSERT_THREADS: usize = 2;

/// What restoring runs added up to.
#[derive(Default)]
struct Restored {
    entries: u64,
    precached: u64,
}

/// Orders and inserts runs; owns the sorted copy and the sort's scratch.
struct Restorer<'a> {
    l2: &'a L2Arc,
    device: &'a CacheDevice,
    sorted: Vec<IndexEntry>,
    counts: Vec<u32>,
    restored: Restored,
}

impl<'a> Restorer<'a> {
    fn new(l2: &'a L2Arc, device: &'a CacheDevice) -> Self {
        Restorer {
            l2,
            device,
            sorted: Vec::new(),
            counts: Vec::new(),
            restored: Restored::default(),
        }
    }

    /// Inserts a run (entries in walk order, newest first), each unless a
    /// newer entry for its record is in the index already.
    fn restore_run(&mut self, run: &[IndexEntry]) {
        if run.is_empty() {
            return;
        }
        let index = &self.l2.index;
        index.sort_run(run, &mut self.sorted, &mut self.counts);
        // Under the writer lock, as a feed indexes its batch: `remove_device`
        // marks the device removed, then takes this lock before it forgets
        // the device's entries, so none restored here outlives the device.
        let device = self.device;
        let _writer = device.writer.lock().expect("writer poisoned");
        if device.state.load(Ordering::SeqCst) != STATE_REBUILDING {
            return;
        }
        let inserted = index.insert_sorted_if_absent(&mut self.sorted, REBUILD_INSERT_THREADS);
        // Entries not inserted came back with key_hash 0.
        let (mut plain, mut compressed) = (0u64, 0u64);
        for e in self.sorted.iter().filter(|e| e.key_hash != 0) {
            // As `account_insert` counts it.
            let location = format::Location(e.location);
            if location.compression() == Some(Compression::Off) {
                plain += location.stored_bytes() as u64;
            } else {
                compressed += u64::from(location.asize_blocks()) * BLOCK_BYTES;
            }
        }
        let inserted = inserted as u64;
        let precached = run.len() as u64 - inserted;
        let c = &device.counters;
        c.entries.fetch_add(inserted, Ordering::Relaxed);
        c.asize_plain.fetch_add(plain, Ordering::Relaxed);
        c.asize_compressed.fetch_add(compressed, Ordering::Relaxed);
        c.rebuild_bufs.fetch_add(inserted, Ordering::Relaxed);
        c.rebuild_bufs_precached
            .fetch_add(precached, Ordering::Relaxed);
        self.restored.entries += inserted;
        self.restored.precached += precached;
    }
}

/// Where full runs go: to the inserting thread, or inserted in place when
/// there is no second thread.
enum RunSink<'r, 'a> {
    Channel {
        full: SyncSender<Vec<IndexEntry>>,
        empty: Receiver<Vec<IndexEntry>>,
    },
    Inline(&'r mut Restorer<'a>),
}

/// The reader's side: stages the entries of each good log block in a run
/// and hands full runs on.
struct Stager<'r, 'a> {
    device: &'a CacheDevice,
    run: Vec<IndexEntry>,
    sink: RunSink<'r, 'a>,
    newest_sequence: u64,
    /// Entries the log is estimated to hold (0 until the first block).
    estimate: usize,
}

impl Stager<'_, '_> {
    /// Stages the entries of one log block that the hand has not
    /// overwritten. False if the inserting side has gone.
    fn stage(
        &mut self,
        l2: &L2Arc,
        pointer: LogPointer,
        lb: &LogBlockHeader,
        entries: &[LogEntry],
    ) -> bool {
        if self.newest_sequence == 0 {
            self.newest_sequence = lb.sequence;
            self.estimate = entries_estimate(self.device, pointer, lb);
            l2.index.reserve(l2.index.len() + self.estimate);
        }
        if self.run.len() + entries.len() > REBUILD_RUN_ENTRIES_MAX && !self.flush() {
            return false;
        }
        let device = self.device;
        for entry in entries {
            let location = entry.location.with_device(device.slot);
            if !device.holds_location(location) {
                continue;
            }
            self.run.push(IndexEntry {
                key_hash: entry.key_hash,
                location: location.0,
                checksum: entry.checksum,
            });
        }
        device
            .counters
            .rebuild_log_blks
            .fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Hands the run on and takes an empty one. False if the inserting
    /// side has gone.
    fn flush(&mut self) -> bool {
        if self.run.is_empty() {
            return true;
        }
        match &mut self.sink {
            RunSink::Channel { full, empty } => {
                let run = std::mem::take(&mut self.run);
                if full.send(run).is_err() {
                    return false;
                }
                match empty.recv() {
                    Ok(run) => {
                        self.run = run;
                        true
                    }
                    Err(_) => false,
                }
            }
            RunSink::Inline(restorer) => {
                restorer.restore_run(&self.run);
                self.run.clear();
                true
            }
        }
    }
}

/// Entries the log is likely to hold: those of the newest batch per block
/// of it, times the blocks the log spans (up to the hand in the first lap,
/// the whole data area after). At most one per block.
fn entries_estimate(device: &CacheDevice, pointer: LogPointer, lb: &LogBlockHeader) -> usize {
    let (lap, hand) = device.position();
    let live_blocks = if lap == 0 {
        u64::from(hand.saturating_sub(device.start_block))
    } else {
        device.data_blocks()
    };
    let batch_end_block = pointer.end_bytes() / BLOCK_BYTES;
    let batch_blocks = batch_end_block
        .saturating_sub(u64::from(lb.first_block))
        .max(1);
    let estimate = live_blocks * u64::from(lb.entry_count) / batch_blocks;
    estimate.min(live_blocks) as usize
}

impl L2Arc {
    /// Walks the device's log from the newest block back and restores every
    /// entry the hand has not overwritten, in runs (see the module comment).
    /// Reads are served meanwhile: what is not restored yet is a miss.
    pub(super) fn rebuild(&self, device: &CacheDevice) {
        let started = std::time::Instant::now();
        let newest_log = device
            .writer
            .lock()
            .expect("writer poisoned")
            .header
            .newest_log;
        let mut restorer = Restorer::new(self, device);
        let (newest_sequence, estimate) = std::thread::scope(|scope| {
            let (full_tx, full_rx) = sync_channel::<Vec<IndexEntry>>(1);
            let (empty_tx, empty_rx) = sync_channel::<Vec<IndexEntry>>(REBUILD_RUNS);
            for _ in 1..REBUILD_RUNS {
                empty_tx.send(Vec::new()).expect("the receiver is here");
            }
            let reader = std::thread::Builder::new()
                .name(format!("l2arc-rebuild-read-{}", device.slot))
                .spawn_scoped(scope, move || {
                    let stager = Stager {
                        device,
                        run: Vec::new(),
                        sink: RunSink::Channel {
                            full: full_tx,
                            empty: empty_rx,
                        },
                        newest_sequence: 0,
                        estimate: 0,
                    };
                    self.walk_and_stage(device, newest_log, stager)
                });
            match reader {
                Ok(reader) => {
                    for mut run in full_rx {
                        restorer.restore_run(&run);
                        run.clear();
                        let _ = empty_tx.send(run);
                    }
                    reader.join().expect("the rebuild reader panicked")
                }
                Err(_) => {
                    // No second thread: read and restore in turn.
                    let stager = Stager {
                        device,
                        run: Vec::new(),
                        sink: RunSink::Inline(&mut restorer),
                        newest_sequence: 0,
                        estimate: 0,
                    };
                    self.walk_and_stage(device, newest_log, stager)
                }
            }
        });
        // Sized for far more than came back (a misestimate): shrink the
        // shards left under half full.
        if (restorer.restored.entries as usize) < estimate / 2 {
            self.index.retain(|_| true);
        }
        let c = &device.counters;
        let mut writer = device.writer.lock().expect("writer poisoned");
        writer.log_sequence = newest_sequence;
        if newest_sequence == 0 {
            // The newest log block was unreadable: start a fresh chain rather
            // than point every future rebuild at the bad block.
            writer.header.newest_log = None;
        }
        drop(writer);
        c.rebuild_ns
            .store(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        c.rebuild_success.fetch_add(1, Ordering::Relaxed);
        let _ = device.state.compare_exchange(
            STATE_REBUILDING,
            STATE_ONLINE,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }

    /// Walks the log into `stager` and hands on its last run. Returns the
    /// newest log block's sequence (0 if none was good) and the estimate of
    /// entries the index was sized for.
    fn walk_and_stage(
        &self,
        device: &CacheDevice,
        newest_log: Option<LogPointer>,
        mut stager: Stager<'_, '_>,
    ) -> (u64, usize) {
        self.walk_log(device, newest_log, |pointer, lb, entries| {
            stager.stage(self, pointer, lb, &entries)
        });
        stager.flush();
        (stager.newest_sequence, stager.estimate)
    }

    /// Follows the log from `newest_log` back, checking every log block, and
    /// hands the pointer, header and entries of each good one to `found`,
    /// newest first, until a block fails, lies where the hand has been
    /// since, or `found` returns false.
    pub(super) fn walk_log(
        &self,
        device: &CacheDevice,
        newest_log: Option<LogPointer>,
        mut found: impl FnMut(LogPointer, &LogBlockHeader, Vec<LogEntry>) -> bool,
    ) {
        let c = &device.counters;
        let mut pointer = newest_log;
        let mut expected_sequence: Option<u64> = None;
        let (hand_lap, hand) = device.position();
        // The block and lap of the log block walked last.
        let mut newer: Option<(u32, u32)> = None;
        let mut walked = 0u64;
        let walk_max = device.data_blocks();
        let mut buf = AlignedBuf::zeroed(0);
        while let Some(p) = pointer {
            if self.stopping.load(Ordering::Relaxed)
                || walked >= walk_max
                || device.state.load(Ordering::SeqCst) == STATE_REMOVED
            {
                break;
            }
            walked += 1;
            let block = (p.offset_bytes / BLOCK_BYTES) as u32;
            let blocks = p.size_bytes / BLOCK_BYTES as u32;
            if p.size_bytes == 0
                || u64::from(block) + u64::from(blocks) > u64::from(device.end_block)
            {
                c.rebuild_cksum_lb_errors.fetch_add(1, Ordering::Relaxed);
                break;
            }
            // The log ends at a log block the hand has swept over since it was
            // written, whatever its bytes are now (a later lap's data, or a
            // batch cut short by a crash): judge by position and lap before
            // reading, so that is no checksum error. Blocks rise within a
            // lap, so the lap of the block pointed at is known: the newest
            // lies below the hand unless the hand has just wrapped, and a
            // predecessor lies below its successor unless the lap changed.
            let lap = match newer {
                None if block < hand => hand_lap,
                None => hand_lap.wrapping_sub(1),
                Some((newer_block, newer_lap)) if block < newer_block => newer_lap,
                Some((_, newer_lap)) => newer_lap.wrapping_sub(1),
            };
            if !device.holds(block, lap % 32) || !device.holds(block + blocks - 1, lap % 32) {
                break;
            }
            if buf.capacity_bytes() < p.size_bytes as usize {
                buf = AlignedBuf::zeroed(p.size_bytes as usize);
            }
            buf.set_len(p.size_bytes as usize);
            if device
                .io
                .read_at(p.offset_bytes, buf.as_mut_slice())
                .is_err()
            {
                c.rebuild_io_errors.fetch_add(1, Ordering::Relaxed);
                break;
            }
            if crc32c::crc32c(&buf) != p.crc {
                c.rebuild_cksum_lb_errors.fetch_add(1, Ordering::Relaxed);
                break;
            }
            let (lb, entries) = match format::decode_log_block(&buf, device.guid) {
                Ok(decoded) => decoded,
                Err(_) => {
                    c.rebuild_cksum_lb_errors.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            };
            if expected_sequence.is_some_and(|s| s != lb.sequence) {
                c.rebuild_cksum_lb_errors.fetch_add(1, Ordering::Relaxed);
                break;
            }
            // The log block itself must not have been overwritten.
            if !device.holds(block, lb.lap % 32) || !device.holds(block + blocks - 1, lb.lap % 32) {
                break;
            }
            if !found(p, &lb, entries) {
                break;
            }
            expected_sequence = lb.sequence.checked_sub(1);
            newer = Some((lb.first_block, lb.lap));
            pointer = lb.prev;
        }
    }

    /// True while any device is still rebuilding its index.
    pub fn rebuilding(&self) -> bool {
        self.all_devices()
            .iter()
            .any(|d| d.state.load(Ordering::SeqCst) == STATE_REBUILDING)
    }

    /// Waits (bounded) for every rebuild to finish.
    pub fn wait_for_rebuild(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while self.rebuilding() {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }
}
