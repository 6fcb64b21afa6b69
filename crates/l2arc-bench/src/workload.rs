//! Closed-loop reads through a `ReadTarget`, sampled per interval.
//!
//! The seed experiments' scenarios need more than `runner::run_phase` gives: each
//! interval's latency distribution (the heatmap), the target's counters per
//! interval (the L2ARC fill curve), and phases that end when the cache stops
//! warming rather than after a fixed time. So this runner
//!
//! - times and verifies every single read (a wrong byte ends the run with an
//!   error naming file and offset: a fast wrong answer must not win);
//! - records each read twice: in a per-thread HDR histogram (exact
//!   percentiles, merged at the end, no shared cache line on the hot path)
//!   and in a coarse log-bucket row of the interval it completed in (relaxed
//!   atomics; 30 buckets of 5 per decade is what the heatmap can show, and a
//!   read costs at least tens of microseconds, so the shared counters are
//!   noise);
//! - samples the target's counters at every interval boundary and asks the
//!   scenario's `stop` predicate whether the phase is over.
//!
//! Intervals are aligned to the phase start, so row k of the heatmap and
//! sample k describe the same second. Reads that complete after the stop are
//! dropped: every figure covers exactly the sampled intervals.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use hdrhistogram::Histogram;
use serde::Serialize;

use super::dataset::DatasetSpec;
use super::runner::Rng;
use super::targets::{ReadTarget, TargetCounters};

/// Latencies are recorded in nanoseconds from 100 ns to 60 s, 3 digits.
/// Heatmap buckets: 5 per decade from 10 µs (bucket 0 also takes anything
/// faster) to 10 s (the last also takes anything slower).
pub(crate) const HEATMAP_BUCKETS: usize = 30;
const HEATMAP_FIRST_NS: f64 = 10_000.0;
const HEATMAP_PER_DECADE: f64 = 5.0;
/// Longest phase, a bound on the per-interval rows allocated up front.
const MAX_INTERVALS: usize = 100_000;

/// The heatmap bucket of a latency.
pub(crate) fn latency_bucket(latency_ns: u64) -> usize {
    let decades = (latency_ns.max(1) as f64 / HEATMAP_FIRST_NS).log10();
    ((decades * HEATMAP_PER_DECADE).floor().max(0.0) as usize).min(HEATMAP_BUCKETS - 1)
}

/// Lower edge of heatmap bucket `i`, in nanoseconds.
pub(crate) fn bucket_lower_ns(i: usize) -> f64 {
    HEATMAP_FIRST_NS * 10f64.powf(i as f64 / HEATMAP_PER_DECADE)
}

/// One interval of a phase.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Sample {
    pub end_secs: f64,
    pub ios: u64,
    pub bytes: u64,
    pub iops: f64,
    pub mib_per_sec: f64,
    /// The target's cumulative counters at the end of the interval.
    pub counters: TargetCounters,
    /// Reads completed in the interval per heatmap bucket.
    pub latency_buckets: Vec<u64>,
}

/// What every closed-loop scenario report says about its set-up (flattened
/// into the report's JSON, so the fields sit beside the scenario's own).
#[derive(Serialize)]
pub(crate) struct Setup {
    pub read_bytes: u64,
    pub working_set_bytes: u64,
    pub arc_max_bytes: u64,
    pub cache_size_bytes: u64,
    pub recordsize_bytes: u64,
    pub compression: bool,
    pub hdd: String,
    pub content: String,
    pub dataset_lz4_ratio: f64,
    pub heatmap_bucket_lower_us: Vec<f64>,
}

impl Setup {
    pub(crate) fn new(
        args: &super::BenchArgs,
        bench: &super::targets::Bench,
        spec: &super::targets::TargetSpec,
        read_bytes: u64,
    ) -> Setup {
        Setup {
            read_bytes,
            working_set_bytes: spec.total_bytes(),
            arc_max_bytes: args.arc_max,
            cache_size_bytes: args.cache_size,
            recordsize_bytes: u64::from(spec.recordsize_bytes),
            compression: spec.compression,
            hdd: bench.describe_hdd(),
            content: format!("{:?}", args.content).to_lowercase(),
            dataset_lz4_ratio: bench.lz4_ratio,
            heatmap_bucket_lower_us: (0..HEATMAP_BUCKETS)
                .map(|i| bucket_lower_ns(i) / 1000.0)
                .collect(),
        }
    }
}

pub(crate) struct PhaseRun {
    pub ios: u64,
    pub bytes: u64,
    pub elapsed_secs: f64,
    pub latency_ns: Histogram<u64>,
    pub samples: Vec<Sample>,
}

impl PhaseRun {
    pub(crate) fn iops(&self) -> f64 {
        self.ios as f64 / self.elapsed_secs.max(1e-9)
    }

