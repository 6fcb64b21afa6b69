//! Read-ahead of sequential streams (ZFS's `zfetch`, reduced to one rule).
//!
//! Why. On a disk a read costs a seek (milliseconds) plus its transfer (a
//! 128 KiB record at 150 MiB/s: under a millisecond), so a reader that goes
//! through an object record by record, each record a miss, spends most of
//! the disk's time seeking. Reading the records it will want next in the
//! same primary read as the one it asked for pays one seek for all of them.
//! A cache that only caches what is asked for cannot do that; ZFS's DMU
//! prefetcher does it under the ARC, and so does this.
//!
//! The rule. A demand read of record `i` that misses the ARC and the L2ARC
//! looks back: if the `k` records right before `i` are all in the ARC (`k`
//! at least `STREAM_RECORDS_MIN`), the reader is taken to be
//! sequential, `k` records long so far, and the next `k` records (at most
//! `zfetch_max_distance`, and 1/32 of `arc_max`) are claimed as read-ahead and read from primary
//! storage in the same read as `i` (those on flash come from flash). The
//! distance thus grows with the stream, as zfetch's does, and a reader
//! whose stream ends soon after it began wastes little. A random reader
//! almost never finds two records before its own in DRAM; if it does, it
//! reads a few records more. No per-object state: the ARC is the history.
//! Records still being read do not count: readers of neighbouring records
//! at the same moment (32 threads each reading its own record) are not a
//! stream, and claiming each other's records would queue on one reader
//! what many disks would serve at once.
//!
//! The reader that started the read-ahead waits for the whole span (its
//! own record is published first; readers of the others wait on their
//! claims, as for any fill). Read-ahead records are fills of kind
//! prefetch: `l2arc_noprefetch` keeps them off flash until a demand read
//! uses them, and a demand read that does counts as a hit.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::arc::AccessKind;
use crate::arc::live::{FillClaim, Lookup, Record};
use crate::{Cache, ObjectHandle};

/// Records before the missed one that must be in DRAM for a stream.
const STREAM_RECORDS_MIN: u64 = 2;
/// Most records one read-ahead claims (and looks back over).
const READ_AHEAD_RECORDS_MAX: u64 = 64;
/// One read-ahead claims at most this share of the ARC: records read ahead
/// must outlive the wait for their reader, with many streams at once (a
/// 16 MiB ARC reads ahead at most 512 KiB).
const ARC_SHARE_PER_READ_AHEAD: u64 = 32;

impl Cache {
    /// Fills record `index`, claimed by this demand reader and not on
    /// flash, from primary storage, with a read-ahead of the records after
    /// it when the reader looks sequential (see the module comment).
    pub(crate) fn fill_from_primary<'a>(
        &'a self,
        handle: &ObjectHandle,
        index: u64,
        token: u64,
        kind: AccessKind,
        claim: FillClaim<'a>,
    ) -> io::Result<Arc<Record>> {
        let ahead = if kind == AccessKind::Demand {
            self.read_ahead_claims(handle, index, token)
        } else {
            Vec::new()
        };
        // Read ahead: the records right after this one, in order.
        debug_assert!(
            ahead
                .iter()
                .enumerate()
                .all(|(i, &(ahead, _))| ahead == index + 1 + i as u64)
        );
        if ahead.is_empty() {
            let fill_sequence = self.invalidation_sequence.load(Ordering::Acquire);
            let result = self.read_primary(handle, index, token);
            return self.publish_fill(claim, result, token, fill_sequence, Some((handle, index)));
        }
        self.counters.zfetch_hits.add(1);
        self.counters.zfetch_io_issued.add(ahead.len() as u64);
        // The claim's own fill carries its record (or error) out of the span.
        let fill = claim.fill();
        let span = self.fill_claims(handle, token, vec![(index, claim)], ahead, &|_| true);
        match fill.try_result() {
            Some(Ok(record)) => Ok(record),
            Some(Err(e)) => Err(e.into()),
            None => Err(span.err().unwrap_or_else(|| {
                io::Error::other(format!(
                    "record {index} was read ahead of and not published"
                ))
            })),
        }
    }

    /// Claims the records to read ahead of a demand miss on `index`: none
    /// unless the records right before it are in the ARC,
    /// then as many after it as there are such records before it, up to
    /// `zfetch_max_distance`, stopping at the first one already in the ARC
    /// or being read, and at the end of the object.
    fn read_ahead_claims(
        &self,
        handle: &ObjectHandle,
        index: u64,
        token: u64,
    ) -> Vec<(u64, FillClaim<'_>)> {
        let recordsize = u64::from(handle.recordsize_bytes());
        let distance_bytes = self
            .config
            .zfetch_max_distance_bytes
            .min(self.config.arc_max_bytes / ARC_SHARE_PER_READ_AHEAD);
        let distance_records = (distance_bytes / recordsize).min(READ_AHEAD_RECORDS_MAX);
        if self.config.zfs_prefetch_disable || distance_records == 0 || index < STREAM_RECORDS_MIN {
            return Vec::new();
        }
        let resident = |i: u64| self.arc.resident(handle.record_key(i), token);
        let mut behind = 0;
        while behind < distance_records && behind < index && resident(index - 1 - behind) {
            behind += 1;
        }
        if behind < STREAM_RECORDS_MIN {
            return Vec::new();
        }
        let last_record = handle.size_bytes().saturating_sub(1) / recordsize;
        // As far ahead as the stream is behind, at most the distance.
        debug_assert!(behind <= distance_records && distance_records <= READ_AHEAD_RECORDS_MAX);
        let mut claims = Vec::with_capacity(behind as usize);
        let held = |i: u64| self.arc.holds(handle.record_key(i), token);
        for ahead in index + 1..=(index + behind).min(last_record) {
            if held(ahead) {
                break;
            }
            match self
                .arc
                .lookup(handle.record_key(ahead), token, AccessKind::Prefetch)
            {
                Lookup::Claimed(claim) => claims.push((ahead, claim)),
                _ => break, // filled meanwhile: the run ends here
            }
        }
        claims
    }
}
