//! Polled lone reads: a flash read that nothing else is waiting beside.
//!
//! Why. A blocking read of a record from flash ([`super::L2Arc::read`], the
//! path of `Cache::read`) costs the device's time plus the time to put the
//! thread to sleep and wake it when the completion interrupt comes: a
//! scheduler round trip, about a microsecond on the machine measured here
//! (a 4 KiB read: 24.7 us with `pread`, 23.7 us submitted to an io_uring and
//! watched in a loop), and a larger share of a real NVMe device's 10 us.
//! At queue depth 1 (one client, a sequential reader that missed the ARC)
//! that wake-up is the gap between the cache and the bare device.
//!
//! A thread can instead hand the read to an io_uring of its own and watch
//! the completion queue until the bytes land: no sleep, no wake-up. That
//! spends a core for as long as the read takes, which pays only when a core
//! would otherwise idle. So a read polls only while the process's blocking
//! flash reads in flight (this one included) are no more than its spare
//! cores (all but one): one client polls, thirty-two threads reading at
//! once sleep in `pread` as before, since their cores have other work. A
//! poll is bounded by `l2arc_read_poll_us`, after which the thread sleeps
//! in the ring until the read completes (a slow or stalled device costs a
//! bounded spin, not a core).
//!
//! The ring is set up plainly (no deferred task work), so that the kernel
//! posts the completion while the thread is still in user space. One ring
//! per thread, made at its first polled read, one read in it at a time; a
//! thread whose ring the kernel refuses reads with `pread` from then on.

use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::ring::{ReadRing, read_outcome};

/// Blocking flash reads in flight in this process (polled or not).
static BLOCKING_READS_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Spins between two looks at the clock while polling (a look costs more
/// than a look at the completion queue).
const SPINS_PER_CLOCK_CHECK: u32 = 32;

thread_local! {
    static RING: RefCell<ThreadRing> = const { RefCell::new(ThreadRing::NotMade) };
}

enum ThreadRing {
    NotMade,
    /// The kernel refused a ring to this thread: it reads with `pread`.
    Refused,
    /// Boxed: most threads never poll, and keep only the tag.
    Ready(Box<ReadRing>),
}

/// Cores beyond the one every thread of the process could be on: how many
/// reads may poll at once.
fn spare_cores() -> usize {
    static SPARE: OnceLock<usize> = OnceLock::new();
    *SPARE.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(cores >= 1);
        cores - 1
    })
}

/// One blocking flash read, counted in flight from `start` until dropped.
pub(crate) struct BlockingRead {
    may_poll: bool,
}

impl BlockingRead {
    pub(crate) fn start() -> Self {
        let before = BLOCKING_READS_IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
        // Far from wrapping: each read in flight is one thread's.
        debug_assert!(before < isize::MAX as usize, "blocking reads count wrapped");
        Self {
            may_poll: before < spare_cores(),
        }
    }

    /// Whether a core is free for this read to poll on (see the module
    /// comment).
    pub(crate) fn may_poll(&self) -> bool {
        // Negative space: with no spare core no read ever polls.
        debug_assert!(!self.may_poll || spare_cores() > 0);
        self.may_poll
    }
}

impl Drop for BlockingRead {
    fn drop(&mut self) {
        let before = BLOCKING_READS_IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
        // Paired with `start`: this read was counted.
        debug_assert!(before >= 1, "blocking reads count underflowed");
    }
}

/// How a polled read ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Polled {
    /// The completion came within the poll.
    Completed,
    /// The poll ran out; the thread slept until the completion came.
    Slept,
}

/// Reads `buf.len()` bytes at `offset` of `fd` through this thread's ring,
/// polling for the completion for at most `poll_max`. `None`: this thread
/// has no ring (the kernel refused one, or would not take the read), and
/// nothing was read; the caller reads another way.
/// Returns only once the kernel is done with `buf`.
pub(crate) fn read(
    fd: RawFd,
    offset: u64,
    buf: &mut [u8],
    poll_max: Duration,
) -> Option<(io::Result<()>, Polled)> {
    RING.with(|slot| {
        let mut slot = slot.borrow_mut();
        if matches!(*slot, ThreadRing::NotMade) {
            *slot = match ReadRing::new_polled(2) {
                Ok(ring) => ThreadRing::Ready(Box::new(ring)),
                Err(_) => ThreadRing::Refused,
            };
        }
        let ThreadRing::Ready(ring) = &mut *slot else {
            return None;
        };
        let read = read_on(ring, fd, offset, buf, poll_max);
        // A read that went out was reaped: the ring holds no pointer to `buf`.
        debug_assert!(read.is_none() || ring.in_flight() == 0);
        if read.is_none() {
            // A read the ring took but could not send would go out with the
            // next one, into a buffer gone by then: drop the ring unsent.
            *slot = ThreadRing::Refused;
        }
        read
    })
}

