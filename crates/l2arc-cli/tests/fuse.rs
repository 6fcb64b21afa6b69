//! `l2arc mount`: the FUSE front end driven by real programs (fio, cp, tar,
//! diff) and by changes made to the source behind the mount's back.
//!
//! Every test mounts its own temporary tree and unmounts it in a Drop guard,
//! even when an assertion fails, so no mount outlives a test. A missing tool
//! is a failure that says to run scripts/setup.sh, never a skip.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use l2arc_testkit::mapping::SharedMapping;
use l2arc_testkit::service::{Running, Service};
use l2arc_testkit::within;

const ATTR_TIMEOUT_SECS: f64 = 0.2;

fn need(tool: &str) {
    let ok = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "`{tool}` is missing or broken: run scripts/setup.sh");
}

fn run(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&l2arc_testkit::run(cmd).stdout).into_owned()
}

fn is_mounted(mnt: &Path) -> bool {
    l2arc_fuse::is_mounted(mnt).expect("read /proc/mounts")
}

/// A running `l2arc mount`, unmounted and reaped on drop.
struct Mount {
    service: Running,
    /// The process has exited and was reaped.
    exited: bool,
    mnt: PathBuf,
    stderr: Arc<Mutex<String>>,
}

impl Mount {
    fn start(src: &Path, mnt: &Path, extra: &[&str]) -> Mount {
        need("fusermount3");
        let mut service = Service::mount(Path::new(env!("CARGO_BIN_EXE_l2arc")), src, mnt)
            .args(["--arc-max", "64MiB"]);
        if !extra.contains(&"--attr-timeout") {
            service = service.args(["--attr-timeout", &ATTR_TIMEOUT_SECS.to_string()]);
        }
        let mut service = service.args(extra).start();
        let stderr = service.gather_stderr();
        assert!(
            is_mounted(mnt),
            "ready line printed but {mnt:?} is not mounted"
        );
        Mount {
            service,
            exited: false,
            mnt: mnt.to_path_buf(),
            stderr,
        }
    }

    fn pid(&self) -> u32 {
        assert!(!self.exited, "running");
        self.service.pid()
    }

    fn signal(&self, signal: &str) {
        run(Command::new("kill").args([signal, &self.pid().to_string()]));
    }

