//! Sequential streams read ahead in spans, for stores where a request is
//! dear (ZFS's zfetch streams, `dmu_zfetch.c`, reshaped for object stores).
//!
//! Why. The ARC-history read-ahead (`read_ahead`) suits a disk: it grows
//! with the stream, a few records at a time, and reads them in the demand
//! reader's own primary read. For an object store both are wrong. A GET's
//! round trip and its charge are worth megabytes of transfer, so a
//! sequential reader should cost one GET per window of tens of megabytes,
//! not one per few records; and readers that keep many requests in flight
//! (an NBD client: nbdcopy has 64 reads of 256 KiB out, QEMU 32, served by
//! as many worker threads) reach the cache all at once, so the records
//! right before a miss are usually still being read, and the ARC-history
//! rule (which counts only records already in DRAM, to tell one stream from
//! many random readers) sees no stream at all: `serve-nbd s3://` read a
//! 256 MiB object in 249 GETs where the object mount, which watches its
//! readers itself, made one a window.
//!
//! So for datasets whose primary says a request is dear
//! (`Primary::read_ahead_span_bytes`), the engine watches each object's
//! readers, as OpenZFS keeps zstreams per dnode: up to `ZFETCH_MAX_STREAMS`
//! streams an object, each where its next read would start. A demand read
//! that starts exactly where a stream's last read ended makes the stream
//! sequential; from then on a read within `REORDER_SLACK_BYTES` of it
//! continues it (requests in flight together arrive slightly out of
//! order), and never moves it back. A read inside what a stream claimed
//! ahead moves that stream's pace whoever reads it, and starts no stream of
//! its own: a span paced to a stream that no read moves would stall, for
//! `IDLE_MAX`, the very readers waiting on its records (one reader's
//! reordered reads could start two streams, and another reader may read in
//! the window). A read that continues no stream starts
//! a candidate, in place of the one least recently used: random readers
//! thus never read ahead (two of their reads are almost never adjacent),
//! and cost no allocation. Once sequential, a stream asks at once for the
//! whole window (the primary's span, 64 MiB for an object store) from the
//! record its read is in, and again when a quarter of the window or less is
//! left ahead of its furthest read, for runs of three quarters of it: the
//! rule of the object mount (`l2arc-fuse`'s `ReadAhead::at_once`), now
//! where every front end's reads pass.
//!
//! The window's records are claimed on the reader's thread, before its
//! read looks them up (`Cache::claim_span`), so that the read waits on the
//! span instead of sending a GET of its own, and filled by a pool of
//! `SPAN_FILL_THREADS` threads of the cache, one streamed GET a span
//! (`ClaimedSpan::fill_paced`), each record served as soon as its bytes are
//! in. A span is claimed only when a thread is free to fill it at once:
//! claims waiting in a queue would hold their readers up. A span is paced
//! to its stream: it runs at most a quarter of the window (and an eighth of
//! `arc_max`) ahead of the stream's furthest read, so that what it reads is
//! not evicted before it is read, and gives the rest up (its claims
//! abandoned: their readers look again) when the stream makes no progress
//! for `IDLE_MAX`.
//!
//! A front end that reads ahead itself (the object mount) opts its handles
//! out (`ObjectHandle::reads_ahead_itself`): two read-aheads of one reader
//! would only race for the same claims.
//!
//! Memory: the streams of an object (a few dozen bytes each, made only for
//! objects of such datasets, on their first read), and per fill thread one
//! record being assembled; what is read ahead is the ARC's, under
//! `arc_max`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::time::Instant;

use crate::cache::prefetch::{ClaimedSpan, PREFETCH_SPAN_BYTES_MAX};
use crate::lock_order::{RankedMutex, rank};
use crate::pace::Pace;
use crate::{Cache, ObjectHandle};

/// Streams watched per object (OpenZFS's `zfetch_max_streams`).
const ZFETCH_MAX_STREAMS: usize = 8;
/// How far out of order a read may arrive and still continue a
/// sequential stream: a few of a client's requests in flight.
const REORDER_SLACK_BYTES: u64 = 1 << 20;
/// Threads filling spans, each one GET at a time (the object mount's
/// prefetch pool has as many).
const SPAN_FILL_THREADS: usize = 8;
/// One stream of an object: a candidate until a read continues it.
struct Stream {
    /// Where the next sequential read starts (the furthest end of the
    /// reads that continued it).
    next_offset: u64,
    /// The furthest end of every read that moved it (those in what it
    /// claimed too): the records before it were touched.
    read_until: u64,
    /// Start of what it claimed ahead (its first ask's first record).
    claimed_from: u64,
    /// End of what was claimed ahead (bytes); 0 before the first ask.
    fetched_until: u64,
    /// When a read last continued or started it (for replacement).
    last_used: Instant,
    /// Some once sequential: the pace its spans follow.
    pace: Option<Arc<Pace>>,
}

