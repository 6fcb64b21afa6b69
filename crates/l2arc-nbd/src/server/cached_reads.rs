//! Reads of cached data, served by the connection's reader itself.
//!
//! Why in the reader. A read whose records are all in the ARC or on flash
//! needs no thread to block on: ARC hits complete at once and flash reads
//! go in flight together on one io_uring (`l2arc::ReadQueue`). Handing such
//! a read to another thread costs a wake-up per request, which is most of
//! the work of a 4 KiB hit; so the thread that decodes requests starts
//! them in its own read queue and writes their replies.
//!
//! Why it sleeps in the ring. While reads are in flight the reader has two
//! things to wait for, the device and the client; the ring watches the
//! socket too (`ReadQueue::wait_or_readable`), so the thread sleeps in one
//! place until either needs it. An earlier design gave each connection a
//! second thread that polled the socket's queue every 50 µs while reads
//! were in flight: with 128 connections 71 such threads were runnable at
//! once and the kernel took 80% of the CPU. Now an idle connection costs
//! nothing and a busy one wakes once per event.
//!
//! The one rule that keeps it deadlock-free: the reader never blocks on
//! anything another thread must release (pool memory, room in the
//! workers' queue) while its own reads are in flight, because a worker of
//! any connection may be waiting for a record one of those reads will
//! publish, which happens only when this thread reaps it. So before such a
//! wait it finishes every read it has in flight (`finish_all`); those
//! complete on their own.

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering;

use l2arc::{ReadCompletion, ReadQueue, ReadView};

use super::reply::Replier;
use super::table::Slot;
use super::{Job, Shared};
use crate::protocol;

/// A request taken by the read queue and not yet answered.
struct QueuedRead {
    job: Job,
    timer: l2arc::analytics::Timer,
}

/// The reader's read queue and the requests in it, by tag.
pub(super) struct CachedReads<'c> {
    queue: ReadQueue<'c>,
    /// The request behind each tag in flight.
    taken: Vec<Option<QueuedRead>>,
    free_tags: Vec<u64>,
    done: Vec<ReadCompletion>,
}

impl<'c> CachedReads<'c> {
    /// A read queue of `depth` for a connection where it pays (flash read
    /// through io_uring, a nonzero depth); `None` sends every read to the
    /// workers.
    pub(super) fn new(shared: &'c Shared) -> Option<Self> {
        let depth = shared
            .config
            .read_queue_depth
            .min(shared.config.max_in_flight_requests);
        if depth == 0 || shared.cache.ioengine() != l2arc::IoEngine::IoUring {
            return None;
        }
        let queue = shared.cache.read_queue(depth).ok()?;
        if queue.ioengine() != l2arc::IoEngine::IoUring {
            return None;
        }
        Some(Self {
            queue,
            taken: (0..depth).map(|_| None).collect(),
            free_tags: (0..depth as u64).rev().collect(),
            done: Vec::with_capacity(depth),
        })
    }

    /// Reads taken and not yet answered.
    pub(super) fn pending(&self) -> usize {
        self.queue.pending()
    }

    /// Starts `job` (a read of at most one buffer) if its records are all
    /// cached: `Ok(None)`. `Ok(Some(job))`: it needs primary storage (or is
    /// a small piece of a flash-only record), for the workers. `Err`: the
    /// queue failed; the connection must end (`abandon`).
    pub(super) fn take(
        &mut self,
        shared: &Shared,
        job: Job,
        replier: &Replier,
        slot: &Slot,
    ) -> io::Result<Option<Job>> {
        if !self.queue.has_room()
            && let Err(e) = self.wait_answering(shared, replier, slot, 1)
        {
            drop(job);
            slot.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(e);
        }
        let tag = self
            .free_tags
            .pop()
            .expect("a free tag while the queue has room");
        let timer = shared.cache.analytics().start();
        let request = job.request;
        match self.queue.submit_if_cached(
            &shared.handle,
            request.offset_bytes,
            request.length_bytes as usize,
            tag,
        ) {
            Ok(true) => {
                shared.counters.reads_queued.fetch_add(1, Ordering::Relaxed);
                self.taken[tag as usize] = Some(QueuedRead { job, timer });
                Ok(None)
            }
            Ok(false) => {
                shared
                    .counters
                    .reads_passed_on
                    .fetch_add(1, Ordering::Relaxed);
                self.free_tags.push(tag);
                Ok(Some(job))
            }
            Err(e) => {
                self.free_tags.push(tag);
                let failed = io::Error::new(e.kind(), e.to_string());
                answer_read(shared, replier, QueuedRead { job, timer }, Err(e));
                slot.in_flight.fetch_sub(1, Ordering::SeqCst);
                Err(failed)
            }
        }
    }

