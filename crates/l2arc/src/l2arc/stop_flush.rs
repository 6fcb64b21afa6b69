//! The stop flush: what only DRAM holds goes to flash before a clean stop.
//!
//! Why. The feeder copies records from the ARC's cold ends, a few batches
//! deep, on its own schedule; the hottest records, which the ARC has no
//! reason to let go, are then often in DRAM alone. A stop that drops them
//! throws away exactly what a restart wants back first: measured, a 32 MiB
//! ARC over a 64 MiB image read once and stopped with SIGTERM took 33
//! records from primary storage again after the restart. ZFS has the same
//! hole (its users asked for "flush the ARC to the L2ARC on shutdown" when
//! the L2ARC became persistent, and got a tuning workaround). So a clean
//! stop, once the front end has drained, writes the ARC's eligible records
//! that are not on flash to the cache devices, and the log the restart
//! rebuilds from then names them.
//!
//! Order. What a restart most wants first goes first: the MFU list, then
//! the MRU list, each from its most recently used end (the shards taken in
//! turn), then the write-back queue (records the ARC already let go, the
//! coldest of all). Eligibility is the feeder's: not on flash already, not
//! only read ahead under `l2arc_noprefetch`, not MRU under
//! `l2arc_mfuonly`, and the dataset's `secondarycache` allows it.
//!
//! Bounds. A stop must end, and a unit's stop timeout is waiting: the stop
//! budget (`l2arc_stop_budget_secs`) is checked before each batch. A batch
//! begun is finished (a torn batch is only lost work), and a budget above
//! 0 always begins the first, so a flush overruns its budget by at most one
//! batch per device and a tiny budget still writes the hottest batch. The
//! endurance budget (`l2arc_dwpd`) holds as for any feed: a service
//! restarted every few minutes must not wear its flash out of turn. The
//! device's batch size holds; `l2arc_write_max` does not: it paces a
//! running feeder against readers, and at a stop there are none.
//!
//! Writers. The device feeders are quiet while a flush runs
//! (`L2Arc::stop_flushes`, looked at before each feed and each batch of a
//! burst); a feeder in a burst finishes its batch in flight, and the
//! flush's batches to that device wait for it on the device's commit order.
//! The feed claims (`L2Arc::feeding`) would keep two writers off one record
//! anyway. One thread per online device writes batches through the same
//! path as a feed (laid out, written, its header, then indexed through the
//! stale-write gate), taking candidates from one shared cursor, so that N
//! devices are written side by side.
//!
//! Memory. The candidates are a snapshot of the ARC's keys, its records
//! held weakly: O(records), at most `arc_max / 4 KiB` entries of about 64
//! bytes, made once per stop. A batch holds its records' buffers (no copy:
//! at a stop nothing is reading) until it is written, at most one batch per
//! device.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::cache_device::CacheDevice;
use super::feeder::{FeedClaims, StaleWriteGate};
use super::writeback::Queued;
use super::{FeedRecord, L2Arc};
use crate::arc::live::{Record, RecordKey};
use crate::lock_order::{RankedMutex, rank};
use crate::tier::{ColdRecord, FeedSource, Keeping};

/// What a stop flush did ([`crate::Cache::flush_arc_to_l2`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StopFlush {
    /// Records written to cache devices.
    pub records_written: u64,
    /// Their bytes, as the ARC holds them (before compression).
    pub bytes_written: u64,
    /// Eligible records not on flash when the flush ended (in the ARC or
    /// the write-back queue).
    pub records_left: u64,
    /// Their bytes.
    pub bytes_left: u64,
    /// How long the flush took.
    pub elapsed: Duration,
    /// The stop budget it was given.
    pub budget: Duration,
    /// Why records were left, when some were.
    pub cut: Option<StopFlushCut>,
}

/// Why a stop flush left records unwritten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopFlushCut {
    /// The stop budget ran out (or was 0: no flush).
    Budget,
    /// The endurance budget (`l2arc_dwpd`) had no credit left.
    Dwpd,
    /// No cache device took writes (none online, or each failed a write).
    NoDevice,
}

impl StopFlushCut {
    const NONE: u8 = 0;

    fn code(self) -> u8 {
        let code = match self {
            StopFlushCut::Budget => 1,
            StopFlushCut::Dwpd => 2,
            StopFlushCut::NoDevice => 3,
        };
        debug_assert_ne!(code, Self::NONE);
        code
    }

