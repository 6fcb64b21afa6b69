//! A directory tree of files as primary storage.
//!
//! Object names come from whoever drives the cache (a CLI argument, a
//! network client), so they are untrusted: a name must never reach a file
//! outside the root, neither through `..` nor through a symlink planted
//! inside the tree. Checking the name as a string is not enough (a symlink
//! can be swapped between the check and the open), so the kernel resolves
//! the name for us with `openat2(RESOLVE_BENEATH)` relative to a descriptor
//! of the root: any step that would leave the root fails with EXDEV, and
//! the check and the open are one atomic step. Kernels older than 5.6 lack
//! openat2; there we walk the name one component at a time with
//! `O_PATH | O_NOFOLLOW` descriptors and expand symlinks ourselves, so every
//! step is again taken relative to a descriptor we already vetted.
//!
//! Reads are buffered (the page cache is the primary's business, and the
//! ARC above decides what is worth keeping). The generation is read from
//! `fstat` of the open descriptor, so a file replaced under the same name
//! (new inode) or rewritten in place (new size or mtime) is noticed.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{Generation, ObjectInfo, Primary, PrimaryObject};

/// Symlinks expanded in one name before giving up (the kernel's limit).
const MAX_SYMLINKS: usize = 40;
/// openat2 with RESOLVE_BENEATH returns EAGAIN when a rename races the
/// lookup; it is safe to retry.
const MAX_EAGAIN_RETRIES: usize = 16;

/// Files under one root directory; object names are paths relative to it.
pub struct DirPrimary {
    root: PathBuf,
    root_fd: OwnedFd,
    /// st_dev of the root: objects on it use their inode number as id.
    root_dev: u64,
    /// Set once openat2 returned ENOSYS (or by tests): walk names by hand.
    use_fallback: AtomicBool,
}

