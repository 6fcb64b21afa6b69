//! Thin wrappers over the `*at` system calls the file system passes through.
//!
//! Every namespace operation acts on a *leaf name relative to a directory
//! descriptor* that was opened beneath the source root (see
//! `DirPrimary::open_fd_beneath`). A leaf is one path component, never `..`
//! and never containing `/`, so the only directory an operation can touch
//! is the one we vetted; the leaf itself is never followed when it is a
//! symlink (AT_SYMLINK_NOFOLLOW, O_NOFOLLOW), so a symlink planted in the
//! tree cannot redirect a chmod, truncate or open to a file outside it.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

/// Checks a leaf name from the kernel and makes it a C string.
pub(crate) fn leaf(name: &OsStr) -> io::Result<CString> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    CString::new(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Retries a call interrupted by a signal.
fn retry<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

/// `fstatat(dir, leaf, AT_SYMLINK_NOFOLLOW)`; an empty leaf stats `dir` itself.
pub(crate) fn stat_at(dir: RawFd, leaf: &CStr) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let flags = if leaf.is_empty() {
        libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW
    } else {
        libc::AT_SYMLINK_NOFOLLOW
    };
    // SAFETY: valid dirfd, C string and writable stat.
    check(unsafe { libc::fstatat(dir, leaf.as_ptr(), &mut st, flags) })?;
    Ok(st)
}

/// `openat(dir, leaf, flags | O_NOFOLLOW | O_CLOEXEC, mode)`.
pub(crate) fn open_at(dir: RawFd, leaf: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    retry(|| {
        // SAFETY: valid dirfd and C string; the result is checked.
        let fd = unsafe {
            libc::openat(
                dir,
                leaf.as_ptr(),
                flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    })
}

pub(crate) fn mkdir_at(dir: RawFd, leaf: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: valid dirfd and C string.
    check(unsafe { libc::mkdirat(dir, leaf.as_ptr(), mode as libc::mode_t) })
}

pub(crate) fn mknod_at(dir: RawFd, leaf: &CStr, mode: u32, rdev: u64) -> io::Result<()> {
    // SAFETY: valid dirfd and C string.
    check(unsafe { libc::mknodat(dir, leaf.as_ptr(), mode as libc::mode_t, rdev) })
}

pub(crate) fn unlink_at(dir: RawFd, leaf: &CStr, is_dir: bool) -> io::Result<()> {
    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: valid dirfd and C string.
    check(unsafe { libc::unlinkat(dir, leaf.as_ptr(), flags) })
}

/// `renameat2`; `flags` are RENAME_NOREPLACE / RENAME_EXCHANGE as given by the kernel.
pub(crate) fn rename_at(
    from_dir: RawFd,
    from: &CStr,
    to_dir: RawFd,
    to: &CStr,
    flags: u32,
) -> io::Result<()> {
    // SAFETY: valid dirfds and C strings.
    check(unsafe {
        libc::renameat2(
            from_dir,
            from.as_ptr(),
            to_dir,
            to.as_ptr(),
            flags as libc::c_uint,
        )
    })
}

pub(crate) fn symlink_at(target: &OsStr, dir: RawFd, leaf: &CStr) -> io::Result<()> {
    let target =
        CString::new(target.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: valid C strings and dirfd.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir, leaf.as_ptr()) })
}

/// The target of the symlink `fd` pins (an `O_PATH | O_NOFOLLOW` descriptor).
pub(crate) fn readlink_fd(fd: RawFd) -> io::Result<OsString> {
    readlink_at(fd, c"")
}

pub(crate) fn readlink_at(dir: RawFd, leaf: &CStr) -> io::Result<OsString> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: buf is writable for its length.
    let n = unsafe { libc::readlinkat(dir, leaf.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(OsString::from_vec(buf))
}

/// `/proc/self/fd/N`: names exactly the inode an `O_PATH` descriptor pins,
/// for the calls that take no descriptor of that kind (open, chmod, xattrs,
/// link). Following this magic link never resolves a name, so it cannot be
/// redirected by a symlink or a rename.
pub(crate) fn proc_path(fd: RawFd) -> CString {
    CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL")
}

/// An `O_PATH | O_NOFOLLOW` descriptor of `path` (tests).
#[cfg(test)]
pub(crate) fn open_path(path: &std::path::Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    open_at(libc::AT_FDCWD, &c, libc::O_PATH, 0)
}

/// Opens the inode `fd` pins (an `O_PATH` descriptor) for I/O with `flags`,
/// even when its last name is gone (an open, unlinked file). `flags` must
/// not hold O_NOFOLLOW: that would open the /proc link itself.
pub(crate) fn reopen(fd: RawFd, flags: i32) -> io::Result<OwnedFd> {
    assert_eq!(
        flags & libc::O_NOFOLLOW,
        0,
        "O_NOFOLLOW opens the magic link"
    );
    let path = proc_path(fd);
    retry(|| {
        // SAFETY: a valid C string; the result is checked.
        let ret = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, 0) };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        Ok(unsafe { OwnedFd::from_raw_fd(ret) })
    })
}

