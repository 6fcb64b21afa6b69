//! io_uring for cache-device reads.
//!
//! Why. A flash device serves random reads in parallel: the one measured here
//! does ~35 k 4 KiB reads a second one at a time, ~100 k with 32 threads
//! each in `pread`, and ~130 k with 32 reads in flight from one thread through
//! io_uring; real NVMe devices go to a million. Threads blocked in `pread`
//! pay a context switch and a system call per read, which on a small machine
//! is the ceiling; a ring pays one system call per batch of submissions and
//! none per completion. So a reader that has many reads to do (a read queue:
//! a benchmark at queue depth 32, an NBD connection's pipelined requests)
//! puts them all in flight on its own ring and reaps them as they complete.
//!
//! One ring per queue, owned by one thread: no locks, no sharing. The ring
//! holds raw pointers to buffers it reads into, so the only unsafe contract
//! is that a buffer outlives its read; the read queue keeps every buffer in
//! its table until the completion is reaped and drains the ring before it is
//! dropped.
//!
//! A ring may also watch one descriptor for input (`arm_poll`): a thread
//! that serves a socket and keeps reads in flight (an NBD connection) then
//! sleeps in one place until either a read completes or the client sends
//! more, instead of waking on a timer to look at the socket. The poll is
//! not a read: it holds no buffer and does not count in `in_flight`, and
//! closing the ring cancels it.
//!
//! Where io_uring is unavailable (an old kernel, a seccomp profile that
//! refuses it, `l2arc_ioengine=psync`), reads stay positioned reads
//! (`psync`); [`IoEngine::resolve`] decides once, at start, and says why.

use std::io;
use std::os::fd::RawFd;

/// The `user_data` of the poll on a watched descriptor (reads use table
/// indexes, far below it).
const POLL_USER_DATA: u64 = u64::MAX;
use std::time::Duration;

use io_uring::{IoUring, opcode, types};

/// How cache devices are read: the `l2arc_ioengine` tunable (fio's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoEngine {
    /// io_uring where the kernel allows it, else psync.
    #[default]
    Auto,
    /// io_uring, or fail at start.
    IoUring,
    /// Positioned reads from the reader's own thread.
    Psync,
}

impl IoEngine {
    /// fio's name for the engine ("io_uring", "psync").
    pub fn name(self) -> &'static str {
        const {
            assert!(
                POLL_USER_DATA > u32::MAX as u64,
                "read user_data are table indexes"
            )
        };
        match self {
            IoEngine::Auto => "auto",
            IoEngine::IoUring => "io_uring",
            IoEngine::Psync => "psync",
        }
    }

    /// The engine to use here: `IoUring` or `Psync`, with the reason when
    /// `Auto` fell back. A forced `IoUring` that the kernel refuses is an error.
    pub fn resolve(self) -> io::Result<(IoEngine, Option<String>)> {
        let resolved = match self {
            IoEngine::Psync => Ok((IoEngine::Psync, None)),
            IoEngine::IoUring => ReadRing::new(2).map(|_| (IoEngine::IoUring, None)),
            IoEngine::Auto => match ReadRing::new(2) {
                Ok(_) => Ok((IoEngine::IoUring, None)),
                Err(e) => Ok((IoEngine::Psync, Some(format!("io_uring unavailable: {e}")))),
            },
        };
        // Resolved is never `Auto`, and a fallback reason only from `Auto`.
        if let Ok((engine, reason)) = &resolved {
            assert_ne!(*engine, IoEngine::Auto);
            assert!(reason.is_none() || self == IoEngine::Auto);
        }
        resolved
    }
}

impl std::str::FromStr for IoEngine {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let engine = match s {
            "auto" => Ok(IoEngine::Auto),
            "io_uring" => Ok(IoEngine::IoUring),
            "psync" => Ok(IoEngine::Psync),
            _ => Err(format!(
                "l2arc_ioengine must be auto, io_uring or psync, not {s:?}"
            )),
        };
        // Parsing and naming are inverses.
        debug_assert!(engine.as_ref().is_err() || engine.as_ref().is_ok_and(|e| e.name() == s));
        engine
    }
}

