//! The batch writer: records from the feeder go to the next device of the
//! rotor in one sequential write, then into the index.
//!
//! A batch is laid out in memory (payloads compressed where the dataset
//! asks and it saves 1/8, each padded to whole blocks, the log block last),
//! the hand is advanced and published, the batch written and synced, and
//! only then the device header is rewritten to point at the new log block.
//! A crash anywhere in between leaves a header that points at the previous,
//! complete log block. The records are indexed last, through a
//! [`WriteGate`] that the caller uses to leave out records made stale while
//! the batch was in flight.
//!
//! The steps come in three parts so that the feeder can encode one batch
//! while the one before is written: `prepare_batch` (lay out, encode,
//! advance the hand and the log chain, under the writer mutex),
//! `commit_batch` (the durable write and the header, no lock), and
//! `finish_batch` (index, count, sweep; or, on a failed write, put the
//! chain back to before the batch).
//!
//! The endurance budget (`l2arc_dwpd`) is a token bucket refilled with time
//! and holding at most one batch of credit.

use std::io;
use std::sync::atomic::Ordering;

use super::cache_device::*;
use super::format::{
    self, BLOCK_BYTES, Compression, DeviceHeader, Location, LogBlockHeader, LogEntry, LogPointer,
};
use super::index::IndexEntry;
use super::*;
use crate::buf::AlignedBuf;

/// Decides which records of a batch, once it is on the device, are indexed
/// (see [`L2Arc::write_batch_gated`]).
///
/// Lock order. The writer calls `admit` holding the device's writer mutex;
/// `admit` takes the caller's own lock (the read path's log of recent
/// invalidations), decides, and calls `index`, which takes the index's
/// shard locks: writer mutex -> caller's lock -> index shard. A write
/// through the cache takes the caller's lock and then the ARC and index
/// shards, never the writer mutex, so the order holds everywhere. Holding
/// the caller's lock across the decision and the indexing is what makes a
/// record copied before a write unfindable once that write has returned.
pub trait WriteGate {
    /// Called once per batch with its record count; must call `index`
    /// exactly once, with one flag per record (true: index it).
    fn admit(&mut self, records: usize, index: &mut dyn FnMut(&[bool]));
}

/// Indexes every record of a batch.
struct AdmitAll;

impl WriteGate for AdmitAll {
    fn admit(&mut self, records: usize, index: &mut dyn FnMut(&[bool])) {
        // Only a batch with records on the device is admitted.
        debug_assert!(records >= 1);
        index(&vec![true; records]);
    }
}

/// One record handed to the feeder's batch writer.
pub struct FeedRecord<'a> {
    /// Hash of the record's identity.
    pub key_hash: u64,
    /// The record's bytes, uncompressed.
    pub data: &'a [u8],
    /// How to store it.
    pub compression: Compression,
    /// Stored plain and at least this long, it is written with a sector
    /// table (`format::SECTOR_TABLE_RECORD_BYTES_MIN` unless its dataset
    /// asks otherwise).
    pub sector_table_min_bytes: u32,
}

