//! Analytics history (`--history PATH`): the service's counters and latency
//! heat maps, per second for the last hour and per minute for seven days,
//! in one file of fixed size beside the cache.
//!
//! Why a fixed-size file of slots. A cache runs for months; its history must
//! neither grow nor need a database. The file holds two rings of slots, one
//! indexed by the second (3,600 slots), one by the minute (10,080 slots): a
//! sample goes to the slot its own time names, overwriting whatever that
//! slot held one lap ago. So the file's size is fixed when it is made
//! (about 64 MiB, the same after a day as after a year) and no index or
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
//! Why the breakdowns are bounded. Every rate chart of the page can be
//! broken down by dataset and by object (file, image), over any window.
//! A slot keeps the cumulative counters of at most `DATASETS_KEPT`
//! datasets (a service has few; past the bound they add up in the last
//! entry, named "(other)") and the work of the `OBJECTS_KEPT` objects that
//! did the most reads during the slot's period (a second, or a minute in
//! the minute ring), as counts over that period, not cumulative: the set
//! of busy objects changes from one slot to the next, and a delta makes
//! each slot stand alone, so the top objects of a window are the sums of
//! its slots. The bound is what the breakdown can miss: an object that is
//! never among the 8 busiest of a period is in "other" even if it adds up
//! to much over an hour. Eight because the page draws at most that many
//! series before "other" and a slot stays under 5 KiB. The L2ARC hit
//! latency is kept per cache-device slot too (`DEVICES_KEPT`, the
//! engine's `DEVICE_HISTOGRAMS_MAX`), for the per-device heat maps.
//!
//! Why a version. The layout of a slot is fixed by the version in the
//! header's magic; a file of another version (or anything else) is refused
//! at start with one line and left as it is: the history is a view that a
//! new file starts again, and a refusal never destroys an operator's file.
//! Read under another layout, an older file's words would land in the
//! wrong counters and tiers (a new field or tier shifts every word after
//! it), so it is never read, not even in part.
//!
//! Why it survives crashes without fsync. Each slot is written whole with
//! one `pwrite` and carries a CRC-32C: a slot torn by a crash, or never
//! written, fails its check and is skipped. The history is a view, not
//! data: losing the last seconds before a crash costs nothing else.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use l2arc::Cache;
use l2arc::analytics::{DEVICE_HISTOGRAMS_MAX, TOP_OBJECTS_MAX};
use l2arc::latency::bucket_low_ns;
use serde_json::{Value, json};

/// Slots of the per-second ring: one hour.
pub(crate) const SECONDS_KEPT: u64 = 3600;
/// Slots of the per-minute ring: seven days.
pub(crate) const MINUTES_KEPT: u64 = 7 * 24 * 60;
/// The longest window one request may ask for.
pub(crate) const WINDOW_SECS_MAX: u64 = MINUTES_KEPT * 60;

/// The counters kept, by arcstats name (absent ones are kept as 0: the
/// shared tier's without `--shared-cache`).
pub(crate) const FIELDS: [&str; 43] = [
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
    "evict_l2_cached",
    "evict_l2_eligible",
    "evict_l2_eligible_mfu",
    "evict_l2_eligible_mru",
    "evict_l2_ineligible",
    "evict_l2_queued",
    "l2_cksum_bad",
    "l2_io_error",
    "l2_writes_error",
    "primary_errors",
    "shared_hits",
    "shared_misses",
    "shared_bad",
    "shared_writes",
    "shared_write_drops",
    "shared_errors",
    "shared_timeouts",
    "shared_read_bytes",
    "shared_write_bytes",
];
/// The latency tiers kept, as the analytics name them.
pub(crate) const TIERS: [&str; 5] = ["frontend", "arc_hit", "l2_hit", "shared_hit", "primary"];
/// Heat-map rows: one per power of two from 2^HEAT_LOW_LOG2 ns.
pub(crate) const HEAT_LOW_LOG2: u32 = 5;
pub(crate) const HEAT_ROWS: usize = 30;
/// The counts of a dataset or an object that the breakdowns chart.
pub(crate) const BREAKDOWN: [&str; 5] =
    ["reads", "misses", "l2_hits", "primary_reads", "bytes_below"];
