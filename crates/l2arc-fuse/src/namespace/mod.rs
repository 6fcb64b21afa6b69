//! What the two file systems differ in: their namespaces.
//!
//! A FUSE file system over the cache is two things. A skeleton: the table
//! of open files and listings, the read path (find the open file, keep it
//! fresh, read through the cache, answer), listings served from a snapshot
//! taken at opendir, the replies. And a namespace: how a name becomes a
//! node, a node its attributes and its listing, and an open node an object
//! the cache can read. The pass-through directory tree and the object store
//! bucket differ only in the namespace, so the skeleton is written once
//! (`crate::adapter`) over the [`Namespace`] trait, and a fix to the read
//! path or to the handle table is made in one place for both mounts.
//!
//! Around each read the two namespaces still decide three things their
//! storage makes them decide differently (`ReadPlan` and the hooks): how
//! much to read (the tree reads a small read's whole record, to hand it to
//! the kernel's pages), when to read ahead (the bucket claims its spans
//! before the demand read, so that the read waits on a GET in flight
//! instead of issuing one of its own; the tree asks after it, for what was
//! served), and what to do once the answer is sent (the tree stores the
//! record into the kernel's pages, the bucket drops pages of a version
//! that moved under the open). Both happen after the reply because the
//! kernel may hold pages locked until it has the answer.
//!
//! Only the tree can be changed. Its writes, metadata changes, links,
//! extended attributes and locks go through [`Passthrough`], which a
//! read-only namespace does not have; the adapter then answers as a
//! read-only mount always has (`crate::adapter::read_only`).

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fuser::{
    AccessFlags, Errno, FileAttr, FileType, FopenFlags, INodeNo, InitFlags, LockOwner, OpenFlags,
    RenameFlags, ReplyEmpty, Request, TimeOrNow,
};
use l2arc::{Cache, ObjectHandle, ReadView};

use crate::locks::{Conflict, LockRange};
use crate::readahead::ReadAhead;

pub(crate) mod bucket;
pub(crate) mod dir;

/// The kernel side of the mount, known once it is mounted (`crate::mount`).
pub(crate) type NotifierSlot = Arc<std::sync::OnceLock<fuser::Notifier>>;

/// What every namespace is served with, and the adapter uses too.
pub(crate) struct Serving {
    pub(crate) cache: Arc<Cache>,
    /// The kernel, for notifications sent off the request threads.
    pub(crate) notifier: NotifierSlot,
    /// How long the kernel may trust attributes and names; also how often
    /// an open file is revalidated while it is read.
    pub(crate) attr_timeout: Duration,
    /// Open files and listings the mount holds at most (EMFILE beyond).
    pub(crate) max_open_handles: usize,
    /// The errno a failure of the cache or of the storage is answered with.
    pub(crate) errno: fn(&io::Error) -> Errno,
}

impl Serving {
    /// With a notifier slot of its own, filled once mounted (`crate::mount`).
    pub(crate) fn new(
        cache: Arc<Cache>,
        attr_timeout: Duration,
        max_open_handles: usize,
        errno: fn(&io::Error) -> Errno,
    ) -> Self {
        assert!(max_open_handles > 0);
        Self {
            cache,
            notifier: NotifierSlot::default(),
            attr_timeout,
            max_open_handles,
            errno,
        }
    }
}

/// One open of a regular file: the cache's handle of the object and what
/// every mount keeps per open, with what the namespace keeps (`state`).
pub(crate) struct OpenFile<S> {
    /// First, so dropped first: a namespace's close runs while the
    /// object's handle is still open.
    pub(crate) state: S,
    pub(crate) handle: ObjectHandle,
    pub(crate) readahead: Mutex<ReadAhead>,
    /// When the cache last checked the object against its source.
    last_revalidate: Mutex<Instant>,
}

impl<S> OpenFile<S> {
    pub(crate) fn new(handle: ObjectHandle, readahead: ReadAhead, state: S) -> Self {
        Self {
            state,
            handle,
            readahead: Mutex::new(readahead),
            last_revalidate: Mutex::new(Instant::now()),
        }
    }

    /// Revalidates the object at most once per `interval`. The lock is held
    /// through the revalidation: a concurrent read of the same file (the
    /// kernel sends several at once) must wait for it, not go on under the
    /// old size and generation because the clock was already reset (it
    /// served bytes past a truncation behind the mount).
    pub(crate) fn revalidate_if_due(&self, cache: &Cache, interval: Duration) -> io::Result<()> {
        let mut last = self.last_revalidate.lock().expect("poisoned");
        if last.elapsed() >= interval {
            let started = Instant::now();
            cache.revalidate(&self.handle)?;
            *last = started;
        }
        Ok(())
    }