impl L2Arc {
    /// How many bytes the feeder may write now to the next device of the
    /// rotor: the per-feed cap, the smallest batch size, and the endurance
    /// budget.
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
        let budget = self.capped_budget_bytes(batch_bytes);
        assert!(
            budget <= batch_bytes,
            "a feed never exceeds the smallest batch"
        );
        budget
    }

    /// [`feed_budget_bytes`](Self::feed_budget_bytes) for one device (its
    /// own batch size); 0 unless it is online. The endurance budget is
    /// shared: each device's feeder reads the same credit, so devices fed
    /// at once may overdraw it by a batch each, which the next refills
    /// wait out (the rate over a day holds).
    pub(crate) fn feed_budget_bytes_for(&self, device: &CacheDevice) -> u64 {
        if !device.is_online() {
            return 0;
        }
        let batch_bytes = u64::from(device.batch_blocks_max) * BLOCK_BYTES;
        let budget = self.capped_budget_bytes(batch_bytes);
        assert!(budget <= batch_bytes);
        budget
    }

    /// `batch_bytes` capped by `l2arc_write_max` and the endurance credit.
    fn capped_budget_bytes(&self, batch_bytes: u64) -> u64 {
        // The credit holds up to a whole batch whatever `l2arc_write_max`.
        let mut budget = self.endurance_capped_bytes(batch_bytes);
        let write_max_bytes = self.live.write_max_bytes();
        if write_max_bytes > 0 {
            budget = budget.min(write_max_bytes);
        }
        debug_assert!(budget <= batch_bytes);
        budget
    }

    /// `batch_bytes` capped by the endurance credit (`l2arc_dwpd`), which
    /// refills with time and holds at most one batch.
    pub(super) fn endurance_capped_bytes(&self, batch_bytes: u64) -> u64 {
        let mut budget = batch_bytes;
        if self.live.dwpd() > 0.0 {
            let per_sec = self.dwpd_bytes_per_day() as f64 / 86_400.0;
            let mut bucket = self.budget_bytes.lock().expect("budget poisoned");
            let now = std::time::Instant::now();
            // Refill, holding at most one batch of credit.
            bucket.0 =
                (bucket.0 + per_sec * (now - bucket.1).as_secs_f64()).min(batch_bytes as f64);
            bucket.1 = now;
            // The bucket holds at most one batch of credit.
            assert!(bucket.0 <= batch_bytes as f64);
            budget = budget.min(bucket.0 as u64);
        }
        debug_assert!(budget <= batch_bytes);
        budget
    }

    /// `l2arc_dwpd` in bytes: what the online devices may be written per
    /// day (0 = unlimited).
    pub(crate) fn dwpd_bytes_per_day(&self) -> u64 {
        if self.live.dwpd() <= 0.0 {
            return 0;
        }
        let online_bytes: u64 = self
            .all_devices()
            .iter()
            .filter(|d| d.is_online())
            .map(|d| d.data_blocks() * BLOCK_BYTES)
            .sum();
        debug_assert!(online_bytes.is_multiple_of(BLOCK_BYTES));
        (self.live.dwpd() * online_bytes as f64) as u64
    }

    /// Bytes the endurance budget lets the feeder write now (as of its last
    /// refill; at most one batch). 0 when there is no budget.
    pub(crate) fn dwpd_credit_bytes(&self) -> u64 {
        if self.live.dwpd() <= 0.0 {
            return 0;
        }
        let bucket = self.budget_bytes.lock().expect("budget poisoned");
        debug_assert!(!bucket.0.is_nan());
        bucket.0.max(0.0) as u64
    }

    pub(super) fn spend_budget(&self, bytes: u64) {
        // A finished batch: at least its log block.
        debug_assert!(bytes >= BLOCK_BYTES && bytes.is_multiple_of(BLOCK_BYTES));
        if self.live.dwpd() > 0.0 {
            let mut bucket = self.budget_bytes.lock().expect("budget poisoned");
            bucket.0 -= bytes as f64;
        }
    }

    /// Writes one batch of records to the next device of the rotor and
    /// indexes them. Returns the bytes written and how many of `records`
    /// (a prefix) went in; `(0, 0)` when no device is usable.
    pub fn write_batch(&self, records: &[FeedRecord<'_>]) -> io::Result<(u64, usize)> {
        let written = self.write_batch_gated(records, &mut AdmitAll);
        debug_assert!(
            written.as_ref().is_err() || written.as_ref().is_ok_and(|w| w.1 <= records.len())
        );
        written
    }

    /// [`write_batch`](Self::write_batch), but once the batch is on the
    /// device, `gate(n, index)` decides which of its `n` records are
    /// indexed by calling `index` with one flag per record. The caller
    /// holds its own lock around that call, so that a record it has learnt
    /// is stale (written to since it was copied) is never findable.
    pub fn write_batch_gated(
        &self,
        records: &[FeedRecord<'_>],
        gate: &mut dyn WriteGate,
    ) -> io::Result<(u64, usize)> {
        let devices = self.all_devices();
        let online: Vec<_> = devices.into_iter().filter(|d| d.is_online()).collect();
        if online.is_empty() {
            return Ok((0, 0));
        }
        let turn = self.rotor.fetch_add(1, Ordering::Relaxed) as usize % online.len();
        debug_assert!(turn < online.len());
        self.write_batch_gated_to(&online[turn], records, gate)
    }

    /// [`write_batch_gated`](Self::write_batch_gated) to one device (its
    /// own feeder's), counting its errors and faulting it past the limit.
    pub(crate) fn write_batch_gated_to(
        &self,
        device: &CacheDevice,
        records: &[FeedRecord<'_>],
        gate: &mut dyn WriteGate,
    ) -> io::Result<(u64, usize)> {
        if records.is_empty() {
            return Ok((0, 0));
        }
        let written = self.write_batch_to(device, records, gate);
        // A prefix of the records, in whole blocks (its log block at least).
        if let Ok((bytes, n)) = written {
            assert!(n <= records.len() && bytes.is_multiple_of(BLOCK_BYTES));
            assert!(n == 0 || bytes >= BLOCK_BYTES);
        }
        written
    }

    /// Writes one batch to `device` (see the module comment for the order
    /// of the steps and why): prepared, committed and finished in turn.
    pub(super) fn write_batch_to(
        &self,
        device: &CacheDevice,
        records: &[FeedRecord<'_>],
        gate: &mut dyn WriteGate,
    ) -> io::Result<(u64, usize)> {
        let _order = device.commit_order.lock().expect("commit order poisoned");
        let prepared = match self.prepare_batch(device, records) {
            Ok(Some(prepared)) => prepared,
            Ok(None) => return Ok((0, 0)),
            Err(e) => {
                self.note_write_error(device, &e);
                return Err(e);
            }
        };
        debug_assert!(prepared.records() <= records.len());
        let result = commit_batch(device, &prepared);
        self.finish_batch(device, prepared, result, gate)
    }

    /// Lays out and encodes the largest prefix of `records` that fits a
    /// batch of `device`, into a buffer of its own, and advances the
    /// writer past it: the hand (published), the log chain and the header
    /// to write once the batch is durable. Nothing is written to the
    /// device unless the hand wraps (the wrap is published first). `None`
    /// when the device is offline or nothing fits. The caller holds the
    /// device's `commit_order` until the batch is finished.
    pub(crate) fn prepare_batch(
        &self,
        device: &CacheDevice,
        records: &[FeedRecord<'_>],
    ) -> io::Result<Option<PreparedBatch>> {
        let mut writer = device.writer.lock().expect("writer poisoned");
        if !device.is_online() {
            return Ok(None);
        }
        let payloads = lay_out(records, device.batch_blocks_max);
        if payloads.is_empty() {
            return Ok(None);
        }
        let data_blocks: u32 = payloads.iter().map(Payload::asize_blocks).sum();
        let log_bytes = format::log_block_size_bytes(payloads.len());
        let total_blocks = data_blocks + (log_bytes as u64 / BLOCK_BYTES) as u32;
        assert!(
            total_blocks <= device.batch_blocks_max,
            "batch of {total_blocks} blocks over {}",
            device.batch_blocks_max
        );
        let (lap, hand) = advance_hand(device, &mut writer, total_blocks)?;
        debug_assert!(payloads.len() <= records.len());
        let position = BatchPosition {
            lap,
            hand,
            total_blocks,
        };
        let state = &mut *writer;
        let mut buffer = state
            .spare_batch
            .take()
            .unwrap_or_else(|| AlignedBuf::zeroed(0));
        let encoded = encode_batch(
            device,
            (&state.header, state.log_sequence, state.older_logs),
            &mut buffer,
            &payloads,
            position,
        );
        verify_batch(device, &buffer, &encoded, hand);
        let before = (state.header.clone(), state.log_sequence, state.older_logs);
        state.header.sequence += 1;
        state.header.hand_block = hand + total_blocks;
        state.header.lap = lap;
        state.push_log(encoded.log_pointer);
        let header = state.header.clone();
        // The header to write names this batch's log block, at its end.
        assert_eq!(header.newest_log, Some(encoded.log_pointer));
        assert_eq!(
            encoded.log_pointer.end_bytes(),
            u64::from(hand + total_blocks) * BLOCK_BYTES
        );
        let mut compressed_bytes = (0u64, 0u64);
        for (entry, payload) in encoded.entries.iter().zip(&payloads) {
            if payload.compression != Compression::Off {
                compressed_bytes.0 += payload.logical_bytes as u64;
                compressed_bytes.1 += u64::from(entry.location.asize_blocks()) * BLOCK_BYTES;
            }
        }
        Ok(Some(PreparedBatch {
            buffer,
            position,
            header,
            entries: encoded.entries,
            compressed_bytes,
            log_sequence: state.log_sequence,
            before,
        }))
    }

    /// After [`commit_batch`]: on success indexes the batch's records that
    /// `gate` admits (unless the device left meanwhile), counts it and
    /// sweeps when the hand has gone far enough; on failure puts the
    /// writer's log chain back to what it was before the batch, so that no
    /// header ever names its log block. Either way the buffer goes back to
    /// the writer. Counts the device's errors, faulting it past the limit.
    pub(crate) fn finish_batch(
        &self,
        device: &CacheDevice,
        prepared: PreparedBatch,
        result: io::Result<()>,
        gate: &mut dyn WriteGate,
    ) -> io::Result<(u64, usize)> {
        let PreparedBatch {
            buffer,
            position,
            header: _,
            entries,
            compressed_bytes,
            log_sequence,
            before,
        } = prepared;
        let mut writer = device.writer.lock().expect("writer poisoned");
        if writer.spare_batch.is_none() {
            writer.spare_batch = Some(buffer);
        }
        if let Err(e) = result {
            // Batches prepared after this one chain to its log block: they
            // are dropped by their feeder, and the chain resumes here.
            assert!(writer.log_sequence >= log_sequence);
            (writer.header, writer.log_sequence, writer.older_logs) = before;
            drop(writer);
            self.note_write_error(device, &e);
            return Err(e);
        }
        if device.is_removed() {
            return Ok((0, 0));
        }
        assert!(!entries.is_empty() && position.total_blocks >= 1);
        self.index_batch(device, &entries, gate);
        device.space.assert_within_data_area(device.slot);
        let c = &device.counters;
        c.compressed_lsize_written
            .fetch_add(compressed_bytes.0, Ordering::Relaxed);
        c.compressed_asize_written
            .fetch_add(compressed_bytes.1, Ordering::Relaxed);
        let BatchPosition {
            lap,
            hand,
            total_blocks,
        } = position;
        let bytes = u64::from(total_blocks) * BLOCK_BYTES;
        c.write_bytes.fetch_add(bytes, Ordering::Relaxed);
        c.feeds.fetch_add(1, Ordering::Relaxed);
        device.note_success();
        self.spend_budget(bytes);

        // Every sixteenth of a lap, drop the entries the hand swept over.
        let progress = u64::from(lap) * u64::from(SWEEPS_PER_LAP)
            + u64::from(hand + total_blocks - device.start_block) * u64::from(SWEEPS_PER_LAP)
                / device.data_blocks();
        if progress > writer.swept_at {
            writer.swept_at = progress;
            drop(writer);
            self.sweep(device);
        }
        Ok((bytes, entries.len()))
    }

    /// Counts a failed write to `device`, faulting it past the limit.
    pub(crate) fn note_write_error(&self, device: &CacheDevice, e: &io::Error) {
        let before = device.counters.writes_error.fetch_add(1, Ordering::Relaxed);
        debug_assert!(before < u64::MAX);
        if device.note_error("write", e) {
            self.forget_device(device);
        }
    }

    /// Indexes the records of a batch on `device` that `gate` admits.
    fn index_batch(&self, device: &CacheDevice, entries: &[LogEntry], gate: &mut dyn WriteGate) {
        let mut indexed = 0usize;
        gate.admit(entries.len(), &mut |flags| {
            assert_eq!(flags.len(), entries.len(), "one flag per record");
            indexed += 1;
            for (entry, _) in entries.iter().zip(flags).filter(|(_, keep)| **keep) {
                // The index side of the pair: an entry names blocks of this
                // device's data area, as the batch placed them.
                debug_assert_eq!(entry.location.device(), device.slot);
                debug_assert!(entry.location.block() >= device.start_block);
                debug_assert!(entry.location.end_block() <= u64::from(device.end_block));
                // Counted before it is found: a reader that drops it at
                // once uncounts what was counted.
                account_insert(device, entry.location);
                let old = self.index.insert(IndexEntry {
                    key_hash: entry.key_hash,
                    location: entry.location.0,
                    checksum: entry.checksum,
                });
                if let Some(old) = old {
                    let old_location = Location(old.location);
                    if let Some(old_device) = self.device(old_location.device()) {
                        account_remove(&old_device, old_location);
                    }
                }
            }
        });
        assert_eq!(indexed, 1, "a write gate must index its batch exactly once");
    }
}

/// The largest prefix of `records` (plain) that fits a batch of
/// `max_blocks`, as `lay_out` fits it: each record's blocks and whether it
/// has a sector table, and the blocks of them all.
#[cfg(feature = "internals")]
fn lay_out_plain(records: &[LogOnlyRecord], max_blocks: u32) -> (Vec<(u32, bool)>, u32) {
    let mut asizes: Vec<(u32, bool)> = Vec::with_capacity(records.len());
    let mut blocks_total = 0u32;
    for record in records {
        let stored_bytes = record.stored_bytes as usize;
        let sectored = stored_bytes >= format::SECTOR_TABLE_RECORD_BYTES_MIN;
        let payload_blocks = stored_bytes.div_ceil(BLOCK_BYTES as usize).max(1) as u32;
        let asize_blocks = payload_blocks + u32::from(sectored);
        if !batch_fits(blocks_total, asize_blocks, asizes.len() + 1, max_blocks) {
            break;
        }
        blocks_total += asize_blocks;
        asizes.push((asize_blocks, sectored));
    }
    debug_assert!(blocks_total <= max_blocks);
    (asizes, blocks_total)
}

/// A record of a log-only batch ([`L2Arc::write_log_only_batch`]): its
/// identity, stored length and checksum, without its bytes.
#[cfg(feature = "internals")]
#[derive(Clone, Copy, Debug)]
pub struct LogOnlyRecord {
    /// Hash of the record's identity.
    pub key_hash: u64,
    /// Its stored (plain) length.
    pub stored_bytes: u32,
    /// [`format::record_checksum`] of the bytes the device holds for it.
    pub checksum: u32,
}

#[cfg(feature = "internals")]
impl L2Arc {
    /// For benchmarks of the rebuild (feature `internals`): writes the next
    /// batch of the rotor exactly as [`write_batch`](Self::write_batch)
    /// lays it out (the same fit, locations, log block and header update),
    /// but writes only its log block: the records' blocks keep whatever the
    /// device holds there (holes in a sparse file read as zeros), and their
    /// entries carry the checksums given. Nothing is indexed, and nothing
    /// is synced (call [`sync_devices`](Self::sync_devices) at the end).
    /// Returns the bytes the batch spans and how many of `records` (a
    /// prefix) went in.
    pub fn write_log_only_batch(&self, records: &[LogOnlyRecord]) -> io::Result<(u64, usize)> {
        let online: Vec<_> = self
            .all_devices()
            .into_iter()
            .filter(|d| d.is_online())
            .collect();
        if online.is_empty() || records.is_empty() {
            return Ok((0, 0));
        }
        let turn = self.rotor.fetch_add(1, Ordering::Relaxed) as usize % online.len();
        let device = &online[turn];
        let _order = device.commit_order.lock().expect("commit order poisoned");
        let mut writer = device.writer.lock().expect("writer poisoned");
        let (asizes, blocks_total) = lay_out_plain(records, device.batch_blocks_max);
        if asizes.is_empty() {
            return Ok((0, 0));
        }
        let log_bytes = format::log_block_size_bytes(asizes.len());
        let total_blocks = blocks_total + (log_bytes as u64 / BLOCK_BYTES) as u32;
        let (lap, hand) = advance_hand(device, &mut writer, total_blocks)?;
        let mut entries = Vec::with_capacity(asizes.len());
        let mut at_block = 0u32;
        for (record, &(asize_blocks, sectored)) in records.iter().zip(&asizes) {
            let location = payload_location(
                record.stored_bytes as usize,
                Compression::Off,
                sectored,
                (hand + at_block, lap, device.slot),
            );
            entries.push(LogEntry {
                key_hash: record.key_hash,
                location,
                checksum: record.checksum,
            });
            at_block += asize_blocks;
        }
        let log_header = LogBlockHeader {
            device_guid: device.guid,
            sequence: writer.log_sequence + 1,
            lap,
            first_block: hand,
            prev: writer.header.newest_log,
            read_ahead: writer.older_logs,
            entry_count: entries.len() as u32,
            size_bytes: log_bytes as u32,
        };
        let mut log = AlignedBuf::zeroed(log_bytes);
        let crc = format::encode_log_block(&log_header, &entries, log.as_mut_slice());
        let log_offset_bytes = u64::from(hand + at_block) * BLOCK_BYTES;
        // The log block ends the batch, as `write_batch` lays it out.
        assert_eq!(
            log_offset_bytes + log_bytes as u64,
            u64::from(hand + total_blocks) * BLOCK_BYTES
        );
        device.io.write_at(log_offset_bytes, &log)?;
        let log_pointer = LogPointer {
            offset_bytes: log_offset_bytes,
            size_bytes: log_bytes as u32,
            crc,
        };
        let mut header = writer.header.clone();
        header.sequence += 1;
        header.hand_block = hand + total_blocks;
        header.lap = lap;
        header.newest_log = Some(log_pointer);
        device.write_header(&header)?;
        header.newest_log = writer.header.newest_log;
        writer.header = header;
        writer.push_log(log_pointer);
        Ok((u64::from(total_blocks) * BLOCK_BYTES, entries.len()))
    }

    /// Syncs every device (after [`write_log_only_batch`](Self::write_log_only_batch)).
    pub fn sync_devices(&self) -> io::Result<()> {
        let devices = self.all_devices();
        debug_assert!(devices.len() <= DEVICES_MAX);
        for device in devices {
            device.io.sync()?;
        }
        Ok(())
    }
}

/// One record as it will be stored: framed (compressed) or plain bytes
/// (borrowed from the feeder's copy, not copied again).
struct Payload<'a> {
    key_hash: u64,
    stored: std::borrow::Cow<'a, [u8]>,
    compression: Compression,
    logical_bytes: usize,
    /// Followed by a sector table block (plain and large: see
    /// `format::SECTOR_TABLE_RECORD_BYTES_MIN`).
    sectored: bool,
}

impl Payload<'_> {
    fn payload_blocks(&self) -> u32 {
        // A sector table only behind a plain payload (`lay_out`).
        debug_assert!(!self.sectored || self.compression == Compression::Off);
        self.stored.len().div_ceil(BLOCK_BYTES as usize).max(1) as u32
    }

    fn asize_blocks(&self) -> u32 {
        // A compressed payload is a frame: its 8-byte header at least.
        debug_assert!(self.compression == Compression::Off || self.stored.len() >= 8);
        self.payload_blocks() + u32::from(self.sectored)
    }
}

/// The largest prefix of `records` that fits a batch of `max_blocks`
/// (with its log block), each compressed where its dataset asks and it pays.
fn lay_out<'a>(records: &[FeedRecord<'a>], max_blocks: u32) -> Vec<Payload<'a>> {
    let mut payloads: Vec<Payload> = Vec::with_capacity(records.len());
    let mut compressed = Vec::new();
    let mut blocks_total = 0u32;
    for record in records {
        let (stored, compression) = if record.compression != Compression::Off
            && format::compress(record.data, record.compression, &mut compressed)
        {
            let mut framed = vec![0u8; compressed.len() + 8];
            let n =
                format::encode_compressed_frame(record.data.len() as u32, &compressed, &mut framed);
            framed.truncate(n);
            (std::borrow::Cow::Owned(framed), record.compression)
        } else {
            (std::borrow::Cow::Borrowed(record.data), Compression::Off)
        };
        let sectored = compression == Compression::Off
            && stored.len() >= record.sector_table_min_bytes as usize;
        let payload = Payload {
            key_hash: record.key_hash,
            stored,
            compression,
            logical_bytes: record.data.len(),
            sectored,
        };
        let asize_blocks = payload.asize_blocks();
        if !batch_fits(blocks_total, asize_blocks, payloads.len() + 1, max_blocks) {
            break;
        }
        blocks_total += asize_blocks;
        payloads.push(payload);
    }
    // The batch with its log block fits the device's largest batch.
    debug_assert!(
        payloads.is_empty()
            || blocks_total
                + format::log_block_size_bytes(payloads.len()) as u32 / BLOCK_BYTES as u32
                <= max_blocks
    );
    payloads
}

