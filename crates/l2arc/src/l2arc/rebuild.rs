//! Rebuilding the index from a device's log at open (persistent L2ARC).
//!
//! The header points at the newest log block; each log block points at the
//! one before. The walk checks every block (checksum, device guid, sequence
//! strictly falling, location still intact for the hand) and stops at the
//! first that fails: what lies behind a bad block cannot be trusted to
//! belong to this log. Entries the hand has overwritten since are skipped,
//! and a newer entry for the same record wins over an older one. Reading
//! log blocks runs a couple of blocks ahead of restoring them, in a second
//! thread, so the device and the index work at the same time; reads go on
//! meanwhile and see what has been restored so far.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::cache_device::*;
use super::format::{self, BLOCK_BYTES, Compression, LogEntry, LogPointer};
use super::index::IndexEntry;
use super::*;
use crate::buf::AlignedBuf;

impl L2Arc {
    /// Walks the device's log from the newest block back and restores every
    /// entry the hand has not overwritten. Reads are served meanwhile: what is
    /// not restored yet is a miss.
    ///
    /// Reading and checking log blocks (I/O, CRC, decoding) runs in a second
    /// thread, a couple of blocks ahead of restoring their entries into the
    /// index, so that the device and the index work at the same time.
    pub(super) fn rebuild(&self, device: &CacheDevice) {
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
    pub(super) fn walk_log(
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
    pub(super) fn restore_entries(&self, device: &CacheDevice, entries: &[LogEntry]) {
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
}
