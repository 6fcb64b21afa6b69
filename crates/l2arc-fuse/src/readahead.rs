//! Sequential read detection and a bounded, ramping read-ahead window.
//!
//! The kernel already reads ahead in its page cache, but only as far as
//! its own window (128 KiB by default), and each of those requests waits
//! on the slow source in turn. Like ZFS's zfetch we watch each open file:
//! when a read starts where the previous one ended, the reader is
//! sequential and we ask the cache to fetch the records ahead of it
//! (`Cache::prefetch_span`) in the background, so that the source streams
//! while the reader consumes. The window starts at one record and doubles
//! on every sequential hit up to `max_records`, so a reader that does one
//! sequential pair of reads costs one extra record, not eight; a random
//! read resets it. Once the window is open, more is asked for only when
//! half of it or less is left ahead, so that read-ahead goes below in runs
//! of half a window, each run read below at once.
//! Prefetched records are flagged as such by the engine,
//! so they do not count as reuse and (with `l2arc_noprefetch`) do not
//! wear the L2ARC.
//!
//! Over an object store the ramp is the wrong trade: each ask is a GET,
//! and a GET's round trip costs as much as megabytes of transfer, so the
//! object mount opens the window at once (`ReadAhead::at_once`): the first
//! sequential read (a read at offset 0 of a fresh open is one) asks for
//! the whole window from the record it reads, its own records included,
//! so that its demand read waits on the span instead of a GET of its own.
//! It asks again when a quarter of the window or less is left ahead, for
//! runs of three quarters of a window: the next GET's first byte comes
//! while the reader still has that quarter to read. The kernel's own
//! concurrent reads of a file reach us slightly out of order; a read close
//! to the stream (`REORDER_SLACK_BYTES`) continues it rather than reset it.

/// How far out of order a read may arrive and still continue a stream
/// (at once): a few of the kernel's read-ahead requests.
const REORDER_SLACK_BYTES: u64 = 1 << 20;
/// The smallest read that starts a stream on a fresh open anywhere but at
/// offset 0 (within the reorder slack): the kernel's sequential reads are
/// 128 KiB, a random reader's are a few KiB.
const FRESH_STREAM_READ_BYTES_MIN: u64 = 64 << 10;

/// Per-open-file state.
#[derive(Debug, Clone)]
pub(crate) struct ReadAhead {
    /// Where the next sequential read would start.
    next_offset: u64,
    /// Current window, in records (0 = not sequential yet).
    window_records: u32,
    /// End of what was already requested ahead (bytes): never ask twice.
    fetched_until: u64,
    max_records: u32,
    /// Opens the window at once and covers the read itself (object stores).
    at_once: bool,
}

impl ReadAhead {
    pub(crate) fn new(max_records: u32) -> Self {
        Self {
            next_offset: 0,
            window_records: 0,
            fetched_until: 0,
            max_records,
            at_once: false,
        }
    }

    /// A window of `max_records` from the first sequential read on (see
    /// the module comment).
    pub(crate) fn at_once(max_records: u32) -> Self {
        Self {
            at_once: true,
            ..Self::new(max_records)
        }
    }

