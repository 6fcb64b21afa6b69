//! The system's memory, as the breathing ARC (`arc::breathe`) reads it.
//!
//! Why this exists. A fixed `arc_max` is either too small (the page cache
//! of every other program then holds more of our working set than we do)
//! or too large (the ARC's buffers are anonymous memory: under a memory
//! cgroup's limit, with no swap, the kernel cannot reclaim them and kills
//! the biggest process instead, which is us or a neighbour). ZFS sizes
//! its ARC from the memory the kernel reports free and gives memory back
//! when the kernel asks; we do the same from user space, which means
//! reading what the kernel publishes:
//!
//! - the host's `MemAvailable` (/proc/meminfo): what can be allocated
//!   without swapping, page cache counted as free (it is reclaimable);
//! - the memory cgroup we run in, if it has a limit (systemd's
//!   `MemoryMax=`, a container's): its limit and its usage, less the
//!   inactive file cache that the kernel reclaims first. Cgroup v1 (a
//!   `memory` hierarchy) and v2 (the unified one) name these differently;
//!   both are read. A limit of "max" (v2) or one near 2^63 (v1) is none;
//! - pressure: PSI (/proc/pressure/memory, and the cgroup's own
//!   `memory.pressure` on v2) says when tasks stall on memory.
//!
//! Polling alone is too slow for a neighbour that allocates a gigabyte a
//! second, so [`Wakeups`] also arms the kernel's notifications: a PSI
//! trigger (`some 100000 1000000`: 100 ms of stall within a second, polled
//! for POLLPRI), on cgroup v1 a usage threshold eventfd registered through
//! `cgroup.event_control` at the limit less `arc_sys_free`, and on v2
//! `memory.events` (POLLPRI when the cgroup hits `memory.high`/`max`).
//! Each is optional: where one cannot be armed (no PSI, no permission)
//! the 100 ms poll still runs, and the reason is kept to be logged.
//!
//! The readers allocate a little (a `String` per file read); they run on
//! the watcher's thread only, ten times a second, never on a read path.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// A cgroup limit at or above this is no limit (v1 writes 2^63 less a page).
const CGROUP_LIMIT_NONE_BYTES: u64 = 1 << 60;

/// Which cgroup interface the memory controller is under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupVersion {
    /// A `memory` hierarchy of its own (/sys/fs/cgroup/memory/...).
    V1,
    /// The unified hierarchy (/sys/fs/cgroup/...).
    V2,
}

/// The memory cgroup this process runs in.
#[derive(Clone, Debug)]
pub struct Cgroup {
    /// v1 or v2.
    pub version: CgroupVersion,
    /// Its directory.
    pub dir: PathBuf,
}

/// One reading of the memory the ARC may use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemorySample {
    /// The host's `MemAvailable`.
    pub host_available_bytes: u64,
    /// The memory cgroup's limit, if it has one.
    pub cgroup_limit_bytes: Option<u64>,
    /// The cgroup's usage less its inactive file cache.
    pub cgroup_usage_bytes: u64,
    /// A pressure notification (PSI trigger, cgroup event) fired since the
    /// last sample.
    pub pressure: bool,
}

impl MemorySample {
    /// What can be allocated now: the host's available memory, or what is
    /// left under the cgroup's limit, whichever is less.
    pub fn available_bytes(&self) -> u64 {
        let cgroup_free = self.cgroup_limit_bytes.map_or(u64::MAX, |limit| {
            limit.saturating_sub(self.cgroup_usage_bytes)
        });
        let available = self.host_available_bytes.min(cgroup_free);
        debug_assert!(available <= self.host_available_bytes);
        available
    }
}

/// Where memory readings come from: the system, or a test's numbers.
pub trait MemorySource: Send {
    /// The memory state now (`pressure` is set by the caller).
    fn sample(&mut self) -> io::Result<MemorySample>;
}

/// The fixed sizes `arc_max = auto` is resolved from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryLimits {
    /// The host's `MemTotal`.
    pub mem_total_bytes: u64,
    /// The memory cgroup's limit (the least of its and its ancestors'), if any.
    pub cgroup_limit_bytes: Option<u64>,
}

