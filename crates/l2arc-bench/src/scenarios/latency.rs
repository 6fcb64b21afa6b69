//! Latency cold and warm: the second workload of the seed articles.
//!
//! 20 clients issue random 8 KiB reads over a working set larger than the
//! ARC and smaller than the L2ARC (three quarters of the cache file by
//! default). The seed reported that once the L2ARC was warm, IOPS rose 8.3×
//! and latency fell 20× (9–10 ms from the disks, 0.4–0.6 ms from the SSDs).
//! Here one target runs three phases back to back: cold (the first seconds
//! from an empty cache: reads go to the emulated disks), a warm-up that ends
//! when the share of reads that reach the disks stops falling, and warm. The report gives IOPS and
//! latency percentiles of the cold and warm phases, the ARC and L2ARC hit
//! rates of the warm phase, the factors set against the seed's, the time the
//! warm-up took, and a heatmap of every read's latency over the whole run,
//! where the move from the disks' band (milliseconds) to the cache file's
//! (tenths of a millisecond) is visible. `no_cache` runs one phase as the
//! baseline.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::BenchArgs;

use super::{Goal, Headline, Outcome, Scenario};
use crate::report::{self, Series};
use crate::runner::{self, Until};
use crate::targets::{Bench, TargetKind, TargetSpec, each_target};
use crate::targets::{ReadTarget, TargetCounters};
use crate::workload::{self, PhaseRun, Sample, Setup};

const CLIENTS: usize = 20;
const READ_BYTES: u64 = 8 << 10;
/// recordsize of the dataset: the read size, as ZFS advises for databases
/// (a miss then costs one 8 KiB disk read, and warming takes one disk read
/// per 8 KiB of working set, so the cold phase stays cold).
const RECORDSIZE_BYTES: u32 = 8 << 10;
/// Working set in multiples of `arc_max`: over the ARC, within the L2ARC.
const WORKING_SET_OF_ARC: u64 = 5;
const DEFAULT_MEASURE_SECS: f64 = 6.0;
const DEFAULT_WARM_SECS: f64 = 60.0;
/// The seed's factors: warm / cold IOPS, cold / warm latency.
const SEED_IOPS_FACTOR: f64 = 8.3;
const SEED_LATENCY_FACTOR: f64 = 20.0;

#[derive(Serialize, Clone)]
pub(crate) struct Phase {
    pub name: String,
    pub seconds: f64,
    pub ios: u64,
    pub iops: f64,
    pub latency_us_p50: f64,
    pub latency_us_p90: f64,
    pub latency_us_p99: f64,
    pub latency_us_p999: f64,
    pub latency_us_max: f64,
    /// Counters over the phase (sizes at its end).
    pub counters: TargetCounters,
    /// DRAM hits over all reads of records.
    pub arc_hit_ratio: f64,
    /// Flash hits over the reads that missed DRAM.
    pub l2arc_hit_ratio: f64,
}

#[derive(Serialize)]
pub(crate) struct TargetRun {
    pub target: String,
    pub cold: Phase,
    pub warm: Option<Phase>,
    pub warmup_secs: f64,
    /// End of the first warm-up second at 90% of the warm IOPS.
    pub secs_to_90pct_of_warm: Option<f64>,
    pub iops_factor: Option<f64>,
    pub latency_p50_factor: Option<f64>,
    /// Every second of the run: cold, warm-up, warm.
    pub samples: Vec<Sample>,
}

#[derive(Serialize)]
pub(crate) struct LatencyReport {
    pub scenario: &'static str,
    #[serde(flatten)]
    pub setup: Setup,
    pub clients: usize,
    pub hdd_service_ms_record: f64,
    pub seed_iops_factor: f64,
    pub seed_latency_factor: f64,
    pub runs: Vec<TargetRun>,
    pub bytes_verified: u64,
    pub elapsed_secs: f64,
}