/// Whether a batch of `blocks_total` blocks of records still fits
/// `max_blocks` with one more record of `asize_blocks` and the log block
/// for `entries` records.
fn batch_fits(blocks_total: u32, asize_blocks: u32, entries: usize, max_blocks: u32) -> bool {
    debug_assert!(entries >= 1 && asize_blocks >= 1);
    let log_blocks = format::log_block_size_bytes(entries) as u32 / BLOCK_BYTES as u32;
    blocks_total + asize_blocks + log_blocks <= max_blocks
        && asize_blocks <= u32::from(format::MAX_ASIZE_BLOCKS)
}

/// The location of a payload of `stored_bytes` at `(block, lap, slot)`.
fn payload_location(
    stored_bytes: usize,
    compression: Compression,
    sectored: bool,
    at: (u32, u32, u8),
) -> Location {
    let (block, lap, slot) = at;
    let payload_blocks = stored_bytes.div_ceil(BLOCK_BYTES as usize).max(1) as u16;
    let allocated = usize::from(payload_blocks) * BLOCK_BYTES as usize;
    assert!(stored_bytes <= allocated && allocated - stored_bytes < BLOCK_BYTES as usize);
    debug_assert!(!sectored || compression == Compression::Off);
    let tail_bytes = (allocated - stored_bytes) as u16;
    if sectored {
        Location::new_sectored(block, lap, slot, payload_blocks, tail_bytes)
    } else {
        Location::new(block, lap, slot, payload_blocks, compression, tail_bytes)
    }
}

