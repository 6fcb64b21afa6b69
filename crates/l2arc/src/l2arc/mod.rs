//! The L2ARC: a second-level read cache on flash, between the ARC and primary.
//!
//! Why a log. Flash is fast to read at random and wears when written at
//! random, and a cache is rewritten constantly. So each cache device is a
//! circular log: the feeder gathers records that are about to fall out of the
//! ARC and writes them in one large sequential batch at the device's write
//! hand; the hand sweeps the device and wraps, and whatever it sweeps over is
//! simply gone. There is no allocator, no free-space map and no write
//! amplification beyond one pass over the device per lap.
//!
//! Why lazy invalidation. An index entry names a block and the lap it was
//! written in; the device publishes its hand (and lap) before it writes a
//! batch, so an entry is valid exactly when the hand has not swept past it
//! since (`CacheDevice::holds`). Entries that the hand overwrote are dropped
//! when a lookup meets them and by a sweep every sixteenth of a lap, so the
//! write path never has to find them.
//!
//! Why 20 bytes of DRAM a record. The index keeps only what finds and
//! validates a record: a 64-bit hash of its identity (dataset, object,
//! record, object generation), the packed location word, and a CRC-32C of
//! the stored bytes seeded with that hash. A read recomputes the CRC with the
//! hash the reader asked for, so one check catches corruption, a misdirected
//! or overwritten block, and a record that belongs to someone else. Everything
//! else (sizes, compression framing, the log) lives on the device.
//!
//! Why it never returns bad data. Every failure on the L2ARC side — an I/O
//! error, a checksum mismatch, a failed decompression, a device that is
//! faulted, rebuilding or being removed — drops the entry and reports a miss;
//! the read path then reads primary storage. A device that keeps failing is
//! faulted and leaves the rotor; the cache goes on at primary speed.
//!
//! Why it survives restarts. Each batch ends with a log block that lists its
//! records and points at the previous log block; the device header points at
//! the newest. At open, the index is rebuilt by walking that chain backwards,
//! verifying every checksum, in a background thread while reads go on.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

pub mod device;
pub mod format;
pub mod index;

use crate::buf::AlignedBuf;
use device::DeviceIo;
use format::{
    BLOCK_BYTES, Compression, DATA_START_BYTES, DeviceHeader, HEADER_COPY_OFFSETS, Location,
    LogBlockHeader, LogEntry, LogPointer,
};
use index::{IndexEntry, L2Index};

/// Devices per cache: the location word has 4 bits for the device.
pub const DEVICES_MAX: usize = 16;
/// Largest batch (records plus log block) written in one sequential write.
pub const BATCH_BYTES_MAX: u64 = 16 << 20;
/// A device needs room for several batches to be a useful log.
pub const DEVICE_DATA_BYTES_MIN: u64 = 4 << 20;
/// Consecutive I/O errors after which a device is faulted.
pub const DEVICE_ERRORS_MAX: u32 = 8;
/// Sweeps of overwritten index entries per lap of the write hand.
const SWEEPS_PER_LAP: u32 = 16;

/// The L2ARC tunables, named as ZFS names them.
#[derive(Clone, Debug)]
pub struct L2ArcConfig {
    /// Most bytes written per feed; 0 = no cap but the batch size and the
    /// endurance budget.
    pub l2arc_write_max_bytes: u64,
    /// How deep the feeder scans the ARC's cold ends, in multiples of the
    /// write size.
    pub l2arc_headroom: u32,
    /// Feeder period when there is nothing to write.
    pub l2arc_feed_secs: f64,
    /// Feeder period while it keeps finding records to write.
    pub l2arc_feed_min_ms: u64,
    /// Do not cache records that were only read ahead.
    pub l2arc_noprefetch: bool,
    /// Cache only records from the MFU side of the ARC.
    pub l2arc_mfuonly: bool,
    /// Rebuild the index from the devices' logs at open.
    pub l2arc_rebuild_enabled: bool,
    /// Endurance budget: device writes per day (0 = unlimited).
    pub l2arc_dwpd: f64,
    /// Initialise a device whose header is not an L2ARC header (a device
    /// holding something else). Off: such a device is refused.
    pub force_init_foreign: bool,
}

impl Default for L2ArcConfig {
    fn default() -> Self {
        Self {
            l2arc_write_max_bytes: 0,
            l2arc_headroom: 8,
            l2arc_feed_secs: 1.0,
            l2arc_feed_min_ms: 200,
            l2arc_noprefetch: true,
            l2arc_mfuonly: false,
            l2arc_rebuild_enabled: true,
            l2arc_dwpd: 0.0,
            force_init_foreign: false,
        }
    }
}

/// Device states.
const STATE_REBUILDING: u8 = 0;
const STATE_ONLINE: u8 = 1;
const STATE_FAULTED: u8 = 2;
const STATE_REMOVED: u8 = 3;

/// Counters of one device (ZFS's arcstats `l2_*` names).
#[derive(Default)]
pub struct DeviceCounters {
    pub hits: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub writes_sent: AtomicU64,
    pub writes_error: AtomicU64,
    pub feeds: AtomicU64,
    pub cksum_bad: AtomicU64,
    pub io_error: AtomicU64,
    pub evict_reading: AtomicU64,
    /// Stored bytes of uncompressed records in the index.
    pub asize_plain: AtomicU64,
    /// Allocated bytes of compressed records in the index.
    pub asize_compressed: AtomicU64,
    /// Logical and allocated bytes of compressed records ever written
    /// (their ratio estimates the logical size of compressed records).
    pub compressed_lsize_written: AtomicU64,
    pub compressed_asize_written: AtomicU64,
    pub entries: AtomicU64,
    pub rebuild_success: AtomicU64,
    pub rebuild_bufs: AtomicU64,
    pub rebuild_bufs_precached: AtomicU64,
    pub rebuild_log_blks: AtomicU64,
    pub rebuild_cksum_lb_errors: AtomicU64,
    pub rebuild_io_errors: AtomicU64,
    pub rebuild_dh_errors: AtomicU64,
    pub rebuild_unsupported: AtomicU64,
    pub rebuild_ns: AtomicU64,
}

