//! Many reads in flight from one thread: the read queue.
//!
//! Why. [`Cache::read`] blocks its thread until the bytes are there, so a
//! caller with 32 reads to do needs 32 threads, and on flash that is the
//! ceiling (a context switch and a system call per read; see
//! `l2arc::ring`). A read queue takes reads as they come
//! ([`ReadQueue::submit`]) and hands back completions as they finish
//! ([`ReadQueue::wait`]), in any order, each with the caller's tag. ARC
//! hits complete at once; records on flash are read through the queue's
//! own io_uring, all in flight together; the rest (records only primary
//! storage has, a flash read that failed its checks) are read in the
//! calling thread, as `Cache::read` would.
//!
//! Same rules as the blocking path. A record missing from the ARC is claimed
//! (single flight) before it is read; the claim is completed when the read
//! is reaped, so readers elsewhere wait for this queue's read rather than
//! issue their own. A record someone else is filling is parked on that fill
//! and polled; the queue blocks on such a fill only when none of its own
//! reads are in flight, so two queues each waiting for the other's record
//! cannot deadlock (a queue holds unfinished claims only for reads in its
//! ring, which complete without it waiting on anyone). Every flash read is
//! verified exactly as a blocking one is, and a failure falls back to
//! primary storage: the queue never returns bytes the blocking path would
//! not.
//!
//! A queue belongs to the thread that made it (it is not `Send`): its ring
//! is set up for a single submitter, which lets the kernel defer completion
//! work to the moment that thread waits.
//!
//! Bounds: at most `depth` requests at a time (submit says `WouldBlock`
//! past that), and at most `RING_ENTRIES_MAX` device reads in flight; the
//! tables are sized once, at creation, so a steady stream of reads does not
//! allocate beyond the record buffers themselves. Dropping a queue waits
//! for its reads in flight: the kernel writes into buffers the queue owns.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use smallvec::SmallVec;

use crate::arc::live::{Fill, FillClaim, Lookup, Record};
use crate::arc::policy::AccessKind;
use crate::cache::{Cache, ObjectHandle, ReadView};
use crate::l2arc::reader::PendingRead;
use crate::l2arc::ring::{IoEngine, ReadRing};

/// Most device reads one queue keeps in flight.
pub(crate) const RING_ENTRIES_MAX: usize = 256;
/// Most requests one queue holds.
pub(crate) const QUEUE_DEPTH_MAX: usize = 4096;
/// Most completed flash reads finished (checked, published to the ARC) per
/// reap. Finishing one costs ~3 µs at 8 KiB (most of it the CRC of lines
/// the device has just written, cold to this core), and the device gets a
/// new read only once the caller has a completion back: a thread that
/// wakes to 15 completions and finishes them all leaves the device 15
/// reads short for ~45 µs. Two per reap gets the first replacement out
/// after ~6 µs, at one system call per two reads. Measured side by side
/// (`l2-hit`, 8 KiB QD32, quiet machine, medians of paired single rounds):
/// 2 per reap 0.95x of fio io_uring, 1 per reap 0.94x, 4 per reap 0.85x,
/// all 32 0.60x.
const FINISH_PER_REAP_MAX: usize = 2;

/// A finished read: the caller's tag and the bytes (shared record buffers,
/// as [`Cache::read_view`] returns them) or the error.
pub struct ReadCompletion {
    /// The tag given to `submit`.
    pub tag: u64,
    /// The bytes read, or why not.
    pub result: io::Result<ReadView>,
}

/// Where one record of a request stands.
enum RecordSlot {
    Ready(Arc<Record>),
    /// Being read through this queue's ring.
    Reading,
    /// Someone (maybe this queue) is filling it: poll the fill.
    Parked(Arc<Fill>),
}

struct Request {
    tag: u64,
    handle: ObjectHandle,
    offset: u64,
    /// End of the read, clipped to the object's size at submit.
    end: u64,
    first_record: u64,
    kind: AccessKind,
    /// A record an earlier read of its sequential stream touched: a hit on
    /// it is no new access (`Cache::note_stream_read`).
    continues: Option<u64>,
    slots: SmallVec<[RecordSlot; 2]>,
    unresolved: usize,
    error: Option<io::Error>,
}

