//! Read views: the bytes of a read as shared record buffers, and the rule
//! for reading a small piece of a record alone.
//!
//! A view holds the records it spans (reference-counted), so a front end
//! can send the bytes without a copy, and eviction cannot free them while
//! they are being sent. A read within one or two records allocates
//! nothing.

use std::ops::Range;

use smallvec::SmallVec;
use std::sync::Arc;

use super::objects::*;
use crate::arc::live::Record;
use crate::buf::AlignedBuf;

/// Bytes of a read, as shared record buffers (no copy).
pub struct ReadView {
    /// Inline for reads within one or two records: no allocation on a hit.
    pub segments: SmallVec<[(Arc<Record>, Range<usize>); 2]>,
}

impl ReadView {
    pub(crate) fn empty() -> Self {
        let view = ReadView {
            segments: SmallVec::new(),
        };
        debug_assert!(!view.segments.spilled(), "an empty view allocates nothing");
        view
    }

    pub(crate) fn push(&mut self, record: Arc<Record>, range: Range<usize>) {
        // A segment is a non-empty piece of its record's buffer.
        debug_assert!(range.start < range.end && range.end <= record.data.len());
        self.segments.push((record, range));
    }

    /// A view of bytes that belong to no cached record.
    pub(crate) fn owned(bytes: Vec<u8>) -> Self {
        let len = bytes.len();
        let record = Record {
            data: AlignedBuf::copy_from(&bytes),
            generation_token: 0,
            fill_sequence: 0,
        };
        let mut view = Self::empty();
        if len > 0 {
            view.push(Arc::new(record), 0..len);
        }
        debug_assert_eq!(view.len(), len);
        view
    }

    /// Bytes in the view.
    pub fn len(&self) -> usize {
        debug_assert!(
            self.segments
                .iter()
                .all(|(record, r)| r.start <= r.end && r.end <= record.data.len()),
            "every segment lies within its record"
        );
        self.segments.iter().map(|(_, r)| r.len()).sum()
    }

    /// Whether the view is empty (at or past the end of the object).
    pub fn is_empty(&self) -> bool {
        let empty = self.len() == 0;
        // Segments are never empty: no bytes means no segments.
        debug_assert_eq!(empty, self.segments.is_empty());
        empty
    }

    /// The bytes of the view, one slice per record it spans, in order.
    pub fn slices(&self) -> impl Iterator<Item = &[u8]> + '_ {
        debug_assert!(
            self.segments
                .iter()
                .all(|(record, range)| range.end <= record.data.len())
        );
        self.segments
            .iter()
            .map(|(record, range)| &record.data[range.clone()])
    }

    /// The view as one slice when it lies within one record (no copy).
    pub fn as_single_slice(&self) -> Option<&[u8]> {
        match self.segments.as_slice() {
            [] => Some(&[]),
            [(record, range)] => {
                debug_assert!(!range.is_empty() && range.end <= record.data.len());
                Some(&record.data[range.clone()])
            }
            _ => None,
        }
    }

    /// Copies the view into `out` (which must be at least `len()` long).
    pub fn copy_to(&self, out: &mut [u8]) -> usize {
        debug_assert!(out.len() >= self.len(), "copy_to's buffer is short");
        let mut at = 0;
        for (record, range) in &self.segments {
            let n = range.len();
            out[at..at + n].copy_from_slice(&record.data[range.clone()]);
            at += n;
        }
        debug_assert_eq!(at, self.len());
        at
    }
}

/// A small read is tried as a sector read when it is at most this
/// fraction of its record (see `Cache::get_piece`): 64 KiB of a 1 MiB
/// record. Below the kernel's 128 KiB FUSE reads, so a sequential reader
/// (whose read-ahead fetches whole records) does not also read pieces.
pub(super) const SECTOR_READ_FRACTION: usize = 16;

/// Whether a demand read of bytes `piece` of one record of `handle`'s
/// dataset may be tried as a sector read: its records large enough to
/// carry sector tables, the piece small, and not at the record's start. A
/// reader that starts a record is taken to read on through it (a
/// sequential reader of small pieces), so it gets the whole record into
/// the ARC, and the rest of its pieces are hits; a random reader starts a
/// record once in `recordsize / len` reads.
pub(super) fn sector_read_fits(handle: &ObjectHandle, piece: &Range<usize>) -> bool {
    let config = &handle.dataset.config;
    let recordsize = config.recordsize_bytes as usize;
    // The piece lies within one record.
    debug_assert!(piece.start <= piece.end && piece.end <= recordsize);
    recordsize >= config.sector_table_min_bytes as usize
        && piece.start > 0
        && piece.len() * SECTOR_READ_FRACTION <= recordsize
}

/// `wanted` of a whole record, cut at its end, and whether it is short.
pub(super) fn piece_of(
    record: Arc<Record>,
    wanted: Range<usize>,
    recordsize: usize,
) -> (Arc<Record>, Range<usize>, bool) {
    let len = record.data.len();
    // What is wanted lies within one record, and so does what it holds.
    debug_assert!(wanted.start <= wanted.end && wanted.end <= recordsize);
    debug_assert!(len <= recordsize, "a record is at most its recordsize");
    let to = wanted.end.min(len);
    let from = wanted.start.min(to);
    debug_assert!(from <= to && to <= len && to - from <= wanted.len());
    (record, from..to, len < recordsize)
}
