//! The one phase runner every scenario measures with.
//!
//! A phase is N threads each doing one operation at a time (a closed loop,
//! like fio at queue depth 1 per job) until a deadline passes or a fixed
//! number of operations is done. Every scenario's figures come out of the
//! same loop, so they are taken the same way:
//!
//! - each completed operation's latency goes into a per-thread HDR
//!   histogram (`latency_histogram`: merged at the end, so recording costs
//!   no shared cache line) and into a coarse log-bucket row of the interval
//!   it completed in (30 buckets of 5 per decade: what a heatmap can show;
//!   per thread too, merged at the end);
//! - completions and bytes are counted per thread in a padded atomic that
//!   only its thread writes; the calling thread sums them at every interval
//!   boundary (intervals are aligned to the phase start, so interval k and
//!   heatmap row k describe the same second) and hands the interval to a
//!   `Watch`, which may end the phase early (a cache that stopped warming);
//! - an operation that completes after the phase stopped, or during its
//!   warm-up, is not recorded: every figure covers exactly the sampled
//!   intervals;
//! - the first error of any thread stops every thread and is returned.
//!
//! An operation either lets the runner time it (`Worker::timed`, or
//! `run_timed` for the whole phase) or times its own parts and records
//! each (`Worker::record`: a read queue's completions, a verified read
//! whose check must not count as latency).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Latencies are recorded in nanoseconds from 100 ns to 60 s, 3 digits
/// (every scenario's histograms: `latency_histogram`).
pub(crate) const LATENCY_NS_MAX: u64 = 60_000_000_000;
pub(crate) const LATENCY_NS_MIN: u64 = 100;

/// Heatmap buckets: 5 per decade from 10 µs (bucket 0 also takes anything
/// faster) to 10 s (the last also takes anything slower).
pub(crate) const HEATMAP_BUCKETS: usize = 30;
const HEATMAP_FIRST_NS: f64 = 10_000.0;
const HEATMAP_PER_DECADE: f64 = 5.0;

/// An empty latency histogram with the bounds every scenario uses.
pub(crate) fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(LATENCY_NS_MIN, LATENCY_NS_MAX, 3).expect("valid bounds")
}

/// The heatmap bucket of a latency.
pub(crate) fn latency_bucket(latency_ns: u64) -> usize {
    let decades = (latency_ns.max(1) as f64 / HEATMAP_FIRST_NS).log10();
    ((decades * HEATMAP_PER_DECADE).floor().max(0.0) as usize).min(HEATMAP_BUCKETS - 1)
}

/// Lower edge of heatmap bucket `i`, in nanoseconds.
pub(crate) fn bucket_lower_ns(i: usize) -> f64 {
    HEATMAP_FIRST_NS * 10f64.powf(i as f64 / HEATMAP_PER_DECADE)
}

/// CPU time (user + system) of the calling thread, in seconds.
pub(crate) fn thread_cpu_secs() -> f64 {
    // SAFETY: getrusage writes one rusage into the zeroed struct given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
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

/// When a phase ends.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Until {
    /// After this long (measured from the end of the warm-up), or earlier if
    /// the `Watch` says so.
    Elapsed(Duration),
    /// When this many operations are done, each handed out once
    /// (`Worker::op_index`) to whichever thread is free.
    Ops(u64),
}

/// How a phase runs: built with `Phase::new`, adjusted with its setters.
#[derive(Clone, Debug)]
pub(crate) struct Phase<'a> {
    label: &'a str,
    threads: usize,
    until: Until,
    warmup: Duration,
    interval: Duration,
    seed: u64,
    show_progress: bool,
}

impl<'a> Phase<'a> {
    /// `threads` threads until `until`; one interval (the whole phase, or
    /// 1 s for `Until::Ops`), no warm-up, seed 0, no progress bar.
    pub(crate) fn new(label: &'a str, threads: usize, until: Until) -> Self {
        assert!(threads > 0 && threads <= 4096);
        let interval = match until {
            Until::Elapsed(duration) => duration,
            Until::Ops(_) => Duration::from_secs(1),
        };
        Self {
            label,
            threads,
            until,
            warmup: Duration::ZERO,
            interval,
            seed: 0,
            show_progress: false,
        }
    }

