//! One cache device's state: where its write hand is, its data area, its
//! health, and its counters.
//!
//! The hand is published (`position`, lap and block in one atomic word)
//! before a batch is written, so readers stop trusting the region ahead of
//! it at once; `Geometry::holds` is the one rule that says whether a block
//! is still intact for a given hand (docs/format.md, "Data area"). The
//! writer's own state (the header as last written, the log sequence, the
//! sweep mark) lives under the device's writer mutex.

use std::io;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

use super::device::DeviceIo;
use super::format::{
    BLOCK_BYTES, DeviceHeader, HEADER_COPY_OFFSETS, LOG_READ_AHEAD_POINTERS, Location, LogPointer,
};
use super::space::Space;
use super::*;
use crate::buf::AlignedBuf;
use crate::lock_order::{RankedMutex, rank};

/// Device states.
pub(super) const STATE_REBUILDING: u8 = 0;
pub(super) const STATE_ONLINE: u8 = 1;
pub(super) const STATE_FAULTED: u8 = 2;
pub(super) const STATE_REMOVED: u8 = 3;

/// Counters of one device (ZFS's arcstats `l2_*` names).
#[derive(Default)]
pub(crate) struct DeviceCounters {
    pub hits: AtomicU64,
    /// Hits served from 4 KiB pieces of a record (`L2Arc::read_sectors`).
    pub sector_hits: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub writes_sent: AtomicU64,
    /// Batches prepared while the batch before was being written.
    pub writes_pipelined: AtomicU64,
    pub writes_error: AtomicU64,
    pub feeds: AtomicU64,
    pub cksum_bad: AtomicU64,
    pub io_error: AtomicU64,
    pub evict_reading: AtomicU64,
    /// Logical and allocated bytes of compressed records ever written
    /// (their ratio estimates the logical size of compressed records).
    pub compressed_lsize_written: AtomicU64,
    pub compressed_asize_written: AtomicU64,
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
pub(super) struct WriterState {
    pub(super) header: DeviceHeader,
    /// Sequence of the newest log block written (0 = none).
    pub(super) log_sequence: u64,
    /// The log blocks before `header.newest_log`, newest first: the next
    /// log block's read-ahead hints (`LogBlockHeader::read_ahead`).
    pub(super) older_logs: [Option<LogPointer>; LOG_READ_AHEAD_POINTERS],
    /// Lap fraction (in sixteenths) at which the index was last swept.
    pub(super) swept_at: u64,
    /// A batch buffer kept from one batch to the next: a fresh 16 MiB
    /// buffer per batch cost the feeder more in page faults and zeroing
    /// than the device write itself. A batch takes it while it is prepared
    /// and written and gives it back when finished; a second batch
    /// prepared meanwhile makes a second buffer, kept in turn (so at most
    /// two per device exist). None until the first batch.
    pub(super) spare_batch: Option<AlignedBuf>,
}

pub(crate) struct CacheDevice {
    pub(super) slot: u8,
    pub(super) io: Box<dyn DeviceIo>,
    pub(super) guid: u128,
    pub(super) start_block: u32,
    pub(super) end_block: u32,
    pub(super) batch_blocks_max: u32,
    /// `lap << 32 | hand_block`, published before each batch is written.
    pub(super) position: AtomicU64,
    pub(super) writer: RankedMutex<WriterState, { rank::DEVICE_WRITER }>,
    /// Held by whoever has a batch of this device prepared and not yet
    /// finished: a device feeder for its whole burst, any other feed for
    /// its one batch. Batches are then written in the order they were
    /// prepared, each after the one its log block names; without it a
    /// feed from another thread wrote its batch and header while the
    /// feeder's batch before it was still being written, and a crash then
    /// left a header whose chain broke one block back.
    pub(super) commit_order: RankedMutex<(), { rank::COMMIT_ORDER }>,
    pub(super) state: AtomicU8,
    pub(super) inflight_reads: AtomicU64,
    /// Batches handed to a feeder's writer thread and not yet written
    /// (`feeder::BatchWriter`); removal waits for them.
    pub(super) commits_in_flight: AtomicU64,
    pub(super) consecutive_errors: AtomicU32,
    /// When the last I/O error warning was logged (ms since `added`;
    /// `u64::MAX`: never), and whether the current run of errors was.
    error_logged_ms: AtomicU64,
    error_run_logged: std::sync::atomic::AtomicBool,
    added: std::time::Instant,
    pub(super) counters: DeviceCounters,
    /// What the device holds now (`l2_asize`, `l2_bufs`), written off as
    /// the hand overwrites it (`space`).
    pub(super) space: Space,
}

/// Least time between two warnings that a device's I/O fails (a device
/// that fails and recovers in turn logs a line per run, at most this often).
const ERROR_LOG_INTERVAL_MS: u64 = 10_000;

impl WriterState {
    /// Makes `pointer` the newest log block (the header is written by the
    /// caller); the one it replaces becomes the first read-ahead hint.
    pub(super) fn push_log(&mut self, pointer: LogPointer) {
        // A log block is whole blocks in the data area, never the one
        // already newest (each batch has its own).
        assert!(
            pointer.size_bytes > 0 && u64::from(pointer.size_bytes).is_multiple_of(BLOCK_BYTES)
        );
        assert!(pointer.offset_bytes.is_multiple_of(BLOCK_BYTES));
        assert!(pointer.offset_bytes >= self.header.data_start_bytes);
        assert!(pointer.end_bytes() <= self.header.data_end_bytes);
        assert_ne!(
            self.header.newest_log,
            Some(pointer),
            "one log block per batch"
        );
        self.older_logs.rotate_right(1);
        self.older_logs[0] = self.header.newest_log;
        self.header.newest_log = Some(pointer);
        self.log_sequence += 1;
    }
}

impl CacheDevice {
    /// A device in `slot` laid out as `header` says, still rebuilding.
    pub(super) fn new(
        slot: u8,
        io: Box<dyn super::device::DeviceIo>,
        header: &DeviceHeader,
        counters: DeviceCounters,
    ) -> Self {
        let geometry = Geometry::of(header);
        assert!(geometry.start_block < geometry.end_block);
        // The header was checked (`DeviceHeader::decode`) or made here: the
        // hand lies in the data area and a batch fits in it.
        assert!(geometry.batch_blocks_max >= 1);
        assert!(geometry.batch_blocks_max <= geometry.end_block - geometry.start_block);
        assert!(header.data_start_bytes.is_multiple_of(BLOCK_BYTES));
        assert!(header.data_end_bytes.is_multiple_of(BLOCK_BYTES));
        assert!(header.data_end_bytes <= io.size_bytes());
        assert!(
            (geometry.start_block..=geometry.end_block).contains(&header.hand_block),
            "hand {} outside the data area",
            header.hand_block
        );
        Self {
            slot,
            guid: header.device_guid,
            start_block: geometry.start_block,
            end_block: geometry.end_block,
            batch_blocks_max: geometry.batch_blocks_max,
            position: AtomicU64::new((u64::from(header.lap) << 32) | u64::from(header.hand_block)),
            writer: RankedMutex::new(WriterState {
                log_sequence: 0,
                older_logs: [None; LOG_READ_AHEAD_POINTERS],
                swept_at: 0,
                header: header.clone(),
                spare_batch: None,
            }),
            commit_order: RankedMutex::new(()),
            state: AtomicU8::new(STATE_REBUILDING),
            inflight_reads: AtomicU64::new(0),
            commits_in_flight: AtomicU64::new(0),
            consecutive_errors: AtomicU32::new(0),
            error_logged_ms: AtomicU64::new(u64::MAX),
            error_run_logged: std::sync::atomic::AtomicBool::new(false),
            added: std::time::Instant::now(),
            counters,
            space: Space::new(
                geometry.start_block,
                geometry.end_block,
                geometry.batch_blocks_max,
                header.lap,
                header.hand_block,
            ),
            io,
        }
    }