/// Datasets per slot; the last entry sums those past it ("(other)").
pub(crate) const DATASETS_KEPT: usize = 8;
/// Objects per slot: the busiest of the slot's period.
pub(crate) const OBJECTS_KEPT: usize = 8;
/// Cache-device slots with a heat map of their own.
pub(crate) const DEVICES_KEPT: usize = DEVICE_HISTOGRAMS_MAX;
const DATASET_NAME_BYTES: usize = 24;
const OBJECT_NAME_BYTES: usize = 56;
/// Counts, then the name (NUL-padded).
const DATASET_BYTES: usize = 8 * BREAKDOWN.len() + DATASET_NAME_BYTES;
/// Object id, dataset index (u32), has-name flag, name length, 2 spare
/// bytes, counts, name.
const OBJECT_BYTES: usize = 16 + 8 * BREAKDOWN.len() + OBJECT_NAME_BYTES;

const HEADER_BYTES: u64 = 4096;
/// The magic's last byte is the layout's version: 3 since the shared
/// tier's counters and heat map (2: breakdowns, per-device heat maps).
const HEADER_MAGIC: &[u8; 16] = b"l2arc-history\n\0\x03";
const SLOT_MAGIC: u32 = 0x4c32_4853; // "L2HS"
/// magic, crc, time_ms, boot_ms, then the counters and the heat rows.
const SLOT_HEAD_BYTES: usize = 4 + 4 + 8 + 8;
const WORDS_AT: usize = SLOT_HEAD_BYTES;
const DATASETS_AT: usize = WORDS_AT + 8 * (FIELDS.len() + TIERS.len() * HEAT_ROWS);
const OBJECTS_AT: usize = DATASETS_AT + DATASETS_KEPT * DATASET_BYTES;
const DEVICE_HEAT_AT: usize = OBJECTS_AT + OBJECTS_KEPT * OBJECT_BYTES;
const SLOT_BYTES: usize = DEVICE_HEAT_AT + 8 * DEVICES_KEPT * HEAT_ROWS;
/// Slots read at once by `History::window`.
const READ_SLOTS_MAX: usize = 256;
/// Size of the whole file.
pub(crate) const FILE_BYTES: u64 = HEADER_BYTES + (SECONDS_KEPT + MINUTES_KEPT) * SLOT_BYTES as u64;

/// Counts of one dataset (cumulative) or one object (over the slot's
/// period), in `BREAKDOWN` order.
pub(crate) type Counts = [u64; BREAKDOWN.len()];

/// One dataset's entry of a slot; an empty name is an unused entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DatasetEntry {
    pub(crate) name: String,
    pub(crate) counts: Counts,
}

/// One object's entry of a slot; all-zero counts is an unused entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ObjectEntry {
    /// Index into the slot's datasets (the last one for "(other)").
    pub(crate) dataset: u32,
    pub(crate) object: u64,
    pub(crate) name: Option<String>,
    pub(crate) counts: Counts,
}

/// One sample: the counters and folded histograms at `time_ms`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sample {
    pub(crate) time_ms: u64,
    /// Start of the run that wrote it: rates only within one run.
    pub(crate) boot_ms: u64,
    pub(crate) values: [u64; FIELDS.len()],
    pub(crate) heat: [[u64; HEAT_ROWS]; TIERS.len()],
    pub(crate) datasets: [DatasetEntry; DATASETS_KEPT],
    pub(crate) objects: [ObjectEntry; OBJECTS_KEPT],
    pub(crate) device_heat: [[u64; HEAT_ROWS]; DEVICES_KEPT],
}

/// The tracked objects' cumulative counts, by (dataset, object): what a
/// period's counts are taken from.
pub(crate) type ObjectTotals = HashMap<(u32, u64), (Option<String>, Counts)>;

/// Folds a histogram's buckets into heat rows.
fn fold_heat(counts: &[u64], rows: &mut [u64; HEAT_ROWS]) {
    for (bucket, &count) in counts.iter().enumerate() {
        rows[heat_row(bucket_low_ns(bucket))] += count;
    }
}

/// Copies `name` into `out` (NUL-padded), cut at a character boundary;
/// returns the length kept.
fn put_name(name: &str, out: &mut [u8]) -> usize {
    let mut end = name.len().min(out.len());
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    out[..end].copy_from_slice(&name.as_bytes()[..end]);
    end
}

