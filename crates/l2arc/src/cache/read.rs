//! Reads: one record at a time, down the tiers in order.
//!
//! A read is split into the dataset's records; each is looked up in the
//! ARC, and a miss claims the record's fill (one read below per record at
//! a time: single flight), reads the whole record from the first tier
//! below that holds it or else from primary storage, inserts it, and wakes
//! any reader that waited. A conditional primary read that finds the
//! object changed (412) re-stats and tries again under the new token, at
//! most `STALE_RETRIES_MAX` times: nothing of the old version is ever
//! returned or cached under the new token.

use std::io;
use std::ops::Range;
use std::sync::atomic::Ordering;

use smallvec::SmallVec;
use std::sync::Arc;

use crate::arc::live::{Lookup, Record};
use crate::arc::policy::AccessKind;
use crate::buf::AlignedBuf;
use crate::l2arc::L2Arc;
use crate::tier::{BelowKey, Tier, record_key_hash};

use super::Cache;
use super::config::*;
use super::objects::*;
use super::view::*;

impl Cache {
    /// Reads like `pread`: fills `buf` from `offset`, short at end of object.
    pub fn read(&self, handle: &ObjectHandle, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        if handle.caches_nothing() {
            return self.read_uncached(handle, offset, buf);
        }
        let recordsize = u64::from(handle.dataset.config.recordsize_bytes);
        let size_bytes = handle.size_bytes();
        let end = offset.saturating_add(buf.len() as u64).min(size_bytes);
        if offset < end && offset / recordsize == (end - 1) / recordsize {
            // Within one record: copy straight out of the record buffer.
            let continues = self.note_stream_read(handle, offset, buf.len());
            let timer = self.analytics.start_read();
            let index = offset / recordsize;
            let from = (offset - index * recordsize) as usize;
            let to = (end - index * recordsize) as usize;
            let peeked = (continues == Some(index))
                .then(|| self.arc.peek_hit(handle.record_key(index), handle.token()))
                .flatten();
            let (record, range, _) = match peeked {
                Some(record) => piece_of(record, from..to, recordsize as usize),
                None => self.get_piece(handle, index, AccessKind::Demand, from..to)?,
            };
            let n = range.len();
            // A piece of one record, no more than was asked.
            debug_assert!(n as u64 <= end - offset && n <= buf.len());
            buf[..n].copy_from_slice(&record.data[range]);
            self.counters.reads.add(1);
            self.counters.read_bytes.add(n as u64);
            self.analytics
                .finish_read(timer, handle.dataset_id.0, handle.state.id);
            return Ok(n);
        }
        let view = self.read_view_as(handle, offset, buf.len(), AccessKind::Demand, None)?;
        debug_assert!(view.len() <= buf.len());
        Ok(view.copy_to(buf))
    }

    /// Warms the cache with the records under a range (read-ahead): they are
    /// flagged as prefetched and do not count as reuse.
    pub fn prefetch(&self, handle: &ObjectHandle, offset: u64, len: usize) -> io::Result<()> {
        if handle.caches_nothing() {
            return Ok(());
        }
        self.read_view_as(handle, offset, len, AccessKind::Prefetch, None)
            .map(|view| debug_assert!(view.len() <= len))
    }

    /// Reads a range as shared record buffers, without copying.
    pub fn read_view(
        &self,
        handle: &ObjectHandle,
        offset: u64,
        len: usize,
    ) -> io::Result<ReadView> {
        let view = self.read_view_as(handle, offset, len, AccessKind::Demand, None)?;
        debug_assert!(view.len() <= len, "a view is no longer than asked");
        Ok(view)
    }

    /// As [`Self::read_view`], for a reader whose previous read ended in
    /// record `continues`: a hit on that record is counted, but is not a new
    /// access for the ARC's policy (`LiveArc::peek_hit`). Without it a
    /// sequential reader that reads a record in several reads (the kernel's
    /// 128 KiB) would promote every record it reads to MFU, as if it were
    /// reused, and the records read ahead of it would be evicted first.
    pub fn read_view_continuing(
        &self,
        handle: &ObjectHandle,
        offset: u64,
        len: usize,
        continues: Option<u64>,
    ) -> io::Result<ReadView> {
        self.read_view_as(handle, offset, len, AccessKind::Demand, continues)
    }

