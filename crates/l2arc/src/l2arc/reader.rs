//! Reading records from flash.
//!
//! An index entry locates a record; the device is read only while it is
//! readable and the hand has not swept over the record, and the bytes are
//! checked (CRC-32C seeded with the key hash the reader asked for) before
//! they are decompressed and handed out. Every failure drops the entry and
//! is a miss: the caller reads primary storage instead.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::cache_device::*;
use super::format::{self, BLOCK_BYTES, Compression, Location};
use super::index::IndexEntry;
use super::*;
use crate::buf::AlignedBuf;

/// The longest device read `begin_runs` merges records into: what a
/// sequential reader (fio's 1 MiB blocks) asks of a device at once.
pub(crate) const COALESCED_READ_BYTES_MAX: usize = 1 << 20;
const _: () = assert!(COALESCED_READ_BYTES_MAX as u64 >= 256 * BLOCK_BYTES);

/// A flash read between [`L2Arc::begin_read`] and [`L2Arc::finish_read`]:
/// the device it pins, the entry it found, and the buffer to read into.
pub(crate) struct PendingRead {
    device: Arc<CacheDevice>,
    key_hash: u64,
    entry: IndexEntry,
    lsize_max: u32,
    /// Made at the first `buf_mut` (in the thread that reads); taken by
    /// `finish_read`.
    buf: Option<AlignedBuf>,
    /// Set by `finish_read`; a pending read dropped before it would leave
    /// its device pinned forever (removal waits for it).
    finished: bool,
}

impl PendingRead {
    /// Where to read: whole 4 KiB blocks, aligned.
    pub(crate) fn offset_bytes(&self) -> u64 {
        let location = Location(self.entry.location);
        // The buffer is exactly the location's blocks (`begin_read`).
        debug_assert!(
            self.buf
                .as_ref()
                .is_none_or(|b| b.len() == location.asize_bytes())
        );
        location.offset_bytes()
    }

    /// The buffer to read into (page-aligned, `asize` long). Its heap
    /// memory stays put while the read is pending, moves or not.
    pub(crate) fn buf_mut(&mut self) -> &mut [u8] {
        assert!(!self.finished, "a finished read has no buffer");
        // Made by the thread that reads (`begin_read` may run on another:
        // the prewarm begins a batch, its readers read it).
        let len_bytes = self.len_bytes() as usize;
        let buf = self
            .buf
            .get_or_insert_with(|| AlignedBuf::for_overwrite(len_bytes))
            .as_mut_slice();
        // O_DIRECT and io_uring read into it: page-aligned, whole blocks.
        debug_assert!(buf.as_ptr().addr().is_multiple_of(BLOCK_BYTES as usize));
        debug_assert!(buf.len().is_multiple_of(BLOCK_BYTES as usize) && !buf.is_empty());
        buf
    }

    /// How many bytes the read is (the location's whole blocks).
    fn len_bytes(&self) -> u64 {
        Location(self.entry.location).asize_bytes() as u64
    }

    /// The device to read from.
    pub(crate) fn device_io(&self) -> &dyn super::device::DeviceIo {
        // Pinned: its removal waits for this read.
        debug_assert!(self.device.inflight_reads.load(Ordering::Relaxed) >= 1);
        &*self.device.io
    }

    /// Reads the blocks with a positioned read in this thread.
    pub(crate) fn read_psync(&mut self) -> std::io::Result<()> {
        let offset = self.offset_bytes();
        debug_assert!(offset.is_multiple_of(BLOCK_BYTES) && !self.finished);
        self.buf_mut(); // made here, in the thread that reads
        let buf = self.buf.as_mut().expect("made above").as_mut_slice();
        self.device.io.read_at(offset, buf)
    }
}

impl Drop for PendingRead {
    fn drop(&mut self) {
        if !self.finished {
            // Unpin without a verdict: the entry stays, nothing was read.
            let before = self.device.inflight_reads.fetch_sub(1, Ordering::SeqCst);
            debug_assert!(before >= 1, "a pending read unpinned twice");
        }
    }
}

