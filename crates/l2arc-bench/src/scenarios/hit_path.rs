//! The ARC hit path against a plain locked hash map.
//!
//! What a hit costs is the cache's floor: the hash, the shard lock, the list
//! update, the reference count, and the copy out. The baseline does the least
//! any cache must (a `Mutex<HashMap>` lookup of the same buffers, a clone of
//! the `Arc`, the same copy), so the ratio shows what ARC bookkeeping and the
//! read path add, and how each scales from one thread to two.
//!
//! The same cells are then run with the engine's analytics (latency
//! histograms, `l2arc::analytics`) off and on, alternating, `--rounds`
//! pairs each: what watching the cache costs on its fastest path, in one
//! run so that the machine's load is the same on both sides. Each side is
//! reported per wall-clock second and per CPU second of this process: on a
//! shared machine other processes take a varying share of the cores, and
//! hits per CPU second do not count the time they took.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use l2arc::internals::AlignedBuf;
use l2arc::internals::Record;
use l2arc::primary::Primary;
use l2arc::primary::dir::DirPrimary;
use l2arc::{Cache, CacheConfig, DatasetConfig, ObjectHandle};
use serde::Serialize;

use crate::BenchArgs;

use super::{Goal, Headline, Outcome, Scenario};
use crate::dataset::DatasetSpec;
use crate::runner::{self, Phase, PhaseResult, Until};

const RECORD_BYTES: u64 = 8 * 1024;
const WORKING_SET_BYTES: u64 = 64 << 20;
const RECORDS: u64 = WORKING_SET_BYTES / RECORD_BYTES;

#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
enum Mode {
    /// The reader gets the shared buffer (what the FUSE and NBD front ends send from).
    ZeroCopy,
    /// The reader's own page-aligned buffer is filled (`Cache::read`).
    Copy,
}

thread_local! {
    static OUT: std::cell::RefCell<AlignedBuf> = std::cell::RefCell::new(AlignedBuf::zeroed(RECORD_BYTES as usize));
}

#[derive(Serialize)]
struct Row {
    mode: Mode,
    threads: usize,
    arc_hits_per_sec: f64,
    arc_hits_per_sec_per_thread: f64,
    mutex_hashmap_per_sec: f64,
    ratio: f64,
    arc_p50_ns: u64,
    mutex_hashmap_p50_ns: u64,
    /// Median over rounds of ARC hits/s with analytics off and on.
    analytics_off_per_sec: f64,
    analytics_on_per_sec: f64,
    /// Median over rounds of (on / off - 1): negative is slower with analytics.
    analytics_cost: f64,
    /// The same per CPU second of this process.
    analytics_off_per_cpu_sec: f64,
    analytics_on_per_cpu_sec: f64,
    analytics_cost_cpu: f64,
}

pub(crate) fn run(args: &BenchArgs) -> Result<Outcome> {
    let temp = tempfile::tempdir().context("cannot make a temporary directory")?;
    let spec = DatasetSpec {
        files: 1,
        file_size_bytes: WORKING_SET_BYTES,
        seed: args.seed,
        content: crate::dataset::Content::Random,
    };
    spec.materialise(temp.path())?;
    let hits = HitPath::new(args, &spec, temp.path())?;
    let mut rows = Vec::new();
    for mode in [Mode::ZeroCopy, Mode::Copy] {
        for threads in [1usize, 2] {
            rows.push(hits.row(mode, threads)?);
        }
    }
    hits.check_all_hits()?;
    let headline = headline(&rows);
    let (rounds, cache) = (args.rounds, Arc::clone(&hits.cache));
    Outcome::new(rows, headline, move |rows: &Vec<Row>| {
        print_hits(rows);
        println!();
        print_analytics_cost(rows, rounds, &cache);
    })
}