impl MemoryLimits {
    /// The memory this process may use at most: the host's, or the
    /// cgroup's limit if less.
    pub fn limit_bytes(&self) -> u64 {
        let limit = self
            .cgroup_limit_bytes
            .map_or(self.mem_total_bytes, |c| c.min(self.mem_total_bytes));
        debug_assert!(limit <= self.mem_total_bytes);
        limit
    }
}

/// `arc_min`'s default (ZFS: max(1/32 of memory, 32 MiB); ours is a
/// user-space cache next to other programs, so a fixed small floor).
pub const ARC_MIN_DEFAULT_BYTES: u64 = 64 << 20;
/// `arc_sys_free`'s least default.
pub const ARC_SYS_FREE_MIN_BYTES: u64 = 256 << 20;
/// What `arc_max = auto` leaves the host at least (of `MemTotal`).
pub const HOST_RESERVE_BYTES: u64 = 1 << 30;
/// The bounds the ARC breathes within, resolved at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreatheConfig {
    /// `c_min` (`arc_min`): the floor.
    pub c_min_bytes: u64,
    /// `c_max`: the ceiling (the LiveArc's `arc_max`).
    pub c_max_bytes: u64,
    /// `arc_sys_free`: memory kept free for everybody else.
    pub arc_sys_free_bytes: u64,
}

impl BreatheConfig {
    /// Resolves `arc_max = auto`: `arc_sys_free` (0 = default: 1/32 of the
    /// limit, at least 256 MiB), the ceiling (all but 1 GiB of `MemTotal`,
    /// or the cgroup's limit less `arc_sys_free`, whichever is less; at
    /// least `floor_bytes`, the least the ARC can be built with) and
    /// `arc_min` (0 = 64 MiB; never above the ceiling).
    pub fn resolve(
        limits: MemoryLimits,
        arc_min_bytes: u64,
        arc_sys_free_bytes: u64,
        floor_bytes: u64,
    ) -> BreatheConfig {
        let arc_sys_free_bytes = if arc_sys_free_bytes == 0 {
            (limits.limit_bytes() / 32).max(ARC_SYS_FREE_MIN_BYTES)
        } else {
            arc_sys_free_bytes
        };
        let host = limits.mem_total_bytes.saturating_sub(HOST_RESERVE_BYTES);
        let cgroup = limits
            .cgroup_limit_bytes
            .map_or(u64::MAX, |l| l.saturating_sub(arc_sys_free_bytes));
        let c_max_bytes = host.min(cgroup).max(floor_bytes);
        let c_min_bytes = if arc_min_bytes == 0 {
            ARC_MIN_DEFAULT_BYTES
        } else {
            arc_min_bytes
        }
        .clamp(floor_bytes, c_max_bytes);
        let config = BreatheConfig {
            c_min_bytes,
            c_max_bytes,
            arc_sys_free_bytes,
        };
        assert!(config.c_min_bytes <= config.c_max_bytes);
        config
    }
}

/// The breathing ARC's counters and gauges (arcstats names), kept in the
/// ARC so that its `stats` reports them. For a fixed `arc_max`, `c_min` =
/// `c_max` = `arc_max` and the rest stay 0.
#[derive(Debug, Default)]
pub(crate) struct MemoryCounters {
    pub c_min: AtomicU64,
    pub c_max: AtomicU64,
    pub arc_no_grow: AtomicU64,
    pub memory_throttle_count: AtomicU64,
    pub memory_available_bytes: AtomicU64,
    pub arc_sys_free: AtomicU64,
    pub arc_shrinks: AtomicU64,
    pub arc_shrunk_bytes: AtomicU64,
}

/// The system's memory: /proc/meminfo and the process's memory cgroup.
pub struct SystemMemory {
    cgroup: Option<Cgroup>,
    /// Reused across reads (the watcher reads ten times a second).
    text: String,
}

impl SystemMemory {
    /// Finds this process's memory cgroup (none if there is no memory
    /// controller or its directory cannot be found).
    pub fn open() -> SystemMemory {
        let cgroup = own_cgroup(Path::new("/sys/fs/cgroup"));
        debug_assert!(cgroup.as_ref().is_none_or(|c| c.dir.is_dir()));
        SystemMemory {
            cgroup,
            text: String::with_capacity(4096),
        }
    }