/// What an io_uring read of `len` bytes returned (`result`: the bytes
/// read, or a negative errno) as a read's outcome: a short read is an
/// error (a cache device read never ends early; past its end it is gone).
pub(crate) fn read_outcome(result: i32, len: usize) -> io::Result<()> {
    // A read's length was a u32 for the ring and its result an i32.
    debug_assert!(len <= i32::MAX as usize);
    if result < 0 {
        Err(io::Error::from_raw_os_error(-result))
    } else if result as usize != len {
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("short cache device read: {result} of {len} bytes"),
        ))
    } else {
        Ok(())
    }
}

/// One thread's io_uring for reads.
pub(crate) struct ReadRing {
    ring: IoUring,
    /// Reads pushed to the submission queue and not yet reaped.
    in_flight: usize,
    /// Most reads in flight at once (the ring's size).
    entries: usize,
    /// The descriptor whose poll is in the ring and has not completed.
    poll_armed: Option<RawFd>,
    /// The armed poll completed since `take_readable` last looked.
    readable: bool,
}

impl ReadRing {
    /// A ring for up to `entries` reads in flight (rounded up to a power of
    /// two by the kernel; the completion queue is twice that, so it cannot
    /// overflow while `in_flight <= entries`).
    pub(crate) fn new(entries: u32) -> io::Result<Self> {
        let entries = entries.clamp(1, 4096).next_power_of_two();
        // One thread submits and reaps (the queue is not Send), so the
        // kernel may run completions only when that thread asks for them
        // (6.1+): no interrupting the reader to post each one. Older
        // kernels refuse the flags; a plain ring works there.
        let ring = IoUring::builder()
            .setup_coop_taskrun()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(entries)
            .or_else(|_| IoUring::new(entries))?;
        assert!(entries.is_power_of_two() && entries <= 4096);
        Ok(Self {
            ring,
            in_flight: 0,
            entries: entries as usize,
            poll_armed: None,
            readable: false,
        })
    }

    /// A ring whose completions the kernel posts while its thread is in
    /// user space (no deferred task work), for a reader that watches the
    /// completion queue instead of waiting in the kernel (`poll`).
    pub(crate) fn new_polled(entries: u32) -> io::Result<Self> {
        let entries = entries.clamp(1, 4096).next_power_of_two();
        assert!(entries.is_power_of_two() && entries <= 4096);
        Ok(Self {
            ring: IoUring::new(entries)?,
            in_flight: 0,
            entries: entries as usize,
            poll_armed: None,
            readable: false,
        })
    }

    /// Whether a completion waits to be reaped (no system call).
    pub(crate) fn completion_ready(&mut self) -> bool {
        debug_assert!(self.in_flight <= self.entries);
        !self.ring.completion().is_empty()
    }

    pub(crate) fn in_flight(&self) -> usize {
        debug_assert!(self.in_flight <= self.entries);
        self.in_flight
    }

    pub(crate) fn has_room(&self) -> bool {
        debug_assert!(self.in_flight <= self.entries);
        self.in_flight < self.entries
    }

    /// Queues a read of `len` bytes at `offset` of `fd` into `buf`; it is
    /// sent at the next [`Self::submit_and_wait`].
    ///
    /// # Safety
    /// `buf` must stay valid for `len` bytes, and untouched, until the
    /// completion carrying `user_data` has been reaped; `fd` must stay open
    /// until then.
    pub(crate) unsafe fn push_read(
        &mut self,
        fd: RawFd,
        offset: u64,
        buf: *mut u8,
        len: u32,
        user_data: u64,
    ) -> io::Result<()> {
        assert!(self.has_room(), "ring full: the caller bounds its reads");
        debug_assert!(!buf.is_null() && len > 0, "a read into a buffer");
        debug_assert_ne!(
            user_data, POLL_USER_DATA,
            "a read's user_data is not the poll's"
        );
        let entry = opcode::Read::new(types::Fd(fd), buf, len)
            .offset(offset)
            .build()
            .user_data(user_data);
        // SAFETY: the caller keeps `buf` and `fd` valid until the completion
        // is reaped (this function's contract).
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            // The submission queue holds only unsent entries: send them.
            self.submit_and_wait(0)?;
            // SAFETY: as above.
            unsafe { self.ring.submission().push(&entry) }
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        self.in_flight += 1;
        assert!(self.in_flight <= self.entries);
        Ok(())
    }

