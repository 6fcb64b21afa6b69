//! `l2arc serve-nbd` while something else writes its image: an image file
//! written behind a running export is seen (inotify, a flush, the timer)
//! and its old bytes are never served after that; a block device that
//! another process holds open for writing is refused unless
//! `--shared-writer-unsafe` says the writes are safe.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const IMAGE_BYTES: usize = 16 << 20;
const BLOCK_BYTES: usize = 4096;

/// Deterministic bytes, different per seed.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

struct Served {
    socket: PathBuf,
    child: Child,
    stderr: mpsc::Receiver<String>,
}

impl Served {
    fn start(image: &Path, dir: &Path, extra: &[&str]) -> Served {
        let socket = dir.join("nbd.sock");
        let mut child = Command::new(env!("CARGO_BIN_EXE_l2arc"))
            .arg("serve-nbd")
            .arg(image)
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .args(["--arc-max", "8MiB"])
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = l2arc_testkit::stderr_lines(&mut child);
        std::iter::from_fn(|| stderr.recv_timeout(Duration::from_secs(20)).ok())
            .find(|line| line.starts_with("l2arc: serving "))
            .expect("serve-nbd printed no ready line within 20 s");
        Served {
            socket,
            child,
            stderr,
        }
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    /// The whole export, read by nbdcopy.
    fn read_all(&self, dir: &Path) -> Vec<u8> {
        let out = dir.join("copy.raw");
        l2arc_testkit::run(
            l2arc_testkit::tool("nbdcopy", "libnbd-bin")
                .arg(self.uri())
                .arg(&out),
        );
        std::fs::read(out).unwrap()
    }

    /// SIGTERM; the stop line.
    fn stop(mut self) -> String {
        l2arc_testkit::run(Command::new("kill").args(["-TERM", &self.child.id().to_string()]));
        assert!(self.child.wait().unwrap().success());
        std::iter::from_fn(|| self.stderr.recv_timeout(Duration::from_secs(10)).ok())
            .find(|l| l.starts_with("l2arc: stopped:"))
            .expect("a stop line")
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Overwrites `blocks` of the file with `seed`'s bytes as another process
/// would (plain buffered writes); returns the file's new content.
fn write_behind(image: &Path, blocks: &[usize], seed: u64) -> Vec<u8> {
    let mut f = std::fs::OpenOptions::new().write(true).open(image).unwrap();
    for &b in blocks {
        f.seek(SeekFrom::Start((b * BLOCK_BYTES) as u64)).unwrap();
        f.write_all(&pattern(BLOCK_BYTES, seed + b as u64)).unwrap();
    }
    drop(f);
    std::fs::read(image).unwrap()
}

/// Reads the export until it matches `want`, for at most `within`.
fn served_within(served: &Served, dir: &Path, want: &[u8], within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let got = served.read_all(dir);
        if got == want {
            return started.elapsed();
        }
        let wrong = got
            .chunks(BLOCK_BYTES)
            .zip(want.chunks(BLOCK_BYTES))
            .filter(|(a, b)| a != b)
            .count();
        assert!(
            started.elapsed() < within,
            "{wrong} blocks still old after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Warm in the ARC and on flash, then written behind the export three
/// ways: plain writes (inotify sees them: new bytes within 2 s), a write
/// followed by a client's flush (new bytes at once, read by the client
/// that flushed), and writes through a shared mapping, which inotify does
/// not see (the timer: new bytes within 2 s of `--revalidate-secs 0.5`).
#[test]
fn an_image_written_behind_a_running_export_is_never_served_stale() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    std::fs::write(&image, pattern(IMAGE_BYTES, 1)).unwrap();
    let cache = dir.path().join("cache.img");
    let served = Served::start(
        &image,
        dir.path(),
        &[
            "--cache",
            cache.to_str().unwrap(),
            "--cache-size",
            "64MiB",
            "--revalidate-secs",
            "0.5",
        ],
    );
    // Warm: read twice (the second time from the ARC and flash).
    for _ in 0..2 {
        assert_eq!(served.read_all(dir.path()), pattern(IMAGE_BYTES, 1));
    }
    // 1. Plain writes by another process, 418 blocks as in the report.
    let blocks: Vec<usize> = (0..418)
        .map(|i| i * 9 % (IMAGE_BYTES / BLOCK_BYTES))
        .collect();
    let want = write_behind(&image, &blocks, 100);
    served_within(&served, dir.path(), &want, Duration::from_secs(2));
    // 2. A write, then a client that flushes reads the new bytes at once.
    let want = write_behind(&image, &[5, 6], 200);
    let at = 5 * BLOCK_BYTES;
    let check = dir.path().join("expected.raw");
    std::fs::write(&check, &want[at..at + 2 * BLOCK_BYTES]).unwrap();
    let out = l2arc_testkit::run(l2arc_testkit::tool("qemu-io", "qemu-utils").args([
        "-f",
        "raw",
        &served.uri(),
        "-c",
        "flush",
        "-c",
        &format!("read -v {at} {}", 2 * BLOCK_BYTES),
    ]));
    let dumped = String::from_utf8_lossy(&out.stdout);
    let first_line = &want[at..at + 16];
    let hex: Vec<String> = first_line.iter().map(|b| format!("{b:02x}")).collect();
    assert!(
        dumped.contains(&hex.join(" ")),
        "the flushing client read old bytes: {dumped}"
    );
    // 3. Writes through a shared mapping: no inotify event; the timer.
    let want = write_through_mapping(&image, 7 * BLOCK_BYTES, &pattern(BLOCK_BYTES, 300));
    served_within(&served, dir.path(), &want, Duration::from_secs(3));
    let stopped = served.stop();
    let changes: u64 = stopped
        .split(", ")
        .find_map(|p| p.strip_suffix(" image changes seen behind the export"))
        .expect("the stop line counts image changes")
        .parse()
        .unwrap();
    assert!(changes >= 3, "{stopped}");
}

/// Writes `bytes` at `offset` through a shared mapping of the file and
/// syncs it (the mtime moves; inotify reports nothing).
fn write_through_mapping(image: &Path, offset: usize, bytes: &[u8]) -> Vec<u8> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh shared mapping of the whole file, unmapped below;
    // nothing else in this process touches it.
    unsafe {
        let map = libc::mmap(
            std::ptr::null_mut(),
            IMAGE_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(map, libc::MAP_FAILED);
        let dst = std::slice::from_raw_parts_mut(map.cast::<u8>(), IMAGE_BYTES);
        dst[offset..offset + bytes.len()].copy_from_slice(bytes);
        assert_eq!(libc::msync(map, IMAGE_BYTES, libc::MS_SYNC), 0);
        assert_eq!(libc::munmap(map, IMAGE_BYTES), 0);
    }
    let mut all = Vec::new();
    std::fs::File::open(image)
        .unwrap()
        .read_to_end(&mut all)
        .unwrap();
    all
}

/// A loop device detached on drop.
struct LoopDevice(PathBuf);

impl LoopDevice {
    fn attach(backing: &Path) -> LoopDevice {
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(backing)
            .output()
            .expect(
                "cannot run losetup: this test needs util-linux's losetup, root and loop devices",
            );
        assert!(
            out.status.success(),
            "losetup failed (needs root and loop devices): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        LoopDevice(PathBuf::from(
            String::from_utf8(out.stdout).unwrap().trim().to_string(),
        ))
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

/// A process that holds `device` open (`<>` for writing, `<` for
/// reading) until killed.
fn hold_open(device: &Path, mode: &str) -> Child {
    Command::new("bash")
        .arg("-c")
        .arg(format!("exec 3{mode}{}; exec sleep 600", device.display()))
        .spawn()
        .unwrap()
}

/// A block device another process holds open for writing is refused with
/// one line that names the process and the way out; a reader does not
/// stop it; `--shared-writer-unsafe` exports it anyway. While it is
/// exported without that flag the device is claimed: an exclusive open
/// (what mount does) fails.
#[test]
fn a_block_device_held_open_for_writing_is_refused_unless_unsafe() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing.img");
    std::fs::write(&backing, pattern(8 << 20, 3)).unwrap();
    let device = LoopDevice::attach(&backing);
    let mut writer = hold_open(&device.0, "<>");
    // Give bash the moment it takes to open the device and exec.
    std::thread::sleep(Duration::from_millis(300));
    let socket = dir.path().join("refused.sock");
    let out = Command::new(env!("CARGO_BIN_EXE_l2arc"))
        .arg("serve-nbd")
        .arg(&device.0)
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .args(["--arc-max", "8MiB"])
        .output()
        .unwrap();
    l2arc_testkit::assert_one_line_error(
        &out,
        "l2arc",
        &format!("process {} (sleep) has it open for writing", writer.id()),
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("--shared-writer-unsafe"), "{said}");
    let served = Served::start(&device.0, dir.path(), &["--shared-writer-unsafe"]);
    assert_eq!(served.read_all(dir.path()), pattern(8 << 20, 3));
    served.stop();
    writer.kill().unwrap();
    writer.wait().unwrap();
    // A reader is no writer; the device is claimed while exported.
    let mut reader = hold_open(&device.0, "<");
    std::thread::sleep(Duration::from_millis(300));
    let served = Served::start(&device.0, dir.path(), &[]);
    let exclusive = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(&device.0)
    };
    assert_eq!(
        exclusive.unwrap_err().raw_os_error(),
        Some(libc::EBUSY),
        "the export claims the device"
    );
    assert_eq!(served.read_all(dir.path()), pattern(8 << 20, 3));
    served.stop();
    reader.kill().unwrap();
    reader.wait().unwrap();
}
