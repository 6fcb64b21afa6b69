//! Read-ahead in spans: one primary read for a run of records.
//!
//! A record is the unit of caching, but for an object store it is a poor
//! unit of reading: every GET pays a round trip and a request charge, so
//! reading an object sequentially record by record costs a thousand GETs a
//! GiB with 1 MiB records. Read-ahead knows that a whole range is wanted,
//! so it claims every record of the range that is neither in the ARC nor
//! being read, takes from the L2ARC those it holds there, and reads each
//! run of the rest from primary storage at once (one GET). The claims keep
//! single flight: a demand reader of a record in the span waits for the
//! span's read, as it would for the record's own, and a write that lands
//! meanwhile dooms the claims it touches as it dooms any fill.
//!
//! Claiming and filling are two steps ([`Cache::claim_span`],
//! [`ClaimedSpan::fill`]) so that a front end can take the claims on the
//! request thread, before its demand read looks the records up, and fill
//! them on a worker: the demand read then waits on the span instead of
//! racing it with a GET of its own.
//!
//! The run is read as a stream (`PrimaryObject::read_span_at_generation`)
//! and each record is published as soon as its last byte is in, so a long
//! span does not hold the first reader until its end. Memory: a span holds
//! one record being assembled beyond what the primary buffers (an object
//! store: a few network chunks; the default of the trait: the whole run, at
//! most `PREFETCH_SPAN_BYTES_MAX`); published records are the ARC's, under
//! `arc_max`. A read that fails midway leaves the records already published
//! (they are of the version their token names: every piece of the stream is
//! of it) and fails the rest, so a changed object (412) caches nothing of
//! its new version under the old token.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::arc::AccessKind;
use crate::arc::live::{DetachedClaim, FillClaim, Lookup};
use crate::buf::AlignedBuf;
use crate::{Cache, ObjectHandle};

/// Largest read one span makes below (one GET of an object store).
pub const PREFETCH_SPAN_BYTES_MAX: u64 = 64 << 20;

/// Claims of a span looked up below the ARC together (`read_below_many`):
/// the shared tier's GETs in flight at once, and the records found held
/// until they are published (16 MiB of 1 MiB records at most).
const BELOW_BATCH_RECORDS: usize = 16;

/// Records of a span claimed for read-ahead and not yet filled: made by
/// [`Cache::claim_span`], filled by [`ClaimedSpan::fill`] on any thread.
/// Dropped unfilled, it gives its claims up and their waiters look again.
#[must_use = "fill it: until then, readers of its records wait"]
pub struct ClaimedSpan {
    cache: Arc<Cache>,
    handle: ObjectHandle,
    token: u64,
    /// (record index, claim), ascending.
    claims: Vec<(u64, DetachedClaim)>,
}

impl std::fmt::Debug for ClaimedSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Claims in record order, each record once.
        debug_assert!(self.claims.windows(2).all(|w| w[0].0 < w[1].0));
        f.debug_struct("ClaimedSpan")
            .field("records", &self.claims.len())
            .finish_non_exhaustive()
    }
}

impl Cache {
    /// Fetches the records covering `len` bytes at `offset` into the cache
    /// (read-ahead), reading each run of them that is neither cached nor
    /// being read nor on the L2ARC from primary storage in one read (of at
    /// most [`PREFETCH_SPAN_BYTES_MAX`]). An error of a primary read is
    /// returned (the records it was for stay uncached; demand readers
    /// waiting on them get it too).
    pub fn prefetch_span(
        self: &Arc<Self>,
        handle: &ObjectHandle,
        offset: u64,
        len: u64,
    ) -> io::Result<()> {
        let end = offset.saturating_add(len).min(handle.size_bytes());
        let mut result = Ok(());
        let mut at = offset;
        while at < end {
            let n = PREFETCH_SPAN_BYTES_MAX.min(end - at);
            debug_assert!(n > 0 && at + n <= end, "spans tile the range");
            if let Some(span) = self.claim_span(handle, at, n) {
                result = result.and(span.fill());
            }
            at += n;
        }
        result
    }