    /// A read of `kind`: demand reads count as reads and as accesses for
    /// the ARC's policy; read-ahead (`prefetch`) flags what it brings in.
    pub(crate) fn read_view_as(
        &self,
        handle: &ObjectHandle,
        offset: u64,
        len: usize,
        kind: AccessKind,
        continues: Option<u64>,
    ) -> io::Result<ReadView> {
        let size_bytes = handle.size_bytes();
        let mut segments = SmallVec::new();
        if len == 0 || offset >= size_bytes {
            return Ok(ReadView { segments });
        }
        let end = offset.saturating_add(len as u64).min(size_bytes);
        let recordsize = u64::from(handle.dataset.config.recordsize_bytes);
        // A record the caller's previous read ended in, or one an earlier
        // read of the object's sequential stream touched: not a new access.
        let continues = match kind {
            AccessKind::Demand => self.note_stream_read(handle, offset, len).or(continues),
            _ => continues,
        };
        let timer = self.analytics.start_read_if(kind == AccessKind::Demand);
        for index in offset / recordsize..=(end - 1) / recordsize {
            let record_start = index * recordsize;
            let from = (offset.max(record_start) - record_start) as usize;
            let to = ((end - record_start) as usize).min(recordsize as usize);
            // Every record under the range holds some of it.
            debug_assert!(from < to && to <= recordsize as usize);
            let peeked = (kind == AccessKind::Demand && continues == Some(index))
                .then(|| self.arc.peek_hit(handle.record_key(index), handle.token()))
                .flatten();
            let (record, range, short) = match peeked {
                Some(record) => piece_of(record, from..to, recordsize as usize),
                None => self.get_piece(handle, index, kind, from..to)?,
            };
            if !range.is_empty() {
                segments.push((record, range));
            }
            if short {
                break; // end of object as the primary saw it
            }
        }
        let view = ReadView { segments };
        // Within the object as last seen (O(segments), as `len` is).
        debug_assert!(view.len() as u64 <= end - offset);
        if kind == AccessKind::Demand {
            self.counters.reads.add(1);
            self.counters.read_bytes.add(view.len() as u64);
            self.analytics
                .finish_read(timer, handle.dataset_id.0, handle.state.id);
            return Ok(view);
        }
        Ok(view)
    }

    /// Bytes `wanted` of record `index` (cut at the record's end): a
    /// buffer, the range of it that holds them, and whether the record is
    /// short (the object's last).
    ///
    /// A small demand read (at most 1/`SECTOR_READ_FRACTION` of a record,
    /// not at its start: `sector_read_fits`) of a record the ARC neither
    /// holds nor is filling is first tried as a piece read from the tiers
    /// below (`Tier::read_piece`; on the L2ARC the 4 KiB blocks under it
    /// and the record's sector table, not the whole record), and no ARC
    /// fill. Reading a 1 MiB record from flash to serve 4 KiB is 256 times
    /// the I/O, and filling the ARC with it evicts a megabyte of DRAM for
    /// every random read that misses it. A record read this way is still
    /// counted as an ARC miss and a hit below it.
    pub(super) fn get_piece(
        &self,
        handle: &ObjectHandle,
        index: u64,
        kind: AccessKind,
        wanted: Range<usize>,
    ) -> io::Result<(Arc<Record>, Range<usize>, bool)> {
        let recordsize = handle.dataset.config.recordsize_bytes as usize;
        if kind == AccessKind::Demand && sector_read_fits(handle, &wanted) {
            let token = handle.token();
            let key = handle.record_key(index);
            match self.arc.lookup_resident(key, token, kind) {
                Some(Lookup::Hit(record)) => return Ok(piece_of(record, wanted, recordsize)),
                Some(_) => {} // being filled: wait for it below
                None => {
                    if let Some((data, range, record_bytes)) =
                        self.read_piece_below(handle, index, token, wanted.clone())
                    {
                        self.arc.note_miss(key, kind);
                        let record = Arc::new(Record {
                            data,
                            generation_token: token,
                            fill_sequence: 0,
                        });
                        return Ok((record, range, record_bytes < recordsize));
                    }
                }
            }
        }
        let record = self.get_record(handle, index, kind)?;
        let piece = piece_of(record, wanted.clone(), recordsize);
        // A piece read is within the record, and no more than wanted.
        debug_assert!(piece.1.end <= piece.0.data.len() && piece.1.len() <= wanted.len());
        Ok(piece)
    }