    /// Waits for the process to exit (at most `limit`).
    fn wait(&mut self, limit: Duration) -> ExitStatus {
        assert!(!self.exited, "running");
        let start = Instant::now();
        loop {
            if let Some(status) = self.service.child.try_wait().expect("try_wait") {
                self.exited = true;
                return status;
            }
            assert!(
                start.elapsed() < limit,
                "l2arc mount did not exit within {limit:?}; stderr:\n{}",
                self.stderr.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(mut self) -> (ExitStatus, String) {
        self.signal("-TERM");
        let status = self.wait(Duration::from_secs(15));
        // Let the reader thread drain the last lines.
        std::thread::sleep(Duration::from_millis(100));
        let log = self.stderr.lock().unwrap().clone();
        (status, log)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if !self.exited {
            let child = &mut self.service.child;
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .stderr(Stdio::null())
                .status();
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.mnt)
                .status();
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

/// A temporary directory holding `src` and `mnt`.
fn tree() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().canonicalize().unwrap();
    let src = root.join("src");
    let mnt = root.join("mnt");
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    (dir, src, mnt)
}

/// Deterministic bytes: `len` bytes of a stream keyed by `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn settle() {
    // Past the attribute TTL the kernel asks us again.
    std::thread::sleep(Duration::from_secs_f64(ATTR_TIMEOUT_SECS * 1.5));
}

#[test]
fn fio_write_then_verify_through_the_mount() {
    need("fio");
    let (_dir, src, mnt) = tree();
    let m = Mount::start(&src, &mnt, &[]);
    for (rw, bs, size) in [("randwrite", "4k", "8M"), ("write", "128k", "16M")] {
        run(Command::new("fio")
            .arg(format!("--name=v-{rw}"))
            .arg(format!("--directory={}", mnt.display()))
            .current_dir(src.parent().unwrap())
            .args(["--ioengine=psync", "--fallocate=none", "--verify=crc32c"])
            .arg("--verify_state_save=0")
            .arg(format!("--rw={rw}"))
            .arg(format!("--bs={bs}"))
            .arg(format!("--size={size}"))
            .args(["--numjobs=2", "--do_verify=1", "--verify_fatal=1"]));
        // Verify again from fresh opens: reads come through our cache, not
        // from pages the writer left in the kernel.
        run(Command::new("fio")
            .arg(format!("--name=v-{rw}"))
            .arg(format!("--directory={}", mnt.display()))
            .current_dir(src.parent().unwrap())
            .args(["--ioengine=psync", "--fallocate=none", "--verify=crc32c"])
            .arg("--verify_state_save=0")
            .arg(format!("--rw={rw}"))
            .arg(format!("--bs={bs}"))
            .arg(format!("--size={size}"))
            .args(["--numjobs=2", "--verify_only", "--verify_fatal=1"]));
    }
    let mut files = 0;
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_owned();
        let through = std::fs::read(mnt.join(&name)).unwrap();
        assert!(std::fs::read(&path).unwrap() == through, "{name:?} differs");
        files += 1;
    }
    assert_eq!(files, 4, "two jobs of two runs, each a file in SRC");
    let (status, log) = m.stop();
    assert!(status.success(), "{status}: {log}");
    assert!(log.contains("\nhits "), "stats on exit: {log}");
}

/// Builds a varied tree: nested dirs, odd sizes, empty file, symlink, modes.
fn make_tree(root: &Path) {
    std::fs::create_dir_all(root.join("a/b/c")).unwrap();
    std::fs::create_dir_all(root.join("empty")).unwrap();
    let sizes = [0usize, 1, 4095, 4096, 4097, 131_072, 131_073, 1_048_583];
    for (i, size) in sizes.iter().enumerate() {
        let dir = ["", "a", "a/b", "a/b/c"][i % 4];
        std::fs::write(
            root.join(dir).join(format!("f{i}")),
            pattern(i as u64, *size),
        )
        .unwrap();
    }
    std::fs::set_permissions(root.join("a/f1"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(root.join("f0"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("b/c/f3", root.join("a/link")).unwrap();
}

#[test]
fn cp_diff_and_tar_match_the_source() {
    need("cp");
    need("diff");
    need("tar");
    let (dir, src, mnt) = tree();
    let orig = dir.path().join("orig");
    make_tree(&orig);
    let m = Mount::start(&src, &mnt, &[]);
    run(Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", orig.display()))
        .arg(mnt.join("copy")));
    run(Command::new("diff")
        .args(["-r", "--no-dereference"])
        .arg(&orig)
        .arg(mnt.join("copy")));
    run(Command::new("diff")
        .args(["-r", "--no-dereference"])
        .arg(&orig)
        .arg(src.join("copy")));
    assert_eq!(
        std::fs::metadata(src.join("copy/a/f1")).unwrap().mode() & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::read_link(mnt.join("copy/a/link")).unwrap(),
        Path::new("b/c/f3")
    );
    let tar = |root: &Path| {
        let out = Command::new("tar")
            .args(["--sort=name", "--numeric-owner", "-cf", "-", "-C"])
            .arg(root)
            .arg("copy")
            .output()
            .expect("tar");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let through = tar(&mnt);
    let direct = tar(&src);
    assert!(through.len() > 1 << 20);
    assert!(through == direct, "tar of MNT differs from tar of SRC");
    drop(m);
    assert!(!is_mounted(&mnt));
}

#[test]
fn changes_behind_the_mount_are_seen() {
    let (_dir, src, mnt) = tree();
    let path = src.join("f");
    let a = pattern(1, 300_000);
    std::fs::write(&path, &a).unwrap();
    let m = Mount::start(&src, &mnt, &[]);
    assert!(std::fs::read(mnt.join("f")).unwrap() == a);
    assert!(std::fs::read(mnt.join("f")).unwrap() == a, "a hit");

    // Rewritten in place, same size.
    std::thread::sleep(Duration::from_millis(50));
    let b = pattern(2, 300_000);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .write_all_at(&b, 0)
        .unwrap();
    settle();
    assert!(
        std::fs::read(mnt.join("f")).unwrap() == b,
        "same-size rewrite"
    );

    // Rewritten with another size (shorter, then longer).
    std::thread::sleep(Duration::from_millis(50));
    let c = pattern(3, 100_001);
    std::fs::write(&path, &c).unwrap();
    settle();
    assert!(
        std::fs::read(mnt.join("f")).unwrap() == c,
        "shorter rewrite"
    );
    let c2 = pattern(4, 700_000);
    std::fs::write(&path, &c2).unwrap();
    settle();
    assert!(
        std::fs::read(mnt.join("f")).unwrap() == c2,
        "longer rewrite"
    );

    // Replaced by rename (a new inode under the name).
    let d = pattern(5, 700_000);
    std::fs::write(src.join("f.tmp"), &d).unwrap();
    std::fs::rename(src.join("f.tmp"), &path).unwrap();
    settle();
    assert!(
        std::fs::read(mnt.join("f")).unwrap() == d,
        "replaced by rename"
    );

    // New and removed names behind the mount.
    std::fs::write(src.join("new"), b"new").unwrap();
    settle();
    assert_eq!(std::fs::read(mnt.join("new")).unwrap(), b"new");
    std::fs::remove_file(src.join("new")).unwrap();
    settle();
    assert!(!mnt.join("new").exists());
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
}

const BLOCK: usize = 4096;
const BLOCKS: usize = 512; // 2 MiB
const VERSIONS: u32 = 12;

fn block(index: usize, version: u32) -> Vec<u8> {
    let word = ((index as u64) << 32 | u64::from(version)).to_le_bytes();
    word.iter().copied().cycle().take(BLOCK).collect()
}

/// Checks one block read while the writer may be rewriting it; returns the
/// oldest version any of its words holds.
///
/// Each 8-byte word must hold its own block's index and a version that was
/// written, and no word may be older than `floor`: the oldest version an
/// earlier read of the block saw in every word. A whole block is not
/// required: a read that races with a write of the same page may see part
/// of each on the source file system itself (ext4 copies a page to and
/// from user memory without a lock that orders readers and writers), so the
/// mount cannot promise more. What it must never do is return bytes older
/// than a read already returned: a stale record served after a fresh one.
fn check_block(data: &[u8], index: usize, floor: u32) -> u32 {
    let mut oldest = u32::MAX;
    for (w, word) in data.chunks(8).enumerate() {
        let word = u64::from_le_bytes(word.try_into().unwrap());
        let (word_index, version) = ((word >> 32) as usize, word as u32);
        assert!(
            word_index == index && version <= VERSIONS,
            "block {index} word {w}: block {word_index} version {version}"
        );
        assert!(
            version >= floor,
            "block {index} word {w}: version {version} after a read saw {floor} in every word (stale bytes)"
        );
        oldest = oldest.min(version);
    }
    oldest
}

#[test]
fn concurrent_readers_and_a_writer_never_see_stale_bytes() {
    let (_dir, src, mnt) = tree();
    let initial: Vec<u8> = (0..BLOCKS).flat_map(|i| block(i, 0)).collect();
    std::fs::write(src.join("shared"), &initial).unwrap();
    let m = Mount::start(&src, &mnt, &[]);
    let file = mnt.join("shared");
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|r| {
            let file = file.clone();
            let done = Arc::clone(&done);
            std::thread::spawn(move || {
                let mut checked = 0usize;
                let mut floor = vec![0u32; BLOCKS];
                let mut x = 0x1234_5678u64 + r;
                while !done.load(std::sync::atomic::Ordering::Relaxed) || checked == 0 {
                    let f = std::fs::File::open(&file).unwrap();
                    for _ in 0..64 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let first = (x as usize) % BLOCKS;
                        let count = 1 + (x >> 40) as usize % 16;
                        let count = count.min(BLOCKS - first);
                        let mut buf = vec![0u8; count * BLOCK];
                        f.read_exact_at(&mut buf, (first * BLOCK) as u64).unwrap();
                        for (k, chunk) in buf.chunks(BLOCK).enumerate() {
                            let b = first + k;
                            floor[b] = check_block(chunk, b, floor[b]);
                            checked += 1;
                        }
                    }
                }
                checked
            })
        })
        .collect();
    let writer = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    for version in 1..=VERSIONS {
        for step in 0..BLOCKS {
            let index = (step * 97 + version as usize) % BLOCKS; // all blocks, scattered
            writer
                .write_all_at(&block(index, version), (index * BLOCK) as u64)
                .unwrap();
        }
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        assert!(r.join().expect("reader panicked") > 0);
    }
    drop(writer);
    let mut through = Vec::new();
    std::fs::File::open(&file)
        .unwrap()
        .read_to_end(&mut through)
        .unwrap();
    let direct = std::fs::read(src.join("shared")).unwrap();
    assert_eq!(through.len(), BLOCKS * BLOCK);
    for (i, chunk) in through.chunks(BLOCK).enumerate() {
        assert_eq!(
            check_block(chunk, i, 0),
            VERSIONS,
            "block {i} after the writer"
        );
    }
    assert!(through == direct);
    drop(m);
}

/// What `rewrite_stress` found: pages checked, versions written, and the
/// first read that went back in time, if any.
struct Stress {
    checked: u64,
    versions: u32,
    stale: Option<String>,
}

/// Pages of the file `rewrite_stress` rewrites: one 128 KiB record, so
/// that the readers and the writer meet often.
const STRESS_PAGES: usize = 32;

/// One reader of `rewrite_stress` until `done`: random runs of pages of
/// `path`, reopened every 64 reads, through a shared mapping of each open
/// if `mapped` (its page faults ask for no attributes). Each page must be
/// of a version written (at most the one after `finished`) and no older
/// than the oldest word of what this reader last saw of it. Returns the
/// pages checked and, if one went back in time, what it saw.
fn stress_reader(
    path: &Path,
    seed: u64,
    mapped: bool,
    done: &std::sync::atomic::AtomicBool,
    finished: &std::sync::atomic::AtomicU32,
) -> (u64, Option<String>) {
    use std::sync::atomic::Ordering;
    let mut floor = [0u32; STRESS_PAGES];
    let mut checked = 0u64;
    let mut x = 0x9e37_79b9u64 + seed;
    while !done.load(Ordering::Relaxed) {
        let f = std::fs::File::open(path).unwrap();
        let map = mapped.then(|| SharedMapping::new(&f, STRESS_PAGES * BLOCK, false));
        for _ in 0..64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let first = (x as usize) % STRESS_PAGES;
            let count = (1 + (x >> 40) as usize % 4).min(STRESS_PAGES - first);
            let buf = match &map {
                Some(map) => map.bytes()[first * BLOCK..][..count * BLOCK].to_vec(),
                None => {
                    let mut buf = vec![0u8; count * BLOCK];
                    f.read_exact_at(&mut buf, (first * BLOCK) as u64).unwrap();
                    buf
                }
            };
            // At most the version being written when the read ended.
            let newest = finished.load(Ordering::SeqCst) + 1;
            for (k, page) in buf.chunks(BLOCK).enumerate() {
                let b = first + k;
                let mut oldest = u32::MAX;
                for (w, word) in page.chunks(8).enumerate() {
                    let word = u64::from_le_bytes(word.try_into().unwrap());
                    let (index, version) = ((word >> 32) as usize, word as u32);
                    assert!(
                        index == b && version <= newest,
                        "page {b} word {w}: page {index} version {version}"
                    );
                    if version < floor[b] {
                        let seen = floor[b];
                        return (
                            checked,
                            Some(format!(
                                "reader {seed}, page {b} word {w}: version {version} after a \
                                 read saw {seen} in every word (stale bytes)"
                            )),
                        );
                    }
                    oldest = oldest.min(version);
                }
                floor[b] = oldest;
                checked += 1;
            }
        }
    }
    (checked, None)
}

/// Rewrites every page of `path` with a new version, one whole page per
/// write, in a scattered order, for `secs`, while `readers` threads check
/// that no read returns a page older than one the same thread has already
/// seen in every word (`stress_reader`; the last one reads through shared
/// mappings). After each version the writer reads the file through a
/// shared mapping made at the start and from a fresh open: every page must
/// be that version (a finished write is seen by every read that starts
/// after it, a mapping's too).
fn rewrite_stress(path: &Path, readers: usize, secs: f64) -> Stress {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    let bytes = STRESS_PAGES * BLOCK;
    let initial: Vec<u8> = (0..STRESS_PAGES).flat_map(|i| block(i, 0)).collect();
    std::fs::write(path, initial).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicU32::new(0));
    let threads: Vec<_> = (0..readers)
        .map(|r| {
            let path = path.to_path_buf();
            let (done, finished) = (Arc::clone(&done), Arc::clone(&finished));
            let mapped = r + 1 == readers;
            std::thread::spawn(move || stress_reader(&path, r as u64, mapped, &done, &finished))
        })
        .collect();
    let writer = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let map = SharedMapping::new(&std::fs::File::open(path).unwrap(), bytes, false);
    let mut stress = Stress {
        checked: 0,
        versions: 0,
        stale: None,
    };
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs && stress.stale.is_none() {
        let version = stress.versions + 1;
        for step in 0..STRESS_PAGES {
            let index = (step * 7 + version as usize) % STRESS_PAGES;
            writer
                .write_all_at(&block(index, version), (index * BLOCK) as u64)
                .unwrap();
        }
        // The mapping first: an open without KEEP_CACHE drops its pages.
        let mapped = map.bytes();
        let mut read = vec![0u8; bytes];
        std::fs::File::open(path)
            .unwrap()
            .read_exact_at(&mut read, 0)
            .unwrap();
        for (how, after) in [("mapping", mapped), ("read", read)] {
            let is_version = |b: usize| after[b * BLOCK..][..BLOCK] == block(b, version)[..];
            if let Some(b) = (0..STRESS_PAGES).find(|&b| !is_version(b)) {
                stress.stale = stress.stale.take().or(Some(format!(
                    "page {b} through a {how} after version {version} was written: not that version"
                )));
            }
        }
        finished.store(version, Ordering::SeqCst);
        stress.versions = version;
    }
    done.store(true, Ordering::Relaxed);
    for t in threads {
        let (checked, stale) = t.join().expect("reader panicked");
        stress.checked += checked;
        stress.stale = stress.stale.take().or(stale);
    }
    stress
}

/// Readers of a file that a writer keeps rewriting a page at a time never
/// go back in time through the mount, and see each write once it returned.
/// Without direct writes (`namespace/dir/open.rs` in l2arc-fuse) the kernel
/// put a written page into its page cache before the write reached the
/// mount; a page dropped meanwhile was read again from the source's old
/// bytes: a reader saw a page older than one it had seen, or the old bytes
/// stayed in the page cache after the write returned. That failed every
/// run on a loaded machine (as on the code before the FUSE adapter was
/// split), and a libfuse pass-through that caches nothing failed the same
/// way. The same check runs first on the source itself: it asks no more
/// than ext4 gives. L2ARC_STRESS_SECS sets how long the mount is stressed
/// (default 5 s; ext4 gets at most 1 s).
#[test]
fn readers_never_go_back_in_time_while_a_writer_rewrites_pages() {
    let secs: f64 = std::env::var("L2ARC_STRESS_SECS")
        .map(|s| s.parse().expect("L2ARC_STRESS_SECS: seconds"))
        .unwrap_or(5.0);
    let (_dir, src, mnt) = tree();
    let direct = rewrite_stress(&src.join("direct"), 4, secs.min(1.0));
    assert!(
        direct.stale.is_none(),
        "on ext4 itself: {}",
        direct.stale.unwrap()
    );
    let m = Mount::start(&src, &mnt, &[]);
    let through = rewrite_stress(&mnt.join("through"), 4, secs);
    eprintln!(
        "ext4: {} pages checked, {} versions; mount: {} pages checked, {} versions",
        direct.checked, direct.versions, through.checked, through.versions
    );
    if let Some(stale) = through.stale {
        panic!("{stale}");
    }
    assert!(through.checked > 0 && through.versions > 1);
    // A file open for writing can still be mapped shared and written
    // through its mapping (its handle is direct: FUSE_DIRECT_IO_ALLOW_MMAP).
    let rw = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(mnt.join("through"))
        .unwrap();
    SharedMapping::new(&rw, 32 * BLOCK, true).write_and_sync(5 * BLOCK, &block(5, 1 << 20));
    drop(rw);
    let mut page = vec![0u8; BLOCK];
    std::fs::File::open(src.join("through"))
        .unwrap()
        .read_exact_at(&mut page, (5 * BLOCK) as u64)
        .unwrap();
    assert!(
        page == block(5, 1 << 20),
        "a store through a mapping reached the source"
    );
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
}

/// A reader of a shared mapping sees a write through the mount as soon as
/// the write returns, with no system call of its own, as on the source,
/// even while another thread keeps faulting the page in during the write:
/// a read answered before the write reached the source must not leave its
/// old bytes in the kernel's pages (`Passthrough::write` in l2arc-fuse).
#[test]
fn a_mapping_sees_a_write_through_the_mount_when_it_returns() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (_dir, src, mnt) = tree();
    let initial: Vec<u8> = (0..8).flat_map(|i| block(i, 0)).collect();
    std::fs::write(src.join("f"), initial).unwrap();
    let m = Mount::start(&src, &mnt, &[]);
    let reader = std::fs::File::open(mnt.join("f")).unwrap();
    let map = SharedMapping::new(&reader, 8 * BLOCK, false);
    let done = Arc::new(AtomicBool::new(false));
    // Another mapping of the same pages, read without a pause.
    let toucher = {
        let (path, done) = (mnt.join("f"), Arc::clone(&done));
        std::thread::spawn(move || {
            let file = std::fs::File::open(path).unwrap();
            let map = SharedMapping::new(&file, 8 * BLOCK, false);
            while !done.load(Ordering::Relaxed) {
                std::hint::black_box(map.bytes());
            }
        })
    };
    let writer = std::fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("f"))
        .unwrap();
    let start = Instant::now();
    let mut version = 0;
    while start.elapsed() < Duration::from_secs(3) {
        version += 1;
        writer
            .write_all_at(&block(3, version), (3 * BLOCK) as u64)
            .unwrap();
        let seen = map.bytes();
        let word = u64::from_le_bytes(seen[3 * BLOCK..][..8].try_into().unwrap());
        assert!(
            seen[3 * BLOCK..][..BLOCK] == block(3, version)[..],
            "after version {version} was written the mapping shows version {}",
            word as u32
        );
    }
    done.store(true, Ordering::Relaxed);
    toucher.join().unwrap();
    drop((map, reader, writer));
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn nothing_outside_the_source_is_reachable() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    // src and mnt in different parents, so that host `..` differ too.
    let src = root.join("s/src");
    let mnt = root.join("m/mnt");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::write(root.join("s/outside"), b"SECRET").unwrap();
    std::fs::create_dir(root.join("s/outdir")).unwrap();
    std::fs::write(root.join("s/outdir/f"), b"SECRET").unwrap();
    std::os::unix::fs::symlink("../outside", src.join("up")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", src.join("abs")).unwrap();
    std::fs::create_dir(src.join("d")).unwrap();
    std::fs::write(src.join("d/f"), b"inside").unwrap();
    std::fs::create_dir(src.join("e")).unwrap();
    std::fs::write(src.join("e/f"), b"inside too").unwrap();
    // A long TTL keeps the kernel's names cached while we swap the tree.
    let m = Mount::start(&src, &mnt, &["--attr-timeout", "60"]);

    // Symlinks are passed through as links, never followed by us.
    assert_eq!(
        std::fs::read_link(mnt.join("up")).unwrap(),
        Path::new("../outside")
    );
    assert_eq!(
        std::fs::read_link(mnt.join("abs")).unwrap(),
        Path::new("/etc/passwd")
    );
    assert!(
        std::fs::symlink_metadata(mnt.join("up"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    // The kernel resolves `up` against the mount: MNT/../outside does not exist.
    assert!(std::fs::read(mnt.join("up")).is_err());
    // `..` at the mount root is the mount point's parent, never SRC's.
    assert!(std::fs::read(mnt.join("../outside")).is_err());
    assert_eq!(mnt.join("..").canonicalize().unwrap(), root.join("m"));

    // Race: the kernel still holds names under `d` and `e`; behind the
    // mount they become symlinks out of the tree (relative and absolute).
    assert_eq!(std::fs::read(mnt.join("d/f")).unwrap(), b"inside");
    assert_eq!(std::fs::read(mnt.join("e/f")).unwrap(), b"inside too");
    std::fs::rename(src.join("d"), src.join("d.old")).unwrap();
    std::os::unix::fs::symlink("../outdir", src.join("d")).unwrap();
    std::fs::rename(src.join("e"), src.join("e.old")).unwrap();
    std::os::unix::fs::symlink(root.join("s/outdir"), src.join("e")).unwrap();
    for name in ["d/f", "e/f"] {
        // The kernel's cached name still leads to the directory it named,
        // now `d.old` (inside SRC): its bytes or an error, never the
        // symlink's target outside.
        match std::fs::read(mnt.join(name)) {
            Ok(bytes) => assert!(
                bytes.starts_with(b"inside"),
                "{name} read {:?} from outside the source",
                String::from_utf8_lossy(&bytes)
            ),
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::NotFound
                ),
                "{name}: {e}"
            ),
        }
        // Writing, creating, listing through the stale names stay inside too.
        let _ = std::fs::write(mnt.join(name), b"overwritten");
        let _ = std::fs::write(mnt.join(name).with_file_name("created"), b"x");
        if let Ok(list) = std::fs::read_dir(mnt.join(name).parent().unwrap()) {
            for entry in list.flatten() {
                assert_ne!(entry.file_name(), "outside", "listed a directory outside");
            }
        }
    }
    assert_eq!(std::fs::read(root.join("s/outdir/f")).unwrap(), b"SECRET");
    assert!(!root.join("s/outdir/created").exists());
    assert_eq!(std::fs::read(root.join("s/outside")).unwrap(), b"SECRET");
    drop(m);
}

#[test]
#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn namespace_operations_reach_the_source() {
    let (_dir, src, mnt) = tree();
    let m = Mount::start(&src, &mnt, &[]);
    std::fs::create_dir(mnt.join("n")).unwrap();
    assert!(src.join("n").is_dir());
    let data = pattern(7, 300_000);
    std::fs::write(mnt.join("n/a"), &data).unwrap();
    assert!(std::fs::read(src.join("n/a")).unwrap() == data);
    assert!(
        std::fs::read(mnt.join("n/a")).unwrap() == data,
        "cached now"
    );

    std::fs::rename(mnt.join("n/a"), mnt.join("n/b")).unwrap();
    assert!(!src.join("n/a").exists());
    assert!(std::fs::read(mnt.join("n/b")).unwrap() == data);

    std::fs::set_permissions(mnt.join("n/b"), std::fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(
        std::fs::metadata(src.join("n/b")).unwrap().mode() & 0o7777,
        0o640
    );
    let when = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    std::fs::File::options()
        .write(true)
        .open(mnt.join("n/b"))
        .unwrap()
        .set_modified(when)
        .unwrap();
    assert_eq!(
        std::fs::metadata(src.join("n/b")).unwrap().mtime(),
        1_000_000_000
    );
    assert_eq!(
        std::fs::metadata(mnt.join("n/b")).unwrap().mtime(),
        1_000_000_000
    );

    // Truncate, then grow again: the cached records must not come back.
    let f = std::fs::File::options()
        .write(true)
        .open(mnt.join("n/b"))
        .unwrap();
    f.set_len(1000).unwrap();
    assert_eq!(std::fs::metadata(src.join("n/b")).unwrap().len(), 1000);
    f.set_len(300_000).unwrap();
    drop(f);
    let back = std::fs::read(mnt.join("n/b")).unwrap();
    assert_eq!(back.len(), 300_000);
    assert!(back[..1000] == data[..1000]);
    assert!(
        back[1000..].iter().all(|&b| b == 0),
        "old bytes after truncate"
    );
    // Truncated by open(O_TRUNC) too.
    std::fs::write(mnt.join("n/b"), b"short").unwrap();
    assert_eq!(std::fs::read(mnt.join("n/b")).unwrap(), b"short");

    std::os::unix::fs::symlink("b", mnt.join("n/l")).unwrap();
    assert_eq!(std::fs::read_link(src.join("n/l")).unwrap(), Path::new("b"));
    assert_eq!(std::fs::read(mnt.join("n/l")).unwrap(), b"short");
    std::fs::hard_link(mnt.join("n/b"), mnt.join("n/h")).unwrap();
    assert_eq!(std::fs::metadata(src.join("n/b")).unwrap().nlink(), 2);

    // A directory renamed with names cached below it.
    std::fs::create_dir_all(mnt.join("r/x")).unwrap();
    std::fs::write(mnt.join("r/x/f"), b"deep").unwrap();
    assert_eq!(std::fs::read(mnt.join("r/x/f")).unwrap(), b"deep");
    std::fs::rename(mnt.join("r"), mnt.join("r2")).unwrap();
    assert_eq!(std::fs::read(mnt.join("r2/x/f")).unwrap(), b"deep");
    assert_eq!(std::fs::read(src.join("r2/x/f")).unwrap(), b"deep");
    assert!(!mnt.join("r").exists());

    let mut names: Vec<_> = std::fs::read_dir(mnt.join("n"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["b", "h", "l"]);

    for name in ["n/b", "n/h", "n/l"] {
        std::fs::remove_file(mnt.join(name)).unwrap();
        assert!(std::fs::symlink_metadata(src.join(name)).is_err(), "{name}");
    }
    std::fs::remove_dir(mnt.join("n")).unwrap();
    assert!(!src.join("n").exists());
    assert!(std::fs::remove_dir(mnt.join("r2")).is_err(), "not empty");

    let df = run(Command::new("stat").args(["-f", "-c", "%b %S"]).arg(&mnt));
    let blocks: u64 = df.split_whitespace().next().unwrap().parse().unwrap();
    assert!(blocks > 0, "statfs passes through: {df}");
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn sigterm_unmounts_cleanly() {
    let (_dir, src, mnt) = tree();
    std::fs::write(src.join("f"), b"hello").unwrap();
    let m = Mount::start(&src, &mnt, &[]);
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"hello");
    let (status, log) = m.stop();
    assert!(status.success(), "exit {status}: {log}");
    assert!(!is_mounted(&mnt), "still mounted after SIGTERM");
    assert!(log.contains("l2arc: unmounted"), "{log}");
    assert!(log.contains("\nmisses "), "arcstats on exit: {log}");
    assert!(
        std::fs::read_dir(&mnt).unwrap().next().is_none(),
        "the bare mount point again"
    );
}

#[test]
fn sigkill_then_fusermount_recovers() {
    need("fusermount3");
    let (_dir, src, mnt) = tree();
    std::fs::write(src.join("f"), b"hello").unwrap();
    let mut m = Mount::start(&src, &mnt, &[]);
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"hello");
    m.signal("-KILL");
    let status = m.wait(Duration::from_secs(10));
    assert!(!status.success());
    // auto_unmount may already have released it; otherwise this must.
    std::thread::sleep(Duration::from_millis(200));
    if is_mounted(&mnt) {
        run(Command::new("fusermount3").arg("-u").arg(&mnt));
    }
    assert!(!is_mounted(&mnt), "still mounted after fusermount3 -u");
    // The mount point is usable again.
    let m = Mount::start(&src, &mnt, &[]);
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"hello");
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
    assert!(!is_mounted(&mnt));
}

#[test]
fn refuses_a_mount_point_inside_the_source() {
    let (_dir, src, _mnt) = tree();
    std::fs::create_dir(src.join("inner")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_l2arc"))
        .arg("mount")
        .arg(&src)
        .arg(src.join("inner"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("inside the source tree"), "{stderr}");
    assert!(!is_mounted(&src.join("inner")));
}

/// Reads all of `file` by pread (the same descriptor each time).
fn pread_all(file: &std::fs::File, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        match file.read_at(&mut buf[done..], done as u64).unwrap() {
            0 => break,
            n => done += n,
        }
    }
    buf.truncate(done);
    buf
}

#[test]
fn open_files_see_changes_behind_the_mount() {
    // A reader holds a file open on the mount while the source changes
    // behind it; after the attribute timeout the same descriptor must read
    // exactly what the source's own descriptor of that file reads: never
    // old bytes, never a mix. Each check reads every block.
    const LEN: usize = 1 << 20;
    let (_dir, src, mnt) = tree();
    let path = src.join("f");
    std::fs::write(&path, pattern(1, LEN)).unwrap();
    let m = Mount::start(&src, &mnt, &[]);
    let through = std::fs::File::open(mnt.join("f")).unwrap();
    let direct = std::fs::File::open(&path).unwrap();
    let check = |what: &str| {
        settle();
        let want = pread_all(&direct, 4 * LEN);
        // Twice: the first read may fill the page cache, the second is served by it.
        for round in 0..2 {
            let got = pread_all(&through, 4 * LEN);
            assert_eq!(got.len(), want.len(), "{what}: size (round {round})");
            for (i, (g, w)) in got.chunks(4096).zip(want.chunks(4096)).enumerate() {
                assert!(
                    g == w,
                    "{what}: block {i} differs from the source (round {round})"
                );
            }
        }
    };
    check("initial");

    // In place, same size, mtime set back (cp -p, rsync, tar do this).
    let before = std::fs::metadata(&path).unwrap();
    let writer = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    writer.write_all_at(&pattern(2, 8192), 8192).unwrap();
    writer
        .set_times(
            std::fs::FileTimes::new()
                .set_accessed(before.accessed().unwrap())
                .set_modified(before.modified().unwrap()),
        )
        .unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().modified().unwrap(),
        before.modified().unwrap()
    );
    check("same size, mtime restored");

    // Grown and then truncated in place, a few times: the kernel's answer
    // to the size change races whatever else moves its size (it failed 1
    // run in 10-25 with one round).
    for round in 0..4u8 {
        writer
            .write_all_at(&pattern(3 + u64::from(round), LEN), LEN as u64)
            .unwrap();
        check("grown");
        writer.set_len(300_001 - u64::from(round) * 4096).unwrap();
        check("truncated");
    }
    // Rewritten and shrunk with the mtime set back: only the size tells
    // the kernel, and its pages before the new end are stale too.
    let before = std::fs::metadata(&path).unwrap();
    writer.write_all_at(&pattern(9, 200_000), 0).unwrap();
    writer.set_len(250_000).unwrap();
    writer
        .set_times(std::fs::FileTimes::new().set_modified(before.modified().unwrap()))
        .unwrap();
    check("rewritten and shrunk, mtime restored");
    drop(writer);

    // Replaced by rename: the descriptor keeps the file it opened (now
    // unlinked), exactly as a descriptor on the source does; a new open
    // gets the new file.
    std::fs::write(src.join("f.new"), pattern(10, LEN)).unwrap();
    std::fs::rename(src.join("f.new"), &path).unwrap();
    check("replaced by rename (held descriptor)");
    assert!(
        std::fs::read(mnt.join("f")).unwrap() == pattern(10, LEN),
        "a new open after rename-replace"
    );
    drop(through);
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
}

/// How long the mount may take to notice a change made in the source, for
/// a program that asks it nothing (the watcher's promise, docs/mount.md).
const SOURCE_CHANGE_SEEN_WITHIN: Duration = Duration::from_secs(2);

#[test]
fn an_mmap_reader_sees_changes_in_the_source_without_a_system_call() {
    // A program that reads a file only through a shared mapping asks the
    // mount nothing once its pages are in: no getattr, no read. The mount
    // must drop those pages itself when the source changes. A long
    // attribute timeout, so that no timeout can be what shows the change.
    const LEN: usize = 1 << 20;
    let (_dir, src, mnt) = tree();
    let path = src.join("f");
    std::fs::write(&path, pattern(1, LEN)).unwrap();
    let m = Mount::start(&src, &mnt, &["--attr-timeout", "60"]);
    let file = std::fs::File::open(mnt.join("f")).unwrap();
    let map = SharedMapping::new(&file, LEN, false);
    assert!(
        map.bytes() == pattern(1, LEN),
        "the mapping before any change"
    );
    let writer = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let mut took = Vec::new();
    for round in 0..3u64 {
        let before = std::fs::metadata(&path).unwrap();
        match round {
            0 => writer.write_all_at(&pattern(2, LEN), 0).unwrap(),
            1 => {
                // Same size, mtime set back (cp -p, rsync, tar).
                writer.write_all_at(&pattern(3, LEN), 0).unwrap();
                writer
                    .set_times(
                        std::fs::FileTimes::new()
                            .set_accessed(before.accessed().unwrap())
                            .set_modified(before.modified().unwrap()),
                    )
                    .unwrap();
            }
            _ => writer
                .write_all_at(&pattern(4, 4096), (LEN / 2) as u64)
                .unwrap(),
        }
        // The source's own bytes (read on the source, not the mount).
        let want = std::fs::read(&path).unwrap();
        // Polled with loads only: the test thread makes no system call on
        // the mount from here until the bytes match.
        let seen = within(SOURCE_CHANGE_SEEN_WITHIN, || map.bytes() == want);
        let seen = seen.unwrap_or_else(|| {
            let stale = map
                .bytes()
                .chunks(4096)
                .zip(want.chunks(4096))
                .filter(|(g, w)| g != w)
                .count();
            panic!(
                "round {round}: the mapping still holds {stale} stale pages of {} after {SOURCE_CHANGE_SEEN_WITHIN:?}",
                LEN / 4096
            )
        });
        took.push(seen);
    }
    eprintln!("the mmap reader saw each change after {took:?}");
    drop(map);
    drop(file);
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn an_open_file_sees_changes_in_the_source_before_the_attribute_timeout() {
    // A reader holds the file open and only reads it (no stat) while the
    // source is appended to, truncated, rewritten and touched. With an
    // attribute timeout of a minute, only the mount telling the kernel
    // can make these reads see the change.
    const LEN: usize = 300_000;
    let (_dir, src, mnt) = tree();
    let path = src.join("f");
    std::fs::write(&path, pattern(1, LEN)).unwrap();
    let m = Mount::start(&src, &mnt, &["--attr-timeout", "60"]);
    let through = std::fs::File::open(mnt.join("f")).unwrap();
    let direct = std::fs::File::open(&path).unwrap();
    assert!(pread_all(&through, 4 * LEN) == pattern(1, LEN));
    let writer = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let see = |what: &str| {
        let want = pread_all(&direct, 4 * LEN);
        let took = within(SOURCE_CHANGE_SEEN_WITHIN, || {
            pread_all(&through, 4 * LEN) == want
        })
        .unwrap_or_else(|| {
            let got = pread_all(&through, 4 * LEN);
            panic!(
                "{what}: the open file reads {} bytes ({} wanted, {}) after {SOURCE_CHANGE_SEEN_WITHIN:?}",
                got.len(),
                want.len(),
                if got.len() == want.len() { "stale bytes" } else { "stale size" }
            )
        });
        eprintln!("{what}: seen after {took:?}");
    };
    writer
        .write_all_at(&pattern(2, 100_000), LEN as u64)
        .unwrap();
    see("appended");
    writer.set_len(200_001).unwrap();
    see("truncated");
    let before = std::fs::metadata(&path).unwrap();
    writer.write_all_at(&pattern(3, 8192), 4096).unwrap();
    writer
        .set_times(std::fs::FileTimes::new().set_modified(before.modified().unwrap()))
        .unwrap();
    see("rewritten in place, mtime set back");
    // Touched only: the same bytes, a new mtime, which fstat of the held
    // descriptor must show.
    writer
        .set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1_500_000_000))
        .unwrap();
    let took = within(SOURCE_CHANGE_SEEN_WITHIN, || {
        through.metadata().unwrap().mtime() == 1_500_000_000
    });
    assert!(
        took.is_some(),
        "touched: fstat on the mount still shows mtime {} after {SOURCE_CHANGE_SEEN_WITHIN:?}",
        through.metadata().unwrap().mtime()
    );
    drop(through);
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn a_new_open_sees_a_name_replaced_in_the_source_at_once() {
    // The kernel holds the names `a`, `b` and `c` (a long timeout: it would
    // trust them for a minute). Each is changed in the source and opened
    // on the mount at once: the open must find what the name holds now.
    let (_dir, src, mnt) = tree();
    for (name, seed) in [("a", 1), ("b", 2), ("c", 3)] {
        std::fs::write(src.join(name), pattern(seed, 70_000)).unwrap();
    }
    let m = Mount::start(&src, &mnt, &["--attr-timeout", "60"]);
    for (name, seed) in [("a", 1), ("b", 2), ("c", 3)] {
        assert!(std::fs::read(mnt.join(name)).unwrap() == pattern(seed, 70_000));
    }
    let held = std::fs::File::open(mnt.join("b")).unwrap();
    let mut failed = Vec::new();

    // mv a.new a
    std::fs::write(src.join("a.new"), pattern(4, 70_000)).unwrap();
    std::fs::rename(src.join("a.new"), src.join("a")).unwrap();
    if std::fs::read(mnt.join("a")).unwrap() != pattern(4, 70_000) {
        failed.push("a new open after a rename-replace read the old file");
    }
    // rm b; a new b (the old one held open meanwhile).
    std::fs::remove_file(src.join("b")).unwrap();
    std::fs::write(src.join("b"), pattern(5, 50_000)).unwrap();
    if std::fs::read(mnt.join("b")).unwrap() != pattern(5, 50_000) {
        failed.push("a new open after delete-and-recreate read the old file");
    }
    // rm c for good.
    std::fs::remove_file(src.join("c")).unwrap();
    match std::fs::File::open(mnt.join("c")) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        _ => failed.push("a new open of a deleted name did not fail with ENOENT"),
    }
    assert!(failed.is_empty(), "{failed:#?}");
    assert!(
        pread_all(&held, 1 << 20) == pattern(2, 70_000),
        "the held descriptor keeps the file it opened, as on the source"
    );
    drop(held);
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
}

/// A file's ctime as (seconds, nanoseconds).
fn ctime(path: &Path) -> (i64, i64) {
    let meta = std::fs::metadata(path).unwrap();
    (meta.ctime(), meta.ctime_nsec())
}

#[test]
fn a_no_op_chown_updates_ctime_as_on_the_source() {
    // chown(f, -1, -1) changes no owner, but the call itself is a change
    // of the inode: ext4 moves its ctime. The mount must do what the
    // source does. Between the calls the clock must move past the
    // timestamp granularity (a jiffy, at most 10 ms): 50 ms.
    let (_dir, src, mnt) = tree();
    std::fs::write(src.join("a"), b"a").unwrap();
    std::fs::write(src.join("b"), b"b").unwrap();
    let m = Mount::start(&src, &mnt, &[]);
    let tick = || std::thread::sleep(Duration::from_millis(50));

    let before = ctime(&src.join("a"));
    tick();
    std::os::unix::fs::chown(src.join("a"), None, None).unwrap();
    let on_source = ctime(&src.join("a")) != before;

    let before = ctime(&mnt.join("b"));
    assert_eq!(before, ctime(&src.join("b")));
    tick();
    std::os::unix::fs::chown(mnt.join("b"), None, None).unwrap();
    let through = ctime(&mnt.join("b"));
    assert_eq!(
        through != before,
        on_source,
        "chown(-1, -1) moved ctime on the source: {on_source}; through the mount: {}",
        through != before
    );
    assert_eq!(
        through,
        ctime(&src.join("b")),
        "the mount shows the source's ctime"
    );
    // The same through an open descriptor (fchown).
    let f = std::fs::File::open(mnt.join("b")).unwrap();
    tick();
    std::os::unix::fs::fchown(&f, None, None).unwrap();
    assert_eq!(
        f.metadata().unwrap().ctime_nsec() != through.1
            || f.metadata().unwrap().ctime() != through.0,
        on_source,
        "fchown(-1, -1) through the mount"
    );
    drop(f);
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
}

/// Context switches of the mount's source watcher thread so far: each is
/// a wake-up (found by its name in /proc/PID/task).
fn watcher_wakeups(pid: u32) -> u64 {
    let tasks = format!("/proc/{pid}/task");
    for task in std::fs::read_dir(&tasks).unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        // Thread names are cut to 15 bytes.
        if comm.trim_end() != "l2arc-fuse-watc" {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap();
        return status
            .lines()
            .filter(|l| l.contains("ctxt_switches:"))
            .map(|l| l.split_whitespace().last().unwrap().parse::<u64>().unwrap())
            .sum();
    }
    panic!("no source watcher thread in {tasks}");
}

/// The mount process's CPU time so far (user + system), in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command's closing parenthesis; utime, stime are 14, 15.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn the_source_watcher_sleeps_while_no_file_is_open() {
    // An idle mount must cost nothing: with no file open the watcher has
    // nothing to watch and no tick, so its thread never wakes. With one
    // open it ticks (the periodic check); closed, it sleeps again.
    const WINDOW: Duration = Duration::from_millis(1500);
    let (_dir, src, mnt) = tree();
    std::fs::write(src.join("f"), b"watched").unwrap();
    let m = Mount::start(&src, &mnt, &[]);
    let pid = m.pid();
    let (wakeups, cpu) = (watcher_wakeups(pid), cpu_ticks(pid));
    std::thread::sleep(WINDOW);
    let idle = watcher_wakeups(pid) - wakeups;
    eprintln!(
        "idle mount, {WINDOW:?}: {idle} watcher wake-ups, {} CPU ticks for the whole process",
        cpu_ticks(pid) - cpu
    );
    assert_eq!(idle, 0, "the watcher woke with no file open");

