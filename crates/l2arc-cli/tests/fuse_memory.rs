//! `l2arc mount` under hostile load: the daemon's memory stays within the
//! formula docs/mount.md states, hostile clients get clean errors (EMFILE,
//! ENFILE, ENOMEM) rather than hangs, and a good client is served right
//! meanwhile and afterwards.
//!
//! Why a separate test binary: it measures the daemon's peak RSS (VmHWM in
//! `/proc/PID/status`) of its own mount process, so no other test's memory
//! is counted, and it sits alone so that the other FUSE tests do not compete
//! with its clients for the two cores. It asserts bounds, not speeds: its
//! one time limit (`HANG_LIMIT`) is far past what the clients take and
//! only catches a hang.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use l2arc_testkit::service::{Running, Service};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

const ARC_MAX_BYTES: u64 = 64 << 20;
/// Evicted records held for the L2ARC feeder (no cache device here).
const WRITEBACK_MAX_BYTES: u64 = 1 << 20;
const THREADS: u64 = 4;
/// Below what the openers pin (a node per file they hold, beside the
/// empty directories), so that the node bound is reached for good (ENFILE)
/// before the handle bound (EMFILE): idle nodes would be given back.
const MAX_NODES: u64 = 1000;
const MAX_OPEN_HANDLES: u64 = 2000;
const DIR_LISTING_MAX_BYTES: u64 = 16 << 20;
/// Measured RSS of a node the kernel holds and of an open handle, rounded
/// up (docs/mount.md, `scripts/mount-node-sizes.py`: 250-290 B and
/// 460-690 B).
const NODE_BYTES: u64 = 300;
const HANDLE_BYTES: u64 = 700;
/// FUSE request buffers: one of max_write (1 MiB) per serving thread.
const THREAD_BUFFER_BYTES: u64 = 1 << 20;
/// Records waiting to be stored into the page cache (`STORE_BYTES_MAX`).
const STORE_QUEUE_BYTES: u64 = 32 << 20;
/// The fixed part of the formula: code, stacks, allocator slack.
const FIXED_BYTES: u64 = 64 << 20;

/// Files of the huge directory: 20 000 names of 200 bytes, a listing of
/// about 5 MiB, so that a few held listings fill the listing bound.
const HUGE_DIR_FILES: usize = 20_000;
const EMPTY_DIRS: usize = 300;
const BIG_FILES: usize = 3;
const BIG_FILE_BYTES: usize = 32 << 20;
const GOOD_FILE_BYTES: usize = 8 << 20;
const OPENERS: usize = 4;
const LISTERS: usize = 3;
const READERS: usize = 2;
/// Longest any client waits for an answer before the test calls it a hang.
const HANG_LIMIT: Duration = Duration::from_secs(120);

fn pattern(seed: u32, offset: usize, len: usize) -> Vec<u8> {
    (offset..offset + len)
        .map(|i| {
            (i as u32)
                .wrapping_add(seed)
                .wrapping_mul(2_654_435_761)
                .to_le_bytes()[2]
        })
        .collect()
}

fn long_name(i: usize) -> String {
    format!("{i:06}-{}", "n".repeat(193))
}

/// open(2) of `path`, the errno on failure.
fn open(path: &Path, flags: libc::c_int) -> Result<OwnedFd, i32> {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
    }
    // SAFETY: a descriptor we just opened and own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Drops the kernel's page cache of a file, so that its next reads reach