/// The writer's side of a device, under its mutex.
struct WriterState {
    header: DeviceHeader,
    /// Sequence of the newest log block written (0 = none).
    log_sequence: u64,
    /// Lap fraction (in sixteenths) at which the index was last swept.
    swept_at: u64,
}

pub(crate) struct CacheDevice {
    slot: u8,
    io: Box<dyn DeviceIo>,
    guid: u128,
    start_block: u32,
    end_block: u32,
    batch_blocks_max: u32,
    /// `lap << 32 | hand_block`, published before each batch is written.
    position: AtomicU64,
    writer: Mutex<WriterState>,
    state: AtomicU8,
    inflight_reads: AtomicU64,
    consecutive_errors: AtomicU32,
    counters: DeviceCounters,
}

impl CacheDevice {
    fn position(&self) -> (u32, u32) {
        let p = self.position.load(Ordering::Acquire);
        ((p >> 32) as u32, p as u32)
    }

    fn geometry(&self) -> Geometry {
        Geometry {
            start_block: self.start_block,
            end_block: self.end_block,
            batch_blocks_max: self.batch_blocks_max,
        }
    }

    /// Whether a block written in `lap_mod32` is still intact on the device.
    fn holds(&self, block: u32, lap_mod32: u32) -> bool {
        let (lap, hand) = self.position();
        self.geometry().holds(lap, hand, block, lap_mod32)
    }

    fn holds_location(&self, location: Location) -> bool {
        let last = location.block() + u32::from(location.asize_blocks()) - 1;
        self.holds(location.block(), u32::from(location.lap_mod32()))
            && self.holds(last, u32::from(location.lap_mod32()))
    }

    fn is_online(&self) -> bool {
        self.state.load(Ordering::SeqCst) == STATE_ONLINE
    }

    /// Online or rebuilding: what the rebuild has restored may be read.
    fn is_readable(&self) -> bool {
        matches!(
            self.state.load(Ordering::SeqCst),
            STATE_ONLINE | STATE_REBUILDING
        )
    }

    fn note_error(&self) -> bool {
        let errors = self.consecutive_errors.fetch_add(1, Ordering::Relaxed) + 1;
        if errors >= DEVICE_ERRORS_MAX {
            return self
                .state
                .compare_exchange(
                    STATE_ONLINE,
                    STATE_FAULTED,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                )
                .is_ok();
        }
        false
    }

    fn note_success(&self) {
        if self.consecutive_errors.load(Ordering::Relaxed) != 0 {
            self.consecutive_errors.store(0, Ordering::Relaxed);
        }
    }

    fn data_blocks(&self) -> u64 {
        u64::from(self.end_block - self.start_block)
    }

    fn write_header(&self, header: &DeviceHeader) -> io::Result<()> {
        let mut block = AlignedBuf::zeroed(BLOCK_BYTES as usize);
        let bytes: &mut [u8; 4096] = block
            .as_mut_slice()
            .try_into()
            .expect("header block is 4096 bytes");
        header.encode(bytes);
        let copy = (header.sequence % 2) as usize;
        self.io.write_at(HEADER_COPY_OFFSETS[copy], &block)
    }
}

/// Where a device's data area lies and how far a batch may reach.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    pub start_block: u32,
    pub end_block: u32,
    pub batch_blocks_max: u32,
}

impl Geometry {
    /// The geometry a device header implies. The largest batch is a
    /// function of the data area alone, so it is the same after a restart.
    pub fn of(header: &DeviceHeader) -> Geometry {
        let data_blocks = ((header.data_end_bytes - header.data_start_bytes) / BLOCK_BYTES) as u32;
        Geometry {
            start_block: (header.data_start_bytes / BLOCK_BYTES) as u32,
            end_block: (header.data_end_bytes / BLOCK_BYTES) as u32,
            batch_blocks_max: ((BATCH_BYTES_MAX / BLOCK_BYTES) as u32).min(data_blocks / 4),
        }
    }

    /// Whether a block written in lap `lap_mod32` is intact when the hand is
    /// at `hand` in lap `lap` (docs/format.md, "Data area").
    pub fn holds(&self, lap: u32, hand: u32, block: u32, lap_mod32: u32) -> bool {
        if block < self.start_block || block >= self.end_block {
            return false;
        }
        if lap_mod32 == lap % 32 {
            block < hand
        } else if lap_mod32 == lap.wrapping_sub(1) % 32 {
            block >= hand.saturating_add(self.batch_blocks_max)
        } else {
            false
        }
    }
}

/// Decides which records of a written batch are indexed (see
/// [`L2Arc::write_batch_gated`]): called with the batch's record count and
/// the function that indexes them, one flag per record.
pub type IndexGate<'a> = dyn FnMut(usize, &mut dyn FnMut(&[bool])) + 'a;

/// One record handed to the feeder's batch writer.
pub struct FeedRecord<'a> {
    pub key_hash: u64,
    pub data: &'a [u8],
    pub compression: Compression,
}

/// What happened when a device was opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceOpen {
    /// The header was valid: the index is being rebuilt from the log.
    Rebuilding,
    /// The header was valid but rebuild is off: the device starts empty.
    Reused,
    /// Blank, or ours but unreadable: initialised empty.
    Initialised,
}

