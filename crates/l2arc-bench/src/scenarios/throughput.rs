//! Throughput by dataset size: the first workload of the seed articles.
//!
//! 50 reader threads each loop: pick a random file, a random 128 KiB-aligned
//! offset, and read eight 128 KiB blocks from there. The dataset grows from
//! half the L2ARC to three times it (prefixes of one generated dataset, so
//! the bytes are made once); at each size three settings run from cold:
//! `no_l2arc` (the ARC alone, deliberately small), `l2arc` (records stored as
//! they are) and `l2arc_lz4` (compressed about 2:1, so the cache holds about
//! twice the data). Each cell warms until its miss ratio stops falling and its flash tier stops filling (or a time
//! limit), then is measured. The tables are the seed's two: aggregate MiB/s
//! and aggregate 128 KiB reads per second.
//!
//! The expected floor. While the dataset fits the L2ARC, a warm read costs a
//! cache-file read instead of a disk read, so `l2arc` should gain on
//! `no_l2arc` what the cache file gains on the disk array under the same
//! load: 50 readers of 128 KiB. The disk array's capacity follows from its
//! configuration (spindles, each one read of mean positioning time plus
//! transfer at a time); the cache file's is measured here on the file the
//! `l2arc` cell filled, by 50 threads of random O_DIRECT reads. Their ratio
//! is the floor. (One read at a time would be the wrong yardstick: the
//! array serves 4 reads at once and the flash queue many more.) The report
//! also gives `l2arc` as a share of the raw cache file: how much of what the
//! device can do the cache delivers, with every byte checked and, for
//! `l2arc_lz4`, decompressed on 2 CPUs. `no_l2arc` has ARC hits of its own
//! (small files are picked as often as large ones), so it can beat the bare
//! array: the report states both ratios.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::BenchArgs;

use super::{Goal, Headline, Outcome, Scenario};
use crate::report::{self, Series};
use crate::runner::{self, Phase, Until};
use crate::targets::{Bench, L2arcTarget, TargetKind, TargetSpec, build};
use crate::targets::{ReadTarget, TargetCounters};
use crate::workload::{self, PhaseRun, Sample};

const THREADS: usize = 50;
const IO_BYTES: u64 = 128 << 10;
const READS_PER_LOOP: u64 = 8;
const DEFAULT_MEASURE_SECS: f64 = 8.0;
const DEFAULT_WARM_SECS: f64 = 30.0;
/// How long the cache file is read to measure the floor.
const FLOOR_SECS: f64 = 2.0;

#[derive(Serialize)]
pub(crate) struct Cell {
    pub multiple: f64,
    pub dataset_bytes: u64,
    pub files: usize,
    pub setting: String,
    pub warm_secs: f64,
    pub mib_per_sec: f64,
    pub iops: f64,
    pub latency_us_p50: f64,
    pub latency_us_p99: f64,
    /// Counters over the measured phase (sizes at its end).
    pub counters: TargetCounters,
    pub hit_ratio: f64,
    pub warm_samples: Vec<Sample>,
    pub samples: Vec<Sample>,
}

#[derive(Serialize)]
pub(crate) struct Ratios {
    pub multiple: f64,
    pub l2arc_lz4_over_l2arc: f64,
    pub l2arc_over_no_l2arc: f64,
}

#[derive(Serialize)]
pub(crate) struct Floor {
    /// One 128 KiB read on one emulated disk: mean positioning plus transfer.
    pub hdd_service_ms_128k: f64,
    /// The array's capacity for 128 KiB reads with every spindle busy.
    pub hdd_mib_per_sec: f64,
    /// Random 128 KiB reads of the filled cache file by the workload's threads.
    pub cache_file_mib_per_sec: f64,
    pub cache_file_direct: bool,
    /// cache file / disk array: what l2arc / no_l2arc should reach while the dataset fits.
    pub ratio: f64,
}

#[derive(Serialize)]
pub(crate) struct ThroughputReport {
    pub scenario: &'static str,
    pub threads: usize,
    pub io_bytes: u64,
    pub reads_per_loop: u64,
    pub arc_max_bytes: u64,
    pub cache_size_bytes: u64,
    pub recordsize_bytes: u64,
    pub hdd: String,
    pub hdd_spindles: usize,
    pub content: String,
    pub dataset_lz4_ratio: f64,
    pub settings: Vec<String>,
    pub multiples: Vec<f64>,
    pub cells: Vec<Cell>,
    pub ratios: Vec<Ratios>,
    pub floor: Option<Floor>,
    pub bytes_verified: u64,
    pub elapsed_secs: f64,
}