fn phase(name: &str, run: &PhaseRun, before: &TargetCounters) -> Phase {
    let counters = run
        .samples
        .last()
        .map(|s| s.counters)
        .unwrap_or_default()
        .since(before);
    let total = counters.dram_hits + counters.flash_hits + counters.misses;
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    Phase {
        name: name.to_string(),
        seconds: run.phase.elapsed_secs,
        ios: run.phase.ops,
        iops: run.phase.iops(),
        latency_us_p50: run.phase.latency_us(0.5),
        latency_us_p90: run.phase.latency_us(0.9),
        latency_us_p99: run.phase.latency_us(0.99),
        latency_us_p999: run.phase.latency_us(0.999),
        latency_us_max: run.phase.latency_ns.max() as f64 / 1000.0,
        arc_hit_ratio: ratio(counters.dram_hits, total),
        l2arc_hit_ratio: ratio(counters.flash_hits, counters.flash_hits + counters.misses),
        counters,
    }
}

pub(crate) fn run(args: &BenchArgs) -> Result<Outcome> {
    let began = Instant::now();
    let measure = Duration::from_secs_f64(args.measure_secs.unwrap_or(DEFAULT_MEASURE_SECS));
    let warm_max = Duration::from_secs_f64(args.warm_secs.unwrap_or(DEFAULT_WARM_SECS));
    let bench = Bench::prepare(args)?;
    let files = bench.files_for(WORKING_SET_OF_ARC * args.arc_max);
    let compression = args.compression != l2arc::Compression::Off;
    let spec = TargetSpec {
        recordsize_bytes: RECORDSIZE_BYTES,
        ..bench.spec(args, files, compression)
    };
    if spec.total_bytes() <= args.arc_max || spec.total_bytes() >= args.cache_size {
        bail!(
            "latency: the working set ({} MiB, about {WORKING_SET_OF_ARC}x --arc-max) must be larger than --arc-max ({} MiB) and smaller than --cache-size ({} MiB)",
            spec.total_bytes() >> 20,
            args.arc_max >> 20,
            args.cache_size >> 20
        );
    }
    let mut verified = 0u64;
    let runs = each_target(&TargetKind::in_run(args.peers), &spec, |kind, target| {
        let name = target.name().to_string();
        let (run, bytes) = run_target(args, &bench, &spec, target, kind, measure, warm_max)
            .with_context(|| format!("latency: {name}"))?;
        verified += bytes;
        if !args.json {
            eprintln!(
                "{name:>12}: cold {:.0} IOPS p50 {:.0} us{}",
                run.cold.iops,
                run.cold.latency_us_p50,
                run.warm.as_ref().map_or(String::new(), |w| format!(
                    ", warm {:.0} IOPS p50 {:.0} us after {:.0} s of warm-up",
                    w.iops, w.latency_us_p50, run.warmup_secs
                ))
            );
        }
        Ok(run)
    })?;
    let report = LatencyReport {
        scenario: "latency",
        setup: Setup::new(args, &bench, &spec, READ_BYTES),
        clients: CLIENTS,
        hdd_service_ms_record: bench.hdd_service_ms(u64::from(RECORDSIZE_BYTES)),
        seed_iops_factor: SEED_IOPS_FACTOR,
        seed_latency_factor: SEED_LATENCY_FACTOR,
        runs,
        bytes_verified: verified,
        elapsed_secs: began.elapsed().as_secs_f64(),
    };
    let html = html(&report);
    let headline = headline(&report);
    Ok(Outcome::new(report, headline, print_tables)?.with_html(html))
}