    pub(super) fn position(&self) -> (u32, u32) {
        let p = self.position.load(Ordering::Acquire);
        let (lap, hand) = ((p >> 32) as u32, p as u32);
        // The hand never leaves the data area: it is at most its end (a
        // batch that ended there), and wraps to its start.
        debug_assert!(
            hand >= self.start_block && hand <= self.end_block,
            "hand {hand} outside [{}, {}]",
            self.start_block,
            self.end_block
        );
        (lap, hand)
    }

    pub(super) fn geometry(&self) -> Geometry {
        debug_assert!(self.start_block < self.end_block);
        Geometry {
            start_block: self.start_block,
            end_block: self.end_block,
            batch_blocks_max: self.batch_blocks_max,
        }
    }

    /// Whether a block written in `lap_mod32` is still intact on the device.
    pub(super) fn holds(&self, block: u32, lap_mod32: u32) -> bool {
        debug_assert!(lap_mod32 < 32, "a lap modulo 32");
        let (lap, hand) = self.position();
        self.geometry().holds(lap, hand, block, lap_mod32)
    }

    pub(super) fn holds_location(&self, location: Location) -> bool {
        // Every location the engine makes or decodes has a block (a
        // `Location::new` argument; `decode_log_block` rejects 0).
        debug_assert!(location.asize_blocks() >= 1);
        let last = location.block() + u32::from(location.asize_blocks()) - 1;
        let held = self.holds(location.block(), u32::from(location.lap_mod32()))
            && self.holds(last, u32::from(location.lap_mod32()));
        // Negative space: a location held lies wholly in the data area.
        debug_assert!(
            !held
                || (location.block() >= self.start_block
                    && location.end_block() <= u64::from(self.end_block))
        );
        held
    }