    /// The memory cgroup, if one was found.
    pub fn cgroup(&self) -> Option<&Cgroup> {
        debug_assert!(self.text.capacity() > 0);
        self.cgroup.as_ref()
    }

    /// `MemTotal` and the cgroup's limit.
    pub fn limits(&mut self) -> io::Result<MemoryLimits> {
        let mem_total_bytes = meminfo_bytes(&mut self.text, "MemTotal:")?;
        let cgroup_limit_bytes = match &self.cgroup {
            Some(c) => cgroup_limit(c, &mut self.text),
            None => None,
        };
        assert!(mem_total_bytes > 0, "MemTotal is never zero");
        Ok(MemoryLimits {
            mem_total_bytes,
            cgroup_limit_bytes,
        })
    }
}

impl MemorySource for SystemMemory {
    fn sample(&mut self) -> io::Result<MemorySample> {
        let host_available_bytes = meminfo_bytes(&mut self.text, "MemAvailable:")?;
        let (cgroup_limit_bytes, cgroup_usage_bytes) = match &self.cgroup {
            Some(c) => match cgroup_limit(c, &mut self.text) {
                Some(limit) => (Some(limit), cgroup_usage(c, &mut self.text)?),
                None => (None, 0),
            },
            None => (None, 0),
        };
        debug_assert!(cgroup_limit_bytes.is_some() || cgroup_usage_bytes == 0);
        Ok(MemorySample {
            host_available_bytes,
            cgroup_limit_bytes,
            cgroup_usage_bytes,
            pressure: false,
        })
    }
}

fn read_into(path: &Path, text: &mut String) -> io::Result<()> {
    text.clear();
    File::open(path)?.read_to_string(text)?;
    debug_assert!(text.len() < 1 << 20, "a kernel file of a megabyte");
    Ok(())
}

/// A `Key:   123 kB` line of /proc/meminfo, in bytes.
fn meminfo_bytes(text: &mut String, key: &str) -> io::Result<u64> {
    debug_assert!(key.ends_with(':'));
    read_into(Path::new("/proc/meminfo"), text)?;
    parse_meminfo(text, key)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("no {key} in meminfo")))
}

/// `key` of a meminfo text (kB) in bytes.
pub(crate) fn parse_meminfo(text: &str, key: &str) -> Option<u64> {
    debug_assert!(key.ends_with(':'));
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line[key.len()..].split_whitespace().next()?.parse().ok()?;
    Some(kb.saturating_mul(1024))
}

/// `key value` in a memory.stat text.
pub(crate) fn parse_stat(text: &str, key: &str) -> Option<u64> {
    debug_assert!(!key.contains(' '));
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// A limit file's value: "max" or a huge number is none.
pub(crate) fn parse_limit(text: &str) -> Option<u64> {
    let text = text.trim();
    if text == "max" {
        return None;
    }
    let bytes: u64 = text.parse().ok()?;
    let limit = (bytes < CGROUP_LIMIT_NONE_BYTES).then_some(bytes);
    debug_assert!(limit.is_none_or(|l| l < CGROUP_LIMIT_NONE_BYTES));
    limit
}

/// This process's memory cgroup under `root` (normally /sys/fs/cgroup),
/// from /proc/self/cgroup.
pub(crate) fn own_cgroup(root: &Path) -> Option<Cgroup> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let (version, mount, relative) = parse_proc_cgroup(&text, root)?;
    let dir = mount.join(relative.trim_start_matches('/'));
    debug_assert!(dir.starts_with(&mount));
    // In a cgroup namespace the path is relative to the namespace's root,
    // which is what is mounted: fall back to the mount itself.
    let dir = if dir.is_dir() { dir } else { mount };
    let limit_file = match version {
        CgroupVersion::V1 => "memory.limit_in_bytes",
        CgroupVersion::V2 => "memory.current",
    };
    dir.join(limit_file)
        .exists()
        .then_some(Cgroup { version, dir })
}