/// The streams of one object (made on its first read through a dataset
/// that reads ahead in spans).
pub(crate) struct Streams {
    streams: RankedMutex<Vec<Stream>, { rank::STREAMS }>,
}

impl Default for Streams {
    fn default() -> Self {
        let streams = Vec::new();
        // An object that is never read sequentially costs no allocation.
        debug_assert_eq!(streams.capacity(), 0);
        Self {
            streams: RankedMutex::new(streams),
        }
    }
}

/// A span to fill, paced to its stream.
type SpanJob = (ClaimedSpan, Arc<Pace>);

/// The cache's span fillers: threads started with the first span.
pub(crate) struct SpanPool {
    jobs: SyncSender<SpanJob>,
    /// Spans sent and not yet filled (at most one a thread).
    busy: Arc<AtomicUsize>,
}

impl SpanPool {
    /// Starts the threads; None if none could be started (read-ahead then
    /// stays off: reads go on without it).
    pub(crate) fn start() -> Option<Self> {
        let (jobs, rx) = std::sync::mpsc::sync_channel::<SpanJob>(SPAN_FILL_THREADS);
        let rx = Arc::new(RankedMutex::new(rx));
        let busy = Arc::new(AtomicUsize::new(0));
        let mut started = 0;
        for n in 0..SPAN_FILL_THREADS {
            let (rx, busy) = (Arc::clone(&rx), Arc::clone(&busy));
            let spawned = std::thread::Builder::new()
                .name(format!("l2arc-zstream-{n}"))
                .spawn(move || fill_spans(&rx, &busy));
            started += usize::from(spawned.is_ok());
        }
        debug_assert!(started <= SPAN_FILL_THREADS);
        (started > 0).then_some(Self { jobs, busy })
    }
}

/// A fill thread: fills spans until the pool (the cache) is gone.
fn fill_spans(rx: &RankedMutex<Receiver<SpanJob>, { rank::LEAF }>, busy: &AtomicUsize) {
    loop {
        let job = rx.lock().expect("span queue poisoned").recv();
        let Ok((span, pace)) = job else {
            return;
        };
        // A failed read-ahead is only a lost hint; the readers waiting on
        // its records get the error (a 412: they re-stat).
        let _ = span.fill_paced(&|offset| pace.wait_for(offset));
        let before = busy.fetch_sub(1, Ordering::AcqRel);
        // Counted before it was sent.
        debug_assert!(before > 0, "a span filled that was never counted");
    }
}

/// What one read asks of its stream: the bytes to claim and the pace.
struct Ask {
    from: u64,
    len: u64,
    pace: Arc<Pace>,
}

/// What a read of a sequential stream learnt: the record it starts in if
/// an earlier read of the stream touched it already, and what to read
/// ahead.
#[derive(Default)]
struct Noted {
    continues: Option<u64>,
    ask: Option<Ask>,
}

/// The sizes one object's streams work in.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    recordsize: u64,
    /// The window: a whole number of records.
    window_bytes: u64,
    /// How far a span may fill ahead of its stream's furthest read.
    ahead_bytes: u64,
    size_bytes: u64,
}

impl Streams {
    /// Notes a read of `len` bytes at `offset` (see the module comment):
    /// whether it continues a record its stream read, and what to read
    /// ahead, if anything.
    fn on_read(streams: &mut Vec<Stream>, (offset, len): (u64, u64), g: Geometry) -> Noted {
        assert!(g.recordsize.is_power_of_two() && g.window_bytes >= g.recordsize);
        let end = offset.saturating_add(len);
        let (sequential, read_until) = Self::stream_of(streams, offset, end, g.recordsize);
        // A record a read of its stream touched before (the kernel's and
        // NBD clients' reads are smaller than a 1 MiB record): the same
        // access, not a reuse that would promote the record to the MFU
        // side, where records already read would outlive those read ahead.
        let record = offset / g.recordsize;
        let continues =
            (read_until > 0 && record <= (read_until - 1) / g.recordsize).then_some(record);
        let ask = sequential.and_then(|i| Self::ask(&mut streams[i], offset, end, g));
        Noted { continues, ask }
    }

