//! A connection's workers: requests that block.
//!
//! Why threads. The engine is synchronous: a read that misses blocks its
//! thread on primary storage (milliseconds on a disk), and so do writes,
//! flushes and trims. A client such as QEMU or fio keeps many requests in
//! flight on one connection and expects them served in parallel, so each
//! connection has a pool of workers sharing one bounded queue. Reads of
//! cached data never come here where the connection has a read queue (the
//! reader serves them: `cached_reads`); what comes here is what waits on
//! primary storage. The pool starts small and grows while every worker is
//! busy, up to `workers_max`: a worker blocked on the disk holds a thread,
//! so a client with 32 misses in flight needs 32 to keep the disks busy,
//! and a connection that never misses keeps its first few asleep.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use l2arc::{Cache, ObjectHandle};

use super::budget::{read_piece_bytes, split_piece_bytes};
use super::reply::Replier;
use super::table::Slot;
use super::{Job, Shared};
use crate::protocol::{
    self, Command, NBD_CMD_FLAG_FUA, NBD_CMD_FLAG_NO_HOLE, Request, SIMPLE_REPLY_BYTES,
};

/// Largest write of zeros for `NBD_CMD_WRITE_ZEROES` when no hole is punched.
const ZERO_CHUNK_BYTES: usize = 1 << 20;