    /// Sampling interval (the warm-up curve's resolution, the `Watch`'s beat).
    pub(crate) fn interval(mut self, interval: Duration) -> Self {
        assert!(!interval.is_zero());
        self.interval = interval;
        self
    }

    /// Thread `t` draws from `Rng::new(seed ^ mix64(t + 1))`.
    pub(crate) fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Operations run but are not recorded for this long first.
    pub(crate) fn warmup(mut self, warmup: Duration) -> Self {
        self.warmup = warmup;
        self
    }

    /// A progress bar on stderr, with the IOPS of the last interval.
    pub(crate) fn progress(mut self, show: bool) -> Self {
        self.show_progress = show;
        self
    }
}

/// One sampled interval of a phase.
#[derive(Clone, Debug)]
pub(crate) struct Interval {
    /// End of the interval, seconds since the measured part began.
    pub end_secs: f64,
    /// Length of the interval (the last one of a phase may be shorter).
    pub secs: f64,
    pub ops: u64,
    pub bytes: u64,
    /// Operations completed in the interval per heatmap bucket.
    pub latency_buckets: Vec<u64>,
}

impl Interval {
    pub(crate) fn iops(&self) -> f64 {
        self.ops as f64 / self.secs.max(1e-9)
    }

    pub(crate) fn mib_per_sec(&self) -> f64 {
        self.bytes as f64 / self.secs.max(1e-9) / (1 << 20) as f64
    }
}

/// What a phase measured.
pub(crate) struct PhaseResult {
    pub ops: u64,
    pub bytes: u64,
    pub elapsed_secs: f64,
    pub latency_ns: Histogram<u64>,
    pub intervals: Vec<Interval>,
    /// CPU time (user + system) of the phase's threads over the measured part.
    pub cpu_secs: f64,
}

impl PhaseResult {
    pub(crate) fn iops(&self) -> f64 {
        self.ops as f64 / self.elapsed_secs.max(1e-9)
    }

    pub(crate) fn mib_per_sec(&self) -> f64 {
        self.bytes as f64 / self.elapsed_secs.max(1e-9) / (1 << 20) as f64
    }

    /// IOPS over the last quarter of the phase: the warm figure.
    pub(crate) fn tail_iops(&self) -> f64 {
        let n = self.intervals.len();
        if n == 0 {
            return self.iops();
        }
        let tail = &self.intervals[n - n.div_ceil(4)..];
        tail.iter().map(Interval::iops).sum::<f64>() / tail.len() as f64
    }

    pub(crate) fn latency_us(&self, quantile: f64) -> f64 {
        self.latency_ns.value_at_quantile(quantile) as f64 / 1000.0
    }
}

/// What a scenario watches while a phase runs (the calling thread calls it).
pub(crate) trait Watch {
    /// The warm-up is over: the measured part begins.
    fn started(&mut self) {}

    /// An interval ended (the last of `intervals`); true ends the phase.
    fn interval(&mut self, intervals: &[Interval]) -> bool {
        let _ = intervals;
        false
    }
}

/// Watches nothing.
impl Watch for () {}

/// One thread's completions and bytes: written by that thread alone, read at
/// interval boundaries (its own cache line, so threads do not share one).
#[derive(Default)]
#[repr(align(128))]
struct Counts {
    ops: AtomicU64,
    bytes: AtomicU64,
}

struct Shared {
    measure_from: Instant,
    interval_ns: u64,
    stop: AtomicBool,
    next_op: AtomicU64,
    counts: Vec<Counts>,
}

impl Shared {
    fn totals(&self) -> (u64, u64) {
        self.counts.iter().fold((0, 0), |(ops, bytes), c| {
            (
                ops + c.ops.load(Ordering::Relaxed),
                bytes + c.bytes.load(Ordering::Relaxed),
            )
        })
    }
}

/// One thread of a phase: its random stream, and where it records what its
/// operations did.
pub(crate) struct Worker<'a> {
    pub rng: Rng,
    op_index: u64,
    shared: &'a Shared,
    counts: &'a Counts,
    latency_ns: Histogram<u64>,
    rows: Vec<[u64; HEATMAP_BUCKETS]>,
}

