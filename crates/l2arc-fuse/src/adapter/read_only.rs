//! How a namespace that cannot be changed answers what would change it.
//!
//! The bucket is mounted "ro", so the kernel refuses most changes itself
//! before they reach us. What it still sends that would make or remove a
//! node or change its attributes is refused here with EROFS. Everything
//! else a read-only namespace has no use for (links, writes, extended
//! attributes, locks, sync, lseek) gets fuser's own answer for an
//! operation a file system does not implement (mostly ENOSYS, which the
//! kernel remembers, and so stops asking), by leaving those callbacks to
//! fuser's defaults.

use std::ffi::OsStr;
use std::time::SystemTime;

use fuser::{Errno, FileHandle, Filesystem, INodeNo, ReplyAttr, ReplyEmpty, ReplyEntry, Request};

/// The answers of a namespace without `Passthrough` (see the module comment).
pub(super) struct ReadOnly;

fn erofs() -> Errno {
    Errno::from_i32(libc::EROFS)
}

impl Filesystem for ReadOnly {
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