    pub(super) fn get_record(
        &self,
        handle: &ObjectHandle,
        index: u64,
        kind: AccessKind,
    ) -> io::Result<Arc<Record>> {
        let key = handle.record_key(index);
        let mut stale_tries = 0u32;
        loop {
            let token = handle.token();
            let result = match self.arc.lookup(key, token, kind) {
                Lookup::Hit(record) => {
                    debug_assert_eq!(record.generation_token, token, "a hit is current");
                    return Ok(record);
                }
                Lookup::InFlight(fill) => {
                    self.analytics.note_below();
                    match fill.wait() {
                        Ok(record) if record.generation_token == token => return Ok(record),
                        // Filled under another generation, or the claim
                        // was dropped unfilled: look again.
                        Ok(_) => continue,
                        Err(e) if e.is_abandoned() => continue,
                        Err(e) => Err(io::Error::from(e)),
                    }
                }
                Lookup::Claimed(claim) => {
                    let fill_sequence = self.invalidation_sequence.load(Ordering::Acquire);
                    match self.read_below(handle, index, token) {
                        Some(data) => {
                            self.publish_fill(claim, Ok(data), token, fill_sequence, None)
                        }
                        None => self.fill_from_primary(handle, index, token, kind, claim),
                    }
                }
            };
            match result {
                // The object is no longer the version the token stands for
                // (a conditional read saw 412): learn the new one and read
                // again under its token. Nothing of the old version was
                // returned or cached under the new token.
                Err(e) if is_stale(&e) && stale_tries < STALE_RETRIES_MAX => {
                    stale_tries += 1;
                    self.counters.primary_stale.add(1);
                    self.revalidate(handle)?;
                }
                Err(e) if is_stale(&e) => {
                    return Err(io::Error::other(format!(
                        "the object kept changing while record {index} was read ({STALE_RETRIES_MAX} tries)"
                    )));
                }
                other => return other,
            }
        }
    }

    /// Completes a fill this reader claimed: inserts the record (the ARC
    /// decides) and hands it, or the error, to every reader waiting on it.
    /// `primary`: the bytes came from primary storage, as record `.1` of
    /// object `.0`: the tiers are offered them (`offer_primary_fill`),
    /// after the waiters are woken.
    pub(crate) fn publish_fill(
        &self,
        claim: crate::arc::live::FillClaim<'_>,
        result: io::Result<AlignedBuf>,
        token: u64,
        fill_sequence: u64,
        primary: Option<(&ObjectHandle, u64)>,
    ) -> io::Result<Arc<Record>> {
        // Noted before the read, from a sequence that only grows.
        debug_assert!(fill_sequence <= self.invalidation_sequence.load(Ordering::Acquire));
        match result {
            Ok(data) => {
                let record = Arc::new(Record {
                    data,
                    generation_token: token,
                    fill_sequence,
                });
                let seen_before = claim.complete_noting_ghost(Ok(Arc::clone(&record)));
                self.offer_fill(record.data.len() as u64);
                if let Some((handle, index)) = primary {
                    self.offer_primary_fill(handle, index, &record, seen_before);
                }
                Ok(record)
            }
            Err(e) => {
                // The waiters get the error as `Fill` keeps it; the
                // claimant keeps its kind too.
                let failed = io::Error::new(e.kind(), e.to_string());
                claim.complete(Err(e));
                Err(failed)
            }
        }
    }

    /// Produces a record's bytes from below the ARC, and whether they came
    /// from primary storage.
    ///
    /// The tiers in order from the `skip`th (a miss or any failure in one
    /// falls through to the next; a read queue that tried the L2ARC on its
    /// own ring skips it), then primary storage.
    pub(crate) fn fill_record_from(
        &self,
        handle: &ObjectHandle,
        index: u64,
        token: u64,
        skip: usize,
    ) -> (io::Result<AlignedBuf>, bool) {
        if let Some(data) = self.read_below_from(handle, index, token, skip) {
            return (Ok(data), false);
        }
        let data = self.read_primary(handle, index, token);
        debug_assert!(
            data.as_ref()
                .is_ok_and(|d| d.len() <= handle.dataset.config.recordsize_bytes as usize)
                || data.is_err()
        );
        (data, true)
    }

    /// A record's bytes from the first tier below the ARC that holds them
    /// under `token`, if any does (a miss or any failure in a tier is a
    /// miss there), and the dataset lets tiers below the ARC keep them.
    pub(crate) fn read_below(
        &self,
        handle: &ObjectHandle,
        index: u64,
        token: u64,
    ) -> Option<AlignedBuf> {
        self.read_below_from(handle, index, token, 0)
    }