impl DirPrimary {
    /// Opens `root`, which must be an existing directory.
    pub fn new(root: impl AsRef<Path>) -> io::Result<Self> {
        let root = root.as_ref().to_path_buf();
        let meta = std::fs::metadata(&root).map_err(|e| {
            io::Error::new(e.kind(), format!("primary root {}: {e}", root.display()))
        })?;
        if !meta.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("primary root {} is not a directory", root.display()),
            ));
        }
        let c_root = CString::new(root.as_os_str().as_bytes()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("primary root {} contains a NUL byte", root.display()),
            )
        })?;
        // SAFETY: c_root is a valid C string; the result is checked.
        let fd = unsafe {
            libc::open(
                c_root.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("primary root {}: {e}", root.display()),
            ));
        }
        // SAFETY: fd is a fresh descriptor we own.
        let root_fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let primary = Self {
            root,
            root_fd,
            root_dev: meta.dev(),
            use_fallback: AtomicBool::new(false),
        };
        // Seccomp filters of some container runtimes answer ENOSYS or EPERM
        // to syscalls they do not know; an O_PATH open of "." cannot fail
        // for any other reason, so one probe decides.
        if let Err(e) = primary.open_openat2(".", libc::O_PATH | libc::O_CLOEXEC)
            && (e.raw_os_error() == Some(libc::ENOSYS)
                || e.kind() == io::ErrorKind::PermissionDenied)
        {
            primary.use_fallback.store(true, Ordering::Relaxed);
        }
        Ok(primary)
    }

    /// The directory the objects live in.
    pub fn root(&self) -> &Path {
        &self.root
    }

    #[cfg(test)]
    fn force_fallback(&self) {
        self.use_fallback.store(true, Ordering::Relaxed);
    }

    fn full_path(&self, name: &str) -> String {
        format!("{}/{name}", self.root.display())
    }

    fn escape_error(&self, name: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "object {name:?} resolves outside the primary root {}",
                self.root.display()
            ),
        )
    }

    /// Opens `name` beneath the root, returning an fd of a regular file.
    fn open_beneath(&self, name: &str, writable: bool) -> io::Result<File> {
        if name.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("empty object name in {}", self.describe()),
            ));
        }
        if name.as_bytes().contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("object name {name:?} contains a NUL byte"),
            ));
        }
        if Path::new(name).is_absolute() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "object name {name:?} is absolute; names are relative to {}",
                    self.root.display()
                ),
            ));
        }
        // O_NONBLOCK: opening a FIFO must not hang; cleared below for files.
        let flags = if writable {
            libc::O_RDWR
        } else {
            libc::O_RDONLY
        } | libc::O_CLOEXEC
            | libc::O_NOCTTY
            | libc::O_NONBLOCK;

        let fd = if self.use_fallback.load(Ordering::Relaxed) {
            self.open_walk(name, flags)?
        } else {
            match self.open_openat2(name, flags) {
                Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                    self.use_fallback.store(true, Ordering::Relaxed);
                    self.open_walk(name, flags)?
                }
                other => other?,
            }
        };
        let file = File::from(fd);
        let meta = file
            .metadata()
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", self.full_path(name))))?;
        if meta.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{} is a directory, not an object", self.full_path(name)),
            ));
        }
        if !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a regular file", self.full_path(name)),
            ));
        }
        clear_nonblock(file.as_raw_fd())
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", self.full_path(name))))?;
        Ok(file)
    }

    /// Opens `name` (a relative path; `""` or `"."` is the root) beneath the
    /// root with open(2) `flags`, resolved like object names: no step may
    /// leave the root, whatever symlinks or renames race with it. Front ends
    /// use it for a parent directory's descriptor, then act on a leaf name
    /// relative to it (mkdirat, unlinkat, renameat, ...), so that namespace
    /// operations are confined to the tree too. O_CLOEXEC is always added.
    /// Without openat2 (the by-hand walk), a symlink as the last component
    /// is not followed: with O_DIRECTORY that is ENOTDIR.
    pub fn open_fd_beneath(&self, name: &str, flags: i32) -> io::Result<OwnedFd> {
        let name = if name.is_empty() { "." } else { name };
        if name.as_bytes().contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("name {name:?} contains a NUL byte"),
            ));
        }
        if Path::new(name).is_absolute() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "name {name:?} is absolute; names are relative to {}",
                    self.root.display()
                ),
            ));
        }
        let flags = flags | libc::O_CLOEXEC;
        if self.use_fallback.load(Ordering::Relaxed) {
            return self.open_walk(name, flags);
        }
        match self.open_openat2(name, flags) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                self.use_fallback.store(true, Ordering::Relaxed);
                self.open_walk(name, flags)
            }
            other => other,
        }
    }

    fn open_openat2(&self, name: &str, flags: libc::c_int) -> io::Result<OwnedFd> {
        let c_name = CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: open_how is plain data; zero is a valid value of every field.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = flags as u64;
        how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
        for _ in 0..MAX_EAGAIN_RETRIES {
            // SAFETY: valid dirfd, C string and open_how of the size we pass.
            let ret = unsafe {
                libc::syscall(
                    libc::SYS_openat2,
                    self.root_fd.as_raw_fd(),
                    c_name.as_ptr(),
                    &how as *const libc::open_how,
                    std::mem::size_of::<libc::open_how>(),
                )
            };
            if ret >= 0 {
                // SAFETY: the kernel returned a fresh descriptor we own.
                return Ok(unsafe { OwnedFd::from_raw_fd(ret as RawFd) });
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => continue,
                Some(libc::ENOSYS) => return Err(e),
                Some(libc::EXDEV) => return Err(self.escape_error(name)),
                Some(libc::ELOOP) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "{}: too many symlinks or a /proc magic link ({e})",
                            self.full_path(name)
                        ),
                    ));
                }
                _ => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("{}: {e}", self.full_path(name)),
                    ));
                }
            }
        }
        Err(io::Error::new(
            io::ErrorKind::Interrupted,
            format!("{}: lookup kept racing with renames", self.full_path(name)),
        ))
    }

    /// The openat2-less path: resolve one component at a time from vetted
    /// directory descriptors, expanding symlinks by hand. `..` pops back to
    /// the directory we came from and may never pop the root.
    fn open_walk(&self, name: &str, flags: libc::c_int) -> io::Result<OwnedFd> {
        let mut pending: Vec<OsString> = components_rev(OsStr::new(name));
        // Directories entered so far, below the root; the last is current.
        let mut stack: Vec<OwnedFd> = Vec::new();
        let mut symlinks = 0usize;
        let ctx = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", self.full_path(name)));

        while let Some(comp) = pending.pop() {
            let cur = stack
                .last()
                .map_or(self.root_fd.as_raw_fd(), |fd| fd.as_raw_fd());
            if comp.is_empty() || comp == "." {
                continue;
            }
            if comp == ".." {
                if stack.pop().is_none() {
                    return Err(self.escape_error(name));
                }
                continue;
            }
            let c_comp = CString::new(comp.as_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?;
            let last = pending.is_empty();
            if last {
                // Open the final component for real, refusing to follow a
                // symlink: if it is one, expand it and go round again.
                match openat(cur, &c_comp, flags | libc::O_NOFOLLOW) {
                    Ok(fd) => return Ok(fd),
                    Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {}
                    Err(e) => return Err(ctx(e)),
                }
            }
            let fd = openat(
                cur,
                &c_comp,
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
            .map_err(ctx)?;
            let st = fstat(fd.as_raw_fd()).map_err(ctx)?;
            match st.st_mode & libc::S_IFMT {
                libc::S_IFLNK => {
                    symlinks += 1;
                    if symlinks > MAX_SYMLINKS {
                        return Err(ctx(io::Error::from_raw_os_error(libc::ELOOP)));
                    }
                    let target = readlink_fd(fd.as_raw_fd()).map_err(ctx)?;
                    if target.as_bytes().starts_with(b"/") {
                        return Err(self.escape_error(name));
                    }
                    pending.extend(components_rev(&target));
                }
                libc::S_IFDIR => stack.push(fd),
                _ if last => {
                    // Not a symlink after all (raced with a rename): retry,
                    // within the same budget so a racing attacker cannot spin us.
                    symlinks += 1;
                    if symlinks > MAX_SYMLINKS {
                        return Err(ctx(io::Error::from_raw_os_error(libc::ELOOP)));
                    }
                    pending.push(comp);
                }
                _ => return Err(ctx(io::Error::from_raw_os_error(libc::ENOTDIR))),
            }
        }
        // The name ended on a directory (or `.`/`..`): open it so the caller
        // reports "is a directory".
        let cur = stack
            .last()
            .map_or(self.root_fd.as_raw_fd(), |fd| fd.as_raw_fd());
        openat(
            cur,
            c".",
            libc::O_RDONLY | libc::O_CLOEXEC | libc::O_DIRECTORY,
        )
        .map_err(ctx)
    }

    /// Identity of a file: its inode on the root's file system, otherwise a
    /// mix of device and inode (a mount inside the tree reuses inode numbers).
    fn object_id(&self, dev: u64, ino: u64) -> u64 {
        if dev == self.root_dev {
            ino
        } else {
            splitmix64(splitmix64(dev) ^ ino)
        }
    }
}

impl Primary for DirPrimary {
    fn open(&self, name: &str, writable: bool) -> io::Result<Arc<dyn PrimaryObject>> {
        let file = self.open_beneath(name, writable)?;
        let meta = file.metadata()?;
        Ok(Arc::new(DirObject {
            file,
            path: self.full_path(name),
            id: self.object_id(meta.dev(), meta.ino()),
        }))
    }

    fn describe(&self) -> String {
        format!("dir {}", self.root.display())
    }

    fn open_file(&self, file: File, _writable: bool) -> io::Result<Arc<dyn PrimaryObject>> {
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "inode {} under {} is not a regular file",
                    meta.ino(),
                    self.root.display()
                ),
            ));
        }
        Ok(Arc::new(DirObject {
            path: format!("inode {} under {}", meta.ino(), self.root.display()),
            id: self.object_id(meta.dev(), meta.ino()),
            file,
        }))
    }
}

