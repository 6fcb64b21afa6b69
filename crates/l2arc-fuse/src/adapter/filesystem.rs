//! The FUSE callbacks of the adapter: each finds what the request names
//! (an open file, a listing) and hands the rest to the namespace, then
//! answers. The callbacks that change the namespace or reach past its
//! names and data go to its `Passthrough`; a namespace without one is
//! answered by `ReadOnly`, as a read-only mount always was.
//!
//! Open files and listings are put into the table here, after the
//! namespace made them, so that both mounts bound them in one place
//! (EMFILE past `max_open_handles`).

use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::FuseAdapter;
use super::read_only::ReadOnly;
use crate::handles::Handle;
use crate::locks::LockRange;
use crate::namespace::{DirEntry, Namespace, SetAttr, Xattr};

fn reply_entry(reply: ReplyEntry, ttl: &std::time::Duration, result: Result<FileAttr, Errno>) {
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

fn reply_xattr(reply: ReplyXattr, result: Result<Xattr, Errno>) {
    match result {
        Ok(Xattr::Size(size_bytes)) => reply.size(size_bytes),
        Ok(Xattr::Data(data)) => reply.data(&data),
        Err(e) => reply.error(e),
    }
}

impl<N: Namespace> Filesystem for FuseAdapter<N> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let mut granted = InitFlags::empty();
        for &flag in N::KERNEL_CAPABILITIES {
            if config.add_capabilities(flag).is_ok() {
                granted |= flag;
            }
        }
        self.namespace.kernel_granted(granted);
        // Refused: the kernel keeps its own.
        let _ = config.set_max_background(self.max_background);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        crate::ops::count(crate::ops::Op::Lookup);
        reply_entry(reply, &self.ttl(), self.namespace.lookup(parent, name));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        crate::ops::count(crate::ops::Op::Forget);
        self.namespace.forget(ino, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        crate::ops::count(crate::ops::Op::Getattr);
        let file = self.file_if_open(fh);
        match self.namespace.getattr(ino, file.as_deref()) {
            Ok((attr, after)) => {
                reply.attr(&self.ttl(), &attr);
                self.namespace.after_attr(ino, after);
            }
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        crate::ops::count(crate::ops::Op::Open);
        let opened = self
            .namespace
            .open(ino, flags, req.pid())
            .and_then(|(file, open_flags)| Ok((self.files.add(Handle::File(file))?, open_flags)));
        match opened {
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
        crate::ops::count(crate::ops::Op::Read);
        self.read_file(fh, offset, size, reply);
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
        crate::ops::count(crate::ops::Op::Release);
        self.files.remove(fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        crate::ops::count(crate::ops::Op::Opendir);
        let opened = self
            .namespace
            .list(ino)
            .and_then(|listing| self.files.add(Handle::Dir(Arc::new(listing))));
        match opened {
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
        crate::ops::count(crate::ops::Op::Readdir);
        let listing = match self.files.dir(fh.0) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        let entries: &[DirEntry] = (*listing).as_ref();
        // An entry's offset is the one after it: where a readdir goes on.
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
        crate::ops::count(crate::ops::Op::Releasedir);
        self.files.remove(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        crate::ops::count(crate::ops::Op::Statfs);
        match self.namespace.statfs(ino) {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_available,
                s.files,
                s.files_free,
                s.block_size_bytes,
                s.name_max_bytes,
                s.fragment_size_bytes,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        crate::ops::count(crate::ops::Op::Access);
        reply_empty(reply, self.namespace.access(ino, mask));
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        crtime: Option<SystemTime>,
        chgtime: Option<SystemTime>,
        bkuptime: Option<SystemTime>,
        flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        crate::ops::count(crate::ops::Op::Setattr);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.setattr(
                req, ino, mode, uid, gid, size, atime, mtime, ctime, fh, crtime, chgtime, bkuptime,
                flags, reply,
            );
        };
        let change = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        };
        let file = self.file_if_open(fh);
        match tree.setattr(ino, change, file.as_deref()) {
            Ok(attr) => reply.attr(&self.ttl(), &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        crate::ops::count(crate::ops::Op::Readlink);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.readlink(req, ino, reply);
        };
        match tree.readlink(ino) {
            Ok(target) => reply.data(std::os::unix::ffi::OsStrExt::as_bytes(target.as_os_str())),
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
        crate::ops::count(crate::ops::Op::Mknod);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.mknod(req, parent, name, mode, umask, rdev, reply);
        };
        let made = tree.mknod(req, parent, name, mode, umask, rdev);
        reply_entry(reply, &self.ttl(), made);
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
        crate::ops::count(crate::ops::Op::Mkdir);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.mkdir(req, parent, name, mode, umask, reply);
        };
        reply_entry(
            reply,
            &self.ttl(),
            tree.mkdir(req, parent, name, mode, umask),
        );
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        crate::ops::count(crate::ops::Op::Unlink);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.unlink(req, parent, name, reply);
        };
        reply_empty(reply, tree.remove(parent, name, false));
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        crate::ops::count(crate::ops::Op::Rmdir);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.rmdir(req, parent, name, reply);
        };
        reply_empty(reply, tree.remove(parent, name, true));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        crate::ops::count(crate::ops::Op::Symlink);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.symlink(req, parent, link_name, target, reply);
        };
        reply_entry(
            reply,
            &self.ttl(),
            tree.symlink(req, parent, link_name, target),
        );
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        crate::ops::count(crate::ops::Op::Rename);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.rename(req, parent, name, newparent, newname, flags, reply);
        };
        reply_empty(reply, tree.rename(parent, name, newparent, newname, flags));
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        crate::ops::count(crate::ops::Op::Link);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.link(req, ino, newparent, newname, reply);
        };
        reply_entry(reply, &self.ttl(), tree.link(ino, newparent, newname));
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
        crate::ops::count(crate::ops::Op::Create);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.create(req, parent, name, mode, umask, flags, reply);
        };
        let (attr, (file, open_flags)) = match tree.create(req, parent, name, mode, umask, flags) {
            Ok(created) => created,
            Err(e) => return reply.error(e),
        };
        match self.files.add(Handle::File(file)) {
            Ok(fh) => reply.created(
                &self.ttl(),
                &attr,
                Generation(0),
                FileHandle(fh),
                open_flags,
            ),
            Err(e) => {
                // The kernel never learns of the node: give its reference back.
                self.namespace.forget(attr.ino, 1);
                reply.error(e);
            }
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        crate::ops::count(crate::ops::Op::Write);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.write(
                req,
                ino,
                fh,
                offset,
                data,
                write_flags,
                flags,
                lock_owner,
                reply,
            );
        };
        let from_page_cache = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        let written = self
            .file(fh)
            .and_then(|file| tree.write(&file, offset, data, from_page_cache));
        match written {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        crate::ops::count(crate::ops::Op::Flush);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.flush(req, ino, fh, lock_owner, reply);
        };
        tree.flush(ino, lock_owner);
        reply.ok();
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        crate::ops::count(crate::ops::Op::Fsync);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.fsync(req, ino, fh, datasync, reply);
        };
        reply_empty(reply, self.file(fh).and_then(|file| tree.fsync(&file)));
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        crate::ops::count(crate::ops::Op::Fsyncdir);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.fsyncdir(req, ino, fh, datasync, reply);
        };
        reply_empty(reply, tree.fsyncdir(ino));
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        crate::ops::count(crate::ops::Op::Setxattr);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.setxattr(req, ino, name, value, flags, position, reply);
        };
        reply_empty(reply, tree.setxattr(ino, name, value, flags));
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        crate::ops::count(crate::ops::Op::Getxattr);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.getxattr(req, ino, name, size, reply);
        };
        reply_xattr(reply, tree.getxattr(ino, name, size));
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        crate::ops::count(crate::ops::Op::Listxattr);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.listxattr(req, ino, size, reply);
        };
        reply_xattr(reply, tree.listxattr(ino, size));
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        crate::ops::count(crate::ops::Op::Removexattr);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.removexattr(req, ino, name, reply);
        };
        reply_empty(reply, tree.removexattr(ino, name));
    }

    fn getlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        crate::ops::count(crate::ops::Op::Getlk);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.getlk(req, ino, fh, lock_owner, start, end, typ, pid, reply);
        };
        match tree.getlk(ino, lock_owner, LockRange { typ, start, end }) {
            Ok(Some(lock)) => reply.locked(lock.start, lock.end, lock.typ, lock.pid),
            Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
            Err(e) => reply.error(e),
        }
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        crate::ops::count(crate::ops::Op::Setlk);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.setlk(req, ino, fh, lock_owner, start, end, typ, pid, sleep, reply);
        };
        tree.setlk(ino, lock_owner, LockRange { typ, start, end }, sleep, reply);
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        crate::ops::count(crate::ops::Op::Fallocate);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.fallocate(req, ino, fh, offset, length, mode, reply);
        };
        let file = self.file_if_open(Some(fh));
        reply_empty(
            reply,
            tree.fallocate(ino, file.as_deref(), offset, length, mode),
        );
    }

    fn lseek(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        crate::ops::count(crate::ops::Op::Lseek);
        let Some(tree) = self.namespace.passthrough() else {
            return ReadOnly.lseek(req, ino, fh, offset, whence, reply);
        };
        match tree.lseek(ino, offset, whence) {
            Ok(at) => reply.offset(at),
            Err(e) => reply.error(e),
        }
    }
}
