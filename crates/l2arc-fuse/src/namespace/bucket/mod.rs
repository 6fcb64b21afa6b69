//! The namespace of an object store bucket, served read-only.
//!
//! Why a namespace of its own and not the pass-through one: a bucket has
//! no inodes, no descriptors and no directories, only keys; "directories"
//! are what a '/'-delimited listing says is a common prefix. So names are
//! resolved here from listings (`ObjectStorePrimary::list_dir`, trusted for
//! the metadata TTL, which also fills the stat cache: a lookup or an `ls -l`
//! costs one LIST per directory per TTL, not a HEAD per file), and node ids
//! are a stable hash of the key, so they survive a remount (`nodes.rs`).
//!
//! Freshness is the object store primary's: a stat is trusted for the TTL;
//! reads of records not in the cache are conditional on the ETag the
//! object was opened under (a 412 makes the read path re-stat and read the
//! new version, never a mix within a record). The kernel's page cache is
//! kept across opens (FOPEN_KEEP_CACHE) while the object's version is the
//! one the pages came from, and dropped when it is not: at open, at a
//! getattr (the attribute timeout is the metadata TTL, and with
//! FUSE_AUTO_INVAL_DATA the kernel asks at least once a TTL while a file is
//! read), and when a read finds that the object's generation moved under
//! an open file. The invalidation is sent after the reply, on a thread of
//! its own, never waited for; a getattr that finds a new size sends none,
//! as in the pass-through mount (`namespace::dir` says why).
//!
//! Writes: the mount is read-only (the "ro" mount option, and EROFS from
//! every call that would make or remove a node: `adapter::read_only`).
//!
//! Read-ahead claims whole windows before the demand read (`spans.rs`).

use std::ffi::OsStr;
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{AccessFlags, Errno, FileAttr, FileType, FopenFlags, INodeNo, InitFlags, OpenFlags};
use l2arc::primary::object_store::{ObjectMeta, ObjectStorePrimary};
use l2arc::{Cache, ClaimedSpan, DatasetId, ReadView};

use super::{DirEntry, FsStats, Namespace, OpenFile, Opened, ReadPlan, Serving};
use crate::readahead::ReadAhead;
use crate::workers;
use nodes::{NodeTable, ReliefJob, join, node_id};

mod nodes;
mod spans;

/// Tunables of the object file system.
#[derive(Clone, Debug)]
pub struct ObjectFsOptions {
    /// How long the kernel may trust attributes and names (the metadata TTL).
    pub attr_timeout: Duration,
    /// Read-ahead window of a sequential reader (0 = none), in whole
    /// records, at least one: what one GET asks for at most.
    pub readahead_window_bytes: u64,
    /// Threads fetching read-ahead spans (GETs in flight for read-ahead).
    pub prefetch_threads: usize,
    /// Largest read-ahead span, one GET (whole records, at least one; the
    /// engine reads at most `l2arc::PREFETCH_SPAN_BYTES_MAX` at once).
    pub readahead_span_bytes: u64,
    /// Open files and directories at most (EMFILE beyond).
    pub max_open_handles: usize,
    /// Nodes the kernel may hold at most (ENFILE beyond; idle ones are
    /// given back near it, see `crate::relief`).
    pub max_nodes: usize,
}

impl Default for ObjectFsOptions {
    fn default() -> Self {
        Self {
            attr_timeout: Duration::from_secs(60),
            readahead_window_bytes: READAHEAD_WINDOW_DEFAULT_BYTES,
            prefetch_threads: 8,
            readahead_span_bytes: l2arc::PREFETCH_SPAN_BYTES_MAX,
            max_open_handles: 1 << 16,
            max_nodes: 1 << 20,
        }
    }
}

/// Default `readahead_window_bytes`: one GET of the engine's largest span.
pub const READAHEAD_WINDOW_DEFAULT_BYTES: u64 = l2arc::PREFETCH_SPAN_BYTES_MAX;
/// Kernel invalidations waiting for the notifier thread; more are dropped
/// (the next getattr or open catches the change again).
const INVALIDATE_QUEUE_LEN: usize = 1024;
/// Relief batches waiting for their thread (each is bounded by the table).
const RELIEF_QUEUE_LEN: usize = 2;
/// Block size reported in attributes (st_blksize): what `cp` reads at once.
const BLKSIZE_BYTES: u32 = 1 << 20;

