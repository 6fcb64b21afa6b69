//! Opens of the tree's files: a descriptor of the source inode handed to
//! the cache, the page-cache verdict, and stale names.
//!
//! An open reopens the node's `O_PATH` descriptor with the caller's access
//! mode and hands it to the cache (`Cache::open_file`), which reads and
//! writes the file through it; the file's generation then decides whether
//! the kernel may keep its pages (`coherence.rs`). An open for writing is
//! counted on the inode (`Inode::writers`): stores into the kernel's pages
//! and the watcher's checks stand aside while one is open.
//!
//! An open for writing is answered with FOPEN_DIRECT_IO, so that no byte
//! written through the mount is in the kernel's pages before it is in the
//! source. Without it (and without a writeback cache) the kernel copies a
//! write(2) of a whole page into its page cache, marks the page up to date
//! and unlocks it *before* it sends us FUSE_WRITE (`fuse_fill_write_pages`
//! in fs/fuse/file.c, since 2020, against a deadlock with page
//! faults). Until we have written the source, that page is the only copy
//! of the new bytes: a reader reads them from it; the page is dropped (an
//! attribute reply with a new mtime under FUSE_AUTO_INVAL_DATA, one of our
//! invalidations, an open without KEEP_CACHE, reclaim); the reader's next
//! read misses, and we answer it from the source, which still holds the
//! old bytes. The reader has gone back in time, which no local file system
//! allows. Under load (the write's request waits for a thread) this
//! happened within seconds in every run of the CLI's test
//! `readers_never_go_back_in_time_while_a_writer_rewrites_pages`, and a
//! 60-line libfuse pass-through with no cache at all did the same; with
//! direct writes neither ever did. A direct write drops its range from the
//! kernel's pages before it is sent, and a read racing it may bring the old
//! bytes back into them, so the write drops its range again once the
//! source and the cache have the new bytes, before it answers
//! (`Passthrough::write` in `passthrough.rs`): no page older than a
//! finished write outlives it.
//!
//! The price: reads through a handle open for writing (O_RDWR) bypass the
//! kernel's pages too (each is a request, answered from the ARC), and a
//! page just written is read from us, not from the copy the kernel kept.
//! Only where the kernel still lets such a file be mapped shared
//! (FUSE_DIRECT_IO_ALLOW_MMAP, Linux 6.6); on an older kernel writes go
//! through its pages, with the race above.
//!
//! A new open of a name that the source replaced (`mv new f`) or removed
//! reaches the old inode: the kernel caches names for the entry timeout,
//! and an open does not look the name up again before. That inode then
//! has no name left; the open is refused with ESTALE, on which the kernel
//! walks the path again with every name revalidated (`StaleOpens`).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fuser::{Errno, FopenFlags, INodeNo, OpenFlags};

use super::attr::{err, fd_path};
use super::{DirTree, TreeFile};
use crate::inodes::{Inode, Kind};
use crate::namespace::{OpenFile, Opened};
use crate::readahead::ReadAhead;
use crate::sys;
use crate::watch::Watch;

/// Opens refused as stale that are remembered, to let their retry through
/// when it comes back to the same inode (`StaleOpens`).
const STALE_OPENS_MAX: usize = 64;
/// How long a refused open is remembered: its retry follows at once.
const STALE_OPEN_RETRY_WINDOW: Duration = Duration::from_secs(1);

/// What the tree keeps per open file.
pub(crate) struct TreeOpen {
    /// The file's node (its store epoch and writer count).
    pub(super) inode: Arc<Inode>,
    pub(super) writable: bool,
    /// Answered with FOPEN_DIRECT_IO (see the module comment).
    pub(super) direct_io: bool,
    /// The source watcher, which counts this open (`crate::watch`).
    watch: Watch,
}

impl Drop for TreeOpen {
    fn drop(&mut self) {
        if self.writable {
            let before = self.inode.writers.fetch_sub(1, Ordering::SeqCst);
            assert!(before > 0, "a writer closed that never opened");
            if before == 1 {
                self.watch.writer_closed(&self.inode);
            }
        }
        self.watch.closed(self.inode.id);
    }
}

/// Opens refused with ESTALE because their inode has no name left in the
/// source: (node, thread, when), oldest first.
///
/// The kernel reached such an inode through a name it still caches (for up
/// to the entry timeout) although the source has replaced or removed that
/// name. On ESTALE it walks the path again with every name revalidated
/// (LOOKUP_REVAL), so the open finds what the name holds now, or ENOENT.
/// A path that cannot be revalidated (/proc/PID/fd/N of a deleted file)
/// comes back to the same inode from the same thread at once: that retry
/// is let through, as ext4 would open it. A thread's entries go when it
/// opens a named file (its retry found the new one): a node id is the
/// source's inode number, which a later file may reuse.
#[derive(Default)]
pub(super) struct StaleOpens {
    recent: Mutex<std::collections::VecDeque<(u64, u32, Instant)>>,
    /// Entries held: opens skip the lock while it is zero.
    len: AtomicUsize,
}