fn read_on(
    ring: &mut ReadRing,
    fd: RawFd,
    offset: u64,
    buf: &mut [u8],
    poll_max: Duration,
) -> Option<(io::Result<()>, Polled)> {
    debug_assert_eq!(ring.in_flight(), 0, "one read at a time");
    let len = buf.len();
    // SAFETY: `buf` outlives the read: this function returns only after the
    // completion is reaped (or the process aborts, below).
    let pushed = unsafe { ring.push_read(fd, offset, buf.as_mut_ptr(), len as u32, 0) };
    if pushed.is_err() || ring.submit_and_wait(0).is_err() {
        return None;
    }
    let mut polled = Polled::Completed;
    if !until_ready(ring, poll_max) {
        polled = Polled::Slept;
        if let Err(e) = ring.submit_and_wait(1) {
            // The kernel may still write into `buf`, which the caller will
            // free: no way on is safe.
            eprintln!("l2arc: waiting on an io_uring read failed ({e}); aborting");
            std::process::abort();
        }
    }
    let mut result = None;
    ring.reap(1, |_, r| result = Some(r));
    let result = result.expect("a completion after the wait for one");
    debug_assert_eq!(ring.in_flight(), 0, "the one read was reaped");
    Some((read_outcome(result, len), polled))
}

/// Watches `ring`'s completion queue for up to `poll_max`: whether a
/// completion is there.
fn until_ready(ring: &mut ReadRing, poll_max: Duration) -> bool {
    debug_assert_eq!(ring.in_flight(), 1, "one read to wait for");
    let started = Instant::now();
    loop {
        for _ in 0..SPINS_PER_CLOCK_CHECK {
            if ring.completion_ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        if started.elapsed() >= poll_max {
            return ring.completion_ready();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::AlignedBuf;
    use std::os::fd::AsRawFd;

    #[test]
    fn polled_reads_return_the_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..64 * 4096).map(|i| (i * 13 + i / 4096) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let mut buf = AlignedBuf::zeroed(8192);
        for block in [3u64, 40] {
            let (result, polled) = read(
                file.as_raw_fd(),
                block * 4096,
                buf.as_mut_slice(),
                Duration::from_secs(1),
            )
            .expect("io_uring is available here: the tests need it");
            result.unwrap();
            let at = block as usize * 4096;
            assert_eq!(&buf[..], &data[at..at + 8192]);
            // From the page cache: done at submission, within any poll.
            assert_eq!(polled, Polled::Completed);
        }
        // Past the end: a short read is an error, not stale bytes.
        let (result, _) = read(
            file.as_raw_fd(),
            63 * 4096,
            buf.as_mut_slice(),
            Duration::ZERO,
        )
        .unwrap();
        assert_eq!(result.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_read_that_outlasts_its_poll_sleeps_until_it_completes() {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe(2) returns.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let bytes = [7u8; 4096];
            // SAFETY: `bytes` is 4096 bytes long; the descriptor is ours.
            let n = unsafe { libc::write(fds[1], bytes.as_ptr().cast(), bytes.len()) };
            assert_eq!(n, 4096);
        });
        let mut buf = AlignedBuf::zeroed(4096);
        let (result, polled) =
            read(fds[0], 0, buf.as_mut_slice(), Duration::from_millis(1)).unwrap();
        writer.join().unwrap();
        result.unwrap();
        assert_eq!(polled, Polled::Slept);
        assert!(buf.iter().all(|&b| b == 7));
        // SAFETY: both descriptors are ours and no longer used.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }

    #[test]
    fn reads_poll_only_while_a_core_is_spare() {
        let spare = spare_cores();
        let held: Vec<BlockingRead> = (0..spare + 1).map(|_| BlockingRead::start()).collect();
        // Other tests may read at the same time: only the count's floor is
        // known, so the last of ours, beyond every spare core, never polls.
        assert!(!held.last().unwrap().may_poll());
        drop(held);
    }
}
