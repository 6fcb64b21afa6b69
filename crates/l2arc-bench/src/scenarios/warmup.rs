//! The warm-up curve: the third workload of the seed articles.
//!
//! Random 4 KiB reads at queue depth 32 (32 threads, one read each) for a
//! fixed time over a working set that fits the L2ARC but not the ARC. The
//! seed watched IOPS climb for four hours as the L2ARC filled, from 2,532 at
//! ten minutes to 20,873 at the end, about ten times a box without cache.
//! Here the same curve is drawn at this machine's scale: IOPS and L2ARC fill
//! every second from an empty cache, the time to reach 90% of the final IOPS
//! (the median second of the last quarter of the run), and `no_cache` measured for a
//! few seconds as the cache-less box. How fast the curve rises is bounded by
//! the disks: a record reaches the L2ARC only after it was read from them,
//! so the report also gives the time one pass over the working set takes at
//! the emulation's mean service time.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::BenchArgs;

use super::{Goal, Headline, Outcome, Scenario};
use crate::report::{self, Series};
use crate::runner::{Phase, Until};
use crate::targets::{Bench, ReadTarget, TargetKind, TargetSpec, each_target};
use crate::workload::{self, Sample, Setup};

const QUEUE_DEPTH: usize = 32;
const READ_BYTES: u64 = 4 << 10;
/// Working set as a share of the cache file.
const WORKING_SET_OF_CACHE: f64 = 0.9;
/// recordsize: small enough that filling the L2ARC takes many passes of
/// the disks (the curve is the point), large enough to fit this run's time.
const RECORDSIZE_BYTES: u32 = 16 << 10;
const DEFAULT_SECS: f64 = 75.0;
/// The no-cache baseline is flat: a few seconds measure it.
const NO_CACHE_SECS: f64 = 5.0;
/// Share of the run at its end whose median IOPS is the final level (a
/// median: one second disturbed by a neighbour on a shared machine should
/// not move it).
const FINAL_SHARE: f64 = 0.25;

#[derive(Serialize)]
pub(crate) struct WarmupRun {
    pub target: String,
    pub iops: f64,
    pub final_iops: f64,
    pub secs_to_90pct: Option<f64>,
    pub final_flash_bytes: u64,
    pub samples: Vec<Sample>,
}

#[derive(Serialize)]
pub(crate) struct WarmupReport {
    pub scenario: &'static str,
    #[serde(flatten)]
    pub setup: Setup,
    pub queue_depth: usize,
    /// The working set read once from the emulated disks in whole records.
    pub one_pass_secs: f64,
    pub no_cache_iops: f64,
    pub runs: Vec<WarmupRun>,
    pub bytes_verified: u64,
    pub elapsed_secs: f64,
}

pub(crate) fn run(args: &BenchArgs) -> Result<Outcome> {
    let began = Instant::now();
    let secs = args.measure_secs.unwrap_or(DEFAULT_SECS);
    let bench = Bench::prepare(args)?;
    let files = bench.files_for((args.cache_size as f64 * WORKING_SET_OF_CACHE) as u64);
    let compression = args.compression != l2arc::Compression::Off;
    let spec = TargetSpec {
        recordsize_bytes: RECORDSIZE_BYTES,
        ..bench.spec(args, files, compression)
    };
    let mut verified = 0u64;
    let mut no_cache_iops = 0.0;
    let runs = each_target(&TargetKind::in_run(args.peers), &spec, |kind, target| {
        let duration = if kind.has_flash() {
            secs
        } else {
            NO_CACHE_SECS.min(secs)
        };
        let (result, bytes) = run_target(args, &bench, &spec, target, duration)?;
        verified += bytes;
        if !kind.has_flash() {
            no_cache_iops = result.iops;
        }
        Ok(result)
    })?;
    let records = spec
        .file_sizes_bytes
        .iter()
        .map(|s| s.div_ceil(u64::from(RECORDSIZE_BYTES)))
        .sum::<u64>();
    let report = WarmupReport {
        scenario: "warmup",
        setup: Setup::new(args, &bench, &spec, READ_BYTES),
        queue_depth: QUEUE_DEPTH,
        one_pass_secs: records as f64 * bench.hdd_service_ms(u64::from(RECORDSIZE_BYTES))
            / 1000.0
            / bench.hdd.spindles as f64,
        no_cache_iops,
        runs,
        bytes_verified: verified,
        elapsed_secs: began.elapsed().as_secs_f64(),
    };
    let html = html(&report);
    let headline = headline(&report);
    Ok(Outcome::new(report, headline, print_tables)?.with_html(html))
}