/// A flash read in the ring.
struct Op<'c> {
    request: u32,
    slot: u32,
    token: u64,
    fill_sequence: u64,
    /// Started when the flash read was (analytics' `l2_hit` latency).
    timer: crate::analytics::Timer,
    claim: FillClaim<'c>,
    pending: PendingRead,
}

/// Reads with many in flight, for one thread. See the module comment.
pub struct ReadQueue<'c> {
    cache: &'c Cache,
    ring: Option<ReadRing>,
    requests: Vec<Option<Request>>,
    free_requests: Vec<u32>,
    ops: Vec<Option<Op<'c>>>,
    free_ops: Vec<u32>,
    /// Requests with a parked record, polled after each reap.
    parked: Vec<u32>,
    /// Requests submitted and not yet handed back (at most `depth`: the
    /// done list is bounded by it too).
    outstanding: usize,
    done: VecDeque<ReadCompletion>,
    /// Not `Send`: the ring belongs to the thread that made it.
    _one_thread: std::marker::PhantomData<*const ()>,
}

impl Cache {
    /// A read queue for up to `depth` reads at a time from one thread,
    /// reading flash through io_uring unless the cache's `l2arc_ioengine`
    /// resolved to psync.
    pub fn read_queue(&self, depth: usize) -> io::Result<ReadQueue<'_>> {
        if !(1..=QUEUE_DEPTH_MAX).contains(&depth) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("read queue depth must be from 1 to {QUEUE_DEPTH_MAX}, not {depth}"),
            ));
        }
        let ring_entries = depth.min(RING_ENTRIES_MAX);
        let ring = match self.ioengine() {
            IoEngine::IoUring => Some(ReadRing::new(ring_entries as u32)?),
            _ => None,
        };
        let ops_max = ring
            .as_ref()
            .map_or(0, |_| ring_entries.next_power_of_two());
        let queue = ReadQueue {
            cache: self,
            ring,
            requests: (0..depth).map(|_| None).collect(),
            free_requests: (0..depth as u32).rev().collect(),
            ops: (0..ops_max).map(|_| None).collect(),
            free_ops: (0..ops_max as u32).rev().collect(),
            parked: Vec::with_capacity(depth),
            outstanding: 0,
            done: VecDeque::with_capacity(depth),
            _one_thread: std::marker::PhantomData,
        };
        // A slot per request, and an op slot per ring entry (none without).
        debug_assert_eq!(queue.free_requests.len(), depth);
        debug_assert!(queue.ring.is_none() || queue.ops.len() >= ring_entries);
        Ok(queue)
    }
}

impl<'c> ReadQueue<'c> {
    /// How this queue reads flash: `IoUring` or `Psync`.
    pub fn ioengine(&self) -> IoEngine {
        // Op slots are the ring's: a psync queue has none.
        debug_assert!(self.ring.is_some() || self.ops.is_empty());
        if self.ring.is_some() {
            IoEngine::IoUring
        } else {
            IoEngine::Psync
        }
    }

    /// Requests submitted and not yet handed back by [`Self::wait`].
    pub fn pending(&self) -> usize {
        debug_assert!(self.outstanding <= self.requests.len(), "at most depth");
        self.outstanding
    }

    /// Whether [`Self::submit`] would take another request.
    pub fn has_room(&self) -> bool {
        // Outstanding: requests live in a slot, or done and not handed back.
        debug_assert_eq!(
            self.free_requests.len() + self.outstanding,
            self.requests.len() + self.done.len()
        );
        self.outstanding < self.requests.len()
    }

