//! FUSE front end: a directory tree (a slow disk, an NFS or SMB mount)
//! served at a mount point through the l2arc cache.
//!
//! Reads go through the cache (ARC in DRAM, L2ARC on flash when cache
//! devices are attached); every other operation passes through to the
//! source tree and drops what it made stale. The design, piece by piece:
//!
//! - **Inode table** (`inodes.rs`). The kernel names files by node id; each
//!   node is a source inode, pinned by an `O_PATH` descriptor, with the
//!   source's inode number as its id. Hard links share a node, renames
//!   need no bookkeeping, open-unlinked files keep working, and no full
//!   path is ever built (trees as deep as the source allows).
//!
//! - **Descriptors, not paths** (`sys.rs`). Every operation acts on a
//!   node's descriptor or on one leaf name relative to its parent's, never
//!   following the leaf if it is a symlink, so `..`, hostile symlinks and
//!   renames racing a lookup cannot reach outside the source. (A directory
//!   moved out of the tree behind the mount stays reachable through names
//!   the kernel still caches, until they expire: as with any pass-through
//!   file system, the descriptor follows the directory.) Names are bytes
//!   end to end; they need not be UTF-8.
//!
//! - **One adapter, two namespaces** (`adapter/`, `namespace/`). The FUSE
//!   skeleton (handle table, read path, listings) is written once over a
//!   namespace: this directory tree (`namespace/dir/`) or an object store
//!   bucket, served read-only (`namespace/bucket/`).
//!
//! - **Coherence** (`namespace/dir/coherence.rs`, `watch.rs`). Hot files stay in the kernel's
//!   page cache across opens (FOPEN_KEEP_CACHE), and are dropped from it,
//!   and from the ARC and L2ARC, when the source changes behind the mount:
//!   at once for a new open (also of a name the source replaced), and for
//!   a file held open as soon as the source watcher sees the change
//!   (inotify: at once; a periodic check: within half a second), with no
//!   request needed, so a reader of a shared mapping sees it too. The
//!   generation that decides it includes ctime, so a rewrite whose mtime
//!   was set back is caught too. Files open for writing are direct
//!   (FOPEN_DIRECT_IO): no written byte is in the kernel's pages before it
//!   is in the source (`namespace/dir/open.rs`).
//!
//! - **TTLs.** Attributes and names are returned with a short, documented
//!   timeout (`FsOptions::attr_timeout`, `--attr-timeout`, default 1 s).
//!   Directory listings are read whole at opendir and served from that
//!   snapshot.
//!
//! - **Callers' credentials** (`creds.rs`). Files, directories, nodes and
//!   symlinks made through the mount belong to the caller; the mode is the
//!   caller's, with the caller's umask (the daemon's own umask is 0).
//!
//! - **Extended attributes and locks** pass through to the source
//!   (`locks.rs`: POSIX record locks as open-file-description locks, one
//!   descriptor per lock owner). flock(2) locks are the kernel's, local to
//!   the mount.
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

use std::io;
use std::path::Path;

mod adapter;
mod creds;
mod file_systems;
mod handles;
mod inodes;
mod locks;
mod namespace;
pub mod ops;
mod readahead;
mod relief;
mod sys;
mod watch;
mod workers;

pub use file_systems::{CachedFs, ObjectFs};
/// A mounted file system served from background threads (fuser's).
pub use fuser::BackgroundSession as Session;
pub use namespace::bucket::{ObjectFsOptions, READAHEAD_WINDOW_DEFAULT_BYTES};
pub use namespace::dir::FsOptions;

/// How the mount is made.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Let every user in (allow_other), with the kernel checking
    /// permissions (default_permissions). Off: only root and the mounting
    /// user reach the file system.
    pub allow_other: bool,
    /// Threads serving FUSE requests: a read that misses holds one while
    /// primary storage answers, so this is also how many such reads are
    /// in flight at once. The kernel is asked to send as many reads at once
    /// (its `max_background`, 16 otherwise): the seed workload's 4
    /// emulated disks read 300 records a second with 4 threads, about 420
    /// with 16, and 452 of the model's 453 with 32.
    pub threads: usize,
}

impl Default for MountOptions {
    fn default() -> Self {
        Self {
            allow_other: false,
            threads: 32,
        }
    }
}

/// Mounts `fs` at `mountpoint` and serves it from background threads until
/// the returned session is unmounted (`umount_and_join`) or dropped, or the
/// mount is removed from outside (`fusermount3 -u`).
///
/// Sets the process's umask to 0: modes of files made through the mount
/// are the callers' (the kernel already applied their umask), not ours.
/// Also pins glibc's mmap threshold ([`MMAP_THRESHOLD_BYTES`]) for the
/// whole process.
pub fn mount(
    fs: CachedFs,
    mountpoint: &Path,
    options: &MountOptions,
) -> io::Result<fuser::BackgroundSession> {
    mount_adapter(fs.adapter, mountpoint, options)
}

/// Mounts an object store file system (read-only: the "ro" mount option)
/// at `mountpoint`, as [`mount`] does.
pub fn mount_objects(
    fs: ObjectFs,
    mountpoint: &Path,
    options: &MountOptions,
) -> io::Result<fuser::BackgroundSession> {
    mount_adapter(fs.adapter, mountpoint, options)
}