/// Warm l2arc against foyer (with `--peers`), and warm over cold.
fn headline(r: &LatencyReport) -> Vec<Headline> {
    // Named with `_lz4` when the L2ARC compresses (the default).
    let run_of = |name: &str| {
        r.runs
            .iter()
            .find(|x| x.target == name || x.target == format!("{name}_lz4"))
    };
    let warm = |name: &str| run_of(name).and_then(|x| x.warm.as_ref());
    let mut h = Vec::new();
    let what = format!(
        "seed experiment 2: {} clients, random {} KiB reads, working set between ARC and L2ARC, warm",
        r.clients,
        r.setup.read_bytes >> 10
    );
    if let (Some(ours), Some(foyer)) = (warm("l2arc"), warm("foyer")) {
        h.push(Headline::versus(
            "warm_iops_vs_foyer",
            &what,
            "IOPS",
            (ours.iops, "foyer HybridCache, same run", foyer.iops),
            Goal::ratio_at_least(1.0),
        ));
    }
    if let Some(run) = run_of("l2arc")
        && let Some(w) = &run.warm
    {
        h.push(Headline::versus(
            "warm_over_cold",
            "seed experiment 2: warm over cold IOPS",
            "IOPS",
            (w.iops, "the same cache cold", run.cold.iops),
            None,
        ));
    }
    h
}

fn run_target(
    args: &BenchArgs,
    bench: &Bench,
    spec: &TargetSpec,
    target: &dyn ReadTarget,
    kind: TargetKind,
    measure: Duration,
    warm_max: Duration,
) -> Result<(TargetRun, u64)> {
    let data = bench.dataset.spec();
    let op = workload::uniform_reads(&spec.file_sizes_bytes, READ_BYTES);
    let phase_for = |until, seed| {
        runner::Phase::new(target.name(), CLIENTS, Until::Elapsed(until))
            .interval(Duration::from_secs(1))
            .seed(seed)
    };
    let cold_run = workload::read_phase(
        target,
        &data,
        &phase_for(measure, args.seed),
        |_| false,
        &op,
    )?;
    if !kind.has_flash() {
        let bytes = cold_run.phase.bytes;
        return Ok((TargetRun::cold_only(target.name(), cold_run), bytes));
    }
    let settle = workload::misses_settled(6, 3, 0.05, (spec.cache_size_bytes / 100).max(1));
    let warming = workload::read_phase(
        target,
        &data,
        &phase_for(warm_max, args.seed ^ 1),
        settle,
        &op,
    )?;
    let warm_run = workload::read_phase(
        target,
        &data,
        &phase_for(measure, args.seed ^ 2),
        |_| false,
        &op,
    )?;
    let bytes = cold_run.phase.bytes + warming.phase.bytes + warm_run.phase.bytes;
    let run = TargetRun::warmed(target.name(), cold_run, warming, warm_run);
    Ok((run, bytes))
}

impl TargetRun {
    /// A target without a flash tier: the cold phase alone.
    fn cold_only(target: &str, cold_run: PhaseRun) -> Self {
        TargetRun {
            target: target.to_string(),
            cold: phase("cold", &cold_run, &TargetCounters::default()),
            warm: None,
            warmup_secs: 0.0,
            secs_to_90pct_of_warm: None,
            iops_factor: None,
            latency_p50_factor: None,
            samples: cold_run.samples,
        }
    }

    /// Cold, the warm-up, and warm, with every second on one time line.
    fn warmed(target: &str, cold_run: PhaseRun, warming: PhaseRun, warm_run: PhaseRun) -> Self {
        let cold = phase("cold", &cold_run, &TargetCounters::default());
        let before = warming
            .samples
            .last()
            .map(|s| s.counters)
            .unwrap_or_default();
        let warm = phase("warm", &warm_run, &before);
        let secs_to_90pct_of_warm = warming
            .samples
            .iter()
            .find(|s| s.iops >= 0.9 * warm.iops)
            .map(|s| s.end_secs);
        let offset = cold_run.phase.elapsed_secs;
        let mut samples = cold_run.samples;
        let warm_offset = offset + warming.phase.elapsed_secs;
        samples.extend(warming.samples.iter().map(|s| Sample {
            end_secs: s.end_secs + offset,
            ..s.clone()
        }));
        samples.extend(warm_run.samples.iter().map(|s| Sample {
            end_secs: s.end_secs + warm_offset,
            ..s.clone()
        }));
        TargetRun {
            target: target.to_string(),
            iops_factor: Some(warm.iops / cold.iops.max(1e-9)),
            latency_p50_factor: Some(cold.latency_us_p50 / warm.latency_us_p50.max(1e-9)),
            cold,
            warm: Some(warm),
            warmup_secs: warming.phase.elapsed_secs,
            secs_to_90pct_of_warm,
            samples,
        }
    }
}