/// What the bucket keeps per open object.
pub(crate) struct OpenObject {
    ino: u64,
    /// The cache's generation token when the kernel's pages were last
    /// known good for this open: a change means the pages must go.
    token_seen: AtomicU64,
    /// Where the reader is, for the spans read ahead of it.
    pace: Arc<l2arc::Pace>,
    /// The record the last read ended in (`u64::MAX`: none yet), for
    /// `Cache::read_view_continuing`.
    last_record: AtomicU64,
}

impl Drop for OpenObject {
    fn drop(&mut self) {
        self.pace.close(); // spans still waiting for this reader give up
    }
}

/// A span to fill, paced to its reader.
type PrefetchJob = (ClaimedSpan, Arc<l2arc::Pace>);

/// A bucket (or prefix) as a namespace.
pub(crate) struct Bucket {
    serving: Serving,
    dataset: DatasetId,
    store: Arc<ObjectStorePrimary>,
    options: ObjectFsOptions,
    nodes: Mutex<NodeTable>,
    prefetch: Option<SyncSender<PrefetchJob>>,
    /// Spans sent to the pool and not yet filled (at most one a thread).
    spans_in_flight: Arc<AtomicUsize>,
    invalidate: SyncSender<u64>,
    relief: SyncSender<ReliefJob>,
    mounted_at: SystemTime,
}

fn errno(e: &io::Error) -> Errno {
    use io::ErrorKind as K;
    Errno::from_i32(match e.kind() {
        K::NotFound => libc::ENOENT,
        K::PermissionDenied => libc::EACCES,
        K::NotADirectory => libc::ENOTDIR,
        K::IsADirectory => libc::EISDIR,
        K::ReadOnlyFilesystem => libc::EROFS,
        // A store that did not answer within the read deadline: EIO, what
        // readers of files expect of failed storage (ETIMEDOUT is a
        // socket's errno, and was the old, undocumented answer).
        K::TimedOut => libc::EIO,
        K::FileTooLarge => libc::EFBIG,
        _ => libc::EIO,
    })
}

fn erofs() -> Errno {
    Errno::from_i32(libc::EROFS)
}

/// The version the kernel's pages of an object reflect: (version hash, size).
fn version_of(meta: &ObjectMeta) -> (u64, u64) {
    (
        l2arc::primary::Generation::version_hash_of(&meta.etag, &meta.version_id),
        meta.size_bytes,
    )
}

impl Bucket {
    /// `dataset` must be a dataset of `cache` whose primary is `store`.
    pub(crate) fn new(
        cache: Arc<Cache>,
        dataset: DatasetId,
        store: Arc<ObjectStorePrimary>,
        options: ObjectFsOptions,
    ) -> io::Result<Self> {
        assert!(options.max_open_handles > 0 && options.max_nodes > 1);
        let spans_in_flight = Arc::new(AtomicUsize::new(0));
        let prefetch = if options.readahead_window_bytes > 0 && options.prefetch_threads > 0 {
            let in_flight = Arc::clone(&spans_in_flight);
            Some(workers::spawn_pool(
                "l2arc-s3-prefetch",
                options.prefetch_threads,
                options.prefetch_threads,
                move |(span, pace): PrefetchJob| {
                    // A failed read-ahead is only a lost hint; a demand read
                    // waiting on it gets the error (a 412: it re-stats).
                    let _ = span.fill_paced(&|offset| pace.wait_for(offset));
                    in_flight.fetch_sub(1, Ordering::AcqRel);
                },
            )?)
        } else {
            None
        };
        let serving = Serving::new(cache, options.attr_timeout, options.max_open_handles, errno);
        let notifier = &serving.notifier;
        let invalidate = {
            let notifier = Arc::clone(notifier);
            workers::spawn_worker("l2arc-s3-inval", INVALIDATE_QUEUE_LEN, move |ino| {
                if let Some(notifier) = notifier.get() {
                    // ENOENT: the kernel already forgot the inode.
                    let _ = notifier.inval_inode(INodeNo(ino), 0, 0);
                }
            })?
        };
        let relief = {
            let notifier = Arc::clone(notifier);
            workers::spawn_worker(
                "l2arc-s3-relief",
                RELIEF_QUEUE_LEN,
                move |batch: ReliefJob| {
                    if let Some(notifier) = notifier.get() {
                        for (parent, name) in batch {
                            // ENOENT: the kernel dropped it already.
                            let _ = notifier.inval_entry(INodeNo(parent), OsStr::new(&name));
                        }
                    }
                },
            )?
        };
        let nodes = Mutex::new(NodeTable::new(options.max_nodes));
        Ok(Self {
            serving,
            dataset,
            store,
            options,
            nodes,
            prefetch,
            spans_in_flight,
            invalidate,
            relief,
            mounted_at: SystemTime::now(),
        })
    }