    pub(super) fn is_online(&self) -> bool {
        let state = self.state.load(Ordering::SeqCst);
        debug_assert!(state <= STATE_REMOVED, "device state {state}");
        state == STATE_ONLINE
    }

    /// Taken out by `remove_device` (for good: a device added again is a
    /// new one).
    pub(super) fn is_removed(&self) -> bool {
        let state = self.state.load(Ordering::SeqCst);
        debug_assert!(state <= STATE_REMOVED, "device state {state}");
        state == STATE_REMOVED
    }

    /// Online or rebuilding: what the rebuild has restored may be read.
    pub(super) fn is_readable(&self) -> bool {
        let state = self.state.load(Ordering::SeqCst);
        debug_assert!(state <= STATE_REMOVED, "device state {state}");
        matches!(state, STATE_ONLINE | STATE_REBUILDING)
    }

    /// Counts an I/O error of `op` ("read", "write"); true if it faulted
    /// the device (`DEVICE_ERRORS_MAX` in a row). The first error of a
    /// run is logged (at most every `ERROR_LOG_INTERVAL_MS`), the fault
    /// always: not each record, each change of state.
    pub(super) fn note_error(&self, op: &str, error: &io::Error) -> bool {
        let errors = self.consecutive_errors.fetch_add(1, Ordering::Relaxed) + 1;
        assert!(errors >= 1, "error count wrapped");
        if errors == 1 {
            let now_ms = self.added.elapsed().as_millis() as u64;
            let last_ms = self.error_logged_ms.load(Ordering::Relaxed);
            if last_ms == u64::MAX || now_ms.saturating_sub(last_ms) >= ERROR_LOG_INTERVAL_MS {
                self.error_logged_ms.store(now_ms, Ordering::Relaxed);
                self.error_run_logged.store(true, Ordering::Relaxed);
                log::warn!(
                    "cache device {} ({}): {op} error: {error}; reads go to primary storage",
                    self.slot,
                    self.io.name()
                );
            }
        }
        if errors >= DEVICE_ERRORS_MAX {
            let faulted = self
                .state
                .compare_exchange(
                    STATE_ONLINE,
                    STATE_FAULTED,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                )
                .is_ok();
            if faulted {
                log::error!(
                    "cache device {} ({}): faulted after {errors} I/O errors in a row (last: \
                     {op} error: {error}); it is out of service, reads go to primary storage \
                     until it is removed and added again",
                    self.slot,
                    self.io.name()
                );
            }
            return faulted;
        }
        false
    }