    /// Records a read of `len` bytes at `offset` and returns the range to
    /// prefetch, if any: `(offset, len)` in bytes, within `size_bytes`.
    pub(crate) fn on_read(
        &mut self,
        offset: u64,
        len: u64,
        recordsize_bytes: u64,
        size_bytes: u64,
    ) -> Option<(u64, u64)> {
        assert!(recordsize_bytes.is_power_of_two());
        let end = offset.saturating_add(len);
        // The kernel has several reads of a file in flight, and they reach
        // us out of order: at once, a read that starts within a little of
        // where a stream is (one under way, or the start of a fresh open)
        // continues it, and never moves it back. A stream starts only with
        // a read where the last one ended, so random readers start none.
        let slack = REORDER_SLACK_BYTES.max(recordsize_bytes);
        // A fresh open streams from a read at 0, or from a read as large as
        // the kernel's sequential ones that overtook it; not from a small
        // read near the start (a random reader's 4 KiB).
        let fresh_start =
            self.next_offset == 0 && (offset == 0 || len >= FRESH_STREAM_READ_BYTES_MIN);
        let streaming = self.at_once && (self.window_records > 0 || fresh_start);
        let sequential = len > 0
            && if streaming {
                offset <= self.next_offset.saturating_add(slack)
                    && offset.saturating_add(slack) >= self.next_offset
            } else {
                offset == self.next_offset
            };
        self.next_offset = if self.at_once && sequential {
            self.next_offset.max(end)
        } else {
            end
        };
        if !sequential || self.max_records == 0 {
            self.window_records = 0;
            self.fetched_until = 0;
            return None;
        }
        self.window_records = if self.at_once {
            self.max_records
        } else if self.window_records == 0 {
            1
        } else {
            (self.window_records * 2).min(self.max_records)
        };
        let window_bytes = u64::from(self.window_records) * recordsize_bytes;
        // Ask again only once half the window (a quarter, at once) or less
        // is left ahead of the reader: what is asked for then comes in runs
        // of half a window or more (one read below each, for an object
        // store one GET), not a record each time the reader crosses one.
        let refill_at = if self.at_once {
            window_bytes / 4
        } else {
            window_bytes / 2
        };
        if self.fetched_until > end && self.fetched_until - end > refill_at {
            return None;
        }
        // From the end of this read (at once: from its first record) or of
        // what was already asked for, to the end of the window, in whole
        // records.
        let (from, window_end) = if self.at_once {
            let first = offset / recordsize_bytes * recordsize_bytes;
            (
                first.max(self.fetched_until),
                first.saturating_add(window_bytes),
            )
        } else {
            (
                end.max(self.fetched_until),
                end.saturating_add(window_bytes),
            )
        };
        let to = window_end
            .div_ceil(recordsize_bytes)
            .saturating_mul(recordsize_bytes)
            .min(size_bytes);
        if from >= to {
            return None;
        }
        self.fetched_until = to;
        debug_assert!(to - from <= window_bytes + recordsize_bytes);
        Some((from, to - from))
    }

    /// What was asked from `offset` on was not taken (no thread to read
    /// it): the next read asks again.
    pub(crate) fn not_asked_from(&mut self, offset: u64) {
        self.fetched_until = self.fetched_until.min(offset);
    }

