//! Watching the source behind open files: a change made there reaches the
//! kernel's pages of a file held open without waiting for a request.
//!
//! Why a watcher at all. The kernel checks a file's attributes only when a
//! request brings it to us: a lookup, a stat, a read once the attribute
//! timeout has passed. A program that reads a file through a shared
//! mapping makes none of these once its pages are in, so without help it
//! reads the old bytes for as long as the kernel keeps them (minutes, under
//! no memory pressure), and even a plain reader waits for the attribute
//! timeout. So a thread of ours checks the files the kernel holds open and,
//! on a change, does what a request would have done
//! (`crate::namespace::dir`): drops the cache's records, fences the record
//! stores, and tells the kernel to drop the inode's pages and attributes
//! (`notify_inval_inode`). The next touch of a mapping then faults, and
//! the fault reads the new bytes.
//!
//! Two ways to see a change, because neither sees all of them:
//!
//! - inotify, one watch per open inode (not per directory: only open files
//!   hold pages that no request may revisit, and a directory's watch would
//!   wake us for every file in it), is immediate and costs nothing while
//!   the file is quiet. An IN_MODIFY or IN_CLOSE_WRITE event drops
//!   everything whatever the generation says: a write that lands within
//!   one timestamp tick of an earlier check leaves size, mtime and ctime as
//!   that check saw them, and only the event tells. But inotify sees only
//!   changes made through this machine's kernel: not those of another NFS
//!   or SMB client, not stores through a shared mapping in the source, and
//!   none past the watch limit or after a queue overflow;
//! - a periodic generation check (inode, size, mtime, ctime, by fstat of
//!   the node's descriptor) of every open inode, `poll_interval` apart, a
//!   bounded batch per tick, round robin. It sees what the file system
//!   reports, within its own attribute caching (NFS: `actimeo`). A change
//!   it is the first to see is dropped again one interval later: a write
//!   still under way when it was seen may end within the same timestamp
//!   tick, and no generation would show the rest of it.
//!
//! Our own changes. The events cannot tell a write through the mount from
//! one made in the source, and taking ours for foreign ones would drop a
//! file's records on every write. So a file with a handle open for writing
//! through the mount is not checked at all (a change made behind it
//! meanwhile is seen as before: by the requests, within the attribute
//! timeout); when its last writer closes it is checked once by generation;
//! and a content event read within `QUIET_AFTER_OWN_CHANGE_MS` of a change
//! made through the mount (a write, a truncate, an attribute, the writer's
//! close) is checked by generation only. A change our own write already
//! brought the cache (`Cache::write` adopts the new generation) then
//! drops only the kernel's pages, as a stat after such a write did before.
//!
//! Cost and bounds. A mount with no open file has no watch and its thread
//! sleeps with no timeout: no CPU at all. Each open inode costs one entry
//! here and one inotify watch (at most `WATCHES_MAX`; past it, only the
//! periodic check). A tick checks at most `POLL_BATCH_MAX` inodes; an inode
//! is checked at most once per `CHECK_GAP_MIN` however many events it gets,
//! and at most `CHECKS_PER_ROUND_MAX` checks run between two reads of the
//! event queue. The queue itself is the kernel's (`max_queued_events`); on
//! overflow every open inode is checked by generation.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::ops::Bound::{Excluded, Unbounded};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use l2arc::ObjectHandle;

use crate::inodes::Inode;

/// inotify watches at most (the user's `max_user_watches` is shared with
/// every other program of that user); open inodes past it are polled only.
const WATCHES_MAX: usize = 8192;
/// Open inodes checked by generation per tick.
const POLL_BATCH_MAX: usize = 512;
/// An inode is checked at most this often, however many events it gets: a
/// writer busy in the source costs a bounded rate of invalidations.
const CHECK_GAP_MIN: Duration = Duration::from_millis(50);
/// Checks done before the event queue is read again.
const CHECKS_PER_ROUND_MAX: usize = 1024;
/// Events of a change made through the mount are read within this of it
/// (they are queued during its system call); meanwhile a content event of
/// that inode is checked by generation only.
const QUIET_AFTER_OWN_CHANGE_MS: u64 = 100;
/// Bytes of inotify events read at once (a 16-byte header each; our
/// watches are on files, so no names follow).
const EVENT_BUF_BYTES: usize = 16 << 10;
/// Reads of the event queue per round, so that a flood of events cannot
/// keep the due checks from running.
const EVENT_READS_PER_ROUND_MAX: usize = 16;