    /// What a read of `[offset, end)` of sequential stream `s` asks to read
    /// ahead, if anything.
    fn ask(s: &mut Stream, offset: u64, end: u64, g: Geometry) -> Option<Ask> {
        s.last_used = Instant::now();
        s.next_offset = s.next_offset.max(end);
        let pace = Arc::clone(
            s.pace
                .get_or_insert_with(|| Arc::new(Pace::new(offset, g.ahead_bytes))),
        );
        // Asked again only once a quarter of the window or less is left
        // ahead: runs of three quarters of a window, one GET each.
        if s.fetched_until > end && s.fetched_until - end > g.window_bytes / 4 {
            return None;
        }
        let first = offset / g.recordsize * g.recordsize;
        if s.fetched_until == 0 {
            s.claimed_from = first;
        }
        let from = first.max(s.fetched_until);
        let to = first.saturating_add(g.window_bytes).min(
            g.size_bytes
                .div_ceil(g.recordsize)
                .saturating_mul(g.recordsize),
        );
        if from >= to {
            return None;
        }
        s.fetched_until = to;
        debug_assert!(to - from <= g.window_bytes);
        Some(Ask {
            from,
            len: to - from,
            pace,
        })
    }

    /// The stream a read of `[offset, end)` continues, made sequential if
    /// it was a candidate (None when it continues none: a candidate is
    /// started for it, unless it lies in a window a stream claimed), and
    /// how far the reads of the streams it belongs to had got before it (0:
    /// none). Moves every stream the read belongs to.
    fn stream_of(
        streams: &mut Vec<Stream>,
        offset: u64,
        end: u64,
        recordsize: u64,
    ) -> (Option<usize>, u64) {
        let slack = REORDER_SLACK_BYTES.max(recordsize);
        let now = Instant::now();
        // Near a sequential stream: a little behind where its next read
        // would start, or a little ahead. Covered by one: in what it claimed.
        let near = |s: &Stream| {
            s.pace.is_some()
                && offset <= s.next_offset.saturating_add(slack)
                && offset.saturating_add(slack) >= s.next_offset
        };
        let covered =
            |s: &Stream| s.pace.is_some() && (s.claimed_from..s.fetched_until).contains(&offset);
        // A read moves the pace of every stream that claimed its record:
        // the read may wait on that stream's span, which must then not wait
        // for a reader of its own. And it continues every stream it is near.
        let mut sequential = None;
        let mut inside = false;
        let mut read_until = 0;
        for (i, s) in streams.iter_mut().enumerate() {
            let (is_near, is_covered) = (near(s), covered(s));
            if let Some(pace) = s.pace.as_ref().filter(|_| is_near || is_covered) {
                pace.reader_at(offset);
                s.last_used = now;
                read_until = read_until.max(s.read_until);
                s.read_until = s.read_until.max(end);
            }
            if is_near {
                sequential.get_or_insert(i);
                s.next_offset = s.next_offset.max(end);
            }
            inside |= is_covered;
        }
        if sequential.is_some() || inside {
            // In a window a stream claimed: that stream's, not a new one.
            debug_assert!(sequential.is_none_or(|i| i < streams.len()));
            return (sequential, read_until);
        }
        if let Some(i) = streams
            .iter()
            .position(|s| s.pace.is_none() && offset == s.next_offset)
        {
            let s = &mut streams[i];
            let read_until = s.read_until;
            s.read_until = s.read_until.max(end);
            return (Some(i), read_until);
        }
        // A candidate, in place of the least recently used.
        let candidate = Stream {
            next_offset: end,
            read_until: end,
            claimed_from: 0,
            fetched_until: 0,
            last_used: now,
            pace: None,
        };
        if streams.len() < ZFETCH_MAX_STREAMS {
            streams.push(candidate);
        } else if let Some(lru) = streams.iter_mut().min_by_key(|s| s.last_used) {
            *lru = candidate;
        }
        debug_assert!(streams.len() <= ZFETCH_MAX_STREAMS, "bounded");
        (None, 0)
    }

    /// What was asked from `offset` on was not taken (no thread free): the
    /// stream's next read asks again.
    fn not_asked_from(streams: &mut [Stream], pace: &Arc<Pace>, offset: u64) {
        debug_assert!(streams.len() <= ZFETCH_MAX_STREAMS);
        if let Some(s) = streams
            .iter_mut()
            .find(|s| s.pace.as_ref().is_some_and(|p| Arc::ptr_eq(p, pace)))
        {
            s.fetched_until = s.fetched_until.min(offset);
        }
    }
}

