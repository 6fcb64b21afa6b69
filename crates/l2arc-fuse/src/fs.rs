//! The FUSE operations: reads through the cache, everything else through to
//! the source, confined beneath its root.
//!
//! Reads are the point of the mount: `read` asks the cache (ARC, then
//! L2ARC, then the source) and, for a sequential reader, starts read-ahead
//! in the background. Everything that changes the source — writes,
//! truncates, renames, unlinks, attribute changes — goes straight through
//! to the source and then drops whatever the cache held that it made
//! stale: `Cache::write` is write-through and invalidates the records it
//! touched, and a truncate or fallocate invalidates the whole object.
//!
//! Changes made behind the mount are caught by the object generation
//! (inode, size, mtime): `Cache::open` compares it at every open, and an
//! open file is revalidated on `getattr` and at least once per attribute
//! timeout while it is read, so a long-lived reader sees a rewritten file
//! within that bound. Files are opened without FOPEN_KEEP_CACHE, so the
//! kernel drops its own page cache of a file at each open and cannot serve
//! bytes we would no longer serve.
//!
//! Open files and directory listings live in two tables bounded by
//! `FsOptions`; past the bound an open fails with EMFILE.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use l2arc::arc::AccessKind;
use l2arc::primary::dir::DirPrimary;
use l2arc::{Cache, DatasetId, ObjectHandle};

use crate::inodes::{InodeTable, ROOT_ID, child_path, split_path};
use crate::readahead::ReadAhead;
use crate::sys;

/// Tunables of the file system.
#[derive(Clone, Debug)]
pub struct FsOptions {
    /// How long the kernel may trust attributes and names we returned, and
    /// how stale an open file's view of a change behind the mount may get.
    pub attr_timeout: Duration,
    /// Largest read-ahead window, in records (0 = no read-ahead).
    pub readahead_max_records: u32,
    /// Bound of the inode table (nodes the kernel holds).
    pub max_nodes: usize,
    /// Bound of open files plus open directories.
    pub max_open_handles: usize,
    /// Largest directory listed (entries held per open directory).
    pub max_dir_entries: usize,
    /// Background read-ahead threads.
    pub prefetch_threads: usize,
}

impl Default for FsOptions {
    fn default() -> Self {
        Self {
            attr_timeout: Duration::from_secs(1),
            readahead_max_records: 8,
            max_nodes: 1 << 20,
            max_open_handles: 1 << 16,
            max_dir_entries: 1 << 20,
            prefetch_threads: 2,
        }
    }
}

/// Read-ahead requests waiting for a thread; more are dropped, not queued:
/// read-ahead is a hint and must never hold up demand reads.
const PREFETCH_QUEUE_LEN: usize = 64;

struct OpenFile {
    handle: ObjectHandle,
    readahead: Mutex<ReadAhead>,
    last_revalidate: Mutex<Instant>,
}

struct DirEntry {
    name: std::ffi::OsString,
    kind: FileType,
    ino: u64,
}

enum Handle {
    File(Arc<OpenFile>),
    Dir(Arc<Vec<DirEntry>>),
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

/// A directory tree served through the cache.
pub struct CachedFs {
    cache: Arc<Cache>,
    dataset: DatasetId,
    primary: Arc<DirPrimary>,
    options: FsOptions,
    inodes: Mutex<InodeTable>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    prefetch: Option<SyncSender<PrefetchJob>>,
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
        _ => libc::EIO,
    })
}