/// The version, mount point and path of the memory cgroup named in a
/// /proc/self/cgroup text.
pub(crate) fn parse_proc_cgroup(
    text: &str,
    root: &Path,
) -> Option<(CgroupVersion, PathBuf, String)> {
    let v1 = text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    });
    let mount_v1 = root.join("memory");
    debug_assert!(mount_v1.starts_with(root));
    if let Some(path) = v1
        && mount_v1.is_dir()
    {
        return Some((CgroupVersion::V1, mount_v1, path));
    }
    let v2 = text
        .lines()
        .find_map(|line| line.strip_prefix("0::").map(str::to_string))?;
    root.join("cgroup.controllers")
        .exists()
        .then(|| (CgroupVersion::V2, root.to_path_buf(), v2))
}

/// The cgroup's limit: v1's hierarchical limit (the least of its and its
/// ancestors'), v2's least `memory.max` up to the root.
fn cgroup_limit(cgroup: &Cgroup, text: &mut String) -> Option<u64> {
    debug_assert!(cgroup.dir.is_absolute());
    match cgroup.version {
        CgroupVersion::V1 => {
            if read_into(&cgroup.dir.join("memory.stat"), text).is_ok()
                && let Some(v) = parse_stat(text, "hierarchical_memory_limit")
            {
                return (v < CGROUP_LIMIT_NONE_BYTES).then_some(v);
            }
            read_into(&cgroup.dir.join("memory.limit_in_bytes"), text).ok()?;
            parse_limit(text)
        }
        CgroupVersion::V2 => {
            let mut least = None::<u64>;
            let mut dir = Some(cgroup.dir.as_path());
            while let Some(d) = dir {
                if read_into(&d.join("memory.max"), text).is_err() {
                    break; // the root has no memory.max
                }
                if let Some(limit) = parse_limit(text) {
                    least = Some(least.map_or(limit, |l| l.min(limit)));
                }
                dir = d.parent();
            }
            least
        }
    }
}

/// The cgroup's usage less the inactive file cache (reclaimed first).
fn cgroup_usage(cgroup: &Cgroup, text: &mut String) -> io::Result<u64> {
    let (usage_file, inactive_key) = match cgroup.version {
        CgroupVersion::V1 => ("memory.usage_in_bytes", "total_inactive_file"),
        CgroupVersion::V2 => ("memory.current", "inactive_file"),
    };
    read_into(&cgroup.dir.join(usage_file), text)?;
    let usage: u64 = text
        .trim()
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, usage_file))?;
    read_into(&cgroup.dir.join("memory.stat"), text)?;
    let inactive = parse_stat(text, inactive_key).unwrap_or(0);
    debug_assert!(usage < CGROUP_LIMIT_NONE_BYTES, "usage {usage} of a cgroup");
    Ok(usage.saturating_sub(inactive))
}

/// What ended a [`Wakeups::wait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// The poll interval passed.
    Timeout,
    /// A pressure notification fired.
    Pressure,
    /// [`Wakeups::stopper`] was signalled.
    Stop,
}

/// The kernel's memory notifications and a stop signal, in one `poll`.
pub struct Wakeups {
    stop: OwnedFd,
    /// PSI trigger (POLLPRI).
    psi: Option<OwnedFd>,
    /// v1 usage threshold eventfd (POLLIN), with the usage file it watches.
    threshold: Option<(OwnedFd, File)>,
    /// v2 memory.events (POLLPRI), re-read after each wake.
    events: Option<File>,
    /// Why a notification could not be armed (for the log).
    pub unarmed: Vec<String>,
}

/// A handle that stops a [`Wakeups::wait`] from another thread.
pub struct Stopper(std::sync::Arc<OwnedFd>);