    pub(crate) fn mib_per_sec(&self) -> f64 {
        self.bytes as f64 / self.elapsed_secs.max(1e-9) / (1 << 20) as f64
    }

    pub(crate) fn latency_us(&self, quantile: f64) -> f64 {
        self.latency_ns.value_at_quantile(quantile) as f64 / 1000.0
    }
}

struct Shared {
    start: Instant,
    interval_ns: u64,
    stop: AtomicBool,
    ios: AtomicU64,
    bytes: AtomicU64,
    rows: Vec<[AtomicU64; HEATMAP_BUCKETS]>,
}

/// What one reader thread uses to read: times, verifies and records.
pub(crate) struct Reader<'a> {
    target: &'a dyn ReadTarget,
    dataset: &'a DatasetSpec,
    shared: &'a Shared,
    histogram: Histogram<u64>,
    buf: Vec<u8>,
}

impl Reader<'_> {
    /// Reads `len_bytes` of `file` at `offset`, checks every byte, records
    /// the latency. A short read or a wrong byte is an error.
    pub(crate) fn read(&mut self, file: u32, offset: u64, len_bytes: usize) -> Result<()> {
        if self.buf.len() < len_bytes {
            self.buf.resize(len_bytes, 0);
        }
        let buf = &mut self.buf[..len_bytes];
        let began = Instant::now();
        let n = self.target.read(file, offset, buf)?;
        let ended = Instant::now();
        if n != len_bytes || !self.dataset.verify(file, offset, &buf[..n]) {
            bail!(
                "{}: wrong bytes at file {file} offset {offset}: read {n} of {len_bytes} bytes, not matching the dataset",
                self.target.name()
            );
        }
        if self.shared.stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        let latency_ns = (ended - began).as_nanos() as u64;
        self.histogram.saturating_record(
            latency_ns.clamp(super::runner::LATENCY_NS_MIN, super::runner::LATENCY_NS_MAX),
        );
        let row =
            ((ended - self.shared.start).as_nanos() as u64 / self.shared.interval_ns) as usize;
        let row = row.min(self.shared.rows.len() - 1);
        self.shared.rows[row][latency_bucket(latency_ns)].fetch_add(1, Ordering::Relaxed);
        self.shared.ios.fetch_add(1, Ordering::Relaxed);
        self.shared.bytes.fetch_add(n as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Runs `op` from `threads` threads until `stop(samples)` says so at an
/// interval boundary or `max_duration` has passed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<F, S>(
    target: &dyn ReadTarget,
    dataset: &DatasetSpec,
    threads: usize,
    max_duration: Duration,
    interval: Duration,
    seed: u64,
    mut stop: S,
    op: F,
) -> Result<PhaseRun>
where
    F: Fn(&mut Rng, &mut Reader) -> Result<()> + Sync,
    S: FnMut(&[Sample]) -> bool,
{
    assert!(threads > 0 && threads <= 4096);
    assert!(!interval.is_zero());
    let interval_ns = interval.as_nanos() as u64;
    let max_intervals = (max_duration.as_nanos() as u64)
        .div_ceil(interval_ns)
        .max(1) as usize;
    if max_intervals > MAX_INTERVALS {
        bail!("a phase of more than {MAX_INTERVALS} intervals");
    }
    let shared = Shared {
        start: Instant::now(),
        interval_ns,
        stop: AtomicBool::new(false),
        ios: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        // One spare row takes the reads that end after the last boundary.
        rows: (0..=max_intervals)
            .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
            .collect(),
    };
    let mut samples: Vec<Sample> = Vec::new();
    let results = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (shared, op) = (&shared, &op);
                scope.spawn(move || -> Result<Histogram<u64>> {
                    let mut rng = Rng::new(seed ^ l2arc::hash::mix64(t as u64 + 1));
                    let mut reader = Reader {
                        target,
                        dataset,
                        shared,
                        histogram: super::runner::latency_histogram(),
                        buf: Vec::new(),
                    };
                    while !shared.stop.load(Ordering::Relaxed) {
                        if let Err(e) = op(&mut rng, &mut reader) {
                            shared.stop.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                    }
                    Ok(reader.histogram)
                })
            })
            .collect();
        let (mut last_ios, mut last_bytes) = (0u64, 0u64);
        for k in 0..max_intervals {
            let boundary = shared.start + interval * (k as u32 + 1);
            std::thread::sleep(boundary.saturating_duration_since(Instant::now()));
            if shared.stop.load(Ordering::Relaxed) {
                break; // a worker failed
            }
            let (ios, bytes) = (
                shared.ios.load(Ordering::Relaxed),
                shared.bytes.load(Ordering::Relaxed),
            );
            let secs = interval.as_secs_f64();
            samples.push(Sample {
                end_secs: (k + 1) as f64 * secs,
                ios: ios - last_ios,
                bytes: bytes - last_bytes,
                iops: (ios - last_ios) as f64 / secs,
                mib_per_sec: (bytes - last_bytes) as f64 / secs / (1 << 20) as f64,
                counters: target.counters(),
                latency_buckets: Vec::new(),
            });
            (last_ios, last_bytes) = (ios, bytes);
            if stop(&samples) {
                break;
            }
        }
        shared.stop.store(true, Ordering::Relaxed);
        workers
            .into_iter()
            .map(|w| w.join().expect("benchmark worker panicked"))
            .collect::<Vec<_>>()
    });
    let mut latency_ns = super::runner::latency_histogram();
    for result in results {
        latency_ns.add(&result?).expect("same bounds");
    }
    for (k, sample) in samples.iter_mut().enumerate() {
        sample.latency_buckets = shared.rows[k]
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
    }
    let elapsed_secs = samples.len() as f64 * interval.as_secs_f64();
    Ok(PhaseRun {
        ios: shared.ios.load(Ordering::Relaxed),
        bytes: shared.bytes.load(Ordering::Relaxed),
        elapsed_secs,
        latency_ns,
        samples,
    })
}