    /// [`Self::read_below`] from the `skip`th tier on.
    fn read_below_from(
        &self,
        handle: &ObjectHandle,
        index: u64,
        token: u64,
        skip: usize,
    ) -> Option<AlignedBuf> {
        if self.tiers.is_empty() {
            return None;
        }
        let key_hash = self.key_below(handle, index, token)?;
        let generation = || handle.state.generation_of(token);
        let key = below_key(handle, index, key_hash, &generation);
        let recordsize_bytes = key.recordsize_bytes;
        self.tiers.iter().skip(skip).find_map(|tier| {
            let timer = self.analytics.start();
            let data = tier.checked_read(&key)?;
            assert!(data.len() <= recordsize_bytes as usize);
            // Each kind of tier in its own band (the L2ARC's, the shared
            // tier's), timed from the start of its read.
            self.note_below_hit(handle, tier.checked_band(), timer, data.len() as u64);
            Some(data)
        })
    }

    /// Records `indices` from the tiers below the ARC, as
    /// [`Self::read_below`] reads one: a slot per index, `None` where no
    /// tier holds it. The L2ARC is read record by record (its reads are
    /// local and fast); the tiers after it get the records it missed
    /// together (`Tier::read_many`: the shared tier's GETs in flight at
    /// once, where one by one a span would cost a round trip a record).
    pub(crate) fn read_below_many(
        &self,
        handle: &ObjectHandle,
        indices: &[u64],
        token: u64,
    ) -> Vec<Option<AlignedBuf>> {
        let mut out: Vec<Option<AlignedBuf>> = indices.iter().map(|_| None).collect();
        if self.tiers.is_empty() || handle.dataset.props.secondarycache() != CacheMode::All {
            return out;
        }
        let generation = || handle.state.generation_of(token);
        let keys: Vec<BelowKey<'_>> = indices
            .iter()
            .map(|&index| {
                let key_hash = record_key_hash(handle.dataset.uid, handle.state.id, index, token);
                below_key(handle, index, key_hash, &generation)
            })
            .collect();
        for (at, tier) in self.tiers.iter().enumerate() {
            if out.iter().all(Option::is_some) {
                break;
            }
            let band = tier.checked_band();
            if at > 0 {
                // The slots this tier fills are its hits, each timed from
                // the batch's start (its GETs are in flight together).
                let missing: Vec<bool> = out.iter().map(Option::is_none).collect();
                let timer = self.analytics.start();
                tier.checked_read_many(&keys, &mut out);
                for (slot, was_missing) in out.iter().zip(missing) {
                    if let (Some(data), true) = (slot, was_missing) {
                        self.note_below_hit(handle, band, timer, data.len() as u64);
                    }
                }
                continue;
            }
            for (key, slot) in keys.iter().zip(out.iter_mut()) {
                let timer = self.analytics.start();
                *slot = tier.checked_read(key);
                if let Some(data) = slot {
                    self.note_below_hit(handle, band, timer, data.len() as u64);
                }
            }
        }
        debug_assert_eq!(out.len(), indices.len());
        out
    }

    /// Offers a record just filled from primary storage to every tier
    /// (`Tier::offer_primary_fill`), if its dataset lets tiers below the
    /// ARC keep it.
    fn offer_primary_fill(
        &self,
        handle: &ObjectHandle,
        index: u64,
        record: &Record,
        seen_before: bool,
    ) {
        if self.tiers.is_empty() || record.data.is_empty() {
            return;
        }
        let token = record.generation_token;
        let Some(key_hash) = self.key_below(handle, index, token) else {
            return;
        };
        let generation = || handle.state.generation_of(token);
        let key = below_key(handle, index, key_hash, &generation);
        debug_assert!(record.data.len() <= key.recordsize_bytes as usize);
        for tier in self.tiers.iter() {
            tier.checked_offer_primary_fill(&key, record, seen_before);
        }
    }

    /// Bytes `wanted` of a record from the first tier below the ARC that
    /// can read that piece alone (`Tier::read_piece`).
    fn read_piece_below(
        &self,
        handle: &ObjectHandle,
        index: u64,
        token: u64,
        wanted: Range<usize>,
    ) -> Option<(AlignedBuf, Range<usize>, usize)> {
        if self.tiers.is_empty() {
            return None;
        }
        let key_hash = self.key_below(handle, index, token)?;
        let generation = || handle.state.generation_of(token);
        let key = below_key(handle, index, key_hash, &generation);
        self.tiers.iter().find_map(|tier| {
            let timer = self.analytics.start();
            let (data, range, record_bytes) = tier.checked_read_piece(&key, wanted.clone())?;
            assert!(range.end <= data.len() && range.len() <= wanted.len());
            self.note_below_hit(handle, tier.checked_band(), timer, range.len() as u64);
            Some((data, range, record_bytes))
        })
    }

