//! `l2arc shared-cache gc`: keeps a fleet's shared cache bucket bounded.
//!
//! The shared tier writes one object per record, `PREFIX/<64 hex>/<index>`,
//! and never rewrites or deletes one: a block's key names the source's
//! identity, its ETag and the record size, so the bytes under a key never
//! change, and a changed source object simply stops being asked for under
//! its old keys. Nothing in the fleet evicts; this command does, run by any
//! one node or a cron job.
//!
//! Why oldest first by last-modified. A block is written once, when the
//! first node that missed it read it from the primary, and its
//! last-modified time is that moment. Deleting the oldest first is LRU by
//! write time (FIFO): it keeps what the fleet fetched most recently, which
//! is what it is reading now (a training epoch, a render's frames), and it
//! drops first the blocks of sources that changed (their old keys are never
//! read again, and they are all older than the new ones). A true LRU by
//! read would need a write per hit to the bucket (S3 has no access time):
//! a PUT per cache hit, across the fleet, costs more than the misses it
//! saves. A block dropped while still popular costs one primary read,
//! after which the tier writes it again, young: FIFO with reinsertion on
//! miss, which is close to LRU for a working set that fits the bound.
//!
//! Why racing with readers and writers is safe. A reader that asks for a
//! block gc just deleted gets a miss, and the record comes from the primary
//! (the tier checks every block it reads: a deleted block is a miss, never
//! a wrong byte). A writer that puts a block during the listing writes it
//! after gc's clock was read, so it is younger than every block the age
//! bound deletes, and the size bound deletes oldest first: it reaches a
//! block written during the listing only once everything older is gone,
//! which is the order the bound asks for anyway. A block deleted just as a
//! writer puts it again (same key, same bytes) is at worst one more miss.
//!
//! Only keys of exactly the tier's form are touched, so a prefix that is a
//! whole bucket holding other data never loses an unrelated object; the
//! rest are counted and left alone. Nothing is deleted until the listing
//! is complete: a listing that fails deletes nothing.
//!
//! Deletes go in batches (S3 DeleteObjects: up to 1000 keys a request). A
//! batch that fails is deleted again key by key, a bounded number at a
//! time, so that one refused key is counted, reported, and does not stop
//! the rest; the command then exits nonzero.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use l2arc::primary::object_store::{ObjectStoreConfig, ObjectStorePrimary};
use l2arc_cli::service::S3FileOptions;

use crate::s3_opts::S3Options;

/// Blocks held in memory for one run (56 bytes each: 896 MiB, 1.3 GiB
/// while the vector grows to it). A
/// cache of more blocks than that is split over several prefixes, or
/// bounded by the store's lifecycle rule.
const BLOCKS_LISTED_MAX: usize = 1 << 24;
/// Keys of one DeleteObjects request (S3's own limit).
const DELETE_BATCH_MAX: usize = 1000;
/// Single deletes in flight when a batch is retried key by key.
const DELETE_SINGLE_INFLIGHT_MAX: usize = 16;
/// Longest wait between two tries of a delete.
const BACKOFF_MAX_MS: u64 = 2_000;
/// Failed keys whose error is kept for the report.
const FAILURES_REPORTED_MAX: usize = 3;

/// `l2arc shared-cache ...`.
#[derive(Args, Debug)]
pub(crate) struct SharedCacheArgs {
    #[command(subcommand)]
    command: SharedCacheCommand,
}

#[derive(Subcommand, Debug)]
enum SharedCacheCommand {
    /// Delete the oldest blocks of a shared cache bucket until it is under
    /// --max-size (and every block older than --max-age): `l2arc
    /// shared-cache gc s3://BUCKET/PREFIX --max-size 2TiB --max-age 7d`.
    Gc(GcArgs),
}

/// `l2arc shared-cache gc`.
#[derive(Args, Debug)]
pub(crate) struct GcArgs {
    /// The shared cache: s3://BUCKET[/PREFIX], as given to
    /// --shared-cache. Only keys PREFIX/<64 hex>/<index> are considered.
    uri: String,
    /// Bytes of blocks to keep at most (4TiB, 500GiB...): the oldest
    /// blocks past it are deleted.
    #[arg(long, value_parser = parse_max_size)]
    max_size: u64,
    /// Also delete every block older than this (30m, 12h, 7d, 2w; plain
    /// seconds).
    #[arg(long, value_parser = parse_duration_secs)]
    max_age: Option<u64>,
    /// List and print what would be deleted; delete nothing.
    #[arg(long)]
    dry_run: bool,
    /// S3 endpoint URL, as for `mount s3://...`; default
    /// AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's endpoint_url,
    /// else AWS.
    #[arg(long)]
    s3_endpoint: Option<String>,
    /// S3 region, as for `mount s3://...`; default AWS_REGION,
    /// AWS_DEFAULT_REGION, the profile's region, else us-east-1.
    #[arg(long)]
    s3_region: Option<String>,
    /// Virtual-host addressing (BUCKET.endpoint) instead of path style.
    #[arg(long)]
    s3_virtual_host: bool,
    /// Seconds one S3 request may take (a page of the listing, a batch of
    /// deletes) [default: 5].
    #[arg(long)]
    s3_timeout: Option<f64>,
    /// Tries of one request beyond the first (the check of the bucket, a
    /// key deleted alone) [default: 4].
    #[arg(long)]
    s3_retries: Option<u32>,
}