    /// Claims the records covering `len` bytes at `offset` (at most
    /// [`PREFETCH_SPAN_BYTES_MAX`], from `offset` on) that are neither in
    /// the ARC nor being read: cheap, no I/O. None if there is none.
    pub fn claim_span(
        self: &Arc<Self>,
        handle: &ObjectHandle,
        offset: u64,
        len: u64,
    ) -> Option<ClaimedSpan> {
        let size_bytes = handle.size_bytes();
        if handle.caches_nothing() || len == 0 || offset >= size_bytes {
            return None;
        }
        let end = offset
            .saturating_add(len.min(PREFETCH_SPAN_BYTES_MAX))
            .min(size_bytes);
        let recordsize = u64::from(handle.recordsize_bytes());
        let token = handle.token();
        let mut claims = Vec::new();
        for index in offset / recordsize..=(end - 1) / recordsize {
            if let Lookup::Claimed(claim) =
                self.arc
                    .lookup(handle.record_key(index), token, AccessKind::Prefetch)
            {
                claims.push((index, claim.detach()));
            }
        }
        // At most a claim per record of the span, in record order.
        debug_assert!(claims.len() as u64 <= (end - 1) / recordsize - offset / recordsize + 1);
        debug_assert!(claims.windows(2).all(|w| w[0].0 < w[1].0));
        (!claims.is_empty()).then(|| ClaimedSpan {
            cache: Arc::clone(self),
            handle: handle.clone(),
            token,
            claims,
        })
    }
}

impl ClaimedSpan {
    /// Records claimed.
    pub fn records(&self) -> usize {
        // A span is made only with claims, and gives them up only when
        // it is filled (which takes it).
        debug_assert!(!self.claims.is_empty());
        self.claims.len()
    }

    /// Fills the claimed records: from the L2ARC those it holds, the rest
    /// from primary storage, one read per run of consecutive records. The
    /// first error of a primary read is returned (its records are failed).
    pub fn fill(self) -> io::Result<()> {
        debug_assert!(!self.claims.is_empty());
        self.fill_paced(&|_| true)
    }

    /// As [`Self::fill`], asking `pace` before each record read from
    /// primary storage, with the record's offset: it may block until the
    /// reader is close enough (so that what is read ahead is not evicted
    /// before it is read), or return false to give the rest of the span up
    /// (its claims are dropped: their waiters look again).
    pub fn fill_paced(mut self, pace: &dyn Fn(u64) -> bool) -> io::Result<()> {
        let claims = std::mem::take(&mut self.claims);
        // Filled here; none are left for `Drop` to give up.
        debug_assert!(self.claims.is_empty() && !claims.is_empty());
        let cache = &*self.cache;
        let claims = claims
            .into_iter()
            .map(|(index, claim)| (index, claim.attach(&cache.arc)))
            .collect();
        cache.fill_claims(&self.handle, self.token, Vec::new(), claims, pace)
    }
}

