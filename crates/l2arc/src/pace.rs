//! Pacing a read-ahead span to its reader.
//!
//! A span is one large read below the cache (one GET of an object store),
//! and the store sends it as fast as it can; the reader may be slower.
//! What arrives goes into the ARC, where records read ahead sit on the
//! recency side, the first to go when the cache is full: a span that ran
//! far ahead of its reader would see its own records evicted before they
//! are read, and each of them read again on its own. So before each record
//! a span's fill waits until the reader is within `ahead_bytes` of it
//! (`ClaimedSpan::fill_paced`); the stream stalls (TCP backpressure)
//! instead of flooding the ARC, and what a reader has ahead of it in DRAM
//! is bounded. A reader that makes no progress for `IDLE_MAX` (or is gone:
//! `close`) lets the span go: the rest is given up, and read again if
//! wanted. Used by the engine's sequential streams (`zstream`) and by the
//! object mount's per-file read-ahead.

use crate::lock_order::{RankedCondvar, RankedMutex, rank};
use std::time::{Duration, Instant};

/// How long a span waits for a reader that does not move before it gives
/// the rest up (its GET stays open meanwhile).
const IDLE_MAX: Duration = Duration::from_secs(10);

/// Where one reader (an open file, a sequential stream) is, for the spans
/// read ahead of it.
pub struct Pace {
    state: RankedMutex<PaceState, { rank::PACE }>,
    advanced: RankedCondvar,
    /// How far ahead of the furthest read a span may fill.
    ahead_bytes: u64,
}

struct PaceState {
    /// Furthest offset a read started at.
    read_to: u64,
    closed: bool,
    /// Spans blocked in `wait_for` (a read notifies only when some are).
    waiting: u32,
}

impl Pace {
    /// A reader at `read_to`, whose spans may fill `ahead_bytes` past it.
    pub fn new(read_to: u64, ahead_bytes: u64) -> Self {
        Self {
            state: RankedMutex::new(PaceState {
                read_to,
                closed: false,
                waiting: 0,
            }),
            advanced: RankedCondvar::new(),
            ahead_bytes,
        }
    }

    /// A read starts at `offset` (called before it looks records up, so
    /// that the record it waits for is always within reach of a span).
    pub fn reader_at(&self, offset: u64) {
        let mut state = self.state.lock().expect("pace poisoned");
        if offset > state.read_to {
            state.read_to = offset;
            if state.waiting > 0 {
                self.advanced.notify_all();
            }
        }
    }

    /// The furthest offset a read started at (for tests).
    #[cfg(test)]
    pub(crate) fn read_to(&self) -> u64 {
        self.state.lock().expect("pace poisoned").read_to
    }

    /// The reader is gone (its file closed): spans waiting give up, and
    /// none waits again.
    pub fn close(&self) {
        self.state.lock().expect("pace poisoned").closed = true;
        self.advanced.notify_all();
    }

    /// Blocks until a record at `offset` is within `ahead_bytes` of the
    /// reader; false if the reader is gone or stood still for `IDLE_MAX`.
    pub fn wait_for(&self, offset: u64) -> bool {
        let mut state = self.state.lock().expect("pace poisoned");
        let mut seen = state.read_to;
        let mut deadline = Instant::now() + IDLE_MAX;
        loop {
            if state.closed {
                return false;
            }
            if offset < state.read_to.saturating_add(self.ahead_bytes) {
                return true;
            }
            if state.read_to != seen {
                seen = state.read_to;
                deadline = Instant::now() + IDLE_MAX;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            state.waiting += 1;
            state = self
                .advanced
                .wait_timeout(state, left)
                .expect("pace poisoned")
                .0;
            state.waiting -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const MIB: u64 = 1 << 20;

    /// Blocks until a span is waiting in `pace`.
    fn until_waiting(pace: &Pace) {
        while pace.state.lock().unwrap().waiting == 0 {
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_span_waits_for_its_reader_and_lets_go_when_it_is_gone() {
        let pace = Arc::new(Pace::new(0, 4 * MIB));
        assert!(pace.wait_for(0), "within reach of a reader at 0");
        assert!(pace.wait_for(4 * MIB - 1));
        // Beyond reach: waits until the reader moves.
        let span = {
            let pace = Arc::clone(&pace);
            std::thread::spawn(move || pace.wait_for(10 * MIB))
        };
        until_waiting(&pace);
        pace.reader_at(7 * MIB);
        assert!(span.join().unwrap(), "the reader came within reach");
        // A reader that is gone releases a waiting span.
        let span = {
            let pace = Arc::clone(&pace);
            std::thread::spawn(move || pace.wait_for(100 * MIB))
        };
        until_waiting(&pace);
        pace.close();
        assert!(!span.join().unwrap(), "gone: the span gives up");
        assert!(!pace.wait_for(0), "gone: nothing more is read ahead");
    }
}