    /// The record's identity below the ARC, if its dataset lets tiers
    /// below the ARC keep it (`secondarycache=all`).
    fn key_below(&self, handle: &ObjectHandle, index: u64, token: u64) -> Option<u64> {
        let key_hash = (handle.dataset.props.secondarycache() == CacheMode::All)
            .then(|| record_key_hash(handle.dataset.uid, handle.state.id, index, token));
        debug_assert_ne!(key_hash, Some(0), "0 marks an empty slot below");
        key_hash
    }

    /// Counts a hit of `bytes` below the ARC for the analytics (latency
    /// from `timer`), in the band of the tier that served it (`band`: the
    /// L2ARC's or the shared tier's, `Tier::band`).
    pub(crate) fn note_below_hit(
        &self,
        handle: &ObjectHandle,
        band: crate::analytics::Below,
        timer: crate::analytics::Timer,
        bytes: u64,
    ) {
        // A hit below is at most one record, from a tier.
        debug_assert!(bytes <= u64::from(handle.dataset.config.recordsize_bytes));
        debug_assert_ne!(band, crate::analytics::Below::Primary);
        let dataset = handle.dataset_id.0 as usize;
        self.analytics
            .below_hit_done(band, timer, dataset, handle.state.id, bytes);
    }

    /// Whether a read queue should take a read of `len` bytes at `offset`:
    /// every record under it is in the ARC (resident or being filled) or on
    /// flash, so it needs nothing from primary storage (unless a record
    /// leaves both before it is read), and it is not a small piece of a
    /// record that only flash holds with a sector table, which
    /// [`Cache::read`] reads alone (`get_piece`) where a queue reads the
    /// whole record. One ARC and at most one index lookup a record; no
    /// statistics.
    pub(crate) fn queue_takes(&self, handle: &ObjectHandle, offset: u64, len: usize) -> bool {
        if !handle.caches_in_arc() {
            return false;
        }
        let end = offset.saturating_add(len as u64).min(handle.size_bytes());
        if offset >= end {
            return true;
        }
        let recordsize = u64::from(handle.recordsize_bytes());
        let token = handle.token();
        let records = offset / recordsize..=(end - 1) / recordsize;
        // The piece of the record when the read is within one.
        let piece = (records.start() == records.end()).then(|| {
            let start = records.start() * recordsize;
            (offset - start) as usize..(end - start) as usize
        });
        debug_assert!(
            piece
                .as_ref()
                .is_none_or(|p| p.start < p.end && p.end as u64 <= recordsize)
        );
        records.clone().all(|index| {
            if self.arc.holds(handle.record_key(index), token) {
                return true;
            }
            let Some((l2, key_hash)) = self.l2_source(handle, index, token) else {
                return false;
            };
            match <dyn Tier>::checked_holds(&**l2, key_hash) {
                None => false,
                Some(sectored) => {
                    !(sectored && piece.as_ref().is_some_and(|p| sector_read_fits(handle, p)))
                }
            }
        })
    }

    /// The L2ARC and the record's key there, if the record may be on
    /// flash: read queues read it on their own rings, the one tier they
    /// read without blocking.
    pub(crate) fn l2_source(
        &self,
        handle: &ObjectHandle,
        index: u64,
        token: u64,
    ) -> Option<(&Arc<L2Arc>, u64)> {
        let l2 = self.l2.get()?;
        let key_hash = self.key_below(handle, index, token)?;
        debug_assert_ne!(key_hash, 0);
        Some((l2, key_hash))
    }

    /// Reads a whole record from primary storage.
    /// `token` is the one the record will carry: the read asks primary
    /// storage for the version it stands for.
    pub(crate) fn read_primary(
        &self,
        handle: &ObjectHandle,
        index: u64,
        token: u64,
    ) -> io::Result<AlignedBuf> {
        let data = self.read_primary_span(handle, index, 1, token)?;
        debug_assert!(data.len() <= handle.dataset.config.recordsize_bytes as usize);
        Ok(data)
    }

