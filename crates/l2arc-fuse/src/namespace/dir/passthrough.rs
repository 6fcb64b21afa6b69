//! Everything but reads, passed through to the source.
//!
//! Writes, truncates, renames, unlinks, attribute changes, links, extended
//! attributes and locks go straight through to the source, each on the
//! descriptor of the inode it concerns or on one leaf name relative to its
//! parent's (`crate::sys`), and then drop whatever the cache held that they
//! made stale: `Cache::write` is write-through and invalidates the records
//! it touched, and a truncate or fallocate invalidates the whole object.
//! Nodes are made as the caller (`crate::creds`), with the caller's umask.
//! Each change made through the mount is noted on its inode, so that the
//! source watcher does not take it for a change behind the mount.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use fuser::{Errno, FileAttr, INodeNo, LockOwner, RenameFlags, ReplyEmpty, Request};

use super::attr::{err, errno, leaf, time, to_attr};
use super::coherence::PageRange;
use super::{DirTree, TreeFile, TreeOpen};
use crate::creds;
use crate::inodes::{Inode, Kind};
use crate::locks::{Conflict, LockRange};
use crate::namespace::{Opened, Passthrough, SetAttr, Xattr};
use crate::sys;
use crate::watch;

impl DirTree {
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

    /// The node `ino` if extended attributes can be reached through its
    /// descriptor (no race-free way to reach a symlink's own).
    fn xattr_node(&self, ino: INodeNo) -> Result<std::sync::Arc<Inode>, Errno> {
        let inode = self.inode(ino)?;
        if inode.kind == Kind::Symlink {
            return Err(Errno::EOPNOTSUPP);
        }
        Ok(inode)
    }

    /// A getxattr or listxattr: the size when `size` is 0, else the bytes.
    fn read_xattr(
        &self,
        ino: INodeNo,
        size: u32,
        call: impl Fn(i32, &mut [u8]) -> io::Result<usize>,
    ) -> Result<Xattr, Errno> {
        let inode = self.xattr_node(ino)?;
        if size == 0 {
            return call(inode.fd(), &mut [])
                .map(|n| Xattr::Size(n as u32))
                .map_err(err);
        }
        let mut buf = vec![0u8; size as usize];
        let n = call(inode.fd(), &mut buf).map_err(err)?;
        buf.truncate(n);
        Ok(Xattr::Data(buf))
    }
}

/// The result of a libc call that answers -1 and sets errno on failure.
fn checked(ret: i64) -> Result<i64, Errno> {
    if ret < 0 {
        Err(errno(&io::Error::last_os_error()))
    } else {
        Ok(ret)
    }
}