/// Records back to back on one device, read with one device read between
/// [`L2Arc::begin_runs`] and [`L2Arc::finish_run`]: into the one record's
/// own buffer, or into a merged buffer that `finish_run` cuts up.
pub(crate) struct RunRead {
    /// (index in the caller's list, its pending read), in device order.
    reads: Vec<(usize, PendingRead)>,
    /// The merged read's buffer, when the run is more than one record
    /// (made at the first `buf_mut`, in the thread that reads).
    merged: Option<AlignedBuf>,
    /// Where the run ends on its device.
    end: u64,
    /// Where the run starts on its device.
    start: u64,
}

impl RunRead {
    /// Where to read: whole 4 KiB blocks, aligned.
    pub(crate) fn offset_bytes(&self) -> u64 {
        debug_assert_eq!(self.start, self.reads[0].1.offset_bytes());
        self.start
    }

    /// The buffer to read into (page-aligned, whole blocks). Its heap
    /// memory stays put while the read is pending, moves or not.
    pub(crate) fn buf_mut(&mut self) -> &mut [u8] {
        if self.reads.len() == 1 {
            return self.reads[0].1.buf_mut();
        }
        let len_bytes = (self.end - self.start) as usize;
        self.merged
            .get_or_insert_with(|| AlignedBuf::for_overwrite(len_bytes))
            .as_mut_slice()
    }

    /// Reads the run with a positioned read in this thread.
    pub(crate) fn read_psync(&mut self) -> std::io::Result<()> {
        let offset = self.offset_bytes();
        let device = Arc::clone(&self.reads[0].1.device);
        device.io.read_at(offset, self.buf_mut())
    }
}

impl L2Arc {
    /// Whether the L2ARC holds a record (the feeder skips those).
    pub fn contains(&self, key_hash: u64) -> bool {
        let entry = self.index.get(key_hash);
        debug_assert!(entry.is_none_or(|e| is_well_formed(Location(e.location))));
        entry.is_some()
    }

    /// Whether the L2ARC holds a record (`None`: not), and if so whether
    /// with a sector table (a small piece of it can be read alone:
    /// `read_sectors`).
    pub(crate) fn sector_table_of(&self, key_hash: u64) -> Option<bool> {
        let location = Location(self.index.get(key_hash)?.location);
        debug_assert!(is_well_formed(location));
        // A sector table follows a plain payload of at least a block.
        debug_assert!(!location.sectored() || location.payload_blocks() >= 1);
        Some(location.sectored())
    }

