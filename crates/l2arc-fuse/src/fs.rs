//! The FUSE operations: reads through the cache, everything else through to
//! the source, each acting on a descriptor of the inode it concerns.
//!
//! Reads are the point of the mount: `read` asks the cache (ARC, then
//! L2ARC, then the source) and, for a sequential reader, starts read-ahead
//! in the background. Everything that changes the source — writes,
//! truncates, renames, unlinks, attribute changes — goes straight through
//! to the source and then drops whatever the cache held that it made
//! stale: `Cache::write` is write-through and invalidates the records it
//! touched, and a truncate or fallocate invalidates the whole object.
//!
//! Coherence with the kernel's page cache. Files are opened with
//! FOPEN_KEEP_CACHE when nothing changed since the kernel's pages were
//! filled, so a hot file is served by the page cache at memory speed and
//! its pages survive close and reopen. They are dropped exactly when the
//! source changes behind the mount:
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
//! A new open of a name that the source replaced (`mv new f`) or removed
//! reaches the old inode: the kernel caches names for the entry timeout,
//! and an open does not look the name up again before. That inode then
//! has no name left; the open is refused with ESTALE, on which the kernel
//! walks the path again with every name revalidated (`StaleOpens`).
//!
//! The invalidation runs on a thread of its own and the request waits for
//! it only a bounded time: the kernel may need one of our threads to
//! finish a read before it can drop a page that read holds locked.
//!
//! Whole records into the page cache. A random 4 KiB read that misses
//! the kernel's pages costs a FUSE round trip and fills one page, so a
//! random reader warms the page cache one page per miss (the seed
//! workload took 2.9x a pass over the disks to reach the page cache's
//! rate). After answering such a read, the record under it is handed to
//! the kernel whole (`notify_store`), from the notification thread, so
//! each record read fills all its pages. A store is the one write into
//! the kernel's pages that no request orders, so it is fenced:
//!
//! - it is taken only while no handle of the file is open for writing
//!   (`Inode::writers`): a buffered write holds its pages locked while it
//!   waits for our answer, so a store must never be in flight then;
//! - every change the pages must not outlive (an open for writing, a
//!   truncate, a change seen behind the mount, an open without
//!   KEEP_CACHE) bumps the inode's `store_epoch` after the change and then
//!   waits, before its answer, for the notification thread to pass a
//!   barrier: a store taken before the change has then landed before the
//!   kernel hears of it, and a store taken at the old epoch is dropped;
//! - the waits are bounded (see below); a store that lands after its
//!   epoch moved anyway is followed at once by an invalidation of its
//!   range.
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
//!
//! Open files and directory listings live in one table bounded by
//! `FsOptions`; past the bound an open fails with EMFILE.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use l2arc::arc::AccessKind;
use l2arc::primary::dir::DirPrimary;
use l2arc::{Cache, DatasetId, ObjectHandle};

use crate::creds;
use crate::handles::{Handle, HandleTable};
use crate::inodes::{Inode, InodeTable, Kind, ROOT_ID, own_number_id};
use crate::locks::{LockRange, LockTable};
use crate::readahead::ReadAhead;
use crate::sys;
use crate::watch::{self, Check, Checked, Watch, Watcher};
use crate::workers;

/// Tunables of the file system.
#[derive(Clone, Debug)]
pub struct FsOptions {
    /// How long the kernel may trust attributes and names we returned (a
    /// file held open is checked by the watcher meanwhile: `crate::watch`).
    pub attr_timeout: Duration,
    /// Largest read-ahead window, in records (0 = no read-ahead).
    pub readahead_max_records: u32,
    /// Bound of the inode table (nodes the kernel holds); also limited to
    /// half the descriptors the process may open.
    pub max_nodes: usize,
    /// Bound of open files plus open directories; also limited to a
    /// quarter of the descriptors the process may open.
    pub max_open_handles: usize,
    /// Largest directory listed (entries held per open directory).
    pub max_dir_entries: usize,
    /// Bytes of directory listings held by all open directories together
    /// (names plus per-entry overhead); an opendir beyond it fails with
    /// ENOMEM until others are closed.
    pub max_dir_listing_bytes: usize,
    /// Background read-ahead threads.
    pub prefetch_threads: usize,
    /// After a small read, hand the kernel the whole record under it (up
    /// to 128 KiB), so that a random reader fills the page cache a record
    /// per miss instead of a page (see the module comment).
    pub store_whole_records: bool,
    /// Watch the source of open files with inotify (`crate::watch`): a
    /// change made there reaches the kernel's pages at once.
    pub source_inotify: bool,
    /// How often open files are checked for a change in the source that
    /// inotify cannot see (another NFS client's, a shared mapping's);
    /// zero: never.
    pub source_poll_interval: Duration,
}

impl Default for FsOptions {
    fn default() -> Self {
        Self {
            attr_timeout: Duration::from_secs(1),
            readahead_max_records: 8,
            max_nodes: 1 << 19,
            max_open_handles: 1 << 16,
            max_dir_entries: 1 << 20,
            max_dir_listing_bytes: 64 << 20,
            prefetch_threads: 2,
            store_whole_records: true,
            source_inotify: true,
            source_poll_interval: Duration::from_millis(500),
        }
    }
}