/// Moves the write hand over the next `total_blocks` and publishes it
/// before anything is written there, wrapping to the start of the data area
/// when the batch does not fit before its end. Returns (lap, first block).
fn advance_hand(
    device: &CacheDevice,
    writer: &mut WriterState,
    total_blocks: u32,
) -> io::Result<(u32, u32)> {
    // A batch is at least its log block and at most the largest batch,
    // which fits the data area (`CacheDevice::new`).
    assert!(total_blocks >= 1 && total_blocks <= device.batch_blocks_max);
    let (mut lap, mut hand) = device.position();
    if hand + total_blocks > device.end_block {
        lap = lap.wrapping_add(1);
        hand = device.start_block;
        // Publish the wrap on the device before writing over the start of
        // the data area: until then the header's rule holds the records
        // there valid, and a batch cut short by a crash would leave other
        // bytes where a rebuild expects them. At (lap + 1, start) they fall
        // in the margin ahead of the hand instead.
        let mut header = writer.header.clone();
        header.sequence += 1;
        header.hand_block = hand;
        header.lap = lap;
        device.write_header(&header)?;
        device.io.sync()?;
        writer.header = header;
    }
    assert!(hand >= device.start_block && hand + total_blocks <= device.end_block);
    // What the hand is about to overwrite stops counting before readers
    // stop trusting it (`space`).
    device
        .space
        .advance(device.position(), (lap, hand + total_blocks));
    device.position.store(
        (u64::from(lap) << 32) | u64::from(hand + total_blocks),
        Ordering::Release,
    );
    Ok((lap, hand))
}