/// Runs `l2arc shared-cache ...`.
pub(crate) fn run(args: SharedCacheArgs) -> Result<()> {
    match args.command {
        SharedCacheCommand::Gc(gc) => run_gc(&gc),
    }
}

/// A size as the cache's flags take it (4TiB, 500GiB, 1000000), or 0:
/// delete every block.
fn parse_max_size(s: &str) -> Result<u64, String> {
    let number = s.trim().trim_end_matches(|c: char| c.is_ascii_alphabetic());
    if !number.is_empty() && number.bytes().all(|b| b == b'0') {
        return Ok(0);
    }
    let size_bytes = crate::service::parse_size(s)?;
    debug_assert!(size_bytes > 0);
    Ok(size_bytes)
}

/// "7d", "12h", "30m", "45s", "2w" or plain seconds, in seconds (> 0).
pub(crate) fn parse_duration_secs(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let unit_secs: u64 = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => {
            return Err(format!(
                "`{s}` is not a duration: expected a number and s, m, h, d or w (7d, 12h, 30m)"
            ));
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{s}` is not a duration: expected 7d, 12h, 30m, 45s"))?;
    let secs = n
        .checked_mul(unit_secs)
        .ok_or_else(|| format!("`{s}`: too long"))?;
    if secs == 0 {
        return Err(format!("`{s}`: a maximum age must be positive"));
    }
    debug_assert!(secs >= unit_secs);
    Ok(secs)
}

/// One block of the cache, as the listing gave it (compact: a run holds
/// up to `BLOCKS_LISTED_MAX` of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Block {
    /// Last-modified, ms since the epoch; first, so blocks sort oldest
    /// first (then by key, for a stable order).
    mtime_ms: i64,
    hash: [u8; 32],
    index: u64,
    size_bytes: u64,
}

impl Block {
    /// The key under the prefix: `<64 lowercase hex>/<index>`.
    fn key(&self) -> String {
        use std::fmt::Write;
        let mut key = String::with_capacity(64 + 1 + 20);
        for b in self.hash {
            write!(key, "{b:02x}").expect("write to a String");
        }
        write!(key, "/{}", self.index).expect("write to a String");
        debug_assert_eq!(parse_block_key(&key), Some((self.hash, self.index)));
        key
    }
}

/// The (hash, index) of a key under the prefix of exactly the tier's form,
/// `<64 lowercase hex>/<decimal index>` (no sign, no leading zero, fits
/// u64); None for anything else.
fn parse_block_key(rel: &str) -> Option<([u8; 32], u64)> {
    let (hex, index) = rel.split_once('/')?;
    if hex.len() != 64 || index.is_empty() || index.len() > 20 {
        return None;
    }
    if !index.bytes().all(|b| b.is_ascii_digit()) || (index.len() > 1 && index.starts_with('0')) {
        return None;
    }
    let index: u64 = index.parse().ok()?;
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut hash = [0u8; 32];
    for (i, pair) in hex.as_bytes().chunks_exact(2).enumerate() {
        hash[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some((hash, index))
}

/// What to delete: `blocks` sorted oldest first; every block older than
/// `cutoff_ms` (by age), then the oldest of the rest while the total is
/// over `max_size_bytes` (by size). Returns (by age, by size): the victims
/// are `blocks[..by_age + by_size]`.
fn plan(blocks: &[Block], cutoff_ms: Option<i64>, max_size_bytes: u64) -> (usize, usize) {
    debug_assert!(blocks.is_sorted());
    let mut total_bytes: u64 = blocks.iter().map(|b| b.size_bytes).sum();
    let (mut by_age, mut by_size) = (0usize, 0usize);
    for block in blocks {
        if cutoff_ms.is_some_and(|cutoff| block.mtime_ms < cutoff) {
            by_age += 1;
        } else if total_bytes > max_size_bytes {
            by_size += 1;
        } else {
            break;
        }
        total_bytes -= block.size_bytes;
    }
    assert!(by_age + by_size <= blocks.len());
    (by_age, by_size)
}

/// What one run found and did.
#[derive(Debug, Default)]
struct Outcome {
    blocks: u64,
    bytes: u64,
    others: u64,
    by_age: u64,
    by_size: u64,
    deleted: u64,
    deleted_bytes: u64,
    failed: u64,
    failures: Vec<String>,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

impl Outcome {
    /// The summary line (see docs/operations.md).
    fn summary(&self, name: &str, dry_run: bool, victim_bytes: u64) -> String {
        debug_assert!(self.deleted <= self.blocks && self.deleted_bytes <= self.bytes);
        let head = format!(
            "shared-cache gc {name}{}: {} blocks, {:.1} MiB before",
            if dry_run { " (dry run)" } else { "" },
            self.blocks,
            mib(self.bytes)
        );
        let reasons = format!("({} by age, {} by size)", self.by_age, self.by_size);
        let others = format!("{} other objects left alone", self.others);
        if dry_run {
            let victims = self.by_age + self.by_size;
            return format!(
                "{head}; would delete {victims} blocks, {:.1} MiB {reasons}; {} blocks, {:.1} MiB after; {others}; nothing was deleted",
                mib(victim_bytes),
                self.blocks - victims,
                mib(self.bytes - victim_bytes),
            );
        }
        let mut line = format!(
            "{head}; deleted {} blocks, {:.1} MiB {reasons}; {} blocks, {:.1} MiB now; {others}",
            self.deleted,
            mib(self.deleted_bytes),
            self.blocks - self.deleted,
            mib(self.bytes - self.deleted_bytes),
        );
        if self.failed > 0 {
            line.push_str(&format!("; {} deletes failed", self.failed));
        }
        line
    }
}

/// The store's configuration, built as `mount s3://...` builds it (the
/// same endpoint, region and credential lookup), checked at once with the
/// mount's own check so that a wrong endpoint, bucket or key says so in
/// one line.
fn connect(args: &GcArgs) -> Result<ObjectStoreConfig> {
    let options = S3Options {
        s3_endpoint: args.s3_endpoint.clone(),
        s3_region: args.s3_region.clone(),
        s3_virtual_host: args.s3_virtual_host,
        s3_timeout: args.s3_timeout,
        s3_retries: args.s3_retries,
        ..S3Options::default()
    };
    let config = options.store_config(&args.uri, false, &S3FileOptions::default())?;
    assert!(config.request_timeout_ms > 0);
    let store = ObjectStorePrimary::new(config.clone()).map_err(|e| anyhow::anyhow!("{e}"))?;
    store.check().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(config)
}

fn run_gc(args: &GcArgs) -> Result<()> {
    let config = connect(args)?;
    let name = config.display_name.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the S3 client")?;
    let op = {
        let _guard = runtime.enter();
        opendal::Operator::via_iter(&config.scheme, config.options.clone())
            .with_context(|| format!("{name}: S3 client"))?
    };
    let timeout = Duration::from_millis(config.request_timeout_ms);
    // The clock is read before the listing: a block written while it runs
    // is younger than the age bound (module comment).
    let now_ms = ms_since_epoch(SystemTime::now());
    let (mut blocks, others) = runtime
        .block_on(list_blocks(&op, timeout, now_ms))
        .map_err(|e| anyhow::anyhow!("list {name}: {e}; nothing was deleted"))?;
    blocks.sort_unstable();
    let cutoff_ms = args.max_age.map(|secs| {
        now_ms.saturating_sub(i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX))
    });
    let (by_age, by_size) = plan(&blocks, cutoff_ms, args.max_size);
    let victims = &blocks[..by_age + by_size];
    let victim_bytes: u64 = victims.iter().map(|b| b.size_bytes).sum();
    let mut outcome = Outcome {
        blocks: blocks.len() as u64,
        bytes: blocks.iter().map(|b| b.size_bytes).sum(),
        others,
        by_age: by_age as u64,
        by_size: by_size as u64,
        ..Outcome::default()
    };
    if !args.dry_run {
        let batch_max = op
            .info()
            .capability()
            .delete_max_size
            .unwrap_or(1)
            .clamp(1, DELETE_BATCH_MAX);
        let tries = config.retries_max + 1;
        for batch in victims.chunks(batch_max) {
            runtime.block_on(delete_batch(&op, batch, timeout, tries, &mut outcome));
        }
        assert_eq!(outcome.deleted + outcome.failed, victims.len() as u64);
    }
    println!("{}", outcome.summary(&name, args.dry_run, victim_bytes));
    if outcome.failed > 0 {
        bail!(
            "{name}: {} of {} deletes failed (first: {})",
            outcome.failed,
            victims.len(),
            outcome.failures.join("; ")
        );
    }
    Ok(())
}

fn ms_since_epoch(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

/// Every block under the prefix (and how many other objects), each page
/// within `timeout`. A block without a last-modified time is taken as
/// written `now_ms` (the youngest: deleted last).
async fn list_blocks(
    op: &opendal::Operator,
    timeout: Duration,
    now_ms: i64,
) -> Result<(Vec<Block>, u64)> {
    use futures_core::Stream;
    use std::future::IntoFuture;
    let lister = tokio::time::timeout(timeout, op.lister_with("/").recursive(true).into_future())
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {timeout:?}"))??;
    let mut lister = std::pin::pin!(lister);
    let (mut blocks, mut others) = (Vec::new(), 0u64);
    loop {
        let next = std::future::poll_fn(|cx| lister.as_mut().poll_next(cx));
        let entry = match tokio::time::timeout(timeout, next).await {
            Err(_) => bail!("no answer within {timeout:?}"),
            Ok(None) => break,
            Ok(Some(entry)) => entry?,
        };
        let rel = entry.path().trim_start_matches('/');
        if rel.is_empty() {
            continue; // The prefix itself.
        }
        let meta = entry.metadata();
        let Some((hash, index)) = parse_block_key(rel).filter(|_| !meta.is_dir()) else {
            others += 1;
            continue;
        };
        if blocks.len() == BLOCKS_LISTED_MAX {
            bail!(
                "more than {BLOCKS_LISTED_MAX} blocks: split the cache over several prefixes, or bound it with a lifecycle rule (docs/operations.md)"
            );
        }
        blocks.push(Block {
            mtime_ms: meta
                .last_modified()
                .map_or(now_ms, |t| ms_since_epoch(SystemTime::from(t))),
            hash,
            index,
            size_bytes: meta.content_length(),
        });
    }
    debug_assert!(blocks.len() <= BLOCKS_LISTED_MAX);
    Ok((blocks, others))
}

/// Deletes `batch` in one request; if that fails, key by key (at most
/// `DELETE_SINGLE_INFLIGHT_MAX` at a time, each up to `tries` times), so
/// that a key the store refuses is counted and the others still go.
async fn delete_batch(
    op: &opendal::Operator,
    batch: &[Block],
    timeout: Duration,
    tries: u32,
    outcome: &mut Outcome,
) {
    assert!(!batch.is_empty() && batch.len() <= DELETE_BATCH_MAX);
    let keys: Vec<String> = batch.iter().map(Block::key).collect();
    let whole = async {
        let mut deleter = op.deleter().await?;
        for key in &keys {
            deleter.delete(key.as_str()).await?;
        }
        deleter.close().await
    };
    if let Ok(Ok(())) = tokio::time::timeout(timeout, whole).await {
        outcome.deleted += batch.len() as u64;
        outcome.deleted_bytes += batch.iter().map(|b| b.size_bytes).sum::<u64>();
        return;
    }
    // Deleting a key that is already gone succeeds in S3, so the keys the
    // failed batch did delete are deleted again harmlessly.
    let mut in_flight = tokio::task::JoinSet::new();
    let mut pending = batch.iter().zip(keys);
    loop {
        while in_flight.len() < DELETE_SINGLE_INFLIGHT_MAX {
            let Some((block, key)) = pending.next() else {
                break;
            };
            let (op, size_bytes) = (op.clone(), block.size_bytes);
            in_flight.spawn(async move {
                let result = delete_one(&op, &key, timeout, tries).await;
                (key, size_bytes, result)
            });
        }
        let Some(joined) = in_flight.join_next().await else {
            break;
        };
        let (key, size_bytes, result) = joined.expect("a delete task does not panic");
        match result {
            Ok(()) => {
                outcome.deleted += 1;
                outcome.deleted_bytes += size_bytes;
            }
            Err(e) => {
                outcome.failed += 1;
                if outcome.failures.len() < FAILURES_REPORTED_MAX {
                    outcome.failures.push(format!("{key}: {e}"));
                }
            }
        }
    }
    debug_assert!(in_flight.is_empty());
}

/// One DELETE, tried up to `tries` times with capped exponential backoff.
async fn delete_one(
    op: &opendal::Operator,
    key: &str,
    timeout: Duration,
    tries: u32,
) -> Result<(), String> {
    assert!(tries >= 1);
    let mut last = String::new();
    for attempt in 0..tries {
        if attempt > 0 {
            let backoff_ms = (100u64 << attempt.min(10)).min(BACKOFF_MAX_MS);
            tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
        }
        match tokio::time::timeout(timeout, op.delete(key)).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => {
                last = e.to_string();
                if !e.is_temporary() {
                    break;
                }
            }
            Err(_) => last = format!("no answer within {timeout:?}"),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    fn block(mtime_ms: i64, size_bytes: u64, index: u64) -> Block {
        Block {
            mtime_ms,
            hash: [7; 32],
            index,
            size_bytes,
        }
    }

    #[test]
    fn only_keys_of_the_tiers_form_are_blocks() {
        let (hash, index) = parse_block_key(&format!("{HEX}/42")).expect("a block key");
        assert_eq!((hash[1], hash[31], index), (0x11, 0xff, 42));
        assert_eq!(parse_block_key(&format!("{HEX}/0")).map(|k| k.1), Some(0));
        let b = block(0, 1, 18_446_744_073_709_551_615);
        assert_eq!(parse_block_key(&b.key()), Some((b.hash, b.index)));
        for other in [
            format!("{HEX}/"),
            format!("{HEX}/01"),
            format!("{HEX}/-1"),
            format!("{HEX}/1x"),
            format!("{HEX}/18446744073709551616"),
            format!("{HEX}/1/2"),
            format!("{HEX}0/1"),
            format!("{}/1", HEX.to_uppercase()),
            format!("{}/1", &HEX[1..]),
            format!("{}g/1", &HEX[1..]),
            "readme.txt".to_string(),
            format!("x/{HEX}/1"),
        ] {
            assert_eq!(parse_block_key(&other), None, "{other}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_max_size("0"), Ok(0));
        assert_eq!(parse_max_size("0GiB"), Ok(0));
        assert_eq!(parse_max_size("2TiB"), Ok(2 << 40));
        assert_eq!(parse_max_size("4096"), Ok(4096));
        assert!(parse_max_size("lots").is_err());
        assert!(parse_max_size("").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_secs("7d"), Ok(7 * 86_400));
        assert_eq!(parse_duration_secs("12h"), Ok(12 * 3_600));
        assert_eq!(parse_duration_secs("30m"), Ok(1_800));
        assert_eq!(parse_duration_secs("45"), Ok(45));
        assert_eq!(parse_duration_secs("2w"), Ok(14 * 86_400));
        for bad in ["", "d", "7x", "0d", "-1h", "1.5h", "99999999999999999999d"] {
            assert!(parse_duration_secs(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn plan_deletes_by_age_then_oldest_first_to_the_size() {
        let blocks: Vec<Block> = (0..10).map(|i| block(i * 1000, 100, i as u64)).collect();
        // 1000 bytes: under 1000 nothing, under 550 the five oldest.
        assert_eq!(plan(&blocks, None, 1000), (0, 0));
        assert_eq!(plan(&blocks, None, 550), (0, 5));
        assert_eq!(plan(&blocks, None, 0), (0, 10));
        // Older than 3000 ms: three by age; then two more for the size.
        assert_eq!(plan(&blocks, Some(3000), 550), (3, 2));
        assert_eq!(plan(&blocks, Some(3000), 10_000), (3, 0));
        assert_eq!(plan(&blocks, Some(i64::MAX), 10_000), (10, 0));
        assert_eq!(plan(&[], Some(0), 0), (0, 0));
    }

    #[test]
    fn the_summary_says_what_was_done() {
        let outcome = Outcome {
            blocks: 40,
            bytes: 40 << 20,
            others: 3,
            by_age: 4,
            by_size: 6,
            deleted: 10,
            deleted_bytes: 10 << 20,
            ..Outcome::default()
        };
        assert_eq!(
            outcome.summary("s3://b/p", false, 10 << 20),
            "shared-cache gc s3://b/p: 40 blocks, 40.0 MiB before; deleted 10 blocks, 10.0 MiB (4 by age, 6 by size); 30 blocks, 30.0 MiB now; 3 other objects left alone"
        );
        let dry = Outcome {
            deleted: 0,
            deleted_bytes: 0,
            ..outcome
        };
        assert_eq!(
            dry.summary("s3://b/p", true, 10 << 20),
            "shared-cache gc s3://b/p (dry run): 40 blocks, 40.0 MiB before; would delete 10 blocks, 10.0 MiB (4 by age, 6 by size); 30 blocks, 30.0 MiB after; 3 other objects left alone; nothing was deleted"
        );
    }
}
