//! Analytics history (`--history PATH`): the service's counters and latency
//! heat maps, per second for the last hour and per minute for seven days,
//! in one file of fixed size beside the cache.
//!
//! Why a fixed-size file of slots. A cache runs for months; its history must
//! neither grow nor need a database. The file holds two rings of slots, one
//! indexed by the second (3,600 slots), one by the minute (10,080 slots): a
//! sample goes to the slot its own time names, overwriting whatever that
//! slot held one lap ago. So the file's size is fixed when it is made
//! (about 16 MiB, the same after a day as after a year) and no index or
//! write position needs to be kept: a reader takes every valid slot in the
//! window it wants and sorts by time.
//!
//! Why cumulative counters. Each slot holds the counters as they were at
//! its time, not rates, so any two slots give the rate between them at any
//! resolution, and a missed second loses nothing. A service restart starts
//! its counters at zero again: each slot carries the start time of the run
//! that wrote it (`boot_ms`), and rates are only taken between slots of one
//! run. The latency histograms are kept the same way, folded to one row per
//! power of two, so the heat maps of a past day can be drawn again.
//!
//! Why it survives crashes without fsync. Each slot is written whole with
//! one `pwrite` and carries a CRC-32C: a slot torn by a crash, or never
//! written, fails its check and is skipped. The history is a view, not
//! data: losing the last seconds before a crash costs nothing else.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use l2arc::Cache;
use l2arc::latency::bucket_low_ns;
use serde_json::{Value, json};

/// Slots of the per-second ring: one hour.
pub(crate) const SECONDS_KEPT: u64 = 3600;
/// Slots of the per-minute ring: seven days.
pub(crate) const MINUTES_KEPT: u64 = 7 * 24 * 60;
/// The longest window one request may ask for.
pub(crate) const WINDOW_SECS_MAX: u64 = MINUTES_KEPT * 60;

/// The counters kept, by arcstats name (absent ones are kept as 0).
pub(crate) const FIELDS: [&str; 24] = [
    "reads",
    "read_bytes",
    "hits",
    "misses",
    "iohits",
    "primary_reads",
    "primary_read_bytes",
    "size",
    "c",
    "p",
    "mru_size",
    "mfu_size",
    "mru_ghost_size",
    "mfu_ghost_size",
    "l2_hits",
    "l2_misses",
    "l2_read_bytes",
    "l2_write_bytes",
    "l2_size",
    "l2_asize",
    "l2_hdr_size",
    "l2_dwpd_limit",
    "l2_rebuild_bufs",
    "evict_l2_skip",
];
/// The latency tiers kept, as the analytics name them.
pub(crate) const TIERS: [&str; 4] = ["frontend", "arc_hit", "l2_hit", "primary"];
/// Heat-map rows: one per power of two from 2^HEAT_LOW_LOG2 ns.
pub(crate) const HEAT_LOW_LOG2: u32 = 5;
pub(crate) const HEAT_ROWS: usize = 30;

const HEADER_BYTES: u64 = 4096;
const HEADER_MAGIC: &[u8; 16] = b"l2arc-history\n\0\x01";
const SLOT_MAGIC: u32 = 0x4c32_4853; // "L2HS"
/// magic, crc, time_ms, boot_ms, then the counters and the heat rows.
const SLOT_HEAD_BYTES: usize = 4 + 4 + 8 + 8;
const SLOT_BYTES: usize = SLOT_HEAD_BYTES + 8 * FIELDS.len() + 8 * TIERS.len() * HEAT_ROWS;
/// Size of the whole file.
pub(crate) const FILE_BYTES: u64 = HEADER_BYTES + (SECONDS_KEPT + MINUTES_KEPT) * SLOT_BYTES as u64;

/// One sample: the counters and folded histograms at `time_ms`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sample {
    pub(crate) time_ms: u64,
    /// Start of the run that wrote it: rates only within one run.
    pub(crate) boot_ms: u64,
    pub(crate) values: [u64; FIELDS.len()],
    pub(crate) heat: [[u64; HEAT_ROWS]; TIERS.len()],
}