impl ThroughputReport {
    fn cell(&self, multiple: f64, setting: &str) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.multiple == multiple && c.setting == setting)
    }
}

pub(crate) fn run(args: &BenchArgs) -> Result<Outcome> {
    let began = Instant::now();
    if args.multiples.is_empty() || args.multiples.iter().any(|m| !(*m > 0.0 && *m <= 100.0)) {
        bail!(
            "--multiples must be positive numbers up to 100: {:?}",
            args.multiples
        );
    }
    let cells = Cells {
        args,
        bench: Bench::prepare(args)?,
        warm_max: Duration::from_secs_f64(args.warm_secs.unwrap_or(DEFAULT_WARM_SECS)),
        measure: Duration::from_secs_f64(args.measure_secs.unwrap_or(DEFAULT_MEASURE_SECS)),
    };
    let settings = settings(args.peers);
    let mut report = cells.empty_report(settings.clone());
    for &multiple in &args.multiples {
        let files = cells
            .bench
            .dataset
            .prefix_files((multiple * args.cache_size as f64) as u64);
        for setting in &settings {
            let want_floor = report.floor.is_none() && setting == "l2arc";
            let (cell, bytes, floor) = cells.measure(multiple, files, setting, want_floor)?;
            report.cells.push(cell);
            report.bytes_verified += bytes;
            report.floor = report.floor.take().or(floor);
        }
    }
    report.ratios = ratios(&report);
    report.elapsed_secs = began.elapsed().as_secs_f64();
    let html = html(&report);
    let headline = headline(&report);
    Ok(Outcome::new(report, headline, print_tables)?.with_html(html))
}

/// l2arc against foyer (with `--peers`) at each dataset size, without and
/// with LZ4.
fn headline(r: &ThroughputReport) -> Vec<Headline> {
    let mut h = Vec::new();
    for &m in &r.multiples {
        for (ours, peer, lz4) in [
            ("l2arc", "foyer", ""),
            ("l2arc_lz4", "foyer_lz4", ", LZ4 on both"),
        ] {
            let (Some(a), Some(b)) = (r.cell(m, ours), r.cell(m, peer)) else {
                continue;
            };
            h.push(Headline::versus(
                &format!("{ours}_{m}x"),
                &format!(
                    "seed experiment 1: 50 threads of 8 sequential 128 KiB reads, dataset {m}x the L2ARC{lz4}"
                ),
                "MiB/s",
                (a.mib_per_sec, &format!("foyer HybridCache{lz4}"), b.mib_per_sec),
                Goal::ratio_at_least(1.0),
            ));
        }
    }
    h
}

/// The settings in report order: ours, then with `--peers` the peers.
fn settings(peers: bool) -> Vec<String> {
    let mut settings: Vec<String> = ["no_l2arc", "l2arc", "l2arc_lz4"]
        .map(String::from)
        .to_vec();
    if peers {
        settings.extend(["foyer", "foyer_lz4", "l2arc_lru"].map(String::from));
    }
    settings
}

/// The cache settings' ratios at each dataset size.
fn ratios(report: &ThroughputReport) -> Vec<Ratios> {
    report
        .multiples
        .iter()
        .map(|&m| {
            let mib = |s: &str| report.cell(m, s).map_or(f64::NAN, |c| c.mib_per_sec);
            Ratios {
                multiple: m,
                l2arc_lz4_over_l2arc: mib("l2arc_lz4") / mib("l2arc"),
                l2arc_over_no_l2arc: mib("l2arc") / mib("no_l2arc"),
            }
        })
        .collect()
}

/// What every cell shares: the flags, the dataset and disks, the phases' lengths.
struct Cells<'a> {
    args: &'a BenchArgs,
    bench: Bench,
    warm_max: Duration,
    measure: Duration,
}