/// Copies a payload into its blocks of a batch (`out`, whole blocks),
/// zeroes the padding after it, writes its sector table into the last
/// block if it has one, and returns its location at `(block, lap, slot)`.
fn place_payload(payload: &Payload<'_>, out: &mut [u8], at: (u32, u32, u8)) -> Location {
    let allocated = payload.payload_blocks() as usize * BLOCK_BYTES as usize;
    // `out` is exactly the payload's blocks (and its table block).
    debug_assert_eq!(
        out.len(),
        payload.asize_blocks() as usize * BLOCK_BYTES as usize
    );
    assert!(payload.stored.len() <= allocated);
    let (blocks, table) = out.split_at_mut(allocated);
    blocks[..payload.stored.len()].copy_from_slice(&payload.stored);
    // The buffer is reused: padding must not carry an older batch.
    blocks[payload.stored.len()..].fill(0);
    if payload.sectored {
        format::encode_sector_table(payload.key_hash, blocks, table);
    } else {
        debug_assert!(table.is_empty());
    }
    payload_location(
        payload.stored.len(),
        payload.compression,
        payload.sectored,
        at,
    )
}

/// Where a batch goes: the lap and first block of the hand, and its size.
#[derive(Clone, Copy)]
struct BatchPosition {
    lap: u32,
    hand: u32,
    total_blocks: u32,
}