    /// Reads `records` whole records from `first` on from primary storage
    /// in one read (one GET from an object store), as [`Self::read_primary`]
    /// does one; short at the end of the object.
    pub(crate) fn read_primary_span(
        &self,
        handle: &ObjectHandle,
        first: u64,
        records: usize,
        token: u64,
    ) -> io::Result<AlignedBuf> {
        assert!(records > 0);
        let recordsize = handle.dataset.config.recordsize_bytes as usize;
        let mut data = AlignedBuf::zeroed(recordsize * records);
        let offset = first * recordsize as u64;
        let expected = handle.state.generation_of(token);
        let timer = self.analytics.start();
        match handle
            .object
            .read_at_generation(offset, data.as_mut_slice(), expected.as_ref())
        {
            Ok(n) => {
                data.set_len(n);
                self.counters.primary_reads.add(1);
                self.counters.primary_read_bytes.add(n as u64);
                let dataset = handle.dataset_id.0 as usize;
                self.analytics
                    .primary_done(timer, dataset, handle.state.id, n as u64);
                Ok(data)
            }
            Err(e) => {
                if !is_stale(&e) {
                    self.counters.primary_errors.add(1);
                }
                Err(e)
            }
        }
    }

    /// Reads `records` whole records from `first` on from primary storage
    /// as one stream (`PrimaryObject::read_span_at_generation`), handing
    /// the bytes to `sink` as they arrive; counted as one read, as
    /// [`Self::read_primary_span`] is. `token` is the one the records will
    /// carry.
    pub(crate) fn read_primary_stream(
        &self,
        handle: &ObjectHandle,
        first: u64,
        records: usize,
        token: u64,
        sink: &mut dyn FnMut(&[u8]) -> bool,
    ) -> io::Result<usize> {
        let recordsize = handle.dataset.config.recordsize_bytes as usize;
        // A run of whole records, whose offsets do not overflow.
        assert!(records > 0);
        debug_assert!(
            first
                .checked_add(records as u64)
                .and_then(|end| end.checked_mul(recordsize as u64))
                .is_some()
        );
        let expected = handle.state.generation_of(token);
        let timer = self.analytics.start();
        let result = handle.object.read_span_at_generation(
            first * recordsize as u64,
            recordsize * records,
            expected.as_ref(),
            sink,
        );
        match &result {
            Ok(n) => {
                self.counters.primary_reads.add(1);
                self.counters.primary_read_bytes.add(*n as u64);
                let dataset = handle.dataset_id.0 as usize;
                self.analytics
                    .primary_done(timer, dataset, handle.state.id, *n as u64);
            }
            Err(e) if !is_stale(e) => self.counters.primary_errors.add(1),
            Err(_) => {}
        }
        result
    }

    pub(super) fn read_uncached(
        &self,
        handle: &ObjectHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<usize> {
        let align = handle.object.read_alignment_bytes() as u64;
        let timer = self.analytics.start();
        let n = if align <= 1 {
            handle.object.read_at(offset, buf)?
        } else {
            // O_DIRECT below: read whole aligned blocks, then copy out.
            let start = offset / align * align;
            let end = offset
                .checked_add(buf.len() as u64)
                .and_then(|end| end.checked_next_multiple_of(align))
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("read {offset}+{} is beyond the largest offset", buf.len()),
                    )
                })?;
            let mut bounce = AlignedBuf::zeroed((end - start) as usize);
            let got = handle.object.read_at(start, bounce.as_mut_slice())?;
            let skip = (offset - start) as usize;
            // The bounce buffer covers the read, whole aligned blocks.
            debug_assert!(skip < align as usize && (end - start) as usize >= skip + buf.len());
            let n = got.saturating_sub(skip).min(buf.len());
            buf[..n].copy_from_slice(&bounce[skip..skip + n]);
            n
        };
        self.counters.primary_reads.add(1);
        self.counters.primary_read_bytes.add(n as u64);
        let dataset = handle.dataset_id.0 as usize;
        self.analytics
            .primary_done(timer, dataset, handle.state.id, n as u64);
        self.counters.reads.add(1);
        self.counters.read_bytes.add(n as u64);
        Ok(n)
    }
}

/// A record's name below the ARC (`crate::tier::BelowKey`): `key_hash` and
/// what a fleet-stable name is made of, the version only when asked.
fn below_key<'a>(
    handle: &'a ObjectHandle,
    index: u64,
    key_hash: u64,
    generation: &'a dyn Fn() -> Option<crate::primary::Generation>,
) -> BelowKey<'a> {
    debug_assert_ne!(key_hash, 0, "0 marks an empty slot below");
    BelowKey {
        hash: key_hash,
        object: &*handle.object,
        generation,
        index,
        recordsize_bytes: handle.dataset.config.recordsize_bytes,
        compression: handle.dataset.props.compression(),
    }
}
