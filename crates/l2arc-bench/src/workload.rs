//! Verified reads through a `ReadTarget`, sampled per interval: the seed
//! experiments' phases, on the one runner (`runner::run`).
//!
//! The seed experiments' scenarios need more than a count of operations:
//! each interval's latency distribution (the heatmap, which the runner
//! keeps), the target's counters per interval (the L2ARC fill curve), and
//! phases that end when the cache stops warming rather than after a fixed
//! time. So a phase here
//!
//! - times and verifies every single read (a wrong byte ends the run with an
//!   error naming file and offset: a fast wrong answer must not win), and
//!   records the read alone as the runner's operation, without the check;
//! - samples the target's counters at every interval boundary and asks the
//!   scenario's `stop` predicate whether the phase is over.

use std::time::Instant;

use anyhow::{Result, bail};
use serde::Serialize;

use super::dataset::DatasetSpec;
use super::runner::{self, HEATMAP_BUCKETS, Interval, Phase, PhaseResult, Rng, Worker};
use super::targets::{ReadTarget, TargetCounters};

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
                .map(|i| runner::bucket_lower_ns(i) / 1000.0)
                .collect(),
        }
    }
}

/// A phase of reads: the runner's figures, and the target's per interval.
pub(crate) struct PhaseRun {
    pub phase: PhaseResult,
    pub samples: Vec<Sample>,
}

/// What one reader thread reads through: times, verifies and records.
pub(crate) struct Reader<'r, 'w> {
    target: &'r dyn ReadTarget,
    dataset: &'r DatasetSpec,
    buf: &'r mut Vec<u8>,
    worker: &'r mut Worker<'w>,
}

impl Reader<'_, '_> {
    /// This thread's random stream.
    pub(crate) fn rng(&mut self) -> &mut Rng {
        &mut self.worker.rng
    }

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
        self.worker.record(began, ended, n as u64);
        Ok(())
    }
}

/// Samples the target's counters at each interval and asks `stop`.
struct CounterWatch<'a, S> {
    target: &'a dyn ReadTarget,
    samples: Vec<Sample>,
    stop: S,
}

impl<S: FnMut(&[Sample]) -> bool> runner::Watch for CounterWatch<'_, S> {
    fn interval(&mut self, intervals: &[Interval]) -> bool {
        let last = intervals.last().expect("an interval just ended");
        self.samples.push(Sample {
            end_secs: last.end_secs,
            ios: last.ops,
            bytes: last.bytes,
            iops: last.iops(),
            mib_per_sec: last.mib_per_sec(),
            counters: self.target.counters(),
            latency_buckets: Vec::new(),
        });
        (self.stop)(&self.samples)
    }
}

/// Runs `op` as `phase` through `target` until `stop(samples)` says so at
/// an interval boundary or the phase's time is up.
pub(crate) fn read_phase<F, S>(
    target: &dyn ReadTarget,
    dataset: &DatasetSpec,
    phase: &Phase,
    stop: S,
    op: F,
) -> Result<PhaseRun>
where
    F: Fn(&mut Reader) -> Result<()> + Sync,
    S: FnMut(&[Sample]) -> bool,
{
    let mut watch = CounterWatch {
        target,
        samples: Vec::new(),
        stop,
    };
    let result = runner::run(
        phase,
        &mut watch,
        |_| Ok(Vec::new()),
        |buf, worker| {
            op(&mut Reader {
                target,
                dataset,
                buf,
                worker,
            })
        },
    )?;
    let mut samples = watch.samples;
    for (sample, interval) in samples.iter_mut().zip(&result.intervals) {
        sample.latency_buckets.clone_from(&interval.latency_buckets);
    }
    Ok(PhaseRun {
        phase: result,
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

/// Reads of `read_bytes` uniform over the bytes of files of `sizes` (not
/// over files: a database's client reads blocks, not files): the one
/// operation of the latency and warmup experiments.
pub(crate) fn uniform_reads(
    sizes: &[u64],
    read_bytes: u64,
) -> impl Fn(&mut Reader) -> Result<()> + Sync {
    let blocks: Vec<u64> = sizes.iter().map(|s| s / read_bytes).collect();
    let total_blocks: u64 = blocks.iter().sum();
    move |reader: &mut Reader| {
        let mut block = reader.rng().below(total_blocks);
        let mut file = 0usize;
        while block >= blocks[file] {
            block -= blocks[file];
            file += 1;
        }
        reader.read(file as u32, block * read_bytes, read_bytes as usize)
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
}