    /// Starts a read of `len` bytes at `offset` (short at the end of the
    /// object, as `pread`). Its completion carries `tag`. A full queue
    /// refuses with `WouldBlock`: wait for completions first. Reads of
    /// records only primary storage has are done before this returns.
    pub fn submit(
        &mut self,
        handle: &ObjectHandle,
        offset: u64,
        len: usize,
        tag: u64,
    ) -> io::Result<()> {
        let before = self.outstanding;
        let submitted = self.submit_kind(handle, offset, len, tag, AccessKind::Demand);
        // Taken (counted until handed back), or refused before anything.
        debug_assert!(submitted.is_err() || self.outstanding == before + 1);
        debug_assert!(self.outstanding <= self.requests.len());
        submitted
    }

    /// As [`Self::submit`], for a caller that has another way to serve
    /// reads (threads of its own, each with [`Cache::read`]): `Ok(false)`,
    /// and nothing taken, when a record under the range is neither in the
    /// ARC (resident or being filled) nor on flash, so that the thread
    /// owning the queue does not wait on primary storage; and when the
    /// read is a small piece of a record that only flash holds, with a
    /// sector table, which `Cache::read` reads alone where the queue would
    /// read the whole record (a 4 KiB read of a 128 KiB record: 1/32 of the
    /// flash bandwidth). A record that leaves both between this check and
    /// its lookup is still read, from primary storage in this thread:
    /// correct, only slower.
    pub fn submit_if_cached(
        &mut self,
        handle: &ObjectHandle,
        offset: u64,
        len: usize,
        tag: u64,
    ) -> io::Result<bool> {
        let before = self.outstanding;
        if !self.cache.queue_takes(handle, offset, len) {
            return Ok(false);
        }
        let taken = self.submit(handle, offset, len, tag).map(|()| true);
        debug_assert!(!matches!(taken, Ok(true)) || self.outstanding == before + 1);
        taken
    }