fn name_str(name: &OsStr) -> Result<&str, Errno> {
    sys::leaf(name).map_err(|e| errno(&e))?;
    name.to_str().ok_or(Errno::EINVAL)
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

impl CachedFs {
    /// `dataset` must be a dataset of `cache` whose primary serves the same
    /// tree as `primary` (possibly wrapped, e.g. in an emulated HDD).
    pub fn new(
        cache: Arc<Cache>,
        dataset: DatasetId,
        primary: Arc<DirPrimary>,
        options: FsOptions,
    ) -> Self {
        assert!(options.max_open_handles > 0 && options.max_dir_entries > 0);
        let prefetch =
            (options.readahead_max_records > 0 && options.prefetch_threads > 0).then(|| {
                let (tx, rx) = sync_channel::<PrefetchJob>(PREFETCH_QUEUE_LEN);
                let rx = Arc::new(Mutex::new(rx));
                for i in 0..options.prefetch_threads {
                    let rx = Arc::clone(&rx);
                    let cache = Arc::clone(&cache);
                    std::thread::Builder::new()
                        .name(format!("l2arc-prefetch-{i}"))
                        .spawn(move || prefetch_worker(&cache, &rx))
                        .expect("spawn a prefetch thread");
                }
                tx
            });
        Self {
            cache,
            dataset,
            primary,
            inodes: Mutex::new(InodeTable::new(options.max_nodes)),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            prefetch,
            options,
        }
    }

    fn ttl(&self) -> Duration {
        self.options.attr_timeout
    }

    fn path_of(&self, ino: INodeNo) -> Result<String, Errno> {
        self.inodes
            .lock()
            .expect("inode table poisoned")
            .path(ino.0)
            .ok_or(Errno::ENOENT)
    }

    /// A descriptor of directory `dir` (a path beneath the root).
    fn dir_fd(&self, dir: &str) -> Result<OwnedFd, Errno> {
        self.primary
            .open_fd_beneath(dir, libc::O_PATH | libc::O_DIRECTORY)
            .map_err(|e| errno(&e))
    }

    /// The parent's descriptor and leaf of `path` ("." for the root itself).
    fn locate(&self, path: &str) -> Result<(OwnedFd, CString), Errno> {
        if path.is_empty() {
            return Ok((self.dir_fd("")?, c".".to_owned()));
        }
        let (dir, leaf) = split_path(path);
        let leaf = CString::new(leaf).map_err(|_| Errno::EINVAL)?;
        Ok((self.dir_fd(dir)?, leaf))
    }

    fn stat_path(&self, path: &str) -> Result<libc::stat, Errno> {
        let (dir, leaf) = self.locate(path)?;
        sys::stat_at(dir.as_raw_fd(), &leaf).map_err(|e| errno(&e))
    }

    /// A new or known node for `path`, with its attributes (one lookup reference).
    fn entry(&self, path: &str) -> Result<FileAttr, Errno> {
        let st = self.stat_path(path)?;
        let ino = self
            .inodes
            .lock()
            .expect("inode table poisoned")
            .lookup(path)
            .ok_or(Errno::ENFILE)?;
        Ok(to_attr(ino, &st))
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<(String, OwnedFd, CString), Errno> {
        let name = name_str(name)?;
        let dir = self.path_of(parent)?;
        let fd = self.dir_fd(&dir)?;
        let leaf = CString::new(name).map_err(|_| Errno::EINVAL)?;
        Ok((child_path(&dir, name), fd, leaf))
    }

    fn add_handle(&self, handle: Handle) -> Result<u64, Errno> {
        let mut handles = self.handles.lock().expect("handle table poisoned");
        if handles.len() >= self.options.max_open_handles {
            return Err(Errno::EMFILE);
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let old = handles.insert(fh, handle);
        assert!(old.is_none(), "file handles are never reused");
        Ok(fh)
    }

    fn file(&self, fh: FileHandle) -> Result<Arc<OpenFile>, Errno> {
        match self
            .handles
            .lock()
            .expect("handle table poisoned")
            .get(&fh.0)
        {
            Some(Handle::File(f)) => Ok(Arc::clone(f)),
            _ => Err(Errno::EBADF),
        }
    }

    fn open_file(&self, path: &str, writable: bool) -> Result<u64, Errno> {
        let handle = self
            .cache
            .open(self.dataset, path, writable)
            .map_err(|e| errno(&e))?;
        self.add_handle(Handle::File(Arc::new(OpenFile {
            handle,
            readahead: Mutex::new(ReadAhead::new(self.options.readahead_max_records)),
            last_revalidate: Mutex::new(Instant::now()),
        })))
    }

    /// Drops every cached record of the file at `path` (its content changed
    /// by another path than `Cache::write`), through an open handle if the
    /// caller has one.
    fn invalidate(&self, path: &str, fh: Option<FileHandle>) {
        if let Some(file) = fh.and_then(|fh| self.file(fh).ok()) {
            self.cache.invalidate_object(&file.handle);
            let _ = self.cache.revalidate(&file.handle);
        } else if let Ok(handle) = self.cache.open(self.dataset, path, false) {
            // Handles share the object's state: this drops it for all of them.
            self.cache.invalidate_object(&handle);
        }
    }

    /// Revalidates an open file at most once per attribute timeout.
    fn maybe_revalidate(&self, file: &OpenFile) -> io::Result<()> {
        let mut last = file.last_revalidate.lock().expect("poisoned");
        if last.elapsed() >= self.options.attr_timeout {
            *last = Instant::now();
            drop(last);
            self.cache.revalidate(&file.handle)?;
        }
        Ok(())
    }

    fn do_setattr(
        &self,
        ino: INodeNo,
        change: SetAttr,
        fh: Option<FileHandle>,
    ) -> Result<FileAttr, Errno> {
        let SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        } = change;
        let path = self.path_of(ino)?;
        let (dir, leaf) = self.locate(&path)?;
        let dir = dir.as_raw_fd();
        let err = |e: io::Error| errno(&e);
        if let Some(mode) = mode {
            sys::chmod_at(dir, &leaf, mode).map_err(err)?;
        }
        if uid.is_some() || gid.is_some() {
            sys::chown_at(dir, &leaf, uid, gid).map_err(err)?;
        }
        if let Some(size) = size {
            let fd = sys::open_at(dir, &leaf, libc::O_WRONLY | libc::O_NONBLOCK, 0).map_err(err)?;
            let result = sys::ftruncate(fd.as_raw_fd(), size);
            self.invalidate(&path, fh);
            result.map_err(err)?;
        }
        if atime.is_some() || mtime.is_some() {
            let t = |t: Option<TimeOrNow>| match t {
                None => sys::Time::Omit,
                Some(TimeOrNow::Now) => sys::Time::Now,
                Some(TimeOrNow::SpecificTime(at)) => sys::Time::At(at),
            };
            sys::utimens_at(dir, &leaf, &t(atime), &t(mtime)).map_err(err)?;
        }
        let st = sys::stat_at(dir, &leaf).map_err(err)?;
        Ok(to_attr(ino.0, &st))
    }

    fn do_create(
        &self,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(FileAttr, u64), Errno> {
        let (path, dir, leaf) = self.child(parent, name)?;
        let keep = libc::O_ACCMODE | libc::O_EXCL | libc::O_TRUNC | libc::O_APPEND;
        let fd = sys::open_at(
            dir.as_raw_fd(),
            &leaf,
            (flags & keep) | libc::O_CREAT | libc::O_NONBLOCK,
            mode & !umask & 0o7777,
        )
        .map_err(|e| errno(&e))?;
        drop(fd);
        let writable = OpenFlags(flags).acc_mode() != OpenAccMode::O_RDONLY;
        let fh = self.open_file(&path, writable)?;
        if flags & libc::O_TRUNC != 0 {
            self.invalidate(&path, Some(FileHandle(fh)));
        }
        match self.entry(&path) {
            Ok(attr) => Ok((attr, fh)),
            Err(e) => {
                self.handles.lock().expect("poisoned").remove(&fh);
                Err(e)
            }
        }
    }

    fn do_opendir(&self, ino: INodeNo) -> Result<u64, Errno> {
        let path = self.path_of(ino)?;
        let fd = self
            .primary
            .open_fd_beneath(&path, libc::O_RDONLY | libc::O_DIRECTORY)
            .map_err(|e| errno(&e))?;
        let entries = sys::read_dir(fd, self.options.max_dir_entries)
            .map_err(|e| errno(&e))?
            .into_iter()
            .map(|e| DirEntry {
                name: e.name,
                kind: dirent_type(e.d_type),
                ino: e.ino,
            })
            .collect();
        self.add_handle(Handle::Dir(Arc::new(entries)))
    }

    fn do_read(&self, fh: FileHandle, offset: u64, size: u32, reply: ReplyData) {
        let file = match self.file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        if let Err(e) = self.maybe_revalidate(&file) {
            return reply.error(errno(&e));
        }
        let view =
            match self
                .cache
                .read_view(&file.handle, offset, size as usize, AccessKind::Demand)
            {
                Ok(v) => v,
                Err(e) => return reply.error(errno(&e)),
            };
        if let Some(tx) = &self.prefetch {
            let ahead = file.readahead.lock().expect("poisoned").on_read(
                offset,
                view.len() as u64,
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
        match view.segments.len() {
            0 => reply.data(&[]),
            1 => {
                let (record, range) = &view.segments[0];
                reply.data(&record.data[range.clone()]);
            }
            _ => {
                let mut buf = vec![0u8; view.len()];
                view.copy_to(&mut buf);
                reply.data(&buf);
            }
        }
    }
}

fn prefetch_worker(cache: &Cache, jobs: &Mutex<Receiver<PrefetchJob>>) {
    loop {
        let job = jobs.lock().expect("prefetch queue poisoned").recv();
        let Ok((file, offset, len)) = job else {
            return; // the file system is gone
        };
        // A failed read-ahead is only a lost hint; the demand read reports errors.
        let _ = cache.prefetch(&file.handle, offset, len as usize);
    }
}

impl Filesystem for CachedFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let result = (|| {
            let name = name_str(name)?;
            let dir = self.path_of(parent)?;
            self.entry(&child_path(&dir, name))
        })();
        match result {
            Ok(attr) => reply.entry(&self.ttl(), &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.inodes
            .lock()
            .expect("inode table poisoned")
            .forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        if let Some(file) = fh.and_then(|fh| self.file(fh).ok()) {
            // The kernel asks through an open file: notice changes behind us now.
            let _ = self.cache.revalidate(&file.handle);
            *file.last_revalidate.lock().expect("poisoned") = Instant::now();
        }
        match self.path_of(ino).and_then(|p| self.stat_path(&p)) {
            Ok(st) => reply.attr(&self.ttl(), &to_attr(ino.0, &st)),
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
        let result = self.path_of(ino).and_then(|p| {
            let (dir, leaf) = self.locate(&p)?;
            sys::readlink_at(dir.as_raw_fd(), &leaf).map_err(|e| errno(&e))
        });
        match result {
            Ok(target) => reply.data(target.as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let result = self.child(parent, name).and_then(|(path, dir, leaf)| {
            let mode = (mode & libc::S_IFMT) | (mode & !umask & 0o7777);
            sys::mknod_at(dir.as_raw_fd(), &leaf, mode, u64::from(rdev)).map_err(|e| errno(&e))?;
            self.entry(&path)
        });
        match result {
            Ok(attr) => reply.entry(&self.ttl(), &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let result = self.child(parent, name).and_then(|(path, dir, leaf)| {
            sys::mkdir_at(dir.as_raw_fd(), &leaf, mode & !umask & 0o7777).map_err(|e| errno(&e))?;
            self.entry(&path)
        });
        match result {
            Ok(attr) => reply.entry(&self.ttl(), &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, false, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, true, reply);
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        // The target is stored as given: the kernel resolves it on the
        // client side; our own opens never follow it out of the tree.
        let result = self.child(parent, link_name).and_then(|(path, dir, leaf)| {
            sys::symlink_at(target.as_os_str(), dir.as_raw_fd(), &leaf).map_err(|e| errno(&e))?;
            self.entry(&path)
        });
        match result {
            Ok(attr) => reply.entry(&self.ttl(), &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
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
            let (from, from_dir, from_leaf) = self.child(parent, name)?;
            let (to, to_dir, to_leaf) = self.child(newparent, newname)?;
            // Hold the table across the rename so that a lookup cannot map
            // a path between the source's change and ours.
            let mut inodes = self.inodes.lock().expect("inode table poisoned");
            sys::rename_at(
                from_dir.as_raw_fd(),
                &from_leaf,
                to_dir.as_raw_fd(),
                &to_leaf,
                flags.bits(),
            )
            .map_err(|e| errno(&e))?;
            if flags.contains(RenameFlags::RENAME_EXCHANGE) {
                inodes.exchange(&from, &to);
            } else {
                inodes.rename(&from, &to);
            }
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
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
            let from = self.path_of(ino)?;
            let (from_dir, from_leaf) = self.locate(&from)?;
            let (to, to_dir, to_leaf) = self.child(newparent, newname)?;
            sys::link_at(
                from_dir.as_raw_fd(),
                &from_leaf,
                to_dir.as_raw_fd(),
                &to_leaf,
            )
            .map_err(|e| errno(&e))?;
            self.entry(&to)
        })();
        match result {
            Ok(attr) => reply.entry(&self.ttl(), &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let writable = flags.acc_mode() != OpenAccMode::O_RDONLY;
        match self
            .path_of(ino)
            .and_then(|path| self.open_file(&path, writable))
        {
            // No FOPEN_KEEP_CACHE: the kernel drops its pages of the file now.
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
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
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Writes are write-through: nothing is buffered here.
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
        self.handles.lock().expect("poisoned").remove(&fh.0);
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
        match self
            .file(fh)
            .and_then(|f| self.cache.sync(&f.handle).map_err(|e| errno(&e)))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
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
        let entries = match self.handles.lock().expect("poisoned").get(&fh.0) {
            Some(Handle::Dir(d)) => Arc::clone(d),
            _ => return reply.error(Errno::EBADF),
        };
        for (i, e) in entries.iter().enumerate().skip(offset as usize) {
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
        self.handles.lock().expect("poisoned").remove(&fh.0);
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
        let result = self.path_of(ino).and_then(|p| {
            let fd = self
                .primary
                .open_fd_beneath(&p, libc::O_RDONLY | libc::O_DIRECTORY)
                .map_err(|e| errno(&e))?;
            std::fs::File::from(fd).sync_all().map_err(|e| errno(&e))
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let result = self
            .primary
            .open_fd_beneath("", libc::O_RDONLY | libc::O_DIRECTORY)
            .and_then(|fd| sys::fstatvfs(fd.as_raw_fd()));
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
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // Only the mounting user (root) reaches us without allow_other, and
        // with it the kernel checks permissions (default_permissions).
        match self.path_of(ino).and_then(|p| self.stat_path(&p)) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self.do_create(parent, name, mode, umask, flags) {
            Ok((attr, fh)) => reply.created(
                &self.ttl(),
                &attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::empty(),
            ),
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
        let result = self.path_of(ino).and_then(|path| {
            let (dir, leaf) = self.locate(&path)?;
            let fd = sys::open_at(dir.as_raw_fd(), &leaf, libc::O_WRONLY | libc::O_NONBLOCK, 0)
                .map_err(|e| errno(&e))?;
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
            self.invalidate(&path, Some(fh));
            result
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

impl CachedFs {
    fn remove(&self, parent: INodeNo, name: &OsStr, is_dir: bool, reply: ReplyEmpty) {
        let result = self.child(parent, name).and_then(|(path, dir, leaf)| {
            let mut inodes = self.inodes.lock().expect("inode table poisoned");
            sys::unlink_at(dir.as_raw_fd(), &leaf, is_dir).map_err(|e| errno(&e))?;
            inodes.detach(&path);
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
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
        assert!(self.handles.lock().expect("poisoned").len() <= self.options.max_open_handles);
        assert_eq!(inodes.path(ROOT_ID).as_deref(), Some(""));
    }
}