impl Stopper {
    /// Wakes the waiter with [`Wake::Stop`].
    pub fn stop(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to an eventfd we own.
        let n = unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        debug_assert!(n == 8 || n == -1);
    }
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain system call; the fd is owned below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    debug_assert!(fd >= 0);
    // SAFETY: a new fd no one else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Wakeups {
    /// Arms what it can: a PSI trigger, and the cgroup's notification with
    /// the usage threshold at `threshold_bytes` (v1).
    pub fn arm(
        cgroup: Option<&Cgroup>,
        threshold_bytes: Option<u64>,
    ) -> io::Result<(Wakeups, Stopper)> {
        let stop = eventfd()?;
        let stopper = Stopper(std::sync::Arc::new(stop.try_clone()?));
        let mut unarmed = Vec::new();
        let psi_path = match cgroup {
            Some(c) if c.version == CgroupVersion::V2 => c.dir.join("memory.pressure"),
            _ => PathBuf::from("/proc/pressure/memory"),
        };
        let psi = psi_trigger(&psi_path)
            .map_err(|e| unarmed.push(format!("PSI trigger {}: {e}", psi_path.display())))
            .ok();
        let mut threshold = None;
        let mut events = None;
        match (cgroup, threshold_bytes) {
            (Some(c), Some(bytes)) if c.version == CgroupVersion::V1 => {
                threshold = usage_threshold(c, bytes)
                    .map_err(|e| unarmed.push(format!("cgroup usage threshold: {e}")))
                    .ok();
            }
            (Some(c), _) if c.version == CgroupVersion::V2 => {
                events = File::open(c.dir.join("memory.events"))
                    .map_err(|e| unarmed.push(format!("memory.events: {e}")))
                    .ok();
            }
            _ => {}
        }
        debug_assert!(
            threshold.is_none() || events.is_none(),
            "one cgroup version"
        );
        let wakeups = Wakeups {
            stop,
            psi,
            threshold,
            events,
            unarmed,
        };
        Ok((wakeups, stopper))
    }

