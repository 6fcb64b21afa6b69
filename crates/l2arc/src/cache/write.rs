//! Writes and holes through the cache, and the log of recent ones that
//! feeds in flight check.
//!
//! A write goes to primary storage first, then drops the records it
//! touched from every tier, then adopts the object's new generation without
//! a new token: untouched records stay valid. A feed that copied a record
//! before a write and indexes it after would make a stale record findable;
//! so each write is logged (bounded, `INVALIDATIONS_KEPT`) under the lock
//! a feed holds while it decides what of its batch to index, and the feed
//! leaves out what a later write touched (`admit_unwritten`).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use std::collections::VecDeque;

use super::Cache;
use super::objects::*;
use crate::arc::live::RecordKey;
use crate::hash::{FastBuildHasher, hash_one};
use crate::tier::record_key_hash;

/// How many recent invalidations a feed can look back on.
pub(super) const INVALIDATIONS_KEPT: usize = 4096;

/// One write (or hole) through the cache, as feeds see it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Invalidation {
    pub(super) sequence: u64,
    /// Hash of (dataset, object).
    pub(super) object_hash: u64,
    /// The records it dropped, first and last (inclusive).
    pub(super) records: (u64, u64),
}

/// Recent writes, for feeds that raced with them (see the module comment).
#[derive(Default)]
pub(super) struct Invalidations {
    pub(super) sequence: u64,
    /// Recent writes, oldest first.
    pub(super) recent: VecDeque<Invalidation>,
}

/// Logs a write to records `first..=last` of an object for feeds in flight
/// (see `feed_l2arc`), and publishes the new sequence.
pub(super) fn note_invalidation(
    invalidations: &mut Invalidations,
    published: &AtomicU64,
    handle: &ObjectHandle,
    records: (u64, u64),
) {
    let object_hash = hash_one(&(handle.dataset_id.0, handle.state.id));
    debug_assert!(records.0 <= records.1, "first and last, in order");
    invalidations.sequence += 1;
    let sequence = invalidations.sequence;
    if invalidations.recent.len() == INVALIDATIONS_KEPT {
        invalidations.recent.pop_front();
    }
    invalidations.recent.push_back(Invalidation {
        sequence,
        object_hash,
        records,
    });
    published.store(sequence, Ordering::Release);
    // Bounded, and in sequence order, the newest last.
    debug_assert!(invalidations.recent.len() <= INVALIDATIONS_KEPT);
    debug_assert!(
        invalidations
            .recent
            .iter()
            .rev()
            .nth(1)
            .is_none_or(|previous| previous.sequence < sequence)
    );
}

impl Cache {
    /// Writes through to primary storage, then drops every cached record the
    /// write touched (and the old last record, whose short length the write
    /// may have made wrong).
    pub fn write(&self, handle: &ObjectHandle, offset: u64, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let _in_flight = WriteInFlight::new(&handle.state);
        // While it lives, `revalidate` leaves a moved generation to us.
        debug_assert!(handle.state.writes_in_flight.load(Ordering::Acquire) > 0);
        let old_size_bytes = handle.size_bytes();
        if let Err(e) = handle.object.write_at(offset, data) {
            // Part of it may have landed (ENOSPC, EIO, end of a device):
            // drop every record of the object rather than serve old bytes.
            self.invalidate_object(handle);
            return Err(e);
        }
        self.drop_changed_range(handle, offset, data.len() as u64, old_size_bytes)?;
        self.counters.writes.add(1);
        self.counters.write_bytes.add(data.len() as u64);
        Ok(())
    }