/// Events that say the content changed, and those that say an attribute
/// did (mtime set, truncate through setattr's ctime, link count).
const CONTENT_EVENTS: u32 = libc::IN_MODIFY | libc::IN_CLOSE_WRITE;
const WATCHED_EVENTS: u32 = CONTENT_EVENTS | libc::IN_ATTRIB;

/// How to check an open inode; a stronger check covers a weaker one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Check {
    /// Compare the source's generation with the one the kernel's pages
    /// reflect; drop on a difference.
    Generation,
    /// The same, and if it changed, drop again one poll interval later.
    Poll,
    /// The content was modified: drop, whatever the generation says.
    Modified,
}

/// What a check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Checked {
    Unchanged,
    /// Changed, and the cache and the kernel were told. `foreign`: the
    /// cache had not seen the change either (neither a write of ours nor a
    /// request had brought it the new generation).
    Dropped {
        foreign: bool,
    },
    /// The kernel could not be told now (its queue is full): try again.
    Busy,
}

/// Does a check: given by the file system (`crate::namespace::dir`), run on
/// the watcher's thread.
pub(crate) type Checker = Box<dyn Fn(&Inode, &ObjectHandle, Check) -> Checked + Send>;

/// What the checks of an open inode act on: its node, and a handle of its
/// object (the first open's; handles share the object's state).
type Target = (Arc<Inode>, ObjectHandle);

/// One inode the kernel holds open, `T` what its checks act on.
struct Watched<T> {
    target: T,
    /// Handles open (the entry goes with the last).
    handles: usize,
    wd: Option<i32>,
    last_check: Option<Instant>,
}

/// A check waiting for its time.
#[derive(Clone, Copy)]
struct Pending {
    check: Check,
    not_before: Instant,
}

struct Registry<T> {
    open: BTreeMap<u64, Watched<T>>,
    by_wd: HashMap<i32, u64>,
    pending: HashMap<u64, Pending>,
    /// The last inode the poll checked; the next tick starts after it.
    cursor: u64,
    next_tick: Option<Instant>,
}

impl<T: Clone> Registry<T> {
    fn new() -> Self {
        Self {
            open: BTreeMap::new(),
            by_wd: HashMap::new(),
            pending: HashMap::new(),
            cursor: 0,
            next_tick: None,
        }
    }

    /// Adds a check of `id` (an open inode), merged with one waiting.
    fn want(&mut self, id: u64, check: Check, not_before: Instant) {
        let Some(entry) = self.open.get(&id) else {
            return;
        };
        let gap_end = entry.last_check.map(|t| t + CHECK_GAP_MIN);
        let not_before = gap_end.map_or(not_before, |g| g.max(not_before));
        let merged = match self.pending.get(&id) {
            Some(p) => Pending {
                check: p.check.max(check),
                not_before: p.not_before.min(not_before),
            },
            None => Pending { check, not_before },
        };
        self.pending.insert(id, merged);
    }

    /// When the thread must next wake: the first pending check, or the
    /// next tick while any inode is open. None: only an event or a wake.
    fn next_deadline(&self) -> Option<Instant> {
        let pending = self.pending.values().map(|p| p.not_before).min();
        match (pending, self.next_tick) {
            (Some(p), Some(t)) => Some(p.min(t)),
            (p, t) => p.or(t),
        }
    }

    /// Takes the checks due at `now`: the pending ones, then a tick's batch.
    fn take_due(&mut self, now: Instant, poll_interval: Option<Duration>) -> Vec<(u64, T, Check)> {
        let mut due: Vec<(u64, Check)> = self
            .pending
            .iter()
            .filter(|(_, p)| p.not_before <= now)
            .map(|(&id, p)| (id, p.check))
            .take(CHECKS_PER_ROUND_MAX)
            .collect();
        for (id, _) in &due {
            self.pending.remove(id);
        }
        if let (Some(interval), Some(tick)) = (poll_interval, self.next_tick)
            && tick <= now
        {
            self.next_tick = Some(now + interval);
            let taken: HashSet<u64> = due.iter().map(|&(id, _)| id).collect();
            let after = self.open.range((Excluded(self.cursor), Unbounded));
            let wrapped = self.open.range(..=self.cursor);
            let batch: Vec<u64> = after
                .chain(wrapped)
                .map(|(&id, _)| id)
                .filter(|id| !self.pending.contains_key(id) && !taken.contains(id))
                .take(POLL_BATCH_MAX)
                .collect();
            if let Some(&last) = batch.last() {
                self.cursor = last;
            }
            due.extend(batch.into_iter().map(|id| (id, Check::Poll)));
        }
        debug_assert!(due.len() <= CHECKS_PER_ROUND_MAX + POLL_BATCH_MAX);
        due.into_iter()
            .filter_map(|(id, check)| {
                let entry = self.open.get_mut(&id)?;
                entry.last_check = Some(now);
                Some((id, entry.target.clone(), check))
            })
            .collect()
    }
}

