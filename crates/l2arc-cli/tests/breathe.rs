//! The breathing ARC (`arc_max = auto`, the default) in a memory cgroup with
//! a limit, as systemd's `MemoryMax=` makes one: under a read load the ARC
//! grows into the cgroup's free memory; a second program in the same cgroup
//! then allocates and touches most of the limit, and must not be OOM-killed:
//! the ARC shrinks within a stated bound, the service lives on, every byte
//! read stays right, and after the program exits the ARC grows again.
//!
//! Why a separate test binary: it makes a cgroup and moves processes into
//! it (root only; it fails loudly otherwise), and its memory figures must
//! not be shared with other tests' servers.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use l2arc_testkit::nbd::NbdClient;
use l2arc_testkit::service::Service;

const MIB: u64 = 1 << 20;
/// The cgroup's limit.
const LIMIT_BYTES: u64 = 1024 * MIB;
/// Larger than the limit: the ARC cannot hold it all.
const IMAGE_BYTES: u64 = 1536 * MIB;
/// What the second program touches: most of what the ARC grew into.
const BALLOON_BYTES: u64 = 600 * MIB;
/// The stated bound: the ARC has shrunk this long after the balloon is full.
const SHRINK_WITHIN: Duration = Duration::from_secs(5);
const READ_BYTES: u32 = 1 << 20;

