//! Reading records from flash.
//!
//! An index entry locates a record; the device is read only while it is
//! readable and the hand has not swept over the record, and the bytes are
//! checked (CRC-32C seeded with the key hash the reader asked for) before
//! they are decompressed and handed out. Every failure drops the entry and
//! is a miss: the caller reads primary storage instead.

use std::sync::atomic::Ordering;

use super::cache_device::*;
use super::format::{self, BLOCK_BYTES, Compression, Location};
use super::index::IndexEntry;
use super::*;
use crate::buf::AlignedBuf;

impl L2Arc {
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
    pub(super) fn drop_entry(
        &self,
        key_hash: u64,
        location: Location,
        device: Option<&CacheDevice>,
    ) {
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

    pub(super) fn read_from(
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
}