fn word(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn put_words<'a>(out: &mut [u8], words: impl IntoIterator<Item = &'a u64>) {
    for (chunk, w) in out.chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&w.to_le_bytes());
    }
}

fn counts_at(b: &[u8]) -> Counts {
    std::array::from_fn(|i| word(b, 8 * i))
}

impl Sample {
    /// The cache's counters now (no objects: see `with_objects`).
    pub(crate) fn take(cache: &Cache, time_ms: u64, boot_ms: u64) -> Self {
        let kstats = cache.stats().kstats();
        let mut values = [0u64; FIELDS.len()];
        for (v, name) in values.iter_mut().zip(FIELDS) {
            *v = kstats
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(0, |(_, x)| *x);
        }
        let analytics = cache.analytics();
        let mut heat = [[0u64; HEAT_ROWS]; TIERS.len()];
        for (tier, h) in analytics.histograms() {
            if let Some(t) = TIERS.iter().position(|&n| n == tier) {
                fold_heat(&h.counts, &mut heat[t]);
            }
        }
        let mut device_heat = [[0u64; HEAT_ROWS]; DEVICES_KEPT];
        for (slot, h) in analytics.device_histograms() {
            if let Some(rows) = device_heat.get_mut(usize::from(slot)) {
                fold_heat(&h.counts, rows);
            }
        }
        Self {
            time_ms,
            boot_ms,
            values,
            heat,
            datasets: dataset_entries(cache),
            objects: Default::default(),
            device_heat,
        }
    }

    /// This sample with the objects that did the most reads since `base`
    /// (an object not in `base` counts from zero; one whose counts went
    /// back left the table and came again: it counts from zero too).
    pub(crate) fn with_objects(&self, now: &ObjectTotals, base: &ObjectTotals) -> Self {
        let mut period: Vec<ObjectEntry> = now
            .iter()
            .map(|(&(dataset, object), (name, counts))| {
                let was = base.get(&(dataset, object)).map(|(_, c)| c);
                let went_back = was.is_some_and(|w| w.iter().zip(counts).any(|(a, b)| a > b));
                let counts: Counts = match was {
                    Some(w) if !went_back => std::array::from_fn(|i| counts[i] - w[i]),
                    _ => *counts,
                };
                ObjectEntry {
                    dataset: dataset.min(DATASETS_KEPT as u32 - 1),
                    object,
                    name: name.clone(),
                    counts,
                }
            })
            .filter(|o| o.counts.iter().any(|&c| c > 0))
            .collect();
        period.sort_by(|a, b| b.counts[0].cmp(&a.counts[0]).then(a.object.cmp(&b.object)));
        let mut sample = self.clone();
        for (slot, o) in sample.objects.iter_mut().zip(period) {
            *slot = o;
        }
        sample
    }

    fn encode(&self, out: &mut [u8; SLOT_BYTES]) {
        out[0..4].copy_from_slice(&SLOT_MAGIC.to_le_bytes());
        out[8..16].copy_from_slice(&self.time_ms.to_le_bytes());
        out[16..24].copy_from_slice(&self.boot_ms.to_le_bytes());
        let words = self.values.iter().chain(self.heat.iter().flatten());
        put_words(&mut out[WORDS_AT..DATASETS_AT], words);
        for (d, b) in self
            .datasets
            .iter()
            .zip(out[DATASETS_AT..OBJECTS_AT].chunks_exact_mut(DATASET_BYTES))
        {
            put_words(&mut b[..8 * BREAKDOWN.len()], &d.counts);
            put_name(&d.name, &mut b[8 * BREAKDOWN.len()..]);
        }
        for (o, b) in self
            .objects
            .iter()
            .zip(out[OBJECTS_AT..DEVICE_HEAT_AT].chunks_exact_mut(OBJECT_BYTES))
        {
            b[0..8].copy_from_slice(&o.object.to_le_bytes());
            b[8..12].copy_from_slice(&o.dataset.to_le_bytes());
            b[12] = u8::from(o.name.is_some());
            b[13] = put_name(
                o.name.as_deref().unwrap_or(""),
                &mut b[OBJECT_BYTES - OBJECT_NAME_BYTES..],
            ) as u8;
            put_words(&mut b[16..16 + 8 * BREAKDOWN.len()], &o.counts);
        }
        put_words(
            &mut out[DEVICE_HEAT_AT..],
            self.device_heat.iter().flatten(),
        );
        let crc = crc32c::crc32c(&out[8..]);
        out[4..8].copy_from_slice(&crc.to_le_bytes());
    }