    /// Revalidates the object now (the kernel asks for attributes through
    /// this open: a change behind the mount is to be seen at once) and
    /// restarts the clock of `revalidate_if_due`.
    pub(crate) fn revalidate_now(&self, cache: &Cache) {
        let _ = cache.revalidate(&self.handle);
        *self.last_revalidate.lock().expect("poisoned") = Instant::now();
    }
}

/// An open file as a namespace opened it, and whether the kernel may keep
/// the pages it already holds of it (FOPEN_KEEP_CACHE).
pub(crate) type Opened<S> = (Arc<OpenFile<S>>, FopenFlags);

/// One entry of a directory listing.
pub(crate) struct DirEntry {
    pub(crate) name: OsString,
    pub(crate) kind: FileType,
    pub(crate) ino: u64,
}

/// How one read is made: which range is read from the cache (the
/// request's, or the whole record under it), and what the namespace does
/// after the answer (`after`).
pub(crate) struct ReadPlan<A> {
    /// At or before the request's offset.
    pub(crate) read_at: u64,
    pub(crate) read_len: usize,
    /// The record the open's previous read ended in, if the namespace
    /// follows it (`Cache::read_view_continuing`).
    pub(crate) continues: Option<u64>,
    pub(crate) after: A,
}

/// A file system's statistics, as statfs(2) reports them.
pub(crate) struct FsStats {
    pub(crate) blocks: u64,
    pub(crate) blocks_free: u64,
    pub(crate) blocks_available: u64,
    pub(crate) files: u64,
    pub(crate) files_free: u64,
    pub(crate) block_size_bytes: u32,
    pub(crate) name_max_bytes: u32,
    pub(crate) fragment_size_bytes: u32,
}

/// The answer to a getxattr or listxattr: the size asked for (a call with
/// size 0) or the bytes.
pub(crate) enum Xattr {
    Size(u32),
    Data(Vec<u8>),
}

/// What a setattr asks to change (None: leave it).
pub(crate) struct SetAttr {
    pub(crate) mode: Option<u32>,
    pub(crate) uid: Option<u32>,
    pub(crate) gid: Option<u32>,
    pub(crate) size: Option<u64>,
    pub(crate) atime: Option<TimeOrNow>,
    pub(crate) mtime: Option<TimeOrNow>,
}

/// Names, nodes, attributes, listings and opens: what a mount serves, as
/// its storage has them (see the module comment).
pub(crate) trait Namespace: Send + Sync + 'static {
    /// What the namespace keeps per open file.
    type FileState: Send + Sync + 'static;
    /// An open directory's listing, held until releasedir.
    type Listing: AsRef<[DirEntry]> + Send + Sync + 'static;
    /// What a getattr leaves to do once its answer is sent.
    type AfterAttr;
    /// What a read leaves to do once its answer is sent.
    type AfterRead;

    /// FUSE capabilities asked for at init.
    const KERNEL_CAPABILITIES: &'static [InitFlags];
    /// At init, before any other request: which of `KERNEL_CAPABILITIES`
    /// the kernel granted.
    fn kernel_granted(&self, _granted: InitFlags) {}
    fn serving(&self) -> &Serving;

    /// The node of `name` in `parent` (one kernel reference), with its
    /// attributes.
    fn lookup(&self, parent: INodeNo, name: &OsStr) -> Result<FileAttr, Errno>;
    /// Drops `nlookup` kernel references to `ino`.
    fn forget(&self, ino: INodeNo, nlookup: u64);
    /// The attributes of `ino`, asked through `open` when the kernel names
    /// an open file.
    fn getattr(
        &self,
        ino: INodeNo,
        open: Option<&OpenFile<Self::FileState>>,
    ) -> Result<(FileAttr, Self::AfterAttr), Errno>;
    fn after_attr(&self, ino: INodeNo, after: Self::AfterAttr);
    /// Opens the regular file `ino` for a request of thread `caller_pid`.
    fn open(
        &self,
        ino: INodeNo,
        flags: OpenFlags,
        caller_pid: u32,
    ) -> Result<Opened<Self::FileState>, Errno>;
    /// The listing of directory `ino`, read whole (served from it until
    /// releasedir).
    fn list(&self, ino: INodeNo) -> Result<Self::Listing, Errno>;
    fn statfs(&self, ino: INodeNo) -> Result<FsStats, Errno>;
    fn access(&self, ino: INodeNo, mask: AccessFlags) -> Result<(), Errno>;

    /// Before a read of `size` bytes at `offset` through `file`.
    fn plan_read(
        &self,
        file: &Arc<OpenFile<Self::FileState>>,
        offset: u64,
        size: u32,
    ) -> ReadPlan<Self::AfterRead>;
    /// After the read, before the answer: `served_bytes` at `offset` are
    /// about to be answered.
    fn read_served(&self, file: &Arc<OpenFile<Self::FileState>>, offset: u64, served_bytes: usize);
    /// After the answer: `view` is what was read at `read_at`.
    fn after_read(
        &self,
        file: &OpenFile<Self::FileState>,
        after: Self::AfterRead,
        read_at: u64,
        view: ReadView,
    );

    /// The operations that change the namespace or reach past its names
    /// and data; None for a read-only namespace.
    fn passthrough(&self) -> Option<&dyn Passthrough<Self::FileState>> {
        None
    }
}

