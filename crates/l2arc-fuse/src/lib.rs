//! FUSE front end: a directory tree (a slow disk, an NFS or SMB mount)
//! served at a mount point through the l2arc cache.
//!
//! Reads go through the cache (ARC in DRAM, L2ARC on flash when cache
//! devices are attached); every other operation passes through to the
//! source tree and drops what it made stale. The design, piece by piece:
//!
//! - **Inode table** (`inodes.rs`). The kernel names files by node id; we
//!   map each id to a *path* beneath the source root, not to a source inode,
//!   so a file replaced behind the mount is reached under its old node and
//!   its new generation is noticed. Renames through the mount move paths;
//!   the table is bounded (ENFILE past `FsOptions::max_nodes`).
//!
//! - **TTLs.** Attributes and names are returned with a short, documented
//!   timeout (`FsOptions::attr_timeout`, `--attr-timeout`, default 1 s). The
//!   kernel caches them that long, which saves a round trip per `stat` and
//!   per path component, and bounds how long a change made behind the mount
//!   (a new size, a new file under a name) can go unseen. Directory
//!   listings are read whole at opendir and served from that snapshot.
//!
//! - **Generation checks.** The cache keys records by object and a
//!   generation token from (inode, size, mtime). Every open compares the
//!   generation (`Cache::open`); an open file is revalidated on getattr and
//!   at least once per TTL while read. Files are opened without
//!   FOPEN_KEEP_CACHE, so the kernel's page cache is dropped at each open:
//!   no layer can serve bytes of an older version after a reopen.
//!
//! - **Descriptors beneath the root** (`sys.rs`). Names come from whoever
//!   uses the mount, and the source tree may hold hostile symlinks or be
//!   renamed under us, so no operation uses a full path: the parent
//!   directory is opened with `openat2(RESOLVE_BENEATH)` relative to the
//!   root (`DirPrimary::open_fd_beneath`), and the operation acts on a
//!   single leaf name relative to it, never following the leaf if it is a
//!   symlink. `..` and absolute symlink targets cannot take us outside the
//!   root. Symlinks themselves are passed through as symlinks: the kernel
//!   resolves them on the client side, as for any file system.
//!
//! - **Read-ahead** (`readahead.rs`): sequential readers get a ramping,
//!   bounded window of records prefetched in the background.
//!
//! Unmounting: an orderly stop unmounts with umount(2) (`unmount`), or
//! lazily (`detach_mount`) when the mount is busy. `mount` also asks for
//! fusermount3's auto_unmount, whose watcher process releases the mount if
//! we are killed; where that watcher does not survive (it did not in the
//! container these tests run in), a dead mount ("Transport endpoint is not
//! connected") is recovered with `fusermount3 -u MNT` or `umount -l MNT`.
//!
//! Limits: names must be UTF-8 (others are EINVAL: the engine names
//! objects by `&str`); extended attributes, locks and lseek(SEEK_DATA)
//! are left to the kernel's defaults (not supported / local only).

use std::io;
use std::path::Path;

pub mod fs;
pub mod inodes;
pub mod readahead;
pub mod sys;

pub use fs::{CachedFs, FsOptions};
/// A mounted file system served from background threads (fuser's).
pub use fuser::BackgroundSession as Session;

/// How the mount is made.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Let every user in (allow_other), with the kernel checking
    /// permissions (default_permissions). Off: only root and the mounting
    /// user reach the file system.
    pub allow_other: bool,
    /// Threads serving FUSE requests.
    pub threads: usize,
}

impl Default for MountOptions {
    fn default() -> Self {
        Self {
            allow_other: false,
            threads: 4,
        }
    }
}

/// Mounts `fs` at `mountpoint` and serves it from background threads until
/// the returned session is unmounted (`umount_and_join`) or dropped, or the
/// mount is removed from outside (`fusermount3 -u`).
pub fn mount(
    fs: CachedFs,
    mountpoint: &Path,
    options: &MountOptions,
) -> io::Result<fuser::BackgroundSession> {
    use fuser::{MountOption, SessionACL};
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName("l2arc".to_string()),
        MountOption::Subtype("l2arc".to_string()),
        MountOption::NoDev,
        MountOption::NoSuid,
        // Released by fusermount3 when this process dies, however it dies.
        MountOption::AutoUnmount,
    ];
    // auto_unmount needs allow_other at the kernel level; without
    // --allow-other fuser itself refuses every user but root and the owner.
    config.acl = if options.allow_other {
        config.mount_options.push(MountOption::DefaultPermissions);
        SessionACL::All
    } else {
        SessionACL::RootAndOwner
    };
    config.n_threads = Some(options.threads.max(1));
    config.clone_fd = options.threads > 1;
    fuser::spawn_mount(fs, mountpoint, &config)
}

/// Lazily unmounts `mountpoint` (`umount -l`): the name is free at once and
/// the kernel lets go when the last user leaves. For a mount that a normal
/// unmount refused as busy.
pub fn detach_mount(mountpoint: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c_mnt = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a valid C string.
    if unsafe { libc::umount2(c_mnt.as_ptr(), libc::MNT_DETACH) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Unmounts `mountpoint`: umount(2) when we may (root), otherwise through
/// the setuid helper (`fusermount3 -u`). The session's threads then see the
/// device close and end. We do not rely on fusermount3's auto_unmount
/// watcher for an orderly stop: it is a separate process that some
/// container setups do not keep alive.
pub fn unmount(mountpoint: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c_mnt = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a valid C string.
    if unsafe { libc::umount2(c_mnt.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EPERM) {
        return Err(e);
    }
    let status = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(mountpoint)
        .status()?;
    if !status.success() {
        return Err(io::Error::other(format!(
            "fusermount3 -u {} failed ({status})",
            mountpoint.display()
        )));
    }
    Ok(())
}