struct Shared {
    registry: Mutex<Registry<Target>>,
    /// None when inotify is off or could not be had: polling only.
    inotify: Option<OwnedFd>,
    /// An eventfd that wakes the thread (a registration, the stop).
    wake: OwnedFd,
    stop: AtomicBool,
    poll_interval: Option<Duration>,
}

impl Shared {
    fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our eventfd. A full
        // counter (EAGAIN) already wakes the thread.
        let _ = unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry<Target>> {
        self.registry.lock().expect("watch registry poisoned")
    }
}

/// The file system's side of the watcher: registers open inodes. Cloned
/// into every open file.
#[derive(Clone)]
pub(crate) struct Watch(Arc<Shared>);

/// Owns the watcher's thread: stops and joins it when dropped.
pub(crate) struct Watcher {
    watch: Watch,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watcher {
    /// Starts the thread. `inotify` false, or inotify unavailable: the
    /// periodic check only. `poll_interval` zero: no periodic check.
    pub(crate) fn start(
        inotify: bool,
        poll_interval: Duration,
        check: Checker,
    ) -> io::Result<Self> {
        let inotify = if inotify {
            // Without inotify (no more instances for this user), the poll
            // still runs: the mount works, changes are seen later.
            inotify_init().ok()
        } else {
            None
        };
        let shared = Arc::new(Shared {
            registry: Mutex::new(Registry::new()),
            inotify,
            wake: eventfd()?,
            stop: AtomicBool::new(false),
            poll_interval: (!poll_interval.is_zero()).then_some(poll_interval),
        });
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("l2arc-fuse-watch".to_string())
                .spawn(move || run(&shared, &check))?
        };
        Ok(Self {
            watch: Watch(shared),
            thread: Some(thread),
        })
    }