    /// `None` for a slot never written or torn.
    fn decode(b: &[u8; SLOT_BYTES]) -> Option<Self> {
        if b[0..4] != SLOT_MAGIC.to_le_bytes() || b[4..8] != crc32c::crc32c(&b[8..]).to_le_bytes() {
            return None;
        }
        let values = std::array::from_fn(|i| word(b, WORDS_AT + 8 * i));
        let heat_at = WORDS_AT + 8 * FIELDS.len();
        let heat = std::array::from_fn(|t| {
            std::array::from_fn(|r| word(b, heat_at + 8 * (t * HEAT_ROWS + r)))
        });
        let datasets = std::array::from_fn(|i| {
            let d = &b[DATASETS_AT + i * DATASET_BYTES..][..DATASET_BYTES];
            let name = &d[8 * BREAKDOWN.len()..];
            let len = name.iter().position(|&c| c == 0).unwrap_or(name.len());
            DatasetEntry {
                name: String::from_utf8_lossy(&name[..len]).into_owned(),
                counts: counts_at(d),
            }
        });
        let objects = std::array::from_fn(|i| {
            let o = &b[OBJECTS_AT + i * OBJECT_BYTES..][..OBJECT_BYTES];
            let name =
                &o[OBJECT_BYTES - OBJECT_NAME_BYTES..][..usize::from(o[13]).min(OBJECT_NAME_BYTES)];
            ObjectEntry {
                object: word(o, 0),
                dataset: u32::from_le_bytes(o[8..12].try_into().expect("4 bytes")),
                name: (o[12] == 1).then(|| String::from_utf8_lossy(name).into_owned()),
                counts: counts_at(&o[16..]),
            }
        });
        let device_heat = std::array::from_fn(|d| {
            std::array::from_fn(|r| word(b, DEVICE_HEAT_AT + 8 * (d * HEAT_ROWS + r)))
        });
        Some(Self {
            time_ms: word(b, 8),
            boot_ms: word(b, 16),
            values,
            heat,
            datasets,
            objects,
            device_heat,
        })
    }

    /// `[time_ms, boot_ms, values, heat, datasets, objects, device_heat]`:
    /// datasets as `[name, counts...]` and objects as `[dataset name,
    /// object, name or null, counts...]`, unused entries left out; device
    /// heat as `[slot, rows]` for the slots with any event.
    fn to_json(&self) -> Value {
        let datasets: Vec<Value> = self
            .datasets
            .iter()
            .filter(|d| !d.name.is_empty())
            .map(|d| json!([d.name, d.counts.to_vec()]))
            .collect();
        let objects: Vec<Value> = self
            .objects
            .iter()
            .filter(|o| o.counts.iter().any(|&c| c > 0))
            .map(|o| {
                let dataset = self
                    .datasets
                    .get(o.dataset as usize)
                    .map_or("", |d| d.name.as_str());
                json!([dataset, o.object, o.name, o.counts.to_vec()])
            })
            .collect();
        let device_heat: Vec<Value> = (0..DEVICES_KEPT)
            .filter(|&d| self.device_heat[d].iter().any(|&n| n > 0))
            .map(|d| json!([d, self.device_heat[d].to_vec()]))
            .collect();
        json!([
            self.time_ms,
            self.boot_ms,
            self.values.to_vec(),
            self.heat.to_vec(),
            datasets,
            objects,
            device_heat
        ])
    }
}