impl Worker<'_> {
    /// The current operation: its index in `0..n` under `Until::Ops(n)`,
    /// otherwise how many this thread ran before it.
    pub(crate) fn op_index(&self) -> u64 {
        self.op_index
    }

    /// Records one completed operation that moved `bytes`, unless it ended
    /// during the warm-up or after the phase stopped.
    pub(crate) fn record(&mut self, began: Instant, ended: Instant, bytes: u64) {
        if ended < self.shared.measure_from || self.shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let latency_ns = (ended - began).as_nanos() as u64;
        self.latency_ns
            .saturating_record(latency_ns.clamp(LATENCY_NS_MIN, LATENCY_NS_MAX));
        let row = ((ended - self.shared.measure_from).as_nanos() as u64 / self.shared.interval_ns)
            as usize;
        if row >= self.rows.len() {
            self.rows.resize(row + 1, [0; HEATMAP_BUCKETS]);
        }
        self.rows[row][latency_bucket(latency_ns)] += 1;
        self.counts.ops.fetch_add(1, Ordering::Relaxed);
        self.counts.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Times `op` (which returns the bytes it moved) and records it.
    pub(crate) fn timed(&mut self, op: impl FnOnce(&mut Rng) -> Result<u64>) -> Result<()> {
        let began = Instant::now();
        let bytes = op(&mut self.rng)?;
        self.record(began, Instant::now(), bytes);
        Ok(())
    }
}

/// What a worker thread hands back: its latencies, heatmap rows and CPU time.
type WorkerTotals = (Histogram<u64>, Vec<[u64; HEATMAP_BUCKETS]>, f64);

/// Runs `phase`: each thread makes its state with `init`, then calls `op`
/// until the phase ends; `watch` sees every interval.
pub(crate) fn run<S, Init, Op>(
    phase: &Phase,
    watch: &mut dyn Watch,
    init: Init,
    op: Op,
) -> Result<PhaseResult>
where
    Init: Fn(&mut Worker) -> Result<S> + Sync,
    Op: Fn(&mut S, &mut Worker) -> Result<()> + Sync,
{
    let start = Instant::now();
    let shared = Shared {
        measure_from: start + phase.warmup,
        interval_ns: (phase.interval.as_nanos() as u64).max(1),
        stop: AtomicBool::new(false),
        next_op: AtomicU64::new(0),
        counts: (0..phase.threads).map(|_| Counts::default()).collect(),
    };
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let (results, mut intervals) = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..phase.threads)
            .map(|t| {
                let (shared, init, op, done_tx) = (&shared, &init, &op, done_tx.clone());
                scope.spawn(move || {
                    let result = work(phase, shared, t, init, op);
                    let _ = done_tx.send(());
                    result
                })
            })
            .collect();
        drop(done_tx);
        let intervals = Sampler::new(phase, &shared, done_rx).run(watch);
        shared.stop.store(true, Ordering::Relaxed);
        let results: Vec<Result<WorkerTotals>> = workers
            .into_iter()
            .map(|w| w.join().expect("benchmark worker panicked"))
            .collect();
        (results, intervals)
    });
    merge(results, &mut intervals)
}

/// Runs `phase` with `op` timed as one operation (it returns the bytes it
/// moved); no per-thread state, nothing watched.
pub(crate) fn run_timed<Op>(phase: &Phase, op: Op) -> Result<PhaseResult>
where
    Op: Fn(&mut Rng) -> Result<u64> + Sync,
{
    run(phase, &mut (), |_| Ok(()), |(), worker| worker.timed(&op))
}

/// One worker thread: its state, then operations until the phase ends.
fn work<S>(
    phase: &Phase,
    shared: &Shared,
    thread: usize,
    init: &impl Fn(&mut Worker) -> Result<S>,
    op: &impl Fn(&mut S, &mut Worker) -> Result<()>,
) -> Result<WorkerTotals> {
    let mut worker = Worker {
        rng: Rng::new(phase.seed ^ l2arc::hash::mix64(thread as u64 + 1)),
        op_index: 0,
        shared,
        counts: &shared.counts[thread],
        latency_ns: latency_histogram(),
        rows: Vec::new(),
    };
    let stop_on_error = |e| {
        shared.stop.store(true, Ordering::Relaxed);
        e
    };
    let mut state = init(&mut worker).map_err(stop_on_error)?;
    let mut cpu_from = phase.warmup.is_zero().then(thread_cpu_secs);
    while !shared.stop.load(Ordering::Relaxed) {
        if let Until::Ops(n) = phase.until {
            worker.op_index = shared.next_op.fetch_add(1, Ordering::Relaxed);
            if worker.op_index >= n {
                break;
            }
        }
        if cpu_from.is_none() && Instant::now() >= shared.measure_from {
            cpu_from = Some(thread_cpu_secs());
        }
        op(&mut state, &mut worker).map_err(stop_on_error)?;
        if let Until::Elapsed(_) = phase.until {
            worker.op_index += 1;
        }
    }
    let cpu_secs = cpu_from.map_or(0.0, |from| thread_cpu_secs() - from);
    drop(state);
    Ok((worker.latency_ns, worker.rows, cpu_secs))
}

