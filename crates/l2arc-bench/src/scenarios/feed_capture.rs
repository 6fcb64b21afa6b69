//! How much of what the ARC lets go reaches flash: an image read whole
//! four times in a row through a small ARC.
//!
//! The image is in the page cache, so primary reads are fast and the ARC
//! (an eighth of the image) turns over far faster than any timer-driven
//! feeder wakes: the worst case for an L2ARC that copies from the ARC's cold
//! ends, and the common case of a sequential re-read. Each pass reads the
//! image from 4 threads in 1 MiB chunks (nbdcopy's shape). Three feeders,
//! each on a fresh cache and cache file, side by side:
//!
//! - `write-back`: evicted records are handed to the feeder (the default);
//! - `intake wake`: the feeder is woken by the ARC's intake, no write-back;
//! - `timer`: neither (OpenZFS's feeder: it wakes on its timer alone).
//!
//! Reported per pass: the L2 hit ratio of the ARC's misses (the goal: 90%
//! on the second pass), `l2_size` after the pass, and the `evict_l2_*`
//! counters of the pass, with the capture ratio `evict_l2_queued /
//! evict_l2_eligible` (the goal: 95%).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use l2arc::Compression;
use l2arc::L2ArcConfig;
use l2arc::primary::Primary;
use l2arc::primary::image::ImagePrimary;
use l2arc::{Cache, CacheConfig, DatasetConfig};
use serde::Serialize;

use crate::BenchArgs;

use super::{Goal, Headline, Outcome, Scenario};
use crate::runner::{self, Phase, Until};

const PASSES: usize = 4;
const READERS: usize = 4;
const CHUNK_BYTES: u64 = 1 << 20;

#[derive(Serialize)]
struct Pass {
    pass: usize,
    secs: f64,
    l2_hit_ratio: f64,
    l2_size_bytes: u64,
    evict_l2_eligible: u64,
    evict_l2_queued: u64,
    evict_l2_skip: u64,
    evict_l2_cached: u64,
    evict_l2_ineligible: u64,
    capture_ratio: f64,
    primary_reads: u64,
}

#[derive(Serialize)]
struct Feeder {
    name: &'static str,
    passes: Vec<Pass>,
}

#[derive(Serialize)]
struct Report {
    image_bytes: u64,
    arc_max_bytes: u64,
    cache_file_bytes: u64,
    recordsize_bytes: u64,
    feeders: Vec<Feeder>,
    load_average: String,
}

pub(crate) fn run(args: &BenchArgs) -> Result<Outcome> {
    let temp;
    let dir = match &args.data {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::tempdir().context("cannot make a temporary directory")?;
            temp.path().to_path_buf()
        }
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let image_bytes = args.dataset_size / CHUNK_BYTES * CHUNK_BYTES;
    if image_bytes < 16 * CHUNK_BYTES {
        bail!("--dataset-size must be at least 16 MiB for --scenario feed-capture");
    }
    let image = dir.join("feed-capture.img");
    write_random_image(&image, image_bytes, args.seed)?;
    let arc_max_bytes = image_bytes / 8;
    let cache_file_bytes = image_bytes * 2;
    let recordsize_bytes = 64 << 10;
    let feeders = [
        ("write-back", true, true),
        ("intake wake", false, true),
        ("timer", false, false),
    ];
    let mut report = Report {
        image_bytes,
        arc_max_bytes,
        cache_file_bytes,
        recordsize_bytes,
        feeders: Vec::new(),
        load_average: crate::load_average(),
    };
    for (name, write_back, feed_again) in feeders {
        let cache_path = dir.join("feed-capture-cache.img");
        let _ = std::fs::remove_file(&cache_path);
        let feeder = Feeder::measure(name, &report, &image, &cache_path, write_back, feed_again)?;
        report.feeders.push(feeder);
        let _ = std::fs::remove_file(&cache_path);
    }
    let _ = std::fs::remove_file(&image);
    let headline = headline(&report);
    Outcome::new(report, headline, print_report)
}

