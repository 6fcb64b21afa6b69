//! Latency by the tier that served a read, for the live analytics.
//!
//! The appliance analytics of the seed articles showed read latency as heat
//! maps, where the tiers appear by themselves: a dark stripe of DRAM hits at
//! the bottom, flash hits near 300 µs, the disk's cloud near 10 ms. Counters
//! cannot show that; histograms per tier can. Five are kept:
//!
//! - `arc_hit`: demand reads served entirely from the ARC, start to end of
//!   `Cache::read`/`read_view`. An ARC hit costs about 250 ns, and reading
//!   the clock twice costs tens of nanoseconds, so only one read in
//!   `ARC_HIT_SAMPLE_PERIOD` per thread is timed, and counted with that
//!   weight: the counts estimate every hit, the shape is exact enough for
//!   a heat map, and the hit path pays one thread-local countdown.
//! - `l2_hit`: every L2ARC record read that returned data (device read,
//!   checksum, decompression).
//! - `shared_hit`: every record the shared tier (a cache bucket a fleet
//!   shares, `crate::shared`) served, timed as `l2_hit` is, from the start
//!   of the tier's read (its GET, the block's checks, decompression) to
//!   the record in hand; in a batch of GETs in flight together, from the
//!   batch's start. A band of its own because its hits cost a round trip
//!   (milliseconds) where flash costs microseconds: mixed into `l2_hit`,
//!   the L2ARC's band would show the cache bucket's latency. Which band a
//!   tier's hits go to, the tier says (`Tier::band`), so the read path
//!   counts every tier alike.
//! - `primary`: every read of primary storage (a record fill, or a read
//!   that bypasses the ARC under `primarycache=none`).
//! - `frontend`: every request as its front end saw it (an NBD command from
//!   its dispatch to its reply; a FUSE read from the call to the reply),
//!   recorded by the front end through [`Analytics::start`] and
//!   [`LatencyHistogram::finish`].
//!
//! - `l2_hit` again per cache device (`device_histograms`, slots below
//!   `DEVICE_HISTOGRAMS_MAX`): the L2ARC's reader notes on its thread
//!   which slot served the hit, and the same elapsed time goes to that
//!   slot's histogram, so a slow device shows as its own band. One
//!   thread-local write and one more histogram record per L2 hit, which
//!   costs microseconds anyway.
//!
//! Per dataset, the counters below the ARC and reads and misses (fills
//! count one read and one miss; sampled ARC hits count their weight), so
//! every rate chart of the live page can be broken down by dataset.
//!
//! Reads below the ARC are timed every time: they cost microseconds to
//! milliseconds, so the clock is noise there. A read that waited for
//! another reader's fill (an I/O hit) is in none of the first three: its
//! latency is the fill's, which is counted once where it happened.
//!
//! Everything is behind one relaxed flag ([`Analytics::set_enabled`]) so
//! that the cost can be measured in one run (`l2arc bench --scenario
//! arc-hit`).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

pub use crate::latency::{HistogramSnapshot, LatencyHistogram};
pub(crate) use crate::top_objects::Below;
pub use crate::top_objects::{ObjectCounts, TOP_OBJECTS_MAX};

/// One ARC hit in this many (per thread) is timed.
pub const ARC_HIT_SAMPLE_PERIOD: u32 = 64;

/// Datasets with counters of their own; later ones share the last slot.
pub const DATASETS_TRACKED_MAX: usize = 64;

/// Cache-device slots with a latency histogram of their own (16 KiB or so
/// each); hits on later slots are in the `l2_hit` tier only.
pub const DEVICE_HISTOGRAMS_MAX: usize = 8;

/// No slot noted (`LAST_L2_SLOT`).
const NO_SLOT: u8 = u8::MAX;

thread_local! {
    /// Reads left until this thread times one.
    static SAMPLE_COUNTDOWN: Cell<u32> = const { Cell::new(0) };
    /// Set when a timed read went below the ARC (or waited for a fill).
    static WENT_BELOW: Cell<bool> = const { Cell::new(false) };
    /// The cache-device slot of this thread's last L2ARC hit, until the
    /// hit is counted (`Analytics::l2_hit_done`).
    static LAST_L2_SLOT: Cell<u8> = const { Cell::new(NO_SLOT) };
}

/// Notes that this thread's L2ARC read was served by device `slot`.
#[inline]
pub(crate) fn note_l2_device(slot: u8) {
    LAST_L2_SLOT.with(|s| s.set(slot));
}