/// One open file of a [`DirPrimary`].
struct DirObject {
    file: File,
    path: String,
    id: u64,
}

impl PrimaryObject for DirObject {
    fn info(&self) -> io::Result<ObjectInfo> {
        let meta = self
            .file
            .metadata()
            .map_err(|e| io::Error::new(e.kind(), format!("fstat {}: {e}", self.path)))?;
        Ok(ObjectInfo {
            id: self.id,
            generation: Generation::of(&meta),
        })
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        read_full_at(&self.file, offset, buf)
            .map_err(|e| io::Error::new(e.kind(), format!("read {} at {offset}: {e}", self.path)))
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file
            .write_all_at(data, offset)
            .map_err(|e| io::Error::new(e.kind(), format!("write {} at {offset}: {e}", self.path)))
    }

    fn sync(&self) -> io::Result<()> {
        self.file
            .sync_data()
            .map_err(|e| io::Error::new(e.kind(), format!("sync {}: {e}", self.path)))
    }
}

/// `pread` until `buf` is full or the file ends.
pub(crate) fn read_full_at(file: &File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let pos = offset
            .checked_add(done as u64)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "offset overflows u64"))?;
        match file.read_at(&mut buf[done..], pos) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// The components of a relative path, last first (so `pop` yields them in order).
