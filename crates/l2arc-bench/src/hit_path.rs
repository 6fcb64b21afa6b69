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
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use l2arc::arc::AccessKind;
use l2arc::internals::AlignedBuf;
use l2arc::internals::Record;
use l2arc::primary::Primary;
use l2arc::primary::dir::DirPrimary;
use l2arc::{Cache, CacheConfig, DatasetConfig};
use serde::Serialize;

use super::BenchArgs;
use super::dataset::DatasetSpec;
use super::runner::{self, Phase, Until};

const RECORD_BYTES: u64 = 8 * 1024;
const WORKING_SET_BYTES: u64 = 64 << 20;

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

pub(crate) fn run(args: &BenchArgs) -> Result<()> {
    let temp = tempfile::tempdir().context("cannot make a temporary directory")?;
    let spec = DatasetSpec {
        files: 1,
        file_size_bytes: WORKING_SET_BYTES,
        seed: args.seed,
        content: super::dataset::Content::Random,
    };
    spec.materialise(temp.path())?;
    let records = WORKING_SET_BYTES / RECORD_BYTES;
    let mut config = CacheConfig {
        arc_max_bytes: 4 * WORKING_SET_BYTES,
        ..CacheConfig::default()
    };
    if let Some(shards) = args.arc_shards {
        config.arc_shards = shards;
    }
    let cache = Cache::new(config)?;
    let primary: Arc<dyn Primary> = Arc::new(DirPrimary::new(temp.path())?);
    let dataset = cache.add_dataset(
        "hit",
        primary,
        DatasetConfig {
            recordsize_bytes: RECORD_BYTES as u32,
            ..DatasetConfig::default()
        },
    )?;
    let handle = cache.open(dataset, &DatasetSpec::file_name(0), false)?;
    // The baseline holds the very record buffers the ARC holds.
    let mut baseline: HashMap<u64, Arc<Record>> = HashMap::new();
    for r in 0..records {
        let view = cache.read_view(
            &handle,
            r * RECORD_BYTES,
            RECORD_BYTES as usize,
            AccessKind::Demand,
        )?;
        let (record, _) = view.segments.into_iter().next().context("empty record")?;
        baseline.insert(r, record);
    }
    let warm_misses = cache.stats().arc.misses;
    let baseline = Mutex::new(baseline);
    let seconds = Duration::from_secs_f64(args.seconds.min(5.0));
    let expect = |r: u64, bytes: &[u8]| -> Result<u64> {
        if bytes.len() != RECORD_BYTES as usize
            || bytes[..8] != spec.word(0, r * RECORD_BYTES / 8).to_le_bytes()
        {
            bail!("wrong bytes for record {r}");
        }
        Ok(bytes.len() as u64)
    };

    let mut rows = Vec::new();
    for mode in [Mode::ZeroCopy, Mode::Copy] {
        for threads in [1usize, 2] {
            let phase = |label: &'static str, seconds| {
                Phase::new(label, threads, Until::Elapsed(seconds))
                    .seed(args.seed)
                    .progress(!args.json)
            };
            let arc_hits = |label: &'static str, seconds: Duration| {
                runner::run_timed(&phase(label, seconds), |rng| {
                    let r = rng.below(records);
                    match mode {
                        Mode::ZeroCopy => {
                            let view = cache.read_view(
                                &handle,
                                r * RECORD_BYTES,
                                RECORD_BYTES as usize,
                                AccessKind::Demand,
                            )?;
                            let (record, range) = &view.segments[0];
                            expect(r, &record.data[range.clone()])
                        }
                        Mode::Copy => OUT.with_borrow_mut(|out| {
                            let n = cache.read(&handle, r * RECORD_BYTES, out.as_mut_slice())?;
                            expect(r, &out[..n])
                        }),
                    }
                })
            };
            let ours = arc_hits("arc hit", seconds)?;
            // Off and on in turns, the first of each pair alternating.
            let pair_seconds = seconds.min(Duration::from_secs(2));
            let mut offs = Vec::new();
            let mut ons = Vec::new();
            let mut costs = Vec::new();
            let mut offs_cpu = Vec::new();
            let mut ons_cpu = Vec::new();
            let mut costs_cpu = Vec::new();
            for round in 0..args.rounds {
                let mut off_on = [0.0; 2];
                let mut off_on_cpu = [0.0; 2];
                for turn in 0..2 {
                    let on = (turn + round) % 2 == 1;
                    cache.analytics().set_enabled(on);
                    let label = if on { "analytics on" } else { "analytics off" };
                    let cpu_before = process_cpu_secs();
                    let phase = arc_hits(label, pair_seconds)?;
                    let cpu_secs = (process_cpu_secs() - cpu_before).max(1e-9);
                    off_on[usize::from(on)] = phase.iops();
                    off_on_cpu[usize::from(on)] = phase.ops as f64 / cpu_secs;
                }
                cache.analytics().set_enabled(true);
                offs.push(off_on[0]);
                ons.push(off_on[1]);
                costs.push(off_on[1] / off_on[0] - 1.0);
                offs_cpu.push(off_on_cpu[0]);
                ons_cpu.push(off_on_cpu[1]);
                costs_cpu.push(off_on_cpu[1] / off_on_cpu[0] - 1.0);
            }
            let theirs = runner::run_timed(&phase("hashmap", seconds), |rng| {
                let r = rng.below(records);
                let record = Arc::clone(
                    baseline
                        .lock()
                        .expect("poisoned")
                        .get(&r)
                        .expect("preloaded"),
                );
                match mode {
                    Mode::ZeroCopy => expect(r, &record.data),
                    Mode::Copy => OUT.with_borrow_mut(|out| {
                        out.as_mut_slice().copy_from_slice(&record.data);
                        expect(r, out)
                    }),
                }
            })?;
            rows.push(Row {
                mode,
                threads,
                arc_hits_per_sec: ours.iops(),
                arc_hits_per_sec_per_thread: ours.iops() / threads as f64,
                mutex_hashmap_per_sec: theirs.iops(),
                ratio: ours.iops() / theirs.iops(),
                arc_p50_ns: ours.latency_ns.value_at_quantile(0.5),
                mutex_hashmap_p50_ns: theirs.latency_ns.value_at_quantile(0.5),
                analytics_off_per_sec: median(&mut offs),
                analytics_on_per_sec: median(&mut ons),
                analytics_cost: median(&mut costs),
                analytics_off_per_cpu_sec: median(&mut offs_cpu),
                analytics_on_per_cpu_sec: median(&mut ons_cpu),
                analytics_cost_cpu: median(&mut costs_cpu),
            });
        }
    }
    let stats = cache.stats();
    if stats.arc.misses != warm_misses {
        bail!(
            "the hit-path run missed {} times: the working set did not stay cached",
            stats.arc.misses - warm_misses
        );
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "ARC hit path: random 8 KiB reads of {records} cached records (all hits), shared (zero-copy) or copied out"
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
    for r in &rows {
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
    println!();
    println!(
        "analytics cost: ARC hits/s with the latency histograms off and on, {} alternating pairs (medians)",
        args.rounds
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
    for r in &rows {
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
    Ok(())
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
