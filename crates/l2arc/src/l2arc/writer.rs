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
//! The endurance budget (`l2arc_dwpd`) is a token bucket refilled with time
//! and holding at most one batch of credit.

use std::io;
use std::sync::atomic::Ordering;

use super::cache_device::*;
use super::format::{
    self, BLOCK_BYTES, Compression, Location, LogBlockHeader, LogEntry, LogPointer,
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
        index(&vec![true; records]);
    }
}

/// One record handed to the feeder's batch writer.
pub struct FeedRecord<'a> {
    pub key_hash: u64,
    pub data: &'a [u8],
    pub compression: Compression,
}

impl L2Arc {
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

    pub(super) fn spend_budget(&self, bytes: u64) {
        if self.config.l2arc_dwpd > 0.0 {
            let mut bucket = self.budget_bytes.lock().expect("budget poisoned");
            bucket.0 -= bytes as f64;
        }
    }

    /// Writes one batch of records to the next device of the rotor and
    /// indexes them. Returns the bytes written and how many of `records`
    /// (a prefix) went in; `(0, 0)` when no device is usable.
    pub fn write_batch(&self, records: &[FeedRecord<'_>]) -> io::Result<(u64, usize)> {
        self.write_batch_gated(records, &mut AdmitAll)
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

    pub(super) fn write_batch_to(
        &self,
        device: &CacheDevice,
        records: &[FeedRecord<'_>],
        gate: &mut dyn WriteGate,
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

        let mut indexed = 0usize;
        gate.admit(entries.len(), &mut |flags| {
            assert_eq!(flags.len(), entries.len(), "one flag per record");
            indexed += 1;
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
        assert_eq!(indexed, 1, "a write gate must index its batch exactly once");
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
}
