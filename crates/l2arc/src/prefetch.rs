//! Read-ahead in spans: one primary read for a run of records.
//!
//! A record is the unit of caching, but for an object store it is a poor
//! unit of reading: every GET pays a round trip and a request charge, so
//! reading an object sequentially record by record costs a thousand GETs a
//! GiB with 1 MiB records. Read-ahead knows that a whole range is wanted,
//! so it claims every record of the range that is neither in the ARC nor
//! being read, takes from the L2ARC those it holds there, and reads each
//! run of the rest from primary storage at once (one GET), then hands each
//! record its slice. The claims keep single flight: a demand reader of a
//! record in the span waits for the span's read, as it would for the
//! record's own, and a write that lands meanwhile dooms the claims it
//! touches as it dooms any fill.
//!
//! One read is bounded (`PREFETCH_SPAN_BYTES_MAX`): it is the transient
//! buffer a read-ahead holds, on top of the records it becomes; a longer
//! run is read in pieces of that size.

use std::io;
use std::sync::atomic::Ordering;

use crate::arc::AccessKind;
use crate::arc::live::{FillClaim, Lookup};
use crate::{Cache, ObjectHandle};

/// Largest read one [`Cache::prefetch_span`] makes below.
pub const PREFETCH_SPAN_BYTES_MAX: u64 = 64 << 20;

/// Claimed records of a span not on the L2ARC, consecutive from the first.
type Run<'a> = Vec<(u64, FillClaim<'a>)>;

impl Cache {
    /// Fetches the records covering `len` bytes at `offset` into the cache
    /// (read-ahead), reading each run of them that is neither cached nor
    /// being read nor on the L2ARC from primary storage in one read (of at
    /// most [`PREFETCH_SPAN_BYTES_MAX`]). An error of a primary read is
    /// returned (the records it was for stay uncached; demand reads report
    /// their own errors).
    pub fn prefetch_span(&self, handle: &ObjectHandle, offset: u64, len: u64) -> io::Result<()> {
        let size_bytes = handle.size_bytes();
        if handle.caches_nothing() || len == 0 || offset >= size_bytes {
            return Ok(());
        }
        let end = offset.saturating_add(len).min(size_bytes);
        let recordsize = u64::from(handle.recordsize_bytes());
        let token = handle.token();
        let run_records_max = (PREFETCH_SPAN_BYTES_MAX / recordsize).max(1) as usize;
        let mut run: Run<'_> = Vec::new();
        let mut result = Ok(());
        for index in offset / recordsize..=(end - 1) / recordsize {
            let key = handle.record_key(index);
            match self.arc.lookup(key, token, AccessKind::Prefetch) {
                Lookup::Claimed(claim) => {
                    let fill_sequence = self.invalidation_sequence.load(Ordering::Acquire);
                    if let Some(data) = self.read_l2(handle, index, token) {
                        let _ = self.publish_fill(claim, Ok(data), token, fill_sequence);
                        result = result.and(self.read_run(handle, &mut run, token));
                    } else {
                        run.push((index, claim));
                        if run.len() == run_records_max {
                            result = result.and(self.read_run(handle, &mut run, token));
                        }
                    }
                }
                Lookup::Hit(_) | Lookup::InFlight(_) => {
                    result = result.and(self.read_run(handle, &mut run, token));
                }
            }
        }
        result.and(self.read_run(handle, &mut run, token))
    }

    /// Reads a run of claimed records from primary storage in one read and
    /// publishes each (or the error to each); empties `run`.
    fn read_run(&self, handle: &ObjectHandle, run: &mut Run<'_>, token: u64) -> io::Result<()> {
        let Some(&(first, _)) = run.first() else {
            return Ok(());
        };
        let recordsize = handle.recordsize_bytes() as usize;
        // Before the read: a write logged after it may have changed what
        // the read returns (`Record::fill_sequence`).
        let fill_sequence = self.invalidation_sequence.load(Ordering::Acquire);
        let span = self.read_primary_span(handle, first, run.len(), token);
        for (k, (index, claim)) in run.drain(..).enumerate() {
            assert_eq!(index, first + k as u64, "a run is consecutive records");
            let data = match &span {
                Ok(span) => {
                    let from = (k * recordsize).min(span.len());
                    let to = (from + recordsize).min(span.len());
                    Ok(crate::buf::AlignedBuf::copy_from(
                        &span.as_slice()[from..to],
                    ))
                }
                Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
            };
            let _ = self.publish_fill(claim, data, token, fill_sequence);
        }
        span.map(|_| ())
    }
}