    /// Waits up to `timeout` for a notification or the stop signal.
    pub fn wait(&mut self, timeout: Duration) -> Wake {
        const NONE: i32 = -1;
        let fd = |f: Option<i32>| f.unwrap_or(NONE);
        let mut fds = [
            libc::pollfd {
                fd: self.stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: fd(self.psi.as_ref().map(|f| f.as_raw_fd())),
                events: libc::POLLPRI,
                revents: 0,
            },
            libc::pollfd {
                fd: fd(self.threshold.as_ref().map(|(f, _)| f.as_raw_fd())),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: fd(self.events.as_ref().map(|f| f.as_raw_fd())),
                events: libc::POLLPRI,
                revents: 0,
            },
        ];
        let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        debug_assert!(timeout_ms >= 0);
        // SAFETY: `fds` is a live array of pollfd; negative fds are ignored.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if n <= 0 {
            return Wake::Timeout; // EINTR is a timeout: the caller samples
        }
        if fds[0].revents != 0 {
            return Wake::Stop;
        }
        if fds[2].revents & libc::POLLIN != 0
            && let Some((efd, _)) = &self.threshold
        {
            let mut count = [0u8; 8];
            // SAFETY: reads 8 bytes into a live buffer (drains the eventfd).
            let _ = unsafe { libc::read(efd.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
        }
        if fds[3].revents != 0
            && let Some(events) = &mut self.events
        {
            // Re-read to re-arm (kernfs notifies once per change seen).
            let mut text = String::new();
            let _ = events
                .rewind()
                .and_then(|()| events.read_to_string(&mut text));
        }
        if fds[1].revents & (libc::POLLERR | libc::POLLNVAL) != 0 {
            self.psi = None; // the trigger's file went away: stop polling it
        }
        Wake::Pressure
    }
}

/// Opens a PSI file and writes a trigger: 100 ms of "some" stall within a
/// one-second window; without CAP_SYS_RESOURCE (a hardened unit) the
/// kernel takes only windows of whole 2 s, so then 200 ms within 2 s.
fn psi_trigger(path: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    debug_assert!(path.is_absolute());
    let mut last = None;
    for trigger in [&b"some 100000 1000000\0"[..], &b"some 200000 2000000\0"[..]] {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)?;
        match file.write_all(trigger) {
            Ok(()) => return Ok(OwnedFd::from(file)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("two triggers tried"))
}

/// Registers an eventfd on v1's `memory.usage_in_bytes` at `bytes`.
fn usage_threshold(cgroup: &Cgroup, bytes: u64) -> io::Result<(OwnedFd, File)> {
    let efd = eventfd()?;
    let usage = File::open(cgroup.dir.join("memory.usage_in_bytes"))?;
    let line = format!("{} {} {bytes}", efd.as_raw_fd(), usage.as_raw_fd());
    debug_assert!(bytes < CGROUP_LIMIT_NONE_BYTES);
    std::fs::OpenOptions::new()
        .write(true)
        .open(cgroup.dir.join("cgroup.event_control"))?
        .write_all(line.as_bytes())?;
    Ok((efd, usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernels_files() {
        let meminfo = "MemTotal:       24684544 kB\nMemFree:        22374400 kB\nMemAvailable:   24201216 kB\n";
        assert_eq!(parse_meminfo(meminfo, "MemTotal:"), Some(24684544 * 1024));
        assert_eq!(
            parse_meminfo(meminfo, "MemAvailable:"),
            Some(24201216 * 1024)
        );
        assert_eq!(parse_meminfo(meminfo, "SwapTotal:"), None);
        let stat = "cache 47706112\nrss 161640448\ninactive_file 23511040\ntotal_inactive_file 99\nhierarchical_memory_limit 9223372036854771712\n";
        assert_eq!(parse_stat(stat, "inactive_file"), Some(23511040));
        assert_eq!(parse_stat(stat, "total_inactive_file"), Some(99));
        assert_eq!(parse_stat(stat, "file"), None);
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("1073741824\n"), Some(1 << 30));
    }

    #[test]
    fn finds_the_memory_cgroup_of_either_version() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("memory/a/b")).unwrap();
        let v1 = "9:name=systemd:/\n4:memory:/a/b\n0::/\n";
        let (version, mount, path) = parse_proc_cgroup(v1, dir.path()).unwrap();
        assert_eq!(version, CgroupVersion::V1);
        assert_eq!(mount, dir.path().join("memory"));
        assert_eq!(path, "/a/b");
        let v2_root = tempfile::tempdir().unwrap();
        std::fs::write(v2_root.path().join("cgroup.controllers"), "memory\n").unwrap();
        let (version, mount, path) =
            parse_proc_cgroup("0::/system.slice/x.service\n", v2_root.path()).unwrap();
        assert_eq!(version, CgroupVersion::V2);
        assert_eq!(mount, v2_root.path());
        assert_eq!(path, "/system.slice/x.service");
        // Neither: no memory controller at all.
        assert!(parse_proc_cgroup("0::/\n", dir.path().join("nothing").as_path()).is_none());
    }

    #[test]
    fn available_is_the_least_of_host_and_cgroup() {
        let mut s = MemorySample {
            host_available_bytes: 8 << 30,
            cgroup_limit_bytes: Some(1 << 30),
            cgroup_usage_bytes: 768 << 20,
            pressure: false,
        };
        assert_eq!(s.available_bytes(), 256 << 20);
        s.cgroup_usage_bytes = 2 << 30;
        assert_eq!(s.available_bytes(), 0);
        s.cgroup_limit_bytes = None;
        assert_eq!(s.available_bytes(), 8 << 30);
        let limits = MemoryLimits {
            mem_total_bytes: 16 << 30,
            cgroup_limit_bytes: Some(32 << 30),
        };
        assert_eq!(limits.limit_bytes(), 16 << 30);
    }

    /// On this machine's kernel: the readers find numbers, and what can
    /// be armed arms (a failure to arm is reported, never silent).
    #[test]
    fn reads_this_system() {
        let mut memory = SystemMemory::open();
        let limits = memory.limits().unwrap();
        assert!(limits.mem_total_bytes > 0);
        let sample = memory.sample().unwrap();
        assert!(sample.host_available_bytes > 0);
        assert!(sample.host_available_bytes <= limits.mem_total_bytes);
        let (mut wakeups, stopper) = Wakeups::arm(memory.cgroup(), None).unwrap();
        assert!(wakeups.psi.is_some() || !wakeups.unarmed.is_empty());
        stopper.stop();
        assert_eq!(wakeups.wait(Duration::from_secs(10)), Wake::Stop);
    }
}
