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
//! entries to restore into a 1.6 GB table. Inserted in log order, each
//! lands at a random slot: a DRAM miss and, in a VM, a TLB miss walked
//! through two levels of page tables, ~0.5 us each, so 100 M took ~45 s.
//! So the reader stages entries in a run (at most `REBUILD_RUN_ENTRIES_MAX`),
//! and a full run is ordered by shard and home slot (`L2Index::sort_run`, a
//! counting sort into buckets of a few pages of table) and inserted in that
//! order with the home slots of the next entries prefetched: the table is
//! then swept forwards, a few pages at a time, with many misses in flight
//! instead of one. The sort is stable and the walk goes from newest to
//! oldest, so within a run and across runs the first entry met for a key is
//! the newest, and `insert_if_absent` keeps it (for a key's fingerprint, the
//! bits the index keeps of it: of two keys that share one, the newest
//! entry of either wins, and the other is a miss).
//!
//! Why three threads. The reader reads and checks log blocks (CRC,
//! decoding), fills a run and sorts it while the previous run is inserted;
//! inserting splits the shards between two threads (they are independent),
//! so both cores work. Inserting is what bounds the rebuild (each insert
//! still fetches a line or two of table from DRAM), so everything else is
//! kept off the inserting threads. Buffers are bounded: the run being
//! filled and `REBUILD_SORTED_RUNS` sorted runs, `REBUILD_BUFFER_BYTES_MAX`
//! in all, whatever the device's size.
//!
//! Why read ahead. The log is a chain: each block names only the one
//! before it, so a walk that follows `prev` has one read in flight, and a
//! device that reads 80 KiB log blocks at 3,000 a second at queue depth 1
//! (and 8,600 at depth 4) spends 7-9 s on the 24,500 log blocks of 100 M
//! records. So each log block also carries hints to the blocks 2, 3 and 4
//! back (`LogBlockHeader::read_ahead`), and the walk keeps up to
//! `REBUILD_READ_AHEAD_BLOCKS` of them in flight on as many I/O threads. A
//! hint is only a guess at bytes to fetch: the walk still follows `prev`,
//! and takes read-ahead bytes only for the exact pointer it reaches, then
//! checks them as it checks any block. A log written before hints existed
//! is walked one block at a time, as before.
//!
//! Why pre-size. An index sized for fewer entries grows shard by shard
//! (1.25x a step, each a rehash); at 100 M entries that cost as much as the
//! inserts. The newest log block tells how many entries a batch of blocks
//! holds; times the blocks the log spans, that estimates the entries to
//! come, and the index makes room for them once, before the first insert
//! (`L2Index::reserve`). A wrong estimate costs memory or growth, never
//! correctness; an index left at under half the load it was sized for is
//! shrunk once the rebuild ends.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel, sync_channel};
use std::time::Duration;

use super::cache_device::*;
use super::format::{
    self, BLOCK_BYTES, LOG_BLOCK_HEADER_BYTES, LOG_ENTRY_BYTES, LOG_READ_AHEAD_POINTERS,
    LogBlockHeader, LogEntry, LogPointer,
};
use super::index::{IndexEntry, L2Index};
use super::*;
use crate::buf::AlignedBuf;
use crate::lock_order::{RankedMutex, rank};

/// Most entries staged in one run before it is inserted: 2 Mi entries
/// (48 MiB of `IndexEntry`).
const REBUILD_RUN_ENTRIES_MAX: usize = 1 << 21;
/// Sorted runs in memory at once: one being inserted, one sorted by the
/// reader (or waiting), besides the run the reader fills.
const REBUILD_SORTED_RUNS: usize = 2;
/// Every buffer of a rebuild: the run being filled and the sorted ones,
/// 144 MiB at most (log blocks in flight add `REBUILD_READ_AHEAD_BLOCKS` + 3 of at
/// most 84 KiB, or one of 16 MiB from a hostile pointer, checked first).
pub const REBUILD_BUFFER_BYTES_MAX: usize =
    (REBUILD_SORTED_RUNS + 1) * REBUILD_RUN_ENTRIES_MAX * size_of::<IndexEntry>();