    // Ticks are 0.5 s apart: four or five in 2 s, two at the very least
    // however late the thread is scheduled.
    let held = std::fs::File::open(mnt.join("f")).unwrap();
    let wakeups = watcher_wakeups(pid);
    std::thread::sleep(Duration::from_secs(2));
    let ticking = watcher_wakeups(pid) - wakeups;
    eprintln!("one file open, 2 s: {ticking} watcher wake-ups");
    assert!(
        ticking >= 2,
        "no periodic check with a file open: {ticking}"
    );

    drop(held);
    // The close reaches the mount after close(2) returns, and a tick due
    // then may still run once: let both pass.
    std::thread::sleep(Duration::from_millis(700));
    let wakeups = watcher_wakeups(pid);
    std::thread::sleep(WINDOW);
    assert_eq!(
        watcher_wakeups(pid) - wakeups,
        0,
        "the watcher still wakes after the last file closed"
    );
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
}

/// Runs `f` in a child process as uid/gid 65534 (nobody) with umask 0;
/// the child's exit code is `f`'s result (0 = ok).
fn as_nobody(f: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child only makes system calls and exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: plain system calls in the child.
        unsafe {
            libc::umask(0);
            if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                libc::_exit(100);
            }
        }
        let code = f();
        // SAFETY: leave the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "child died: {status}");
    libc::WEXITSTATUS(status)
}