/// Merges the threads' histograms and heatmap rows into the result.
fn merge(results: Vec<Result<WorkerTotals>>, intervals: &mut Vec<Interval>) -> Result<PhaseResult> {
    let mut latency_ns = latency_histogram();
    let mut cpu_secs = 0.0;
    let mut rows: Vec<[u64; HEATMAP_BUCKETS]> = Vec::new();
    for result in results {
        let (histogram, thread_rows, thread_cpu_secs) = result?;
        latency_ns.add(&histogram).expect("same bounds");
        cpu_secs += thread_cpu_secs;
        if rows.len() < thread_rows.len() {
            rows.resize(thread_rows.len(), [0; HEATMAP_BUCKETS]);
        }
        for (row, thread_row) in rows.iter_mut().zip(&thread_rows) {
            for (count, thread_count) in row.iter_mut().zip(thread_row) {
                *count += thread_count;
            }
        }
    }
    for (k, interval) in intervals.iter_mut().enumerate() {
        interval.latency_buckets = rows
            .get(k)
            .map_or_else(|| vec![0; HEATMAP_BUCKETS], |row| row.to_vec());
    }
    Ok(PhaseResult {
        ops: intervals.iter().map(|i| i.ops).sum(),
        bytes: intervals.iter().map(|i| i.bytes).sum(),
        elapsed_secs: intervals.iter().map(|i| i.secs).sum(),
        latency_ns,
        intervals: std::mem::take(intervals),
        cpu_secs,
    })
}

/// The calling thread's part of a phase: waits for each interval boundary
/// (or for every worker to finish), samples the counts, asks the `Watch`.
struct Sampler<'a> {
    phase: &'a Phase<'a>,
    shared: &'a Shared,
    done: mpsc::Receiver<()>,
    workers_done: usize,
    progress: ProgressBar,
}

impl<'a> Sampler<'a> {
    fn new(phase: &'a Phase<'a>, shared: &'a Shared, done: mpsc::Receiver<()>) -> Self {
        let progress = match phase.until {
            Until::Elapsed(duration) if phase.show_progress => ProgressBar::with_draw_target(
                Some(duration.as_millis() as u64),
                ProgressDrawTarget::stderr(),
            ),
            _ => ProgressBar::hidden(),
        };
        progress.set_style(
            ProgressStyle::with_template("{prefix:>12} [{bar:30}] {elapsed:>3} {msg}")
                .expect("static template")
                .progress_chars("=> "),
        );
        progress.set_prefix(phase.label.to_string());
        Self {
            phase,
            shared,
            done,
            workers_done: 0,
            progress,
        }
    }

    fn all_done(&self) -> bool {
        self.workers_done == self.phase.threads
    }

    fn stopped(&self) -> bool {
        self.shared.stop.load(Ordering::Relaxed)
    }

    /// Sleeps until `at`, or until every worker has finished.
    fn wait_until(&mut self, at: Instant) {
        while !self.all_done() {
            let now = Instant::now();
            if now >= at {
                return;
            }
            match self.done.recv_timeout(at - now) {
                Ok(()) => self.workers_done += 1,
                Err(mpsc::RecvTimeoutError::Timeout) => return,
                Err(mpsc::RecvTimeoutError::Disconnected) => self.workers_done = self.phase.threads,
            }
        }
    }