impl Cells<'_> {
    /// The report before any cell is measured.
    fn empty_report(&self, settings: Vec<String>) -> ThroughputReport {
        let args = self.args;
        ThroughputReport {
            scenario: "throughput",
            threads: THREADS,
            io_bytes: IO_BYTES,
            reads_per_loop: READS_PER_LOOP,
            arc_max_bytes: args.arc_max,
            cache_size_bytes: args.cache_size,
            recordsize_bytes: args.recordsize,
            hdd: self.bench.describe_hdd(),
            hdd_spindles: self.bench.hdd.spindles,
            content: format!("{:?}", args.content).to_lowercase(),
            dataset_lz4_ratio: self.bench.lz4_ratio,
            settings,
            multiples: args.multiples.clone(),
            cells: Vec::new(),
            ratios: Vec::new(),
            floor: None,
            bytes_verified: 0,
            elapsed_secs: 0.0,
        }
    }

    /// One cell from cold: a fresh target of `setting` over the first
    /// `files` files, warmed, then measured (and, with `want_floor`, the
    /// floor measured on its cache file). Returns the cell, the bytes it
    /// read, and the floor.
    fn measure(
        &self,
        multiple: f64,
        files: usize,
        setting: &str,
        want_floor: bool,
    ) -> Result<(Cell, u64, Option<Floor>)> {
        let spec = self.bench.spec(self.args, files, setting.ends_with("_lz4"));
        let target = make_target(setting, &spec)?;
        let label = format!("{multiple}x {setting}");
        let (warm, run) = self.warm_then_measure(&spec, target.as_ref(), &label)?;
        let floor = if want_floor {
            Some(measure_floor(&spec, &self.bench, &run)?)
        } else {
            None
        };
        let bytes = warm.phase.bytes + run.phase.bytes;
        let cell = Cell::new(multiple, files, setting, &spec, warm, run);
        if !self.args.json {
            eprintln!(
                "{label:>18}: {} MiB in {files} files, warmed {:.0} s, {:.1} MiB/s, {:.0} IOPS, hit {:.0}%, L2 {} MiB",
                cell.dataset_bytes >> 20,
                cell.warm_secs,
                cell.mib_per_sec,
                cell.iops,
                100.0 * cell.hit_ratio,
                cell.counters.flash_bytes >> 20
            );
        }
        drop(target);
        spec.remove_cache_file()?;
        Ok((cell, bytes, floor))
    }

    /// Warms `target` until its miss ratio and flash fill settle (or
    /// `warm_max`), then measures for `measure`.
    fn warm_then_measure(
        &self,
        spec: &TargetSpec,
        target: &dyn ReadTarget,
        label: &str,
    ) -> Result<(PhaseRun, PhaseRun)> {
        let data = self.bench.dataset.spec();
        let sizes = &spec.file_sizes_bytes;
        let op = |reader: &mut workload::Reader| {
            let file = reader.rng().below(sizes.len() as u64) as u32;
            let units = sizes[file as usize] / IO_BYTES;
            assert!(units >= READS_PER_LOOP, "files hold at least 8 reads");
            let first = reader.rng().below(units - READS_PER_LOOP + 1);
            for i in 0..READS_PER_LOOP {
                reader.read(file, (first + i) * IO_BYTES, IO_BYTES as usize)?;
            }
            Ok(())
        };
        let phase = |until, seed| {
            Phase::new(label, THREADS, Until::Elapsed(until))
                .interval(Duration::from_secs(1))
                .seed(seed)
        };
        let settle = workload::misses_settled(6, 3, 0.05, (spec.cache_size_bytes / 100).max(1));
        let warm = workload::read_phase(
            target,
            &data,
            &phase(self.warm_max, self.args.seed),
            settle,
            op,
        )
        .with_context(|| format!("{label}: warm-up"))?;
        let measure_phase = phase(self.measure, self.args.seed ^ 0x6d65_6173);
        let run = workload::read_phase(target, &data, &measure_phase, |_| false, op)
            .with_context(|| format!("{label}: measured phase"))?;
        Ok((warm, run))
    }
}

impl Cell {
    fn new(
        multiple: f64,
        files: usize,
        setting: &str,
        spec: &TargetSpec,
        warm: PhaseRun,
        run: PhaseRun,
    ) -> Self {
        let before = warm.samples.last().map(|s| s.counters).unwrap_or_default();
        let counters = run
            .samples
            .last()
            .map(|s| s.counters)
            .unwrap_or_default()
            .since(&before);
        Cell {
            multiple,
            dataset_bytes: spec.total_bytes(),
            files,
            setting: setting.to_string(),
            warm_secs: warm.phase.elapsed_secs,
            mib_per_sec: run.phase.mib_per_sec(),
            iops: run.phase.iops(),
            latency_us_p50: run.phase.latency_us(0.5),
            latency_us_p99: run.phase.latency_us(0.99),
            hit_ratio: counters.hit_ratio(),
            counters,
            warm_samples: warm.samples,
            samples: run.samples,
        }
    }
}