    fn node(&self, ino: INodeNo) -> Result<(String, bool), Errno> {
        self.nodes
            .lock()
            .expect("node table poisoned")
            .map
            .get(&ino.0)
            .map(|n| (n.path.clone(), n.is_dir))
            .ok_or(Errno::ENOENT)
    }

    fn dir_attr(&self, ino: u64) -> FileAttr {
        self.attr(ino, FileType::Directory, 0, self.mounted_at)
    }

    fn attr(&self, ino: u64, kind: FileType, size: u64, mtime: SystemTime) -> FileAttr {
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind,
            perm: if kind == FileType::Directory {
                0o555
            } else {
                0o444
            },
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid,
            gid,
            rdev: 0,
            blksize: BLKSIZE_BYTES,
            flags: 0,
        }
    }

    fn file_attr(&self, ino: u64, meta: &ObjectMeta) -> FileAttr {
        self.attr(
            ino,
            FileType::RegularFile,
            meta.size_bytes,
            meta.mtime.unwrap_or(UNIX_EPOCH),
        )
    }

    /// Counts a kernel reference to the node of `path` (made if new). Near
    /// the table's bound, hands idle nodes to the relief thread.
    fn remember(&self, path: &str, is_dir: bool) -> Result<u64, Errno> {
        let (result, relief) = {
            let mut nodes = self.nodes.lock().expect("node table poisoned");
            (nodes.remember(path, is_dir), nodes.relief())
        };
        if !relief.is_empty() {
            // Dropped when a batch is still being sent: the next one comes.
            let _ = self.relief.try_send(relief);
        }
        result
    }

    /// Notes the version the kernel's pages of `ino` now reflect and
    /// returns the one they reflected before (None if unknown): the pages
    /// may stay where the two are the same.
    fn note_page_version(&self, ino: u64, version: (u64, u64)) -> Option<(u64, u64)> {
        let mut nodes = self.nodes.lock().expect("node table poisoned");
        let node = nodes.map.get_mut(&ino)?;
        node.page_version.replace(version)
    }

    fn invalidate_kernel_later(&self, ino: u64) {
        // Dropped when full: the next getattr or open sees the change again.
        let _ = self.invalidate.try_send(ino);
    }
}

impl Namespace for Bucket {
    type FileState = OpenObject;
    type Listing = Vec<DirEntry>;
    /// Whether to drop the kernel's pages of the node after the answer.
    type AfterAttr = bool;
    type AfterRead = ();