/// Threads that insert a run, the shards split between them.
const REBUILD_INSERT_THREADS: usize = 2;
/// Log blocks read ahead of the walk at most (and I/O threads for them):
/// the predecessor and the hints of the block walked last.
const REBUILD_READ_AHEAD_BLOCKS: usize = LOG_READ_AHEAD_POINTERS + 1;
/// Largest log block read ahead: that of a batch of 16 MiB of single-block
/// records (84 KiB). A larger one is read when the walk reaches it.
const REBUILD_READ_AHEAD_BLOCK_BYTES_MAX: usize = (LOG_BLOCK_HEADER_BYTES
    + LOG_ENTRY_BYTES * (BATCH_BYTES_MAX / BLOCK_BYTES) as usize)
    .next_multiple_of(BLOCK_BYTES as usize);

/// What restoring runs added up to.
#[derive(Default)]
struct Restored {
    entries: u64,
    precached: u64,
}

/// Inserts sorted runs into the index.
struct Restorer<'a> {
    l2: &'a L2Arc,
    device: &'a CacheDevice,
    restored: Restored,
}

impl<'a> Restorer<'a> {
    fn new(l2: &'a L2Arc, device: &'a CacheDevice) -> Self {
        // Until its rebuild ends a device is rebuilding, or removed: it goes
        // online (and takes writes) only at the end of `rebuild`.
        debug_assert!(matches!(
            device.state.load(Ordering::SeqCst),
            STATE_REBUILDING | STATE_REMOVED
        ));
        Restorer {
            l2,
            device,
            restored: Restored::default(),
        }
    }