impl Passthrough<TreeOpen> for DirTree {
    fn setattr(
        &self,
        ino: INodeNo,
        change: SetAttr,
        open: Option<&TreeFile>,
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
            self.invalidate_records(&inode, open);
            result.map_err(err)?;
        }
        if change.atime.is_some() || change.mtime.is_some() {
            sys::utimens_fd(fd, &time(change.atime), &time(change.mtime)).map_err(err)?;
        }
        let st = Self::stat(&inode)?;
        Ok(to_attr(inode.id, &st))
    }

    fn readlink(&self, ino: INodeNo) -> Result<OsString, Errno> {
        self.inode(ino)
            .and_then(|inode| sys::readlink_fd(inode.fd()).map_err(err))
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<FileAttr, Errno> {
        let mode = (mode & libc::S_IFMT) | (mode & !umask & 0o7777);
        self.make_node(req, parent, name, |dir, leaf| {
            sys::mknod_at(dir, leaf, mode, u64::from(rdev))
        })
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> Result<FileAttr, Errno> {
        self.make_node(req, parent, name, |dir, leaf| {
            sys::mkdir_at(dir, leaf, mode & !umask & 0o7777)
        })
    }

    fn remove(&self, parent: INodeNo, name: &OsStr, is_dir: bool) -> Result<(), Errno> {
        let parent = self.inode(parent)?;
        let leaf = leaf(name)?;
        sys::unlink_at(parent.fd(), &leaf, is_dir).map_err(err)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
    ) -> Result<FileAttr, Errno> {
        // The target is stored as given: the kernel resolves it on the
        // client side; our own opens never follow it.
        self.make_node(req, parent, link_name, |dir, leaf| {
            sys::symlink_at(target.as_os_str(), dir, leaf)
        })
    }

    fn rename(
        &self,
        parent: INodeNo,
        name: &OsStr,
        new_parent: INodeNo,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let (from_dir, to_dir) = (self.inode(parent)?, self.inode(new_parent)?);
        let (from, to) = (leaf(name)?, leaf(new_name)?);
        sys::rename_at(from_dir.fd(), &from, to_dir.fd(), &to, flags.bits()).map_err(err)
    }

    fn link(&self, ino: INodeNo, new_parent: INodeNo, new_name: &OsStr) -> Result<FileAttr, Errno> {
        let (inode, dir) = (self.inode(ino)?, self.inode(new_parent)?);
        let to = leaf(new_name)?;
        sys::link_fd(inode.fd(), dir.fd(), &to).map_err(err)?;
        let fd = sys::open_at(dir.fd(), &to, libc::O_PATH, 0).map_err(err)?;
        self.adopt_node(fd)
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(FileAttr, Opened<TreeOpen>), Errno> {
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
            Ok(opened) => Ok((attr, opened)),
            Err(e) => {
                // The kernel never learns of the node: give its reference back.
                self.inodes.lock().expect("poisoned").forget(attr.ino.0, 1);
                Err(e)
            }
        }
    }

    fn write(
        &self,
        file: &TreeFile,
        offset: u64,
        data: &[u8],
        from_page_cache: bool,
    ) -> Result<(), Errno> {
        if !file.state.writable {
            return Err(Errno::EBADF);
        }
        watch::note_own_change(&file.state.inode);
        self.serving
            .cache
            .write(&file.handle, offset, data)
            .map_err(|e| errno(&e))?;
        if file.state.direct_io && !from_page_cache && !data.is_empty() {
            // The kernel dropped this range from its pages before it sent
            // the direct write, and a read answered since, from the old
            // bytes, may have put them back: drop them again before the
            // write returns (`open.rs`). Not for the writeback of a shared
            // mapping: its pages hold the new bytes, and they stay under
            // writeback until we answer, so a drop would wait for us.
            self.invalidate_kernel_range(file.state.inode.id, PageRange::of(offset, data.len()));
        }
        Ok(())
    }

    fn flush(&self, ino: INodeNo, lock_owner: LockOwner) {
        // Writes are write-through: nothing is buffered here. A close drops
        // the closing owner's POSIX locks, as on the source.
        self.locks.release_owner(ino.0, lock_owner.0);
    }

    fn fsync(&self, file: &TreeFile) -> Result<(), Errno> {
        self.serving.cache.sync(&file.handle).map_err(err)
    }

    fn fsyncdir(&self, ino: INodeNo) -> Result<(), Errno> {
        let inode = self.inode(ino)?;
        let fd =
            sys::open_at(inode.fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0).map_err(err)?;
        std::fs::File::from(fd).sync_all().map_err(err)
    }

    fn setxattr(&self, ino: INodeNo, name: &OsStr, value: &[u8], flags: i32) -> Result<(), Errno> {
        let inode = self.xattr_node(ino)?;
        let name = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
        sys::setxattr_fd(inode.fd(), &name, value, flags).map_err(err)
    }

    fn getxattr(&self, ino: INodeNo, name: &OsStr, size: u32) -> Result<Xattr, Errno> {
        let name = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
        self.read_xattr(ino, size, |fd, buf| sys::getxattr_fd(fd, &name, buf))
    }

    fn listxattr(&self, ino: INodeNo, size: u32) -> Result<Xattr, Errno> {
        self.read_xattr(ino, size, sys::listxattr_fd)
    }

    fn removexattr(&self, ino: INodeNo, name: &OsStr) -> Result<(), Errno> {
        let inode = self.xattr_node(ino)?;
        let name = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
        sys::removexattr_fd(inode.fd(), &name).map_err(err)
    }

    fn getlk(
        &self,
        ino: INodeNo,
        lock_owner: LockOwner,
        lock: LockRange,
    ) -> Result<Option<Conflict>, Errno> {
        let inode = self.inode(ino)?;
        self.locks.test(&inode, lock_owner.0, lock)
    }

    fn setlk(
        &self,
        ino: INodeNo,
        lock_owner: LockOwner,
        lock: LockRange,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        match self.inode(ino) {
            Ok(inode) => self.locks.set(&inode, lock_owner.0, lock, sleep, reply),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        ino: INodeNo,
        open: Option<&TreeFile>,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        let inode = self.inode(ino)?;
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
        let result = checked(i64::from(ret)).map(drop);
        // Punched holes and zeroed ranges change content: drop it all.
        self.invalidate_records(&inode, open);
        result
    }

    fn lseek(&self, ino: INodeNo, offset: i64, whence: i32) -> Result<i64, Errno> {
        // SEEK_DATA / SEEK_HOLE: ask the source where its holes are.
        let inode = self.inode(ino)?;
        let fd = sys::reopen(inode.fd(), libc::O_RDONLY | libc::O_NONBLOCK).map_err(err)?;
        // SAFETY: an open descriptor.
        checked(unsafe { libc::lseek(fd.as_raw_fd(), offset, whence) })
    }
}