/// Reads the kernel sends at once in the background (read-ahead, the page
/// cache's reads for buffered readers): the kernel's `max_background`. As
/// many as the threads that serve them, so that every thread can hold a
/// read that waits on primary storage; fuser's 16 when fewer threads.
fn max_background_for(threads: usize) -> u16 {
    u16::try_from(threads)
        .unwrap_or(u16::MAX)
        .max(MAX_BACKGROUND_MIN)
}

/// fuser's own `max_background`, kept for mounts of fewer threads.
pub(crate) const MAX_BACKGROUND_MIN: u16 = 16;

fn mount_adapter<N: namespace::Namespace>(
    mut fs: adapter::FuseAdapter<N>,
    mountpoint: &Path,
    options: &MountOptions,
) -> io::Result<fuser::BackgroundSession> {
    use fuser::{MountOption, SessionACL};
    // A namespace that cannot be changed is mounted "ro": the kernel then
    // refuses most changes itself.
    let read_only = fs.namespace().passthrough().is_none();
    fs.max_background = max_background_for(options.threads);
    let notifier = std::sync::Arc::clone(&fs.namespace().serving().notifier);
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName("l2arc".to_string()),
        MountOption::Subtype("l2arc".to_string()),
        MountOption::NoDev,
        MountOption::NoSuid,
        // Released by fusermount3 when this process dies, however it dies.
        MountOption::AutoUnmount,
    ];
    if read_only {
        config.mount_options.push(MountOption::RO);
    }
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
    // SAFETY: umask only sets the process's mask.
    unsafe { libc::umask(0) };
    map_records_alone();
    // Before the session's threads start: they inherit it.
    creds::keep_capabilities();
    let session = fuser::spawn_mount(fs, mountpoint, &config)?;
    let _ = notifier.set(session.notifier());
    Ok(session)
}

/// Buffers at least this large (a 128 KiB record and up) are mapped and
/// unmapped on their own, never kept in a glibc arena: glibc's default,
/// pinned.
pub const MMAP_THRESHOLD_BYTES: i32 = 128 << 10;

/// Pins glibc's `M_MMAP_THRESHOLD` at [`MMAP_THRESHOLD_BYTES`]. By default
/// glibc raises the threshold to the largest mapped buffer freed (a FUSE
/// request buffer, a large read: up to 32 MiB), after which the ARC's
/// records come from its arenas, and records evicted there stay as free
/// but resident holes: measured under hostile load with `--arc-max 64MiB`
/// (crates/l2arc-cli/tests/fuse_memory.rs), the mount's RSS reached
/// 240 MiB against a formula of 151 MiB; pinned, 107 MiB.
fn map_records_alone() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes glibc's allocation policy.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
    }
}

/// A mounted file system that is unmounted (lazily, if busy) and whose
/// threads are joined when the guard drops, whatever happened before: for
/// benchmarks and tests that must not leave a mount behind.
pub struct MountGuard {
    mountpoint: std::path::PathBuf,
    session: Option<Session>,
}

impl MountGuard {
    /// Mounts `fs` at `mountpoint` (see [`mount`]) behind a guard.
    pub fn mount(fs: CachedFs, mountpoint: &Path, options: &MountOptions) -> io::Result<Self> {
        let session = mount(fs, mountpoint, options)?;
        Ok(Self {
            mountpoint: mountpoint.to_path_buf(),
            session: Some(session),
        })
    }

    /// Mounts an object store file system (see [`mount_objects`]) behind a guard.
    pub fn mount_objects(
        fs: ObjectFs,
        mountpoint: &Path,
        options: &MountOptions,
    ) -> io::Result<Self> {
        let session = mount_objects(fs, mountpoint, options)?;
        Ok(Self {
            mountpoint: mountpoint.to_path_buf(),
            session: Some(session),
        })
    }

    /// Where the file system is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            if unmount(&self.mountpoint).is_err() {
                let _ = detach_mount(&self.mountpoint);
            }
            let _ = session.join();
        }
    }
}

/// Whether something is mounted at `mountpoint` now (`/proc/mounts`, whose
/// octal escapes of spaces, tabs, newlines and backslashes are undone).
pub fn is_mounted(mountpoint: &Path) -> io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    // Lines of "SOURCE TARGET TYPE OPTIONS 0 0".
    let mounts = std::fs::read("/proc/mounts")?;
    let wanted = mountpoint.as_os_str().as_bytes();
    Ok(mounts
        .split(|&b| b == b'\n')
        .filter_map(|line| line.split(|&b| b == b' ').nth(1))
        .any(|target| unescape_mount_field(target) == wanted))
}

/// Undoes `/proc/mounts`' escapes: `\ooo` (three octal digits) is one byte.
fn unescape_mount_field(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') << 6 | (d[1] - b'0') << 3 | (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_fields_are_unescaped_and_the_root_is_mounted() {
        assert_eq!(
            unescape_mount_field(br"/mnt/a\040b\011c\134d"),
            b"/mnt/a b\tc\\d"
        );
        assert_eq!(
            unescape_mount_field(br"/x\08y\1"),
            br"/x\08y\1",
            "not three octal digits"
        );
        assert!(is_mounted(Path::new("/")).unwrap());
        assert!(!is_mounted(Path::new("/no/such/mount")).unwrap());
    }
}