#[test]
fn files_made_through_the_mount_belong_to_the_caller() {
    let (dir, src, mnt) = tree();
    // Let nobody reach and write the tree.
    for p in [dir.path(), &src] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let m = Mount::start(&src, &mnt, &["--allow-other"]);
    let code = as_nobody(|| {
        let step = |ok: bool, code: i32| if ok { 0 } else { code };
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o4777)
            .open(mnt.join("file"));
        let mut failed = step(f.is_ok(), 1);
        failed |= step(
            std::fs::DirBuilder::new()
                .mode(0o777)
                .create(mnt.join("dir"))
                .is_ok(),
            2,
        );
        failed |= step(
            std::os::unix::fs::symlink("file", mnt.join("link")).is_ok(),
            4,
        );
        // The owner may set the times of what it made.
        let when = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000);
        let times = std::fs::FileTimes::new().set_modified(when);
        failed |= step(f.is_ok_and(|f| f.set_times(times).is_ok()), 8);
        failed
    });
    assert_eq!(code, 0, "nobody could not create through the mount");
    for (name, mode) in [("file", 0o4777), ("dir", 0o777)] {
        let meta = std::fs::symlink_metadata(src.join(name)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (65534, 65534), "{name} owner");
        assert_eq!(meta.mode() & 0o7777, mode, "{name} mode (umask 0)");
    }
    let link = std::fs::symlink_metadata(src.join("link")).unwrap();
    assert_eq!((link.uid(), link.gid()), (65534, 65534), "symlink owner");
    assert_eq!(
        std::fs::metadata(src.join("file")).unwrap().mtime(),
        2_000_000
    );
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
}