    fn submit_kind(
        &mut self,
        handle: &ObjectHandle,
        offset: u64,
        len: usize,
        tag: u64,
        kind: AccessKind,
    ) -> io::Result<()> {
        if !self.has_room() {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "read queue full: wait for completions",
            ));
        }
        let index = self
            .free_requests
            .pop()
            .expect("a free slot per outstanding request");
        self.outstanding += 1;
        if !handle.caches_in_arc() {
            // primarycache=none: nothing to overlap; read it here.
            let mut buf = vec![0u8; len];
            let result = self.cache.read(handle, offset, &mut buf).map(|n| {
                buf.truncate(n);
                ReadView::owned(buf)
            });
            self.free_requests.push(index);
            self.done.push_back(ReadCompletion { tag, result });
            return Ok(());
        }
        let size_bytes = handle.size_bytes();
        let end = offset.saturating_add(len as u64).min(size_bytes);
        let recordsize = u64::from(handle.recordsize_bytes());
        // Before its records are looked up: a span it asks for is claimed
        // first, and this read waits on it.
        let continues = (kind == AccessKind::Demand && offset < end)
            .then(|| self.cache.note_stream_read(handle, offset, len))
            .flatten();
        let records = if len == 0 || offset >= end {
            0..0
        } else {
            offset / recordsize..(end - 1) / recordsize + 1
        };
        let mut request = Request {
            tag,
            handle: handle.clone(),
            offset,
            end,
            first_record: records.start,
            kind,
            continues,
            slots: SmallVec::new(),
            unresolved: (records.end - records.start) as usize,
            error: None,
        };
        request
            .slots
            .extend(records.clone().map(|_| RecordSlot::Reading));
        // One slot per record under the range, all unresolved, and the
        // range within what was asked.
        debug_assert!(
            request.slots.len() == request.unresolved && end - offset.min(end) <= len as u64
        );
        debug_assert!(self.requests[index as usize].is_none(), "a free slot");
        self.requests[index as usize] = Some(request);
        // Timed as `Cache::read` times ARC hits: a request that completes
        // here, without going below the ARC, was served from DRAM.
        let timer = self
            .cache
            .analytics
            .start_read_if(kind == AccessKind::Demand);
        for slot in 0..(records.end - records.start) as u32 {
            self.resolve(index, slot)?;
        }
        let from_dram = self.requests[index as usize]
            .as_ref()
            .is_some_and(|r| r.unresolved == 0 && r.error.is_none());
        self.finish_if_resolved(index);
        if from_dram {
            self.cache
                .analytics
                .finish_read(timer, handle.dataset().0, handle.object_id());
        }
        Ok(())
    }

    /// Looks one record of a request up and starts whatever it needs.
    fn resolve(&mut self, index: u32, slot: u32) -> io::Result<()> {
        let request = self.requests[index as usize]
            .as_ref()
            .expect("live request");
        let record = request.first_record + u64::from(slot);
        // Resolved once: from `Reading`, the shape it starts in.
        debug_assert!(matches!(request.slots[slot as usize], RecordSlot::Reading));
        let key = request.handle.record_key(record);
        let token = request.handle.token();
        let kind = request.kind;
        if request.continues == Some(record)
            && let Some(hit) = self.cache.arc.peek_hit(key, token)
        {
            self.deliver(index, slot, Ok(hit));
            return Ok(());
        }
        match self.cache.arc.lookup(key, token, kind) {
            Lookup::Hit(record) => self.deliver(index, slot, Ok(record)),
            Lookup::InFlight(fill) => {
                // `parked` lists each request with a parked record once.
                let request = self.requests[index as usize]
                    .as_mut()
                    .expect("live request");
                if !request
                    .slots
                    .iter()
                    .any(|s| matches!(s, RecordSlot::Parked(_)))
                {
                    self.parked.push(index);
                }
                request.slots[slot as usize] = RecordSlot::Parked(fill);
            }
            Lookup::Claimed(claim) => {
                let fill_sequence = self.cache.invalidation_sequence.load(Ordering::Acquire);
                let handle = request.handle.clone();
                let recordsize = handle.recordsize_bytes();
                if self.ring.is_some()
                    && let Some((l2, key_hash)) = self.cache.l2_source(&handle, record, token)
                    && let Some(pending) = l2.begin_read(key_hash, recordsize)
                {
                    if pending.device_io().ring_fd().is_some() {
                        return self.start_op(index, slot, (token, fill_sequence), claim, pending);
                    }
                    // A device the ring cannot read: read it here.
                    self.read_here((index, slot), (token, fill_sequence), claim, pending);
                    return Ok(());
                }
                // With a ring the L2ARC was asked above: not on flash (or
                // not allowed there), the tiers after it, then primary.
                let skip = usize::from(self.ring.is_some());
                let (result, from_primary) =
                    self.cache.fill_record_from(&handle, record, token, skip);
                let primary = from_primary.then_some((&handle, record));
                let record = self
                    .cache
                    .publish_fill(claim, result, token, fill_sequence, primary);
                self.deliver(index, slot, record);
            }
        }
        Ok(())
    }

    fn start_op(
        &mut self,
        index: u32,
        slot: u32,
        (token, fill_sequence): (u64, u64),
        claim: FillClaim<'c>,
        mut pending: PendingRead,
    ) -> io::Result<()> {
        while !self.ring.as_ref().expect("ring").has_room() {
            self.reap(1)?;
        }
        // A live op per read in the ring, a free slot for every other.
        debug_assert_eq!(
            self.free_ops.len() + self.ring.as_ref().map_or(0, ReadRing::in_flight),
            self.ops.len()
        );
        let op_index = self.free_ops.pop().expect("one op slot per ring entry");
        debug_assert!(self.ops[op_index as usize].is_none());
        let fd = pending
            .device_io()
            .ring_fd()
            .expect("checked by the caller");
        let offset = pending.offset_bytes();
        let buf = pending.buf_mut();
        let (ptr, len) = (buf.as_mut_ptr(), buf.len() as u32);
        let ring = self.ring.as_mut().expect("ring");
        // SAFETY: the buffer is owned by `pending`, kept in `self.ops` until
        // its completion is reaped (its heap memory does not move with it);
        // the descriptor belongs to the device `pending` pins, which is not
        // removed while a read on it is pending; `Drop` drains the ring.
        let pushed = unsafe { ring.push_read(fd, offset, ptr, len, u64::from(op_index)) };
        if pushed.is_err() {
            // The ring refused it: read it here instead.
            self.free_ops.push(op_index);
            self.read_here((index, slot), (token, fill_sequence), claim, pending);
            return Ok(());
        }
        self.ops[op_index as usize] = Some(Op {
            request: index,
            slot,
            token,
            fill_sequence,
            timer: self.cache.analytics.start(),
            claim,
            pending,
        });
        Ok(())
    }

    /// Hands a record (or its error) to a request's slot.
    fn deliver(&mut self, index: u32, slot: u32, record: io::Result<Arc<Record>>) {
        let request = self.requests[index as usize]
            .as_mut()
            .expect("live request");
        debug_assert!(!matches!(
            request.slots[slot as usize],
            RecordSlot::Ready(_)
        ));
        match record {
            Ok(record) => request.slots[slot as usize] = RecordSlot::Ready(record),
            Err(e) => {
                request.error.get_or_insert(e);
                // Keep the slot's shape; the request fails as a whole.
                request.slots[slot as usize] = RecordSlot::Reading;
            }
        }
        request.unresolved -= 1;
    }

    /// Moves a request whose records are all resolved to the done list.
    fn finish_if_resolved(&mut self, index: u32) {
        let request = self.requests[index as usize]
            .as_ref()
            .expect("live request");
        if request.unresolved > 0 {
            return;
        }
        let request = self.requests[index as usize].take().expect("live request");
        self.free_requests.push(index);
        let result = match request.error {
            Some(e) => Err(e),
            None => Ok(assemble(&request)),
        };
        debug_assert!(self.done.len() < self.outstanding, "done ≤ outstanding");
        if let Ok(view) = &result
            && request.kind == AccessKind::Demand
        {
            self.cache.counters.reads.add(1);
            self.cache.counters.read_bytes.add(view.len() as u64);
        }
        self.done.push_back(ReadCompletion {
            tag: request.tag,
            result,
        });
    }

    /// Hands back at least `min` completions (fewer only if fewer are
    /// pending), appended to `out`; more if more are ready.
    pub fn wait(&mut self, min: usize, out: &mut Vec<ReadCompletion>) -> io::Result<()> {
        let (given, pending) = (out.len(), self.outstanding);
        self.wait_until(min, out, None)?;
        // Without a timeout, at least `min` (or all pending) come back.
        debug_assert!(out.len() - given >= min.min(pending));
        Ok(())
    }

    /// As [`Self::wait`], but returns after `timeout` even with fewer than
    /// `min` (maybe none) when all it waits on are reads in the ring: for a
    /// caller that also has new requests to take. A wait on a record someone
    /// else is filling is not cut short.
    pub fn wait_timeout(
        &mut self,
        min: usize,
        out: &mut Vec<ReadCompletion>,
        timeout: std::time::Duration,
    ) -> io::Result<()> {
        let (given, pending) = (out.len(), self.outstanding);
        self.wait_until(min, out, Some(timeout))?;
        debug_assert!(out.len() - given <= pending, "only what was pending");
        Ok(())
    }

    /// As [`Self::wait`], but also returns, with `true`, as soon as `fd`
    /// has input (or hung up, or failed) while this queue's reads are in
    /// flight: for a thread that serves a socket and keeps reads in flight
    /// (an NBD connection), so that it sleeps in one place until either
    /// needs it, and costs nothing while neither does. The reads queued
    /// since the last wait are sent to the device before it returns. With
    /// nothing of its own in flight it does not watch `fd` (the caller then
    /// reads the socket itself); a wait on a record someone else is filling
    /// does not watch it either. One `fd` per queue.
    pub fn wait_or_readable(
        &mut self,
        min: usize,
        out: &mut Vec<ReadCompletion>,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> io::Result<bool> {
        use std::os::fd::AsRawFd;
        let (given, pending) = (out.len(), self.outstanding);
        let readable = self.wait_watching(min, out, None, Some(fd.as_raw_fd()))?;
        debug_assert!(out.len() - given <= pending, "only what was pending");
        Ok(readable)
    }

    fn wait_until(
        &mut self,
        min: usize,
        out: &mut Vec<ReadCompletion>,
        timeout: Option<std::time::Duration>,
    ) -> io::Result<()> {
        let (given, pending) = (out.len(), self.outstanding);
        let waited = self.wait_watching(min, out, timeout, None).map(|_| ());
        // Each completion handed back is one request fewer outstanding.
        debug_assert!(waited.is_err() || pending - self.outstanding == out.len() - given);
        waited
    }

    /// The one wait loop: until `min` completions (fewer if fewer are
    /// pending), `timeout`, or input on `watch`; true for the last.
    fn wait_watching(
        &mut self,
        min: usize,
        out: &mut Vec<ReadCompletion>,
        timeout: Option<std::time::Duration>,
        watch: Option<std::os::fd::RawFd>,
    ) -> io::Result<bool> {
        debug_assert!(self.outstanding <= self.requests.len());
        let want = min.min(self.outstanding);
        let mut timed_out = false;
        let mut given = 0;
        loop {
            while let Some(completion) = self.done.pop_front() {
                out.push(completion);
                given += 1;
                self.outstanding -= 1;
            }
            let readable = watch.is_some() && self.ring.as_mut().is_some_and(|r| r.take_readable());
            if given >= want || timed_out || readable {
                if watch.is_some()
                    && let Some(ring) = self.ring.as_mut()
                {
                    // The caller is about to write replies and read its
                    // socket: the device gets the reads queued meanwhile.
                    ring.submit_queued()?;
                }
                return Ok(readable);
            }
            let ring_busy = self.ring.as_ref().is_some_and(|r| r.in_flight() > 0);
            if ring_busy {
                if let (Some(fd), Some(ring)) = (watch, self.ring.as_mut()) {
                    ring.arm_poll(fd)?;
                }
                match timeout {
                    Some(timeout) => timed_out = !self.reap_within(timeout)?,
                    None => self.reap(1)?,
                }
            } else if let Some(&index) = self.parked.first() {
                // Nothing of ours in flight: a parked record waits on a
                // fill elsewhere, which completes without us.
                self.wait_parked(index);
            } else {
                // Every unfinished request has a read in the ring or a
                // parked record; with neither, all are done.
                assert_eq!(self.outstanding, 0, "a request is stranded");
                return Ok(false);
            }
            self.poll_parked()?;
        }
    }

    /// Sends queued ring reads, waits for `want` completions, and finishes
    /// every completed read.
    fn reap(&mut self, want: usize) -> io::Result<()> {
        let Some(ring) = self.ring.as_mut() else {
            return Ok(());
        };
        // Only ever waits for reads it has in flight.
        debug_assert!(want <= ring.in_flight());
        ring.submit_and_wait(want)?;
        self.finish_completed();
        Ok(())
    }

    /// As `reap(1)`, giving up after `timeout`: false if nothing completed.
    fn reap_within(&mut self, timeout: std::time::Duration) -> io::Result<bool> {
        let Some(ring) = self.ring.as_mut() else {
            return Ok(false);
        };
        let completed_any = ring.submit_and_wait_timeout(timeout)?;
        self.finish_completed();
        debug_assert!(
            self.ring
                .as_ref()
                .is_some_and(|r| r.in_flight() <= self.ops.len())
        );
        Ok(completed_any)
    }

    /// Finishes up to `FINISH_PER_REAP_MAX` of the reads the ring has
    /// completed; the rest wait in the ring for the next call.
    fn finish_completed(&mut self) {
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        let mut completed: SmallVec<[(u64, i32); FINISH_PER_REAP_MAX]> = SmallVec::new();
        ring.reap(FINISH_PER_REAP_MAX, |user_data, result| {
            completed.push((user_data, result));
        });
        debug_assert!(completed.len() <= FINISH_PER_REAP_MAX && !completed.spilled());
        for (user_data, result) in completed {
            self.complete_op(user_data as u32, result);
        }
    }

    fn complete_op(&mut self, op_index: u32, result: i32) {
        // The user data of a read is its op slot (never the poll's).
        debug_assert!((op_index as usize) < self.ops.len());
        let op = self.ops[op_index as usize]
            .take()
            .expect("a reaped op is live");
        self.free_ops.push(op_index);
        let Op {
            request: index,
            slot,
            token,
            fill_sequence,
            timer,
            claim,
            mut pending,
        } = op;
        let len = pending.buf_mut().len();
        let io_result = crate::l2arc::ring::read_outcome(result, len);
        let offset = pending.offset_bytes();
        let io_result = {
            // Split borrow: the device (behind an Arc) and the buffer.
            let buf: *mut [u8] = pending.buf_mut();
            // SAFETY: `buf` points into `pending`'s own heap buffer, which
            // nothing else touches while the device checks it.
            pending
                .device_io()
                .finish_ring_read(offset, unsafe { &mut *buf }, io_result)
        };
        self.finish_flash_read(
            (index, slot),
            (token, fill_sequence),
            claim,
            pending,
            io_result,
            timer,
        );
        self.finish_if_resolved(index);
    }

    /// Reads a pending flash read with a positioned read in this thread
    /// (a device the ring cannot read, or a submission it refused).
    fn read_here(
        &mut self,
        (index, slot): (u32, u32),
        token_and_sequence: (u64, u64),
        claim: FillClaim<'c>,
        mut pending: PendingRead,
    ) {
        debug_assert!(
            self.requests[index as usize]
                .as_ref()
                .is_some_and(|r| matches!(r.slots[slot as usize], RecordSlot::Reading))
        );
        let timer = self.cache.analytics.start();
        let io_result = pending.read_psync();
        self.finish_flash_read(
            (index, slot),
            token_and_sequence,
            claim,
            pending,
            io_result,
            timer,
        );
    }

    /// Checks what a flash read returned (checksum, decompression) and
    /// completes the record's claim with it, or with primary storage's
    /// bytes when anything on flash failed.
    fn finish_flash_read(
        &mut self,
        (index, slot): (u32, u32),
        (token, fill_sequence): (u64, u64),
        claim: FillClaim<'c>,
        pending: PendingRead,
        io_result: io::Result<()>,
        timer: crate::analytics::Timer,
    ) {
        let l2 = self.cache.l2.get().expect("a pending read has an L2ARC");
        let request = self.requests[index as usize]
            .as_ref()
            .expect("live request");
        let handle = request.handle.clone();
        let record = request.first_record + u64::from(slot);
        let recordsize = handle.recordsize_bytes() as usize;
        debug_assert!(matches!(request.slots[slot as usize], RecordSlot::Reading));
        let (result, from_primary) = match l2
            .finish_read(pending, io_result)
            .filter(|data| data.len() <= recordsize)
        {
            Some(data) => {
                self.cache.note_below_hit(
                    &handle,
                    crate::analytics::Below::L2Arc,
                    timer,
                    data.len() as u64,
                );
                (Ok(data), false)
            }
            // Any failure on flash is a miss: the tiers after the L2ARC,
            // then primary storage, have it.
            None => self.cache.fill_record_from(&handle, record, token, 1),
        };
        let primary = from_primary.then_some((&handle, record));
        let record = self
            .cache
            .publish_fill(claim, result, token, fill_sequence, primary);
        self.deliver(index, slot, record);
    }

    /// Finishes the records parked on fills that have completed.
    fn poll_parked(&mut self) -> io::Result<()> {
        let mut at = 0;
        while at < self.parked.len() {
            let index = self.parked[at];
            let mut still_parked = false;
            let slots = self.requests[index as usize]
                .as_ref()
                .expect("parked request is live")
                .slots
                .len();
            for slot in 0..slots as u32 {
                let request = self.requests[index as usize].as_ref().expect("live");
                let RecordSlot::Parked(fill) = &request.slots[slot as usize] else {
                    continue;
                };
                let Some(result) = fill.try_result() else {
                    still_parked = true;
                    continue;
                };
                let token = request.handle.token();
                match result {
                    Ok(record) if record.generation_token == token => {
                        self.deliver(index, slot, Ok(record));
                    }
                    Err(e) if !e.is_abandoned() => self.deliver(index, slot, Err(e.into())),
                    // Filled under another generation, or the claim was
                    // dropped unfilled: look again.
                    _ => self.look_again(index, slot, &mut still_parked)?,
                }
            }
            if still_parked {
                at += 1;
            } else {
                self.parked.swap_remove(at);
                self.finish_if_resolved(index);
            }
        }
        // Every request still listed has a record parked (O(parked)).
        debug_assert!(self.parked.iter().all(|&i| {
            self.requests[i as usize]
                .as_ref()
                .is_some_and(|r| r.slots.iter().any(|s| matches!(s, RecordSlot::Parked(_))))
        }));
        Ok(())
    }

    /// Resolves a parked record again (its fill gave nothing usable).
    fn look_again(&mut self, index: u32, slot: u32, still_parked: &mut bool) -> io::Result<()> {
        {
            let request = self.requests[index as usize].as_mut().expect("live");
            debug_assert!(matches!(
                request.slots[slot as usize],
                RecordSlot::Parked(_)
            ));
            request.slots[slot as usize] = RecordSlot::Reading;
        }
        self.resolve_again(index, slot)?;
        let request = self.requests[index as usize].as_ref().expect("live");
        *still_parked |= matches!(request.slots[slot as usize], RecordSlot::Parked(_));
        Ok(())
    }

    /// `resolve` for a record already counted in `parked`'s request.
    fn resolve_again(&mut self, index: u32, slot: u32) -> io::Result<()> {
        let before = self.parked.len();
        self.resolve(index, slot)?;
        // The request is in `parked` already; `resolve` may have added it.
        if self.parked.len() > before {
            self.parked.pop();
        }
        debug_assert_eq!(self.parked.len(), before, "listed once");
        Ok(())
    }

    /// Blocks until one parked fill of request `index` completes.
    fn wait_parked(&self, index: u32) {
        debug_assert!(self.parked.contains(&index));
        let request = self.requests[index as usize].as_ref().expect("live");
        if let Some(RecordSlot::Parked(fill)) = request
            .slots
            .iter()
            .find(|s| matches!(s, RecordSlot::Parked(_)))
        {
            let _ = fill.wait();
        }
    }
}