    pub(crate) fn watch(&self) -> &Watch {
        &self.watch
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.watch.0.stop.store(true, Ordering::SeqCst);
        self.watch.0.wake();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Watch {
    /// A handle of `inode` was opened (`handle` is its object).
    pub(crate) fn opened(&self, inode: &Arc<Inode>, handle: &ObjectHandle) {
        let shared = &self.0;
        let mut registry = shared.registry();
        if let Some(entry) = registry.open.get_mut(&inode.id) {
            entry.handles += 1;
            return;
        }
        let wd = match &shared.inotify {
            Some(fd) if registry.by_wd.len() < WATCHES_MAX => add_watch(fd.as_raw_fd(), inode),
            _ => None,
        };
        if let Some(wd) = wd {
            // Watches are per inode, and an inode is one node.
            let old = registry.by_wd.insert(wd, inode.id);
            debug_assert!(old.is_none(), "watch {wd} names two open inodes");
        }
        registry.open.insert(
            inode.id,
            Watched {
                target: (Arc::clone(inode), handle.clone()),
                handles: 1,
                wd,
                last_check: None,
            },
        );
        if registry.next_tick.is_none()
            && let Some(interval) = shared.poll_interval
        {
            registry.next_tick = Some(Instant::now() + interval);
            drop(registry);
            shared.wake(); // from no timeout to ticking
        }
    }

    /// A handle of `id` was closed.
    pub(crate) fn closed(&self, id: u64) {
        let shared = &self.0;
        let mut registry = shared.registry();
        let Some(entry) = registry.open.get_mut(&id) else {
            debug_assert!(false, "closed an inode never opened: {id}");
            return;
        };
        assert!(entry.handles > 0);
        entry.handles -= 1;
        if entry.handles > 0 {
            return;
        }
        let entry = registry.open.remove(&id).expect("just found");
        registry.pending.remove(&id);
        if let Some(wd) = entry.wd {
            registry.by_wd.remove(&wd);
            if let Some(fd) = &shared.inotify {
                // SAFETY: plain system call on our inotify descriptor.
                unsafe { libc::inotify_rm_watch(fd.as_raw_fd(), wd) };
            }
        }
        if registry.open.is_empty() {
            // Idle: the thread sleeps until the next open.
            registry.next_tick = None;
        }
    }

    /// The last handle of `inode` open for writing through the mount
    /// closed: check it once by generation (it was not checked meanwhile).
    pub(crate) fn writer_closed(&self, inode: &Inode) {
        note_own_change(inode);
        let now = Instant::now();
        let mut registry = self.0.registry();
        registry.want(inode.id, Check::Generation, now);
        drop(registry);
        self.0.wake();
    }
}

/// The watcher's thread: waits for events, a due check or a tick, then
/// runs the checks that are due.
fn run(shared: &Shared, check: &Checker) {
    let mut events = vec![0u8; EVENT_BUF_BYTES];
    while !shared.stop.load(Ordering::SeqCst) {
        let deadline = shared.registry().next_deadline();
        wait(shared, deadline);
        drain(&shared.wake);
        if let Some(fd) = &shared.inotify {
            read_events(shared, fd.as_raw_fd(), &mut events);
        }
        let now = Instant::now();
        let due = shared.registry().take_due(now, shared.poll_interval);
        for (id, (inode, handle), what) in due {
            let checked = check(&inode, &handle, what);
            let again = match (what, checked) {
                (_, Checked::Busy) => Some((Check::Modified, now + CHECK_GAP_MIN)),
                (Check::Poll, Checked::Dropped { foreign: true }) => shared
                    .poll_interval
                    .map(|interval| (Check::Modified, Instant::now() + interval)),
                _ => None,
            };
            if let Some((check, at)) = again {
                shared.registry().want(id, check, at);
            }
        }
    }
}

/// Sleeps until the deadline (None: no timeout), an event or a wake.
fn wait(shared: &Shared, deadline: Option<Instant>) {
    let timeout_ms: i32 = match deadline {
        None => -1,
        Some(at) => {
            let left = at.saturating_duration_since(Instant::now());
            // Rounded up: waking early would spin until the deadline.
            i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
        }
    };
    let mut fds = [
        libc::pollfd {
            fd: shared.wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: shared.inotify.as_ref().map_or(-1, |fd| fd.as_raw_fd()),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: two valid pollfd entries (a negative fd is ignored).
    // EINTR only ends the wait early; the loop waits again.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
}

/// Resets the wake counter.
fn drain(wake: &OwnedFd) {
    let mut count = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a live buffer; EAGAIN when zero.
    let _ = unsafe { libc::read(wake.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
}

/// Reads what the event queue holds (a bounded number of reads) and turns
/// each event into a check of its inode.
fn read_events(shared: &Shared, fd: RawFd, buf: &mut [u8]) {
    for _ in 0..EVENT_READS_PER_ROUND_MAX {
        // SAFETY: reads into a live buffer of its length; non-blocking.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            return; // EAGAIN: drained
        }
        let now = Instant::now();
        let mut registry = shared.registry();
        for (wd, mask) in parse_events(&buf[..n as usize]) {
            if mask & libc::IN_Q_OVERFLOW != 0 {
                // Events were lost: check every open inode.
                let ids: Vec<u64> = registry.open.keys().copied().collect();
                for id in ids {
                    registry.want(id, Check::Poll, now);
                }
                continue;
            }
            let Some(&id) = registry.by_wd.get(&wd) else {
                continue; // a watch removed since (its IN_IGNORED)
            };
            if mask & libc::IN_IGNORED != 0 {
                // The kernel dropped the watch (the file system went away):
                // the poll is all that is left for this inode.
                registry.by_wd.remove(&wd);
                if let Some(entry) = registry.open.get_mut(&id) {
                    entry.wd = None;
                }
                continue;
            }
            let check = if mask & CONTENT_EVENTS != 0 {
                Check::Modified
            } else {
                Check::Generation
            };
            registry.want(id, check, now);
        }
    }
}

/// (wd, mask) of each event in `buf` (whole events, as read(2) returns).
fn parse_events(buf: &[u8]) -> Vec<(i32, u32)> {
    const HEADER_BYTES: usize = 16; // wd, mask, cookie, len
    let word = |at: usize| u32::from_ne_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
    let mut out = Vec::new();
    let mut at = 0;
    while at + HEADER_BYTES <= buf.len() {
        let (wd, mask, name_len) = (word(at) as i32, word(at + 4), word(at + 12) as usize);
        out.push((wd, mask));
        at += HEADER_BYTES + name_len;
    }
    debug_assert_eq!(at, buf.len(), "the kernel returns whole events");
    out
}

/// Milliseconds on the watcher's clock (since its first use), from 1.
fn clock_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX) + 1
}

/// The mount itself is changing `inode` (a write, a truncate, attributes):
/// the content events that follow are its own (see the module comment).
pub(crate) fn note_own_change(inode: &Inode) {
    inode.own_change_ms.store(clock_ms(), Ordering::Relaxed);
}

/// How a check of `inode` is to be done: a content event that follows a
/// change of the mount's own is checked by generation only.
pub(crate) fn unless_own(inode: &Inode, check: Check) -> Check {
    let at = inode.own_change_ms.load(Ordering::Relaxed);
    let own = at != 0 && clock_ms().saturating_sub(at) < QUIET_AFTER_OWN_CHANGE_MS;
    if own && check == Check::Modified {
        Check::Generation
    } else {
        check
    }
}

fn inotify_init() -> io::Result<OwnedFd> {
    // SAFETY: plain system call; the result is checked.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain system call; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A watch of the inode a node pins, through its descriptor's /proc link
/// (which names the inode itself, whatever its names now). None when the
/// kernel refuses (the user's watch limit, no read permission): the poll
/// covers that inode.
fn add_watch(inotify: RawFd, inode: &Inode) -> Option<i32> {
    let path = crate::sys::proc_path(inode.fd());
    // SAFETY: a valid descriptor and C string.
    let wd = unsafe { libc::inotify_add_watch(inotify, path.as_ptr(), WATCHED_EVENTS) };
    (wd >= 0).then_some(wd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_parsed_whole_names_skipped() {
        let mut buf = Vec::new();
        for (wd, mask, name) in [(3i32, libc::IN_MODIFY, 0u32), (7, libc::IN_ATTRIB, 16)] {
            buf.extend_from_slice(&wd.to_ne_bytes());
            buf.extend_from_slice(&mask.to_ne_bytes());
            buf.extend_from_slice(&0u32.to_ne_bytes());
            buf.extend_from_slice(&name.to_ne_bytes());
            buf.extend(std::iter::repeat_n(0u8, name as usize));
        }
        assert_eq!(
            parse_events(&buf),
            [(3, libc::IN_MODIFY), (7, libc::IN_ATTRIB)]
        );
    }

    fn registry_of(ids: &[u64]) -> Registry<()> {
        let mut registry = Registry::new();
        for &id in ids {
            registry.open.insert(
                id,
                Watched {
                    target: (),
                    handles: 1,
                    wd: None,
                    last_check: None,
                },
            );
        }
        registry
    }

    #[test]
    fn checks_merge_keep_their_gap_and_only_open_inodes_are_checked() {
        let now = Instant::now();
        let mut registry = registry_of(&[1, 2]);
        assert_eq!(registry.next_deadline(), None, "idle: no timeout");
        registry.want(1, Check::Generation, now + Duration::from_secs(1));
        registry.want(1, Check::Modified, now);
        registry.want(3, Check::Modified, now); // not open: ignored
        assert_eq!(registry.next_deadline(), Some(now));
        let due = registry.take_due(now, None);
        assert_eq!(
            due.iter().map(|(id, _, c)| (*id, *c)).collect::<Vec<_>>(),
            [(1, Check::Modified)],
            "merged to the stronger and the earlier"
        );
        // Checked just now: the next event waits for the gap.
        registry.want(1, Check::Modified, now);
        assert_eq!(registry.next_deadline(), Some(now + CHECK_GAP_MIN));
        assert!(registry.take_due(now, None).is_empty());
        assert_eq!(registry.take_due(now + CHECK_GAP_MIN, None).len(), 1);
    }

    #[test]
    fn ticks_check_a_bounded_batch_round_robin() {
        let ids: Vec<u64> = (1..=POLL_BATCH_MAX as u64 + 10).collect();
        let mut registry = registry_of(&ids);
        let interval = Duration::from_millis(500);
        let start = Instant::now();
        registry.next_tick = Some(start);
        let first = registry.take_due(start, Some(interval));
        assert_eq!(first.len(), POLL_BATCH_MAX);
        assert!(first.iter().all(|(_, _, c)| *c == Check::Poll));
        assert_eq!(registry.next_tick, Some(start + interval));
        assert!(
            registry.take_due(start, Some(interval)).is_empty(),
            "not yet"
        );
        let second = registry.take_due(start + interval, Some(interval));
        let second: Vec<u64> = second.iter().map(|(id, _, _)| *id).collect();
        assert_eq!(second[..10], ids[POLL_BATCH_MAX..], "on from the cursor");
        assert_eq!(second[10..], ids[..POLL_BATCH_MAX - 10], "and around");
    }
}
