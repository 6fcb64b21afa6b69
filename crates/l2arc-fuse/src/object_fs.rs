//! A read-only FUSE file system over an object store bucket, served
//! through the cache.
//!
//! Why a file system of its own and not the pass-through one: a bucket has
//! no inodes, no descriptors and no directories, only keys; "directories"
//! are what a '/'-delimited listing says is a common prefix. So names are
//! resolved here from listings (`ObjectStorePrimary::list_dir`, trusted for
//! the metadata TTL, which also fills the stat cache: a lookup or an `ls -l`
//! costs one LIST per directory per TTL, not a HEAD per file), and node ids
//! are a stable hash of the key, so they survive a remount.
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
//! as in the pass-through mount (fs.rs says why).
//!
//! Writes: the mount is read-only (the "ro" mount option, and EROFS from
//! every call that would change something).
//!
//! Read-ahead is where the GETs go, so it is shaped by them: a sequential
//! reader gets its whole window at once (`ReadAhead::at_once`), claimed on
//! the request thread before the demand read looks its records up
//! (`Cache::claim_span`), in spans of whole records (`readahead_span_bytes`,
//! 64 MiB) that a pool of threads fills, one streamed GET each
//! (`ClaimedSpan::fill`); a span is claimed only when a thread is free for
//! it, never left to wait in a queue with its reader waiting on it. The demand read waits on the span's first record
//! instead of issuing a GET of its own, and each record is served as soon
//! as its bytes are in: a cold sequential read costs one GET per window,
//! as a streaming client's one GET per object. A span is paced to its
//! reader (`l2arc::Pace`): it runs at most a quarter of the window, and at
//! most an eighth of `arc_max`, ahead of the reader, so that what is read
//! ahead is not evicted before it is read. Memory beyond the ARC's records:
//! one record being assembled per span in flight (`l2arc::prefetch`).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, Request,
};
use l2arc::arc::AccessKind;
use l2arc::primary::object_store::{ObjectMeta, ObjectStorePrimary};
use l2arc::{Cache, ClaimedSpan, DatasetId, ObjectHandle};

use crate::fs::NotifierSlot;
use crate::handles::{Handle, HandleTable};
use crate::readahead::ReadAhead;
use crate::relief::{Relief, ReliefClock};
use crate::workers;

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
const ROOT_ID: u64 = 1;
/// Block size reported in attributes (st_blksize): what `cp` reads at once.
const BLKSIZE_BYTES: u32 = 1 << 20;

struct Node {
    /// Key (for objects) or prefix without trailing '/' (directories);
    /// "" for the root.
    path: String,
    is_dir: bool,
    /// Kernel references (lookups not yet forgotten).
    lookups: u64,
    /// When the kernel last looked it up (`crate::relief`).
    last_lookup_tick: u64,
    /// (version hash, size) the kernel's pages of this object reflect.
    page_version: Option<(u64, u64)>,
}

struct OpenObject {
    ino: u64,
    handle: ObjectHandle,
    readahead: Mutex<ReadAhead>,
    last_revalidate: Mutex<Instant>,
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

/// Entries (parent id, name) the kernel is asked to drop.
type ReliefJob = Vec<(u64, String)>;

/// A bucket (or prefix) served read-only through the cache.
pub struct ObjectFs {
    cache: Arc<Cache>,
    dataset: DatasetId,
    store: Arc<ObjectStorePrimary>,
    options: ObjectFsOptions,
    nodes: Mutex<NodeTable>,
    handles: HandleTable<OpenObject, Vec<(String, FileType, u64)>>,
    prefetch: Option<SyncSender<PrefetchJob>>,
    /// Spans sent to the pool and not yet filled (at most one a thread).
    spans_in_flight: Arc<AtomicUsize>,
    invalidate: SyncSender<u64>,
    relief: SyncSender<ReliefJob>,
    pub(crate) notifier: NotifierSlot,
    /// The kernel's `max_background` asked for at init: set by `mount_objects`.
    pub(crate) max_background: u16,
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

/// A stable node id for a path: the same in every mount (1 is the root).
fn node_id(path: &str) -> u64 {
    if path.is_empty() {
        return ROOT_ID;
    }
    // FNV-1a, never 0 or 1.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h.max(2)
}

/// The nodes the kernel holds, bounded by `max_nodes`, with the clock that
/// decides when to give idle ones back (`crate::relief`).
struct NodeTable {
    map: HashMap<u64, Node>,
    max_nodes: usize,
    relief: ReliefClock,
}

impl NodeTable {
    fn new(max_nodes: usize) -> Self {
        let root = Node {
            path: String::new(),
            is_dir: true,
            lookups: 1,
            last_lookup_tick: 0,
            page_version: None,
        };
        Self {
            map: HashMap::from([(ROOT_ID, root)]),
            max_nodes,
            relief: ReliefClock::new(max_nodes),
        }
    }