/// A resolved request's bytes, as `read_view` would give them.
fn assemble(request: &Request) -> ReadView {
    let recordsize = u64::from(request.handle.recordsize_bytes());
    let mut view = ReadView::empty();
    for (i, slot) in request.slots.iter().enumerate() {
        let RecordSlot::Ready(record) = slot else {
            unreachable!("a request without error has every record");
        };
        let record_start = (request.first_record + i as u64) * recordsize;
        let from = (request.offset.max(record_start) - record_start) as usize;
        let to = ((request.end - record_start) as usize).min(record.data.len());
        if from < to {
            view.push(Arc::clone(record), from..to);
        }
        if record.data.len() < recordsize as usize {
            break; // end of object as the primary saw it
        }
    }
    // No more than the request asked for (its end clipped at submit).
    debug_assert!(view.len() as u64 <= request.end - request.offset.min(request.end));
    view
}

impl Drop for ReadQueue<'_> {
    fn drop(&mut self) {
        // The kernel writes into buffers in `ops`: wait for every read.
        while self.ring.as_ref().is_some_and(|r| r.in_flight() > 0) {
            if self.reap(1).is_err() {
                // A ring that cannot be waited on cannot be left with our
                // buffers either.
                std::process::abort();
            }
        }
        debug_assert!(
            std::thread::panicking() || self.ops.iter().all(Option::is_none),
            "every read reaped"
        );
    }
}