#[test]
#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn inodes_links_unlinked_files_deep_trees_and_byte_names() {
    let (_dir, src, mnt) = tree();
    std::fs::write(src.join("a"), b"linked").unwrap();
    let m = Mount::start(&src, &mnt, &["--attr-timeout", "60"]);

    // Hard links: one st_ino (the source's), and a change through one name
    // shows through the other at once, whatever the attribute timeout.
    let src_ino = std::fs::metadata(src.join("a")).unwrap().ino();
    std::fs::hard_link(mnt.join("a"), mnt.join("b")).unwrap();
    let (a, b) = (
        std::fs::metadata(mnt.join("a")).unwrap(),
        std::fs::metadata(mnt.join("b")).unwrap(),
    );
    assert_eq!((a.ino(), b.ino()), (src_ino, src_ino));
    assert_eq!(a.nlink(), 2);
    std::fs::set_permissions(mnt.join("b"), std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        std::fs::metadata(mnt.join("a")).unwrap().mode() & 0o777,
        0o600
    );
    std::fs::remove_file(mnt.join("b")).unwrap();
    assert_eq!(std::fs::metadata(mnt.join("a")).unwrap().nlink(), 1);
    // st_ino stays across a rename.
    std::fs::rename(mnt.join("a"), mnt.join("a2")).unwrap();
    assert_eq!(std::fs::metadata(mnt.join("a2")).unwrap().ino(), src_ino);

    // An open file whose name is gone keeps working, as on ext4.
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .write(true)
        .truncate(true)
        .open(mnt.join("tmp"))
        .unwrap();
    std::io::Write::write_all(&mut f, b"hello world").unwrap();
    std::fs::remove_file(mnt.join("tmp")).unwrap();
    let meta = f.metadata().unwrap();
    assert_eq!((meta.nlink(), meta.len()), (0, 11));
    f.set_len(5).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 5);
    f.write_all_at(b"HELLO", 0).unwrap();
    assert_eq!(pread_all(&f, 100), b"HELLO");
    drop(f);

    // A tree deeper than PATH_MAX below the source root.
    let component = "d".repeat(200);
    let mut dir = std::fs::File::open(&mnt).unwrap();
    for _ in 0..40 {
        let c = std::ffi::CString::new(component.as_str()).unwrap();
        // SAFETY: valid descriptor and C string.
        let made = unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755) };
        assert_eq!(made, 0);
        // SAFETY: as above; the result is checked.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY,
            )
        };
        assert!(
            fd >= 0,
            "openat at depth: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a fresh descriptor we own.
        dir = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    }
    // SAFETY: valid descriptor and C string.
    let leaf = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c"leaf".as_ptr(),
            libc::O_CREAT | libc::O_WRONLY,
            0o644,
        )
    };
    assert!(
        leaf >= 0,
        "create 8,000 characters deep: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: our descriptor.
    unsafe { libc::close(leaf) };
    drop(dir); // an open directory would keep the mount busy at stop

    // Names are bytes: not UTF-8 is fine.
    use std::os::unix::ffi::OsStrExt;
    let name = std::ffi::OsStr::from_bytes(b"caf\xe9");
    std::fs::write(mnt.join(name), b"latin-1").unwrap();
    assert_eq!(std::fs::read(src.join(name)).unwrap(), b"latin-1");
    assert!(
        std::fs::read_dir(&mnt)
            .unwrap()
            .any(|e| e.unwrap().file_name() == name)
    );

    // Extended attributes pass through.
    let c = |s: &str| std::ffi::CString::new(s).unwrap();
    let (file, key) = (c(mnt.join("a2").to_str().unwrap()), c("user.l2arc"));
    // SAFETY: valid C strings and buffer.
    let set = unsafe { libc::setxattr(file.as_ptr(), key.as_ptr(), b"v1".as_ptr().cast(), 2, 0) };
    assert_eq!(set, 0, "setxattr: {}", std::io::Error::last_os_error());
    let on_src = c(src.join("a2").to_str().unwrap());
    let mut buf = [0u8; 16];
    // SAFETY: as above.
    let n = unsafe { libc::getxattr(on_src.as_ptr(), key.as_ptr(), buf.as_mut_ptr().cast(), 16) };
    assert_eq!(&buf[..n as usize], b"v1");
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn posix_locks_conflict_with_locks_on_the_source() {
    let (_dir, src, mnt) = tree();
    std::fs::write(src.join("f"), vec![0u8; 4096]).unwrap();
    let m = Mount::start(&src, &mnt, &[]);
    let lock = |file: &std::fs::File, typ: i32| {
        // SAFETY: plain data.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = typ as i16;
        fl.l_whence = libc::SEEK_SET as i16;
        // SAFETY: an open descriptor and a valid flock.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &fl) };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // Another process holds a write lock on the source itself.
    // SAFETY: the child only makes system calls and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(src.join("f"))
            .unwrap();
        let code = if lock(&f, libc::F_WRLCK).is_ok() {
            0
        } else {
            1
        };
        std::thread::sleep(Duration::from_secs(3));
        // SAFETY: leave the child at once.
        unsafe { libc::_exit(code) };
    }
    std::thread::sleep(Duration::from_millis(500));
    let through = std::fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("f"))
        .unwrap();
    let e = lock(&through, libc::F_WRLCK).expect_err("the source's lock must conflict");
    assert!(
        matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)),
        "{e}"
    );
    let mut status = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "the child could not lock the source"
    );
    // Free now: the mount's lock is taken, and it conflicts with the source.
    lock(&through, libc::F_WRLCK).expect("lock once the source's is gone");
    let direct = std::fs::OpenOptions::new()
        .write(true)
        .open(src.join("f"))
        .unwrap();
    // SAFETY: see above.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = if lock(&direct, libc::F_WRLCK).is_err() {
            0
        } else {
            1
        };
        // SAFETY: leave the child at once.
        unsafe { libc::_exit(code) };
    }
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "the mount's lock did not reach the source"
    );
    // Closing the descriptor drops the lock, as on the source.
    drop(through);
    lock(&direct, libc::F_WRLCK).expect("released at close");
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
}