fn make_target(setting: &str, spec: &TargetSpec) -> Result<Box<dyn ReadTarget>> {
    match setting {
        "no_l2arc" => {
            let spec = TargetSpec {
                cache_size_bytes: 0,
                ..spec.clone()
            };
            Ok(Box::new(L2arcTarget::with_name(&spec, "no_l2arc")?))
        }
        "l2arc" | "l2arc_lz4" => build(TargetKind::L2arc, spec),
        "foyer" | "foyer_lz4" => build(TargetKind::Foyer, spec),
        "l2arc_lru" => build(TargetKind::L2arcLru, spec),
        other => bail!("unknown setting {other}"),
    }
}

/// Measures the floor: the disk array's 128 KiB capacity from its
/// configuration, the cache file's by `THREADS` threads of random O_DIRECT
/// reads over its filled part.
fn measure_floor(spec: &TargetSpec, bench: &Bench, run: &PhaseRun) -> Result<Floor> {
    use l2arc::{DeviceIo, FileDevice};
    let device = FileDevice::open(&spec.cache_path, None)?;
    let filled = run
        .samples
        .last()
        .map_or(0, |s| s.counters.flash_alloc_bytes)
        .clamp(IO_BYTES, device.size_bytes());
    let blocks = (filled / IO_BYTES).max(1);
    let phase = Phase::new(
        "floor",
        THREADS,
        Until::Elapsed(Duration::from_secs_f64(FLOOR_SECS)),
    )
    .seed(0xf100);
    let floor = runner::run(
        &phase,
        &mut (),
        |_| Ok(l2arc::internals::AlignedBuf::zeroed(IO_BYTES as usize)),
        |buf, worker| {
            worker.timed(|rng| {
                device.read_at(rng.below(blocks) * IO_BYTES, buf.as_mut_slice())?;
                Ok(IO_BYTES)
            })
        },
    )?;
    let cache_file_mib_per_sec = floor.mib_per_sec();
    let mib = |reads: f64| reads * IO_BYTES as f64 / (1 << 20) as f64;
    let hdd_ms = bench.hdd_service_ms(IO_BYTES);
    let hdd_mib_per_sec = mib(bench.hdd.spindles as f64 * 1000.0 / hdd_ms);
    Ok(Floor {
        hdd_service_ms_128k: hdd_ms,
        hdd_mib_per_sec,
        cache_file_mib_per_sec,
        cache_file_direct: device.is_direct(),
        ratio: cache_file_mib_per_sec / hdd_mib_per_sec,
    })
}

fn print_tables(r: &ThroughputReport) {
    print_header(r);
    print_cell_tables(r);
    println!();
    print_ratios(r);
    if let Some(f) = &r.floor {
        println!();
        print_floor(r, f);
    }
    println!(
        "every byte checked: {} MiB read, all matching the dataset; {:.0} s",
        r.bytes_verified >> 20,
        r.elapsed_secs
    );
}

fn print_header(r: &ThroughputReport) {
    println!(
        "throughput: {} threads, loops of {} x {} KiB reads; arc_max {} MiB, L2ARC {} MiB, recordsize {} KiB; {}; content {} (LZ4 {:.2}:1)",
        r.threads,
        r.reads_per_loop,
        r.io_bytes >> 10,
        r.arc_max_bytes >> 20,
        r.cache_size_bytes >> 20,
        r.recordsize_bytes >> 10,
        r.hdd,
        r.content,
        r.dataset_lz4_ratio
    );
}

/// The seed's two tables: MiB/s and 128 KiB reads per second, a row per
/// dataset size, a column per setting.
fn print_cell_tables(r: &ThroughputReport) {
    for (title, unit, pick) in [
        (
            "aggregate throughput, MiB/s",
            "MiB/s",
            (|c: &Cell| c.mib_per_sec) as fn(&Cell) -> f64,
        ),
        ("aggregate 128 KiB reads per second", "IOPS", |c: &Cell| {
            c.iops
        }),
    ] {
        println!();
        println!("{title}");
        print!("{:<22}", format!("dataset ({unit})"));
        for s in &r.settings {
            print!(" {s:>10}");
        }
        println!();
        for &m in &r.multiples {
            let bytes = r.cell(m, &r.settings[0]).map_or(0, |c| c.dataset_bytes);
            print!("{:<22}", format!("{m}x = {} MiB", bytes >> 20));
            for s in &r.settings {
                match r.cell(m, s) {
                    Some(c) => print!(" {:>10.1}", pick(c)),
                    None => print!(" {:>10}", "-"),
                }
            }
            println!();
        }
    }
}