/// A batch encoded into a buffer of its own, the writer already past it,
/// waiting for its device write ([`commit_batch`]) and then its indexing
/// ([`L2Arc::finish_batch`]). The feeder prepares the next batch while
/// this one is written (`feeder`).
pub(crate) struct PreparedBatch {
    buffer: AlignedBuf,
    position: BatchPosition,
    /// The device header naming this batch's log block, written once the
    /// batch is durable.
    header: DeviceHeader,
    entries: Vec<LogEntry>,
    /// Logical and allocated bytes of the records stored compressed.
    compressed_bytes: (u64, u64),
    /// This batch's log sequence.
    log_sequence: u64,
    /// The writer's header, log sequence and older logs before this batch.
    before: (
        DeviceHeader,
        u64,
        [Option<LogPointer>; format::LOG_READ_AHEAD_POINTERS],
    ),
}

impl PreparedBatch {
    /// Records in the batch.
    pub(crate) fn records(&self) -> usize {
        debug_assert!(!self.entries.is_empty(), "a prepared batch has records");
        self.entries.len()
    }

    /// Bytes of device the batch takes.
    pub(crate) fn bytes(&self) -> u64 {
        debug_assert_eq!(
            self.buffer.len() as u64,
            u64::from(self.position.total_blocks) * BLOCK_BYTES
        );
        u64::from(self.position.total_blocks) * BLOCK_BYTES
    }
}