    /// Counts a kernel reference to the node of `path` (made if new).
    fn remember(&mut self, path: &str, is_dir: bool) -> Result<u64, Errno> {
        let tick = self.relief.tick();
        let ino = node_id(path);
        if let Some(node) = self.map.get_mut(&ino) {
            if node.path != path {
                // Two keys with one 64-bit hash: refuse the second rather
                // than serve one for the other.
                return Err(Errno::EIO);
            }
            node.lookups += 1;
            node.is_dir = is_dir;
            node.last_lookup_tick = tick;
            return Ok(ino);
        }
        if self.map.len() >= self.max_nodes {
            return Err(Errno::ENFILE);
        }
        let node = Node {
            path: path.to_string(),
            is_dir,
            lookups: 1,
            last_lookup_tick: tick,
            page_version: None,
        };
        self.map.insert(ino, node);
        Ok(ino)
    }

    /// When relief is due, the entries (parent id, name) naming up to a
    /// batch of idle nodes; else none.
    fn relief(&mut self) -> ReliefJob {
        let Some(Relief { batch, idle_since }) = self.relief.due(self.map.len()) else {
            return Vec::new();
        };
        self.map
            .iter()
            .filter(|(ino, node)| **ino != ROOT_ID && node.last_lookup_tick <= idle_since)
            .take(batch)
            .map(|(_, node)| match node.path.rsplit_once('/') {
                Some((dir, name)) => (node_id(dir), name.to_string()),
                None => (ROOT_ID, node.path.clone()),
            })
            .collect()
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

impl ObjectFs {
    /// `dataset` must be a dataset of `cache` whose primary is `store`.
    pub fn new(
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
        let notifier: NotifierSlot = Arc::new(OnceLock::new());
        let invalidate = {
            let notifier = Arc::clone(&notifier);
            workers::spawn_worker("l2arc-s3-inval", INVALIDATE_QUEUE_LEN, move |ino| {
                if let Some(notifier) = notifier.get() {
                    // ENOENT: the kernel already forgot the inode.
                    let _ = notifier.inval_inode(INodeNo(ino), 0, 0);
                }
            })?
        };
        let relief = {
            let notifier = Arc::clone(&notifier);
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
        let handles = HandleTable::new(options.max_open_handles);
        let nodes = Mutex::new(NodeTable::new(options.max_nodes));
        Ok(Self {
            cache,
            dataset,
            store,
            options,
            nodes,
            handles,
            prefetch,
            spans_in_flight,
            invalidate,
            relief,
            notifier,
            max_background: crate::MAX_BACKGROUND_MIN,
            mounted_at: SystemTime::now(),
        })
    }

    fn ttl(&self) -> Duration {
        self.options.attr_timeout
    }

    /// Bytes of one read-ahead job: whole records, at least one.
    fn readahead_span_bytes(&self, recordsize: u64) -> u64 {
        (self.options.readahead_span_bytes / recordsize).max(1) * recordsize
    }

    /// Read-ahead window in records, at least one (0: read-ahead is off).
    fn readahead_window_records(&self, recordsize: u64) -> u32 {
        if self.prefetch.is_none() {
            return 0;
        }
        let records = self.options.readahead_window_bytes / recordsize;
        u32::try_from(records).unwrap_or(u32::MAX).max(1)
    }

    /// How far a span may run ahead of its reader: a quarter of the window
    /// and an eighth of `arc_max` at most, a record at least.
    fn readahead_ahead_bytes(&self, recordsize: u64) -> u64 {
        (self.options.readahead_window_bytes / 4)
            .min(self.cache.arc_max_bytes() / 8)
            .max(recordsize)
    }

    /// Read-ahead for a read of `size` bytes at `offset`, before the read:
    /// the spans it asks for are claimed here, so the demand read waits on
    /// them instead of reading a record of its own.
    fn read_ahead(&self, file: &OpenObject, offset: u64, size: u32) {
        file.pace.reader_at(offset);
        let Some(tx) = &self.prefetch else {
            return;
        };
        let recordsize = u64::from(file.handle.recordsize_bytes());
        let size_bytes = file.handle.size_bytes();
        let len = u64::from(size).min(size_bytes.saturating_sub(offset));
        // Claimed under the lock: a read of this file that comes after
        // this one finds the claims, never races them with its own.
        let mut readahead = file.readahead.lock().expect("poisoned");
        let Some((from, len)) = readahead.on_read(offset, len, recordsize, size_bytes) else {
            return;
        };
        // One job a span of records (one GET each): the pool fetches the
        // spans concurrently. A span is claimed only when a thread is free
        // to fill it at once: claims that waited in a queue behind other
        // readers' streams would hold this reader up. Without a thread, it
        // reads on its own and asks again at its next read.
        let span_bytes = self.readahead_span_bytes(recordsize);
        let threads = self.options.prefetch_threads;
        let mut at = from;
        while at < from + len {
            if self.spans_in_flight.fetch_add(1, Ordering::AcqRel) >= threads {
                self.spans_in_flight.fetch_sub(1, Ordering::AcqRel);
                readahead.not_asked_from(at);
                return;
            }
            let n = span_bytes.min(from + len - at);
            let sent = self
                .cache
                .claim_span(&file.handle, at, n)
                .map(|span| tx.try_send((span, Arc::clone(&file.pace))));
            if !matches!(sent, Some(Ok(()))) {
                self.spans_in_flight.fetch_sub(1, Ordering::AcqRel);
            }
            if let Some(Err(TrySendError::Full(_) | TrySendError::Disconnected(_))) = sent {
                // Dropped: its claims are given up (a waiter looks again).
                readahead.not_asked_from(at);
                return;
            }
            at += n;
        }
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

    fn do_lookup(&self, parent: INodeNo, name: &OsStr) -> Result<FileAttr, Errno> {
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

    fn file(&self, fh: FileHandle) -> Result<Arc<OpenObject>, Errno> {
        self.handles.file(fh.0)
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

    fn do_open(&self, ino: INodeNo, flags: OpenFlags) -> Result<(u64, FopenFlags), Errno> {
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            return Err(Errno::from_i32(libc::EROFS));
        }
        let (path, is_dir) = self.node(ino)?;
        if is_dir {
            return Err(Errno::EISDIR);
        }
        // Its read-ahead is this file system's own (`read_ahead`), not the
        // engine's streams.
        let handle = self
            .cache
            .open(self.dataset, &path, false)
            .map_err(|e| errno(&e))?
            .reads_ahead_itself();
        let meta = self.store.stat(&path).map_err(|e| errno(&e))?;
        let version = (
            l2arc::primary::Generation::version_hash_of(&meta.etag, &meta.version_id),
            meta.size_bytes,
        );
        let keep = self.note_page_version(ino.0, version) == Some(version);
        let recordsize = u64::from(handle.recordsize_bytes());
        let window_records = self.readahead_window_records(recordsize);
        let file = Arc::new(OpenObject {
            ino: ino.0,
            token_seen: AtomicU64::new(handle.generation_token()),
            handle,
            pace: Arc::new(l2arc::Pace::new(0, self.readahead_ahead_bytes(recordsize))),
            last_record: AtomicU64::new(u64::MAX),
            readahead: Mutex::new(ReadAhead::at_once(window_records)),
            last_revalidate: Mutex::new(Instant::now()),
        });
        let fh = self.handles.add(Handle::File(file))?;
        let flags = if keep {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        Ok((fh, flags))
    }

    fn do_opendir(&self, ino: INodeNo) -> Result<u64, Errno> {
        let (path, is_dir) = self.node(ino)?;
        if !is_dir {
            return Err(Errno::ENOTDIR);
        }
        let listed = self.store.list_dir(&path).map_err(|e| errno(&e))?;
        let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
        let mut entries = Vec::with_capacity(listed.len() + 2);
        entries.push((".".to_string(), FileType::Directory, ino.0));
        entries.push(("..".to_string(), FileType::Directory, node_id(parent)));
        for e in listed.iter() {
            let kind = if e.is_dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            entries.push((e.name.clone(), kind, node_id(&join(&path, &e.name))));
        }
        self.handles.add(Handle::Dir(Arc::new(entries)))
    }

    /// Revalidates an open file at most once per attribute timeout (a HEAD
    /// at most once per metadata TTL, fewer when the stat cache answers).
    /// Concurrent reads of the file wait for it (see `CachedFs`'s).
    fn maybe_revalidate(&self, file: &OpenObject) -> io::Result<()> {
        let mut last = file.last_revalidate.lock().expect("poisoned");
        if last.elapsed() >= self.options.attr_timeout {
            let started = Instant::now();
            self.cache.revalidate(&file.handle)?;
            *last = started;
        }
        Ok(())
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
        self.read_ahead(&file, offset, size);
        let recordsize = u64::from(file.handle.recordsize_bytes());
        let last_record = offset.saturating_add(u64::from(size).max(1) - 1) / recordsize;
        let continues =
            Some(file.last_record.swap(last_record, Ordering::Relaxed)).filter(|&r| r != u64::MAX);
        let view = match self.cache.read_view_continuing(
            &file.handle,
            offset,
            size as usize,
            AccessKind::Demand,
            continues,
        ) {
            Ok(v) => v,
            Err(e) => return reply.error(errno(&e)),
        };
        match view.as_single_slice() {
            Some(bytes) => reply.data(bytes),
            None => {
                let mut buf = vec![0u8; view.len()];
                view.copy_to(&mut buf);
                reply.data(&buf);
            }
        }
        // The object's generation moved under this open (a 412, or a
        // revalidate saw a new ETag): what the kernel cached before is of
        // the old version. Dropped after this reply (never before: see the
        // module comment of fs.rs).
        let token = file.handle.generation_token();
        if file.token_seen.swap(token, Ordering::AcqRel) != token {
            self.invalidate_kernel_later(file.ino);
        }
        self.cache.analytics().frontend.finish(timer);
    }

    /// Open handles (tests).
    pub fn open_handles(&self) -> usize {
        self.handles.len()
    }
}

fn erofs() -> Errno {
    Errno::from_i32(libc::EROFS)
}

impl Filesystem for ObjectFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        use fuser::InitFlags;
        for flag in [
            InitFlags::FUSE_AUTO_INVAL_DATA,
            InitFlags::FUSE_PARALLEL_DIROPS,
        ] {
            let _ = config.add_capabilities(flag);
        }
        // Refused: the kernel keeps its own.
        let _ = config.set_max_background(self.max_background);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.do_lookup(parent, name) {
            Ok(attr) => reply.entry(&self.ttl(), &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if ino.0 == ROOT_ID {
            return;
        }
        let nodes = &mut self.nodes.lock().expect("node table poisoned").map;
        if let Some(node) = nodes.get_mut(&ino.0) {
            node.lookups = node.lookups.saturating_sub(nlookup);
            if node.lookups == 0 {
                nodes.remove(&ino.0);
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let (path, is_dir) = match self.node(ino) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        if is_dir {
            return reply.attr(&self.ttl(), &self.dir_attr(ino.0));
        }
        let file = fh.and_then(|fh| self.file(fh).ok());
        if let Some(file) = &file {
            // Through an open file: let the cache see a new ETag now.
            let _ = self.cache.revalidate(&file.handle);
            *file.last_revalidate.lock().expect("poisoned") = Instant::now();
        }
        let meta = match self.store.stat(&path) {
            Ok(m) => m,
            Err(e) => return reply.error(errno(&e)),
        };
        let version = (
            l2arc::primary::Generation::version_hash_of(&meta.etag, &meta.version_id),
            meta.size_bytes,
        );
        let before = self.note_page_version(ino.0, version);
        let changed = before != Some(version);
        reply.attr(&self.ttl(), &self.file_attr(ino.0, &meta));
        let size_changed = before.is_some_and(|(_, size_bytes)| size_bytes != meta.size_bytes);
        if changed && !size_changed {
            // After the answer (fs.rs explains why never before it). A new
            // size is the kernel's own check to act on: an invalidation
            // racing the answer would make it read on with the old size.
            self.invalidate_kernel_later(ino.0);
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.do_open(ino, flags) {
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
        for (i, (name, kind, ino)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), (i + 1) as u64, *kind, name) {
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

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(0, 0, 0, 0, 0, BLKSIZE_BYTES, 1024, BLKSIZE_BYTES);
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        if mask.bits() & libc::W_OK != 0 {
            return reply.error(erofs());
        }
        match self.node(ino) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    // Everything that would change the bucket: EROFS (the mount is "ro",
    // so the kernel answers most of these itself).
    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(erofs());
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(erofs());
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(erofs());
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(erofs());
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(erofs());
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: fuser::ReplyCreate,
    ) {
        reply.error(erofs());
    }
}