/// Read-ahead requests waiting for a thread; more are dropped, not queued:
/// read-ahead is a hint and must never hold up demand reads.
const PREFETCH_QUEUE_LEN: usize = 64;
/// Kernel invalidations waiting for the notifier thread.
const INVALIDATE_QUEUE_LEN: usize = 1024;
/// Relief batches waiting for their thread (each is bounded by the table).
const RELIEF_QUEUE_LEN: usize = 2;
/// Largest record stored whole into the kernel's pages on a small read.
const STORE_RECORD_BYTES_MAX: u64 = 128 << 10;
/// Most record bytes held by stores waiting for the notification thread.
const STORE_BYTES_MAX: usize = 32 << 20;
/// Most stores waiting (a quarter of the queue: invalidations keep room).
const STORE_JOBS_MAX: usize = INVALIDATE_QUEUE_LEN / 4;
/// Longest a request waits for the kernel to drop an inode's pages.
const INVALIDATE_WAIT_MAX: Duration = Duration::from_secs(2);
/// Descriptors kept free for everything that is not a node or a handle.
const FD_RESERVE: u64 = 256;
/// Opens refused as stale that are remembered, to let their retry through
/// when it comes back to the same inode (`StaleOpens`).
const STALE_OPENS_MAX: usize = 64;
/// How long a refused open is remembered: its retry follows at once.
const STALE_OPEN_RETRY_WINDOW: Duration = Duration::from_secs(1);

/// One open of a regular file.
pub(crate) struct OpenFile {
    handle: ObjectHandle,
    /// The file's node (its store epoch and writer count).
    inode: Arc<Inode>,
    writable: bool,
    readahead: Mutex<ReadAhead>,
    last_revalidate: Mutex<Instant>,
    /// The source watcher, which counts this open (`crate::watch`).
    watch: Watch,
}