/// Pass 2's L2 hits and pass 1's share kept, the write-back feeder against
/// the timer's.
fn headline(r: &Report) -> Vec<Headline> {
    let pass = |name: &str, n: usize| {
        r.feeders
            .iter()
            .find(|f| f.name == name)
            .and_then(|f| f.passes.get(n))
    };
    let (Some(ours2), Some(timer2), Some(ours1), Some(timer1)) = (
        pass("write-back", 1),
        pass("timer", 1),
        pass("write-back", 0),
        pass("timer", 0),
    ) else {
        return Vec::new();
    };
    let mut h = vec![
        Headline::versus(
            "pass2_l2_hits",
            "feeder capture (engine): image read 4x through an ARC 1/8 of it, L2 hits of pass 2's misses",
            "%",
            (
                100.0 * ours2.l2_hit_ratio,
                "timer-only feeder",
                100.0 * timer2.l2_hit_ratio,
            ),
            Goal::ours(true, 90.0),
        ),
        Headline::versus(
            "pass1_kept",
            "feeder capture (engine): eligible evicted bytes kept in pass 1",
            "%",
            (
                100.0 * ours1.capture_ratio,
                "timer-only feeder",
                100.0 * timer1.capture_ratio,
            ),
            Goal::ours(true, 95.0),
        ),
    ];
    for x in &mut h {
        x.ratio = None;
    }
    h
}

impl Feeder {
    /// A fresh cache over `image` with a fresh cache file at `cache_path`,
    /// its feeder woken by the write-back, the intake, or its timer alone;
    /// the image read whole `PASSES` times.
    fn measure(
        name: &'static str,
        sizes: &Report,
        image: &Path,
        cache_path: &Path,
        write_back: bool,
        feed_again: bool,
    ) -> Result<Self> {
        let cache = Cache::new(
            CacheConfig::default()
                .arc_max_bytes(sizes.arc_max_bytes)
                .l2arc(
                    L2ArcConfig::default()
                        .l2arc_feed_again(feed_again)
                        .l2arc_writeback_max_bytes(if write_back {
                            L2ArcConfig::default().l2arc_writeback_max_bytes
                        } else {
                            0
                        })
                        .l2arc_rebuild_enabled(false),
                ),
        )?;
        let primary: Arc<dyn Primary> = Arc::new(ImagePrimary::open(image, false)?);
        let dataset = cache.add_dataset(
            "image",
            primary,
            DatasetConfig::default()
                .recordsize_bytes(sizes.recordsize_bytes as u32)
                .compression(Compression::Lz4),
        )?;
        cache.add_cache_path(cache_path, Some(sizes.cache_file_bytes))?;
        let handle = cache.open(dataset, "", false)?;
        let mut passes = Vec::new();
        for pass in 1..=PASSES {
            let before = cache.stats();
            let started = Instant::now();
            read_whole(&cache, &handle, sizes.image_bytes)?;
            let secs = started.elapsed().as_secs_f64();
            passes.push(Pass::between(pass, secs, &before, &cache.stats()));
        }
        Ok(Feeder { name, passes })
    }
}

