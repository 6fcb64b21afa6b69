//! The source's answers in the kernel's terms: stat to attributes, modes
//! and dirent types to file types, io errors to errnos.
//!
//! Errors keep the source's own errno wherever it has one: the mount is to
//! fail exactly as the source does (pjdfstest checks every errno). Only
//! errors the cache rebuilt with a message lost it, and are mapped back
//! from their kind.

use std::ffi::{CString, OsStr};
use std::io;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, INodeNo, TimeOrNow};

use crate::sys;

pub(super) fn errno(e: &io::Error) -> Errno {
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

pub(super) fn err(e: io::Error) -> Errno {
    errno(&e)
}

/// `/proc/self/fd/N`: its link names the file a descriptor holds.
pub(super) fn fd_path(fd: std::os::fd::RawFd) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/proc/self/fd/{fd}"))
}

pub(super) fn leaf(name: &OsStr) -> Result<CString, Errno> {
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

pub(super) fn dirent_type(d_type: u8) -> FileType {
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

pub(super) fn to_attr(ino: u64, st: &libc::stat) -> FileAttr {
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

pub(super) fn time(t: Option<TimeOrNow>) -> sys::Time {
    match t {
        None => sys::Time::Omit,
        Some(TimeOrNow::Now) => sys::Time::Now,
        Some(TimeOrNow::SpecificTime(at)) => sys::Time::At(at),
    }
}