impl Cache {
    /// Fills claimed records, ascending: `run` (records already known not
    /// to be on flash, consecutive, read first from primary storage
    /// together with what follows them), then `claims`, each from the
    /// L2ARC if it holds it, the rest from primary storage, one read per
    /// run of consecutive records. Returns the first error of a primary
    /// read (its records are failed).
    pub(crate) fn fill_claims<'a>(
        &'a self,
        handle: &ObjectHandle,
        token: u64,
        mut run: Vec<(u64, FillClaim<'a>)>,
        claims: Vec<(u64, FillClaim<'a>)>,
        pace: &dyn Fn(u64) -> bool,
    ) -> io::Result<()> {
        // The run and then the claims, in record order; the run consecutive.
        debug_assert!(run.windows(2).all(|w| w[0].0 + 1 == w[1].0));
        debug_assert!(
            run.iter()
                .chain(&claims)
                .map(|&(index, _)| index)
                .is_sorted_by(|a, b| a < b)
        );
        let mut result = Ok(());
        let mut claims = claims.into_iter().peekable();
        while claims.peek().is_some() {
            // A batch of claims looked up below the ARC together (the
            // shared tier's GETs in flight at once), then filled in order.
            let batch: Vec<(u64, FillClaim<'a>)> =
                claims.by_ref().take(BELOW_BATCH_RECORDS).collect();
            // Before the reads: a write logged after it may have changed
            // what they return (`Record::fill_sequence`).
            let fill_sequence = self.invalidation_sequence.load(Ordering::Acquire);
            let indices: Vec<u64> = batch.iter().map(|&(index, _)| index).collect();
            let found = self.read_below_many(handle, &indices, token);
            for ((index, claim), data) in batch.into_iter().zip(found) {
                let consecutive = run.last().is_none_or(|&(last, _)| last + 1 == index);
                if !consecutive {
                    result = result.and(self.read_run(handle, &mut run, token, pace));
                }
                if let Some(data) = data {
                    let _ = self.publish_fill(claim, Ok(data), token, fill_sequence, None);
                    result = result.and(self.read_run(handle, &mut run, token, pace));
                } else {
                    run.push((index, claim));
                }
            }
        }
        result.and(self.read_run(handle, &mut run, token, pace))
    }
}

impl Drop for ClaimedSpan {
    fn drop(&mut self) {
        // Unfilled: attached and dropped, each claim fails as abandoned.
        debug_assert!(self.claims.windows(2).all(|w| w[0].0 < w[1].0));
        for (_, claim) in self.claims.drain(..) {
            drop(claim.attach(&self.cache.arc));
        }
    }
}

impl Cache {
    /// Reads a run of claimed consecutive records from primary storage in
    /// one read, publishing each record as soon as its bytes are in (and
    /// the error to those never completed); empties `run`.
    fn read_run(
        &self,
        handle: &ObjectHandle,
        run: &mut Vec<(u64, FillClaim<'_>)>,
        token: u64,
        pace: &dyn Fn(u64) -> bool,
    ) -> io::Result<()> {
        let Some(&(first, _)) = run.first() else {
            return Ok(());
        };
        let recordsize = handle.recordsize_bytes() as usize;
        let records = run.len();
        let mut claims = run.drain(..);
        // Before the read: a write logged after it may have changed what
        // the read returns (`Record::fill_sequence`).
        let fill_sequence = self.invalidation_sequence.load(Ordering::Acquire);
        // The record being assembled: (its claim, its bytes, how many are in,
        // its index).
        let mut current: Option<(FillClaim<'_>, AlignedBuf, usize, u64)> = None;
        let mut next_index = first;
        let mut stopped = false;
        let published = std::cell::Cell::new(0usize);
        let publish = |claim, data, index| {
            published.set(published.get() + 1);
            let _ = self.publish_fill(claim, Ok(data), token, fill_sequence, Some((handle, index)));
        };
        let result =
            self.read_primary_stream(handle, first, records, token, &mut |mut piece: &[u8]| {
                while !piece.is_empty() {
                    if current.is_none() {
                        if !pace(next_index * recordsize as u64) {
                            stopped = true;
                            return false;
                        }
                        let Some((index, claim)) = claims.next() else {
                            return false; // more than asked for: not ours
                        };
                        assert_eq!(index, next_index, "a run is consecutive records");
                        next_index += 1;
                        current = Some((claim, AlignedBuf::zeroed(recordsize), 0, index));
                    }
                    let (_, buf, filled, _) = current.as_mut().expect("set above");
                    let n = piece.len().min(recordsize - *filled);
                    buf.as_mut_slice()[*filled..*filled + n].copy_from_slice(&piece[..n]);
                    *filled += n;
                    piece = &piece[n..];
                    if *filled == recordsize {
                        let (claim, buf, _, index) = current.take().expect("set above");
                        publish(claim, buf, index);
                    }
                }
                true
            });
        // Every claim taken is published, in progress, or still waiting.
        debug_assert_eq!(
            published.get() + usize::from(current.is_some()) + claims.len(),
            records
        );
        match &result {
            // Given up: the claims not filled are dropped (abandoned).
            Ok(_) if stopped => {}
            Ok(_) => {
                // Short at the end of the object: the record in progress is
                // the last one, and those past it are empty.
                if let Some((claim, mut buf, filled, index)) = current.take() {
                    buf.set_len(filled);
                    publish(claim, buf, index);
                }
                for (index, claim) in claims.by_ref() {
                    publish(claim, AlignedBuf::zeroed(0), index);
                }
                // Read to its end: every claim taken was published.
                debug_assert_eq!(published.get(), records);
            }
            Err(e) => {
                // Never published in part: a record is whole or not at all.
                let unfinished = current.take().map(|(claim, _, _, _)| claim);
                for claim in unfinished.into_iter().chain(claims.map(|(_, c)| c)) {
                    let error = io::Error::new(e.kind(), e.to_string());
                    let _ = self.publish_fill(claim, Err(error), token, fill_sequence, None);
                }
            }
        }
        result.map(|_| ())
    }
}