impl Cache {
    /// Notes a demand read of `len` bytes at `offset` for the object's
    /// streams, and claims and sends what it asks to read ahead (see the
    /// module comment). Does nothing for datasets that do not read ahead in
    /// spans, for handles that read ahead themselves, and under
    /// `zfs_prefetch_disable`.
    ///
    /// Returns the record the read starts in when an earlier read of its
    /// stream touched it: the read path then takes a hit on it without
    /// promoting it (`LiveArc::peek_hit`).
    pub(crate) fn note_stream_read(
        &self,
        handle: &ObjectHandle,
        offset: u64,
        len: usize,
    ) -> Option<u64> {
        let window_bytes = handle.span_window_bytes()?;
        if self.config.zfs_prefetch_disable || len == 0 || !handle.caches_in_arc() {
            return None;
        }
        let recordsize = u64::from(handle.recordsize_bytes());
        let size_bytes = handle.size_bytes();
        let ahead_bytes = (window_bytes / 4)
            .min(self.config.arc_max_bytes / 8)
            .max(recordsize);
        let streams = handle.streams();
        // Claimed under the lock: a read of the stream that comes after
        // this one finds the claims, never races them with its own GET.
        let mut list = streams.streams.lock().expect("streams poisoned");
        let geometry = Geometry {
            recordsize,
            window_bytes,
            ahead_bytes,
            size_bytes,
        };
        debug_assert!(ahead_bytes >= recordsize && window_bytes >= recordsize);
        let noted = Streams::on_read(&mut list, (offset, len as u64), geometry);
        // The record a read continues is the one it starts in.
        debug_assert!(noted.continues.is_none_or(|r| r == offset / recordsize));
        if let Some(ask) = noted.ask {
            self.read_ahead_span(handle, &mut list, &ask);
        }
        noted.continues
    }

