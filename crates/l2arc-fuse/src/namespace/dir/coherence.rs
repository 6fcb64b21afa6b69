//! Coherence with the kernel's page cache: the tree's pages are kept
//! across opens and dropped exactly when the source changes.
//!
//! Files are opened with FOPEN_KEEP_CACHE when nothing changed since the
//! kernel's pages were filled, so a hot file is served by the page cache at
//! memory speed and its pages survive close and reopen. They are dropped
//! exactly when the source changes behind the mount:
//!
//! - each inode remembers the generation (inode, size, mtime, ctime) its
//!   pages reflect (`Inode::page_generation`);
//! - the kernel asks for attributes at least once per attribute timeout
//!   while a file is read (FUSE_AUTO_INVAL_DATA), and at every lookup and
//!   stat; whenever the generation we then see differs, we revalidate the
//!   cache's records and tell the kernel to drop the inode's pages and
//!   attributes (`notify_inval_inode`) before answering;
//! - an open whose generation differs is answered without KEEP_CACHE, which
//!   drops the pages too.
//!
//! The kernel's own check on attribute change compares only size and mtime;
//! ctime is what catches a same-size rewrite whose mtime was set back
//! (`cp -p`, rsync, tar). A change is therefore seen at once by a new open.
//! A file held open may get no request at all (a reader of a mapping sends
//! none once its pages are in): the source watcher (`crate::watch`) checks
//! open files itself, by inotify at once and by a periodic generation
//! check, and drops the same things (`check_open_inode`).
//!
//! The invalidation runs on a thread of its own and the request waits for
//! it only a bounded time: the kernel may need one of our threads to
//! finish a read before it can drop a page that read holds locked. The
//! same thread stores whole records into the pages (`stores.rs`), in order
//! with the invalidations, which is what fences the stores.
//!
//! One exception, in `getattr`: when the size changed, we send no
//! invalidation at all. The kernel applies the answer with a check of its
//! own that truncates and drops the inode's pages whenever the size it
//! holds differs from ours. An invalidation, sent before the answer or
//! after it, bumps the inode's attribute version; if the kernel has not
//! applied the answer by then (its requester applies it after waking, while
//! we go on), it throws the answer away as outdated and reads on with the
//! old size. A file truncated behind the mount then read past its new end,
//! and the two short reads that followed raced each other's size updates:
//! the reader saw 300,001 bytes as 393,216, zeros after the end.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{SyncSender, sync_channel};
use std::time::Duration;

use fuser::INodeNo;
use l2arc::{Cache, ObjectHandle};

use super::stores::{StoreJob, store_record};
use super::{DirTree, FsOptions, TreeFile};
use crate::inodes::{Inode, Kind};
use crate::sys;
use crate::watch::{self, Check, Checked, Watcher};

/// Kernel invalidations waiting for the notifier thread.
pub(super) const INVALIDATE_QUEUE_LEN: usize = 1024;
/// Longest a request waits for the kernel to drop an inode's pages.
const INVALIDATE_WAIT_MAX: Duration = Duration::from_secs(2);

/// Work for the notification thread, done in order.
pub(super) enum KernelJob {
    /// Drop an inode's attributes and its pages in a range; then say so.
    Invalidate(u64, PageRange, SyncSender<()>),
    /// Say so once every job before this one is done.
    Barrier(SyncSender<()>),
    /// Hand a whole record to the kernel's pages (`stores.rs`).
    Store(StoreJob),
}

/// Does one job of the notification thread.
pub(super) fn do_kernel_job(notifier: Option<&fuser::Notifier>, job: KernelJob) {
    match job {
        KernelJob::Invalidate(ino, range, done) => {
            if let Some(notifier) = notifier {
                // ENOENT: the kernel already forgot the inode.
                let _ = notifier.inval_inode(INodeNo(ino), range.offset, range.len);
            }
            let _ = done.try_send(());
        }
        KernelJob::Barrier(done) => {
            let _ = done.try_send(());
        }
        KernelJob::Store(job) => {
            if let Some(notifier) = notifier {
                store_record(notifier, &job);
            }
        }
    }
}