fn print_tables(r: &LatencyReport) {
    println!(
        "latency: {} clients, random {} KiB reads over {} MiB; arc_max {} MiB, L2ARC {} MiB ({}), recordsize {} KiB; {} ({:.2} ms per record); content {} (LZ4 {:.2}:1)",
        r.clients,
        r.setup.read_bytes >> 10,
        r.setup.working_set_bytes >> 20,
        r.setup.arc_max_bytes >> 20,
        r.setup.cache_size_bytes >> 20,
        if r.setup.compression { "lz4" } else { "off" },
        r.setup.recordsize_bytes >> 10,
        r.setup.hdd,
        r.hdd_service_ms_record,
        r.setup.content,
        r.setup.dataset_lz4_ratio
    );
    println!();
    println!(
        "{:<12} {:<5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "target", "phase", "IOPS", "p50 us", "p90 us", "p99 us", "p99.9 us", "ARC hit", "L2 hit"
    );
    for run in &r.runs {
        for p in std::iter::once(&run.cold).chain(run.warm.as_ref()) {
            println!(
                "{:<12} {:<5} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>7.1}% {:>7.1}%",
                run.target,
                p.name,
                p.iops,
                p.latency_us_p50,
                p.latency_us_p90,
                p.latency_us_p99,
                p.latency_us_p999,
                100.0 * p.arc_hit_ratio,
                100.0 * p.l2arc_hit_ratio
            );
        }
    }
    println!();
    for run in r.runs.iter().filter(|x| x.warm.is_some()) {
        println!(
            "{}: warm/cold IOPS {:.1}x (seed {:.1}x), cold/warm p50 latency {:.1}x (seed {:.0}x); warm-up {:.0} s{}",
            run.target,
            run.iops_factor.unwrap_or(0.0),
            r.seed_iops_factor,
            run.latency_p50_factor.unwrap_or(0.0),
            r.seed_latency_factor,
            run.warmup_secs,
            run.secs_to_90pct_of_warm.map_or(String::new(), |s| format!(
                ", 90% of the warm IOPS after {s:.0} s of it"
            ))
        );
    }
    // Runs are no_cache, ours, then the peers.
    let ours = r.runs.get(1).and_then(|x| x.warm.as_ref());
    for peer in r.runs.iter().skip(2) {
        if let (Some(o), Some(p)) = (ours, peer.warm.as_ref()) {
            println!(
                "ours/{}, warm: IOPS {:.2}x, hit ratio {:.3}x, p99 latency {:.2}x lower",
                peer.target,
                o.iops / p.iops,
                o.counters.hit_ratio() / p.counters.hit_ratio().max(f64::MIN_POSITIVE),
                p.latency_us_p99 / o.latency_us_p99.max(f64::MIN_POSITIVE)
            );
        }
    }
    println!(
        "every byte checked: {} MiB read, all matching the dataset; {:.0} s",
        r.bytes_verified >> 20,
        r.elapsed_secs
    );
}

fn html(r: &LatencyReport) -> String {
    let mut sections = vec![
        ("Cold and warm".to_string(), html_phases(r)),
        (
            "Improvement once warm, against the seed".to_string(),
            html_factors(r),
        ),
    ];
    for run in r.runs.iter().filter(|x| x.warm.is_some()) {
        sections.extend(html_run_charts(r, run));
    }
    report::page(
        "l2arc bench: latency cold and warm",
        &format!(
            "{} clients, random {} KiB reads over a {} MiB working set; arc_max {} MiB, L2ARC {} MiB; {}. Seed: {:.1}x IOPS, {:.0}x latency once warm. Every byte verified ({} MiB).",
            r.clients,
            r.setup.read_bytes >> 10,
            r.setup.working_set_bytes >> 20,
            r.setup.arc_max_bytes >> 20,
            r.setup.cache_size_bytes >> 20,
            r.setup.hdd,
            r.seed_iops_factor,
            r.seed_latency_factor,
            r.bytes_verified >> 20
        ),
        &sections,
    )
}