    /// Claims what `ask` asks for and sends it to the pool, span by span,
    /// while a thread is free for each.
    fn read_ahead_span(&self, handle: &ObjectHandle, list: &mut [Stream], ask: &Ask) {
        let Some(pool) = self.span_pool() else {
            return;
        };
        let Some(cache) = self.me.upgrade() else {
            return;
        };
        // A span to read, whose end does not overflow.
        debug_assert!(ask.len > 0 && ask.from.checked_add(ask.len).is_some());
        self.counters.zfetch_hits.add(1);
        let mut at = ask.from;
        while at < ask.from + ask.len {
            if pool.busy.fetch_add(1, Ordering::AcqRel) >= SPAN_FILL_THREADS {
                pool.busy.fetch_sub(1, Ordering::AcqRel);
                Streams::not_asked_from(list, &ask.pace, at);
                return;
            }
            let n = PREFETCH_SPAN_BYTES_MAX.min(ask.from + ask.len - at);
            let Some(span) = cache.claim_span(handle, at, n) else {
                // All in the ARC or being read already.
                pool.busy.fetch_sub(1, Ordering::AcqRel);
                at += n;
                continue;
            };
            self.counters.zfetch_io_issued.add(span.records() as u64);
            if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
                pool.jobs.try_send((span, Arc::clone(&ask.pace)))
            {
                // Dropped: its claims are given up (their readers look again).
                pool.busy.fetch_sub(1, Ordering::AcqRel);
                Streams::not_asked_from(list, &ask.pace, at);
                return;
            }
            at += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GEOMETRY: Geometry = Geometry {
        recordsize: MIB,
        window_bytes: 64 * MIB,
        ahead_bytes: 16 * MIB,
        size_bytes: 200 * MIB,
    };

    fn read(streams: &mut Vec<Stream>, offset: u64, len: u64) -> Option<(u64, u64)> {
        Streams::on_read(streams, (offset, len), GEOMETRY)
            .ask
            .map(|a| (a.from, a.len))
    }

    #[test]
    fn a_stream_asks_its_window_at_the_second_adjacent_read_then_in_large_runs() {
        let mut streams = Vec::new();
        // The first read starts a candidate; the read right after it makes
        // it sequential: the whole window from that read's record.
        assert_eq!(read(&mut streams, 0, 256 << 10), None);
        assert_eq!(
            read(&mut streams, 256 << 10, 256 << 10),
            Some((0, 64 * MIB))
        );
        // Reads in flight together arrive out of order: none resets the
        // stream or asks twice.
        assert_eq!(read(&mut streams, 1 << 20, 256 << 10), None);
        assert_eq!(read(&mut streams, 768 << 10, 256 << 10), None);
        let mut asks = Vec::new();
        let mut at = 1280 << 10;
        while at < 200 * MIB {
            if let Some(ask) = read(&mut streams, at, 256 << 10) {
                assert!(ask.0 >= 64 * MIB, "never asks twice: {ask:?}");
                asks.push(ask);
            }
            at += 256 << 10;
        }
        let asked: u64 = asks.iter().map(|&(_, len)| len).sum();
        assert_eq!(64 * MIB + asked, 200 * MIB, "everything once: {asks:?}");
        assert!(asks.len() <= 3, "{asks:?}: runs of three quarters");
        for w in asks.windows(2) {
            assert_eq!(w[0].0 + w[0].1, w[1].0, "contiguous");
        }
        assert_eq!(streams.len(), 1);
    }

    #[test]
    fn a_read_in_a_record_its_stream_touched_continues_it() {
        let mut streams = Vec::new();
        let mut continues =
            |offset: u64| Streams::on_read(&mut streams, (offset, 256 << 10), GEOMETRY).continues;
        // A candidate's first read touches record 0; the pieces after it
        // in record 0 continue it, the first piece of record 1 does not,
        // a piece behind it (reordered) does.
        assert_eq!(continues(0), None);
        assert_eq!(continues(256 << 10), Some(0));
        assert_eq!(continues(512 << 10), Some(0));
        assert_eq!(continues(MIB + (256 << 10)), None);
        assert_eq!(continues(MIB), Some(1));
        assert_eq!(continues(768 << 10), Some(0));
        assert_eq!(continues(2 * MIB), None);
    }

    #[test]
    fn random_readers_start_no_stream_and_streams_stay_apart() {
        let mut streams = Vec::new();
        for offset in [50, 20, 70, 21, 5, 90, 33, 60, 10, 80].map(|m| m * MIB) {
            assert_eq!(read(&mut streams, offset, 4096), None, "{offset}");
        }
        assert!(streams.len() <= ZFETCH_MAX_STREAMS);
        assert!(streams.iter().all(|s| s.pace.is_none()));
        // Two sequential readers of two regions: two streams, each its own.
        let mut streams = Vec::new();
        assert_eq!(read(&mut streams, 0, MIB), None);
        assert_eq!(read(&mut streams, 128 * MIB, MIB), None);
        assert_eq!(read(&mut streams, MIB, MIB), Some((MIB, 64 * MIB)));
        assert_eq!(
            read(&mut streams, 129 * MIB, MIB),
            Some((129 * MIB, 64 * MIB))
        );
        // A read inside a window another stream claimed starts none of its
        // own; the stream that claimed it asks on, cut at the end of the
        // object.
        assert_eq!(read(&mut streams, 190 * MIB, MIB), None);
        assert_eq!(read(&mut streams, 191 * MIB, MIB), None);
        let last = (131..200)
            .filter_map(|m| read(&mut streams, m * MIB, MIB))
            .last();
        assert_eq!(last, Some((193 * MIB, 7 * MIB)));
        assert_eq!(streams.iter().filter(|s| s.pace.is_some()).count(), 2);
    }

    #[test]
    fn every_read_in_a_claimed_window_moves_its_stream_and_starts_none() {
        let mut streams = Vec::new();
        // 256 KiB reads in flight together, the second overtaken by the
        // third.
        assert_eq!(read(&mut streams, 0, 256 << 10), None);
        assert_eq!(read(&mut streams, 512 << 10, 256 << 10), None);
        assert_eq!(
            read(&mut streams, 256 << 10, 256 << 10),
            Some((0, 64 * MIB))
        );
        let paces: Vec<_> = streams.iter().filter_map(|s| s.pace.clone()).collect();
        assert_eq!(paces.len(), 1);
        let read_to = || paces[0].read_to();
        let count = streams.len();
        // Reads far ahead in the window (overtaking many others, or another
        // reader's): each moves the stream's pace (a span paced to it must
        // not wait while they wait on it) and starts no stream.
        for at in [10 * MIB, 30 * MIB + 4096, 20 * MIB, 63 * MIB] {
            assert_eq!(read(&mut streams, at, 256 << 10), None);
            assert_eq!(read(&mut streams, at + (256 << 10), 256 << 10), None);
            assert_eq!(streams.len(), count, "a stream started at {at}");
        }
        assert_eq!(read_to(), 63 * MIB + (256 << 10));
    }
}
