//! The namespace of a directory tree: reads through the cache, everything
//! else through to the source, each acting on a descriptor of the inode it
//! concerns.
//!
//! Reads are the point of the mount: a read asks the cache (ARC, then
//! L2ARC, then the source) and, for a sequential reader, starts read-ahead
//! in the background, for what the read served (a ramping window,
//! `crate::readahead`). A small read is widened to the record under it,
//! which is then stored whole into the kernel's pages (`stores.rs`).
//! Everything that changes the source goes straight through to it
//! (`passthrough.rs`) and drops what it made stale.
//!
//! Nodes are source inodes, each pinned by an `O_PATH` descriptor
//! (`crate::inodes`); the kernel's page cache of a file is kept across
//! opens and dropped exactly when the source changes (`coherence.rs`);
//! opens of names the source replaced are sent back to the kernel to look
//! up again (`open.rs`); listings are snapshots within a memory budget
//! (`listing.rs`). Open files and listings live in the adapter's one table,
//! bounded by `FsOptions::max_open_handles`; past the bound an open fails
//! with EMFILE.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fuser::{AccessFlags, Errno, FileAttr, INodeNo, InitFlags, OpenFlags};
use l2arc::primary::dir::DirPrimary;
use l2arc::{Cache, DatasetId, ReadView};

use super::{FsStats, Namespace, OpenFile, Opened, Passthrough, ReadPlan, Serving};
use crate::inodes::{Inode, InodeTable, ROOT_ID, own_number_id};
use crate::locks::LockTable;
use crate::sys;
use crate::watch::Watcher;
use crate::workers;
use attr::{err, errno, fd_path, leaf, to_attr};
use coherence::{INVALIDATE_QUEUE_LEN, KernelJob, do_kernel_job, start_watcher};
use listing::DirListing;
use open::StaleOpens;
pub(crate) use open::TreeOpen;
use stores::{StoreBudget, StoreJob};

mod attr;
mod coherence;
mod listing;
mod open;
mod passthrough;
mod stores;

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
/// Relief batches waiting for their thread (each is bounded by the table).
const RELIEF_QUEUE_LEN: usize = 2;
/// Descriptors kept free for everything that is not a node or a handle.
const FD_RESERVE: u64 = 256;

/// An open file of the tree.
pub(crate) type TreeFile = OpenFile<TreeOpen>;

type PrefetchJob = (Arc<TreeFile>, u64, u64);
/// Nodes whose entries the kernel is asked to drop (`InodeTable::relief`).
type ReliefJob = Vec<Arc<Inode>>;

/// A directory tree as a namespace.
pub(crate) struct DirTree {
    serving: Serving,
    dataset: DatasetId,
    options: FsOptions,
    inodes: Mutex<InodeTable>,
    locks: LockTable,
    prefetch: Option<SyncSender<PrefetchJob>>,
    /// The notification thread's queue (`coherence.rs`).
    kernel_jobs: SyncSender<KernelJob>,
    store_budget: Arc<StoreBudget>,
    relief: SyncSender<ReliefJob>,
    /// The source directory's path now, to name open files in analytics.
    source_root: std::path::PathBuf,
    /// Bytes of listings held by open directories (`max_dir_listing_bytes`).
    dir_listing_bytes: Arc<AtomicUsize>,
    /// Opens lately refused as stale, awaiting their retry.
    stale_opens: StaleOpens,
    /// Whether opens for writing are answered with FOPEN_DIRECT_IO: set at
    /// init when the kernel lets such files be mapped shared
    /// (FUSE_DIRECT_IO_ALLOW_MMAP, Linux 6.6); see `open.rs`.
    direct_io_writers: AtomicBool,
    /// Checks open files against the source (`crate::watch`); dropped
    /// last: its thread is joined.
    watcher: Watcher,
}

impl DirTree {
    /// `dataset` must be a dataset of `cache` whose primary serves the same
    /// tree as `primary` (possibly wrapped, e.g. in an emulated HDD).
    pub(crate) fn new(
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
        let serving = Serving::new(
            Arc::clone(&cache),
            options.attr_timeout,
            options.max_open_handles,
            errno,
        );
        let notifier = &serving.notifier;
        let kernel_jobs = {
            let notifier = Arc::clone(notifier);
            workers::spawn_worker(
                "l2arc-fuse-inval",
                INVALIDATE_QUEUE_LEN,
                move |job: KernelJob| do_kernel_job(notifier.get(), job),
            )?
        };
        let relief = {
            let notifier = Arc::clone(notifier);
            let root_key = (root.st_dev, root.st_ino);
            let source_root = source_root.clone();
            workers::spawn_worker("l2arc-fuse-relief", RELIEF_QUEUE_LEN, move |batch| {
                if let Some(notifier) = notifier.get() {
                    relieve(notifier, root_key, &source_root, batch);
                }
            })?
        };
        let watcher = start_watcher(&cache, &kernel_jobs, &options)?;
        Ok(Self {
            serving,
            dataset,
            inodes: Mutex::new(inodes),
            locks: LockTable::new(options.max_open_handles),
            prefetch,
            kernel_jobs,
            store_budget: Arc::new(StoreBudget::default()),
            relief,
            source_root,
            dir_listing_bytes: Arc::new(AtomicUsize::new(0)),
            stale_opens: StaleOpens::default(),
            direct_io_writers: AtomicBool::new(false),
            watcher,
            options,
        })
    }