    #[cfg(test)]
    fn window_records(&self) -> u32 {
        self.window_records
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RS: u64 = 128 << 10;

    #[test]
    fn sequential_ramps_to_the_bound() {
        let mut ra = ReadAhead::new(8);
        let size = 100 * RS;
        let mut windows = Vec::new();
        let mut asked_until = 0;
        let mut asks = 0;
        for i in 0..40u64 {
            let got = ra.on_read(i * RS, RS, RS, size);
            windows.push(ra.window_records());
            let end = (i + 1) * RS;
            if let Some((from, len)) = got {
                assert!(from >= asked_until, "never asks twice");
                assert!(from >= end, "only ahead of the reader");
                assert!(len <= 8 * RS);
                if ra.window_records() == 8 && i > 4 {
                    assert!(len >= 4 * RS, "runs of half a window: {len}");
                }
                asked_until = from + len;
                asks += 1;
            }
            let ahead = asked_until - end;
            assert!(ahead <= 8 * RS, "read {i}: {ahead} bytes ahead");
            if ra.window_records() == 8 {
                assert!(ahead >= 4 * RS, "read {i}: only {ahead} bytes ahead");
            }
        }
        assert_eq!(windows[..5], [1, 2, 4, 8, 8]);
        assert!(asks <= 4 + 36 / 4, "{asks} asks for 40 records");
    }

    #[test]
    fn at_once_asks_the_whole_window_from_the_first_read_then_in_large_runs() {
        const MIB: u64 = 1 << 20;
        let mut ra = ReadAhead::at_once(64);
        let size = 200 * MIB;
        // The first read of a fresh open, at 0: the whole window, from the
        // record it reads (so its demand read waits on the span).
        assert_eq!(ra.on_read(0, 128 << 10, MIB, size), Some((0, 64 * MIB)));
        // The kernel's next reads, one of them overtaken by the other:
        // neither resets the stream, nor asks again.
        assert_eq!(ra.on_read(256 << 10, 128 << 10, MIB, size), None);
        assert_eq!(ra.on_read(128 << 10, 128 << 10, MIB, size), None);
        assert_eq!(ra.window_records(), 64);
        // Read on in 128 KiB: asks again once a quarter of the window or
        // less is left ahead, for runs of about three quarters of it.
        let mut asks = Vec::new();
        let mut at = 384 << 10;
        while at < size {
            if let Some((from, len)) = ra.on_read(at, 128 << 10, MIB, size) {
                assert!(from >= 64 * MIB, "never asks twice");
                asks.push((from, len));
            }
            at += 128 << 10;
        }
        let asked: u64 = asks.iter().map(|&(_, len)| len).sum();
        assert_eq!(64 * MIB + asked, size, "everything asked for, once");
        assert!(
            asks.len() <= 3,
            "{asks:?}: runs of three quarters of a window"
        );
        for w in asks.windows(2) {
            assert_eq!(w[0].0 + w[0].1, w[1].0, "contiguous");
        }
        // A small read near the start of a fresh open is not a stream (a
        // random reader), a large one overtaken by the read at 0 is.
        let mut ra = ReadAhead::at_once(64);
        assert_eq!(ra.on_read(20 << 10, 4096, MIB, size), None);
        assert_eq!(ra.window_records(), 0);
        let mut ra = ReadAhead::at_once(64);
        assert_eq!(
            ra.on_read(128 << 10, 128 << 10, MIB, size),
            Some((0, 64 * MIB))
        );
        // A small file: one ask for all of it.
        let mut ra = ReadAhead::at_once(64);
        assert_eq!(
            ra.on_read(0, 4096, MIB, 5 * MIB + 7),
            Some((0, 5 * MIB + 7))
        );
    }

    #[test]
    fn at_once_random_readers_start_no_stream() {
        const MIB: u64 = 1 << 20;
        let mut ra = ReadAhead::at_once(64);
        let size = 200 * MIB;
        // Random reads, some close to each other: none starts a stream.
        for offset in [
            50 * MIB,
            50 * MIB + 8192,
            20 * MIB,
            20 * MIB - 4096,
            70 * MIB,
        ] {
            assert_eq!(ra.on_read(offset, 4096, MIB, size), None, "{offset}");
        }
        // A read where the last one ended starts one, at once.
        assert_eq!(
            ra.on_read(70 * MIB + 4096, 4096, MIB, size),
            Some((70 * MIB, 64 * MIB))
        );
        // A jump far away ends it.
        assert_eq!(ra.on_read(5 * MIB, 4096, MIB, size), None);
        assert_eq!(ra.window_records(), 0);
    }

    #[test]
    fn random_reads_reset_and_end_of_file_bounds() {
        let mut ra = ReadAhead::new(8);
        let size = 10 * RS;
        assert!(ra.on_read(0, 4096, RS, size).is_some());
        assert!(ra.on_read(4096, 4096, RS, size).is_some() || ra.window_records() == 2);
        assert_eq!(ra.on_read(5 * RS, 4096, RS, size), None, "random read");
        assert_eq!(ra.window_records(), 0);
        // Sequential again from there; never past the end of the file.
        for i in 0..20u64 {
            if let Some((from, len)) = ra.on_read(5 * RS + 4096 * (i + 1), 4096, RS, size) {
                assert!(from + len <= size);
            }
        }
        let mut off = ReadAhead::new(0);
        assert_eq!(off.on_read(0, RS, RS, size), None, "disabled");
        assert_eq!(off.on_read(RS, RS, RS, size), None, "disabled");
    }
}