impl Sample {
    /// The cache's counters now.
    pub(crate) fn take(cache: &Cache, time_ms: u64, boot_ms: u64) -> Self {
        let kstats = cache.stats().kstats();
        let mut values = [0u64; FIELDS.len()];
        for (v, name) in values.iter_mut().zip(FIELDS) {
            *v = kstats
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(0, |(_, x)| *x);
        }
        let mut heat = [[0u64; HEAT_ROWS]; TIERS.len()];
        for (tier, h) in cache.analytics().histograms() {
            let Some(t) = TIERS.iter().position(|&n| n == tier) else {
                continue;
            };
            for (bucket, &count) in h.counts.iter().enumerate() {
                heat[t][heat_row(bucket_low_ns(bucket))] += count;
            }
        }
        Self {
            time_ms,
            boot_ms,
            values,
            heat,
        }
    }

    fn encode(&self, out: &mut [u8; SLOT_BYTES]) {
        out[0..4].copy_from_slice(&SLOT_MAGIC.to_le_bytes());
        out[8..16].copy_from_slice(&self.time_ms.to_le_bytes());
        out[16..24].copy_from_slice(&self.boot_ms.to_le_bytes());
        let words = self.values.iter().chain(self.heat.iter().flatten());
        for (chunk, w) in out[SLOT_HEAD_BYTES..].chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out[8..]);
        out[4..8].copy_from_slice(&crc.to_le_bytes());
        debug_assert_eq!(Self::decode(out).as_ref(), Some(self));
    }

    /// `None` for a slot never written or torn.
    fn decode(b: &[u8; SLOT_BYTES]) -> Option<Self> {
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        if b[0..4] != SLOT_MAGIC.to_le_bytes() || b[4..8] != crc32c::crc32c(&b[8..]).to_le_bytes() {
            return None;
        }
        let mut values = [0u64; FIELDS.len()];
        for (i, v) in values.iter_mut().enumerate() {
            *v = word(SLOT_HEAD_BYTES + 8 * i);
        }
        let mut heat = [[0u64; HEAT_ROWS]; TIERS.len()];
        let heat_at = SLOT_HEAD_BYTES + 8 * FIELDS.len();
        for (t, rows) in heat.iter_mut().enumerate() {
            for (r, v) in rows.iter_mut().enumerate() {
                *v = word(heat_at + 8 * (t * HEAT_ROWS + r));
            }
        }
        Some(Self {
            time_ms: word(8),
            boot_ms: word(16),
            values,
            heat,
        })
    }

    fn to_json(&self) -> Value {
        json!([
            self.time_ms,
            self.boot_ms,
            self.values.to_vec(),
            self.heat.to_vec()
        ])
    }
}

/// The heat-map row of a latency.
fn heat_row(latency_ns: u64) -> usize {
    let log2 = 63 - latency_ns.max(1).leading_zeros();
    (log2.saturating_sub(HEAT_LOW_LOG2) as usize).min(HEAT_ROWS - 1)
}

/// Which ring a sample or a window uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ring {
    Seconds,
    Minutes,
}

impl Ring {
    fn period_ms(self) -> u64 {
        match self {
            Ring::Seconds => 1000,
            Ring::Minutes => 60_000,
        }
    }

    fn slots(self) -> u64 {
        match self {
            Ring::Seconds => SECONDS_KEPT,
            Ring::Minutes => MINUTES_KEPT,
        }
    }

    fn first_slot_offset(self) -> u64 {
        match self {
            Ring::Seconds => HEADER_BYTES,
            Ring::Minutes => HEADER_BYTES + SECONDS_KEPT * SLOT_BYTES as u64,
        }
    }

    fn offset_of(self, time_ms: u64) -> u64 {
        let slot = (time_ms / self.period_ms()) % self.slots();
        self.first_slot_offset() + slot * SLOT_BYTES as u64
    }
}

/// The history file of one service.
pub(crate) struct History {
    file: File,
    path: PathBuf,
}