    /// Watches `fd` for input (or hang-up, or an error): the next wait
    /// returns when it has some, and [`Self::take_readable`] says so. Does
    /// nothing if a poll of `fd` is already armed. One descriptor at a time.
    pub(crate) fn arm_poll(&mut self, fd: RawFd) -> io::Result<()> {
        debug_assert!(fd >= 0, "an open descriptor");
        match self.poll_armed {
            Some(armed) if armed == fd => return Ok(()),
            Some(armed) => panic!("a ring watches one descriptor: {armed} is armed, not {fd}"),
            None => {}
        }
        let entry = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
            .build()
            .user_data(POLL_USER_DATA);
        // SAFETY: a poll holds no buffer; the kernel takes its own
        // reference to the file, so the descriptor may even close first.
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            self.submit_and_wait(0)?;
            // SAFETY: as above.
            unsafe { self.ring.submission().push(&entry) }
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        self.poll_armed = Some(fd);
        // The poll is no read: it takes no room from them.
        debug_assert!(self.in_flight <= self.entries);
        Ok(())
    }

    /// Whether the armed poll completed since the last call (and forgets it).
    pub(crate) fn take_readable(&mut self) -> bool {
        debug_assert!(self.in_flight <= self.entries);
        std::mem::take(&mut self.readable)
    }

    /// Completions a wait may count on: reads in flight and an armed poll.
    fn completions_due(&self) -> usize {
        debug_assert!(self.in_flight <= self.entries);
        self.in_flight + usize::from(self.poll_armed.is_some())
    }

    /// Sends queued entries without waiting, if any are queued.
    pub(crate) fn submit_queued(&mut self) -> io::Result<()> {
        debug_assert!(self.in_flight <= self.entries);
        if self.ring.submission().is_empty() {
            return Ok(());
        }
        self.submit_and_wait(0)
    }

    /// Sends queued reads and waits up to `timeout` for one completion:
    /// whether one is ready.
    pub(crate) fn submit_and_wait_timeout(&mut self, timeout: Duration) -> io::Result<bool> {
        if self.completions_due() == 0 {
            return Ok(false);
        }
        debug_assert!(!timeout.is_zero() || self.completions_due() > 0);
        let timespec = types::Timespec::from(timeout);
        let args = types::SubmitArgs::new().timespec(&timespec);
        loop {
            match self.ring.submitter().submit_with_args(1, &args) {
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME) | Some(libc::EBUSY)) => {
                    break;
                }
                // A kernel without timed waits (before 5.11): wait untimed.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    self.submit_and_wait(1)?;
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(!self.ring.completion().is_empty())
    }