/// A connection's workers: they share one queue of requests, and the pool
/// grows while every worker is busy, up to `workers_max`. Workers end with
/// the connection.
pub(super) struct Workers {
    shared: Arc<Shared>,
    rx: Mutex<Receiver<Job>>,
    replier: Arc<Replier>,
    slot: Arc<Slot>,
    workers_max: usize,
    /// Workers started (they never end before the connection does).
    started: AtomicUsize,
    /// Workers waiting for a request.
    idle: AtomicUsize,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Workers {
    /// A connection's pool with its first `initial` workers started;
    /// `None` if not one could be started.
    pub(super) fn start(
        shared: &Arc<Shared>,
        rx: Receiver<Job>,
        replier: &Arc<Replier>,
        slot: &Arc<Slot>,
        initial: usize,
    ) -> Option<Arc<Self>> {
        let workers = Arc::new(Workers {
            shared: Arc::clone(shared),
            rx: Mutex::new(rx),
            replier: Arc::clone(replier),
            slot: Arc::clone(slot),
            workers_max: shared.config.workers_per_connection,
            started: AtomicUsize::new(0),
            idle: AtomicUsize::new(0),
            threads: Mutex::new(Vec::new()),
        });
        for _ in 0..initial.min(workers.workers_max) {
            Workers::start_one(&workers);
        }
        (workers.started.load(Ordering::SeqCst) > 0).then_some(workers)
    }

    /// Starts one more worker unless `workers_max` are running.
    fn start_one(workers: &Arc<Workers>) {
        let claimed = workers
            .started
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < workers.workers_max).then_some(n + 1)
            });
        let Ok(n) = claimed else {
            return;
        };
        // Idle from birth: a request that arrives before the new thread
        // runs is not taken for one that found every worker busy.
        workers.idle.fetch_add(1, Ordering::SeqCst);
        let pool = Arc::clone(workers);
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-worker-{n}"))
            .spawn(move || worker(&pool));
        match spawned {
            Ok(t) => {
                workers
                    .shared
                    .counters
                    .workers_started
                    .fetch_add(1, Ordering::Relaxed);
                workers
                    .threads
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(t);
            }
            Err(_) => {
                workers.idle.fetch_sub(1, Ordering::SeqCst);
                workers.started.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Waits for every worker to end (the queue's sender is gone). A worker
    /// may start another while it runs; the one it starts is listed before
    /// its own join returns, so an empty list means none is left.
    pub(super) fn join_all(&self) {
        loop {
            let next = self.threads.lock().unwrap_or_else(|p| p.into_inner()).pop();
            let Some(thread) = next else {
                return;
            };
            let _ = thread.join();
        }
    }
}

fn worker(pool: &Arc<Workers>) {
    let (shared, replier, slot) = (&*pool.shared, &*pool.replier, &*pool.slot);
    loop {
        // Counted idle (by `start_one` at first, below after each request).
        let job = {
            let rx = pool.rx.lock().unwrap_or_else(|p| p.into_inner());
            rx.recv()
        };
        let idle_before = pool.idle.fetch_sub(1, Ordering::SeqCst);
        let Ok(job) = job else {
            return;
        };
        if idle_before == 1 {
            // The last idle worker took this one: the next request would
            // wait behind busy ones.
            Workers::start_one(pool);
        }
        // A connection that is going away gets no more work done for it.
        if !replier.is_broken() && !slot.account.is_closed() {
            serve_request(shared, replier, &job);
        }
        drop(job);
        pool.idle.fetch_add(1, Ordering::SeqCst);
        let before = slot.in_flight.fetch_sub(1, Ordering::SeqCst);
        assert!(before > 0, "a request left that never came in");
    }
}

/// Reads `buf.len()` bytes at `offset_bytes`; a short read (the image
/// shrank behind us) leaves zeros, as a hole would read.
fn read_piece(shared: &Shared, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
    let n = shared.cache.read(&shared.handle, offset_bytes, buf)?;
    let len = buf.len();
    buf[n.min(len)..].fill(0);
    Ok(())
}

/// A read longer than the advertised maximum, served by splitting: the
/// first piece is read before the reply header goes out (so an early
/// error is a clean error reply); an error after that ends the connection,
/// as proto.md requires of simple replies. The connection's other replies
/// wait for this one (its pieces must not interleave with them).
fn serve_split_read(shared: &Shared, replier: &Replier, request: &Request) {
    shared
        .counters
        .requests_split
        .fetch_add(1, Ordering::Relaxed);
    let total_bytes = u64::from(request.length_bytes);
    let piece_max_bytes = u64::from(split_piece_bytes(&shared.config));
    let mut buf = vec![0u8; piece_max_bytes.min(total_bytes) as usize];
    let first_bytes = buf.len();
    if let Err(e) = read_piece(shared, request.offset_bytes, &mut buf[..first_bytes]) {
        shared
            .counters
            .request_errors
            .fetch_add(1, Ordering::Relaxed);
        replier.reply(request.cookie, protocol::errno_of(&e));
        return;
    }
    let mut conn = replier.lock();
    let header = protocol::simple_reply(request.cookie, 0);
    if !replier.write_parts(&mut conn, &[&header, &buf[..first_bytes]]) {
        return;
    }
    let mut done_bytes = first_bytes as u64;
    while done_bytes < total_bytes {
        let n = (total_bytes - done_bytes).min(piece_max_bytes) as usize;
        if read_piece(shared, request.offset_bytes + done_bytes, &mut buf[..n]).is_err() {
            shared
                .counters
                .request_errors
                .fetch_add(1, Ordering::Relaxed);
            drop(conn);
            replier.hang_up();
            return;
        }
        if !replier.write_parts(&mut conn, &[&buf[..n]]) {
            return;
        }
        done_bytes += n as u64;
    }
}

/// Runs one checked request against the cache and sends its reply.
fn serve_request(shared: &Shared, replier: &Replier, job: &Job) {
    let (request, command) = (job.request, job.command);
    debug_assert!(
        command == Command::Flush
            || request
                .offset_bytes
                .saturating_add(u64::from(request.length_bytes))
                <= shared.export.size_bytes
    );
    let result = match command {
        Command::Read if request.length_bytes > read_piece_bytes(&shared.config) => {
            serve_split_read(shared, replier, &request);
            return;
        }
        Command::Read => match serve_read(shared, replier, &request) {
            Ok(()) => return,
            Err(e) => Err(e),
        },
        _ => serve_update(shared, &request, command, &job.payload),
    };
    let error = match &result {
        Ok(()) => 0,
        Err(e) => {
            shared
                .counters
                .request_errors
                .fetch_add(1, Ordering::Relaxed);
            protocol::errno_of(e)
        }
    };
    replier.reply(request.cookie, error);
}

/// A read of at most one piece, answered with its data on success.
fn serve_read(shared: &Shared, replier: &Replier, request: &Request) -> io::Result<()> {
    let analytics = shared.cache.analytics();
    let timer = analytics.start();
    let mut reply = vec![0u8; SIMPLE_REPLY_BYTES + request.length_bytes as usize];
    read_piece(
        shared,
        request.offset_bytes,
        &mut reply[SIMPLE_REPLY_BYTES..],
    )?;
    reply[..SIMPLE_REPLY_BYTES].copy_from_slice(&protocol::simple_reply(request.cookie, 0));
    replier.send(&reply);
    analytics.frontend.finish(timer);
    Ok(())
}

/// Every command but reads: writes, flushes, trims, zeroing and prefetch.
fn serve_update(
    shared: &Shared,
    request: &Request,
    command: Command,
    payload: &[u8],
) -> io::Result<()> {
    let cache = &shared.cache;
    let handle = &shared.handle;
    let offset_bytes = request.offset_bytes;
    let length_bytes = u64::from(request.length_bytes);
    let fua = request.flags & NBD_CMD_FLAG_FUA != 0;
    let then_sync = |r: io::Result<()>| {
        if r.is_ok() && fua {
            cache.sync(handle)
        } else {
            r
        }
    };
    match command {
        Command::Write => {
            debug_assert_eq!(payload.len() as u64, length_bytes);
            then_sync(cache.write(handle, offset_bytes, payload))
        }
        Command::Flush => {
            let synced = cache.sync(handle);
            // A client that flushes wants what is on the disk: look for
            // changes made behind the export (`watch.rs`).
            shared.check_image();
            synced
        }
        Command::Trim => match cache.discard(handle, offset_bytes, length_bytes) {
            // TRIM is advisory: an image that cannot punch holes ignores it.
            Err(e) if e.kind() == io::ErrorKind::Unsupported => Ok(()),
            r => then_sync(r),
        },
        Command::WriteZeroes => {
            let punched = request.flags & NBD_CMD_FLAG_NO_HOLE == 0
                && cache.discard(handle, offset_bytes, length_bytes).is_ok();
            if punched {
                then_sync(Ok(()))
            } else {
                then_sync(write_zeroes(cache, handle, offset_bytes, length_bytes))
            }
        }
        Command::Cache => {
            let mut at = offset_bytes;
            let end = offset_bytes + length_bytes;
            while at < end {
                let n = (end - at).min(ZERO_CHUNK_BYTES as u64);
                cache.prefetch(handle, at, n as usize)?;
                at += n;
            }
            Ok(())
        }
        Command::Read | Command::Disconnect => {
            unreachable!("reads are served apart; the reader handles NBD_CMD_DISC")
        }
    }
}

fn write_zeroes(cache: &Cache, handle: &ObjectHandle, offset: u64, len: u64) -> io::Result<()> {
    // One buffer of zeros for the whole process (never written: its pages
    // stay the kernel's zero page), not one per request.
    static ZEROS: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let zeros = ZEROS.get_or_init(|| vec![0u8; ZERO_CHUNK_BYTES]);
    let mut at = offset;
    let end = offset + len;
    while at < end {
        let n = (end - at).min(zeros.len() as u64) as usize;
        cache.write(handle, at, &zeros[..n])?;
        at += n as u64;
    }
    Ok(())
}