/// Pages of a file to drop from the kernel's page cache, as
/// `notify_inval_inode` takes them: a length of 0 runs to the end.
#[derive(Clone, Copy, Debug)]
pub(super) struct PageRange {
    offset: i64,
    len: i64,
}

impl PageRange {
    /// Every page of the file.
    const ALL: Self = Self { offset: 0, len: 0 };

    /// The pages under `len` bytes at `offset` (`len` > 0).
    pub(super) fn of(offset: u64, len: usize) -> Self {
        assert!(len > 0, "an empty range would mean the whole file");
        Self {
            offset: i64::try_from(offset).unwrap_or(i64::MAX),
            len: i64::try_from(len).unwrap_or(i64::MAX),
        }
    }
}

/// Asks the notification thread to drop the kernel's attributes of `ino`
/// and its pages in `range`, and waits a bounded time for it to have done
/// so. False when the queue is full (nothing was sent).
fn invalidate_kernel(queue: &SyncSender<KernelJob>, ino: u64, range: PageRange) -> bool {
    let (done, wait) = sync_channel(1);
    if queue
        .try_send(KernelJob::Invalidate(ino, range, done))
        .is_err()
    {
        return false;
    }
    let _ = wait.recv_timeout(INVALIDATE_WAIT_MAX);
    true
}

/// The watcher's check of an open inode (`crate::watch`): on a change made
/// in the source, what a request that noticed it would do. Never while a
/// handle is open for writing through the mount (our own writes change
/// the generation too).
fn check_open_inode(
    cache: &Cache,
    queue: &SyncSender<KernelJob>,
    inode: &Inode,
    handle: &ObjectHandle,
    check: Check,
) -> Checked {
    if inode.writers.load(Ordering::SeqCst) > 0 {
        return Checked::Unchanged;
    }
    let check = watch::unless_own(inode, check);
    let Ok(st) = sys::stat_at(inode.fd(), c"") else {
        // Only a dead network mount fails fstat of a held descriptor.
        return Checked::Unchanged;
    };
    let now = l2arc::primary::Generation::of_stat(&st);
    {
        let mut seen = inode.page_generation.lock().expect("poisoned");
        if check != Check::Modified && *seen == Some(now) {
            return Checked::Unchanged;
        }
        *seen = Some(now);
    }
    let token = handle.generation_token();
    if check == Check::Modified {
        // The generation may not show it (see `crate::watch`).
        cache.invalidate_object(handle);
    }
    let _ = cache.revalidate(handle);
    let foreign = handle.generation_token() != token;
    // Stores taken before are of the old content (`stores.rs`).
    inode.store_epoch.fetch_add(1, Ordering::SeqCst);
    if invalidate_kernel(queue, inode.id, PageRange::ALL) {
        Checked::Dropped { foreign }
    } else {
        Checked::Busy
    }
}

/// Starts the source watcher (`crate::watch`), whose checks run
/// `check_open_inode`.
pub(super) fn start_watcher(
    cache: &Arc<Cache>,
    queue: &SyncSender<KernelJob>,
    options: &FsOptions,
) -> io::Result<Watcher> {
    let cache = Arc::clone(cache);
    let queue = queue.clone();
    Watcher::start(
        options.source_inotify,
        options.source_poll_interval,
        Box::new(move |inode, handle, check| {
            check_open_inode(&cache, &queue, inode, handle, check)
        }),
    )
}

impl DirTree {
    /// Compares a regular file's generation with the one its kernel pages
    /// reflect; on a difference, revalidates the cache's records and drops
    /// the kernel's pages and attributes (see the module comment).
    pub(super) fn notice_change(&self, inode: &Inode, st: &libc::stat, open: Option<&TreeFile>) {
        if self.notice_change_before_reply(inode, st, open) {
            self.invalidate_kernel(inode.id);
        }
    }