/// The tier histograms and per-dataset counters of a cache.
pub struct Analytics {
    enabled: AtomicBool,
    /// Time of ARC hits (one read in [`ARC_HIT_SAMPLE_PERIOD`] timed, counted with that weight).
    pub arc_hit: LatencyHistogram,
    /// Time of reads served by the L2ARC.
    pub l2_hit: LatencyHistogram,
    /// Time of reads served by the shared tier (empty without one).
    pub shared_hit: LatencyHistogram,
    /// Time of reads that went to primary storage.
    pub primary: LatencyHistogram,
    /// Time of whole front-end requests (NBD, FUSE), as the front end reports them.
    pub frontend: LatencyHistogram,
    /// Time of reads served by the L2ARC, per cache-device slot.
    devices: Box<[LatencyHistogram]>,
    datasets: Box<[DatasetCounters]>,
    top: crate::top_objects::TopObjects,
}

/// Counters of one dataset, kept below the ARC only (where an extra atomic
/// costs nothing next to the I/O).
#[derive(Default)]
struct DatasetCounters {
    reads: AtomicU64,
    misses: AtomicU64,
    l2_hits: AtomicU64,
    l2_read_bytes: AtomicU64,
    shared_hits: AtomicU64,
    shared_read_bytes: AtomicU64,
    primary_reads: AtomicU64,
    primary_read_bytes: AtomicU64,
}

/// A snapshot of one dataset's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DatasetAnalytics {
    /// Demand reads: fills plus sampled ARC hits (estimated, weighted).
    pub reads: u64,
    /// Reads that missed the ARC (fills from below it).
    pub misses: u64,
    /// Reads served by the L2ARC.
    pub l2_hits: u64,
    /// Bytes read from the L2ARC.
    pub l2_read_bytes: u64,
    /// Reads served by the shared tier.
    pub shared_hits: u64,
    /// Bytes read from the shared tier.
    pub shared_read_bytes: u64,
    /// Reads that went to primary storage.
    pub primary_reads: u64,
    /// Bytes read from primary storage.
    pub primary_read_bytes: u64,
}

/// The start of a timed operation (`None` when analytics are off or the
/// operation was not sampled).
#[derive(Clone, Copy, Debug)]
#[must_use]
pub struct Timer(Option<Instant>);

impl Default for Analytics {
    fn default() -> Self {
        Self {
            enabled: AtomicBool::new(true),
            arc_hit: LatencyHistogram::default(),
            l2_hit: LatencyHistogram::default(),
            shared_hit: LatencyHistogram::default(),
            primary: LatencyHistogram::default(),
            frontend: LatencyHistogram::default(),
            devices: (0..DEVICE_HISTOGRAMS_MAX)
                .map(|_| LatencyHistogram::default())
                .collect(),
            datasets: (0..DATASETS_TRACKED_MAX)
                .map(|_| DatasetCounters::default())
                .collect(),
            top: Default::default(),
        }
    }
}

impl Analytics {
    /// Whether reads are timed and counted now.
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Turns the histograms on or off (on by default); counters stay.
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    /// Starts timing an operation that is always timed (I/O, front-end requests).
    #[inline]
    pub fn start(&self) -> Timer {
        Timer(self.enabled().then(Instant::now))
    }

    /// Starts timing a demand read, one in `ARC_HIT_SAMPLE_PERIOD` per thread.
    #[inline]
    pub(crate) fn start_read(&self) -> Timer {
        if !self.enabled() {
            return Timer(None);
        }
        let sampled = SAMPLE_COUNTDOWN.with(|left| match left.get() {
            0 => {
                left.set(ARC_HIT_SAMPLE_PERIOD - 1);
                true
            }
            n => {
                left.set(n - 1);
                false
            }
        });
        if !sampled {
            return Timer(None);
        }
        WENT_BELOW.with(|b| b.set(false));
        Timer(Some(Instant::now()))
    }

    /// `start_read` when `demand` (prefetches are not timed).
    #[inline]
    pub(crate) fn start_read_if(&self, demand: bool) -> Timer {
        if demand {
            self.start_read()
        } else {
            Timer(None)
        }
    }

    /// Ends a read of `object` started with `start_read`: counted as an
    /// ARC hit when nothing below the ARC was waited for.
    #[inline]
    pub(crate) fn finish_read(&self, timer: Timer, dataset: u32, object: u64) {
        if let Timer(Some(start)) = timer
            && !WENT_BELOW.with(|b| b.get())
        {
            let weight = u64::from(ARC_HIT_SAMPLE_PERIOD);
            self.arc_hit
                .record_n(start.elapsed().as_nanos() as u64, weight);
            self.top.sampled_hit(dataset, object, weight);
            self.dataset_counters(dataset as usize)
                .reads
                .fetch_add(weight, Ordering::Relaxed);
        }
    }

    /// Remembers the name `object` was opened by, for the drill-down.
    pub(crate) fn name_object(&self, dataset: u32, object: u64, name: &str) {
        self.top.name(dataset, object, name);
    }