    /// Sends queued reads and waits until at least `want` completions are
    /// ready (0: just send); an armed poll's completion counts.
    pub(crate) fn submit_and_wait(&mut self, want: usize) -> io::Result<()> {
        let want = want.min(self.completions_due());
        // Never waits for more completions than can come: that would hang.
        debug_assert!(want <= self.in_flight + 1);
        loop {
            match self.ring.submit_and_wait(want) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    // Completions are waiting to be reaped: the caller does.
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Hands at most `max` completed reads to `done(user_data, result)`:
    /// the bytes read, or a negative errno. The rest stay in the ring. An
    /// armed poll's completion is taken too (not counted in `max`), and
    /// noted for [`Self::take_readable`].
    pub(crate) fn reap(&mut self, max: usize, mut done: impl FnMut(u64, i32)) {
        let mut reaped = 0;
        let mut completion = self.ring.completion();
        while reaped < max {
            let Some(entry) = completion.next() else {
                break;
            };
            if entry.user_data() == POLL_USER_DATA {
                // Ready, hung up, or failed: any of them is for the owner
                // to find out by reading the descriptor.
                assert!(
                    self.poll_armed.is_some(),
                    "a poll completion with none armed"
                );
                self.poll_armed = None;
                self.readable = true;
                continue;
            }
            reaped += 1;
            done(entry.user_data(), entry.result());
        }
        drop(completion);
        assert!(reaped <= self.in_flight, "more completions than reads");
        self.in_flight -= reaped;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::AlignedBuf;
    use std::os::fd::AsRawFd;

    #[test]
    fn reads_many_blocks_in_flight() {
        let (engine, _) = IoEngine::Auto.resolve().unwrap();
        if engine != IoEngine::IoUring {
            panic!("io_uring is unavailable on this machine: the io_uring tests need it");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..64 * 4096).map(|i| (i * 7 + i / 4096) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let mut ring = ReadRing::new(16).unwrap();
        let mut bufs: Vec<AlignedBuf> = (0..16).map(|_| AlignedBuf::zeroed(4096)).collect();
        for (i, buf) in bufs.iter_mut().enumerate() {
            let block = (i * 5 % 64) as u64;
            // SAFETY: `bufs` and `file` outlive the reads, reaped below.
            unsafe {
                ring.push_read(
                    file.as_raw_fd(),
                    block * 4096,
                    buf.as_mut_slice().as_mut_ptr(),
                    4096,
                    i as u64,
                )
                .unwrap();
            }
        }
        assert!(!ring.has_room());
        let mut done = [false; 16];
        while ring.in_flight() > 0 {
            ring.submit_and_wait(1).unwrap();
            ring.reap(usize::MAX, |user_data, result| {
                assert_eq!(result, 4096);
                done[user_data as usize] = true;
            });
        }
        assert!(done.iter().all(|d| *d));
        for (i, buf) in bufs.iter().enumerate() {
            let block = i * 5 % 64;
            assert_eq!(&buf[..], &data[block * 4096..(block + 1) * 4096]);
        }
    }

    #[test]
    fn a_watched_socket_wakes_the_wait_and_counts_as_no_read() {
        use std::io::Write;
        let (mut peer, watched) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut ring = ReadRing::new(4).unwrap();
        ring.arm_poll(watched.as_raw_fd()).unwrap();
        ring.arm_poll(watched.as_raw_fd()).unwrap(); // armed once
        assert_eq!(ring.in_flight(), 0);
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            peer.write_all(b"x").unwrap();
            peer
        });
        ring.submit_and_wait(1).unwrap();
        ring.reap(usize::MAX, |_, _| panic!("no read was in flight"));
        assert!(ring.take_readable());
        assert!(!ring.take_readable(), "taken once");
        assert_eq!(ring.in_flight(), 0);
        // Re-armed on a socket with input, it completes at once.
        ring.arm_poll(watched.as_raw_fd()).unwrap();
        ring.submit_and_wait(1).unwrap();
        ring.reap(usize::MAX, |_, _| panic!("no read was in flight"));
        assert!(ring.take_readable());
        drop(writer.join().unwrap());
    }

    #[test]
    fn engines_parse_by_fio_names() {
        assert_eq!("psync".parse::<IoEngine>().unwrap(), IoEngine::Psync);
        assert_eq!("io_uring".parse::<IoEngine>().unwrap(), IoEngine::IoUring);
        assert!(
            "libaio"
                .parse::<IoEngine>()
                .unwrap_err()
                .contains("auto, io_uring or psync")
        );
        assert_eq!(IoEngine::Psync.resolve().unwrap().0, IoEngine::Psync);
    }
}