fn components_rev(path: &OsStr) -> Vec<OsString> {
    let mut v: Vec<OsString> = Path::new(path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect();
    v.reverse();
    v
}

fn openat(dir: RawFd, name: &std::ffi::CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    loop {
        // SAFETY: valid dirfd and C string; the result is checked.
        let fd = unsafe { libc::openat(dir, name.as_ptr(), flags, 0) };
        if fd >= 0 {
            // SAFETY: a fresh descriptor we own.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data; fstat fills it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open and st is writable.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Target of the symlink that an O_PATH|O_NOFOLLOW descriptor refers to.
fn readlink_fd(fd: RawFd) -> io::Result<OsString> {
    let mut buf = vec![0u8; 256];
    loop {
        // SAFETY: buf is writable for its length; "" with an O_PATH fd reads the link itself.
        let n = unsafe { libc::readlinkat(fd, c"".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        if n < buf.len() {
            buf.truncate(n);
            return Ok(OsString::from(std::ffi::OsStr::from_bytes(&buf)));
        }
        if buf.len() >= 1 << 16 {
            return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
        }
        buf.resize(buf.len() * 2, 0);
    }
}

fn clear_nonblock(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on an open descriptor.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if fl < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn setup() -> (tempfile::TempDir, DirPrimary) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/file"), b"hello world").unwrap();
        std::fs::write(tmp.path().join("outside"), b"secret").unwrap();
        let p = DirPrimary::new(&root).unwrap();
        (tmp, p)
    }

    fn both(check: impl Fn(&DirPrimary, &Path)) {
        for fallback in [false, true] {
            let (tmp, p) = setup();
            if fallback {
                p.force_fallback();
            }
            check(&p, &tmp.path().join("root"));
        }
    }

    #[test]
    fn new_rejects_missing_and_non_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("nope");
        let e = DirPrimary::new(&missing).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("nope"), "{e}");
        let file = tmp.path().join("plain");
        std::fs::write(&file, b"x").unwrap();
        let e = DirPrimary::new(&file).err().unwrap();
        assert!(e.to_string().contains("plain"), "{e}");
        assert!(e.to_string().contains("not a directory"), "{e}");
        assert_eq!(
            DirPrimary::new(tmp.path()).unwrap().describe(),
            format!("dir {}", tmp.path().display())
        );
    }

    #[test]
    fn read_write_info_roundtrip() {
        both(|p, root| {
            let obj = p.open("a/b/file", true).unwrap();
            let mut buf = [0u8; 64];
            assert_eq!(obj.read_at(0, &mut buf).unwrap(), 11);
            assert_eq!(&buf[..11], b"hello world");
            assert_eq!(obj.read_at(6, &mut buf[..3]).unwrap(), 3);
            assert_eq!(&buf[..3], b"wor");
            assert_eq!(obj.read_at(11, &mut buf).unwrap(), 0);
            assert_eq!(obj.read_at(1000, &mut buf).unwrap(), 0);

            obj.write_at(6, b"WORLD!!").unwrap();
            obj.sync().unwrap();
            assert_eq!(
                std::fs::read(root.join("a/b/file")).unwrap(),
                b"hello WORLD!!"
            );
            let info = obj.info().unwrap();
            let meta = std::fs::metadata(root.join("a/b/file")).unwrap();
            assert_eq!(info.id, meta.ino());
            assert_eq!(info.generation.ino, meta.ino());
            assert_eq!(info.size_bytes(), 13);
            assert_eq!(
                info.generation.mtime_ns,
                meta.mtime() * 1_000_000_000 + meta.mtime_nsec()
            );
            // Same file under another name: same id.
            let again = p.open("a/./b/../b/file", false).unwrap();
            assert_eq!(again.info().unwrap().id, info.id);
            // Read-only object refuses writes.
            assert!(again.write_at(0, b"x").is_err());
            // Missing object.
            let e = p.open("a/b/nope", false).err().unwrap();
            assert_eq!(e.kind(), io::ErrorKind::NotFound);
            assert!(e.to_string().contains("a/b/nope"), "{e}");
        });
    }

    #[test]
    fn generation_changes_on_rewrite_and_replace() {
        let (tmp, p) = setup();
        let path = tmp.path().join("root/a/b/file");
        let obj = p.open("a/b/file", false).unwrap();
        let g0 = obj.info().unwrap().generation;

        // Rewritten in place, same size: mtime moves.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, b"HELLO WORLD").unwrap();
        let g1 = obj.info().unwrap().generation;
        assert_eq!(g1.ino, g0.ino);
        assert_eq!(g1.size_bytes, g0.size_bytes);
        assert_ne!(g1.mtime_ns, g0.mtime_ns);
        // Grown: size moves.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all_at(b"!", 11)
            .unwrap();
        let g2 = obj.info().unwrap().generation;
        assert_eq!(g2.size_bytes, 12);
        assert_ne!(g2, g1);

        // Replaced by rename: a fresh open sees a new inode.
        let new = tmp.path().join("root/a/b/file.new");
        std::fs::write(&new, b"replacement").unwrap();
        std::fs::rename(&new, &path).unwrap();
        let g3 = p
            .open("a/b/file", false)
            .unwrap()
            .info()
            .unwrap()
            .generation;
        assert_ne!(g3.ino, g2.ino);
        assert_ne!(g3, g2);
    }

    #[test]
    fn escapes_rejected() {
        both(|p, root| {
            symlink("/etc", root.join("etc")).unwrap();
            symlink("..", root.join("up")).unwrap();
            symlink("../../outside", root.join("a/out")).unwrap();
            symlink("../../../outside", root.join("a/b/deep")).unwrap();
            for name in [
                "../outside",
                "a/../../outside",
                "a/b/../../../outside",
                "up/outside",
                "up/root/a/b/file",
                "etc/passwd",
                "a/out",
                "a/b/deep",
                "..",
            ] {
                let e = p.open(name, false).err().expect(name);
                assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{name}: {e}");
                assert!(e.to_string().contains("outside the primary root"), "{e}");
            }
            let e = p.open("/etc/passwd", false).err().unwrap();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
            assert!(e.to_string().contains("absolute"), "{e}");
            for name in ["", "a\0b"] {
                let e = p.open(name, false).err().unwrap();
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{name:?}: {e}");
            }
            // Directories are not objects.
            for name in ["a", "a/b", ".", "a/b/..", "a/b/"] {
                let e = p.open(name, false).err().expect(name);
                assert_eq!(e.kind(), io::ErrorKind::IsADirectory, "{name}: {e}");
            }
            // A symlink loop is an error, not a hang.
            symlink("loop2", root.join("loop1")).unwrap();
            symlink("loop1", root.join("loop2")).unwrap();
            assert!(p.open("loop1", false).is_err());
        });
    }

    #[test]
    fn symlinks_that_stay_inside_are_allowed() {
        both(|p, root| {
            symlink("b", root.join("a/bee")).unwrap();
            symlink("a/b/file", root.join("direct")).unwrap();
            symlink("../a/b/file", root.join("a/rel")).unwrap();
            std::fs::create_dir(root.join("c")).unwrap();
            symlink("../a", root.join("c/toa")).unwrap();
            for name in [
                "a/bee/file",
                "direct",
                "a/rel",
                "c/toa/b/file",
                "c/toa/bee/../b/file",
            ] {
                let obj = p
                    .open(name, false)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                let mut buf = [0u8; 11];
                assert_eq!(obj.read_at(0, &mut buf).unwrap(), 11, "{name}");
                assert_eq!(&buf, b"hello world", "{name}");
            }
        });
    }

    #[test]
    fn open_fd_beneath_confines_directories() {
        both(|p, root| {
            symlink("../..", root.join("a/up2")).unwrap();
            let dir_flags = libc::O_PATH | libc::O_DIRECTORY;
            for name in ["", ".", "a", "a/b", "a/b/.."] {
                let fd = p
                    .open_fd_beneath(name, dir_flags)
                    .unwrap_or_else(|e| panic!("{name:?}: {e}"));
                assert!(fstat(fd.as_raw_fd()).unwrap().st_mode & libc::S_IFMT == libc::S_IFDIR);
            }
            for name in ["..", "a/../..", "a/up2/outside"] {
                let e = p.open_fd_beneath(name, dir_flags).expect_err(name);
                assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{name}: {e}");
            }
            // A symlink as the last component: refused (the by-hand walk
            // opens it O_NOFOLLOW, so O_DIRECTORY says ENOTDIR), never followed.
            let e = p.open_fd_beneath("a/up2", dir_flags).unwrap_err();
            assert!(
                matches!(
                    e.kind(),
                    io::ErrorKind::PermissionDenied | io::ErrorKind::NotADirectory
                ),
                "{e}"
            );
            let e = p.open_fd_beneath("/etc", dir_flags).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        });
    }

    #[test]
    fn fifo_is_rejected_without_hanging() {
        both(|p, root| {
            let c = CString::new(root.join("fifo").as_os_str().as_bytes()).unwrap();
            // SAFETY: valid C string.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            let e = p.open("fifo", false).err().unwrap();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        });
    }
}