/// Writes a prepared batch and makes it durable, then the header that
/// names its log block: a header never names a log block that a crash can
/// lose. Takes no lock: the writer's state was settled by
/// [`L2Arc::prepare_batch`], and the caller holds the device's
/// `commit_order` from prepare to finish, so batches of one device are
/// committed in the order they were prepared, one at a time.
pub(crate) fn commit_batch(device: &CacheDevice, prepared: &PreparedBatch) -> io::Result<()> {
    let BatchPosition {
        hand, total_blocks, ..
    } = prepared.position;
    let offset = u64::from(hand) * BLOCK_BYTES;
    let end = offset + u64::from(total_blocks) * BLOCK_BYTES;
    // The write side of the pair: whole aligned blocks in the data area
    // from an aligned buffer, and the header written after it names the
    // log block that ends it, with the CRC of its bytes as written.
    assert!(hand >= device.start_block && hand + total_blocks <= device.end_block);
    assert_eq!(prepared.buffer.len() as u64, end - offset);
    debug_assert!(
        prepared
            .buffer
            .as_slice()
            .as_ptr()
            .addr()
            .is_multiple_of(BLOCK_BYTES as usize)
    );
    let log = prepared
        .header
        .newest_log
        .expect("a batch's header names its log block");
    assert!(log.offset_bytes >= offset && log.end_bytes() == end);
    if cfg!(feature = "invariants") {
        let at = (log.offset_bytes - offset) as usize;
        let bytes = &prepared.buffer[at..at + log.size_bytes as usize];
        assert_eq!(format::log_block_content_crc(bytes), log.crc);
        let (lb, entries) =
            format::decode_log_block(bytes, device.guid).expect("the log block as written decodes");
        assert_eq!(lb.first_block, hand);
        assert_eq!(entries.len(), prepared.entries.len());
    }
    device.counters.writes_sent.fetch_add(1, Ordering::Relaxed);
    device.io.write_at_durable(offset, &prepared.buffer)?;
    device.write_header(&prepared.header)
}