    const KERNEL_CAPABILITIES: &'static [InitFlags] = &[
        InitFlags::FUSE_AUTO_INVAL_DATA,
        InitFlags::FUSE_PARALLEL_DIROPS,
    ];

    fn lookup(&self, parent: INodeNo, name: &OsStr) -> Result<FileAttr, Errno> {
        let (dir, is_dir) = self.node(parent)?;
        if !is_dir {
            return Err(Errno::ENOTDIR);
        }
        let name = name.to_str().ok_or(Errno::ENOENT)?;
        let entries = self.store.list_dir(&dir).map_err(|e| errno(&e))?;
        let entry = entries
            .iter()
            .find(|e| e.name == name && e.is_dir)
            .or_else(|| entries.iter().find(|e| e.name == name))
            .ok_or(Errno::ENOENT)?;
        let path = join(&dir, name);
        if entry.is_dir {
            let ino = self.remember(&path, true)?;
            return Ok(self.dir_attr(ino));
        }
        let meta = self.store.stat(&path).map_err(|e| errno(&e))?;
        let ino = self.remember(&path, false)?;
        Ok(self.file_attr(ino, &meta))
    }

    fn forget(&self, ino: INodeNo, nlookup: u64) {
        let mut nodes = self.nodes.lock().expect("node table poisoned");
        nodes.forget(ino.0, nlookup);
    }

    fn getattr(
        &self,
        ino: INodeNo,
        open: Option<&OpenFile<OpenObject>>,
    ) -> Result<(FileAttr, bool), Errno> {
        let (path, is_dir) = self.node(ino)?;
        if is_dir {
            return Ok((self.dir_attr(ino.0), false));
        }
        if let Some(file) = open {
            // Through an open file: let the cache see a new ETag now.
            file.revalidate_now(&self.serving.cache);
        }
        let meta = self.store.stat(&path).map_err(|e| errno(&e))?;
        let version = version_of(&meta);
        let before = self.note_page_version(ino.0, version);
        let changed = before != Some(version);
        let size_changed = before.is_some_and(|(_, size_bytes)| size_bytes != meta.size_bytes);
        // After the answer (`namespace::dir` explains why never before it).
        // A new size is the kernel's own check to act on: an invalidation
        // racing the answer would make it read on with the old size.
        Ok((self.file_attr(ino.0, &meta), changed && !size_changed))
    }

    fn after_attr(&self, ino: INodeNo, drop_pages: bool) {
        if drop_pages {
            self.invalidate_kernel_later(ino.0);
        }
    }

    fn open(
        &self,
        ino: INodeNo,
        flags: OpenFlags,
        _caller_pid: u32,
    ) -> Result<Opened<OpenObject>, Errno> {
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            return Err(erofs());
        }
        let (path, is_dir) = self.node(ino)?;
        if is_dir {
            return Err(Errno::EISDIR);
        }
        // Its read-ahead is this namespace's own (`spans.rs`), not the
        // engine's streams.
        let handle = self
            .serving
            .cache
            .open(self.dataset, &path, false)
            .map_err(|e| errno(&e))?
            .reads_ahead_itself();
        let meta = self.store.stat(&path).map_err(|e| errno(&e))?;
        let version = version_of(&meta);
        let keep = self.note_page_version(ino.0, version) == Some(version);
        let recordsize = u64::from(handle.recordsize_bytes());
        let window_records = self.readahead_window_records(recordsize);
        let state = OpenObject {
            ino: ino.0,
            token_seen: AtomicU64::new(handle.generation_token()),
            pace: Arc::new(l2arc::Pace::new(0, self.readahead_ahead_bytes(recordsize))),
            last_record: AtomicU64::new(u64::MAX),
        };
        let file = OpenFile::new(handle, ReadAhead::at_once(window_records), state);
        let flags = if keep {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        Ok((Arc::new(file), flags))
    }

    fn list(&self, ino: INodeNo) -> Result<Vec<DirEntry>, Errno> {
        let (path, is_dir) = self.node(ino)?;
        if !is_dir {
            return Err(Errno::ENOTDIR);
        }
        let listed = self.store.list_dir(&path).map_err(|e| errno(&e))?;
        let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
        let entry = |name: &str, kind, ino| DirEntry {
            name: name.into(),
            kind,
            ino,
        };
        let mut entries = Vec::with_capacity(listed.len() + 2);
        entries.push(entry(".", FileType::Directory, ino.0));
        entries.push(entry("..", FileType::Directory, node_id(parent)));
        for e in listed.iter() {
            let kind = if e.is_dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            entries.push(entry(&e.name, kind, node_id(&join(&path, &e.name))));
        }
        Ok(entries)
    }

    fn statfs(&self, _ino: INodeNo) -> Result<FsStats, Errno> {
        Ok(FsStats {
            blocks: 0,
            blocks_free: 0,
            blocks_available: 0,
            files: 0,
            files_free: 0,
            block_size_bytes: BLKSIZE_BYTES,
            name_max_bytes: 1024,
            fragment_size_bytes: BLKSIZE_BYTES,
        })
    }

    fn access(&self, ino: INodeNo, mask: AccessFlags) -> Result<(), Errno> {
        if mask.bits() & libc::W_OK != 0 {
            return Err(erofs());
        }
        self.node(ino).map(drop)
    }

    fn plan_read(&self, file: &Arc<OpenFile<OpenObject>>, offset: u64, size: u32) -> ReadPlan<()> {
        self.read_ahead(file, offset, size);
        let recordsize = u64::from(file.handle.recordsize_bytes());
        let last_record = offset.saturating_add(u64::from(size).max(1) - 1) / recordsize;
        let previous = file.state.last_record.swap(last_record, Ordering::Relaxed);
        ReadPlan {
            read_at: offset,
            read_len: size as usize,
            continues: Some(previous).filter(|&r| r != u64::MAX),
            after: (),
        }
    }

    fn read_served(&self, _file: &Arc<OpenFile<OpenObject>>, _offset: u64, _served_bytes: usize) {}

    fn serving(&self) -> &Serving {
        &self.serving
    }

    fn after_read(&self, file: &OpenFile<OpenObject>, _after: (), _read_at: u64, _view: ReadView) {
        // The object's generation moved under this open (a 412, or a
        // revalidate saw a new ETag): what the kernel cached before is of
        // the old version. Dropped after this reply (never before: see
        // `namespace::dir`).
        let token = file.handle.generation_token();
        if file.state.token_seen.swap(token, Ordering::AcqRel) != token {
            self.invalidate_kernel_later(file.state.ino);
        }
    }
}