    fn run(mut self, watch: &mut dyn Watch) -> Vec<Interval> {
        let measure_from = self.shared.measure_from;
        self.wait_until(measure_from);
        let mut intervals: Vec<Interval> = Vec::new();
        if self.stopped() || (self.all_done() && self.phase.warmup > Duration::ZERO) {
            return intervals;
        }
        watch.started();
        let deadline = match self.phase.until {
            Until::Elapsed(duration) => Some(measure_from + duration),
            Until::Ops(_) => None,
        };
        let (mut last_ops, mut last_bytes, mut last_at) = (0, 0, measure_from);
        for k in 1u32.. {
            let boundary = measure_from + self.phase.interval * k;
            let boundary = deadline.map_or(boundary, |d| boundary.min(d));
            self.wait_until(boundary);
            if self.stopped() {
                break; // a worker failed
            }
            let end = if self.all_done() {
                Instant::now().min(boundary)
            } else {
                boundary
            };
            let (ops, bytes) = self.shared.totals();
            intervals.push(Interval {
                end_secs: (end - measure_from).as_secs_f64(),
                secs: (end - last_at).as_secs_f64(),
                ops: ops - last_ops,
                bytes: bytes - last_bytes,
                latency_buckets: Vec::new(),
            });
            (last_ops, last_bytes, last_at) = (ops, bytes, end);
            self.show(&intervals);
            if watch.interval(&intervals) || self.all_done() || deadline == Some(boundary) {
                break;
            }
        }
        self.progress.finish_and_clear();
        intervals
    }

    fn show(&self, intervals: &[Interval]) {
        if let Some(last) = intervals.last() {
            self.progress.set_position((last.end_secs * 1000.0) as u64);
            self.progress
                .set_message(format!("{:>10.0} IOPS", last.iops()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_op_and_stops_on_error() {
        let phase = Phase::new("t", 2, Until::Elapsed(Duration::from_millis(200)))
            .interval(Duration::from_millis(50))
            .seed(1);
        let result = run_timed(&phase, |_| {
            std::thread::sleep(Duration::from_millis(1));
            Ok(10)
        })
        .unwrap();
        assert!(
            result.ops > 50,
            "two threads doing 1 ms ops for 200 ms: {}",
            result.ops
        );
        assert_eq!(result.bytes, result.ops * 10);
        assert!(result.latency_us(0.5) >= 1000.0);
        assert_eq!(result.intervals.len(), 4);
        assert!((result.elapsed_secs - 0.2).abs() < 1e-6);

        let phase = Phase::new("t", 2, Until::Elapsed(Duration::from_secs(30)));
        let failing = run_timed(&phase, |_| anyhow::bail!("boom"));
        assert!(failing.is_err());
    }

    #[test]
    fn op_counts_hand_out_every_index_once() {
        let seen: Vec<AtomicU64> = (0..1000).map(|_| AtomicU64::new(0)).collect();
        let phase = Phase::new("t", 3, Until::Ops(1000));
        let result = run(
            &phase,
            &mut (),
            |_| Ok(()),
            |(), worker| {
                let i = worker.op_index();
                worker.timed(|_| {
                    seen[i as usize].fetch_add(1, Ordering::Relaxed);
                    Ok(1)
                })
            },
        )
        .unwrap();
        assert_eq!(result.ops, 1000);
        assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn warmup_is_not_recorded_and_the_watch_can_stop() {
        struct StopAfterTwo(bool);
        impl Watch for StopAfterTwo {
            fn started(&mut self) {
                self.0 = true;
            }
            fn interval(&mut self, intervals: &[Interval]) -> bool {
                intervals.len() == 2
            }
        }
        let mut watch = StopAfterTwo(false);
        let phase = Phase::new("t", 1, Until::Elapsed(Duration::from_secs(30)))
            .warmup(Duration::from_millis(50))
            .interval(Duration::from_millis(20));
        let result = run(
            &phase,
            &mut watch,
            |_| Ok(()),
            |(), worker| {
                worker.timed(|_| {
                    std::thread::sleep(Duration::from_millis(1));
                    Ok(1)
                })
            },
        )
        .unwrap();
        assert!(watch.0);
        assert_eq!(result.intervals.len(), 2);
        assert!(result.ops < 60, "{} ops in 40 ms of 1 ms ops", result.ops);
        let bucketed: u64 = result
            .intervals
            .iter()
            .flat_map(|i| &i.latency_buckets)
            .sum();
        assert!(bucketed > 0);
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
