//! Write-back of evicted records: what the ARC lets go reaches flash.
//!
//! Why. The feeder copies records from the ARC's cold ends, but a feed
//! takes time (a 16 MiB batch is tens of milliseconds of copying,
//! checksumming and writing) and an ARC that turns over faster than that
//! evicts records between two feeds that no feed ever saw: ZFS's L2ARC loses
//! them, which is why it warms slowly. Here an eviction of a record that is
//! eligible for the L2ARC and not on flash yet hands the record itself (its
//! shared buffer, no copy) to a bounded queue; the feeder writes the queue
//! first, oldest first, and is woken as soon as a quarter of a batch waits.
//! The records are already out of the ARC, so holding them blocks nothing.
//! A record the ARC turns away on insert (every eviction candidate of its
//! shard is being read, as under many concurrent readers) counts as let go
//! at once and comes here too: otherwise such bursts would keep exactly
//! the records they read off flash for good. A queued record that a batch
//! has no room for (a sector table or the log block took it) goes back to
//! the front of the queue, not away.
//!
//! Bounds. The queue holds at most `l2arc_writeback_max` bytes of buffers
//! (DRAM on top of `arc_max`, stated in the memory budget); past that an
//! eligible record is skipped (`evict_l2_skip`) — the feeder is a pressure
//! valve, never a stall, and eviction never waits for flash.
//!
//! Counters, in bytes, under ZFS's arcstats names: `evict_l2_cached`
//! (evicted, already on flash), `evict_l2_eligible` (evicted, could go to
//! flash, was not there; split `_mfu`/`_mru`), `evict_l2_ineligible`
//! (evicted, not for flash: `secondarycache=none`, prefetch-only under
//! `l2arc_noprefetch`, MRU under `l2arc_mfuonly`), `evict_l2_skip` (eligible
//! but dropped: the queue was full or no device takes writes). Eligible
//! bytes that were queued are `evict_l2_queued`; their ratio to
//! `evict_l2_eligible` is the share of what the ARC let go that the L2ARC
//! kept.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::arc::live::{Record, RecordKey};
use crate::lock_order::{RankedMutex, rank};
use crate::tier::Keeping;

/// Eviction counters (bytes), as ZFS names them.
#[derive(Default)]
pub(crate) struct EvictCounters {
    pub(crate) cached: AtomicU64,
    pub(crate) eligible: AtomicU64,
    pub(crate) eligible_mfu: AtomicU64,
    pub(crate) eligible_mru: AtomicU64,
    pub(crate) ineligible: AtomicU64,
    pub(crate) skip: AtomicU64,
    pub(crate) queued: AtomicU64,
}

impl EvictCounters {
    pub(crate) fn kstats(&self) -> [(&'static str, u64); 7] {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let kstats = [
            ("evict_l2_cached", get(&self.cached)),
            ("evict_l2_eligible", get(&self.eligible)),
            ("evict_l2_eligible_mfu", get(&self.eligible_mfu)),
            ("evict_l2_eligible_mru", get(&self.eligible_mru)),
            ("evict_l2_ineligible", get(&self.ineligible)),
            ("evict_l2_skip", get(&self.skip)),
            ("evict_l2_queued", get(&self.queued)),
        ];
        // Under ZFS's arcstats names.
        debug_assert!(kstats.iter().all(|(name, _)| name.starts_with("evict_l2_")));
        kstats
    }
}

/// An evicted record waiting for the feeder.
pub(crate) struct Queued {
    pub(crate) key: RecordKey,
    pub(crate) key_hash: u64,
    pub(crate) record: Arc<Record>,
    /// How its dataset wants it stored.
    pub(crate) keeping: Keeping,
}

/// The bounded queue of evicted records (see the module comment).
pub(crate) struct WriteBack {
    queue: RankedMutex<(VecDeque<Queued>, u64), { rank::LEAF }>,
    bytes_max: u64,
    /// Bytes queued at which the feeder is woken.
    wake_bytes: u64,
}