/// Hits per second against the locked map at 2 threads, and what
/// analytics cost.
fn headline(rows: &[Row]) -> Vec<Headline> {
    let mut h = Vec::new();
    for row in rows.iter().filter(|r| r.threads == 2) {
        let mode = match row.mode {
            Mode::ZeroCopy => ("zero_copy", "shared buffer"),
            Mode::Copy => ("copy", "copied out"),
        };
        h.push(Headline::versus(
            &format!("{}_2_threads", mode.0),
            &format!("ARC hit path, 8 KiB, 2 threads, {}", mode.1),
            "hits/s",
            (
                row.arc_hits_per_sec,
                "Mutex<HashMap> of the same buffers",
                row.mutex_hashmap_per_sec,
            ),
            None,
        ));
    }
    if let Some(row) = rows
        .iter()
        .find(|r| r.threads == 2 && matches!(r.mode, Mode::Copy))
    {
        h.push(
            Headline::versus(
                "analytics_on_over_off",
                "analytics (latency histograms) on the ARC hit path, copy, 2 threads",
                "hits/s",
                (
                    row.analytics_on_per_sec,
                    "the same cells with analytics off",
                    row.analytics_off_per_sec,
                ),
                Goal::ratio_at_least(0.97),
            )
            .ratio_is(1.0 + row.analytics_cost, "on / off, median of the rounds"),
        );
    }
    h
}

/// A cache holding the whole working set, and a locked hash map of the very
/// record buffers it holds.
struct HitPath<'a> {
    args: &'a BenchArgs,
    spec: &'a DatasetSpec,
    cache: Arc<Cache>,
    handle: ObjectHandle,
    baseline: Mutex<HashMap<u64, Arc<Record>>>,
    /// The ARC's misses after the preload: any more and a hit was not one.
    warm_misses: u64,
    seconds: Duration,
}

impl<'a> HitPath<'a> {
    fn new(args: &'a BenchArgs, spec: &'a DatasetSpec, dir: &Path) -> Result<Self> {
        let mut config = CacheConfig::default().arc_max_bytes(4 * WORKING_SET_BYTES);
        if let Some(shards) = args.arc_shards {
            config.arc_shards = shards;
        }
        let cache = Cache::new(config)?;
        let primary: Arc<dyn Primary> = Arc::new(DirPrimary::new(dir)?);
        let dataset = cache.add_dataset(
            "hit",
            primary,
            DatasetConfig::default().recordsize_bytes(RECORD_BYTES as u32),
        )?;
        let handle = cache.open(dataset, &DatasetSpec::file_name(0), false)?;
        let mut baseline: HashMap<u64, Arc<Record>> = HashMap::new();
        for r in 0..RECORDS {
            let view = cache.read_view(&handle, r * RECORD_BYTES, RECORD_BYTES as usize)?;
            let (record, _) = view.segments.into_iter().next().context("empty record")?;
            baseline.insert(r, record);
        }
        Ok(Self {
            args,
            spec,
            warm_misses: cache.stats().arc.misses,
            cache,
            handle,
            baseline: Mutex::new(baseline),
            seconds: Duration::from_secs_f64(args.seconds.min(5.0)),
        })
    }

    /// Checks the first word of record `r`; returns the bytes read.
    fn expect(&self, r: u64, bytes: &[u8]) -> Result<u64> {
        if bytes.len() != RECORD_BYTES as usize
            || bytes[..8] != self.spec.word(0, r * RECORD_BYTES / 8).to_le_bytes()
        {
            bail!("wrong bytes for record {r}");
        }
        Ok(bytes.len() as u64)
    }