    /// Forgets a record (its data changed): the next read of it is a miss.
    pub fn invalidate(&self, key_hash: u64) {
        if let Some(old) = self.index.remove(key_hash) {
            let location = Location(old.location);
            debug_assert!(is_well_formed(location));
            if let Some(device) = self.device(location.device()) {
                account_remove(&device, location);
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
        // The device is the location's, or gone.
        debug_assert!(device.is_none_or(|d| d.slot == location.device()));
        if self
            .index
            .remove_if(key_hash, |e| e.location == location.0)
            .is_some()
            && let Some(device) = device
        {
            account_remove(device, location);
        }
    }

    /// Reads a record from flash, blocking. `None` is a miss; every failure
    /// is a miss too (counted), so callers fall back to primary storage.
    /// Polls for the completion when a core is spare (`poll`).
    pub fn read(&self, key_hash: u64, lsize_max: u32) -> Option<AlignedBuf> {
        let mut pending = self.begin_read(key_hash, lsize_max)?;
        let blocking = poll::BlockingRead::start();
        let poll_us = self.config.l2arc_read_poll_us;
        let polled = match pending.device_io().ring_fd() {
            Some(fd) if poll_us > 0 && blocking.may_poll() => {
                let offset = pending.offset_bytes();
                debug_assert!(offset.is_multiple_of(BLOCK_BYTES));
                let buf: *mut [u8] = pending.buf_mut();
                // SAFETY: `buf` points into `pending`'s own heap buffer,
                // which nothing else touches during the read; the device it
                // pins stays open until `finish_read`.
                let buf = unsafe { &mut *buf };
                poll::read(fd, offset, buf, Duration::from_micros(poll_us)).map(|(result, how)| {
                    self.reads_polled.fetch_add(1, Ordering::Relaxed);
                    if how == poll::Polled::Slept {
                        self.reads_poll_slept.fetch_add(1, Ordering::Relaxed);
                    }
                    pending.device_io().finish_ring_read(offset, buf, result)
                })
            }
            _ => None,
        };
        let result = polled.unwrap_or_else(|| pending.read_psync());
        drop(blocking);
        self.finish_read(pending, result)
    }

    /// First half of reading several records (`wanted[i]`: key hash, most
    /// logical bytes): finds and pins each, as [`Self::begin_read`] does
    /// (a record not on flash is a counted miss, handed to `missed`, and
    /// has no run), and groups them into runs that lie back to back on one
    /// device, up to
    /// `COALESCED_READ_BYTES_MAX` each: one device read a run, what a
    /// sequential reader asks of a device. Every run must reach
    /// [`Self::finish_run`].
    pub(crate) fn begin_runs(
        &self,
        wanted: &[(u64, u32)],
        runs: &mut Vec<RunRead>,
        missed: &mut dyn FnMut(usize),
    ) {
        let mut pending: Vec<(usize, PendingRead)> = Vec::with_capacity(wanted.len());
        for (i, &(key_hash, lsize_max)) in wanted.iter().enumerate() {
            match self.begin_read(key_hash, lsize_max) {
                Some(read) => pending.push((i, read)),
                None => missed(i),
            }
        }
        pending.sort_unstable_by_key(|(_, p)| (p.device.slot, p.offset_bytes()));
        let mut rest = pending.into_iter().peekable();
        while let Some(first) = rest.next() {
            let start = first.1.offset_bytes();
            let mut end = start + first.1.len_bytes();
            let mut reads = vec![first];
            while let Some((_, next)) = rest.peek() {
                let next_end = next.offset_bytes() + next.len_bytes();
                let adjacent = Arc::ptr_eq(&next.device, &reads[0].1.device)
                    && next.offset_bytes() == end
                    && next_end - start <= COALESCED_READ_BYTES_MAX as u64;
                if !adjacent {
                    break;
                }
                end = next_end;
                reads.push(rest.next().expect("peeked"));
            }
            // Back to back, within the bound (a lone record may be longer).
            debug_assert!(reads.len() == 1 || end - start <= COALESCED_READ_BYTES_MAX as u64);
            runs.push(RunRead {
                reads,
                merged: None,
                start,
                end,
            });
        }
    }

    /// Second half of a run: hands each record's checked bytes (or `None`:
    /// a miss, counted) to `done` with its index in the caller's list. A
    /// merged read that failed is read again record by record, so that a
    /// bad block costs only its own record (and counts one error).
    pub(crate) fn finish_run(
        &self,
        run: RunRead,
        io_result: std::io::Result<()>,
        done: &mut dyn FnMut(usize, Option<AlignedBuf>),
    ) {
        let RunRead {
            reads,
            merged,
            start,
            end,
        } = run;
        debug_assert!(
            merged
                .as_ref()
                .is_none_or(|m| m.len() as u64 == end - start)
        );
        let Some(merged) = merged.filter(|_| reads.len() > 1) else {
            let [(i, one)]: [(usize, PendingRead); 1] = reads
                .try_into()
                .ok()
                .expect("an unmerged run is one record");
            done(i, self.finish_read(one, io_result));
            return;
        };
        for (i, mut one) in reads {
            let result = match &io_result {
                Ok(()) => {
                    let at = (one.offset_bytes() - start) as usize;
                    let buf = one.buf_mut();
                    let len = buf.len();
                    // Back to back: each record's blocks lie in the merged read.
                    debug_assert!(at + len <= merged.len());
                    buf.copy_from_slice(&merged[at..at + len]);
                    Ok(())
                }
                Err(_) => one.read_psync(),
            };
            done(i, self.finish_read(one, result));
        }
    }

    /// First half of a read: finds the record and pins its device (a
    /// device is not removed while reads on it are pending). `None` is a
    /// miss, counted. The caller reads [`PendingRead::target`] by any means
    /// (a positioned read, an io_uring submission) and hands the outcome to
    /// [`Self::finish_read`], which every pending read must reach.
    pub(crate) fn begin_read(&self, key_hash: u64, lsize_max: u32) -> Option<PendingRead> {
        let Some(entry) = self.index.get(key_hash) else {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let location = Location(entry.location);
        let device = match self.device(location.device()) {
            Some(device) if device.is_readable() && device.holds_location(location) => device,
            device => {
                self.drop_entry(key_hash, location, device.as_deref());
                self.misses.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        if location.compression().is_none() {
            self.drop_entry(key_hash, location, Some(&device));
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        // What the index says lies where it was written: on this device,
        // in its data area (`holds_location`), whole blocks.
        debug_assert_eq!(device.slot, location.device());
        debug_assert!(is_well_formed(location));
        device.inflight_reads.fetch_add(1, Ordering::SeqCst);
        let asize_bytes = usize::from(location.asize_blocks()) * BLOCK_BYTES as usize;
        debug_assert_eq!(asize_bytes, location.asize_bytes());
        Some(PendingRead {
            device,
            key_hash,
            entry,
            lsize_max,
            // Every byte is overwritten by the read, or the buffer dropped.
            buf: None,
            finished: false,
        })
    }

    /// Second half of a read: checks what the device returned and turns it
    /// into the record's bytes, or into a miss (counted; the entry dropped).
    pub(crate) fn finish_read(
        &self,
        mut pending: PendingRead,
        io_result: std::io::Result<()>,
    ) -> Option<AlignedBuf> {
        debug_assert!(!pending.finished, "a pending read finishes once");
        pending.finished = true;
        let device = std::sync::Arc::clone(&pending.device);
        let buf = pending.buf.take().expect("a pending read has its buffer");
        let result = self.check_read(
            &device,
            pending.key_hash,
            pending.entry,
            pending.lsize_max,
            buf,
            io_result,
        );
        device.inflight_reads.fetch_sub(1, Ordering::SeqCst);
        match &result {
            Some(_) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                device.counters.hits.fetch_add(1, Ordering::Relaxed);
                crate::analytics::note_l2_device(device.slot);
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    /// Reads bytes `range` of a record from flash without reading the
    /// rest of it, when the record was stored with a sector table: the
    /// 4 KiB blocks under the range and the table block are read and each
    /// block is checked against its table entry. Returns the buffer read,
    /// the range of it that holds the bytes asked for (cut at the record's
    /// end; handed out as read, not copied), and the record's length.
    ///
    /// `None` when the record is not on flash, has no sector table, or
    /// fails a check (then its entry is dropped and the failure counted as
    /// a whole-record read counts it). No miss is counted here: the caller
    /// then reads the whole record, which counts the miss if there is one.
    pub fn read_sectors(
        &self,
        key_hash: u64,
        range: std::ops::Range<usize>,
    ) -> Option<(AlignedBuf, std::ops::Range<usize>, usize)> {
        let entry = self.index.get(key_hash)?;
        let location = Location(entry.location);
        if !location.sectored() {
            return None;
        }
        let device = match self.device(location.device()) {
            Some(device) if device.is_readable() && device.holds_location(location) => device,
            device => {
                self.drop_entry(key_hash, location, device.as_deref());
                return None;
            }
        };
        let record_bytes = location.stored_bytes();
        debug_assert!(is_well_formed(location) && device.slot == location.device());
        let to = range.end.min(record_bytes);
        let from = range.start.min(to);
        debug_assert!(from <= to && to <= record_bytes);
        if from == to {
            return Some((AlignedBuf::zeroed(0), 0..0, record_bytes));
        }
        let block = BLOCK_BYTES as usize;
        let first = from / block;
        let blocks = to.div_ceil(block) - first;
        debug_assert!(first + blocks <= usize::from(location.payload_blocks()));
        device.inflight_reads.fetch_add(1, Ordering::SeqCst);
        let kept = self.sector_tables.get(key_hash, location.0);
        let (buf, io_result) =
            read_blocks_and_table(&device, location, first, blocks, kept.is_none());
        let c = &device.counters;
        let result = match io_result {
            Err(e) => {
                self.read_failed(&device, key_hash, location, &e);
                None
            }
            Ok(()) => {
                device.note_success();
                c.read_bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
                let (data, table) = buf.split_at(blocks * block);
                let table = kept.as_deref().unwrap_or(table);
                if format::check_sectors(key_hash, table, first as u32, data) {
                    if kept.is_none() {
                        let used = 4 * usize::from(location.payload_blocks());
                        self.sector_tables
                            .keep(key_hash, location.0, &table[..used]);
                    }
                    let skip = from - first * block;
                    // Handed out as read: the range lies in the blocks read.
                    debug_assert!(skip + (to - from) <= blocks * block);
                    Some(skip..skip + (to - from))
                } else {
                    self.sector_tables.forget(key_hash);
                    self.checksum_failed(&device, key_hash, location);
                    None
                }
            }
        };
        device.inflight_reads.fetch_sub(1, Ordering::SeqCst);
        let wanted = result?;
        self.hits.fetch_add(1, Ordering::Relaxed);
        c.hits.fetch_add(1, Ordering::Relaxed);
        crate::analytics::note_l2_device(device.slot);
        c.sector_hits.fetch_add(1, Ordering::Relaxed);
        Some((buf, wanted, record_bytes))
    }

    /// A device read failed: the entry goes, and enough failures fault
    /// the device.
    fn read_failed(
        &self,
        device: &CacheDevice,
        key_hash: u64,
        location: Location,
        e: &std::io::Error,
    ) {
        debug_assert_eq!(device.slot, location.device());
        device.counters.io_error.fetch_add(1, Ordering::Relaxed);
        self.drop_entry(key_hash, location, Some(device));
        if device.note_error("read", e) {
            self.forget_device(device);
        }
    }

    /// Bytes read failed their checksum: corruption, or the hand swept
    /// over them while they were read (not corruption). The entry goes.
    fn checksum_failed(&self, device: &CacheDevice, key_hash: u64, location: Location) {
        debug_assert_eq!(device.slot, location.device());
        let c = &device.counters;
        if device.holds_location(location) {
            c.cksum_bad.fetch_add(1, Ordering::Relaxed);
        } else {
            c.evict_reading.fetch_add(1, Ordering::Relaxed);
        }
        self.drop_entry(key_hash, location, Some(device));
    }

    fn check_read(
        &self,
        device: &CacheDevice,
        key_hash: u64,
        entry: IndexEntry,
        lsize_max: u32,
        mut buf: AlignedBuf,
        io_result: std::io::Result<()>,
    ) -> Option<AlignedBuf> {
        let location = Location(entry.location);
        let c = &device.counters;
        let compression = location.compression()?;
        // The read side of the pair: the buffer is exactly the blocks the
        // writer placed the record in, and the stored bytes lie within it.
        debug_assert_eq!(buf.len(), location.asize_bytes());
        assert!(location.stored_bytes() <= buf.len());
        if let Err(e) = io_result {
            self.read_failed(device, key_hash, location, &e);
            return None;
        }
        device.note_success();
        c.read_bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        let stored_bytes = location.stored_bytes();
        if format::record_checksum(key_hash, &buf[..stored_bytes]) != entry.checksum {
            self.checksum_failed(device, key_hash, location);
            return None;
        }
        match compression {
            Compression::Off => {
                buf.set_len(stored_bytes);
                debug_assert_eq!(buf.len(), stored_bytes);
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
                // A record never decodes longer than its reader allows.
                debug_assert!(
                    decoded
                        .as_ref()
                        .is_none_or(|d| d.len() <= lsize_max as usize)
                );
                decoded
            }
        }
    }
}

/// Whether a location is one the writer could have made (`Location::new`,
/// or a log entry `decode_log_block` accepted): every indexed one is.
fn is_well_formed(location: Location) -> bool {
    debug_assert!(location.device() < format::MAX_DEVICES);
    location.asize_blocks() >= 1
        && location.compression().is_some()
        && (!location.sectored() || location.asize_blocks() >= 2)
        && location.end_block() <= 1 << 32
}

/// Reads payload blocks `first..first + blocks` of a sectored record, and
/// (`with_table`) its table block after them in the same buffer: in one
/// read when they touch (the end of the record), else two.
fn read_blocks_and_table(
    device: &CacheDevice,
    location: Location,
    first: usize,
    blocks: usize,
    with_table: bool,
) -> (AlignedBuf, std::io::Result<()>) {
    let block = BLOCK_BYTES as usize;
    // Within the payload, before its table block.
    debug_assert!(location.sectored() && blocks >= 1);
    debug_assert!(first + blocks <= usize::from(location.payload_blocks()));
    let start = location.offset_bytes() + (first * block) as u64;
    let mut buf = AlignedBuf::for_overwrite((blocks + usize::from(with_table)) * block);
    let result = if !with_table || first + blocks == usize::from(location.payload_blocks()) {
        device.io.read_at(start, buf.as_mut_slice())
    } else {
        let (data, table) = buf.as_mut_slice().split_at_mut(blocks * block);
        device.io.read_at(start, data).and_then(|()| {
            let table_at = location.sector_table_offset_bytes().expect("sectored");
            device.io.read_at(table_at, table)
        })
    };
    (buf, result)
}