    /// Sleeps until a read completes or the client sends more (`fd`
    /// readable), answering what completed. True: the socket has input.
    pub(super) fn wait(
        &mut self,
        shared: &Shared,
        replier: &Replier,
        slot: &Slot,
        fd: BorrowedFd<'_>,
    ) -> io::Result<bool> {
        let readable = self.queue.wait_or_readable(1, &mut self.done, fd)?;
        self.answer_done(shared, replier, slot);
        Ok(readable)
    }

    /// Finishes and answers every read in flight (before the reader waits
    /// on another thread; at the end of the connection).
    pub(super) fn finish_all(
        &mut self,
        shared: &Shared,
        replier: &Replier,
        slot: &Slot,
    ) -> io::Result<()> {
        let pending = self.queue.pending();
        self.wait_answering(shared, replier, slot, pending)
    }

    fn wait_answering(
        &mut self,
        shared: &Shared,
        replier: &Replier,
        slot: &Slot,
        min: usize,
    ) -> io::Result<()> {
        let waited = self.queue.wait(min, &mut self.done);
        self.answer_done(shared, replier, slot);
        waited
    }

    fn answer_done(&mut self, shared: &Shared, replier: &Replier, slot: &Slot) {
        for completion in self.done.drain(..) {
            let read = self.taken[completion.tag as usize]
                .take()
                .expect("a completion for a read this queue took");
            self.free_tags.push(completion.tag);
            answer_read(shared, replier, read, completion.result);
            let before = slot.in_flight.fetch_sub(1, Ordering::SeqCst);
            assert!(before > 0, "a request left that never came in");
        }
    }

    /// The queue failed (its ring refused to submit or wait): reads in
    /// flight cannot be trusted to finish, so the connection ends and the
    /// requests taken are dropped with it.
    pub(super) fn abandon(&mut self, replier: &Replier, slot: &Slot) {
        replier.hang_up();
        let dropped = self.taken.iter_mut().filter_map(Option::take).count();
        slot.in_flight.fetch_sub(dropped, Ordering::SeqCst);
    }
}

/// Sends a read's reply: its bytes, zeros past a short read (the image
/// shrank behind us, as the workers' reads fill), or its error.
fn answer_read(shared: &Shared, replier: &Replier, read: QueuedRead, result: io::Result<ReadView>) {
    let request = read.job.request;
    match result {
        Ok(view) => {
            let header = protocol::simple_reply(request.cookie, 0);
            let zeros = vec![0u8; (request.length_bytes as usize).saturating_sub(view.len())];
            let mut parts: smallvec::SmallVec<[&[u8]; 4]> = smallvec::SmallVec::new();
            parts.push(&header);
            parts.extend(view.slices());
            parts.push(&zeros);
            let mut conn = replier.lock();
            replier.write_parts(&mut conn, &parts);
            drop(conn);
            shared.cache.analytics().frontend.finish(read.timer);
        }
        Err(e) => {
            shared
                .counters
                .request_errors
                .fetch_add(1, Ordering::Relaxed);
            replier.reply(request.cookie, protocol::errno_of(&e));
        }
    }
}