/// pjdfstest's summary line: (failed, skipped, passed) and the names of
/// the tests that did not pass.
fn pjdfstest(dir: &Path) -> ((u64, u64, u64), Vec<String>) {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pjdfstest/linux.toml");
    let out = Command::new("pjdfstest")
        .arg("-c")
        .arg(&config)
        .arg("-p")
        .arg(dir)
        .output()
        .expect("pjdfstest is missing: run scripts/setup.sh (cargo install pjdfstest)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let summary = text
        .lines()
        .find(|l| l.starts_with("Summary:"))
        .unwrap_or_else(|| panic!("no summary from pjdfstest on {dir:?}:\n{text}"));
    let num = |word: &str| -> u64 {
        let at = summary.find(word).unwrap_or_else(|| panic!("{summary}"));
        summary[..at]
            .trim_end()
            .rsplit([' ', ','])
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let not_passed = text
        .lines()
        .filter(|l| l.trim_end().ends_with("skipped") || l.contains("FAILED"))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    (
        (num(" failed"), num(" skipped"), num(" passed")),
        not_passed,
    )
}

#[test]
fn pjdfstest_fails_nothing_on_the_mount_that_the_source_passes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    // pjdfstest switches to unprivileged users: they must reach the trees.
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (bare, src, mnt) = (root.join("bare"), root.join("src"), root.join("mnt"));
    for d in [&bare, &src, &mnt] {
        std::fs::create_dir(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let (source, source_not_passed) = pjdfstest(&bare);
    assert!(
        source.2 > 300,
        "pjdfstest ran too little on the source: {source:?}"
    );
    let m = Mount::start(&src, &mnt, &["--allow-other"]);
    let (mount, mount_not_passed) = pjdfstest(&mnt);
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
    eprintln!("pjdfstest (failed, skipped, passed): source {source:?}, mount {mount:?}");
    // glibc's pathconf(LINK_MAX) knows no limit for FUSE, so pjdfstest
    // skips that one test on any FUSE mount.
    let fuse_skips = ["link::link_count_max"];
    let extra: Vec<&String> = mount_not_passed
        .iter()
        .filter(|t| !source_not_passed.contains(t) && !fuse_skips.contains(&t.as_str()))
        .collect();
    assert!(
        extra.is_empty(),
        "not passed on the mount but passed on the source: {extra:?}"
    );
    assert!(
        mount.0 <= source.0,
        "failures: mount {mount:?}, source {source:?}"
    );
    assert!(
        mount.2 + 1 >= source.2,
        "passes: mount {mount:?}, source {source:?}"
    );
}