impl History {
    /// Opens `path`, or makes it (its full size, sparse) if it does not
    /// exist. A file that is not a history of this layout is refused, never
    /// overwritten.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .with_context(|| format!("--history {}", path.display()))?;
        let len = file.metadata()?.len();
        let mut header = [0u8; 32];
        if len == 0 {
            file.set_len(FILE_BYTES)?;
            header[..16].copy_from_slice(HEADER_MAGIC);
            header[16..24].copy_from_slice(&(SLOT_BYTES as u64).to_le_bytes());
            header[24..32].copy_from_slice(&FILE_BYTES.to_le_bytes());
            file.write_all_at(&header, 0)?;
        } else {
            let read = file.read_at(&mut header, 0)?;
            let ours = read == header.len()
                && &header[..16] == HEADER_MAGIC
                && header[16..24] == (SLOT_BYTES as u64).to_le_bytes()
                && header[24..32] == FILE_BYTES.to_le_bytes()
                && len == FILE_BYTES;
            if !ours {
                bail!(
                    "--history {}: the file exists and is not an l2arc history of this version ({len} bytes); give another path, or remove it",
                    path.display()
                );
            }
        }
        Ok(Self {
            file,
            path: path.to_path_buf(),
        })
    }

    /// Writes a sample to its second's slot, and to its minute's slot when
    /// `minute` is set.
    pub(crate) fn record(&self, sample: &Sample, minute: bool) -> std::io::Result<()> {
        let mut slot = [0u8; SLOT_BYTES];
        sample.encode(&mut slot);
        self.file
            .write_all_at(&slot, Ring::Seconds.offset_of(sample.time_ms))?;
        if minute {
            self.file
                .write_all_at(&slot, Ring::Minutes.offset_of(sample.time_ms))?;
        }
        Ok(())
    }

    /// Every valid sample in `[end_ms - window_secs, end_ms]`, oldest
    /// first, from the per-second ring if the window fits in it, else from
    /// the per-minute ring. Returns the resolution in seconds too.
    pub(crate) fn window(&self, end_ms: u64, window_secs: u64) -> Result<(u64, Vec<Sample>)> {
        let window_secs = window_secs.clamp(1, WINDOW_SECS_MAX);
        let now_ms = now_ms();
        let from_ms = end_ms.saturating_sub(window_secs * 1000);
        // The per-second ring when the window lies within its hour (a
        // second of slack: `end_ms` was taken just before `now_ms`).
        let ring = if from_ms + SECONDS_KEPT * 1000 + 1000 >= now_ms {
            Ring::Seconds
        } else {
            Ring::Minutes
        };
        let mut bytes = vec![0u8; ring.slots() as usize * SLOT_BYTES];
        self.file
            .read_exact_at(&mut bytes, ring.first_slot_offset())
            .with_context(|| format!("--history {}", self.path.display()))?;
        let mut samples: Vec<Sample> = bytes
            .chunks_exact(SLOT_BYTES)
            .filter_map(|b| Sample::decode(b.try_into().expect("a slot")))
            .filter(|s| (from_ms..=end_ms).contains(&s.time_ms))
            .collect();
        samples.sort_by_key(|s| s.time_ms);
        Ok((ring.period_ms() / 1000, samples))
    }

    /// `/api/history` for a window: fields, tiers and compact samples.
    pub(crate) fn window_json(&self, end_ms: u64, window_secs: u64) -> Result<Value> {
        let (resolution_secs, samples) = self.window(end_ms, window_secs)?;
        Ok(json!({
            "resolution_secs": resolution_secs,
            "window_secs": window_secs,
            "end_ms": end_ms,
            "fields": FIELDS,
            "tiers": TIERS,
            "heat_low_log2": HEAT_LOW_LOG2,
            "heat_rows": HEAT_ROWS,
            "samples": samples.iter().map(Sample::to_json).collect::<Vec<_>>(),
        }))
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Takes a sample every second until dropped.
pub(crate) struct Recorder {
    stopping: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Recorder {
    /// Starts recording `cache` into `history`.
    pub(crate) fn start(cache: Arc<Cache>, history: Arc<History>) -> Result<Self> {
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&stopping);
        let thread = std::thread::Builder::new()
            .name("l2arc-history".into())
            .spawn(move || record_loop(&cache, &history, &stop))?;
        Ok(Self {
            stopping,
            thread: Some(thread),
        })
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn record_loop(cache: &Cache, history: &History, stopping: &AtomicBool) {
    let boot_ms = now_ms();
    let mut last_minute = u64::MAX;
    let mut warned = false;
    while !stopping.load(Ordering::SeqCst) {
        // Sleep to the next whole second, in steps that notice a stop.
        let wait_ms = 1000 - now_ms() % 1000;
        std::thread::sleep(Duration::from_millis(wait_ms.min(200)));
        if wait_ms > 200 {
            continue;
        }
        let time_ms = now_ms();
        let minute = time_ms / 60_000;
        let sample = Sample::take(cache, time_ms, boot_ms);
        let result = history.record(&sample, minute != last_minute);
        last_minute = minute;
        if let Err(e) = result
            && !warned
        {
            // A full disk must not stop the service: say it once.
            eprintln!(
                "l2arc: --history {}: {e}; history not recorded",
                history.path.display()
            );
            warned = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(time_ms: u64, seed: u64) -> Sample {
        let mut s = Sample {
            time_ms,
            boot_ms: 7,
            values: [0; FIELDS.len()],
            heat: [[0; HEAT_ROWS]; TIERS.len()],
        };
        for (i, v) in s.values.iter_mut().enumerate() {
            *v = seed * 100 + i as u64;
        }
        s.heat[2][9] = seed;
        s
    }

    #[test]
    fn samples_round_trip_and_torn_slots_are_skipped() {
        let s = sample(123_456, 3);
        let mut b = [0u8; SLOT_BYTES];
        s.encode(&mut b);
        assert_eq!(Sample::decode(&b), Some(s));
        b[SLOT_BYTES - 1] ^= 1;
        assert_eq!(Sample::decode(&b), None);
        assert_eq!(Sample::decode(&[0u8; SLOT_BYTES]), None);
    }

    #[test]
    fn rings_keep_an_hour_of_seconds_and_a_week_of_minutes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h");
        let h = History::open(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), FILE_BYTES);
        let now = now_ms() / 1000 * 1000;
        for i in 0..10u64 {
            h.record(&sample(now - i * 1000, i), i == 0).unwrap();
        }
        let (res, got) = h.window(now, 5).unwrap();
        assert_eq!(res, 1);
        assert_eq!(
            got.iter().map(|s| s.time_ms).collect::<Vec<_>>(),
            (0..=5).rev().map(|i| now - i * 1000).collect::<Vec<_>>()
        );
        // The last hour, asked for now, is the per-second ring.
        assert_eq!(h.window(now_ms(), SECONDS_KEPT).unwrap().0, 1);
        // An old window comes from the minute ring: one sample there.
        let (res, got) = h.window(now, 2 * 3600).unwrap();
        assert_eq!(res, 60);
        assert_eq!(got, vec![sample(now, 0)]);
        // A second lap overwrites the slot of the same second.
        h.record(&sample(now + SECONDS_KEPT * 1000, 42), false)
            .unwrap();
        let (_, got) = h.window(now + SECONDS_KEPT * 1000, 1).unwrap();
        assert_eq!(got, vec![sample(now + SECONDS_KEPT * 1000, 42)]);
        // Reopening keeps it; a foreign file is refused and kept.
        drop(h);
        assert!(History::open(&path).is_ok());
        let foreign = dir.path().join("notes.txt");
        std::fs::write(&foreign, b"my notes").unwrap();
        let e = History::open(&foreign).err().unwrap().to_string();
        assert!(e.contains("not an l2arc history"), "{e}");
        assert_eq!(std::fs::read(&foreign).unwrap(), b"my notes");
    }

    #[test]
    fn heat_rows_are_powers_of_two() {
        assert_eq!(heat_row(0), 0);
        assert_eq!(heat_row(1 << HEAT_LOW_LOG2), 0);
        assert_eq!(heat_row(1 << (HEAT_LOW_LOG2 + 1)), 1);
        assert_eq!(heat_row(300_000), 18 - HEAT_LOW_LOG2 as usize);
        assert_eq!(heat_row(u64::MAX), HEAT_ROWS - 1);
    }
}