    /// The options in force: the node and handle bounds as lowered to fit
    /// the descriptors the process may open.
    pub(crate) fn options(&self) -> &FsOptions {
        &self.options
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

    /// Registers the inode `fd` pins (an O_PATH descriptor) as a node (one
    /// lookup reference), with its attributes; notices a change behind the
    /// mount.
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

    /// Nodes in the inode table (tests, statistics).
    pub(crate) fn nodes(&self) -> usize {
        self.inodes.lock().expect("inode table poisoned").len()
    }

    /// Checks the inode table's invariants (tests).
    pub(crate) fn assert_consistent(&self) {
        let inodes = self.inodes.lock().expect("inode table poisoned");
        inodes.assert_consistent();
        assert!(inodes.get(ROOT_ID).is_some());
    }
}

/// What a read of the tree leaves for after its answer: the store epoch
/// when a whole record was read to be stored (`stores.rs`).
pub(crate) struct StoreAfterRead {
    /// Taken before the read: a change after it drops the store.
    epoch: u64,
    whole_record: bool,
}

impl Namespace for DirTree {
    type FileState = TreeOpen;
    type Listing = DirListing;
    type AfterAttr = ();
    type AfterRead = StoreAfterRead;

    // Page-cache coherence (`coherence.rs`; direct writes: `open.rs`) and
    // locks on the source.
    const KERNEL_CAPABILITIES: &'static [InitFlags] = &[
        InitFlags::FUSE_AUTO_INVAL_DATA,
        InitFlags::FUSE_POSIX_LOCKS,
        InitFlags::FUSE_PARALLEL_DIROPS,
        InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP,
    ];

    fn kernel_granted(&self, granted: InitFlags) {
        self.direct_io_writers.store(
            granted.contains(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP),
            Ordering::SeqCst,
        );
    }

    fn lookup(&self, parent: INodeNo, name: &OsStr) -> Result<FileAttr, Errno> {
        let parent = self.inode(parent)?;
        let leaf = leaf(name)?;
        let fd = sys::open_at(parent.fd(), &leaf, libc::O_PATH, 0).map_err(err)?;
        self.adopt_node(fd)
    }

    fn forget(&self, ino: INodeNo, nlookup: u64) {
        self.inodes
            .lock()
            .expect("inode table poisoned")
            .forget(ino.0, nlookup);
    }

    fn getattr(&self, ino: INodeNo, open: Option<&TreeFile>) -> Result<(FileAttr, ()), Errno> {
        let inode = self.inode(ino)?;
        let st = Self::stat(&inode)?;
        if let Some(file) = open {
            // The kernel asks through an open file: notice changes behind us now.
            file.revalidate_now(&self.serving.cache);
        }
        self.notice_change_for_getattr(&inode, &st, open);
        Ok((to_attr(inode.id, &st), ()))
    }

    fn after_attr(&self, _ino: INodeNo, _after: ()) {}

    fn open(
        &self,
        ino: INodeNo,
        flags: OpenFlags,
        caller_pid: u32,
    ) -> Result<Opened<TreeOpen>, Errno> {
        self.open_file(ino, flags, caller_pid)
    }

    fn list(&self, ino: INodeNo) -> Result<DirListing, Errno> {
        self.list_dir(ino)
    }

    fn statfs(&self, ino: INodeNo) -> Result<FsStats, Errno> {
        let s = self
            .inode(ino)
            .or_else(|_| self.inode(INodeNo(ROOT_ID)))
            .and_then(|inode| sys::fstatvfs(inode.fd()).map_err(err))?;
        Ok(FsStats {
            blocks: s.f_blocks,
            blocks_free: s.f_bfree,
            blocks_available: s.f_bavail,
            files: s.f_files,
            files_free: s.f_ffree,
            block_size_bytes: s.f_bsize as u32,
            name_max_bytes: s.f_namemax as u32,
            fragment_size_bytes: s.f_frsize as u32,
        })
    }

    fn access(&self, ino: INodeNo, _mask: AccessFlags) -> Result<(), Errno> {
        // Only the mounting user (root) reaches us without allow_other, and
        // with it the kernel checks permissions (default_permissions).
        self.inode(ino)
            .and_then(|inode| Self::stat(&inode).map(drop))
    }

    fn plan_read(&self, file: &Arc<TreeFile>, offset: u64, size: u32) -> ReadPlan<StoreAfterRead> {
        let epoch = file.state.inode.store_epoch.load(Ordering::SeqCst);
        let whole = self.record_to_store(file, offset, size);
        let (read_at, read_len) = whole.unwrap_or((offset, size as usize));
        ReadPlan {
            read_at,
            read_len,
            continues: None,
            after: StoreAfterRead {
                epoch,
                whole_record: whole.is_some(),
            },
        }
    }

    fn read_served(&self, file: &Arc<TreeFile>, offset: u64, served_bytes: usize) {
        let Some(tx) = &self.prefetch else {
            return;
        };
        let ahead = file.readahead.lock().expect("poisoned").on_read(
            offset,
            served_bytes as u64,
            u64::from(file.handle.recordsize_bytes()),
            file.handle.size_bytes(),
        );
        if let Some((from, len)) = ahead {
            match tx.try_send((Arc::clone(file), from, len)) {
                Ok(()) | Err(TrySendError::Full(_)) => {}
                Err(TrySendError::Disconnected(_)) => {}
            }
        }
    }

    fn after_read(&self, file: &TreeFile, after: StoreAfterRead, read_at: u64, view: ReadView) {
        if after.whole_record && !view.is_empty() && self.store_budget.try_take(view.len()) {
            let job = StoreJob {
                inode: Arc::clone(&file.state.inode),
                epoch: after.epoch,
                offset_bytes: read_at,
                view,
                budget: Arc::clone(&self.store_budget),
            };
            // A full queue drops the store (its drop gives the budget back).
            let _ = self.kernel_jobs.try_send(KernelJob::Store(job));
        }
    }

    fn serving(&self) -> &Serving {
        &self.serving
    }

    fn passthrough(&self) -> Option<&dyn Passthrough<TreeOpen>> {
        Some(self)
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