    /// Punches a hole in primary storage (TRIM, discard: the range then
    /// reads as zeros, the size stays), then drops every cached record the
    /// hole touched, exactly as [`Self::write`] does. A primary that cannot
    /// punch holes returns `ErrorKind::Unsupported` and nothing changes.
    pub fn discard(&self, handle: &ObjectHandle, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        if offset.checked_add(len).is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("discard {offset}+{len} is beyond the largest offset"),
            ));
        }
        let _in_flight = WriteInFlight::new(&handle.state);
        debug_assert!(handle.state.writes_in_flight.load(Ordering::Acquire) > 0);
        let old_size_bytes = handle.size_bytes();
        if let Err(e) = handle.object.punch_hole(offset, len) {
            if e.kind() != io::ErrorKind::Unsupported {
                // Part of the range may be gone already: trust no record.
                self.invalidate_object(handle);
            }
            return Err(e);
        }
        self.drop_changed_range(handle, offset, len, old_size_bytes)
    }

    /// After primary storage changed `len` bytes at `offset` (a write or a
    /// hole; `len` > 0): drops the records that cover them from both tiers
    /// and adopts the object's new generation without a new token.
    pub(super) fn drop_changed_range(
        &self,
        handle: &ObjectHandle,
        offset: u64,
        len: u64,
        old_size_bytes: u64,
    ) -> io::Result<()> {
        debug_assert!(len > 0);
        let recordsize = u64::from(handle.dataset.config.recordsize_bytes);
        let end = offset.saturating_add(len);
        let first = offset / recordsize;
        let last = (end - 1) / recordsize;
        debug_assert!(first <= last);
        // A short old last record grows with a write past the old end: its
        // cached copies are wrong then. Records beyond the old end were
        // never cached.
        let old_last = (end > old_size_bytes && !old_size_bytes.is_multiple_of(recordsize))
            .then(|| old_size_bytes / recordsize);
        let token = handle.state.token.load(Ordering::Acquire);
        {
            // Under the lock a feed holds while it indexes a batch: a feed
            // either indexed its copies before (and they are dropped here) or
            // sees this write and indexes none of this object's records.
            let mut invalidations = self.invalidations.lock().expect("invalidations poisoned");
            let dropped = (
                old_last.unwrap_or(first).min(first),
                last.max(old_last.unwrap_or(last)),
            );
            note_invalidation(
                &mut invalidations,
                &self.invalidation_sequence,
                handle,
                dropped,
            );
            // Published under the lock: readers of either see the same.
            debug_assert_eq!(
                self.invalidation_sequence.load(Ordering::Acquire),
                invalidations.sequence
            );
            debug_assert!(dropped.0 <= first && last <= dropped.1);
            for record in old_last.into_iter().chain(first..=last) {
                self.drop_record(handle, record, token);
            }
        }
        let info = handle.object.info()?;
        self.adopt(handle, info, false);
        Ok(())
    }

    /// Drops one record from the tiers below and the ARC. In that order: a fill
    /// that read the flash copy before it was dropped was claimed before
    /// the ARC invalidation, which dooms it, so it never enters the ARC.
    pub(super) fn drop_record(&self, handle: &ObjectHandle, record: u64, token: u64) {
        // A record of the object: its offset does not overflow.
        debug_assert!(
            record
                .checked_mul(u64::from(handle.dataset.config.recordsize_bytes))
                .is_some()
        );
        self.drop_below(record_key_hash(
            handle.dataset.uid,
            handle.state.id,
            record,
            token,
        ));
        self.arc.invalidate(RecordKey {
            dataset: handle.dataset_id.0,
            object: handle.state.id,
            record,
        });
    }

    /// Makes written data durable on primary storage.
    pub fn sync(&self, handle: &ObjectHandle) -> io::Result<()> {
        // What a sync makes durable was written through a handle whose
        // dataset passed its checks.
        debug_assert!(handle.dataset.config.validate().is_ok());
        handle.object.sync()
    }

    /// The stale-write gate of a feed (`FeedSource::admit_unwritten`):
    /// under the invalidation lock, which writes hold while they drop
    /// their records, flags each of `keys[..records]` that no write since
    /// `since[i]` touched, and lets `index` index them before the lock is
    /// let go. The log is bounded: a record older than its oldest entry
    /// may have been written without a trace, so none of those is indexed.
    pub(super) fn admit_unwritten_records(
        &self,
        keys: &[RecordKey],
        since: &[u64],
        records: usize,
        index: &mut dyn FnMut(&[bool]),
    ) {
        assert!(records <= keys.len() && keys.len() == since.len());
        let invalidations = self.invalidations.lock().expect("invalidations poisoned");
        let oldest_logged = invalidations.recent.front().map(|i| i.sequence);
        let since_min = since[..records].iter().copied().min().unwrap_or(0);
        let mut written: std::collections::HashMap<u64, Vec<Invalidation>, FastBuildHasher> =
            std::collections::HashMap::default();
        for invalidation in invalidations
            .recent
            .iter()
            .filter(|i| i.sequence > since_min)
        {
            written
                .entry(invalidation.object_hash)
                .or_default()
                .push(*invalidation);
        }
        let keep: Vec<bool> = keys[..records]
            .iter()
            .zip(since)
            .map(|(key, &since)| {
                let lost_track = oldest_logged.is_some_and(|oldest| oldest > since + 1);
                let touched = written
                    .get(&hash_one(&(key.dataset, key.object)))
                    .is_some_and(|list| {
                        list.iter().any(|i| {
                            i.sequence > since && (i.records.0..=i.records.1).contains(&key.record)
                        })
                    });
                !(lost_track || touched)
            })
            .collect();
        assert_eq!(keep.len(), records);
        index(&keep);
    }
}