/// Operations a namespace backed by a file system passes through to it.
/// Each acts on the node it names; the adapter has resolved file handles.
pub(crate) trait Passthrough<S>: Send + Sync {
    /// Changes `ino`'s attributes, through `open` when the kernel names an
    /// open file.
    fn setattr(
        &self,
        ino: INodeNo,
        change: SetAttr,
        open: Option<&OpenFile<S>>,
    ) -> Result<FileAttr, Errno>;
    fn readlink(&self, ino: INodeNo) -> Result<OsString, Errno>;
    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<FileAttr, Errno>;
    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> Result<FileAttr, Errno>;
    fn remove(&self, parent: INodeNo, name: &OsStr, is_dir: bool) -> Result<(), Errno>;
    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
    ) -> Result<FileAttr, Errno>;
    fn rename(
        &self,
        parent: INodeNo,
        name: &OsStr,
        new_parent: INodeNo,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno>;
    fn link(&self, ino: INodeNo, new_parent: INodeNo, new_name: &OsStr) -> Result<FileAttr, Errno>;
    /// Creates and opens a regular file; on failure the node it made has
    /// no kernel reference left.
    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(FileAttr, Opened<S>), Errno>;
    /// Writes `data` at `offset` through `file`; `from_page_cache`: the
    /// kernel's writeback of pages a shared mapping dirtied
    /// (FUSE_WRITE_CACHE), not a write(2) in flight.
    fn write(
        &self,
        file: &OpenFile<S>,
        offset: u64,
        data: &[u8],
        from_page_cache: bool,
    ) -> Result<(), Errno>;
    /// A close of `ino` by `lock_owner`.
    fn flush(&self, ino: INodeNo, lock_owner: LockOwner);
    fn fsync(&self, file: &OpenFile<S>) -> Result<(), Errno>;
    fn fsyncdir(&self, ino: INodeNo) -> Result<(), Errno>;
    fn setxattr(&self, ino: INodeNo, name: &OsStr, value: &[u8], flags: i32) -> Result<(), Errno>;
    fn getxattr(&self, ino: INodeNo, name: &OsStr, size: u32) -> Result<Xattr, Errno>;
    fn listxattr(&self, ino: INodeNo, size: u32) -> Result<Xattr, Errno>;
    fn removexattr(&self, ino: INodeNo, name: &OsStr) -> Result<(), Errno>;
    /// The lock that would conflict with `lock`, if any.
    fn getlk(
        &self,
        ino: INodeNo,
        lock_owner: LockOwner,
        lock: LockRange,
    ) -> Result<Option<Conflict>, Errno>;
    /// Takes or releases `lock`; answers when it is done (a sleeping lock
    /// waits for its conflict to go).
    fn setlk(
        &self,
        ino: INodeNo,
        lock_owner: LockOwner,
        lock: LockRange,
        sleep: bool,
        reply: ReplyEmpty,
    );
    fn fallocate(
        &self,
        ino: INodeNo,
        open: Option<&OpenFile<S>>,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno>;
    /// SEEK_DATA / SEEK_HOLE.
    fn lseek(&self, ino: INodeNo, offset: i64, whence: i32) -> Result<i64, Errno>;
}