    pub(super) fn note_success(&self) {
        let errors = self.consecutive_errors.load(Ordering::Relaxed);
        if errors != 0 && self.consecutive_errors.swap(0, Ordering::Relaxed) != 0 {
            // A run of errors ended: said only if its start was.
            if self.error_run_logged.swap(false, Ordering::Relaxed) && self.is_online() {
                log::info!(
                    "cache device {} ({}): I/O works again after {errors} error(s)",
                    self.slot,
                    self.io.name()
                );
            }
        }
        debug_assert!(self.state.load(Ordering::Relaxed) <= STATE_REMOVED);
    }

    pub(super) fn data_blocks(&self) -> u64 {
        assert!(self.start_block < self.end_block);
        u64::from(self.end_block - self.start_block)
    }

    pub(super) fn write_header(&self, header: &DeviceHeader) -> io::Result<()> {
        let mut block = AlignedBuf::zeroed(BLOCK_BYTES as usize);
        let bytes: &mut [u8; 4096] = block
            .as_mut_slice()
            .try_into()
            .expect("header block is 4096 bytes");
        // What is written is this device's, pointing into its own data area.
        assert_eq!(header.device_guid, self.guid);
        assert_eq!(
            header.data_start_bytes / BLOCK_BYTES,
            u64::from(self.start_block)
        );
        assert_eq!((header.data_end_bytes / BLOCK_BYTES) as u32, self.end_block);
        assert!((self.start_block..=self.end_block).contains(&header.hand_block));
        if let Some(newest) = header.newest_log {
            assert!(newest.offset_bytes >= header.data_start_bytes);
            assert!(newest.end_bytes() <= header.data_end_bytes);
        }
        header.encode(bytes);
        // Both sides: the block decodes back to exactly this header.
        if cfg!(feature = "invariants") {
            let back = DeviceHeader::decode(&bytes[..]).expect("an encoded header decodes");
            assert_eq!(back.sequence, header.sequence);
            assert_eq!((back.lap, back.hand_block), (header.lap, header.hand_block));
            assert_eq!(back.newest_log, header.newest_log);
        }
        let copy = (header.sequence % 2) as usize;
        assert!(HEADER_COPY_OFFSETS[copy] + BLOCK_BYTES <= header.data_start_bytes);
        self.io.write_at(HEADER_COPY_OFFSETS[copy], &block)
    }
}

/// Where a device's data area lies and how far a batch may reach.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geometry {
    pub start_block: u32,
    pub end_block: u32,
    pub batch_blocks_max: u32,
}

impl Geometry {
    /// The geometry a device header states. The largest batch is in the
    /// header (version 2; implied by the data area in version 1), so it is
    /// the same after a restart, whatever this build would choose today.
    pub(crate) fn of(header: &DeviceHeader) -> Geometry {
        // Checked by `DeviceHeader::decode`, or made so by `fresh_header`.
        assert!(header.data_start_bytes < header.data_end_bytes);
        Geometry {
            start_block: (header.data_start_bytes / BLOCK_BYTES) as u32,
            end_block: (header.data_end_bytes / BLOCK_BYTES) as u32,
            batch_blocks_max: header.batch_blocks_max,
        }
    }

    /// Whether a block written in lap `lap_mod32` is intact when the hand is
    /// at `hand` in lap `lap` (docs/format.md, "Data area").
    pub(crate) fn holds(&self, lap: u32, hand: u32, block: u32, lap_mod32: u32) -> bool {
        debug_assert!(self.start_block < self.end_block);
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

/// Counts an entry the index takes in on `device` (before it is
/// inserted, so that whoever removes it finds it counted).
pub(super) fn account_insert(device: &CacheDevice, location: Location) {
    debug_assert!(location.asize_blocks() >= 1 && location.compression().is_some());
    debug_assert_eq!(location.device(), device.slot);
    device.space.add(location);
}

/// Uncounts an entry the index let go (nothing if the hand overwrote it
/// since: its bytes were written off then).
pub(super) fn account_remove(device: &CacheDevice, location: Location) {
    debug_assert!(location.asize_blocks() >= 1);
    debug_assert_eq!(location.device(), device.slot);
    device.space.remove(location);
}