/// Our settings against each other, then against the peers.
fn print_ratios(r: &ThroughputReport) {
    println!(
        "{:<22} {:>16} {:>16}",
        "dataset", "l2arc_lz4/l2arc", "l2arc/no_l2arc"
    );
    for ratio in &r.ratios {
        println!(
            "{:<22} {:>16.2} {:>16.1}",
            format!("{}x", ratio.multiple),
            ratio.l2arc_lz4_over_l2arc,
            ratio.l2arc_over_no_l2arc
        );
    }
    for (ours, peer) in [
        ("l2arc", "foyer"),
        ("l2arc_lz4", "foyer_lz4"),
        ("l2arc", "l2arc_lru"),
    ] {
        for &m in &r.multiples {
            if let (Some(o), Some(p)) = (r.cell(m, ours), r.cell(m, peer)) {
                println!(
                    "{ours}/{peer} at {m}x: throughput {:.2}x, hit ratio {:.3}x, p99 latency {:.2}x lower",
                    o.mib_per_sec / p.mib_per_sec,
                    o.hit_ratio / p.hit_ratio.max(f64::MIN_POSITIVE),
                    p.latency_us_p99 / o.latency_us_p99.max(f64::MIN_POSITIVE)
                );
            }
        }
    }
}

/// The expected floor, and where `l2arc` stands against it.
fn print_floor(r: &ThroughputReport, f: &Floor) {
    println!(
        "expected floor: cache file {:.0} MiB/s ({} threads of random 128 KiB {} reads, measured) / disk array {:.1} MiB/s ({} spindles, {:.2} ms a read) = {:.1}x",
        f.cache_file_mib_per_sec,
        r.threads,
        if f.cache_file_direct {
            "O_DIRECT"
        } else {
            "buffered"
        },
        f.hdd_mib_per_sec,
        r.hdd_spindles,
        f.hdd_service_ms_128k,
        f.ratio
    );
    for ratio in r.ratios.iter().filter(|x| x.multiple <= 1.0) {
        let l2arc = r
            .cell(ratio.multiple, "l2arc")
            .map_or(0.0, |c| c.mib_per_sec);
        println!(
            "  {}x (fits the L2ARC): l2arc/no_l2arc {:.1}x ({} the floor), l2arc/disk array {:.1}x, l2arc/bare cache file {:.2}x (ARC hits on top of flash)",
            ratio.multiple,
            ratio.l2arc_over_no_l2arc,
            if ratio.l2arc_over_no_l2arc >= f.ratio {
                "reaches"
            } else {
                "below"
            },
            l2arc / f.hdd_mib_per_sec,
            l2arc / f.cache_file_mib_per_sec
        );
    }
}

fn html(r: &ThroughputReport) -> String {
    let mut sections = html_charts(r);
    sections.push(("Cells".to_string(), html_cells(r)));
    sections.push(("Ratios".to_string(), html_ratios(r)));
    sections.extend(html_warm_curves(r));
    report::page(
        "l2arc bench: throughput by dataset size",
        &format!(
            "{} threads, each loop eight 128 KiB reads at a random aligned offset of a random file. arc_max {} MiB, L2ARC {} MiB, {}; content {} (LZ4 {:.2}:1). Every byte verified ({} MiB).",
            r.threads,
            r.arc_max_bytes >> 20,
            r.cache_size_bytes >> 20,
            r.hdd,
            r.content,
            r.dataset_lz4_ratio,
            r.bytes_verified >> 20
        ),
        &sections,
    )
}