    /// `notice_change` for `getattr`: a change of size is left to the
    /// kernel's own check when it applies the answer (see the module
    /// comment); any other change is invalidated before the answer.
    pub(super) fn notice_change_for_getattr(
        &self,
        inode: &Inode,
        st: &libc::stat,
        open: Option<&TreeFile>,
    ) {
        let old_size = inode
            .page_generation
            .lock()
            .expect("poisoned")
            .map(|g| g.size_bytes);
        if !self.notice_change_before_reply(inode, st, open) {
            return;
        }
        if old_size.is_some_and(|size| size != st.st_size as u64) {
            // No invalidation, but a store in flight (of the old content,
            // possibly past the new end) must land before the answer.
            self.fence_stores(inode);
            return;
        }
        self.invalidate_kernel(inode.id);
    }

    /// Records a regular file's new generation and revalidates the cache's
    /// records of it; true when the generation changed (the kernel's pages
    /// are then to be dropped).
    fn notice_change_before_reply(
        &self,
        inode: &Inode,
        st: &libc::stat,
        open: Option<&TreeFile>,
    ) -> bool {
        if inode.kind != Kind::Regular {
            return false;
        }
        let now = l2arc::primary::Generation::of_stat(st);
        {
            let mut seen = inode.page_generation.lock().expect("poisoned");
            match *seen {
                Some(old) if old != now => *seen = Some(now),
                _ => return false,
            }
        }
        let weak = inode.open_file.lock().expect("poisoned").upgrade();
        if let Some(file) = open.or(weak.as_deref()) {
            // Handles share the object's state: this revalidates them all.
            let _ = self.serving.cache.revalidate(&file.handle);
        }
        // Stores taken before are of the old content; the invalidation
        // that follows (queued behind any store in flight) is the barrier.
        inode.store_epoch.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// Tells the kernel to drop its pages and attributes of `ino`, waiting
    /// a bounded time for it to have done so.
    fn invalidate_kernel(&self, ino: u64) {
        invalidate_kernel(&self.kernel_jobs, ino, PageRange::ALL);
    }

    /// Tells the kernel to drop its attributes of `ino` and its pages
    /// under `range`, waiting a bounded time for it to have done so
    /// (after a direct write: `passthrough.rs`).
    pub(super) fn invalidate_kernel_range(&self, ino: u64, range: PageRange) {
        invalidate_kernel(&self.kernel_jobs, ino, range);
    }

    /// After a change to `inode` that its kernel pages must not outlive:
    /// drops the stores taken before it and waits (bounded) until any store
    /// already being made has landed, so that the kernel hears of the
    /// change after it (`stores.rs`).
    pub(super) fn fence_stores(&self, inode: &Inode) {
        inode.store_epoch.fetch_add(1, Ordering::SeqCst);
        let (done, wait) = sync_channel(1);
        if self.kernel_jobs.try_send(KernelJob::Barrier(done)).is_ok() {
            let _ = wait.recv_timeout(INVALIDATE_WAIT_MAX);
        }
    }

    /// Drops every cached record of `inode` (its content changed by another
    /// path than `Cache::write`), through `open` if the caller has one.
    pub(super) fn invalidate_records(&self, inode: &Inode, open: Option<&TreeFile>) {
        let upgraded;
        let file = match open {
            Some(file) => Some(file),
            None => {
                upgraded = inode.open_file.lock().expect("poisoned").upgrade();
                upgraded.as_deref()
            }
        };
        if let Some(file) = file {
            self.serving.cache.invalidate_object(&file.handle);
            let _ = self.serving.cache.revalidate(&file.handle);
        } else if let Ok(fd) = sys::reopen(inode.fd(), libc::O_RDONLY)
            && let Ok(handle) =
                self.serving
                    .cache
                    .open_file(self.dataset, std::fs::File::from(fd), false)
        {
            // Handles share the object's state: this drops it for all of them.
            self.serving.cache.invalidate_object(&handle);
        }
        self.fence_stores(inode);
    }
}