impl Pass {
    /// Pass `pass`, which took `secs`, from the statistics before and after it.
    fn between(
        pass: usize,
        secs: f64,
        before: &l2arc::CacheStats,
        after: &l2arc::CacheStats,
    ) -> Self {
        let l2 = |s: &l2arc::CacheStats, name| s.l2.as_ref().map_or(0, |l2| l2.get(name));
        let delta = |name| l2(after, name) - l2(before, name);
        let l2_lookups = delta("l2_hits") + delta("l2_misses");
        let eligible = delta("evict_l2_eligible");
        Pass {
            pass,
            secs,
            l2_hit_ratio: ratio(delta("l2_hits"), l2_lookups),
            l2_size_bytes: l2(after, "l2_size"),
            evict_l2_eligible: eligible,
            evict_l2_queued: delta("evict_l2_queued"),
            evict_l2_skip: delta("evict_l2_skip"),
            evict_l2_cached: delta("evict_l2_cached"),
            evict_l2_ineligible: delta("evict_l2_ineligible"),
            // No eligible bytes evicted: every record the ARC let go was on
            // flash already (`evict_l2_cached`), so nothing was lost.
            capture_ratio: if eligible == 0 {
                1.0
            } else {
                ratio(delta("evict_l2_queued"), eligible)
            },
            primary_reads: after.primary_reads - before.primary_reads,
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Random bytes (incompressible, as in the NBD runs this reproduces).
fn write_random_image(path: &Path, bytes: u64, seed: u64) -> Result<()> {
    use std::io::Write;
    let mut file = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?,
    );
    let mut rng = crate::runner::Rng::new(seed);
    let mut chunk = vec![0u8; CHUNK_BYTES as usize];
    for _ in 0..bytes / CHUNK_BYTES {
        for word in chunk.chunks_exact_mut(8) {
            word.copy_from_slice(&rng.next_u64().to_le_bytes());
        }
        file.write_all(&chunk)?;
    }
    file.flush()?;
    Ok(())
}

/// Reads the image whole: `READERS` threads, each taking the next 1 MiB
/// chunk, every byte read once.
fn read_whole(cache: &Cache, handle: &l2arc::ObjectHandle, image_bytes: u64) -> Result<()> {
    let phase = Phase::new("pass", READERS, Until::Ops(image_bytes / CHUNK_BYTES));
    runner::run(
        &phase,
        &mut (),
        |_| Ok(vec![0u8; CHUNK_BYTES as usize]),
        |buf, worker| {
            let offset = worker.op_index() * CHUNK_BYTES;
            worker.timed(|_| {
                let n = cache.read(handle, offset, buf)?;
                if n as u64 != CHUNK_BYTES {
                    bail!("short read at {offset}: {n} bytes");
                }
                Ok(CHUNK_BYTES)
            })
        },
    )?;
    Ok(())
}

fn print_report(r: &Report) {
    println!(
        "feed capture: a {} MiB image read whole {PASSES} times ({READERS} readers, 1 MiB reads), \
         arc_max {} MiB, cache file {} MiB, recordsize {} KiB, LZ4 (incompressible data); load {}",
        r.image_bytes >> 20,
        r.arc_max_bytes >> 20,
        r.cache_file_bytes >> 20,
        r.recordsize_bytes >> 10,
        r.load_average
    );
    println!(
        "{:<12} {:>4} {:>7} {:>8} {:>9} {:>10} {:>10} {:>9} {:>10} {:>8}",
        "feeder",
        "pass",
        "secs",
        "L2 hits",
        "l2_size",
        "eligible",
        "queued",
        "skip",
        "cached",
        "capture"
    );
    for feeder in &r.feeders {
        for p in &feeder.passes {
            println!(
                "{:<12} {:>4} {:>7.2} {:>7.1}% {:>5} MiB {:>6} MiB {:>6} MiB {:>5} MiB {:>6} MiB {:>7.1}%",
                feeder.name,
                p.pass,
                p.secs,
                100.0 * p.l2_hit_ratio,
                p.l2_size_bytes >> 20,
                p.evict_l2_eligible >> 20,
                p.evict_l2_queued >> 20,
                p.evict_l2_skip >> 20,
                p.evict_l2_cached >> 20,
                100.0 * p.capture_ratio
            );
        }
    }
    println!(
        "L2 hits: hits over the ARC's misses in the pass; eligible/queued/skip/cached: evict_l2_* bytes of the pass; \
         capture: queued over eligible (what the ARC let go that the write-back kept)"
    );
}

/// `--scenario feed-capture`.
pub(crate) struct FeedCapture;

impl Scenario for FeedCapture {
    fn name(&self) -> &'static str {
        "feed-capture"
    }
    fn measures(&self) -> &'static str {
        "Feeder capture: an image read whole four times through an ARC an eighth its size; L2 hits per pass and the evict_l2_* counters, write-back vs intake wake vs timer."
    }
    fn run(&self, args: &BenchArgs) -> Result<Outcome> {
        run(args)
    }
}