    /// The `n` objects with the most reads (at most `TOP_OBJECTS_MAX` are
    /// tracked; see `top_objects`).
    pub fn top_objects(&self, n: usize) -> Vec<ObjectCounts> {
        self.top.top(n)
    }

    /// Notes that this thread's current read went below the ARC.
    #[inline]
    pub(crate) fn note_below(&self) {
        WENT_BELOW.with(|b| b.set(true));
    }

    /// Counts an L2ARC hit of `bytes` for `object` of dataset `index`.
    pub(crate) fn l2_hit_done(&self, timer: Timer, dataset: usize, object: u64, bytes: u64) {
        self.note_below();
        let slot = LAST_L2_SLOT.with(|s| s.replace(NO_SLOT));
        if let Timer(Some(start)) = timer {
            let ns = start.elapsed().as_nanos() as u64;
            self.l2_hit.record(ns);
            if let Some(h) = self.devices.get(usize::from(slot)) {
                h.record(ns);
            }
        }
        self.top.fill(dataset as u32, object, Below::L2Arc, bytes);
        let d = self.dataset_counters(dataset);
        d.reads.fetch_add(1, Ordering::Relaxed);
        d.misses.fetch_add(1, Ordering::Relaxed);
        d.l2_hits.fetch_add(1, Ordering::Relaxed);
        d.l2_read_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts a shared-tier hit of `bytes` for `object` of dataset `index`.
    pub(crate) fn shared_hit_done(&self, timer: Timer, dataset: usize, object: u64, bytes: u64) {
        self.note_below();
        self.shared_hit.finish(timer);
        self.top.fill(dataset as u32, object, Below::Shared, bytes);
        let d = self.dataset_counters(dataset);
        d.reads.fetch_add(1, Ordering::Relaxed);
        d.misses.fetch_add(1, Ordering::Relaxed);
        d.shared_hits.fetch_add(1, Ordering::Relaxed);
        d.shared_read_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts a hit of `bytes` in the tier below the ARC `from` (the
    /// L2ARC or the shared tier), in that tier's band.
    pub(crate) fn below_hit_done(
        &self,
        from: Below,
        timer: Timer,
        dataset: usize,
        object: u64,
        bytes: u64,
    ) {
        match from {
            Below::L2Arc => self.l2_hit_done(timer, dataset, object, bytes),
            Below::Shared => self.shared_hit_done(timer, dataset, object, bytes),
            // Primary storage is no tier: its reads are `primary_done`.
            Below::Primary => unreachable!("a tier's hit counted as a primary read"),
        }
    }

    /// Counts a primary read of `bytes` for `object` of dataset `index`.
    pub(crate) fn primary_done(&self, timer: Timer, dataset: usize, object: u64, bytes: u64) {
        self.note_below();
        self.primary.finish(timer);
        self.top.fill(dataset as u32, object, Below::Primary, bytes);
        let d = self.dataset_counters(dataset);
        d.reads.fetch_add(1, Ordering::Relaxed);
        d.misses.fetch_add(1, Ordering::Relaxed);
        d.primary_reads.fetch_add(1, Ordering::Relaxed);
        d.primary_read_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The counters of dataset `index` (the last slot sums datasets past
    /// `DATASETS_TRACKED_MAX`).
    pub fn dataset(&self, index: usize) -> DatasetAnalytics {
        let d = self.dataset_counters(index);
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DatasetAnalytics {
            reads: get(&d.reads),
            misses: get(&d.misses),
            l2_hits: get(&d.l2_hits),
            l2_read_bytes: get(&d.l2_read_bytes),
            shared_hits: get(&d.shared_hits),
            shared_read_bytes: get(&d.shared_read_bytes),
            primary_reads: get(&d.primary_reads),
            primary_read_bytes: get(&d.primary_read_bytes),
        }
    }

    fn dataset_counters(&self, index: usize) -> &DatasetCounters {
        &self.datasets[index.min(DATASETS_TRACKED_MAX - 1)]
    }

    /// The L2ARC-hit histogram of each cache-device slot below
    /// `DEVICE_HISTOGRAMS_MAX`, by slot.
    pub fn device_histograms(&self) -> Vec<(u8, HistogramSnapshot)> {
        self.devices
            .iter()
            .enumerate()
            .map(|(slot, h)| (slot as u8, h.snapshot()))
            .collect()
    }

    /// The five histograms by name: `arc_hit`, `l2_hit`, `shared_hit`,
    /// `primary`, `frontend`.
    pub fn histograms(&self) -> [(&'static str, HistogramSnapshot); 5] {
        [
            ("arc_hit", self.arc_hit.snapshot()),
            ("l2_hit", self.l2_hit.snapshot()),
            ("shared_hit", self.shared_hit.snapshot()),
            ("primary", self.primary.snapshot()),
            ("frontend", self.frontend.snapshot()),
        ]
    }
}

impl LatencyHistogram {
    /// Records the time since `timer` started (nothing if it did not).
    #[inline]
    pub fn finish(&self, timer: Timer) {
        if let Timer(Some(start)) = timer {
            self.record(start.elapsed().as_nanos() as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_read_in_the_period_is_timed_and_weighted() {
        let a = Analytics::default();
        std::thread::spawn(move || {
            for _ in 0..ARC_HIT_SAMPLE_PERIOD * 10 {
                let t = a.start_read();
                a.finish_read(t, 0, 1);
            }
            let snap = a.arc_hit.snapshot();
            assert_eq!(snap.count(), u64::from(ARC_HIT_SAMPLE_PERIOD) * 10);

            // A read that went below is not an ARC hit.
            let mut timed = 0;
            for _ in 0..ARC_HIT_SAMPLE_PERIOD {
                let t = a.start_read();
                timed += u32::from(t.0.is_some());
                a.note_below();
                a.finish_read(t, 0, 1);
            }
            assert_eq!(timed, 1);
            assert_eq!(a.arc_hit.snapshot().count(), snap.count());

            a.set_enabled(false);
            for _ in 0..ARC_HIT_SAMPLE_PERIOD * 2 {
                let t = a.start_read();
                assert!(t.0.is_none());
                a.finish_read(t, 0, 1);
                a.primary.finish(a.start());
            }
            assert_eq!(a.arc_hit.snapshot().count(), snap.count());
            assert_eq!(a.primary.snapshot().count(), 0);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn datasets_past_the_bound_share_the_last_slot() {
        let a = Analytics::default();
        a.primary_done(a.start(), 3, 1, 4096);
        a.primary_done(a.start(), DATASETS_TRACKED_MAX + 5, 1, 10);
        a.l2_hit_done(a.start(), DATASETS_TRACKED_MAX - 1, 1, 7);
        assert_eq!(a.dataset(3).primary_read_bytes, 4096);
        let last = a.dataset(DATASETS_TRACKED_MAX - 1);
        assert_eq!((last.primary_reads, last.l2_hits), (1, 1));
        assert_eq!(a.primary.snapshot().count(), 2);
        assert_eq!(a.l2_hit.snapshot().count(), 1);
        assert_eq!((a.dataset(3).reads, a.dataset(3).misses), (1, 1));
        assert_eq!((last.reads, last.misses), (2, 2));
    }

    #[test]
    fn a_shared_tier_hit_is_a_band_of_its_own() {
        let a = Analytics::default();
        a.below_hit_done(Below::Shared, a.start(), 0, 9, 4096);
        a.below_hit_done(Below::Shared, a.start(), 0, 9, 100);
        assert_eq!(a.shared_hit.snapshot().count(), 2);
        assert_eq!(a.l2_hit.snapshot().count(), 0);
        assert!(a.device_histograms().iter().all(|(_, h)| h.count() == 0));
        let d = a.dataset(0);
        assert_eq!(
            (d.reads, d.misses, d.shared_hits, d.shared_read_bytes),
            (2, 2, 2, 4196)
        );
        assert_eq!((d.l2_hits, d.l2_read_bytes, d.primary_reads), (0, 0, 0));
        let top = &a.top_objects(1)[0];
        assert_eq!(top.object, 9);
        assert_eq!((top.misses, top.l2_hits, top.primary_reads), (2, 0, 0));
        assert_eq!(top.bytes_below, 4196);
        let names: Vec<&str> = a.histograms().iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            ["arc_hit", "l2_hit", "shared_hit", "primary", "frontend"]
        );
        // The L2ARC's band is the L2ARC's only.
        a.below_hit_done(Below::L2Arc, a.start(), 0, 9, 4096);
        assert_eq!(a.shared_hit.snapshot().count(), 2);
        assert_eq!(a.l2_hit.snapshot().count(), 1);
    }

    #[test]
    fn an_l2_hit_is_counted_for_the_device_that_served_it() {
        let a = Analytics::default();
        std::thread::spawn(move || {
            note_l2_device(2);
            a.l2_hit_done(a.start(), 0, 1, 4096);
            // The slot is taken by the hit: the next one without a note
            // (another tier) goes to no device.
            a.l2_hit_done(a.start(), 0, 1, 4096);
            note_l2_device(DEVICE_HISTOGRAMS_MAX as u8); // past the bound
            a.l2_hit_done(a.start(), 0, 1, 4096);
            let counts: Vec<u64> = a
                .device_histograms()
                .iter()
                .map(|(_, h)| h.count())
                .collect();
            assert_eq!(counts.len(), DEVICE_HISTOGRAMS_MAX);
            assert_eq!(counts[2], 1);
            assert_eq!(counts.iter().sum::<u64>(), 1);
            assert_eq!(a.l2_hit.snapshot().count(), 3);
        })
        .join()
        .unwrap();
    }
}
