//! The bucket's read-ahead: whole windows claimed as spans, one GET each.
//!
//! Read-ahead is where the GETs go, so it is shaped by them: a sequential
//! reader gets its whole window at once (`ReadAhead::at_once`), claimed on
//! the request thread before the demand read looks its records up
//! (`Cache::claim_span`), in spans of whole records (`readahead_span_bytes`,
//! 64 MiB) that a pool of threads fills, one streamed GET each
//! (`ClaimedSpan::fill`); a span is claimed only when a thread is free for
//! it, never left to wait in a queue with its reader waiting on it. The
//! demand read waits on the span's first record instead of issuing a GET
//! of its own, and each record is served as soon as its bytes are in: a
//! cold sequential read costs one GET per window, as a streaming client's
//! one GET per object. A span is paced to its reader (`l2arc::Pace`): it
//! runs at most a quarter of the window, and at most an eighth of
//! `arc_max`, ahead of the reader, so that what is read ahead is not
//! evicted before it is read. Memory beyond the ARC's records: one record
//! being assembled per span in flight (`l2arc::prefetch`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::TrySendError;

use super::{Bucket, OpenObject};
use crate::namespace::OpenFile;

impl Bucket {
    /// Bytes of one read-ahead job: whole records, at least one.
    fn readahead_span_bytes(&self, recordsize: u64) -> u64 {
        (self.options.readahead_span_bytes / recordsize).max(1) * recordsize
    }

    /// Read-ahead window in records, at least one (0: read-ahead is off).
    pub(super) fn readahead_window_records(&self, recordsize: u64) -> u32 {
        if self.prefetch.is_none() {
            return 0;
        }
        let records = self.options.readahead_window_bytes / recordsize;
        u32::try_from(records).unwrap_or(u32::MAX).max(1)
    }

    /// How far a span may run ahead of its reader: a quarter of the window
    /// and an eighth of `arc_max` at most, a record at least.
    pub(super) fn readahead_ahead_bytes(&self, recordsize: u64) -> u64 {
        (self.options.readahead_window_bytes / 4)
            .min(self.serving.cache.arc_max_bytes() / 8)
            .max(recordsize)
    }

    /// Read-ahead for a read of `size` bytes at `offset`, before the read:
    /// the spans it asks for are claimed here, so the demand read waits on
    /// them instead of reading a record of its own.
    pub(super) fn read_ahead(&self, file: &OpenFile<OpenObject>, offset: u64, size: u32) {
        file.state.pace.reader_at(offset);
        let Some(tx) = &self.prefetch else {
            return;
        };
        let recordsize = u64::from(file.handle.recordsize_bytes());
        let size_bytes = file.handle.size_bytes();
        let len = u64::from(size).min(size_bytes.saturating_sub(offset));
        // Claimed under the lock: a read of this file that comes after
        // this one finds the claims, never races them with its own.
        let mut readahead = file.readahead.lock().expect("poisoned");
        let Some((from, len)) = readahead.on_read(offset, len, recordsize, size_bytes) else {
            return;
        };
        // One job a span of records (one GET each): the pool fetches the
        // spans concurrently. A span is claimed only when a thread is free
        // to fill it at once: claims that waited in a queue behind other
        // readers' streams would hold this reader up. Without a thread, it
        // reads on its own and asks again at its next read.
        let span_bytes = self.readahead_span_bytes(recordsize);
        let threads = self.options.prefetch_threads;
        let mut at = from;
        while at < from + len {
            if self.spans_in_flight.fetch_add(1, Ordering::AcqRel) >= threads {
                self.spans_in_flight.fetch_sub(1, Ordering::AcqRel);
                readahead.not_asked_from(at);
                return;
            }
            let n = span_bytes.min(from + len - at);
            let sent = self
                .serving
                .cache
                .claim_span(&file.handle, at, n)
                .map(|span| tx.try_send((span, Arc::clone(&file.state.pace))));
            if !matches!(sent, Some(Ok(()))) {
                self.spans_in_flight.fetch_sub(1, Ordering::AcqRel);
            }
            if let Some(Err(TrySendError::Full(_) | TrySendError::Disconnected(_))) = sent {
                // Dropped: its claims are given up (a waiter looks again).
                readahead.not_asked_from(at);
                return;
            }
            at += n;
        }
    }
}