    fn of_code(code: u8) -> Option<StopFlushCut> {
        debug_assert!(code <= 3);
        match code {
            1 => Some(StopFlushCut::Budget),
            2 => Some(StopFlushCut::Dwpd),
            3 => Some(StopFlushCut::NoDevice),
            _ => None,
        }
    }
}

/// The stop flushes' counters, summed over every flush of this L2ARC.
#[derive(Default)]
pub(crate) struct StopFlushCounters {
    records: AtomicU64,
    bytes: AtomicU64,
    left_records: AtomicU64,
    left_bytes: AtomicU64,
    ms: AtomicU64,
}

impl StopFlushCounters {
    fn add(&self, report: &StopFlush) {
        debug_assert!(report.records_written == 0 || report.bytes_written > 0);
        let add = |c: &AtomicU64, v: u64| c.fetch_add(v, Ordering::Relaxed);
        add(&self.records, report.records_written);
        add(&self.bytes, report.bytes_written);
        add(&self.left_records, report.records_left);
        add(&self.left_bytes, report.bytes_left);
        add(&self.ms, report.elapsed.as_millis() as u64);
    }

    /// Monotonic counters (`crate::stats::kstat_kind`).
    pub(crate) fn kstats(&self) -> [(&'static str, u64); 5] {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let kstats = [
            ("l2_stop_flush_records", get(&self.records)),
            ("l2_stop_flush_bytes", get(&self.bytes)),
            ("l2_stop_flush_left_records", get(&self.left_records)),
            ("l2_stop_flush_left_bytes", get(&self.left_bytes)),
            ("l2_stop_flush_ms", get(&self.ms)),
        ];
        debug_assert!(kstats.iter().all(|(n, _)| n.starts_with("l2_stop_flush_")));
        kstats
    }
}

/// Keeps the device feeders quiet while it lives.
struct QuietFeeders<'a>(&'a L2Arc);

impl Drop for QuietFeeders<'_> {
    fn drop(&mut self) {
        let before = self.0.stop_flushes.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(before >= 1, "a flush ended that never began");
    }
}

/// A record a flush worker has claimed and holds, not yet written.
struct Held {
    key_hash: u64,
    key: RecordKey,
    record: Arc<Record>,
    keeping: Keeping,
    /// The invalidation sequence its bytes are known good at.
    since: u64,
    from: HeldFrom,
}

/// Where a held record came from, and where it goes back if unwritten.
#[derive(Clone, Copy, PartialEq, Eq)]
enum HeldFrom {
    /// The ARC snapshot, at this index (back to `Flush::returned`).
    Candidate(usize),
    /// The write-back queue (back to its front).
    Queue,
}

/// One flush: the candidates, the cursor the device workers share, and
/// what they did.
struct Flush<'a> {
    l2: &'a L2Arc,
    source: &'a dyn FeedSource,
    candidates: Vec<ColdRecord>,
    /// The next candidate to take (may run past the end).
    next: AtomicUsize,
    /// Candidates a worker took and gave back unwritten (its device
    /// failed or left): taken again before the cursor's, by any worker.
    returned: RankedMutex<Vec<usize>, { rank::LEAF }>,
    deadline: Instant,
    /// Batches begun by every worker.
    batches_begun: AtomicU64,
    noprefetch: bool,
    records_written: AtomicU64,
    bytes_written: AtomicU64,
    /// The first reason a worker stopped short (`StopFlushCut::code`).
    cut: AtomicU8,
}

impl L2Arc {
    /// Whether a stop flush is running (the device feeders stay quiet).
    pub(crate) fn stop_flush_running(&self) -> bool {
        let flushes = self.stop_flushes.load(Ordering::SeqCst);
        debug_assert!(flushes < 1 << 16, "flushes are few");
        flushes > 0
    }