/// The cumulative counts of the cache's datasets, those past
/// `DATASETS_KEPT - 1` summed in the last entry as "(other)".
fn dataset_entries(cache: &Cache) -> [DatasetEntry; DATASETS_KEPT] {
    let mut out: [DatasetEntry; DATASETS_KEPT] = Default::default();
    let list = cache.dataset_list();
    let analytics = cache.analytics();
    for (i, (_, name, _)) in list.iter().enumerate() {
        let a = analytics.dataset(i);
        let entry = &mut out[i.min(DATASETS_KEPT - 1)];
        entry.name = if i >= DATASETS_KEPT - 1 && list.len() > DATASETS_KEPT {
            "(other)".to_string()
        } else {
            name.clone()
        };
        let counts = [
            a.reads,
            a.misses,
            a.l2_hits,
            a.primary_reads,
            a.l2_read_bytes + a.shared_read_bytes + a.primary_read_bytes,
        ];
        for (sum, c) in entry.counts.iter_mut().zip(counts) {
            *sum += c;
        }
    }
    out
}

/// The tracked objects' cumulative counts now.
pub(crate) fn object_totals(cache: &Cache) -> ObjectTotals {
    cache
        .analytics()
        .top_objects(TOP_OBJECTS_MAX)
        .into_iter()
        .map(|o| {
            let counts = [o.reads, o.misses, o.l2_hits, o.primary_reads, o.bytes_below];
            ((o.dataset, o.object), (o.name, counts))
        })
        .collect()
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
                let older = read == header.len() && header[..15] == HEADER_MAGIC[..15];
                let what = if older {
                    format!(
                        "is an l2arc history of version {} (this l2arc writes version {})",
                        header[15], HEADER_MAGIC[15]
                    )
                } else {
                    format!("is not an l2arc history of this version ({len} bytes)")
                };
                bail!(
                    "--history {}: the file exists and {what}; give another path, or remove it",
                    path.display()
                );
            }
        }
        Ok(Self {
            file,
            path: path.to_path_buf(),
        })
    }

    /// Writes a sample to its second's slot, and `minute` (the same
    /// counters with the objects of the minute) to its minute's slot.
    pub(crate) fn record(&self, second: &Sample, minute: Option<&Sample>) -> std::io::Result<()> {
        let mut slot = vec![0u8; SLOT_BYTES];
        let slot: &mut [u8; SLOT_BYTES] = slot.as_mut_slice().try_into().expect("a slot");
        second.encode(slot);
        debug_assert_eq!(Sample::decode(slot).as_ref(), Some(second));
        self.file
            .write_all_at(slot, Ring::Seconds.offset_of(second.time_ms))?;
        if let Some(minute) = minute {
            debug_assert_eq!(minute.time_ms, second.time_ms);
            slot.fill(0);
            minute.encode(slot);
            self.file
                .write_all_at(slot, Ring::Minutes.offset_of(minute.time_ms))?;
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
        // In pieces of `READ_SLOTS_MAX` slots: a request holds about 1 MiB
        // of slots at once, not the whole ring (46 MiB of minutes).
        let mut bytes = vec![0u8; READ_SLOTS_MAX * SLOT_BYTES];
        let mut samples = Vec::new();
        for first in (0..ring.slots()).step_by(READ_SLOTS_MAX) {
            let n = (ring.slots() - first).min(READ_SLOTS_MAX as u64) as usize;
            let piece = &mut bytes[..n * SLOT_BYTES];
            self.file
                .read_exact_at(piece, ring.first_slot_offset() + first * SLOT_BYTES as u64)
                .with_context(|| format!("--history {}", self.path.display()))?;
            samples.extend(
                piece
                    .chunks_exact(SLOT_BYTES)
                    .filter_map(|b| Sample::decode(b.try_into().expect("a slot")))
                    .filter(|s| (from_ms..=end_ms).contains(&s.time_ms)),
            );
        }
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
            "fields": FIELDS.as_slice(),
            "tiers": TIERS,
            "heat_low_log2": HEAT_LOW_LOG2,
            "heat_rows": HEAT_ROWS,
            "breakdown_fields": BREAKDOWN,
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
    // The objects' counts at the previous second and the previous minute.
    let mut second_base = ObjectTotals::new();
    let mut minute_base = ObjectTotals::new();
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
        let objects = object_totals(cache);
        let second = sample.with_objects(&objects, &second_base);
        let by_minute =
            (minute != last_minute).then(|| sample.with_objects(&objects, &minute_base));
        let result = history.record(&second, by_minute.as_ref());
        if by_minute.is_some() {
            minute_base.clone_from(&objects);
        }
        second_base = objects;
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

    fn tier(name: &str) -> usize {
        TIERS.iter().position(|&t| t == name).unwrap()
    }

    fn field(name: &str) -> usize {
        FIELDS.iter().position(|&f| f == name).unwrap()
    }

    fn sample(time_ms: u64, seed: u64) -> Sample {
        let mut s = Sample {
            time_ms,
            boot_ms: 7,
            values: [0; FIELDS.len()],
            heat: [[0; HEAT_ROWS]; TIERS.len()],
            datasets: Default::default(),
            objects: Default::default(),
            device_heat: [[0; HEAT_ROWS]; DEVICES_KEPT],
        };
        for (i, v) in s.values.iter_mut().enumerate() {
            *v = seed * 100 + i as u64;
        }
        s.heat[2][9] = seed;
        s.heat[tier("shared_hit")][12] = seed + 5;
        s.datasets[0] = DatasetEntry {
            name: "nbd".into(),
            counts: [seed, 2, 3, 4, 5],
        };
        s.objects[0] = ObjectEntry {
            dataset: 0,
            object: 42,
            name: Some("hot.dat".into()),
            counts: [seed + 1, 1, 0, 1, 4096],
        };
        s.device_heat[DEVICES_KEPT - 1][HEAT_ROWS - 1] = seed;
        s
    }

    #[test]
    fn samples_round_trip_and_torn_slots_are_skipped() {
        let mut s = sample(123_456, 3);
        let mut b = [0u8; SLOT_BYTES];
        s.encode(&mut b);
        assert_eq!(Sample::decode(&b).as_ref(), Some(&s));
        // The shared tier's band and counters come back where they were.
        let back = Sample::decode(&b).unwrap();
        assert_eq!(back.heat[tier("shared_hit")][12], 8);
        assert_eq!(back.heat[tier("l2_hit")][12], 0);
        assert_eq!(
            back.values[field("shared_hits")],
            300 + field("shared_hits") as u64
        );
        assert_eq!(
            back.values[field("shared_write_bytes")],
            300 + field("shared_write_bytes") as u64
        );
        // A long name is cut at a character boundary.
        s.objects[0].name = Some("é".repeat(40));
        s.encode(&mut b);
        s.objects[0].name = Some("é".repeat(OBJECT_NAME_BYTES / 2));
        assert_eq!(Sample::decode(&b).as_ref(), Some(&s));
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
        // The sizes docs/analytics.md states.
        assert_eq!((SLOT_BYTES, FILE_BYTES), (4896, 66_981_376));
        let now = now_ms() / 1000 * 1000;
        for i in 0..10u64 {
            let s = sample(now - i * 1000, i);
            h.record(&s, (i == 0).then_some(&s)).unwrap();
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
        h.record(&sample(now + SECONDS_KEPT * 1000, 42), None)
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
    fn objects_are_counted_over_the_period_busiest_first() {
        let base: ObjectTotals = [
            ((0, 1), (None, [100, 10, 5, 5, 100])),
            ((0, 2), (Some("b".into()), [50, 5, 0, 5, 50])),
            ((0, 3), (None, [900, 9, 9, 0, 9])),
        ]
        .into();
        let mut now = base.clone();
        now.get_mut(&(0, 1)).unwrap().1 = [130, 12, 6, 6, 120]; // +30 reads
        now.get_mut(&(0, 2)).unwrap().1 = [90, 5, 0, 5, 50]; // +40 reads
        now.get_mut(&(0, 3)).unwrap().1 = [4, 4, 0, 4, 4]; // left and came back
        now.insert((9, 4), (None, [1, 1, 1, 0, 1])); // a new one, dataset past the bound
        let got = sample(1000, 1).with_objects(&now, &base);
        let ids: Vec<u64> = got.objects.iter().map(|o| o.object).collect();
        assert_eq!(&ids[..4], &[2, 1, 3, 4]);
        assert_eq!(got.objects[0].counts, [40, 0, 0, 0, 0]);
        assert_eq!(got.objects[0].name.as_deref(), Some("b"));
        assert_eq!(got.objects[1].counts, [30, 2, 1, 1, 20]);
        assert_eq!(got.objects[2].counts, [4, 4, 0, 4, 4]);
        assert_eq!(got.objects[3].dataset, DATASETS_KEPT as u32 - 1);
        assert!(
            got.objects[4..]
                .iter()
                .all(|o| *o == ObjectEntry::default())
        );
        // Only OBJECTS_KEPT are kept.
        let many: ObjectTotals = (0..20u64)
            .map(|i| ((0, i), (None, [i + 1, 0, 0, 0, 0])))
            .collect();
        let got = sample(1000, 1).with_objects(&many, &ObjectTotals::new());
        let ids: Vec<u64> = got.objects.iter().map(|o| o.object).collect();
        assert_eq!(ids, (12..20).rev().collect::<Vec<_>>());
    }

    #[test]
    fn an_older_version_is_refused_by_its_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h");
        let mut v1 = vec![0u8; 64];
        v1[..16].copy_from_slice(b"l2arc-history\n\0\x01");
        std::fs::write(&path, &v1).unwrap();
        let e = History::open(&path).err().unwrap().to_string();
        assert!(
            e.contains("history of version 1 (this l2arc writes version 3)"),
            "{e}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), v1);
    }

    /// A history of version 2 as that layout made it (its slot and file
    /// sizes, a valid slot in it) is refused, not read under the new
    /// layout, and kept as it was.
    #[test]
    fn a_version_2_file_is_refused_never_misread() {
        const V2_SLOT_BYTES: u64 = 4584;
        const V2_FILE_BYTES: u64 = 62_713_216;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h");
        let mut head = vec![0u8; 32];
        head[..16].copy_from_slice(b"l2arc-history\n\0\x02");
        head[16..24].copy_from_slice(&V2_SLOT_BYTES.to_le_bytes());
        head[24..32].copy_from_slice(&V2_FILE_BYTES.to_le_bytes());
        // A slot with a valid magic where the first second's slot is.
        let mut slot = vec![0u8; V2_SLOT_BYTES as usize];
        slot[0..4].copy_from_slice(&SLOT_MAGIC.to_le_bytes());
        let crc = crc32c::crc32c(&slot[8..]);
        slot[4..8].copy_from_slice(&crc.to_le_bytes());
        {
            let file = File::create(&path).unwrap();
            file.set_len(V2_FILE_BYTES).unwrap();
            file.write_all_at(&head, 0).unwrap();
            file.write_all_at(&slot, HEADER_BYTES).unwrap();
        }
        let before = std::fs::read(&path).unwrap();
        let e = History::open(&path).err().unwrap().to_string();
        assert!(
            e.contains("is an l2arc history of version 2 (this l2arc writes version 3)")
                && e.contains("give another path, or remove it"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(
            std::fs::read(&path).unwrap() == before,
            "the file was changed"
        );
    }

    /// Without a shared tier its counters are zeros and its band empty;
    /// its histogram's events land in its own band, not the L2ARC's.
    #[test]
    fn the_shared_tier_is_a_band_of_its_own_and_zero_without_one() {
        let cache = Cache::new(
            l2arc::CacheConfig::default()
                .arc_max_bytes(16 << 20)
                .arc_shards(2),
        )
        .unwrap();
        let s = Sample::take(&cache, 1000, 1);
        assert!(s.heat[tier("shared_hit")].iter().all(|&n| n == 0));
        for name in FIELDS.iter().filter(|n| n.starts_with("shared_")) {
            assert_eq!(s.values[field(name)], 0, "{name}");
        }
        let json = s.to_json();
        assert_eq!(
            json[3][tier("shared_hit")],
            serde_json::json!(vec![0u64; HEAT_ROWS])
        );
        // About 2 ms, both below 2^21 ns: the row of 2^20.
        cache.analytics().shared_hit.record(2_000_000);
        cache.analytics().shared_hit.record(2_050_000);
        let s = Sample::take(&cache, 2000, 1);
        let row = heat_row(2_000_000);
        assert_eq!(row, 20 - HEAT_LOW_LOG2 as usize);
        assert_eq!(s.heat[tier("shared_hit")][row], 2);
        assert_eq!(s.heat[tier("shared_hit")].iter().sum::<u64>(), 2);
        assert!(s.heat[tier("l2_hit")].iter().all(|&n| n == 0));
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