/// l2arc's seconds to 90% of its final rate against one pass over the
/// working set, and its final rate against no cache.
fn headline(r: &WarmupReport) -> Vec<Headline> {
    // Named with `_lz4` when the L2ARC compresses (the default).
    let Some(run) = r
        .runs
        .iter()
        .find(|x| x.target == "l2arc" || x.target == "l2arc_lz4")
    else {
        return Vec::new();
    };
    let mut h = Vec::new();
    if let Some(t) = run.secs_to_90pct {
        h.push(Headline::versus(
            "secs_to_90pct",
            &format!(
                "seed experiment 3, engine: seconds to 90% of the final rate (random {} KiB QD{}, {} MiB)",
                r.setup.read_bytes >> 10,
                r.queue_depth,
                r.setup.working_set_bytes >> 20
            ),
            "s",
            (t, "one pass over the working set from the disks", r.one_pass_secs),
            Goal::ratio_at_most(1.2),
        ));
    }
    h.push(Headline::versus(
        "final_over_no_cache",
        "seed experiment 3: final IOPS",
        "IOPS",
        (run.final_iops, "no cache", r.no_cache_iops),
        None,
    ));
    h
}

/// One target from an empty cache for `duration_secs`: its curve, and the
/// bytes it read.
fn run_target(
    args: &BenchArgs,
    bench: &Bench,
    spec: &TargetSpec,
    target: &dyn ReadTarget,
    duration_secs: f64,
) -> Result<(WarmupRun, u64)> {
    let data = bench.dataset.spec();
    let op = workload::uniform_reads(&spec.file_sizes_bytes, READ_BYTES);
    let name = target.name().to_string();
    let phase = Phase::new(
        &name,
        QUEUE_DEPTH,
        Until::Elapsed(Duration::from_secs_f64(duration_secs)),
    )
    .interval(Duration::from_secs(1))
    .seed(args.seed);
    let run = workload::read_phase(target, &data, &phase, |_| false, op)
        .with_context(|| format!("warmup: {name}"))?;
    let bytes = run.phase.bytes;
    let (final_iops, secs_to_90pct) = final_level(&run.samples);
    let result = WarmupRun {
        target: name.clone(),
        iops: run.phase.iops(),
        final_iops,
        secs_to_90pct,
        final_flash_bytes: run.samples.last().map_or(0, |s| s.counters.flash_bytes),
        samples: run.samples,
    };
    if !args.json {
        eprintln!(
            "{name:>12}: {:.0} IOPS over {duration_secs:.0} s, final {:.0}, L2 {} MiB",
            result.iops,
            result.final_iops,
            result.final_flash_bytes >> 20
        );
    }
    Ok((result, bytes))
}

/// The final IOPS (the median second of the last `FINAL_SHARE` of the
/// run) and the end of the first second at 90% of it.
fn final_level(samples: &[Sample]) -> (f64, Option<f64>) {
    let iops: Vec<f64> = samples.iter().map(|s| s.iops).collect();
    let (final_iops, first) = warm_level(&iops);
    (final_iops, first.map(|i| samples[i].end_secs))
}

/// The warm level of a curve of IOPS per interval (the median of its last
/// `FINAL_SHARE`) and the first interval at 90% of it.
pub(crate) fn warm_level(iops: &[f64]) -> (f64, Option<usize>) {
    let n = iops.len();
    if n == 0 {
        return (0.0, None);
    }
    let mut tail = iops[n - ((n as f64 * FINAL_SHARE).ceil() as usize).clamp(1, n)..].to_vec();
    tail.sort_by(f64::total_cmp);
    let warm = tail[tail.len() / 2];
    (warm, iops.iter().position(|&x| x >= 0.9 * warm))
}

fn print_tables(r: &WarmupReport) {
    println!(
        "warmup: random {} KiB reads at queue depth {} over {} MiB; arc_max {} MiB, L2ARC {} MiB ({}), recordsize {} KiB; {}; content {} (LZ4 {:.2}:1)",
        r.setup.read_bytes >> 10,
        r.queue_depth,
        r.setup.working_set_bytes >> 20,
        r.setup.arc_max_bytes >> 20,
        r.setup.cache_size_bytes >> 20,
        if r.setup.compression { "lz4" } else { "off" },
        r.setup.recordsize_bytes >> 10,
        r.setup.hdd,
        r.setup.content,
        r.setup.dataset_lz4_ratio
    );
    for run in r.runs.iter().filter(|x| x.target != "no_cache") {
        println!();
        println!("{}: IOPS and L2ARC fill per interval", run.target);
        println!("{:>8} {:>10} {:>10}", "end s", "IOPS", "L2 MiB");
        // At most ~20 rows: group seconds.
        let group = run.samples.len().div_ceil(20).max(1);
        for chunk in run.samples.chunks(group) {
            let iops = chunk.iter().map(|s| s.iops).sum::<f64>() / chunk.len() as f64;
            let last = chunk.last().expect("non-empty chunk");
            println!(
                "{:>8.0} {:>10.0} {:>10}",
                last.end_secs,
                iops,
                last.counters.flash_bytes >> 20
            );
        }
        println!(
            "{}: final {:.0} IOPS ({:.1}x no_cache's {:.0}; seed: 20,873 vs 2,532 at 10 min, about 10x a cache-less box); 90% of final after {}; one pass over the working set from the disks takes {:.0} s",
            run.target,
            run.final_iops,
            run.final_iops / r.no_cache_iops.max(1e-9),
            r.no_cache_iops,
            run.secs_to_90pct
                .map_or("never".to_string(), |s| format!("{s:.0} s")),
            r.one_pass_secs
        );
    }
    println!(
        "every byte checked: {} MiB read, all matching the dataset; {:.0} s",
        r.bytes_verified >> 20,
        r.elapsed_secs
    );
}