/// chmod of the inode itself, never of a symlink's target (Linux cannot
/// change a symlink's mode: EOPNOTSUPP, as on the source).
pub(crate) fn chmod_fd(fd: RawFd, mode: u32) -> io::Result<()> {
    let st = stat_at(fd, c"")?;
    if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
        return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
    }
    // SAFETY: valid C string.
    check(unsafe { libc::chmod(proc_path(fd).as_ptr(), (mode & 0o7777) as libc::mode_t) })
}

/// chown of the inode itself (a symlink's own owner for a symlink).
pub(crate) fn chown_fd(fd: RawFd, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    // -1 (as unsigned) leaves an id unchanged.
    let uid = uid.unwrap_or(u32::MAX);
    let gid = gid.unwrap_or(u32::MAX);
    // SAFETY: valid descriptor and an empty C string with AT_EMPTY_PATH.
    check(unsafe {
        libc::fchownat(
            fd,
            c"".as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// utimensat of the inode itself (works on symlinks too).
pub(crate) fn utimens_fd(fd: RawFd, atime: &Time, mtime: &Time) -> io::Result<()> {
    let times = [timespec(atime), timespec(mtime)];
    // SAFETY: valid descriptor, empty C string with AT_EMPTY_PATH, two timespecs.
    check(unsafe { libc::utimensat(fd, c"".as_ptr(), times.as_ptr(), libc::AT_EMPTY_PATH) })
}

/// A new name `to` in `to_dir` for the inode `fd` pins.
pub(crate) fn link_fd(fd: RawFd, to_dir: RawFd, to: &CStr) -> io::Result<()> {
    // SAFETY: valid C strings and dirfd; following the magic link reaches
    // the pinned inode itself (a symlink stays a symlink).
    check(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            proc_path(fd).as_ptr(),
            to_dir,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    })
}

/// An xattr call's result: a size, or the error.
fn xattr_result(n: isize) -> io::Result<usize> {
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// getxattr of the inode `fd` pins; `buf` empty asks for the size.
pub(crate) fn getxattr_fd(fd: RawFd, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: valid C strings; buf is writable for its length.
    xattr_result(unsafe {
        libc::getxattr(
            proc_path(fd).as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })
}

/// listxattr of the inode `fd` pins; `buf` empty asks for the size.
pub(crate) fn listxattr_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: valid C string; buf is writable for its length.
    xattr_result(unsafe {
        libc::listxattr(proc_path(fd).as_ptr(), buf.as_mut_ptr().cast(), buf.len())
    })
}

pub(crate) fn setxattr_fd(fd: RawFd, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
    // SAFETY: valid C strings; value is readable for its length.
    check(unsafe {
        libc::setxattr(
            proc_path(fd).as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
}

pub(crate) fn removexattr_fd(fd: RawFd, name: &CStr) -> io::Result<()> {
    // SAFETY: valid C strings.
    check(unsafe { libc::removexattr(proc_path(fd).as_ptr(), name.as_ptr()) })
}

/// Raises the soft limit on open descriptors as far as allowed (the hard
/// limit; as root, up to `wanted`), and returns the limit now in force.
pub(crate) fn raise_nofile_limit(wanted: u64) -> u64 {
    // SAFETY: plain data.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } < 0 {
        return 1024;
    }
    if lim.rlim_cur >= wanted {
        return lim.rlim_cur;
    }
    let raised = libc::rlimit {
        rlim_cur: wanted,
        rlim_max: lim.rlim_max.max(wanted),
    };
    // SAFETY: a valid rlimit; fails without CAP_SYS_RESOURCE past the hard limit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
        return wanted;
    }
    let soft = libc::rlimit {
        rlim_cur: lim.rlim_max.min(wanted),
        rlim_max: lim.rlim_max,
    };
    // SAFETY: as above, within the hard limit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &soft) } == 0 {
        return soft.rlim_cur;
    }
    lim.rlim_cur
}

/// An open-file-description lock (F_OFD_*): owned by the descriptor, so it
/// conflicts with every other descriptor's and every process's locks on the
/// source, as the caller's POSIX lock would.
pub(crate) fn ofd_lock(
    fd: RawFd,
    cmd: i32,
    lock: crate::locks::LockRange,
) -> io::Result<libc::flock> {
    let crate::locks::LockRange { typ, start, end } = lock;
    // SAFETY: plain data.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start.min(i64::MAX as u64) as libc::off_t;
    // FUSE says "to end of file" with u64::MAX (OFFSET_MAX); flock says 0.
    fl.l_len = if end >= i64::MAX as u64 {
        0
    } else {
        (end - start + 1) as libc::off_t
    };
    retry(|| {
        // SAFETY: an open descriptor and a valid flock.
        check(unsafe { libc::fcntl(fd, cmd, &mut fl) })
    })?;
    Ok(fl)
}

/// One timestamp for utimensat: None = leave it (UTIME_OMIT).
pub(crate) enum Time {
    Omit,
    Now,
    At(std::time::SystemTime),
}

fn timespec(t: &Time) -> libc::timespec {
    match t {
        Time::Omit => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Time::Now => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Time::At(at) => {
            let (sec, nsec) = match at.duration_since(std::time::UNIX_EPOCH) {
                Ok(d) => (d.as_secs() as i64, i64::from(d.subsec_nanos())),
                Err(e) => {
                    // Before 1970: negative seconds, non-negative nanoseconds.
                    let d = e.duration();
                    let mut sec = -(d.as_secs() as i64);
                    let mut nsec = i64::from(d.subsec_nanos());
                    if nsec > 0 {
                        sec -= 1;
                        nsec = 1_000_000_000 - nsec;
                    }
                    (sec, nsec)
                }
            };
            libc::timespec {
                tv_sec: sec,
                tv_nsec: nsec,
            }
        }
    }
}

pub(crate) fn ftruncate(fd: RawFd, size_bytes: u64) -> io::Result<()> {
    let size =
        libc::off_t::try_from(size_bytes).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    retry(|| {
        // SAFETY: an open descriptor.
        check(unsafe { libc::ftruncate(fd, size) })
    })
}

pub(crate) fn fstatvfs(fd: RawFd) -> io::Result<libc::statvfs> {
    // SAFETY: plain data.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: an open descriptor and a writable struct.
    check(unsafe { libc::fstatvfs(fd, &mut st) })?;
    Ok(st)
}

/// One directory entry: name, d_type (DT_*), inode number in the source.
pub(crate) struct RawDirEntry {
    pub name: OsString,
    pub d_type: u8,
    pub ino: u64,
}

/// Reads a whole directory from a descriptor opened with O_RDONLY|O_DIRECTORY,
/// at most `max_entries` entries (more is an error: the listing is held in
/// memory for the life of the directory handle). `admit` is asked about
/// each entry before it is kept; its error ends the read.
pub(crate) fn read_dir(
    fd: OwnedFd,
    max_entries: usize,
    mut admit: impl FnMut(&RawDirEntry) -> io::Result<()>,
) -> io::Result<Vec<RawDirEntry>> {
    // fdopendir takes ownership of the descriptor; closedir closes it.
    let raw = fd.as_raw_fd();
    // SAFETY: raw is an open directory descriptor.
    let dirp = unsafe { libc::fdopendir(raw) };
    if dirp.is_null() {
        return Err(io::Error::last_os_error());
    }
    std::mem::forget(fd);
    struct Closer(*mut libc::DIR);
    impl Drop for Closer {
        fn drop(&mut self) {
            // SAFETY: a DIR we opened and close once.
            unsafe { libc::closedir(self.0) };
        }
    }
    let closer = Closer(dirp);
    let mut out = Vec::new();
    loop {
        // errno distinguishes the end (unchanged) from an error.
        // SAFETY: errno location is thread-local.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: a valid DIR.
        let ent = unsafe { libc::readdir64(closer.0) };
        if ent.is_null() {
            let e = io::Error::last_os_error();
            if e.raw_os_error().unwrap_or(0) != 0 {
                return Err(e);
            }
            return Ok(out);
        }
        // SAFETY: readdir returned a valid entry, d_name NUL terminated.
        let (name, d_type, ino) = unsafe {
            let ent = &*ent;
            (
                CStr::from_ptr(ent.d_name.as_ptr()).to_bytes().to_vec(),
                ent.d_type,
                ent.d_ino,
            )
        };
        if out.len() >= max_entries {
            return Err(io::Error::from_raw_os_error(libc::EMFILE));
        }
        let entry = RawDirEntry {
            name: OsString::from_vec(name),
            d_type,
            ino,
        };
        admit(&entry)?;
        out.push(entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_names_are_one_component() {
        for bad in ["", ".", "..", "a/b", "/", "../x"] {
            assert!(leaf(OsStr::new(bad)).is_err(), "{bad:?}");
        }
        assert!(leaf(OsStr::from_bytes(b"a\0b")).is_err());
        assert_eq!(leaf(OsStr::new("..a")).unwrap().as_bytes(), b"..a");
    }

    #[test]
    fn chmod_never_follows_a_symlink_leaf() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"x").unwrap();
        let inner = tmp.path().join("inner");
        std::fs::create_dir(&inner).unwrap();
        std::os::unix::fs::symlink(&victim, inner.join("link")).unwrap();
        let dir = std::fs::File::open(&inner).unwrap();
        let before = std::fs::metadata(&victim).unwrap();
        let link = open_at(dir.as_raw_fd(), c"link", libc::O_PATH, 0).unwrap();
        let e = chmod_fd(link.as_raw_fd(), 0o777).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP));
        assert_eq!(
            std::fs::metadata(&victim).unwrap().permissions(),
            before.permissions()
        );
        // open_at refuses to follow the link too.
        let e = open_at(dir.as_raw_fd(), c"link", libc::O_RDONLY, 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
        // A listing sees the link as a link.
        let fd = open_at(dir.as_raw_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0);
        let names: Vec<_> = read_dir(fd.unwrap(), 16, |_| Ok(()))
            .unwrap()
            .into_iter()
            .filter(|e| e.name != "." && e.name != "..")
            .map(|e| (e.name, e.d_type))
            .collect();
        assert_eq!(names, vec![(OsString::from("link"), libc::DT_LNK)]);
    }
}