/// Every phase of every target: IOPS, percentiles, hit ratios.
fn html_phases(r: &LatencyReport) -> String {
    let mut rows = Vec::new();
    for run in &r.runs {
        for p in std::iter::once(&run.cold).chain(run.warm.as_ref()) {
            rows.push(vec![
                run.target.clone(),
                p.name.clone(),
                format!("{:.0}", p.iops),
                format!("{:.0}", p.latency_us_p50),
                format!("{:.0}", p.latency_us_p90),
                format!("{:.0}", p.latency_us_p99),
                format!("{:.0}", p.latency_us_p999),
                format!("{:.1}%", 100.0 * p.arc_hit_ratio),
                format!("{:.1}%", 100.0 * p.l2arc_hit_ratio),
            ]);
        }
    }
    report::table(
        &[
            "target",
            "phase",
            "IOPS",
            "p50 us",
            "p90 us",
            "p99 us",
            "p99.9 us",
            "ARC hit",
            "L2ARC hit",
        ],
        &rows,
    )
}

/// Warm over cold, against the seed's factors.
fn html_factors(r: &LatencyReport) -> String {
    let factors: Vec<Vec<String>> = r
        .runs
        .iter()
        .filter(|x| x.warm.is_some())
        .map(|x| {
            vec![
                x.target.clone(),
                format!("{:.1}x", x.iops_factor.unwrap_or(0.0)),
                format!("{:.1}x", r.seed_iops_factor),
                format!("{:.1}x", x.latency_p50_factor.unwrap_or(0.0)),
                format!("{:.0}x", r.seed_latency_factor),
                format!("{:.0}", x.warmup_secs),
            ]
        })
        .collect();
    report::table(
        &[
            "target",
            "warm/cold IOPS",
            "seed",
            "cold/warm p50",
            "seed",
            "warm-up s",
        ],
        &factors,
    )
}

/// A target's latency heatmap and its IOPS and L2ARC fill over the run.
fn html_run_charts(r: &LatencyReport, run: &TargetRun) -> Vec<(String, String)> {
    let mut sections = Vec::new();
    let x: Vec<f64> = run.samples.iter().map(|s| s.end_secs).collect();
    let counts: Vec<Vec<u64>> = run
        .samples
        .iter()
        .map(|s| s.latency_buckets.clone())
        .collect();
    sections.push((
        format!("Latency heatmap, {}", run.target),
        report::heatmap(
            &format!(
                "{}: read latency per second (cold, warm-up, warm)",
                run.target
            ),
            &x,
            "seconds",
            &r.setup.heatmap_bucket_lower_us,
            &counts,
            &[
                (run.cold.seconds, "warm-up".to_string()),
                (run.cold.seconds + run.warmup_secs, "warm".to_string()),
            ],
        ),
    ));
    sections.push((
        format!("IOPS and L2ARC fill, {}", run.target),
        report::line_chart_two_axes(
            &format!("{}: IOPS and L2ARC fill", run.target),
            &x,
            "seconds",
            &[Series::new(
                "IOPS",
                run.samples.iter().map(|s| s.iops).collect(),
            )],
            "IOPS",
            &[Series::new(
                "L2ARC fill, MiB",
                run.samples
                    .iter()
                    .map(|s| s.counters.flash_bytes as f64 / (1 << 20) as f64)
                    .collect(),
            )],
            "L2ARC MiB",
        ),
    ));
    sections
}

/// `--scenario latency`.
pub(crate) struct Latency;

impl Scenario for Latency {
    fn name(&self) -> &'static str {
        "latency"
    }
    fn measures(&self) -> &'static str {
        "Seed experiment 2: 20 clients of random 8 KiB reads over a working set between ARC and L2ARC: cold vs warm."
    }
    fn run(&self, args: &BenchArgs) -> Result<Outcome> {
        run(args)
    }
}