    fn phase(&self, label: &'static str, threads: usize, seconds: Duration) -> Phase<'static> {
        Phase::new(label, threads, Until::Elapsed(seconds))
            .seed(self.args.seed)
            .progress(!self.args.json)
    }

    /// Random hits from `threads` threads for `seconds`.
    fn arc_hits(
        &self,
        mode: Mode,
        threads: usize,
        label: &'static str,
        seconds: Duration,
    ) -> Result<PhaseResult> {
        runner::run_timed(&self.phase(label, threads, seconds), |rng| {
            let r = rng.below(RECORDS);
            match mode {
                Mode::ZeroCopy => {
                    let view = self.cache.read_view(
                        &self.handle,
                        r * RECORD_BYTES,
                        RECORD_BYTES as usize,
                    )?;
                    let (record, range) = &view.segments[0];
                    self.expect(r, &record.data[range.clone()])
                }
                Mode::Copy => OUT.with_borrow_mut(|out| {
                    let n = self
                        .cache
                        .read(&self.handle, r * RECORD_BYTES, out.as_mut_slice())?;
                    self.expect(r, &out[..n])
                }),
            }
        })
    }

    /// The same lookups in the locked hash map.
    fn map_hits(&self, mode: Mode, threads: usize) -> Result<PhaseResult> {
        runner::run_timed(&self.phase("hashmap", threads, self.seconds), |rng| {
            let r = rng.below(RECORDS);
            let record = Arc::clone(
                self.baseline
                    .lock()
                    .expect("poisoned")
                    .get(&r)
                    .expect("preloaded"),
            );
            match mode {
                Mode::ZeroCopy => self.expect(r, &record.data),
                Mode::Copy => OUT.with_borrow_mut(|out| {
                    out.as_mut_slice().copy_from_slice(&record.data);
                    self.expect(r, out)
                }),
            }
        })
    }

    /// ARC hits with analytics off and on in turns, `--rounds` pairs, the
    /// first of each pair alternating; medians over the rounds.
    fn analytics_cost(&self, mode: Mode, threads: usize) -> Result<AnalyticsCost> {
        let pair_seconds = self.seconds.min(Duration::from_secs(2));
        let mut rounds = Vec::new();
        for round in 0..self.args.rounds {
            let mut per_sec = [0.0; 2];
            let mut per_cpu_sec = [0.0; 2];
            for turn in 0..2 {
                let on = (turn + round) % 2 == 1;
                self.cache.analytics().set_enabled(on);
                let label = if on { "analytics on" } else { "analytics off" };
                let cpu_before = process_cpu_secs();
                let phase = self.arc_hits(mode, threads, label, pair_seconds)?;
                let cpu_secs = (process_cpu_secs() - cpu_before).max(1e-9);
                per_sec[usize::from(on)] = phase.iops();
                per_cpu_sec[usize::from(on)] = phase.ops as f64 / cpu_secs;
            }
            self.cache.analytics().set_enabled(true);
            rounds.push((per_sec, per_cpu_sec));
        }
        Ok(AnalyticsCost::of(&rounds))
    }

    /// One mode at one thread count: hits, the map, analytics off and on.
    fn row(&self, mode: Mode, threads: usize) -> Result<Row> {
        let ours = self.arc_hits(mode, threads, "arc hit", self.seconds)?;
        let cost = self.analytics_cost(mode, threads)?;
        let theirs = self.map_hits(mode, threads)?;
        Ok(Row {
            mode,
            threads,
            arc_hits_per_sec: ours.iops(),
            arc_hits_per_sec_per_thread: ours.iops() / threads as f64,
            mutex_hashmap_per_sec: theirs.iops(),
            ratio: ours.iops() / theirs.iops(),
            arc_p50_ns: ours.latency_ns.value_at_quantile(0.5),
            mutex_hashmap_p50_ns: theirs.latency_ns.value_at_quantile(0.5),
            analytics_off_per_sec: cost.off_per_sec,
            analytics_on_per_sec: cost.on_per_sec,
            analytics_cost: cost.cost,
            analytics_off_per_cpu_sec: cost.off_per_cpu_sec,
            analytics_on_per_cpu_sec: cost.on_per_cpu_sec,
            analytics_cost_cpu: cost.cost_cpu,
        })
    }

    /// An error if any read missed: the working set must stay cached.
    fn check_all_hits(&self) -> Result<()> {
        let stats = self.cache.stats();
        if stats.arc.misses != self.warm_misses {
            bail!(
                "the hit-path run missed {} times: the working set did not stay cached",
                stats.arc.misses - self.warm_misses
            );
        }
        Ok(())
    }
}

/// One round of the analytics cost: hits per second with analytics [off,
/// on], and per CPU second [off, on].
type OffOnRound = ([f64; 2], [f64; 2]);

/// Medians over the rounds of hits per second and per CPU second with
/// analytics off and on, and of the rounds' costs (on / off - 1).
struct AnalyticsCost {
    off_per_sec: f64,
    on_per_sec: f64,
    cost: f64,
    off_per_cpu_sec: f64,
    on_per_cpu_sec: f64,
    cost_cpu: f64,
}

impl AnalyticsCost {
    fn of(rounds: &[OffOnRound]) -> Self {
        let med =
            |f: &dyn Fn(&OffOnRound) -> f64| median(&mut rounds.iter().map(f).collect::<Vec<_>>());
        Self {
            off_per_sec: med(&|r| r.0[0]),
            on_per_sec: med(&|r| r.0[1]),
            cost: med(&|r| r.0[1] / r.0[0] - 1.0),
            off_per_cpu_sec: med(&|r| r.1[0]),
            on_per_cpu_sec: med(&|r| r.1[1]),
            cost_cpu: med(&|r| r.1[1] / r.1[0] - 1.0),
        }
    }
}

fn print_hits(rows: &[Row]) {
    println!(
        "ARC hit path: random 8 KiB reads of {RECORDS} cached records (all hits), shared (zero-copy) or copied out"
    );
    println!(
        "{:<9} {:>7} {:>14} {:>16} {:>18} {:>7} {:>10} {:>12}",
        "mode",
        "threads",
        "ARC hits/s",
        "per thread",
        "Mutex<HashMap>/s",
        "ratio",
        "ARC p50",
        "map p50"
    );
    for r in rows {
        println!(
            "{:<9} {:>7} {:>14.0} {:>16.0} {:>18.0} {:>6.2}x {:>8} ns {:>9} ns",
            format!("{:?}", r.mode),
            r.threads,
            r.arc_hits_per_sec,
            r.arc_hits_per_sec_per_thread,
            r.mutex_hashmap_per_sec,
            r.ratio,
            r.arc_p50_ns,
            r.mutex_hashmap_p50_ns
        );
    }
}

fn print_analytics_cost(rows: &[Row], rounds: usize, cache: &Cache) {
    println!(
        "analytics cost: ARC hits/s with the latency histograms off and on, {rounds} alternating pairs (medians)"
    );
    println!(
        "{:<9} {:>7} {:>12} {:>12} {:>7} {:>14} {:>14} {:>7}",
        "mode",
        "threads",
        "off hits/s",
        "on hits/s",
        "cost",
        "off hits/CPU-s",
        "on hits/CPU-s",
        "cost"
    );
    for r in rows {
        println!(
            "{:<9} {:>7} {:>12.0} {:>12.0} {:>+6.1}% {:>14.0} {:>14.0} {:>+6.1}%",
            format!("{:?}", r.mode),
            r.threads,
            r.analytics_off_per_sec,
            r.analytics_on_per_sec,
            r.analytics_cost * 100.0,
            r.analytics_off_per_cpu_sec,
            r.analytics_on_per_cpu_sec,
            r.analytics_cost_cpu * 100.0
        );
    }
    let hits = cache.analytics().arc_hit.snapshot();
    println!(
        "engine's own ARC-hit histogram (1 read in {} timed): p50 {} ns, p99 {} ns, {} hits estimated",
        l2arc::analytics::ARC_HIT_SAMPLE_PERIOD,
        hits.quantile_ns(0.5),
        hits.quantile_ns(0.99),
        hits.count()
    );
}

/// CPU time of this process so far (every thread), in seconds.
fn process_cpu_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(
        rc, 0,
        "CLOCK_PROCESS_CPUTIME_ID is always available on Linux"
    );
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// `--scenario arc-hit`.
pub(crate) struct ArcHit;

impl Scenario for ArcHit {
    fn name(&self) -> &'static str {
        "arc-hit"
    }
    fn measures(&self) -> &'static str {
        "ARC hit path: 8 KiB hits per second, against a Mutex<HashMap> of the same buffers."
    }
    fn run(&self, args: &BenchArgs) -> Result<Outcome> {
        run(args)
    }
}
