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
}

impl ReadAhead {
    pub(crate) fn new(max_records: u32) -> Self {
        Self {
            next_offset: 0,
            window_records: 0,
            fetched_until: 0,
            max_records,
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
        let sequential = len > 0 && offset == self.next_offset;
        self.next_offset = end;
        if !sequential || self.max_records == 0 {
            self.window_records = 0;
            self.fetched_until = 0;
            return None;
        }
        self.window_records = if self.window_records == 0 {
            1
        } else {
            (self.window_records * 2).min(self.max_records)
        };
        let window_bytes = u64::from(self.window_records) * recordsize_bytes;
        // Ask again only once half the window or less is left ahead of the
        // reader: what is asked for then comes in runs of half a window or
        // more (one read below each, for an object store one GET), not a
        // record each time the reader crosses one.
        if self.fetched_until > end && self.fetched_until - end > window_bytes / 2 {
            return None;
        }
        // From the end of this read (or of what was already asked for) to
        // the end of the window, rounded to whole records.
        let from = end.max(self.fetched_until);
        let to = end
            .saturating_add(window_bytes)
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