/// A batch laid out in the writer's buffer: records, then the log block.
struct EncodedBatch {
    entries: Vec<LogEntry>,
    /// Where the log block lies, in blocks from the batch's start.
    log_block: u32,
    log_pointer: LogPointer,
}

/// Lays `payloads` and their log block out in `batch` (resized to the
/// batch; every byte written: payloads, zeroed padding, the log block).
/// `log` is the device header as last written, the newest log sequence and
/// the log blocks before the newest (the read-ahead hints).
fn encode_batch(
    device: &CacheDevice,
    log: (
        &super::format::DeviceHeader,
        u64,
        [Option<LogPointer>; format::LOG_READ_AHEAD_POINTERS],
    ),
    batch: &mut AlignedBuf,
    payloads: &[Payload<'_>],
    position: BatchPosition,
) -> EncodedBatch {
    let BatchPosition {
        lap,
        hand,
        total_blocks,
    } = position;
    let total_bytes = total_blocks as usize * BLOCK_BYTES as usize;
    debug_assert!(!payloads.is_empty());
    if batch.capacity_bytes() < total_bytes {
        *batch = AlignedBuf::zeroed(total_bytes);
    }
    batch.set_len(total_bytes);
    let bytes = batch.as_mut_slice();
    let mut entries = Vec::with_capacity(payloads.len());
    let mut at_block = 0u32;
    for payload in payloads {
        let asize_blocks = payload.asize_blocks() as u16;
        let offset = at_block as usize * BLOCK_BYTES as usize;
        let out = &mut bytes[offset..offset + usize::from(asize_blocks) * BLOCK_BYTES as usize];
        let location = place_payload(payload, out, (hand + at_block, lap, device.slot));
        debug_assert_eq!(location.asize_blocks(), asize_blocks);
        let stored = &bytes[offset..offset + location.stored_bytes()];
        entries.push(LogEntry {
            key_hash: payload.key_hash,
            location,
            checksum: format::record_checksum(payload.key_hash, stored),
        });
        at_block += u32::from(asize_blocks);
    }
    let (header, log_sequence, older_logs) = log;
    let log_bytes = format::log_block_size_bytes(entries.len());
    let log_header = LogBlockHeader {
        device_guid: device.guid,
        sequence: log_sequence + 1,
        lap,
        first_block: hand,
        prev: header.newest_log,
        read_ahead: older_logs,
        entry_count: entries.len() as u32,
        size_bytes: log_bytes as u32,
    };
    let log_offset = at_block as usize * BLOCK_BYTES as usize;
    assert_eq!(
        log_offset + log_bytes,
        total_bytes,
        "the log block ends the batch"
    );
    let crc = format::encode_log_block(
        &log_header,
        &entries,
        &mut bytes[log_offset..log_offset + log_bytes],
    );
    EncodedBatch {
        entries,
        log_block: at_block,
        log_pointer: LogPointer {
            offset_bytes: u64::from(hand + at_block) * BLOCK_BYTES,
            size_bytes: log_bytes as u32,
            crc,
        },
    }
}

/// Checks a batch right before it is written (TigerBeetle's rule: assert
/// data just before it leaves us): the log block decodes, with every check
/// a rebuild will apply, back to exactly the entries we index, and every
/// record's bytes match the checksum its entry carries. A failure here is a
/// bug in the writer, never bad input.
fn verify_batch(device: &CacheDevice, batch: &[u8], encoded: &EncodedBatch, hand: u32) {
    let offset = encoded.log_block as usize * BLOCK_BYTES as usize;
    // The buffer is the batch, whole aligned blocks for O_DIRECT, the log
    // block last.
    assert_eq!(
        batch.len(),
        offset + encoded.log_pointer.size_bytes as usize
    );
    debug_assert!(batch.as_ptr().addr().is_multiple_of(BLOCK_BYTES as usize));
    let log = &batch[offset..offset + encoded.log_pointer.size_bytes as usize];
    let (header, decoded) = format::decode_log_block(log, device.guid)
        .unwrap_or_else(|e| panic!("the writer encoded a log block that does not decode: {e}"));
    assert_eq!(header.first_block, hand);
    assert_eq!(
        format::log_block_content_crc(log),
        encoded.log_pointer.crc,
        "log block content CRC"
    );
    assert_eq!(decoded.len(), encoded.entries.len());
    for (entry, back) in encoded.entries.iter().zip(&decoded) {
        assert_eq!(entry.key_hash, back.key_hash);
        assert_eq!(entry.location.0, back.location.0);
        assert_eq!(entry.checksum, back.checksum);
        let start = (entry.location.block() - hand) as usize * BLOCK_BYTES as usize;
        let stored = &batch[start..start + entry.location.stored_bytes()];
        assert_eq!(
            format::record_checksum(entry.key_hash, stored),
            entry.checksum,
            "record bytes changed between encoding and writing"
        );
    }
}