fn html(r: &WarmupReport) -> String {
    let cached: Vec<&WarmupRun> = r.runs.iter().filter(|x| x.target != "no_cache").collect();
    let mut sections = Vec::new();
    sections.extend(html_curve(r, &cached));
    sections.push(("Summary".to_string(), html_summary(r)));
    sections.extend(cached.iter().map(|run| html_heatmap(r, run)));
    report::page(
        "l2arc bench: warm-up curve",
        &format!(
            "Random {} KiB reads at queue depth {} over {} MiB; arc_max {} MiB, L2ARC {} MiB; {}. Every byte verified ({} MiB).",
            r.setup.read_bytes >> 10,
            r.queue_depth,
            r.setup.working_set_bytes >> 20,
            r.setup.arc_max_bytes >> 20,
            r.setup.cache_size_bytes >> 20,
            r.setup.hdd,
            r.bytes_verified >> 20
        ),
        &sections,
    )
}

/// The cached targets' IOPS and L2ARC fill over time, no_cache's IOPS as a line.
fn html_curve(r: &WarmupReport, cached: &[&WarmupRun]) -> Option<(String, String)> {
    let first = cached.first()?;
    let x: Vec<f64> = first.samples.iter().map(|s| s.end_secs).collect();
    let len = x.len();
    let pad = |v: Vec<f64>| -> Vec<f64> {
        let mut v = v;
        v.resize(len, f64::NAN);
        v
    };
    let mut left: Vec<Series> = cached
        .iter()
        .map(|run| {
            Series::new(
                format!("{} IOPS", run.target),
                pad(run.samples.iter().map(|s| s.iops).collect()),
            )
        })
        .collect();
    left.push(Series::new("no_cache IOPS", vec![r.no_cache_iops; len]));
    let right: Vec<Series> = cached
        .iter()
        .map(|run| {
            Series::new(
                format!("{} L2 fill MiB", run.target),
                pad(run
                    .samples
                    .iter()
                    .map(|s| s.counters.flash_bytes as f64 / (1 << 20) as f64)
                    .collect()),
            )
        })
        .collect();
    Some((
        "Warm-up curve".to_string(),
        report::line_chart_two_axes(
            "IOPS (solid) and L2ARC fill (dashed) from an empty cache",
            &x,
            "seconds",
            &left,
            "IOPS",
            &right,
            "L2ARC MiB",
        ),
    ))
}

fn html_summary(r: &WarmupReport) -> String {
    let rows: Vec<Vec<String>> = r
        .runs
        .iter()
        .map(|run| {
            vec![
                run.target.clone(),
                format!("{:.0}", run.iops),
                format!("{:.0}", run.final_iops),
                run.secs_to_90pct
                    .map_or("-".to_string(), |s| format!("{s:.0}")),
                format!("{}", run.final_flash_bytes >> 20),
            ]
        })
        .collect();
    report::table(
        &[
            "target",
            "mean IOPS",
            "final IOPS",
            "s to 90% of final",
            "L2 MiB",
        ],
        &rows,
    ) + &format!(
        "<p>One pass over the working set from the emulated disks: {:.0} s. Seed: 2,532 IOPS at 10 minutes, 20,873 at 4 hours.</p>",
        r.one_pass_secs
    )
}

fn html_heatmap(r: &WarmupReport, run: &WarmupRun) -> (String, String) {
    let x: Vec<f64> = run.samples.iter().map(|s| s.end_secs).collect();
    let counts: Vec<Vec<u64>> = run
        .samples
        .iter()
        .map(|s| s.latency_buckets.clone())
        .collect();
    (
        format!("Latency heatmap, {}", run.target),
        report::heatmap(
            &format!("{}: 4 KiB read latency per second", run.target),
            &x,
            "seconds",
            &r.setup.heatmap_bucket_lower_us,
            &counts,
            &[],
        ),
    )
}

/// `--scenario warmup`.
pub(crate) struct Warmup;

impl Scenario for Warmup {
    fn name(&self) -> &'static str {
        "warmup"
    }
    fn measures(&self) -> &'static str {
        "Seed experiment 3: random 4 KiB reads at queue depth 32: IOPS and L2ARC fill per interval."
    }
    fn run(&self, args: &BenchArgs) -> Result<Outcome> {
        run(args)
    }
}