impl StaleOpens {
    /// Whether to refuse this open of `ino`, which has no name left, by
    /// thread `pid` (false: it is the retry of one refused).
    fn refuse(&self, ino: u64, pid: u32) -> bool {
        let now = Instant::now();
        let mut recent = self.recent.lock().expect("poisoned");
        while recent
            .front()
            .is_some_and(|&(_, _, at)| now.duration_since(at) >= STALE_OPEN_RETRY_WINDOW)
        {
            recent.pop_front();
        }
        let retry = recent.iter().position(|&(n, p, _)| (n, p) == (ino, pid));
        if let Some(i) = retry {
            recent.remove(i);
        } else {
            if recent.len() >= STALE_OPENS_MAX {
                recent.pop_front();
            }
            recent.push_back((ino, pid, now));
        }
        assert!(recent.len() <= STALE_OPENS_MAX);
        self.len.store(recent.len(), Ordering::Relaxed);
        retry.is_none()
    }

    /// Thread `pid` opened a file that has a name: its refused opens, if
    /// any, were retried.
    fn retried(&self, pid: u32) {
        if self.len.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut recent = self.recent.lock().expect("poisoned");
        recent.retain(|&(_, p, _)| p != pid);
        self.len.store(recent.len(), Ordering::Relaxed);
    }
}

impl DirTree {
    /// Opens the regular file `ino` for thread `pid`.
    pub(super) fn open_file(
        &self,
        ino: INodeNo,
        flags: OpenFlags,
        pid: u32,
    ) -> Result<Opened<TreeOpen>, Errno> {
        let inode = self.inode(ino)?;
        if inode.kind != Kind::Regular {
            return Err(Errno::EINVAL);
        }
        if Self::stat(&inode)?.st_nlink == 0 {
            if self.stale_opens.refuse(inode.id, pid) {
                return Err(Errno::ESTALE);
            }
        } else {
            self.stale_opens.retried(pid);
        }
        let flags = flags.0 & (libc::O_ACCMODE | libc::O_SYNC | libc::O_DSYNC);
        let fd = sys::reopen(inode.fd(), flags | libc::O_NONBLOCK).map_err(err)?;
        self.register_open(inode, fd, flags)
    }

    /// Makes an open regular file of `fd` (opened with `flags`) and says
    /// whether the kernel may keep its pages of it.
    pub(super) fn register_open(
        &self,
        inode: Arc<Inode>,
        fd: OwnedFd,
        flags: i32,
    ) -> Result<Opened<TreeOpen>, Errno> {
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let st = sys::stat_at(fd.as_raw_fd(), c"").map_err(err)?;
        let now = l2arc::primary::Generation::of_stat(&st);
        let keep = {
            let mut seen = inode.page_generation.lock().expect("poisoned");
            let keep = *seen == Some(now);
            *seen = Some(now);
            keep
        };
        // The file's path below the source now, for the drill-down (the
        // descriptor knows it even after renames).
        let name = std::fs::read_link(fd_path(fd.as_raw_fd()))
            .ok()
            .and_then(|p| {
                p.strip_prefix(&self.source_root)
                    .ok()
                    .map(|p| p.to_string_lossy().into_owned())
            });
        let handle = self
            .serving
            .cache
            .open_file(self.dataset, std::fs::File::from(fd), writable)
            .map_err(err)?;
        if let Some(name) = name {
            self.serving.cache.name_object(&handle, &name);
        }
        if writable {
            // Counted before the file exists: its drop uncounts it.
            inode.writers.fetch_add(1, Ordering::SeqCst);
        }
        // Likewise: its drop closes it.
        let watch = self.watcher.watch().clone();
        watch.opened(&inode, &handle);
        // Writes must not reach the kernel's pages before the source (see
        // the module comment).
        let direct_io = writable && self.direct_io_writers.load(Ordering::SeqCst);
        let state = TreeOpen {
            inode: Arc::clone(&inode),
            writable,
            direct_io,
            watch,
        };
        let readahead = ReadAhead::new(self.options.readahead_max_records);
        let file: Arc<TreeFile> = Arc::new(OpenFile::new(handle, readahead, state));
        *inode.open_file.lock().expect("poisoned") = Arc::downgrade(&file);
        if writable || !keep {
            // A writer's pages, or pages the kernel drops at this open,
            // must not meet a store taken before.
            self.fence_stores(&inode);
        }
        let mut flags = if keep {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        if direct_io {
            flags |= FopenFlags::FOPEN_DIRECT_IO;
        }
        Ok((file, flags))
    }
}