    /// The stop flush of `source`'s ARC to this L2ARC (see the module
    /// comment), within `budget`; counted in `l2_stop_flush_*`.
    pub(crate) fn flush_from(&self, source: &dyn FeedSource, budget: Duration) -> StopFlush {
        let started = Instant::now();
        self.stop_flushes.fetch_add(1, Ordering::SeqCst);
        let _quiet = QuietFeeders(self);
        let config = self.live_config();
        let mut candidates = Vec::new();
        source.checked_resident_records(config.l2arc_mfuonly, &mut candidates);
        let flush = Flush {
            l2: self,
            source,
            candidates,
            next: AtomicUsize::new(0),
            returned: RankedMutex::new(Vec::new()),
            deadline: started + budget,
            batches_begun: AtomicU64::new(0),
            noprefetch: config.l2arc_noprefetch,
            records_written: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            cut: AtomicU8::new(StopFlushCut::NONE),
        };
        let online: Vec<Arc<CacheDevice>> = self
            .all_devices()
            .into_iter()
            .filter(|d| d.is_online())
            .collect();
        if budget.is_zero() {
            flush.note_cut(StopFlushCut::Budget);
        } else if online.is_empty() {
            flush.note_cut(StopFlushCut::NoDevice);
        } else {
            flush.write_devices(&online);
        }
        let (left_records, left_bytes) = flush.left();
        let cut = StopFlushCut::of_code(flush.cut.load(Ordering::SeqCst));
        let report = StopFlush {
            records_written: flush.records_written.load(Ordering::SeqCst),
            bytes_written: flush.bytes_written.load(Ordering::SeqCst),
            records_left: left_records,
            bytes_left: left_bytes,
            elapsed: started.elapsed(),
            budget,
            // A reason only for records left; devices that all failed
            // with nothing left to write left nothing.
            cut: if left_records > 0 {
                cut.or(Some(StopFlushCut::NoDevice))
            } else {
                None
            },
        };
        self.stop_flush_counters.add(&report);
        // A budget of 0 writes nothing.
        debug_assert!(!budget.is_zero() || report.records_written == 0);
        report
    }

    /// Bytes a stop flush may write to `device` in its next batch: its
    /// batch size, capped by the endurance budget (not `l2arc_write_max`).
    fn stop_batch_bytes_for(&self, device: &CacheDevice) -> u64 {
        if !device.is_online() {
            return 0;
        }
        let batch_bytes = u64::from(device.batch_blocks_max) * super::format::BLOCK_BYTES;
        let budget = self.endurance_capped_bytes(batch_bytes);
        assert!(budget <= batch_bytes);
        budget
    }
}