/// A `stop` predicate that treats every system alike: the share of reads
/// that went to the disk stopped falling, and the flash tier stopped
/// filling. It compares the miss ratio over the last `window` intervals
/// with the `window` before (settled: it fell by less than
/// `min_relative_drop`, 0.05 = 5%) and requires the fill to have grown by
/// less than `min_fill_growth_bytes` over the last window, after
/// `min_intervals`. Neither rule alone will do: at the start the miss ratio
/// sits near 100% while the flash tier is still being written, and peers
/// count their fill differently (foyer reports bytes written, capped at its
/// capacity), so a full cache may still be improving its hit ratio.
pub(crate) fn misses_settled(
    min_intervals: usize,
    window: usize,
    min_relative_drop: f64,
    min_fill_growth_bytes: u64,
) -> impl FnMut(&[Sample]) -> bool {
    assert!(window > 0);
    assert!((0.0..1.0).contains(&min_relative_drop));
    move |samples: &[Sample]| {
        let n = samples.len();
        if n < min_intervals.max(2 * window + 1) {
            return false;
        }
        let ratio = |from: &Sample, to: &Sample| {
            let d = to.counters.since(&from.counters);
            let total = d.dram_hits + d.flash_hits + d.misses;
            (total > 0).then(|| d.misses as f64 / total as f64)
        };
        let filling = samples[n - 1].counters.flash_bytes
            >= samples[n - 1 - window].counters.flash_bytes + min_fill_growth_bytes;
        if filling {
            return false;
        }
        let last = ratio(&samples[n - 1 - window], &samples[n - 1]);
        let before = ratio(&samples[n - 1 - 2 * window], &samples[n - 1 - window]);
        match (before, last) {
            (Some(before), Some(last)) => last >= before * (1.0 - min_relative_drop),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(dram_hits: u64, misses: u64) -> Sample {
        Sample {
            end_secs: 0.0,
            ios: 0,
            bytes: 0,
            iops: 0.0,
            mib_per_sec: 0.0,
            counters: TargetCounters {
                dram_hits,
                misses,
                ..TargetCounters::default()
            },
            latency_buckets: Vec::new(),
        }
    }

    #[test]
    fn misses_settled_waits_until_the_miss_ratio_stops_falling() {
        let mut stop = misses_settled(4, 2, 0.05, 1);
        // Hits grow faster each interval, misses steady: still warming.
        let mut samples = vec![sample(0, 0)];
        let (mut hits, mut misses) = (0, 0);
        for step in 1..=6u64 {
            hits += 100 * step * step;
            misses += 100;
            samples.push(sample(hits, misses));
            assert!(!stop(&samples), "stopped while warming at {step}");
        }
        // Now a steady state: same hits and misses per interval.
        for _ in 0..5 {
            hits += 5000;
            misses += 100;
            samples.push(sample(hits, misses));
        }
        assert!(stop(&samples));
        // The same, but the flash tier still filling: not settled.
        let last = samples.last_mut().unwrap();
        last.counters.flash_bytes += 1 << 20;
        assert!(!stop(&samples));
    }

    #[test]
    fn buckets_are_five_per_decade_from_ten_microseconds() {
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(9_999), 0);
        assert_eq!(latency_bucket(10_000), 0);
        assert_eq!(latency_bucket(100_000), 5);
        assert_eq!(latency_bucket(1_000_000), 10);
        assert_eq!(latency_bucket(u64::MAX), HEATMAP_BUCKETS - 1);
        for i in 0..HEATMAP_BUCKETS {
            assert_eq!(latency_bucket(bucket_lower_ns(i).ceil() as u64 + 1), i);
        }
    }
}
