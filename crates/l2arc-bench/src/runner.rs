//! Closed-loop load generation shared by every benchmark.
//!
//! N threads each issue one operation at a time for a fixed duration (a
//! closed loop, like fio at queue depth 1 per job), recording every latency
//! in a per-thread HDR histogram (merged at the end, so recording costs no
//! shared cache line) and counting completions in one relaxed atomic that a
//! sampler reads each interval to draw the warm-up curve.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

/// Latencies are recorded in nanoseconds from 100 ns to 60 s, 3 digits
/// (every scenario's histograms: `latency_histogram`).
pub(crate) const LATENCY_NS_MAX: u64 = 60_000_000_000;
pub(crate) const LATENCY_NS_MIN: u64 = 100;

/// An empty latency histogram with the bounds every scenario uses.
pub(crate) fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(LATENCY_NS_MIN, LATENCY_NS_MAX, 3).expect("valid bounds")
}

/// A small, fast, seeded generator (splitmix64) for workload choices.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    #[inline]
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        l2arc::hash::mix64(self.0)
    }

    /// Uniform in [0, n).
    #[inline]
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `p`.
    #[inline]
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct Interval {
    pub end_secs: f64,
    pub iops: f64,
}

pub(crate) struct PhaseResult {
    pub ops: u64,
    pub bytes: u64,
    pub elapsed_secs: f64,
    pub latency_ns: Histogram<u64>,
    pub intervals: Vec<Interval>,
}

impl PhaseResult {
    pub(crate) fn iops(&self) -> f64 {
        self.ops as f64 / self.elapsed_secs
    }

    pub(crate) fn mib_per_sec(&self) -> f64 {
        self.bytes as f64 / self.elapsed_secs / (1 << 20) as f64
    }

    /// IOPS over the last quarter of the phase: the warm figure.
    pub(crate) fn tail_iops(&self) -> f64 {
        let n = self.intervals.len();
        if n == 0 {
            return self.iops();
        }
        let tail = &self.intervals[n - n.div_ceil(4)..];
        tail.iter().map(|i| i.iops).sum::<f64>() / tail.len() as f64
    }

    pub(crate) fn latency_us(&self, quantile: f64) -> f64 {
        self.latency_ns.value_at_quantile(quantile) as f64 / 1000.0
    }
}

/// Runs `op(thread, rng)` from `threads` threads for `duration`. `op`
/// returns the bytes it moved. The first error stops every thread and is
/// returned.
pub(crate) fn run_phase<F>(
    label: &str,
    threads: usize,
    duration: Duration,
    interval: Duration,
    seed: u64,
    show_progress: bool,
    op: F,
) -> Result<PhaseResult>
where
    F: Fn(usize, &mut Rng) -> Result<u64> + Sync,
{
    assert!(threads > 0);
    let ops = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let progress = if show_progress {
        ProgressBar::with_draw_target(
            Some(duration.as_millis() as u64),
            ProgressDrawTarget::stderr(),
        )
    } else {
        ProgressBar::hidden()
    };
    progress.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:30}] {elapsed:>3} {msg}")
            .expect("static template")
            .progress_chars("=> "),
    );
    progress.set_prefix(label.to_string());
    let start = Instant::now();
    let (results, intervals) = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (ops, stop, op) = (&ops, &stop, &op);
                scope.spawn(move || -> Result<(Histogram<u64>, u64)> {
                    let mut rng = Rng::new(seed ^ l2arc::hash::mix64(t as u64 + 1));
                    let mut histogram = latency_histogram();
                    let mut bytes = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let began = Instant::now();
                        match op(t, &mut rng) {
                            Ok(n) => bytes += n,
                            Err(e) => {
                                stop.store(true, Ordering::Relaxed);
                                return Err(e);
                            }
                        }
                        let ns = began.elapsed().as_nanos() as u64;
                        histogram.saturating_record(ns.clamp(LATENCY_NS_MIN, LATENCY_NS_MAX));
                        ops.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok((histogram, bytes))
                })
            })
            .collect();
        let mut intervals = Vec::new();
        let mut last_ops = 0u64;
        let mut last_at = start;
        while start.elapsed() < duration && !stop.load(Ordering::Relaxed) {
            let next = last_at + interval;
            let deadline = (start + duration).min(next);
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
            let now = Instant::now();
            let total = ops.load(Ordering::Relaxed);
            let iops = (total - last_ops) as f64 / (now - last_at).as_secs_f64();
            intervals.push(Interval {
                end_secs: (now - start).as_secs_f64(),
                iops,
            });
            progress.set_position((now - start).as_millis() as u64);
            progress.set_message(format!("{iops:>10.0} IOPS"));
            last_ops = total;
            last_at = now;
        }
        stop.store(true, Ordering::Relaxed);
        let results: Vec<_> = workers
            .into_iter()
            .map(|w| w.join().expect("benchmark worker panicked"))
            .collect();
        (results, intervals)
    });
    let elapsed_secs = start.elapsed().as_secs_f64();
    progress.finish_and_clear();
    let mut latency_ns = latency_histogram();
    let mut bytes = 0;
    for result in results {
        let (histogram, b) = result?;
        latency_ns.add(&histogram).expect("same bounds");
        bytes += b;
    }
    Ok(PhaseResult {
        ops: latency_ns.len(),
        bytes,
        elapsed_secs,
        latency_ns,
        intervals,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_op_and_stops_on_error() {
        let result = run_phase(
            "t",
            2,
            Duration::from_millis(200),
            Duration::from_millis(50),
            1,
            false,
            |_, _| {
                std::thread::sleep(Duration::from_millis(1));
                Ok(10)
            },
        )
        .unwrap();
        assert!(
            result.ops > 50,
            "two threads doing 1 ms ops for 200 ms: {}",
            result.ops
        );
        assert_eq!(result.bytes, result.ops * 10);
        assert!(result.latency_us(0.5) >= 1000.0);
        assert!(!result.intervals.is_empty());

        let failing = run_phase(
            "t",
            2,
            Duration::from_secs(30),
            Duration::from_millis(50),
            1,
            false,
            |_, _| anyhow::bail!("boom"),
        );
        assert!(failing.is_err());
    }

    #[test]
    fn rng_is_uniform_enough() {
        let mut rng = Rng::new(7);
        let mut buckets = [0u32; 10];
        for _ in 0..100_000 {
            buckets[rng.below(10) as usize] += 1;
        }
        assert!(
            buckets.iter().all(|&b| (9_000..11_000).contains(&b)),
            "{buckets:?}"
        );
    }
}
