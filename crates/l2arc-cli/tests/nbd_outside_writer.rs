//! `l2arc serve-nbd` while something else writes its image: an image file
//! written behind a running export is seen (inotify, a flush, the timer)
//! and its old bytes are never served after that; a block device that
//! another process holds open for writing is refused unless
//! `--shared-writer-unsafe` says the writes are safe.

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use l2arc_testkit::mapping::SharedMapping;
use l2arc_testkit::nbd::{LoopDevice, pattern};
use l2arc_testkit::service::{Running, Service};

const IMAGE_BYTES: usize = 16 << 20;
const BLOCK_BYTES: usize = 4096;

/// serve-nbd on `image` in `dir` with `extra` flags.
fn serve(image: &Path, dir: &Path, extra: &[&str]) -> Running {
    Service::serve_nbd(Path::new(env!("CARGO_BIN_EXE_l2arc")), image)
        .listen_unix(&dir.join("nbd.sock"))
        .args(["--arc-max", "8MiB"])
        .args(extra)
        .start()
}

/// The whole export, read by nbdcopy.
fn read_all(served: &Running, dir: &Path) -> Vec<u8> {
    let out = dir.join("copy.raw");
    l2arc_testkit::run(
        l2arc_testkit::tool("nbdcopy", "libnbd-bin")
            .arg(served.uri())
            .arg(&out),
    );
    std::fs::read(out).unwrap()
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
fn served_within(served: &Running, dir: &Path, want: &[u8], within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let got = read_all(served, dir);
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
    let mut served = serve(
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
        assert_eq!(read_all(&served, dir.path()), pattern(IMAGE_BYTES, 1));
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
    let stopped = served.stop_line();
    let changes: u64 = stopped
        .split(", ")
        .find_map(|p| p.strip_suffix(" image changes seen behind the export"))
        .expect("the stop line counts image changes")
        .parse()
        .unwrap();
    assert!(changes >= 3, "{stopped}");
}

/// Writes `bytes` at `offset` through a shared mapping of the file and
/// syncs it (the mtime moves; inotify reports nothing); the file's bytes.
fn write_through_mapping(image: &Path, offset: usize, bytes: &[u8]) -> Vec<u8> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .unwrap();
    SharedMapping::new(&f, IMAGE_BYTES, true).write_and_sync(offset, bytes);
    std::fs::read(image).unwrap()
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
    let mut served = serve(&device.0, dir.path(), &["--shared-writer-unsafe"]);
    assert_eq!(read_all(&served, dir.path()), pattern(8 << 20, 3));
    served.stop_line();
    writer.kill().unwrap();
    writer.wait().unwrap();
    // A reader is no writer; the device is claimed while exported.
    let mut reader = hold_open(&device.0, "<");
    std::thread::sleep(Duration::from_millis(300));
    let mut served = serve(&device.0, dir.path(), &[]);
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
    assert_eq!(read_all(&served, dir.path()), pattern(8 << 20, 3));
    served.stop_line();
    reader.kill().unwrap();
    reader.wait().unwrap();
}