impl Flush<'_> {
    /// Notes why the flush stopped short; the first reason is kept.
    fn note_cut(&self, cut: StopFlushCut) {
        let _ = self.cut.compare_exchange(
            StopFlushCut::NONE,
            cut.code(),
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        debug_assert_ne!(self.cut.load(Ordering::SeqCst), StopFlushCut::NONE);
    }

    /// Whether a worker may begin a batch now: before the deadline, or
    /// past it if no batch has begun yet (a budget above 0 writes one).
    fn may_begin_batch(&self) -> bool {
        if Instant::now() < self.deadline {
            self.batches_begun.fetch_add(1, Ordering::SeqCst);
            return true;
        }
        let first = self
            .batches_begun
            .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        debug_assert!(self.batches_begun.load(Ordering::SeqCst) >= 1);
        first
    }

    /// One worker per device, side by side (the first on this thread).
    fn write_devices(&self, devices: &[Arc<CacheDevice>]) {
        assert!(!devices.is_empty());
        let (first, others) = devices.split_first().expect("one device at least");
        std::thread::scope(|scope| {
            let mut workers = Vec::new();
            let mut inline = Vec::new();
            for device in others {
                let spawned = std::thread::Builder::new()
                    .name(format!("l2arc-stop-{}", device.slot))
                    .spawn_scoped(scope, || self.write_device(device));
                match spawned {
                    Ok(worker) => workers.push(worker),
                    // No thread: that device is written after the first.
                    Err(_) => inline.push(device),
                }
            }
            self.write_device(first);
            for device in inline {
                self.write_device(device);
            }
            for worker in workers {
                worker.join().expect("a stop flush worker panicked");
            }
        });
        // What the workers gave back names candidates, each taken before.
        let next = self.next.load(Ordering::SeqCst);
        debug_assert!(
            self.returned
                .lock()
                .expect("returned poisoned")
                .iter()
                .all(|&at| at < self.candidates.len() && at < next)
        );
    }

    /// Writes batches to `device` until the candidates run out, a budget
    /// does, or the device stops taking writes; then gives back what it
    /// holds unwritten (`give_back`).
    fn write_device(&self, device: &CacheDevice) {
        let mut claims = FeedClaims::new(self.l2);
        let mut carry: Vec<Held> = Vec::new();
        loop {
            let batch_bytes = self.l2.stop_batch_bytes_for(device);
            if !device.is_online() {
                break;
            }
            if batch_bytes == 0 {
                self.note_cut(StopFlushCut::Dwpd);
                break;
            }
            if !self.may_begin_batch() {
                self.note_cut(StopFlushCut::Budget);
                break;
            }
            let batch = self.select(batch_bytes, &mut carry, &mut claims);
            if batch.is_empty() {
                break; // every candidate taken
            }
            match self.write_batch(device, &batch, &mut claims) {
                Some(written) => {
                    carry = batch.into_iter().skip(written).collect();
                }
                None => {
                    // A failed write (the device counted it) or a device
                    // gone offline: another device may take its records.
                    carry = batch;
                    break;
                }
            }
        }
        self.give_back(carry, &mut claims);
    }

    /// Puts records a worker holds unwritten back where others find them:
    /// ARC records to `returned`, queued ones to the write-back queue's
    /// front (their claims let go first, as a feed does).
    fn give_back(&self, held: Vec<Held>, claims: &mut FeedClaims<'_>) {
        let (queued, arc): (Vec<Held>, Vec<Held>) =
            held.into_iter().partition(|h| h.from == HeldFrom::Queue);
        claims.release(arc.iter().map(|h| h.key_hash));
        let mut returned = self.returned.lock().expect("returned poisoned");
        for h in &arc {
            let HeldFrom::Candidate(at) = h.from else {
                unreachable!("partitioned");
            };
            debug_assert!(at < self.candidates.len());
            returned.push(at);
        }
        drop(returned);
        self.requeue(queued, claims);
    }

    /// The next batch: the records carried from the last one first, then
    /// candidates from the shared cursor, then the write-back queue, up to
    /// `batch_bytes` (plus one record).
    fn select(
        &self,
        batch_bytes: u64,
        carry: &mut Vec<Held>,
        claims: &mut FeedClaims<'_>,
    ) -> Vec<Held> {
        let mut batch = std::mem::take(carry);
        let mut bytes: u64 = batch.iter().map(|h| h.record.data.len() as u64).sum();
        // Taken before any buffer is: a write after it is seen by the gate.
        let since = self.source.write_sequence();
        while bytes < batch_bytes {
            // Given back by a worker whose device failed, else the next.
            let returned = self.returned.lock().expect("returned poisoned").pop();
            let at = returned.unwrap_or_else(|| self.next.fetch_add(1, Ordering::SeqCst));
            if at >= self.candidates.len() {
                break;
            }
            if let Some(held) = self.claim_candidate(at, since, claims) {
                bytes += held.record.data.len() as u64;
                batch.push(held);
            }
        }
        if bytes < batch_bytes {
            let mut queued = Vec::new();
            let _in_transit = self.l2.begin_transit();
            self.l2.writeback.take(batch_bytes - bytes, &mut queued);
            for Queued {
                key,
                key_hash,
                record,
                keeping,
            } in queued
            {
                if !claims.claim(key_hash) {
                    continue; // on flash meanwhile, or another writer has it
                }
                batch.push(Held {
                    key_hash,
                    key,
                    since: record.fill_sequence,
                    record,
                    keeping,
                    from: HeldFrom::Queue,
                });
            }
        }
        // One claim for each record held.
        debug_assert!(batch.iter().all(|h| h.key_hash != 0));
        batch
    }

    /// The candidate, claimed and held, if it is still resident, eligible
    /// (the feeder's rules) and not on flash.
    fn claim_candidate(&self, at: usize, since: u64, claims: &mut FeedClaims<'_>) -> Option<Held> {
        let candidate = &self.candidates[at];
        let record = self.eligible(candidate)?;
        let key_hash = candidate
            .keeping
            .key_hash(&candidate.key, record.generation_token);
        if !claims.claim(key_hash) {
            return None;
        }
        debug_assert!(!record.data.is_empty());
        Some(Held {
            key_hash,
            key: candidate.key,
            record,
            keeping: candidate.keeping,
            since,
            from: HeldFrom::Candidate(at),
        })
    }

    /// The candidate's record if it is resident and the feeder would take
    /// it (`l2arc_mfuonly` was applied to the snapshot).
    fn eligible(&self, candidate: &ColdRecord) -> Option<Arc<Record>> {
        // Evicted since the snapshot: in the write-back queue, or gone.
        let record = candidate.record.upgrade()?;
        let only_read_ahead = candidate.prefetched && self.noprefetch;
        let eligible = !record.data.is_empty() && !only_read_ahead && candidate.keeping.below_arc;
        debug_assert!(
            record.data.len() as u64
                <= u64::from(super::format::MAX_ASIZE_BLOCKS) * super::format::BLOCK_BYTES
        );
        eligible.then_some(record)
    }

    /// Writes `batch` (a prefix of it that fits) to `device` and indexes
    /// what no write made stale; `None` if the write failed or the device
    /// took nothing.
    fn write_batch(
        &self,
        device: &CacheDevice,
        batch: &[Held],
        claims: &mut FeedClaims<'_>,
    ) -> Option<usize> {
        assert!(!batch.is_empty());
        let records: Vec<FeedRecord<'_>> = batch
            .iter()
            .map(|h| FeedRecord {
                key_hash: h.key_hash,
                data: &h.record.data,
                compression: h.keeping.compression,
                sector_table_min_bytes: h.keeping.sector_table_min_bytes,
            })
            .collect();
        let keys: Vec<RecordKey> = batch.iter().map(|h| h.key).collect();
        let since: Vec<u64> = batch.iter().map(|h| h.since).collect();
        let mut gate = StaleWriteGate {
            source: self.source,
            keys: &keys,
            since: &since,
        };
        let (_, written) = self
            .l2
            .write_batch_gated_to(device, &records, &mut gate)
            .ok()?;
        if written == 0 {
            return None;
        }
        assert!(written <= batch.len());
        let bytes: u64 = batch[..written]
            .iter()
            .map(|h| h.record.data.len() as u64)
            .sum();
        self.records_written
            .fetch_add(written as u64, Ordering::SeqCst);
        self.bytes_written.fetch_add(bytes, Ordering::SeqCst);
        // Indexed (or left out as stale): no longer this flush's to write.
        claims.release(batch[..written].iter().map(|h| h.key_hash));
        Some(written)
    }

    /// Puts records taken off the write-back queue and not written back
    /// at its front (their claims let go first, as a feed does).
    fn requeue(&self, queued: Vec<Held>, claims: &mut FeedClaims<'_>) {
        if queued.is_empty() {
            return;
        }
        debug_assert!(queued.iter().all(|h| h.from == HeldFrom::Queue));
        let _in_transit = self.l2.begin_transit();
        claims.release(queued.iter().map(|h| h.key_hash));
        let requeue = queued
            .into_iter()
            .map(|h| Queued {
                key: h.key,
                key_hash: h.key_hash,
                record: h.record,
                keeping: h.keeping,
            })
            .collect();
        let skipped = self.l2.writeback.requeue_front(requeue);
        self.l2
            .evict_counters
            .skip
            .fetch_add(skipped, Ordering::Relaxed);
    }

    /// The eligible records not on flash once the workers are done: the
    /// candidates no worker took or that were given back, and the
    /// write-back queue.
    fn left(&self) -> (u64, u64) {
        let (mut records, mut bytes) = (0u64, 0u64);
        let from = self.next.load(Ordering::SeqCst).min(self.candidates.len());
        let returned = std::mem::take(&mut *self.returned.lock().expect("returned poisoned"));
        let untaken = self.candidates[from..].iter();
        for candidate in untaken.chain(returned.iter().map(|&at| &self.candidates[at])) {
            let Some(record) = self.eligible(candidate) else {
                continue;
            };
            let key_hash = candidate
                .keeping
                .key_hash(&candidate.key, record.generation_token);
            if !self.l2.contains(key_hash) {
                records += 1;
                bytes += record.data.len() as u64;
            }
        }
        let (queued_records, queued_bytes) = self.l2.writeback.held_records();
        // A record counts once: no worker holds one any more.
        debug_assert!(records <= self.candidates.len() as u64);
        (records + queued_records, bytes + queued_bytes)
    }
}