/// A snapshot of one device's statistics.
#[derive(Clone, Debug)]
pub struct DeviceStats {
    pub slot: u8,
    pub description: String,
    pub state: &'static str,
    pub size_bytes: u64,
    pub kstats: Vec<(&'static str, u64)>,
}

/// L2ARC statistics, summed over devices, with ZFS's names.
#[derive(Clone, Debug, Default)]
pub struct L2Stats {
    pub kstats: Vec<(&'static str, u64)>,
    pub devices: Vec<DeviceStats>,
}

impl L2Stats {
    pub fn get(&self, name: &str) -> u64 {
        self.kstats
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, v)| *v)
    }
}

/// The flash tier: devices, the index, and the rotor between them.
pub struct L2Arc {
    config: L2ArcConfig,
    cache_guid: u128,
    devices: RwLock<Vec<Option<Arc<CacheDevice>>>>,
    index: L2Index,
    rotor: AtomicU64,
    misses: AtomicU64,
    hits: AtomicU64,
    /// Endurance budget: bytes the feeder may still write (refilled with time).
    budget_bytes: Mutex<(f64, std::time::Instant)>,
    stopping: AtomicBool,
}

/// Seed for random guids: time, pid and an address, mixed.
fn random_u128() -> u128 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let local = 0u8;
    let a = crate::hash::mix64(t as u64 ^ u64::from(std::process::id()) << 32);
    let b = crate::hash::mix64(a ^ (&local as *const u8 as u64) ^ (t >> 64) as u64);
    (u128::from(a) << 64) | u128::from(b)
}

impl L2Arc {
    /// An L2ARC with no devices yet; `expected_records` pre-sizes the index.
    pub fn new(config: L2ArcConfig, expected_records: usize) -> Self {
        Self {
            config,
            cache_guid: random_u128(),
            devices: RwLock::new(Vec::new()),
            index: L2Index::new(64, expected_records),
            rotor: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            budget_bytes: Mutex::new((0.0, std::time::Instant::now())),
            stopping: AtomicBool::new(false),
        }
    }

    pub fn config(&self) -> &L2ArcConfig {
        &self.config
    }

    fn device(&self, slot: u8) -> Option<Arc<CacheDevice>> {
        let devices = self.devices.read().expect("device list poisoned");
        devices.get(slot as usize).and_then(Clone::clone)
    }

    fn all_devices(&self) -> Vec<Arc<CacheDevice>> {
        let devices = self.devices.read().expect("device list poisoned");
        devices.iter().flatten().cloned().collect()
    }