/// The image's bytes at `offset`: a word per 8 bytes, from its offset.
fn fill_pattern(offset: u64, buf: &mut [u8]) {
    debug_assert!(offset.is_multiple_of(8) && buf.len().is_multiple_of(8));
    for (i, word) in buf.chunks_exact_mut(8).enumerate() {
        let at = offset + 8 * i as u64;
        word.copy_from_slice(&at.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
    }
}

fn write_image(path: &Path) {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut chunk = vec![0u8; 8 << 20];
    for offset in (0..IMAGE_BYTES).step_by(chunk.len()) {
        fill_pattern(offset, &mut chunk);
        file.write_all(&chunk).unwrap();
    }
    file.flush().unwrap();
}

/// A memory cgroup with a limit, made under this process's own (so that
/// nothing outside the test is touched); removed on drop, even after a
/// failure, once the processes in it have gone.
struct Cgroup {
    dir: PathBuf,
    parent: PathBuf,
    v2: bool,
}

impl Cgroup {
    fn make(limit_bytes: u64) -> Cgroup {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert!(
            euid == 0,
            "the breathing test makes a memory cgroup: run it as root"
        );
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let (mount, relative) = if v2 {
            let path = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
            (PathBuf::from("/sys/fs/cgroup"), path.to_string())
        } else {
            let path = own
                .lines()
                .find_map(|l| {
                    let mut parts = l.splitn(3, ':');
                    let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                    controllers
                        .split(',')
                        .any(|c| c == "memory")
                        .then_some(path)
                })
                .expect("a memory controller in /proc/self/cgroup");
            (PathBuf::from("/sys/fs/cgroup/memory"), path.to_string())
        };
        let parent = mount.join(relative.trim_start_matches('/'));
        assert!(parent.is_dir(), "{} is not a directory", parent.display());
        let dir = parent.join(format!("l2arc-breathe-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let cgroup = Cgroup { dir, parent, v2 };
        if v2 {
            // The memory controller must be enabled for the children.
            let _ = std::fs::write(cgroup.parent.join("cgroup.subtree_control"), "+memory");
            std::fs::write(cgroup.dir.join("memory.max"), limit_bytes.to_string()).unwrap();
            let _ = std::fs::write(cgroup.dir.join("memory.swap.max"), "0");
        } else {
            std::fs::write(
                cgroup.dir.join("memory.limit_in_bytes"),
                limit_bytes.to_string(),
            )
            .unwrap();
        }
        cgroup
    }

    /// Makes `command` join the cgroup between fork and exec.
    fn enter(&self, command: &mut Command) {
        let procs = std::ffi::CString::new(
            self.dir
                .join("cgroup.procs")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .unwrap();
        // SAFETY: only async-signal-safe calls (open, write, close) on
        // memory prepared before the fork.
        unsafe {
            command.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // "0": the writing process itself.
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if n != 1 {
                    return Err(std::io::Error::other("cannot join the cgroup"));
                }
                Ok(())
            });
        }
    }

    fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// OOM kills in the cgroup so far.
    fn oom_kills(&self) -> u64 {
        let (file, key) = if self.v2 {
            ("memory.events", "oom_kill ")
        } else {
            ("memory.oom_control", "oom_kill ")
        };
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .map_or(0, |v| v.trim().parse().unwrap())
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for pid in self.pids() {
            // SAFETY: a plain signal to a process of this test's cgroup.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

/// Reads 1 MiB pieces at pseudo-random offsets until told to stop, checking
/// every byte; counts the bytes checked.
fn reader(socket: PathBuf, stop: Arc<AtomicBool>, checked: Arc<AtomicU64>, seed: u64) {
    let mut client = NbdClient::open(&socket).unwrap();
    client.set_timeout(Some(Duration::from_secs(60))).unwrap();
    let pieces = IMAGE_BYTES / u64::from(READ_BYTES);
    let mut state = seed | 1;
    let mut expected = vec![0u8; READ_BYTES as usize];
    while !stop.load(Ordering::Relaxed) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let offset = (state % pieces) * u64::from(READ_BYTES);
        let got = client.read(offset, READ_BYTES).unwrap();
        fill_pattern(offset, &mut expected);
        assert!(got == expected, "wrong bytes at offset {offset}");
        checked.fetch_add(u64::from(READ_BYTES), Ordering::Relaxed);
    }
}

fn stdout_lines(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let out = child.stdout.take().expect("stdout piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The balloon: touches `BALLOON_BYTES` in 16 MiB steps (a page at a time,
/// 20 ms between steps: about 800 MB/s), says "full", holds for 3 s.
const BALLOON: &str = r#"
import sys, time
total = int(sys.argv[1]); step = 16 << 20
held = []
while sum(len(b) for b in held) < total:
    b = bytearray(step)
    b[::4096] = b"\x01" * (step // 4096)
    held.append(b)
    time.sleep(0.02)
print("full", flush=True)
time.sleep(3)
print("done", flush=True)
"#;

#[test]
#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn the_arc_breathes_in_a_memory_cgroup() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    write_image(&image);
    let cgroup = Cgroup::make(LIMIT_BYTES);
    let control = dir.path().join("ctl.sock");
    let mut service = Service::serve_nbd(Path::new(env!("CARGO_BIN_EXE_l2arc")), &image)
        .listen_unix(&dir.path().join("nbd.sock"))
        .args(["--control", control.to_str().unwrap()])
        .args(["--cache", dir.path().join("l2.img").to_str().unwrap()])
        .args(["--cache-size", "512MiB"])
        .ready_within(Duration::from_secs(60));
    cgroup.enter(service.command_mut());
    let mut served = service.start();
    assert!(
        cgroup.pids().contains(&served.pid()),
        "the service is in the cgroup"
    );
    let memory = served
        .next_line("l2arc: memory:", Duration::from_secs(5))
        .expect("a memory line");
    // 1 GiB limit: arc_sys_free 256 MiB (the least default), c_max 768 MiB.
    assert!(
        memory.starts_with(
            "l2arc: memory: arc_max auto: c_max 768 MiB (cgroup limit 1024 MiB - 256 MiB), arc_min 64 MiB, arc_sys_free 256 MiB"
        ),
        "{memory}"
    );
    let stats = ctl(&control, &["stats"]);
    assert_eq!(l2arc_testkit::kstat(&stats, "c_max"), 768 * MIB);
    assert_eq!(l2arc_testkit::kstat(&stats, "c_min"), 64 * MIB);
    assert_eq!(l2arc_testkit::kstat(&stats, "arc_sys_free"), 256 * MIB);

    // A read load: the ARC grows into the cgroup's free memory.
    let stop = Arc::new(AtomicBool::new(false));
    let checked = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..2)
        .map(|i| {
            let (socket, stop, checked) = (
                served.socket().to_path_buf(),
                Arc::clone(&stop),
                Arc::clone(&checked),
            );
            std::thread::spawn(move || reader(socket, stop, checked, 0x5eed + i))
        })
        .collect();
    let grown = Instant::now();
    let mut stats;
    loop {
        stats = ctl(&control, &["stats"]);
        if l2arc_testkit::kstat(&stats, "size") >= 400 * MIB {
            break;
        }
        assert!(
            grown.elapsed() < Duration::from_secs(180),
            "the ARC did not grow past 400 MiB under a read load:\n{stats}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let size_grown = l2arc_testkit::kstat(&stats, "size");
    eprintln!(
        "grown in {:.1} s: size {} MiB, c {} MiB, available {} MiB",
        grown.elapsed().as_secs_f64(),
        size_grown >> 20,
        l2arc_testkit::kstat(&stats, "c") >> 20,
        l2arc_testkit::kstat(&stats, "memory_available_bytes") >> 20
    );
    let shrinks_before = l2arc_testkit::kstat(&stats, "arc_shrinks");
    let (rss_grown, _) = l2arc_testkit::rss_and_peak_bytes(served.pid());

    // The balloon, in the same cgroup, touches most of the limit.
    let oom_before = cgroup.oom_kills();
    let mut balloon = Command::new("python3");
    balloon
        .args(["-c", BALLOON, &BALLOON_BYTES.to_string()])
        .stdout(Stdio::piped());
    cgroup.enter(&mut balloon);
    let mut balloon = balloon
        .spawn()
        .expect("python3 (installed on this machine)");
    let lines = stdout_lines(&mut balloon);
    let full = lines
        .recv_timeout(Duration::from_secs(60))
        .expect("the balloon filled");
    assert_eq!(full, "full");
    let filled = Instant::now();
    let mut shrunk_in = None;
    while filled.elapsed() < SHRINK_WITHIN {
        stats = ctl(&control, &["stats"]);
        // The balloon's bytes, the service's and the reserve fit the limit.
        if l2arc_testkit::kstat(&stats, "size") + BALLOON_BYTES + 256 * MIB <= LIMIT_BYTES {
            shrunk_in = Some(filled.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let size_shrunk = l2arc_testkit::kstat(&stats, "size");
    let (rss_shrunk, _) = l2arc_testkit::rss_and_peak_bytes(served.pid());
    eprintln!(
        "after the balloon: shrunk within {shrunk_in:?} of it filling; service RSS {} MiB -> {} MiB; size {} MiB, c {} MiB, arc_shrinks {}, arc_shrunk_bytes {} MiB, memory_throttle_count {}",
        rss_grown >> 20,
        rss_shrunk >> 20,
        size_shrunk >> 20,
        l2arc_testkit::kstat(&stats, "c") >> 20,
        l2arc_testkit::kstat(&stats, "arc_shrinks"),
        l2arc_testkit::kstat(&stats, "arc_shrunk_bytes") >> 20,
        l2arc_testkit::kstat(&stats, "memory_throttle_count"),
    );
    assert!(
        shrunk_in.is_some(),
        "the ARC still holds {} MiB {SHRINK_WITHIN:?} after a {} MiB balloon filled:\n{stats}",
        size_shrunk >> 20,
        BALLOON_BYTES >> 20
    );
    assert!(l2arc_testkit::kstat(&stats, "arc_shrinks") > shrinks_before);
    // What the ARC let go left the process (malloc_trim after a shrink).
    assert!(
        rss_shrunk + (size_grown - size_shrunk) / 2 <= rss_grown,
        "RSS {} MiB -> {} MiB while the ARC went {} MiB -> {} MiB",
        rss_grown >> 20,
        rss_shrunk >> 20,
        size_grown >> 20,
        size_shrunk >> 20
    );
    assert!(l2arc_testkit::kstat(&stats, "memory_throttle_count") > 0);
    let status = balloon.wait().unwrap();
    assert!(status.success(), "the balloon was killed: {status:?}");
    assert_eq!(lines.recv().unwrap(), "done");
    assert_eq!(cgroup.oom_kills(), oom_before, "an OOM kill in the cgroup");
    assert!(
        cgroup.pids().contains(&served.pid()),
        "the service is alive and in the cgroup"
    );

    // The balloon gone, the ARC grows again (no_grow lasts about 2 s).
    let regrow = Instant::now();
    loop {
        stats = ctl(&control, &["stats"]);
        if l2arc_testkit::kstat(&stats, "size") >= size_shrunk + 200 * MIB {
            break;
        }
        assert!(
            regrow.elapsed() < Duration::from_secs(120),
            "the ARC did not grow again after the balloon left:\n{stats}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "grown again in {:.1} s: size {} MiB, c {} MiB",
        regrow.elapsed().as_secs_f64(),
        l2arc_testkit::kstat(&stats, "size") >> 20,
        l2arc_testkit::kstat(&stats, "c") >> 20
    );
    assert_eq!(l2arc_testkit::kstat(&stats, "arc_no_grow"), 0);

    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("a reader found wrong bytes or failed");
    }
    assert!(checked.load(Ordering::Relaxed) >= 1 << 30);
    let (status, _) = served.stop();
    assert!(status.success(), "{status:?}");
    assert_eq!(cgroup.oom_kills(), oom_before);
}

/// `l2arc ctl --socket SOCKET ARGS...` (the testkit's, with this binary).
fn ctl(socket: &std::path::Path, args: &[&str]) -> String {
    l2arc_testkit::ctl(Path::new(env!("CARGO_BIN_EXE_l2arc")), socket, args)
}