    /// Inserts a run sorted by `L2Index::sort_run` (which keeps the walk
    /// order, newest first, among entries of one record), each unless a
    /// newer entry for its record is in the index already.
    fn restore_sorted(&mut self, sorted: &mut [IndexEntry]) {
        if sorted.is_empty() {
            return;
        }
        let index = &self.l2.index;
        // Under the writer lock, as a feed indexes its batch: `remove_device`
        // marks the device removed, then takes this lock before it forgets
        // the device's entries, so none restored here outlives the device.
        let device = self.device;
        let _writer = device.writer.lock().expect("writer poisoned");
        if device.state.load(Ordering::SeqCst) != STATE_REBUILDING {
            return;
        }
        assert!(
            sorted.len() <= REBUILD_RUN_ENTRIES_MAX,
            "a run over its bound"
        );
        // What goes into the index is what the log said, on this device,
        // not overwritten: the hand does not move while the device
        // rebuilds (only an online device takes batches), so what `stage`
        // kept still holds. O(run): behind `invariants`.
        if cfg!(feature = "invariants") {
            for e in sorted.iter() {
                let location = format::Location(e.location);
                assert_ne!(e.key_hash, 0, "key_hash 0 marks an entry left out");
                assert_eq!(location.device(), device.slot);
                assert!(
                    device.holds_location(location),
                    "restoring an overwritten entry"
                );
            }
        }
        let inserted = index.insert_sorted_if_absent(sorted, REBUILD_INSERT_THREADS);
        assert!(inserted <= sorted.len());
        // Entries not inserted came back with key_hash 0; the others are
        // counted as `account_insert` counts one, all at once.
        device.space.add_all(
            sorted
                .iter()
                .filter(|e| e.key_hash != 0)
                .map(|e| format::Location(e.location)),
        );
        let inserted = inserted as u64;
        let precached = sorted.len() as u64 - inserted;
        let c = &device.counters;
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

/// The reader's side: stages the entries of each good log block in a run,
/// and sorts full runs and hands them on.
struct Stager<'r, 'a> {
    device: &'a CacheDevice,
    index: &'a L2Index,
    run: Vec<IndexEntry>,
    sorted: Vec<IndexEntry>,
    counts: Vec<u32>,
    sink: RunSink<'r, 'a>,
    newest_sequence: u64,
    /// The log blocks before the newest, as the newest names them: the
    /// writer's read-ahead hints when it goes on with the log.
    older_logs: [Option<LogPointer>; LOG_READ_AHEAD_POINTERS],
    /// Entries the log is estimated to hold (0 until the first block).
    estimate: usize,
}

/// What the walk found: the newest log block's sequence (0 if none was
/// good) and the blocks before it, and the entries the index was sized for.
struct Walked {
    newest_sequence: u64,
    older_logs: [Option<LogPointer>; LOG_READ_AHEAD_POINTERS],
    estimate: usize,
}

impl<'r, 'a> Stager<'r, 'a> {
    fn new(device: &'a CacheDevice, index: &'a L2Index, sink: RunSink<'r, 'a>) -> Self {
        const { assert!(REBUILD_SORTED_RUNS >= 1 && REBUILD_RUN_ENTRIES_MAX >= 1) };
        Stager {
            device,
            index,
            run: Vec::new(),
            sorted: Vec::new(),
            counts: Vec::new(),
            sink,
            newest_sequence: 0,
            older_logs: [None; LOG_READ_AHEAD_POINTERS],
            estimate: 0,
        }
    }

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
            self.older_logs = std::array::from_fn(|i| {
                if i == 0 {
                    lb.prev
                } else {
                    lb.read_ahead[i - 1]
                }
            });
            self.estimate = entries_estimate(self.device, pointer, lb);
            l2.index.reserve(l2.index.len() + self.estimate);
        }
        // Newest first, each log block once (`walk_log_with` checked the
        // sequence), and as many entries as its header says.
        debug_assert!(lb.sequence >= 1 && lb.sequence <= self.newest_sequence);
        debug_assert_eq!(lb.entry_count as usize, entries.len());
        if self.run.len() + entries.len() > REBUILD_RUN_ENTRIES_MAX && !self.flush() {
            return false;
        }
        let device = self.device;
        for entry in entries {
            let location = entry.location.with_device(device.slot);
            if !device.holds_location(location) {
                continue;
            }
            debug_assert!(entry.key_hash != 0 && location.device() == device.slot);
            self.run.push(IndexEntry {
                key_hash: entry.key_hash,
                location: location.0,
                checksum: entry.checksum,
            });
        }
        // The run's bound (a log block holds at most a batch's entries).
        assert!(self.run.len() <= REBUILD_RUN_ENTRIES_MAX);
        device
            .counters
            .rebuild_log_blks
            .fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Sorts the run and hands it on, and takes an empty sorted buffer
    /// back. False if the inserting side has gone.
    fn flush(&mut self) -> bool {
        if self.run.is_empty() {
            return true;
        }
        self.index
            .sort_run(&self.run, &mut self.sorted, &mut self.counts);
        // The sort moves entries, never adds or drops one.
        debug_assert_eq!(self.sorted.len(), self.run.len());
        self.run.clear();
        match &mut self.sink {
            RunSink::Channel { full, empty } => {
                let sorted = std::mem::take(&mut self.sorted);
                if full.send(sorted).is_err() {
                    return false;
                }
                match empty.recv() {
                    Ok(sorted) => {
                        self.sorted = sorted;
                        true
                    }
                    Err(_) => false,
                }
            }
            RunSink::Inline(restorer) => {
                restorer.restore_sorted(&mut self.sorted);
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
    assert!(live_blocks <= device.data_blocks());
    estimate.min(live_blocks) as usize
}

/// The read side of the writer's pair (`verify_batch`): a log block
/// `decode_log_block` accepted from `buf`, read at `p`, is as the writer
/// made it. O(entries) behind `invariants`.
fn assert_decoded(p: LogPointer, buf: &[u8], lb: &LogBlockHeader, entries: &[LogEntry]) {
    assert!(lb.sequence >= 1 && buf.len() == p.size_bytes as usize);
    debug_assert_eq!(entries.len(), lb.entry_count as usize);
    if cfg!(feature = "invariants") {
        for e in entries {
            assert_ne!(e.key_hash, 0);
            assert!(e.location.asize_blocks() >= 1);
            assert_eq!(u32::from(e.location.lap_mod32()), lb.lap % 32);
            assert!(e.location.block() >= lb.first_block);
        }
    }
}

/// Reads log blocks for the walk, some of them ahead of it on I/O threads.
struct ReadAhead {
    /// To the I/O threads (none: every read is the walk's own).
    requests: Option<SyncSender<LogPointer>>,
    results: Receiver<(LogPointer, io::Result<AlignedBuf>)>,
    /// Sent to the I/O threads, not back yet.
    pending: Vec<LogPointer>,
    /// Back from the I/O threads, not taken yet.
    ready: Vec<(LogPointer, io::Result<AlignedBuf>)>,
    end_bytes: u64,
}

/// The same block: a read for one serves the other (the walk checks the CRC).
fn same_block(a: &LogPointer, b: &LogPointer) -> bool {
    // Pointers from the log: aligned (`LogPointer::decode` checks it).
    debug_assert!(a.offset_bytes.is_multiple_of(BLOCK_BYTES));
    debug_assert!(b.offset_bytes.is_multiple_of(BLOCK_BYTES));
    a.offset_bytes == b.offset_bytes && a.size_bytes == b.size_bytes
}

fn read_block(device: &CacheDevice, p: LogPointer) -> io::Result<AlignedBuf> {
    // Checked by `LogPointer::decode` and `walk_log_with` (or `want`):
    // whole aligned blocks inside the device's data area, at most a batch.
    assert!(p.offset_bytes.is_multiple_of(BLOCK_BYTES) && p.size_bytes > 0);
    assert!(u64::from(p.size_bytes).is_multiple_of(BLOCK_BYTES));
    assert!(u64::from(p.size_bytes) <= BATCH_BYTES_MAX);
    debug_assert!(p.end_bytes() <= u64::from(device.end_block) * BLOCK_BYTES);
    let mut buf = AlignedBuf::for_overwrite(p.size_bytes as usize);
    device.io.read_at(p.offset_bytes, buf.as_mut_slice())?;
    debug_assert_eq!(buf.len(), p.size_bytes as usize);
    Ok(buf)
}

impl ReadAhead {
    /// The block at `p`: read ahead, or read now.
    fn read(&mut self, device: &CacheDevice, p: LogPointer) -> io::Result<AlignedBuf> {
        // Bounded: at most `REBUILD_READ_AHEAD_BLOCKS` blocks in flight, and
        // kept only those the walk may reach next (its hints).
        debug_assert!(self.pending.len() <= REBUILD_READ_AHEAD_BLOCKS);
        debug_assert!(self.ready.len() <= REBUILD_READ_AHEAD_BLOCKS + LOG_READ_AHEAD_POINTERS + 1);
        if let Some(i) = self.ready.iter().position(|(q, _)| same_block(q, &p)) {
            return self.ready.swap_remove(i).1;
        }
        if self.pending.iter().any(|q| same_block(q, &p)) {
            while let Ok((q, result)) = self.results.recv() {
                self.pending.retain(|r| !same_block(r, &q));
                if same_block(&q, &p) {
                    return result;
                }
                self.ready.push((q, result));
            }
        }
        read_block(device, p)
    }

    /// Starts reads of the blocks the walk may reach next (`wanted`, the
    /// nearest first), and drops what it has read that the walk will not.
    fn want(&mut self, wanted: &[LogPointer]) {
        while let Ok((q, result)) = self.results.try_recv() {
            self.pending.retain(|r| !same_block(r, &q));
            self.ready.push((q, result));
        }
        self.ready
            .retain(|(q, _)| wanted.iter().any(|w| same_block(q, w)));
        let Some(requests) = &self.requests else {
            return;
        };
        for w in wanted {
            if self.pending.len() >= REBUILD_READ_AHEAD_BLOCKS {
                break;
            }
            let known = self.pending.iter().any(|q| same_block(q, w))
                || self.ready.iter().any(|(q, _)| same_block(q, w));
            if known
                || w.size_bytes as usize > REBUILD_READ_AHEAD_BLOCK_BYTES_MAX
                || w.end_bytes() > self.end_bytes
            {
                continue;
            }
            if requests.try_send(*w).is_err() {
                break;
            }
            self.pending.push(*w);
        }
        assert!(self.pending.len() <= REBUILD_READ_AHEAD_BLOCKS);
        debug_assert!(self.pending.iter().all(|q| q.end_bytes() <= self.end_bytes
            && q.size_bytes as usize <= REBUILD_READ_AHEAD_BLOCK_BYTES_MAX));
    }
}

/// An I/O thread of [`ReadAhead`]: reads what it is sent until the walk
/// is over.
fn read_ahead_thread(
    device: &CacheDevice,
    requests: &RankedMutex<Receiver<LogPointer>, { rank::LEAF }>,
    results: Sender<(LogPointer, io::Result<AlignedBuf>)>,
) {
    loop {
        let request = requests.lock().expect("read-ahead queue poisoned").recv();
        let Ok(p) = request else { return };
        // `want` sends only small blocks inside the data area.
        debug_assert!(p.size_bytes as usize <= REBUILD_READ_AHEAD_BLOCK_BYTES_MAX);
        if results.send((p, read_block(device, p))).is_err() {
            return;
        }
    }
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
        let walked = self.restore_log(device, newest_log, &mut restorer);
        // Negative space: no good log block, nothing restored.
        assert!(walked.newest_sequence != 0 || restorer.restored.entries == 0);
        // Sized for far more than came back (a misestimate): shrink the
        // shards left under half full.
        if (restorer.restored.entries as usize) < walked.estimate / 2 {
            self.index.retain(|_| true);
        }
        let c = &device.counters;
        let mut writer = device.writer.lock().expect("writer poisoned");
        writer.log_sequence = walked.newest_sequence;
        writer.older_logs = walked.older_logs;
        if walked.newest_sequence == 0 {
            // The newest log block was unreadable: start a fresh chain rather
            // than point every future rebuild at the bad block.
            writer.header.newest_log = None;
        }
        drop(writer);
        c.rebuild_ns
            .store(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        c.rebuild_success.fetch_add(1, Ordering::Relaxed);
        let online = device
            .state
            .compare_exchange(
                STATE_REBUILDING,
                STATE_ONLINE,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok();
        if online {
            log::info!(
                "cache device {} ({}): rebuilt {} records from {} log blocks in {:.1} s; online",
                device.slot,
                device.io.name(),
                restorer.restored.entries,
                c.rebuild_log_blks.load(Ordering::Relaxed),
                started.elapsed().as_secs_f64()
            );
        }
    }

    /// Walks the log in a reader thread that stages and sorts runs, and
    /// inserts them here as they come (both in turn, without a thread).
    fn restore_log<'a>(
        &'a self,
        device: &'a CacheDevice,
        newest_log: Option<LogPointer>,
        restorer: &mut Restorer<'a>,
    ) -> Walked {
        debug_assert!(newest_log.is_none_or(|p| p.size_bytes > 0));
        std::thread::scope(|scope| {
            let (full_tx, full_rx) = sync_channel::<Vec<IndexEntry>>(1);
            let (empty_tx, empty_rx) = sync_channel::<Vec<IndexEntry>>(REBUILD_SORTED_RUNS);
            for _ in 1..REBUILD_SORTED_RUNS {
                empty_tx.send(Vec::new()).expect("the receiver is here");
            }
            let reader = std::thread::Builder::new()
                .name(format!("l2arc-rebuild-read-{}", device.slot))
                .spawn_scoped(scope, move || {
                    let sink = RunSink::Channel {
                        full: full_tx,
                        empty: empty_rx,
                    };
                    let stager = Stager::new(device, &self.index, sink);
                    self.walk_and_stage(device, newest_log, stager)
                });
            match reader {
                Ok(reader) => {
                    for mut sorted in full_rx {
                        restorer.restore_sorted(&mut sorted);
                        sorted.clear();
                        let _ = empty_tx.send(sorted);
                    }
                    reader.join().expect("the rebuild reader panicked")
                }
                Err(_) => {
                    let stager = Stager::new(device, &self.index, RunSink::Inline(restorer));
                    self.walk_and_stage(device, newest_log, stager)
                }
            }
        })
    }

    /// Walks the log into `stager` and hands on its last run.
    fn walk_and_stage(
        &self,
        device: &CacheDevice,
        newest_log: Option<LogPointer>,
        mut stager: Stager<'_, '_>,
    ) -> Walked {
        self.walk_log(device, newest_log, |pointer, lb, entries| {
            stager.stage(self, pointer, lb, &entries)
        });
        stager.flush();
        // Every staged entry went on (or the restorer has gone).
        debug_assert!(stager.run.is_empty());
        debug_assert!(stager.newest_sequence != 0 || stager.estimate == 0);
        Walked {
            newest_sequence: stager.newest_sequence,
            older_logs: stager.older_logs,
            estimate: stager.estimate,
        }
    }

    /// Follows the log from `newest_log` back, checking every log block, and
    /// hands the pointer, header and entries of each good one to `found`,
    /// newest first, until a block fails, lies where the hand has been
    /// since, or `found` returns false.
    pub(super) fn walk_log(
        &self,
        device: &CacheDevice,
        newest_log: Option<LogPointer>,
        found: impl FnMut(LogPointer, &LogBlockHeader, Vec<LogEntry>) -> bool,
    ) {
        let (request_tx, request_rx) = sync_channel::<LogPointer>(REBUILD_READ_AHEAD_BLOCKS);
        let (result_tx, result_rx) = channel();
        let request_rx = RankedMutex::new(request_rx);
        std::thread::scope(|scope| {
            let mut threads = 0;
            for i in 0..REBUILD_READ_AHEAD_BLOCKS {
                let (request_rx, result_tx) = (&request_rx, result_tx.clone());
                let spawned = std::thread::Builder::new()
                    .name(format!("l2arc-rebuild-io-{}-{i}", device.slot))
                    .spawn_scoped(scope, move || {
                        read_ahead_thread(device, request_rx, result_tx);
                    });
                threads += usize::from(spawned.is_ok());
            }
            drop(result_tx);
            assert!(threads <= REBUILD_READ_AHEAD_BLOCKS);
            let mut ahead = ReadAhead {
                // Without I/O threads, the walk reads every block itself.
                requests: (threads > 0).then_some(request_tx),
                results: result_rx,
                pending: Vec::new(),
                ready: Vec::new(),
                end_bytes: u64::from(device.end_block) * BLOCK_BYTES,
            };
            self.walk_log_with(device, newest_log, &mut ahead, found);
            // Dropping the requests ends the I/O threads.
        });
    }

    fn walk_log_with(
        &self,
        device: &CacheDevice,
        newest_log: Option<LogPointer>,
        ahead: &mut ReadAhead,
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
        while let Some(p) = pointer {
            if self.stopping.load(Ordering::Relaxed)
                || walked >= walk_max
                || device.state.load(Ordering::SeqCst) == STATE_REMOVED
            {
                break;
            }
            walked += 1;
            debug_assert!(walked <= walk_max, "the walk is bounded by the data area");
            let block = (p.offset_bytes / BLOCK_BYTES) as u32;
            let blocks = p.size_bytes / BLOCK_BYTES as u32;
            // No log block is larger than a batch: a larger pointer is
            // corrupt, and would have the walk read that much at once.
            if p.size_bytes == 0
                || u64::from(p.size_bytes) > BATCH_BYTES_MAX
                || p.offset_bytes / BLOCK_BYTES + u64::from(blocks) > u64::from(device.end_block)
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
            let Ok(buf) = ahead.read(device, p) else {
                c.rebuild_io_errors.fetch_add(1, Ordering::Relaxed);
                break;
            };
            if format::log_block_content_crc(&buf) != p.crc {
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
            assert_decoded(p, &buf, &lb, &entries);
            // The log block itself must not have been overwritten.
            if !device.holds(block, lb.lap % 32) || !device.holds(block + blocks - 1, lb.lap % 32) {
                break;
            }
            let wanted: Vec<LogPointer> = std::iter::once(lb.prev)
                .chain(lb.read_ahead)
                .flatten()
                .collect();
            ahead.want(&wanted);
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
        let devices = self.all_devices();
        debug_assert!(devices.len() <= DEVICES_MAX);
        devices
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