impl Drop for OpenFile {
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

struct DirEntry {
    name: std::ffi::OsString,
    kind: FileType,
    ino: u64,
}

/// An open directory's entries, read at opendir and charged to the mount's
/// listing budget until the last reference goes.
struct DirListing {
    entries: Vec<DirEntry>,
    charged_bytes: usize,
    held_bytes: Arc<AtomicUsize>,
}

impl DirListing {
    /// What an entry costs in RSS: its slot in the listing and its name's
    /// allocation as glibc's malloc makes it (8 bytes of header, 16-byte
    /// steps, 32 at least): the name's length alone charged an entry with
    /// a short name two thirds of what it holds.
    fn cost_bytes(name_len: usize) -> usize {
        std::mem::size_of::<DirEntry>() + (name_len + 8).next_multiple_of(16).max(32)
    }
}

/// Bytes of listing charged at a time while a directory is read.
const LISTING_CHARGE_STEP: usize = 64 << 10;

impl Drop for DirListing {
    fn drop(&mut self) {
        let before = self
            .held_bytes
            .fetch_sub(self.charged_bytes, Ordering::SeqCst);
        debug_assert!(before >= self.charged_bytes, "listing budget underflow");
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
struct StaleOpens {
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

/// What a setattr asks to change (None: leave it).
struct SetAttr {
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
}

type PrefetchJob = (Arc<OpenFile>, u64, u64);
/// Nodes whose entries the kernel is asked to drop (`InodeTable::relief`).
type ReliefJob = Vec<Arc<Inode>>;
/// Work for the notification thread, done in order.
enum KernelJob {
    /// Drop an inode's pages and attributes; then say so.
    Invalidate(u64, SyncSender<()>),
    /// Say so once every job before this one is done.
    Barrier(SyncSender<()>),
    /// Hand a whole record to the kernel's pages (see the module comment).
    Store(StoreJob),
}

/// A record to store into the kernel's pages of `inode` at `offset_bytes`,
/// if its store epoch is still `epoch` and no writer is open.
struct StoreJob {
    inode: Arc<Inode>,
    epoch: u64,
    offset_bytes: u64,
    view: l2arc::ReadView,
    /// Released from `StoreBudget` when the job is done or dropped.
    budget: Arc<StoreBudget>,
}

impl Drop for StoreJob {
    fn drop(&mut self) {
        self.budget.release(self.view.len());
    }
}

/// Bounds the record bytes (and jobs) held by queued stores, so that they
/// never crowd invalidations out of the queue nor hold much DRAM.
struct StoreBudget {
    bytes: AtomicUsize,
    jobs: AtomicUsize,
}

impl StoreBudget {
    fn try_take(&self, bytes: usize) -> bool {
        if self.jobs.fetch_add(1, Ordering::SeqCst) >= STORE_JOBS_MAX {
            self.jobs.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        if self.bytes.fetch_add(bytes, Ordering::SeqCst) + bytes > STORE_BYTES_MAX {
            self.release(bytes);
            return false;
        }
        true
    }

    fn release(&self, bytes: usize) {
        self.bytes.fetch_sub(bytes, Ordering::SeqCst);
        self.jobs.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Does one job of the notification thread.
fn do_kernel_job(notifier: Option<&fuser::Notifier>, job: KernelJob) {
    match job {
        KernelJob::Invalidate(ino, done) => {
            if let Some(notifier) = notifier {
                // ENOENT: the kernel already forgot the inode.
                let _ = notifier.inval_inode(INodeNo(ino), 0, 0);
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

/// Asks the notification thread to drop the kernel's pages and attributes
/// of `ino`, and waits a bounded time for it to have done so. False when
/// the queue is full (nothing was sent).
fn invalidate_kernel(queue: &SyncSender<KernelJob>, ino: u64) -> bool {
    let (done, wait) = sync_channel(1);
    if queue.try_send(KernelJob::Invalidate(ino, done)).is_err() {
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
    // Stores taken before are of the old content (see the module comment).
    inode.store_epoch.fetch_add(1, Ordering::SeqCst);
    if invalidate_kernel(queue, inode.id) {
        Checked::Dropped { foreign }
    } else {
        Checked::Busy
    }
}

/// Starts the source watcher (`crate::watch`), whose checks run
/// `check_open_inode`.
fn start_watcher(
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

/// Stores `job`'s record into the kernel's pages unless a writer is open
/// or its epoch moved; invalidates the range again if the epoch moved
/// while it was being stored.
fn store_record(notifier: &fuser::Notifier, job: &StoreJob) {
    let inode = &job.inode;
    let current = || {
        inode.writers.load(Ordering::SeqCst) == 0
            && inode.store_epoch.load(Ordering::SeqCst) == job.epoch
    };
    if !current() {
        return;
    }
    let mut at = job.offset_bytes;
    for slice in job.view.slices() {
        // ENOENT: the kernel forgot the inode; nothing to fill.
        if notifier.store(INodeNo(inode.id), at, slice).is_err() {
            break;
        }
        at += slice.len() as u64;
    }
    if !current() {
        let _ = notifier.inval_inode(
            INodeNo(inode.id),
            job.offset_bytes as i64,
            job.view.len() as i64,
        );
    }
}

/// The kernel side of the mount, known once it is mounted (`crate::mount`).
pub(crate) type NotifierSlot = Arc<OnceLock<fuser::Notifier>>;

/// A directory tree served through the cache.
pub struct CachedFs {
    cache: Arc<Cache>,
    dataset: DatasetId,
    options: FsOptions,
    inodes: Mutex<InodeTable>,
    handles: HandleTable<OpenFile, DirListing>,
    locks: LockTable,
    prefetch: Option<SyncSender<PrefetchJob>>,
    invalidate: SyncSender<KernelJob>,
    store_budget: Arc<StoreBudget>,
    relief: SyncSender<ReliefJob>,
    pub(crate) notifier: NotifierSlot,
    /// The kernel's `max_background` asked for at init: set by `mount`.
    pub(crate) max_background: u16,
    /// The source directory's path now, to name open files in analytics.
    source_root: std::path::PathBuf,
    /// Bytes of listings held by open directories (`max_dir_listing_bytes`).
    dir_listing_bytes: Arc<AtomicUsize>,
    /// Opens lately refused as stale, awaiting their retry.
    stale_opens: StaleOpens,
    /// Checks open files against the source (`crate::watch`); dropped
    /// last: its thread is joined.
    watcher: Watcher,
}

fn errno(e: &io::Error) -> Errno {
    if let Some(code) = e.raw_os_error() {
        return Errno::from_i32(code);
    }
    // Errors rebuilt with a message (DirPrimary's) keep only their kind.
    use io::ErrorKind as K;
    Errno::from_i32(match e.kind() {
        K::NotFound => libc::ENOENT,
        K::PermissionDenied => libc::EACCES,
        K::AlreadyExists => libc::EEXIST,
        K::NotADirectory => libc::ENOTDIR,
        K::IsADirectory => libc::EISDIR,
        K::DirectoryNotEmpty => libc::ENOTEMPTY,
        K::InvalidInput => libc::EINVAL,
        K::Interrupted => libc::EINTR,
        K::StorageFull => libc::ENOSPC,
        K::ReadOnlyFilesystem => libc::EROFS,
        K::OutOfMemory => libc::ENOMEM,
        K::Unsupported => libc::EOPNOTSUPP,
        _ => libc::EIO,
    })
}

fn err(e: io::Error) -> Errno {
    errno(&e)
}

/// `/proc/self/fd/N`: its link names the file a descriptor holds.
fn fd_path(fd: std::os::fd::RawFd) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/proc/self/fd/{fd}"))
}

fn leaf(name: &OsStr) -> Result<CString, Errno> {
    sys::leaf(name).map_err(err)
}

fn system_time(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs()) + Duration::from_nanos(nsec as u64)
    }
}

fn file_type(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn dirent_type(d_type: u8) -> FileType {
    match d_type {
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_FIFO => FileType::NamedPipe,
        libc::DT_SOCK => FileType::Socket,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_BLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn to_attr(ino: u64, st: &libc::stat) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: system_time(st.st_atime, st.st_atime_nsec),
        mtime: system_time(st.st_mtime, st.st_mtime_nsec),
        ctime: system_time(st.st_ctime, st.st_ctime_nsec),
        crtime: UNIX_EPOCH,
        kind: file_type(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

fn time(t: Option<TimeOrNow>) -> sys::Time {
    match t {
        None => sys::Time::Omit,
        Some(TimeOrNow::Now) => sys::Time::Now,
        Some(TimeOrNow::SpecificTime(at)) => sys::Time::At(at),
    }
}

impl CachedFs {
    /// `dataset` must be a dataset of `cache` whose primary serves the same
    /// tree as `primary` (possibly wrapped, e.g. in an emulated HDD).
    pub fn new(
        cache: Arc<Cache>,
        dataset: DatasetId,
        primary: Arc<DirPrimary>,
        options: FsOptions,
    ) -> io::Result<Self> {
        assert!(options.max_open_handles > 0 && options.max_dir_entries > 0);
        let mut options = options;
        // Every node and every open file holds a descriptor.
        let wanted = (options.max_nodes + options.max_open_handles) as u64 + FD_RESERVE;
        let fd_limit = sys::raise_nofile_limit(wanted).saturating_sub(FD_RESERVE);
        options.max_nodes = options.max_nodes.min((fd_limit / 2) as usize).max(2);
        options.max_open_handles = options.max_open_handles.min((fd_limit / 4) as usize).max(1);

        let root_fd = primary.open_fd_beneath("", libc::O_PATH | libc::O_DIRECTORY)?;
        let root = sys::stat_at(root_fd.as_raw_fd(), c"")?;
        let source_root = std::fs::read_link(fd_path(root_fd.as_raw_fd()))?;
        let inodes = InodeTable::new(root_fd, root.st_dev, root.st_ino, options.max_nodes);

        let prefetch = if options.readahead_max_records > 0 && options.prefetch_threads > 0 {
            let cache = Arc::clone(&cache);
            Some(workers::spawn_pool(
                "l2arc-prefetch",
                options.prefetch_threads,
                PREFETCH_QUEUE_LEN,
                move |(file, offset, len): PrefetchJob| {
                    // A failed read-ahead is only a lost hint; the demand
                    // read reports errors.
                    let _ = cache.prefetch_span(&file.handle, offset, len);
                },
            )?)
        } else {
            None
        };
        let notifier: NotifierSlot = Arc::new(OnceLock::new());
        let invalidate = {
            let notifier = Arc::clone(&notifier);
            workers::spawn_worker(
                "l2arc-fuse-inval",
                INVALIDATE_QUEUE_LEN,
                move |job: KernelJob| do_kernel_job(notifier.get(), job),
            )?
        };
        let relief = {
            let notifier = Arc::clone(&notifier);
            let root_key = (root.st_dev, root.st_ino);
            let source_root = source_root.clone();
            workers::spawn_worker("l2arc-fuse-relief", RELIEF_QUEUE_LEN, move |batch| {
                if let Some(notifier) = notifier.get() {
                    relieve(notifier, root_key, &source_root, batch);
                }
            })?
        };
        let watcher = start_watcher(&cache, &invalidate, &options)?;
        Ok(Self {
            cache,
            dataset,
            inodes: Mutex::new(inodes),
            handles: HandleTable::new(options.max_open_handles),
            locks: LockTable::new(options.max_open_handles),
            prefetch,
            invalidate,
            store_budget: Arc::new(StoreBudget {
                bytes: AtomicUsize::new(0),
                jobs: AtomicUsize::new(0),
            }),
            relief,
            notifier,
            max_background: crate::MAX_BACKGROUND_MIN,
            source_root,
            dir_listing_bytes: Arc::new(AtomicUsize::new(0)),
            stale_opens: StaleOpens::default(),
            watcher,
            options,
        })
    }

    /// The options in force: the node and handle bounds as lowered to fit
    /// the descriptors the process may open.
    pub fn options(&self) -> &FsOptions {
        &self.options
    }

    fn ttl(&self) -> Duration {
        self.options.attr_timeout
    }

    fn inode(&self, ino: INodeNo) -> Result<Arc<Inode>, Errno> {
        self.inodes
            .lock()
            .expect("inode table poisoned")
            .get(ino.0)
            .ok_or(Errno::ENOENT)
    }

    fn stat(inode: &Inode) -> Result<libc::stat, Errno> {
        sys::stat_at(inode.fd(), c"").map_err(err)
    }

    /// The node of `name` in `parent` (one lookup reference), with its
    /// attributes; notices a change behind the mount.
    fn lookup_child(&self, parent: &Inode, name: &OsStr) -> Result<FileAttr, Errno> {
        let leaf = leaf(name)?;
        let fd = sys::open_at(parent.fd(), &leaf, libc::O_PATH, 0).map_err(err)?;
        self.adopt_node(fd)
    }

    /// Registers the inode `fd` pins (an O_PATH descriptor) as a node.
    fn adopt_node(&self, fd: OwnedFd) -> Result<FileAttr, Errno> {
        let st = sys::stat_at(fd.as_raw_fd(), c"").map_err(err)?;
        let (inode, relief) = {
            let mut inodes = self.inodes.lock().expect("inode table poisoned");
            let inode = inodes.lookup(fd, st.st_dev, st.st_ino, st.st_mode);
            (inode, inodes.relief())
        };
        if !relief.is_empty() {
            // Dropped when a batch is still being sent: the next one comes.
            let _ = self.relief.try_send(relief);
        }
        let inode = inode.ok_or(Errno::ENFILE)?;
        self.notice_change(&inode, &st, None);
        Ok(to_attr(inode.id, &st))
    }

    /// Compares a regular file's generation with the one its kernel pages
    /// reflect; on a difference, revalidates the cache's records and drops
    /// the kernel's pages and attributes (see the module comment).
    fn notice_change(&self, inode: &Inode, st: &libc::stat, open: Option<&OpenFile>) {
        if self.notice_change_before_reply(inode, st, open) {
            self.invalidate_kernel(inode.id);
        }
    }

    /// `notice_change` for `getattr`: a change of size is left to the
    /// kernel's own check when it applies the answer (see the module
    /// comment); any other change is invalidated before the answer.
    fn notice_change_for_getattr(&self, inode: &Inode, st: &libc::stat, open: Option<&OpenFile>) {
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
        open: Option<&OpenFile>,
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
            let _ = self.cache.revalidate(&file.handle);
        }
        // Stores taken before are of the old content; the invalidation
        // that follows (queued behind any store in flight) is the barrier.
        inode.store_epoch.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// Tells the kernel to drop its pages and attributes of `ino`, waiting
    /// a bounded time for it to have done so.
    fn invalidate_kernel(&self, ino: u64) {
        invalidate_kernel(&self.invalidate, ino);
    }

    /// After a change to `inode` that its kernel pages must not outlive:
    /// drops the stores taken before it and waits (bounded) until any store
    /// already being made has landed, so that the kernel hears of the
    /// change after it (see the module comment).
    fn fence_stores(&self, inode: &Inode) {
        inode.store_epoch.fetch_add(1, Ordering::SeqCst);
        let (done, wait) = sync_channel(1);
        if self.invalidate.try_send(KernelJob::Barrier(done)).is_ok() {
            let _ = wait.recv_timeout(INVALIDATE_WAIT_MAX);
        }
    }

    fn file(&self, fh: FileHandle) -> Result<Arc<OpenFile>, Errno> {
        self.handles.file(fh.0)
    }

    /// Registers an open regular file (`fd` opened with `flags`) and says
    /// whether the kernel may keep its pages of it.
    fn register_open(
        &self,
        inode: Arc<Inode>,
        fd: OwnedFd,
        flags: i32,
    ) -> Result<(u64, FopenFlags), Errno> {
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
            .cache
            .open_file(self.dataset, std::fs::File::from(fd), writable)
            .map_err(err)?;
        if let Some(name) = name {
            self.cache.name_object(&handle, &name);
        }
        if writable {
            // Counted before the file exists: its drop uncounts it.
            inode.writers.fetch_add(1, Ordering::SeqCst);
        }
        // Likewise: its drop closes it.
        let watch = self.watcher.watch().clone();
        watch.opened(&inode, &handle);
        let file = Arc::new(OpenFile {
            handle,
            inode: Arc::clone(&inode),
            writable,
            readahead: Mutex::new(ReadAhead::new(self.options.readahead_max_records)),
            last_revalidate: Mutex::new(Instant::now()),
            watch,
        });
        *inode.open_file.lock().expect("poisoned") = Arc::downgrade(&file);
        if writable || !keep {
            // A writer's pages, or pages the kernel drops at this open,
            // must not meet a store taken before.
            self.fence_stores(&inode);
        }
        let fh = self.handles.add(Handle::File(file))?;
        let flags = if keep {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        Ok((fh, flags))
    }

    /// Drops every cached record of `inode` (its content changed by another
    /// path than `Cache::write`), through `fh` if the caller has one.
    fn invalidate_records(&self, inode: &Inode, fh: Option<FileHandle>) {
        let file = fh
            .and_then(|fh| self.file(fh).ok())
            .or_else(|| inode.open_file.lock().expect("poisoned").upgrade());
        if let Some(file) = file {
            self.cache.invalidate_object(&file.handle);
            let _ = self.cache.revalidate(&file.handle);
        } else if let Ok(fd) = sys::reopen(inode.fd(), libc::O_RDONLY)
            && let Ok(handle) = self
                .cache
                .open_file(self.dataset, std::fs::File::from(fd), false)
        {
            // Handles share the object's state: this drops it for all of them.
            self.cache.invalidate_object(&handle);
        }
        self.fence_stores(inode);
    }

    /// Revalidates an open file at most once per attribute timeout. The
    /// lock is held through the revalidation: a concurrent read of the same
    /// file (the kernel sends several at once) must wait for it, not go on
    /// under the old size and generation because the clock was already
    /// reset (it served bytes past a truncation behind the mount).
    fn maybe_revalidate(&self, file: &OpenFile) -> io::Result<()> {
        let mut last = file.last_revalidate.lock().expect("poisoned");
        if last.elapsed() >= self.options.attr_timeout {
            let started = Instant::now();
            self.cache.revalidate(&file.handle)?;
            *last = started;
        }
        Ok(())
    }

    fn do_setattr(
        &self,
        ino: INodeNo,
        change: SetAttr,
        fh: Option<FileHandle>,
    ) -> Result<FileAttr, Errno> {
        let inode = self.inode(ino)?;
        let fd = inode.fd();
        // Its events are ours (`crate::watch`).
        watch::note_own_change(&inode);
        if let Some(mode) = change.mode {
            sys::chmod_fd(fd, mode).map_err(err)?;
        }
        let nothing = change.mode.is_none()
            && change.uid.is_none()
            && change.gid.is_none()
            && change.size.is_none()
            && change.atime.is_none()
            && change.mtime.is_none();
        if change.uid.is_some() || change.gid.is_some() || nothing {
            // A setattr that changes nothing is a chown(f, -1, -1): the
            // kernel sends its ctime only to a mount with a writeback
            // cache. Passed through, it moves ctime as the source's file
            // system does for its own callers (ext4 does).
            sys::chown_fd(fd, change.uid, change.gid).map_err(err)?;
        }
        if let Some(size) = change.size {
            let file = sys::reopen(fd, libc::O_WRONLY | libc::O_NONBLOCK).map_err(err)?;
            let result = sys::ftruncate(file.as_raw_fd(), size);
            self.invalidate_records(&inode, fh);
            result.map_err(err)?;
        }
        if change.atime.is_some() || change.mtime.is_some() {
            sys::utimens_fd(fd, &time(change.atime), &time(change.mtime)).map_err(err)?;
        }
        let st = Self::stat(&inode)?;
        Ok(to_attr(inode.id, &st))
    }

    fn do_create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(FileAttr, u64, FopenFlags), Errno> {
        let parent = self.inode(parent)?;
        let leaf = leaf(name)?;
        // O_APPEND stays with the kernel: our writes come with offsets.
        let flags = flags & (libc::O_ACCMODE | libc::O_EXCL | libc::O_TRUNC);
        let fd = {
            let _as = creds::as_caller(req.uid(), req.gid());
            sys::open_at(
                parent.fd(),
                &leaf,
                flags | libc::O_CREAT | libc::O_NONBLOCK,
                mode & !umask & 0o7777,
            )
            .map_err(err)?
        };
        let path_fd = sys::reopen(fd.as_raw_fd(), libc::O_PATH).map_err(err)?;
        let attr = self.adopt_node(path_fd)?;
        let inode = self.inode(attr.ino)?;
        if flags & libc::O_TRUNC != 0 {
            self.invalidate_records(&inode, None);
        }
        match self.register_open(inode, fd, flags) {
            Ok((fh, open_flags)) => Ok((attr, fh, open_flags)),
            Err(e) => {
                // The kernel never learns of the node: give its reference back.
                self.inodes.lock().expect("poisoned").forget(attr.ino.0, 1);
                Err(e)
            }
        }
    }

    fn do_open(
        &self,
        ino: INodeNo,
        flags: OpenFlags,
        pid: u32,
    ) -> Result<(u64, FopenFlags), Errno> {
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

    fn do_opendir(&self, ino: INodeNo) -> Result<u64, Errno> {
        let inode = self.inode(ino)?;
        let fd = sys::open_at(
            inode.fd(),
            c".",
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK,
            0,
        )
        .map_err(err)?;
        // Charged as it is read, so that concurrent opendirs of huge
        // directories never hold more than the bound even while reading (a
        // charge after the read let each serving thread hold a whole
        // listing beyond it). The listing's drop gives the charge back.
        let mut listing = DirListing {
            entries: Vec::new(),
            charged_bytes: 0,
            held_bytes: Arc::clone(&self.dir_listing_bytes),
        };
        let max_bytes = self.options.max_dir_listing_bytes;
        let mut uncharged = 0;
        let charge = |bytes: usize, listing: &mut DirListing| {
            let held = self.dir_listing_bytes.fetch_add(bytes, Ordering::SeqCst);
            listing.charged_bytes += bytes;
            if held + bytes > max_bytes {
                return Err(io::Error::from_raw_os_error(libc::ENOMEM));
            }
            Ok(())
        };
        let raw = sys::read_dir(fd, self.options.max_dir_entries, |e| {
            uncharged += DirListing::cost_bytes(e.name.len());
            if uncharged < LISTING_CHARGE_STEP {
                return Ok(());
            }
            charge(std::mem::take(&mut uncharged), &mut listing)
        })
        .map_err(err)?;
        charge(uncharged, &mut listing).map_err(err)?;
        listing.entries = raw
            .into_iter()
            .map(|e| DirEntry {
                name: e.name,
                kind: dirent_type(e.d_type),
                ino: e.ino,
            })
            .collect();
        // The slots as charged: no growth slack held for the handle's life.
        listing.entries.shrink_to_fit();
        self.handles.add(Handle::Dir(Arc::new(listing)))
    }

    fn do_read(&self, fh: FileHandle, offset: u64, size: u32, reply: ReplyData) {
        let timer = self.cache.analytics().start();
        let file = match self.file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        if let Err(e) = self.maybe_revalidate(&file) {
            return reply.error(errno(&e));
        }
        // Taken before the read: a change after it drops the store.
        let epoch = file.inode.store_epoch.load(Ordering::SeqCst);
        let whole = self.record_to_store(&file, offset, size);
        let (read_at, read_len) = whole.unwrap_or((offset, size as usize));
        let view = match self
            .cache
            .read_view(&file.handle, read_at, read_len, AccessKind::Demand)
        {
            Ok(v) => v,
            Err(e) => return reply.error(errno(&e)),
        };
        // What the request asked for, within what was read.
        let skip = (offset - read_at) as usize;
        let served = view.len().saturating_sub(skip).min(size as usize);
        if let Some(tx) = &self.prefetch {
            let ahead = file.readahead.lock().expect("poisoned").on_read(
                offset,
                served as u64,
                u64::from(file.handle.recordsize_bytes()),
                file.handle.size_bytes(),
            );
            if let Some((from, len)) = ahead {
                match tx.try_send((Arc::clone(&file), from, len)) {
                    Ok(()) | Err(TrySendError::Full(_)) => {}
                    Err(TrySendError::Disconnected(_)) => {}
                }
            }
        }
        match view.as_single_slice() {
            Some(bytes) => reply.data(&bytes[skip.min(bytes.len())..][..served]),
            None => {
                let mut buf = vec![0u8; view.len()];
                view.copy_to(&mut buf);
                reply.data(&buf[skip.min(buf.len())..][..served]);
            }
        }
        if whole.is_some() && !view.is_empty() && self.store_budget.try_take(view.len()) {
            let job = StoreJob {
                inode: Arc::clone(&file.inode),
                epoch,
                offset_bytes: read_at,
                view,
                budget: Arc::clone(&self.store_budget),
            };
            // A full queue drops the store (its drop gives the budget back).
            let _ = self.invalidate.try_send(KernelJob::Store(job));
        }
        self.cache.analytics().frontend.finish(timer);
    }

    /// The record to read whole and store into the kernel's pages for a
    /// read of `size` at `offset` (see the module comment): a small read
    /// inside one record of at most `STORE_RECORD_BYTES_MAX`, of a file
    /// with no writer open. Larger records are read in sectors from flash,
    /// and reading them whole for one page would cost more than it saves.
    fn record_to_store(&self, file: &OpenFile, offset: u64, size: u32) -> Option<(u64, usize)> {
        let record_bytes = u64::from(file.handle.recordsize_bytes());
        let file_bytes = file.handle.size_bytes();
        if !self.options.store_whole_records
            || record_bytes > STORE_RECORD_BYTES_MAX
            || u64::from(size) >= record_bytes
            || offset >= file_bytes
            || file.inode.writers.load(Ordering::SeqCst) != 0
            || self.notifier.get().is_none()
        {
            return None;
        }
        let start = offset / record_bytes * record_bytes;
        if offset + u64::from(size) > start + record_bytes {
            return None; // crosses into the next record
        }
        Some((start, (file_bytes - start).min(record_bytes) as usize))
    }

    /// Creates a node under `parent` as the caller, then looks it up.
    fn make_node(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        make: impl FnOnce(i32, &CString) -> io::Result<()>,
    ) -> Result<FileAttr, Errno> {
        let parent = self.inode(parent)?;
        let leaf = leaf(name)?;
        {
            let _as = creds::as_caller(req.uid(), req.gid());
            make(parent.fd(), &leaf).map_err(err)?;
        }
        let fd = sys::open_at(parent.fd(), &leaf, libc::O_PATH, 0).map_err(err)?;
        self.adopt_node(fd)
    }

    fn remove(&self, parent: INodeNo, name: &OsStr, is_dir: bool) -> Result<(), Errno> {
        let parent = self.inode(parent)?;
        let leaf = leaf(name)?;
        sys::unlink_at(parent.fd(), &leaf, is_dir).map_err(err)
    }

    fn do_xattr(
        &self,
        ino: INodeNo,
        size: u32,
        call: impl Fn(i32, &mut [u8]) -> io::Result<usize>,
        reply: ReplyXattr,
    ) {
        let result = self.inode(ino).and_then(|inode| {
            if inode.kind == Kind::Symlink {
                // No race-free way to reach a symlink's own xattrs by descriptor.
                return Err(Errno::EOPNOTSUPP);
            }
            if size == 0 {
                return call(inode.fd(), &mut [])
                    .map(|n| (n, Vec::new()))
                    .map_err(err);
            }
            let mut buf = vec![0u8; size as usize];
            let n = call(inode.fd(), &mut buf).map_err(err)?;
            buf.truncate(n);
            Ok((n, buf))
        });
        match result {
            Ok((n, _)) if size == 0 => reply.size(n as u32),
            Ok((_, data)) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    /// Nodes in the inode table (tests, statistics).
    pub fn nodes(&self) -> usize {
        self.inodes.lock().expect("inode table poisoned").len()
    }

    /// Checks the tables' invariants (tests).
    pub fn assert_consistent(&self) {
        let inodes = self.inodes.lock().expect("inode table poisoned");
        inodes.assert_consistent();
        assert!(self.handles.len() <= self.options.max_open_handles);
        assert!(inodes.get(ROOT_ID).is_some());
    }
}

/// Asks the kernel to drop one entry naming each node of the batch; its
/// forgets then empty the node table (see `inodes`). An entry is found
/// from the node's descriptor: its path now, whose parent directory's id
/// is its inode number (a node whose parent has a counter id is skipped).
/// The kernel takes the parent directory's lock to drop an entry, so this
/// runs apart from the requests, which may hold that lock.
fn relieve(notifier: &fuser::Notifier, root_key: (u64, u64), source_root: &Path, batch: ReliefJob) {
    use std::os::unix::fs::MetadataExt;
    for inode in batch {
        let Ok(path) = std::fs::read_link(fd_path(inode.fd())) else {
            continue;
        };
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            continue;
        };
        if !parent.starts_with(source_root) {
            continue; // moved out of the tree: no entry of ours names it
        }
        let Ok(meta) = std::fs::symlink_metadata(parent) else {
            continue;
        };
        let parent_id = if (meta.dev(), meta.ino()) == root_key {
            Some(ROOT_ID)
        } else {
            own_number_id(root_key.0, meta.dev(), meta.ino())
        };
        if let Some(parent_id) = parent_id {
            // ENOENT: the kernel dropped it already.
            let _ = notifier.inval_entry(INodeNo(parent_id), name);
        }
    }
}

fn reply_entry(reply: ReplyEntry, ttl: &Duration, result: Result<FileAttr, Errno>) {
    match result {
        Ok(attr) => reply.entry(ttl, &attr, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn reply_empty(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for CachedFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        use fuser::InitFlags;
        // Page-cache coherence (module comment) and locks on the source.
        for flag in [
            InitFlags::FUSE_AUTO_INVAL_DATA,
            InitFlags::FUSE_POSIX_LOCKS,
            InitFlags::FUSE_PARALLEL_DIROPS,
        ] {
            let _ = config.add_capabilities(flag);
        }
        // Refused: the kernel keeps its own.
        let _ = config.set_max_background(self.max_background);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let result = self
            .inode(parent)
            .and_then(|parent| self.lookup_child(&parent, name));
        reply_entry(reply, &self.ttl(), result);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.inodes
            .lock()
            .expect("inode table poisoned")
            .forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let result = self.inode(ino).and_then(|inode| {
            let st = Self::stat(&inode)?;
            let file = fh.and_then(|fh| self.file(fh).ok());
            if let Some(file) = &file {
                // The kernel asks through an open file: notice changes behind us now.
                let _ = self.cache.revalidate(&file.handle);
                *file.last_revalidate.lock().expect("poisoned") = Instant::now();
            }
            self.notice_change_for_getattr(&inode, &st, file.as_deref());
            Ok(to_attr(inode.id, &st))
        });
        match result {
            Ok(attr) => reply.attr(&self.ttl(), &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let change = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        };
        match self.do_setattr(ino, change, fh) {
            Ok(attr) => reply.attr(&self.ttl(), &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let result = self
            .inode(ino)
            .and_then(|inode| sys::readlink_fd(inode.fd()).map_err(err));
        match result {
            Ok(target) => reply.data(target.as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let mode = (mode & libc::S_IFMT) | (mode & !umask & 0o7777);
        let result = self.make_node(req, parent, name, |dir, leaf| {
            sys::mknod_at(dir, leaf, mode, u64::from(rdev))
        });
        reply_entry(reply, &self.ttl(), result);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let result = self.make_node(req, parent, name, |dir, leaf| {
            sys::mkdir_at(dir, leaf, mode & !umask & 0o7777)
        });
        reply_entry(reply, &self.ttl(), result);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.remove(parent, name, false));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.remove(parent, name, true));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        // The target is stored as given: the kernel resolves it on the
        // client side; our own opens never follow it.
        let result = self.make_node(req, parent, link_name, |dir, leaf| {
            sys::symlink_at(target.as_os_str(), dir, leaf)
        });
        reply_entry(reply, &self.ttl(), result);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let result = (|| {
            let (from_dir, to_dir) = (self.inode(parent)?, self.inode(newparent)?);
            let (from, to) = (leaf(name)?, leaf(newname)?);
            sys::rename_at(from_dir.fd(), &from, to_dir.fd(), &to, flags.bits()).map_err(err)
        })();
        reply_empty(reply, result);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let result = (|| {
            let (inode, dir) = (self.inode(ino)?, self.inode(newparent)?);
            let to = leaf(newname)?;
            sys::link_fd(inode.fd(), dir.fd(), &to).map_err(err)?;
            let fd = sys::open_at(dir.fd(), &to, libc::O_PATH, 0).map_err(err)?;
            self.adopt_node(fd)
        })();
        reply_entry(reply, &self.ttl(), result);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.do_open(ino, flags, req.pid()) {
            Ok((fh, open_flags)) => reply.opened(FileHandle(fh), open_flags),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.do_read(fh, offset, size, reply);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let result = self.file(fh).and_then(|file| {
            if !file.writable {
                return Err(Errno::EBADF);
            }
            watch::note_own_change(&file.inode);
            self.cache
                .write(&file.handle, offset, data)
                .map_err(|e| errno(&e))
        });
        match result {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Writes are write-through: nothing is buffered here. A close drops
        // the closing owner's POSIX locks, as on the source.
        self.locks.release_owner(ino.0, lock_owner.0);
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.handles.remove(fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let result = self
            .file(fh)
            .and_then(|f| self.cache.sync(&f.handle).map_err(err));
        reply_empty(reply, result);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.do_opendir(ino) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match self.handles.dir(fh.0) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        for (i, e) in entries.entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(e.ino), (i + 1) as u64, e.kind, &e.name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.handles.remove(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let result = self.inode(ino).and_then(|inode| {
            let fd = sys::open_at(inode.fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)
                .map_err(err)?;
            std::fs::File::from(fd).sync_all().map_err(err)
        });
        reply_empty(reply, result);
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let result = self
            .inode(ino)
            .or_else(|_| self.inode(INodeNo(ROOT_ID)))
            .and_then(|inode| sys::fstatvfs(inode.fd()).map_err(err));
        match result {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let result = (|| {
            let inode = self.inode(ino)?;
            if inode.kind == Kind::Symlink {
                return Err(Errno::EOPNOTSUPP);
            }
            let name = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
            sys::setxattr_fd(inode.fd(), &name, value, flags).map_err(err)
        })();
        reply_empty(reply, result);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let Ok(name) = CString::new(name.as_bytes()) else {
            return reply.error(Errno::EINVAL);
        };
        self.do_xattr(ino, size, |fd, buf| sys::getxattr_fd(fd, &name, buf), reply);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.do_xattr(ino, size, sys::listxattr_fd, reply);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = (|| {
            let inode = self.inode(ino)?;
            if inode.kind == Kind::Symlink {
                return Err(Errno::EOPNOTSUPP);
            }
            let name = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
            sys::removexattr_fd(inode.fd(), &name).map_err(err)
        })();
        reply_empty(reply, result);
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // Only the mounting user (root) reaches us without allow_other, and
        // with it the kernel checks permissions (default_permissions).
        let result = self
            .inode(ino)
            .and_then(|inode| Self::stat(&inode).map(drop));
        reply_empty(reply, result);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self.do_create(req, parent, name, mode, umask, flags) {
            Ok((attr, fh, open_flags)) => reply.created(
                &self.ttl(),
                &attr,
                Generation(0),
                FileHandle(fh),
                open_flags,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        let result = self.inode(ino).and_then(|inode| {
            self.locks
                .test(&inode, lock_owner.0, LockRange { typ, start, end })
        });
        match result {
            Ok(Some(lock)) => reply.locked(lock.start, lock.end, lock.typ, lock.pid),
            Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
            Err(e) => reply.error(e),
        }
    }

    fn setlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        match self.inode(ino) {
            Ok(inode) => {
                let lock = LockRange { typ, start, end };
                self.locks.set(&inode, lock_owner.0, lock, sleep, reply);
            }
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let result = self.inode(ino).and_then(|inode| {
            watch::note_own_change(&inode);
            let fd = sys::reopen(inode.fd(), libc::O_WRONLY | libc::O_NONBLOCK).map_err(err)?;
            // SAFETY: an open descriptor.
            let ret = unsafe {
                libc::fallocate(
                    fd.as_raw_fd(),
                    mode,
                    offset as libc::off_t,
                    length as libc::off_t,
                )
            };
            let result = if ret < 0 {
                Err(errno(&io::Error::last_os_error()))
            } else {
                Ok(())
            };
            // Punched holes and zeroed ranges change content: drop it all.
            self.invalidate_records(&inode, Some(fh));
            result
        });
        reply_empty(reply, result);
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        // SEEK_DATA / SEEK_HOLE: ask the source where its holes are.
        let result = self.inode(ino).and_then(|inode| {
            let fd = sys::reopen(inode.fd(), libc::O_RDONLY | libc::O_NONBLOCK).map_err(err)?;
            // SAFETY: an open descriptor.
            let at = unsafe { libc::lseek(fd.as_raw_fd(), offset, whence) };
            if at < 0 {
                Err(errno(&io::Error::last_os_error()))
            } else {
                Ok(at)
            }
        });
        match result {
            Ok(at) => reply.offset(at),
            Err(e) => reply.error(e),
        }
    }
}
