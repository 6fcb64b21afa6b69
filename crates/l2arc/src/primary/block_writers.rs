//! Who else may write a block device.
//!
//! Why. A cache trusts a record as long as its object's generation has not
//! moved; a block device has no generation that moves when it is written
//! (no mtime or ctime on writes through the device node), so writes made
//! behind the cache are invisible and the cache would serve what they
//! replaced. What can be known is who is *able* to write it at the moment
//! the cache starts: a process holding the device (or a partition of it,
//! or the disk it is a partition of) open for writing, a file system
//! mounted read-write on one of them, or a driver stacked on it
//! (device-mapper, md: `holders` in sysfs). A front end refuses to start
//! while there is one unless told the writes are safe, and then claims the
//! device (`O_EXCL`) so that nothing mounts it meanwhile; a process that
//! opens it for writing later, without `O_EXCL`, cannot be stopped or
//! seen, which the documentation says.
//!
//! The scan reads `/proc/*/fd` and `fdinfo` (all processes only as root;
//! others' are skipped and said so), `/proc/self/mountinfo` and sysfs:
//! once, at start, a few thousand entries.

use std::collections::BTreeSet;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Most writers named in one report (the rest are counted).
const WRITERS_NAMED_MAX: usize = 8;

/// (major, minor) of a block device.
type DevNum = (u32, u32);

/// Every way something other than this process may write the block
/// device at `path` now, one phrase each ("process 1234 (qemu) has it
/// open for writing"); empty if none was found. Processes this user may
/// not inspect are reported as one phrase too.
pub fn other_writers(path: &Path) -> io::Result<Vec<String>> {
    let meta = std::fs::metadata(path)?;
    if !meta.file_type().is_block_device() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a block device", path.display()),
        ));
    }
    let rdev = meta.rdev();
    let device = (libc::major(rdev), libc::minor(rdev));
    let related = related_devices(device);
    let mut found = holders(&related);
    found.extend(read_write_mounts(&related));
    found.extend(writing_processes(&related));
    if found.len() > WRITERS_NAMED_MAX {
        let more = found.len() - WRITERS_NAMED_MAX;
        found.truncate(WRITERS_NAMED_MAX);
        found.push(format!("{more} more"));
    }
    Ok(found)
}

fn sysfs_dir((major, minor): DevNum) -> PathBuf {
    PathBuf::from(format!("/sys/dev/block/{major}:{minor}"))
}

/// Reads a sysfs `dev` file ("8:1").
fn read_devnum(file: &Path) -> Option<DevNum> {
    let text = std::fs::read_to_string(file).ok()?;
    let (major, minor) = text.trim().split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The device, the disk it is a partition of, and that disk's partitions:
/// a write to any of them changes bytes of the device.
fn related_devices(device: DevNum) -> BTreeSet<DevNum> {
    let mut related = BTreeSet::from([device]);
    let Ok(dir) = std::fs::canonicalize(sysfs_dir(device)) else {
        return related;
    };
    let disk = if dir.join("partition").exists() {
        dir.parent().map(Path::to_path_buf)
    } else {
        Some(dir)
    };
    let Some(disk) = disk else {
        return related;
    };
    related.extend(read_devnum(&disk.join("dev")));
    if let Ok(entries) = std::fs::read_dir(&disk) {
        for entry in entries.flatten() {
            let child = entry.path();
            if child.join("partition").exists() {
                related.extend(read_devnum(&child.join("dev")));
            }
        }
    }
    related
}

/// Drivers stacked on the devices (device-mapper, md, bcache).
fn holders(related: &BTreeSet<DevNum>) -> Vec<String> {
    let mut found = Vec::new();
    for &device in related {
        let Ok(entries) = std::fs::read_dir(sysfs_dir(device).join("holders")) else {
            continue;
        };
        for entry in entries.flatten() {
            found.push(format!(
                "{} is stacked on it (device-mapper, md or another driver)",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}

/// File systems mounted read-write on the devices.
fn read_write_mounts(related: &BTreeSet<DevNum>) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for line in text.lines() {
        // id parent major:minor root mountpoint options ...
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(dev), Some(mountpoint), Some(options)) =
            (fields.get(2), fields.get(4), fields.get(5))
        else {
            continue;
        };
        let Some((major, minor)) = dev.split_once(':') else {
            continue;
        };
        let (Ok(major), Ok(minor)) = (major.parse(), minor.parse()) else {
            continue;
        };
        if related.contains(&(major, minor)) && options.split(',').any(|o| o == "rw") {
            found.push(format!(
                "a file system is mounted read-write on it at {mountpoint}"
            ));
        }
    }
    found
}

/// Processes other than this one holding one of the devices open for
/// writing.
fn writing_processes(related: &BTreeSet<DevNum>) -> Vec<String> {
    let own_pid = std::process::id();
    let mut found = Vec::new();
    let mut not_inspected = 0usize;
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for proc_entry in procs.flatten() {
        let Some(pid) = proc_entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == own_pid {
            continue;
        }
        let fd_dir = proc_entry.path().join("fd");
        let fds = match std::fs::read_dir(&fd_dir) {
            Ok(fds) => fds,
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                not_inspected += 1;
                continue;
            }
            Err(_) => continue, // the process ended
        };
        for fd_entry in fds.flatten() {
            if opened_for_writing(&proc_entry.path(), &fd_entry, related) {
                let comm =
                    std::fs::read_to_string(proc_entry.path().join("comm")).unwrap_or_default();
                found.push(format!(
                    "process {pid} ({}) has it open for writing",
                    comm.trim()
                ));
                break;
            }
        }
    }
    if not_inspected > 0 {
        found.push(format!(
            "{not_inspected} processes of other users could not be inspected (run as root to check them)"
        ));
    }
    found
}

/// Whether descriptor `fd_entry` of process `proc_dir` is one of the
/// devices, open for writing (its `fdinfo` flags).
fn opened_for_writing(
    proc_dir: &Path,
    fd_entry: &std::fs::DirEntry,
    related: &BTreeSet<DevNum>,
) -> bool {
    let Ok(meta) = std::fs::metadata(fd_entry.path()) else {
        return false;
    };
    if !meta.file_type().is_block_device() {
        return false;
    }
    let rdev = meta.rdev();
    if !related.contains(&(libc::major(rdev), libc::minor(rdev))) {
        return false;
    }
    let info = proc_dir.join("fdinfo").join(fd_entry.file_name());
    let Ok(text) = std::fs::read_to_string(info) else {
        return false;
    };
    text.lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| i32::from_str_radix(f.trim(), 8).ok())
        .is_some_and(|flags| flags & libc::O_ACCMODE != libc::O_RDONLY)
}