/// the daemon (and its ARC) again.
fn drop_pages(fd: &impl AsRawFd) {
    // SAFETY: an open descriptor.
    unsafe { libc::posix_fadvise(fd.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

/// Reads the whole good file and checks every byte.
fn read_good(file: &std::fs::File) {
    let mut buf = vec![0u8; 1 << 20];
    for offset in (0..GOOD_FILE_BYTES).step_by(buf.len()) {
        file.read_exact_at(&mut buf, offset as u64).unwrap();
        assert!(
            buf == pattern(0, offset, buf.len()),
            "the good client read wrong bytes at {offset}"
        );
    }
}

fn populate(src: &Path) {
    let huge = src.join("huge");
    std::fs::create_dir(&huge).unwrap();
    for i in 0..HUGE_DIR_FILES {
        std::fs::File::create(huge.join(long_name(i))).unwrap();
    }
    let dirs = src.join("dirs");
    std::fs::create_dir(&dirs).unwrap();
    for i in 0..EMPTY_DIRS {
        std::fs::create_dir(dirs.join(format!("d{i:03}"))).unwrap();
    }
    std::fs::create_dir(src.join("fresh")).unwrap();
    std::fs::write(src.join("fresh/after"), b"after the attack").unwrap();
    for i in 0..BIG_FILES {
        std::fs::write(
            src.join(format!("big{i}")),
            pattern(1 + i as u32, 0, BIG_FILE_BYTES),
        )
        .unwrap();
    }
    std::fs::write(src.join("good"), pattern(0, 0, GOOD_FILE_BYTES)).unwrap();
}

/// A running `l2arc mount` with the test's bounds, unmounted on drop.
struct Mount {
    service: Running,
    mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Mount {
    fn drop(&mut self) {
        let child = &mut self.service.child;
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        for _ in 0..300 {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn mount() -> Mount {
    let fusermount = Command::new("fusermount3")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    assert!(
        fusermount.is_ok_and(|s| s.success()),
        "`fusermount3` is missing: run scripts/setup.sh (it installs fuse3)"
    );
    let dir = tempfile::tempdir().unwrap();
    let (src, mnt) = (dir.path().join("src"), dir.path().join("mnt"));
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    populate(&src);
    let service = Service::mount(Path::new(env!("CARGO_BIN_EXE_l2arc")), &src, &mnt)
        .args(["--arc-max", &format!("{}MiB", ARC_MAX_BYTES >> 20)])
        .args([
            "--l2arc-writeback-max",
            &format!("{}MiB", WRITEBACK_MAX_BYTES >> 20),
        ])
        .args(["--threads", &THREADS.to_string()])
        .args(["--max-nodes", &MAX_NODES.to_string()])
        .args(["--max-open-handles", &MAX_OPEN_HANDLES.to_string()])
        .args([
            "--dir-listing-max",
            &format!("{}MiB", DIR_LISTING_MAX_BYTES >> 20),
        ])
        // Long enough that the kernel keeps every node it looked up.
        .args(["--attr-timeout", "60"])
        .ready_within(Duration::from_secs(30))
        .start();
    let memory = service
        .line_before_ready("l2arc: memory:")
        .expect("a memory line before the ready line")
        .to_string();
    let mount = Mount {
        service,
        mnt,
        _dir: dir,
    };
    assert!(
        memory.starts_with("l2arc: memory: arc_max 64 MiB")
            && memory.contains("listings 16 MiB")
            && memory.contains(&format!("{MAX_NODES} nodes + {MAX_OPEN_HANDLES} handles")),
        "the bounds the test set are in force: {memory}"
    );
    mount
}

/// What the hostile clients saw: errno counts, and descriptors they hold.
#[derive(Default)]
struct Outcome {
    emfile: usize,
    enfile: usize,
    enomem: usize,
    held: Vec<OwnedFd>,
}

impl Outcome {
    fn failed(&mut self, errno: i32, what: &Path) {
        match errno {
            libc::EMFILE => self.emfile += 1,
            libc::ENFILE => self.enfile += 1,
            libc::ENOMEM => self.enomem += 1,
            _ => panic!(
                "{}: {} (a hostile client must get EMFILE, ENFILE or ENOMEM)",
                what.display(),
                std::io::Error::from_raw_os_error(errno)
            ),
        }
    }
}

/// Opens every file of its share of the huge directory and an empty
/// directory beside each, holding whatever it gets.
fn opener(mnt: &Path, me: usize, out: &Mutex<Outcome>) {
    for i in (me..HUGE_DIR_FILES).step_by(OPENERS) {
        let file = mnt.join("huge").join(long_name(i));
        let dir = mnt.join(format!("dirs/d{:03}", i % EMPTY_DIRS));
        for (path, flags) in [
            (file, libc::O_RDONLY),
            (dir, libc::O_RDONLY | libc::O_DIRECTORY),
        ] {
            let result = open(&path, flags);
            let mut out = out.lock().unwrap();
            match result {
                Ok(fd) => out.held.push(fd),
                Err(e) => out.failed(e, &path),
            }
        }
    }
}

/// Lists the huge directory again and again, holding every listing open
/// (a ReadDir's descriptor keeps its listing in the daemon's table).
fn lister(mnt: &Path, stop: &AtomicBool, out: &Mutex<Outcome>) -> Vec<std::fs::ReadDir> {
    let huge = mnt.join("huge");
    let mut held = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match std::fs::read_dir(&huge) {
            Ok(mut listing) => {
                let n = listing
                    .by_ref()
                    .inspect(|e| assert!(e.is_ok(), "{e:?}"))
                    .count();
                assert_eq!(n, HUGE_DIR_FILES, "a listing that was opened is whole");
                held.push(listing);
            }
            Err(e) => out.lock().unwrap().failed(e.raw_os_error().unwrap(), &huge),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    held
}

/// Random 128 KiB reads of the big files, dropping the kernel's pages so
/// that the reads reach the ARC and fill it.
fn reader(files: &[std::fs::File], seed: u64, stop: &AtomicBool) {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005) | 1;
    let mut buf = vec![0u8; 128 << 10];
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let which = (x % BIG_FILES as u64) as usize;
        let offset = ((x >> 8) as usize % (BIG_FILE_BYTES / buf.len())) * buf.len();
        files[which].read_exact_at(&mut buf, offset as u64).unwrap();
        assert!(buf == pattern(1 + which as u32, offset, buf.len()));
        n += 1;
        if n.is_multiple_of(32) {
            drop_pages(&files[which]);
        }
    }
}

/// Hostile clients open files and directories until the mount refuses,
/// list a huge directory holding every listing, and read big files at
/// random; a good client reads its file right all along. The daemon's peak
/// RSS stays within docs/mount.md's formula for the bounds set, every
/// refusal is EMFILE, ENFILE or ENOMEM, nothing hangs, and once the hostile
/// clients close everything the mount serves new opens again.
#[test]
#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn hostile_clients_get_clean_errors_and_the_mount_stays_within_its_memory_formula() {
    // The hostile clients hold more descriptors than a default limit allows.
    // SAFETY: plain data.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        assert!(
            lim.rlim_cur >= 2 * MAX_OPEN_HANDLES + 1024,
            "RLIMIT_NOFILE {} is too low for this test",
            lim.rlim_cur
        );
    }
    let m = mount();
    let pid = m.service.pid();
    let mnt = m.mnt.clone();
    // docs/mount.md's formula; l2_hdr_size is 0: no cache device.
    let budget_bytes = ARC_MAX_BYTES
        + WRITEBACK_MAX_BYTES
        + THREADS * THREAD_BUFFER_BYTES
        + STORE_QUEUE_BYTES
        + DIR_LISTING_MAX_BYTES
        + MAX_NODES * NODE_BYTES
        + MAX_OPEN_HANDLES * HANDLE_BYTES
        + FIXED_BYTES;

    // The good client and the readers open their files before the attack.
    let good = std::fs::File::open(mnt.join("good")).unwrap();
    let big: Arc<Vec<std::fs::File>> = Arc::new(
        (0..BIG_FILES)
            .map(|i| std::fs::File::open(mnt.join(format!("big{i}"))).unwrap())
            .collect(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let outcome = Arc::new(Mutex::new(Outcome::default()));
    let (done_tx, done_rx) = mpsc::channel::<&'static str>();
    let mut readers = Vec::new();
    for i in 0..READERS {
        let (big, stop, done) = (Arc::clone(&big), Arc::clone(&stop), done_tx.clone());
        readers.push(std::thread::spawn(move || {
            reader(&big, i as u64 + 1, &stop);
            let _ = done.send("reader");
        }));
    }
    let mut listers = Vec::new();
    for _ in 0..LISTERS {
        let (mnt, stop, out, done) = (
            mnt.clone(),
            Arc::clone(&stop),
            Arc::clone(&outcome),
            done_tx.clone(),
        );
        listers.push(std::thread::spawn(move || {
            let held = lister(&mnt, &stop, &out);
            let _ = done.send("lister");
            held
        }));
    }
    let mut openers = Vec::new();
    for me in 0..OPENERS {
        let (mnt, out, done) = (mnt.clone(), Arc::clone(&outcome), done_tx.clone());
        openers.push(std::thread::spawn(move || {
            opener(&mnt, me, &out);
            let _ = done.send("opener");
        }));
    }

    // The good client reads while the attack goes on.
    let mut good_passes = 0;
    let mut openers_left = OPENERS;
    // Not a timing: a limit far past the few seconds the openers take,
    // which only a hung open reaches.
    let hung_after = std::time::Instant::now() + HANG_LIMIT;
    while openers_left > 0 || good_passes < 3 {
        read_good(&good);
        drop_pages(&good);
        good_passes += 1;
        while let Ok(who) = done_rx.try_recv() {
            assert_eq!(who, "opener", "a reader or lister ended early");
            openers_left -= 1;
        }
        assert!(
            std::time::Instant::now() < hung_after,
            "{openers_left} hostile openers hung (no answer within {HANG_LIMIT:?})"
        );
    }
    for t in openers {
        t.join().unwrap();
    }
    // Everything is held now; let the readers and listers go on a little.
    std::thread::sleep(Duration::from_secs(3));
    read_good(&good);
    stop.store(true, Ordering::Relaxed);
    for _ in 0..READERS + LISTERS {
        let who = done_rx
            .recv_timeout(HANG_LIMIT)
            .expect("a hostile reader or lister hung");
        assert_ne!(who, "opener");
    }
    for t in readers {
        t.join().unwrap();
    }
    let listings: Vec<_> = listers.into_iter().map(|t| t.join().unwrap()).collect();

    let (rss_bytes, hwm_bytes) = l2arc_testkit::rss_and_peak_bytes(pid);
    let out = std::mem::take(&mut *outcome.lock().unwrap());
    eprintln!(
        "hostile load: {} handles held; EMFILE {}, ENFILE {}, ENOMEM {}; good client {good_passes} passes; \
         daemon RSS {} MiB, peak {} MiB, formula {} MiB",
        out.held.len(),
        out.emfile,
        out.enfile,
        out.enomem,
        rss_bytes >> 20,
        hwm_bytes >> 20,
        budget_bytes >> 20
    );
    assert!(
        out.emfile > 0 && out.enfile > 0 && out.enomem > 0,
        "every bound was reached: EMFILE {}, ENFILE {}, ENOMEM {}",
        out.emfile,
        out.enfile,
        out.enomem
    );
    assert!(out.held.len() <= MAX_OPEN_HANDLES as usize);
    assert!(
        hwm_bytes <= budget_bytes,
        "peak RSS {} MiB over the formula's {} MiB",
        hwm_bytes >> 20,
        budget_bytes >> 20
    );

    // The hostile clients close everything; the good client goes on.
    drop(out);
    drop(listings);
    drop(big);
    read_good(&good);
    let good_again = std::fs::File::open(mnt.join("good")).unwrap();
    read_good(&good_again);
    assert_eq!(
        std::fs::read_dir(mnt.join("huge")).unwrap().count(),
        HUGE_DIR_FILES
    );
    // The kernel still holds the nodes it looked up (its dentries): the
    // table is full of idle nodes. The mount asks the kernel to drop idle
    // entries (no memory pressure needed) and new names are served again;
    // the forgets come on the kernel's own time, so the table drains while
    // this waits, and meanwhile the only refusal is ENFILE.
    let hung_after = std::time::Instant::now() + HANG_LIMIT;
    loop {
        match std::fs::read(mnt.join("fresh/after")) {
            Ok(bytes) => {
                assert_eq!(bytes, b"after the attack");
                break;
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENFILE), "{e}");
                assert!(
                    std::time::Instant::now() < hung_after,
                    "the node table did not drain once its nodes were idle"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    let (_, hwm_after) = l2arc_testkit::rss_and_peak_bytes(pid);
    assert!(
        hwm_after <= budget_bytes,
        "peak RSS {} MiB over the formula's {} MiB after the attack",
        hwm_after >> 20,
        budget_bytes >> 20
    );
}