/// The two bar charts: MiB/s and reads per second by dataset size.
fn html_charts(r: &ThroughputReport) -> Vec<(String, String)> {
    let categories: Vec<String> = r
        .multiples
        .iter()
        .map(|m| {
            let bytes = r.cell(*m, &r.settings[0]).map_or(0, |c| c.dataset_bytes);
            format!("{m}x ({} MiB)", bytes >> 20)
        })
        .collect();
    let series = |pick: fn(&Cell) -> f64| -> Vec<Series> {
        r.settings
            .iter()
            .map(|s| {
                Series::new(
                    s.clone(),
                    r.multiples
                        .iter()
                        .map(|m| r.cell(*m, s).map_or(f64::NAN, pick))
                        .collect(),
                )
            })
            .collect()
    };
    vec![
        (
            "Aggregate throughput".to_string(),
            report::bar_chart(
                "Aggregate throughput by dataset size (x L2ARC size)",
                &categories,
                &series(|c| c.mib_per_sec),
                "MiB/s",
            ),
        ),
        (
            "Aggregate 128 KiB reads per second".to_string(),
            report::bar_chart(
                "128 KiB reads per second by dataset size",
                &categories,
                &series(|c| c.iops),
                "IOPS",
            ),
        ),
    ]
}

fn html_cells(r: &ThroughputReport) -> String {
    let mut rows = Vec::new();
    for c in &r.cells {
        rows.push(vec![
            format!("{}x", c.multiple),
            format!("{}", c.dataset_bytes >> 20),
            c.setting.clone(),
            format!("{:.0}", c.warm_secs),
            format!("{:.1}", c.mib_per_sec),
            format!("{:.0}", c.iops),
            format!("{:.0}", c.latency_us_p50),
            format!("{:.0}", c.latency_us_p99),
            format!("{:.1}%", 100.0 * c.hit_ratio),
            format!("{}", c.counters.flash_bytes >> 20),
        ]);
    }
    report::table(
        &[
            "dataset", "MiB", "setting", "warm s", "MiB/s", "IOPS", "p50 us", "p99 us", "hit",
            "L2 MiB",
        ],
        &rows,
    )
}

fn html_ratios(r: &ThroughputReport) -> String {
    let ratio_rows: Vec<Vec<String>> = r
        .ratios
        .iter()
        .map(|x| {
            vec![
                format!("{}x", x.multiple),
                format!("{:.2}", x.l2arc_lz4_over_l2arc),
                format!("{:.1}", x.l2arc_over_no_l2arc),
            ]
        })
        .collect();
    let floor = r.floor.as_ref().map_or(String::new(), |f| {
        format!(
            "<p>Expected floor while the dataset fits: cache file {:.0} MiB/s ({} threads of random 128 KiB reads) / disk array {:.1} MiB/s = {:.1}x.</p>",
            f.cache_file_mib_per_sec, r.threads, f.hdd_mib_per_sec, f.ratio
        )
    });
    report::table(
        &["dataset", "l2arc_lz4 / l2arc", "l2arc / no_l2arc"],
        &ratio_rows,
    ) + &floor
}

/// Warm-up curves of the cached settings at the smallest size.
fn html_warm_curves(r: &ThroughputReport) -> Vec<(String, String)> {
    let mut sections = Vec::new();
    if let Some(&m) = r.multiples.first() {
        for s in r.settings.iter().filter(|s| *s != "no_l2arc") {
            if let Some(c) = r.cell(m, s) {
                let all: Vec<&Sample> = c.warm_samples.iter().chain(&c.samples).collect();
                let x: Vec<f64> = (1..=all.len()).map(|i| i as f64).collect();
                sections.push((
                    format!("Warm-up and measurement, {s} at {m}x"),
                    report::line_chart_two_axes(
                        &format!("{s} at {m}x: MiB/s and L2ARC fill per second"),
                        &x,
                        "seconds (warm-up, then measured)",
                        &[Series::new(
                            "MiB/s",
                            all.iter().map(|s| s.mib_per_sec).collect(),
                        )],
                        "MiB/s",
                        &[Series::new(
                            "L2ARC fill, MiB",
                            all.iter()
                                .map(|s| s.counters.flash_bytes as f64 / (1 << 20) as f64)
                                .collect(),
                        )],
                        "L2ARC MiB",
                    ),
                ));
            }
        }
    }
    sections
}

/// `--scenario throughput`.
pub(crate) struct Throughput;

impl Scenario for Throughput {
    fn name(&self) -> &'static str {
        "throughput"
    }
    fn measures(&self) -> &'static str {
        "Seed experiment 1: 50 threads of eight 128 KiB reads, datasets 0.5x to 3x the L2ARC: no_l2arc, l2arc, l2arc_lz4."
    }
    fn run(&self, args: &BenchArgs) -> Result<Outcome> {
        run(args)
    }
}