    /// Adds a cache device: reuses and rebuilds it if it holds an L2ARC log,
    /// initialises it if blank, refuses it if it holds something else (unless
    /// `force_init_foreign`). Returns the device slot and what was done. The
    /// rebuild, if any, runs in a background thread.
    pub fn add_device(self: &Arc<Self>, io: Box<dyn DeviceIo>) -> io::Result<(u8, DeviceOpen)> {
        let size_bytes = io.size_bytes();
        let name = io.describe();
        if size_bytes < DATA_START_BYTES + DEVICE_DATA_BYTES_MIN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "cache device {name}: {size_bytes} bytes is too small (at least {} MiB)",
                    (DATA_START_BYTES + DEVICE_DATA_BYTES_MIN) >> 20
                ),
            ));
        }
        let mut headers = AlignedBuf::zeroed(2 * BLOCK_BYTES as usize);
        io.read_at(0, headers.as_mut_slice()).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cache device {name}: cannot read its header: {e}"),
            )
        })?;
        let (a, b) = headers.split_at(BLOCK_BYTES as usize);
        // A copy of a newer format (our magic, a good checksum, another
        // version) means a newer build owns the device: never overwrite it,
        // whatever the other copy holds.
        let crc_at = format::DEVICE_HEADER_BYTES - 4;
        for copy in [a, b] {
            if let Err(e @ format::FormatError::UnsupportedVersion(_)) = DeviceHeader::decode(copy)
                && copy[crc_at..crc_at + 4] == crc32c::crc32c(&copy[..crc_at]).to_le_bytes()
            {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("cache device {name}: {e}; refusing to overwrite a newer format"),
                ));
            }
        }
        let counters = DeviceCounters::default();
        let (header, open) = match DeviceHeader::choose(a, b) {
            Ok((header, _)) if header.device_size_bytes <= size_bytes => {
                if self.config.l2arc_rebuild_enabled {
                    (header, DeviceOpen::Rebuilding)
                } else {
                    (
                        self.fresh_header(size_bytes, Some(header.sequence)),
                        DeviceOpen::Reused,
                    )
                }
            }
            Ok(_) => {
                // The device shrank: its log may point past the end.
                counters.rebuild_dh_errors.fetch_add(1, Ordering::Relaxed);
                (self.fresh_header(size_bytes, None), DeviceOpen::Initialised)
            }
            Err(e) => {
                let ours = a.starts_with(b"L2ARCHDR") || b.starts_with(b"L2ARCHDR");
                let blank = headers.iter().all(|&x| x == 0);
                if ours {
                    counters.rebuild_dh_errors.fetch_add(1, Ordering::Relaxed);
                } else if !blank && !self.config.force_init_foreign {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "cache device {name} holds data that is not an l2arc cache ({e}); \
                             refusing to overwrite it (force_init_foreign to use it anyway)"
                        ),
                    ));
                }
                (self.fresh_header(size_bytes, None), DeviceOpen::Initialised)
            }
        };

        let mut devices = self.devices.write().expect("device list poisoned");
        let slot = match devices.iter().position(Option::is_none) {
            Some(slot) => slot,
            None if devices.len() < DEVICES_MAX => {
                devices.push(None);
                devices.len() - 1
            }
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("at most {DEVICES_MAX} cache devices"),
                ));
            }
        };
        let geometry = Geometry::of(&header);
        let device = Arc::new(CacheDevice {
            slot: slot as u8,
            guid: header.device_guid,
            start_block: geometry.start_block,
            end_block: geometry.end_block,
            batch_blocks_max: geometry.batch_blocks_max,
            position: AtomicU64::new((u64::from(header.lap) << 32) | u64::from(header.hand_block)),
            writer: Mutex::new(WriterState {
                log_sequence: 0,
                swept_at: 0,
                header: header.clone(),
            }),
            state: AtomicU8::new(STATE_REBUILDING),
            inflight_reads: AtomicU64::new(0),
            consecutive_errors: AtomicU32::new(0),
            counters,
            io,
        });
        if open != DeviceOpen::Rebuilding {
            device.write_header(&header).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cache device {name}: cannot write its header: {e}"),
                )
            })?;
            device.io.sync()?;
            device.state.store(STATE_ONLINE, Ordering::SeqCst);
        }
        devices[slot] = Some(Arc::clone(&device));
        drop(devices);
        if open == DeviceOpen::Rebuilding {
            let l2 = Arc::clone(self);
            std::thread::Builder::new()
                .name(format!("l2arc-rebuild-{slot}"))
                .spawn(move || l2.rebuild(&device))?;
        }
        Ok((slot as u8, open))
    }

    fn fresh_header(&self, size_bytes: u64, old_sequence: Option<u64>) -> DeviceHeader {
        let end = size_bytes / BLOCK_BYTES * BLOCK_BYTES;
        DeviceHeader {
            cache_guid: self.cache_guid,
            device_guid: random_u128(),
            device_size_bytes: size_bytes,
            data_start_bytes: DATA_START_BYTES,
            data_end_bytes: end,
            sequence: old_sequence.map_or(1, |s| s + 1),
            hand_block: (DATA_START_BYTES / BLOCK_BYTES) as u32,
            lap: 0,
            newest_log: None,
        }
    }

    /// Walks the device's log from the newest block back and restores every
    /// entry the hand has not overwritten. Reads are served meanwhile: what is
    /// not restored yet is a miss.
    ///
    /// Reading and checking log blocks (I/O, CRC, decoding) runs in a second
    /// thread, a couple of blocks ahead of restoring their entries into the
    /// index, so that the device and the index work at the same time.
    fn rebuild(&self, device: &CacheDevice) {
        let started = std::time::Instant::now();
        let newest_log = device
            .writer
            .lock()
            .expect("writer poisoned")
            .header
            .newest_log;
        let mut newest_sequence = 0u64;
        let mut restore = |sequence: u64, entries: &[LogEntry]| {
            if newest_sequence == 0 {
                newest_sequence = sequence;
            }
            self.restore_entries(device, entries);
        };
        std::thread::scope(|scope| {
            let (sender, receiver) = std::sync::mpsc::sync_channel::<(u64, Vec<LogEntry>)>(2);
            let walker = std::thread::Builder::new()
                .name(format!("l2arc-rebuild-read-{}", device.slot))
                .spawn_scoped(scope, move || {
                    self.walk_log(device, newest_log, |sequence, entries| {
                        sender.send((sequence, entries)).is_ok()
                    });
                });
            if walker.is_ok() {
                for (sequence, entries) in receiver {
                    restore(sequence, &entries);
                }
            } else {
                // No second thread: read and restore in turn.
                self.walk_log(device, newest_log, |sequence, entries| {
                    restore(sequence, &entries);
                    true
                });
            }
        });
        let c = &device.counters;
        let mut writer = device.writer.lock().expect("writer poisoned");
        writer.log_sequence = newest_sequence;
        if newest_sequence == 0 {
            // The newest log block was unreadable: start a fresh chain rather
            // than point every future rebuild at the bad block.
            writer.header.newest_log = None;
        }
        drop(writer);
        c.rebuild_ns
            .store(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        c.rebuild_success.fetch_add(1, Ordering::Relaxed);
        let _ = device.state.compare_exchange(
            STATE_REBUILDING,
            STATE_ONLINE,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }

    /// Follows the log from `newest_log` back, checking every log block, and
    /// hands the sequence and entries of each good one to `found`, newest
    /// first, until a block fails, lies where the hand has been since, or
    /// `found` returns false.
    fn walk_log(
        &self,
        device: &CacheDevice,
        newest_log: Option<LogPointer>,
        mut found: impl FnMut(u64, Vec<LogEntry>) -> bool,
    ) {
        let c = &device.counters;
        let mut pointer = newest_log;
        let mut expected_sequence: Option<u64> = None;
        let (hand_lap, hand) = device.position();
        // The block and lap of the log block walked last.
        let mut newer: Option<(u32, u32)> = None;
        let mut walked = 0u64;
        let walk_max = device.data_blocks();
        let mut buf = AlignedBuf::zeroed(0);
        while let Some(p) = pointer {
            if self.stopping.load(Ordering::Relaxed)
                || walked >= walk_max
                || device.state.load(Ordering::SeqCst) == STATE_REMOVED
            {
                break;
            }
            walked += 1;
            let block = (p.offset_bytes / BLOCK_BYTES) as u32;
            let blocks = p.size_bytes / BLOCK_BYTES as u32;
            if p.size_bytes == 0
                || u64::from(block) + u64::from(blocks) > u64::from(device.end_block)
            {
                c.rebuild_cksum_lb_errors.fetch_add(1, Ordering::Relaxed);
                break;
            }
            // The log ends at a log block the hand has swept over since it was
            // written, whatever its bytes are now (a later lap's data, or a
            // batch cut short by a crash): judge by position and lap before
            // reading, so that is no checksum error. Blocks rise within a
            // lap, so the lap of the block pointed at is known: the newest
            // lies below the hand unless the hand has just wrapped, and a
            // predecessor lies below its successor unless the lap changed.
            let lap = match newer {
                None if block < hand => hand_lap,
                None => hand_lap.wrapping_sub(1),
                Some((newer_block, newer_lap)) if block < newer_block => newer_lap,
                Some((_, newer_lap)) => newer_lap.wrapping_sub(1),
            };
            if !device.holds(block, lap % 32) || !device.holds(block + blocks - 1, lap % 32) {
                break;
            }
            if buf.capacity_bytes() < p.size_bytes as usize {
                buf = AlignedBuf::zeroed(p.size_bytes as usize);
            }
            buf.set_len(p.size_bytes as usize);
            if device
                .io
                .read_at(p.offset_bytes, buf.as_mut_slice())
                .is_err()
            {
                c.rebuild_io_errors.fetch_add(1, Ordering::Relaxed);
                break;
            }
            if crc32c::crc32c(&buf) != p.crc {
                c.rebuild_cksum_lb_errors.fetch_add(1, Ordering::Relaxed);
                break;
            }
            let (lb, entries) = match format::decode_log_block(&buf, device.guid) {
                Ok(decoded) => decoded,
                Err(_) => {
                    c.rebuild_cksum_lb_errors.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            };
            if expected_sequence.is_some_and(|s| s != lb.sequence) {
                c.rebuild_cksum_lb_errors.fetch_add(1, Ordering::Relaxed);
                break;
            }
            // The log block itself must not have been overwritten.
            if !device.holds(block, lb.lap % 32) || !device.holds(block + blocks - 1, lb.lap % 32) {
                break;
            }
            if !found(lb.sequence, entries) {
                break;
            }
            expected_sequence = lb.sequence.checked_sub(1);
            newer = Some((lb.first_block, lb.lap));
            pointer = lb.prev;
        }
    }

    /// Restores one log block's entries that the hand has not overwritten,
    /// unless a newer entry for the same record is in the index already.
    /// The counters are updated once per log block, not per entry.
    fn restore_entries(&self, device: &CacheDevice, entries: &[LogEntry]) {
        // Under the writer lock, as a feed indexes its batch: `remove_device`
        // marks the device removed, then takes this lock before it forgets
        // the device's entries, so none restored here outlives the device.
        let _writer = device.writer.lock().expect("writer poisoned");
        if device.state.load(Ordering::SeqCst) != STATE_REBUILDING {
            return;
        }
        let (mut restored, mut precached, mut plain, mut compressed) = (0u64, 0u64, 0u64, 0u64);
        for entry in entries {
            let location = entry.location.with_device(device.slot);
            if !device.holds_location(location) {
                continue;
            }
            let inserted = self.index.insert_if_absent(IndexEntry {
                key_hash: entry.key_hash,
                location: location.0,
                checksum: entry.checksum,
            });
            if !inserted {
                precached += 1;
                continue;
            }
            restored += 1;
            // As `account_insert` counts it.
            if location.compression() == Some(Compression::Off) {
                plain += location.stored_bytes() as u64;
            } else {
                compressed += u64::from(location.asize_blocks()) * BLOCK_BYTES;
            }
        }
        let c = &device.counters;
        c.entries.fetch_add(restored, Ordering::Relaxed);
        c.asize_plain.fetch_add(plain, Ordering::Relaxed);
        c.asize_compressed.fetch_add(compressed, Ordering::Relaxed);
        c.rebuild_bufs.fetch_add(restored, Ordering::Relaxed);
        c.rebuild_bufs_precached
            .fetch_add(precached, Ordering::Relaxed);
        c.rebuild_log_blks.fetch_add(1, Ordering::Relaxed);
    }

    /// True while any device is still rebuilding its index.
    pub fn rebuilding(&self) -> bool {
        self.all_devices()
            .iter()
            .any(|d| d.state.load(Ordering::SeqCst) == STATE_REBUILDING)
    }

    /// Waits (bounded) for every rebuild to finish.
    pub fn wait_for_rebuild(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while self.rebuilding() {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }

    /// Takes a device out: new reads stop using it, reads in flight finish,
    /// then its index entries are dropped and its slot is freed.
    pub fn remove_device(&self, slot: u8) -> io::Result<()> {
        let device = self.device(slot).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no cache device in slot {slot}"),
            )
        })?;
        device.state.store(STATE_REMOVED, Ordering::SeqCst);
        while device.inflight_reads.load(Ordering::SeqCst) != 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
        // The feeder may be mid-batch on it: wait for the writer to let go.
        drop(device.writer.lock().expect("writer poisoned"));
        self.forget_device(&device);
        let mut devices = self.devices.write().expect("device list poisoned");
        devices[slot as usize] = None;
        Ok(())
    }

    fn forget_device(&self, device: &CacheDevice) {
        let slot = device.slot;
        self.index.retain(|e| Location(e.location).device() != slot);
        let c = &device.counters;
        c.asize_plain.store(0, Ordering::Relaxed);
        c.asize_compressed.store(0, Ordering::Relaxed);
        c.entries.store(0, Ordering::Relaxed);
    }

    /// Whether the L2ARC holds a record (the feeder skips those).
    pub fn contains(&self, key_hash: u64) -> bool {
        self.index.get(key_hash).is_some()
    }

    /// Forgets a record (its data changed): the next read of it is a miss.
    pub fn invalidate(&self, key_hash: u64) {
        if let Some(old) = self.index.remove(key_hash) {
            let location = Location(old.location);
            if let Some(device) = self.device(location.device()) {
                account_remove(&device.counters, location);
            }
        }
    }

    /// Drops one entry if it still has `location`; keeps the accounting.
    fn drop_entry(&self, key_hash: u64, location: Location, device: Option<&CacheDevice>) {
        if self
            .index
            .remove_if(key_hash, |e| e.location == location.0)
            .is_some()
            && let Some(device) = device
        {
            account_remove(&device.counters, location);
        }
    }

    /// Reads a record from flash. `Ok(None)` is a miss; every failure is a
    /// miss too (counted), so callers fall back to primary storage.
    pub fn read(&self, key_hash: u64, lsize_max: u32) -> Option<AlignedBuf> {
        let Some(entry) = self.index.get(key_hash) else {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let location = Location(entry.location);
        let Some(device) = self.device(location.device()) else {
            self.drop_entry(key_hash, location, None);
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        device.inflight_reads.fetch_add(1, Ordering::SeqCst);
        let result = self.read_from(&device, key_hash, entry, lsize_max);
        device.inflight_reads.fetch_sub(1, Ordering::SeqCst);
        match &result {
            Some(_) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                device.counters.hits.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    fn read_from(
        &self,
        device: &CacheDevice,
        key_hash: u64,
        entry: IndexEntry,
        lsize_max: u32,
    ) -> Option<AlignedBuf> {
        let location = Location(entry.location);
        let c = &device.counters;
        if !device.is_readable() || !device.holds_location(location) {
            self.drop_entry(key_hash, location, Some(device));
            return None;
        }
        let compression = location.compression()?;
        let asize_bytes = usize::from(location.asize_blocks()) * BLOCK_BYTES as usize;
        let mut buf = AlignedBuf::zeroed(asize_bytes);
        if device
            .io
            .read_at(location.offset_bytes(), buf.as_mut_slice())
            .is_err()
        {
            c.io_error.fetch_add(1, Ordering::Relaxed);
            self.drop_entry(key_hash, location, Some(device));
            if device.note_error() {
                self.forget_device(device);
            }
            return None;
        }
        device.note_success();
        c.read_bytes
            .fetch_add(asize_bytes as u64, Ordering::Relaxed);
        let stored_bytes = location.stored_bytes();
        if format::record_checksum(key_hash, &buf[..stored_bytes]) != entry.checksum {
            if device.holds_location(location) {
                c.cksum_bad.fetch_add(1, Ordering::Relaxed);
            } else {
                // The hand swept over it while we read: not corruption.
                c.evict_reading.fetch_add(1, Ordering::Relaxed);
            }
            self.drop_entry(key_hash, location, Some(device));
            return None;
        }
        match compression {
            Compression::Off => {
                buf.set_len(stored_bytes);
                Some(buf)
            }
            Compression::Lz4 | Compression::Zstd => {
                let decoded = format::decode_compressed_frame(&buf[..stored_bytes], lsize_max)
                    .ok()
                    .and_then(|(lsize, compressed)| {
                        let mut out = AlignedBuf::zeroed(lsize as usize);
                        format::decompress(compression, compressed, out.as_mut_slice())
                            .ok()
                            .map(|()| out)
                    });
                if decoded.is_none() {
                    c.cksum_bad.fetch_add(1, Ordering::Relaxed);
                    self.drop_entry(key_hash, location, Some(device));
                }
                decoded
            }
        }
    }

    /// How many bytes the feeder may write now: the per-feed cap, the batch
    /// size, and the endurance budget.
    pub fn feed_budget_bytes(&self) -> u64 {
        let devices = self.all_devices();
        let online: Vec<_> = devices.iter().filter(|d| d.is_online()).collect();
        if online.is_empty() {
            return 0;
        }
        let batch_bytes = online
            .iter()
            .map(|d| u64::from(d.batch_blocks_max) * BLOCK_BYTES)
            .min()
            .unwrap_or(0);
        let mut budget = batch_bytes;
        if self.config.l2arc_write_max_bytes > 0 {
            budget = budget.min(self.config.l2arc_write_max_bytes);
        }
        if self.config.l2arc_dwpd > 0.0 {
            let total_bytes: u64 = online.iter().map(|d| d.data_blocks() * BLOCK_BYTES).sum();
            let per_sec = self.config.l2arc_dwpd * total_bytes as f64 / 86_400.0;
            let mut bucket = self.budget_bytes.lock().expect("budget poisoned");
            let now = std::time::Instant::now();
            // Refill, holding at most one batch of credit.
            bucket.0 =
                (bucket.0 + per_sec * (now - bucket.1).as_secs_f64()).min(batch_bytes as f64);
            bucket.1 = now;
            budget = budget.min(bucket.0 as u64);
        }
        budget
    }

    fn spend_budget(&self, bytes: u64) {
        if self.config.l2arc_dwpd > 0.0 {
            let mut bucket = self.budget_bytes.lock().expect("budget poisoned");
            bucket.0 -= bytes as f64;
        }
    }

    /// Writes one batch of records to the next device of the rotor and
    /// indexes them. Returns the bytes written and how many of `records`
    /// (a prefix) went in; `(0, 0)` when no device is usable.
    pub fn write_batch(&self, records: &[FeedRecord<'_>]) -> io::Result<(u64, usize)> {
        self.write_batch_gated(records, &mut |n, index| index(&vec![true; n]))
    }

    /// [`write_batch`](Self::write_batch), but once the batch is on the
    /// device, `gate(n, index)` decides which of its `n` records are
    /// indexed by calling `index` with one flag per record. The caller
    /// holds its own lock around that call, so that a record it has learnt
    /// is stale (written to since it was copied) is never findable.
    pub fn write_batch_gated(
        &self,
        records: &[FeedRecord<'_>],
        gate: &mut IndexGate<'_>,
    ) -> io::Result<(u64, usize)> {
        if records.is_empty() {
            return Ok((0, 0));
        }
        let devices = self.all_devices();
        let online: Vec<_> = devices.into_iter().filter(|d| d.is_online()).collect();
        if online.is_empty() {
            return Ok((0, 0));
        }
        let turn = self.rotor.fetch_add(1, Ordering::Relaxed) as usize % online.len();
        let device = &online[turn];
        let result = self.write_batch_to(device, records, gate);
        match &result {
            Ok((bytes, _)) => {
                device.note_success();
                self.spend_budget(*bytes);
            }
            Err(_) => {
                device.counters.writes_error.fetch_add(1, Ordering::Relaxed);
                if device.note_error() {
                    self.forget_device(device);
                }
            }
        }
        result
    }

    fn write_batch_to(
        &self,
        device: &CacheDevice,
        records: &[FeedRecord<'_>],
        gate: &mut IndexGate<'_>,
    ) -> io::Result<(u64, usize)> {
        let mut writer = device.writer.lock().expect("writer poisoned");
        if !device.is_online() {
            return Ok((0, 0));
        }
        // Lay the payloads out; compress where the dataset asks and it pays.
        let mut payloads: Vec<(u64, Vec<u8>, Compression, usize)> =
            Vec::with_capacity(records.len());
        let mut compressed = Vec::new();
        let mut blocks_total = 0u32;
        let max_blocks = device.batch_blocks_max;
        for record in records {
            let (bytes, compression) = if record.compression != Compression::Off
                && format::compress(record.data, record.compression, &mut compressed)
            {
                let mut framed = vec![0u8; compressed.len() + 8];
                let n = format::encode_compressed_frame(
                    record.data.len() as u32,
                    &compressed,
                    &mut framed,
                );
                framed.truncate(n);
                (framed, record.compression)
            } else {
                (record.data.to_vec(), Compression::Off)
            };
            let asize_blocks = bytes.len().div_ceil(BLOCK_BYTES as usize).max(1) as u32;
            let log_blocks =
                format::log_block_size_bytes(payloads.len() + 1) as u32 / BLOCK_BYTES as u32;
            if blocks_total + asize_blocks + log_blocks > max_blocks || asize_blocks > 511 {
                break;
            }
            blocks_total += asize_blocks;
            let logical = record.data.len();
            payloads.push((record.key_hash, bytes, compression, logical));
        }
        if payloads.is_empty() {
            return Ok((0, 0));
        }
        let log_bytes = format::log_block_size_bytes(payloads.len());
        let total_blocks = blocks_total + (log_bytes as u64 / BLOCK_BYTES) as u32;
        assert!(
            total_blocks <= max_blocks,
            "batch of {total_blocks} blocks over {max_blocks}"
        );

        // Advance the hand first: lookups stop trusting the region at once.
        let (mut lap, mut hand) = device.position();
        if hand + total_blocks > device.end_block {
            lap = lap.wrapping_add(1);
            hand = device.start_block;
            // Publish the wrap on the device before writing over the start
            // of the data area: until then the header's rule holds the
            // records there valid, and a batch cut short by a crash would
            // leave other bytes where a rebuild expects them. At (lap + 1,
            // start) they fall in the margin ahead of the hand instead.
            let mut header = writer.header.clone();
            header.sequence += 1;
            header.hand_block = hand;
            header.lap = lap;
            device.write_header(&header)?;
            device.io.sync()?;
            writer.header = header;
        }
        device.position.store(
            (u64::from(lap) << 32) | u64::from(hand + total_blocks),
            Ordering::Release,
        );

        let mut batch = AlignedBuf::zeroed(total_blocks as usize * BLOCK_BYTES as usize);
        let mut entries = Vec::with_capacity(payloads.len());
        let mut at_block = 0u32;
        for (key_hash, bytes, compression, _) in &payloads {
            let asize_blocks = bytes.len().div_ceil(BLOCK_BYTES as usize).max(1) as u16;
            let tail_bytes =
                (usize::from(asize_blocks) * BLOCK_BYTES as usize - bytes.len()) as u16;
            let offset = at_block as usize * BLOCK_BYTES as usize;
            batch.as_mut_slice()[offset..offset + bytes.len()].copy_from_slice(bytes);
            let location = Location::new(
                hand + at_block,
                lap,
                device.slot,
                asize_blocks,
                *compression,
                tail_bytes,
            );
            let stored = &batch[offset..offset + location.stored_bytes()];
            entries.push(LogEntry {
                key_hash: *key_hash,
                location,
                checksum: format::record_checksum(*key_hash, stored),
            });
            at_block += u32::from(asize_blocks);
        }
        let log_header = LogBlockHeader {
            device_guid: device.guid,
            sequence: writer.log_sequence + 1,
            lap,
            first_block: hand,
            prev: writer.header.newest_log,
            entry_count: entries.len() as u32,
            size_bytes: log_bytes as u32,
        };
        let log_offset = at_block as usize * BLOCK_BYTES as usize;
        let log_crc = format::encode_log_block(
            &log_header,
            &entries,
            &mut batch.as_mut_slice()[log_offset..log_offset + log_bytes],
        );
        let c = &device.counters;
        c.writes_sent.fetch_add(1, Ordering::Relaxed);
        device.io.write_at(u64::from(hand) * BLOCK_BYTES, &batch)?;
        device.io.sync()?;
        let mut header = writer.header.clone();
        header.sequence += 1;
        header.hand_block = hand + total_blocks;
        header.lap = lap;
        header.newest_log = Some(LogPointer {
            offset_bytes: u64::from(hand + at_block) * BLOCK_BYTES,
            size_bytes: log_bytes as u32,
            crc: log_crc,
        });
        device.write_header(&header)?;
        writer.header = header;
        writer.log_sequence += 1;

        gate(entries.len(), &mut |flags| {
            for (entry, _) in entries.iter().zip(flags).filter(|(_, keep)| **keep) {
                let old = self.index.insert(IndexEntry {
                    key_hash: entry.key_hash,
                    location: entry.location.0,
                    checksum: entry.checksum,
                });
                if let Some(old) = old {
                    let old_location = Location(old.location);
                    if let Some(old_device) = self.device(old_location.device()) {
                        account_remove(&old_device.counters, old_location);
                    }
                }
                account_insert(c, entry.location);
            }
        });
        for (entry, (_, _, compression, logical)) in entries.iter().zip(&payloads) {
            if *compression != Compression::Off {
                c.compressed_lsize_written
                    .fetch_add(*logical as u64, Ordering::Relaxed);
                c.compressed_asize_written.fetch_add(
                    u64::from(entry.location.asize_blocks()) * BLOCK_BYTES,
                    Ordering::Relaxed,
                );
            }
        }
        let bytes = u64::from(total_blocks) * BLOCK_BYTES;
        c.write_bytes.fetch_add(bytes, Ordering::Relaxed);
        c.feeds.fetch_add(1, Ordering::Relaxed);

        // Every sixteenth of a lap, drop the entries the hand swept over.
        let data_blocks = device.data_blocks();
        let progress = u64::from(lap) * u64::from(SWEEPS_PER_LAP)
            + u64::from(hand + total_blocks - device.start_block) * u64::from(SWEEPS_PER_LAP)
                / data_blocks;
        if progress > writer.swept_at {
            writer.swept_at = progress;
            drop(writer);
            self.sweep(device);
        }
        Ok((bytes, payloads.len()))
    }

    /// Drops this device's index entries that the hand has overwritten.
    fn sweep(&self, device: &CacheDevice) {
        let slot = device.slot;
        let c = &device.counters;
        self.index.retain(|e| {
            let location = Location(e.location);
            if location.device() != slot || device.holds_location(location) {
                return true;
            }
            account_remove(c, location);
            false
        });
    }

    /// Statistics, in total and per device.
    pub fn stats(&self) -> L2Stats {
        let mut devices = Vec::new();
        let mut total: Vec<(&'static str, u64)> = Vec::new();
        for device in self.all_devices() {
            let kstats = device_kstats(&device);
            if total.is_empty() {
                total = kstats.iter().map(|&(n, _)| (n, 0)).collect();
            }
            for (t, (_, v)) in total.iter_mut().zip(&kstats) {
                t.1 += v;
            }
            devices.push(DeviceStats {
                slot: device.slot,
                description: device.io.describe(),
                state: match device.state.load(Ordering::SeqCst) {
                    STATE_REBUILDING => "rebuilding",
                    STATE_ONLINE => "online",
                    STATE_FAULTED => "faulted",
                    _ => "removed",
                },
                size_bytes: device.data_blocks() * BLOCK_BYTES,
                kstats,
            });
        }
        if total.is_empty() {
            total = device_kstats_names().into_iter().map(|n| (n, 0)).collect();
        }
        let mut kstats = vec![
            ("l2_hits", self.hits.load(Ordering::Relaxed)),
            ("l2_misses", self.misses.load(Ordering::Relaxed)),
            ("l2_hdr_size", self.index.memory_bytes() as u64),
            ("l2_devices", devices.len() as u64),
        ];
        kstats.extend(total.into_iter().filter(|(n, _)| *n != "l2_hits"));
        L2Stats { kstats, devices }
    }

    /// Number of records indexed.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Stops background work (rebuild threads check this).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }
}

fn account_insert(c: &DeviceCounters, location: Location) {
    c.entries.fetch_add(1, Ordering::Relaxed);
    if location.compression() == Some(Compression::Off) {
        c.asize_plain
            .fetch_add(location.stored_bytes() as u64, Ordering::Relaxed);
    } else {
        c.asize_compressed.fetch_add(
            u64::from(location.asize_blocks()) * BLOCK_BYTES,
            Ordering::Relaxed,
        );
    }
}

fn account_remove(c: &DeviceCounters, location: Location) {
    c.entries.fetch_sub(1, Ordering::Relaxed);
    if location.compression() == Some(Compression::Off) {
        c.asize_plain
            .fetch_sub(location.stored_bytes() as u64, Ordering::Relaxed);
    } else {
        c.asize_compressed.fetch_sub(
            u64::from(location.asize_blocks()) * BLOCK_BYTES,
            Ordering::Relaxed,
        );
    }
}

fn device_kstats_names() -> Vec<&'static str> {
    let dummy = DeviceCounters::default();
    kstats_of(&dummy).into_iter().map(|(n, _)| n).collect()
}

fn device_kstats(device: &CacheDevice) -> Vec<(&'static str, u64)> {
    kstats_of(&device.counters)
}

fn kstats_of(c: &DeviceCounters) -> Vec<(&'static str, u64)> {
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let plain = get(&c.asize_plain);
    let compressed = get(&c.asize_compressed);
    let ratio = if get(&c.compressed_asize_written) == 0 {
        1.0
    } else {
        get(&c.compressed_lsize_written) as f64 / get(&c.compressed_asize_written) as f64
    };
    vec![
        ("l2_hits", get(&c.hits)),
        ("l2_feeds", get(&c.feeds)),
        ("l2_read_bytes", get(&c.read_bytes)),
        ("l2_write_bytes", get(&c.write_bytes)),
        ("l2_writes_sent", get(&c.writes_sent)),
        ("l2_writes_error", get(&c.writes_error)),
        ("l2_evict_reading", get(&c.evict_reading)),
        ("l2_cksum_bad", get(&c.cksum_bad)),
        ("l2_io_error", get(&c.io_error)),
        ("l2_size", plain + (compressed as f64 * ratio) as u64),
        ("l2_asize", plain + compressed),
        ("l2_bufs", get(&c.entries)),
        ("l2_rebuild_success", get(&c.rebuild_success)),
        ("l2_rebuild_bufs", get(&c.rebuild_bufs)),
        ("l2_rebuild_bufs_precached", get(&c.rebuild_bufs_precached)),
        ("l2_rebuild_log_blks", get(&c.rebuild_log_blks)),
        (
            "l2_rebuild_cksum_lb_errors",
            get(&c.rebuild_cksum_lb_errors),
        ),
        ("l2_rebuild_io_errors", get(&c.rebuild_io_errors)),
        ("l2_rebuild_dh_errors", get(&c.rebuild_dh_errors)),
        ("l2_rebuild_unsupported", get(&c.rebuild_unsupported)),
        ("l2_rebuild_time_us", get(&c.rebuild_ns) / 1000),
    ]
}