impl WriteBack {
    pub(crate) fn new(bytes_max: u64, wake_bytes: u64) -> Self {
        let writeback = Self {
            queue: RankedMutex::new((VecDeque::new(), 0)),
            bytes_max,
            wake_bytes: wake_bytes.max(1),
        };
        debug_assert!(writeback.wake_bytes > 0);
        writeback
    }

    /// Queues a record if there is room; returns whether it was queued and
    /// whether the feeder should be woken.
    pub(super) fn push(&self, queued: Queued) -> (bool, bool) {
        let bytes = queued.record.data.len() as u64;
        let mut guard = self.queue.lock().expect("write-back queue poisoned");
        let (records, held_bytes) = &mut *guard;
        if *held_bytes + bytes > self.bytes_max {
            return (false, false);
        }
        let before = *held_bytes;
        *held_bytes += bytes;
        records.push_back(queued);
        // Held bytes ≤ the bound (the sum check is in `held_bytes`).
        debug_assert!(*held_bytes <= self.bytes_max);
        (
            true,
            before < self.wake_bytes && *held_bytes >= self.wake_bytes,
        )
    }

    /// Takes queued records, oldest first, up to `budget_bytes` (at least
    /// one if any is queued).
    pub(crate) fn take(&self, budget_bytes: u64, out: &mut Vec<Queued>) {
        let mut guard = self.queue.lock().expect("write-back queue poisoned");
        let (records, held_bytes) = &mut *guard;
        let mut taken = 0u64;
        let out_before = out.len();
        while let Some(front) = records.front() {
            let bytes = front.record.data.len() as u64;
            if taken > 0 && taken + bytes > budget_bytes {
                break;
            }
            taken += bytes;
            *held_bytes -= bytes;
            out.push(records.pop_front().expect("front exists"));
        }
        // Within the budget, or one record that is larger by itself; and
        // an empty queue holds nothing.
        debug_assert!(taken <= budget_bytes || out.len() - out_before == 1);
        debug_assert!(!records.is_empty() || *held_bytes == 0);
    }

    /// Puts back, in front and in their order, evicted records a feed took
    /// but could not fit in its batch, as far as the bound allows; returns
    /// the bytes that did not fit (the caller counts them skipped).
    pub(crate) fn requeue_front(&self, records: Vec<Queued>) -> u64 {
        let mut guard = self.queue.lock().expect("write-back queue poisoned");
        let (queue, held_bytes) = &mut *guard;
        let mut skipped = 0u64;
        for queued in records.into_iter().rev() {
            let bytes = queued.record.data.len() as u64;
            if *held_bytes + bytes > self.bytes_max {
                skipped += bytes;
                continue;
            }
            *held_bytes += bytes;
            queue.push_front(queued);
        }
        debug_assert!(*held_bytes <= self.bytes_max);
        debug_assert_eq!(
            *held_bytes,
            queue
                .iter()
                .map(|q| q.record.data.len() as u64)
                .sum::<u64>(),
            "held = the sum of its records"
        );
        skipped
    }

    /// Records the queue holds, and their bytes.
    pub(crate) fn held_records(&self) -> (u64, u64) {
        let guard = self.queue.lock().expect("write-back queue poisoned");
        debug_assert!(guard.1 <= self.bytes_max);
        (guard.0.len() as u64, guard.1)
    }

    /// Bytes of buffers the queue holds.
    pub(crate) fn held_bytes(&self) -> u64 {
        let guard = self.queue.lock().expect("write-back queue poisoned");
        // The bound holds, and held bytes are its records' (O(records)).
        debug_assert!(guard.1 <= self.bytes_max);
        debug_assert_eq!(
            guard.1,
            guard
                .0
                .iter()
                .map(|q| q.record.data.len() as u64)
                .sum::<u64>()
        );
        guard.1
    }
}
