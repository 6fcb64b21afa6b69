//! `l2arc mount s3://...` and `l2arc serve-nbd s3://...` end to end against
//! a real S3 server (versitygw, started per test by l2arc-testkit; missing,
//! the tests fail): listing and reading (cp -r, diff -r, fio verify), writes
//! refused with EROFS, an overwrite seen by two mounts after the TTL and
//! never mixed within a block, deleted objects, the L2ARC warm after a
//! remount, a missing bucket and refused credentials, sequential read-ahead
//! in spans (few GETs), many names through a small node table, and an NBD export of an image object compared by
//! qemu-img.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use l2arc_testkit::nbd::pattern;
use l2arc_testkit::s3::{S3Server, gets_in_log as gets_in};
use l2arc_testkit::service::{Running, Service};
use l2arc_testkit::{run, tool};

const BUCKET: &str = "bkt";
const TTL_SECS: f64 = 1.0;

fn is_mounted(mnt: &Path) -> bool {
    l2arc_fuse::is_mounted(mnt).expect("read /proc/mounts")
}

/// A running `l2arc mount s3://...` or `serve-nbd s3://...`, its whole
/// stderr gathered in `log`.
struct S3Service {
    running: Running,
    log: Arc<Mutex<String>>,
}

impl S3Service {
    /// `serve-nbd OBJECT --listen unix:SOCKET EXTRA...` of an `s3://` object.
    fn serve_nbd(
        server: &S3Server,
        endpoint: &str,
        object: &str,
        socket: &Path,
        extra: &[&str],
    ) -> S3Service {
        let service = Service::serve_nbd(Path::new(env!("CARGO_BIN_EXE_l2arc")), object)
            .listen_unix(socket)
            .args(extra);
        S3Service::start_at(server, endpoint, service)
    }

    /// Starts `service` against the server at `endpoint` (the server's own,
    /// or a fault proxy in front of it) with its credentials, a small ARC
    /// and, unless the test set one, a short metadata TTL.
    fn start_at(server: &S3Server, endpoint: &str, service: Service) -> S3Service {
        let mut service = service
            .args(["--s3-endpoint", endpoint])
            .args(["--arc-max", "64MiB"])
            .env_remove("AWS_PROFILE")
            .env("HOME", "/nonexistent-l2arc-test-home");
        for (k, v) in server.aws_env() {
            service = service.env(k, v);
        }
        let ttl_set = service
            .command_mut()
            .get_args()
            .any(|a| a == "--metadata-ttl");
        if !ttl_set {
            service = service.args(["--metadata-ttl", &TTL_SECS.to_string()]);
        }
        spawn_until(service).unwrap_or_else(|why| panic!("{why}"))
    }

    fn mount(server: &S3Server, uri: &str, mnt: &Path, extra: &[&str]) -> S3Service {
        S3Service::mount_at(server, &server.endpoint(), uri, mnt, extra)
    }

    fn mount_at(
        server: &S3Server,
        endpoint: &str,
        uri: &str,
        mnt: &Path,
        extra: &[&str],
    ) -> S3Service {
        let service = Service::mount(Path::new(env!("CARGO_BIN_EXE_l2arc")), uri, mnt).args(extra);
        let s = S3Service::start_at(server, endpoint, service);
        assert!(is_mounted(mnt), "{mnt:?} is not mounted");
        s
    }

    /// SIGTERM, wait, and return the log (with the closing statistics).
    fn stop(mut self) -> String {
        let (status, _) = self.running.stop();
        assert!(
            status.success(),
            "exit {status}: {}",
            self.log.lock().unwrap()
        );
        // Let the gathering thread take the last lines.
        std::thread::sleep(Duration::from_millis(100));
        self.log.lock().unwrap().clone()
    }
}

/// A local tree and the same objects in the bucket.
fn populate(server: &S3Server, local: &Path) -> Vec<(String, Vec<u8>)> {
    let files: Vec<(String, Vec<u8>)> = vec![
        ("top.txt".into(), b"hello from s3\n".to_vec()),
        ("empty".into(), Vec::new()),
        ("a/one.bin".into(), pattern(3 * 1024 * 1024 + 17, 1)),
        ("a/b/two.bin".into(), pattern(200_000, 2)),
        ("a/b/c/three.bin".into(), pattern(1 << 20, 3)),
        ("z/last".into(), pattern(4096, 4)),
    ];
    for (key, data) in &files {
        server.put(BUCKET, key, data);
        let path = local.join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, data).unwrap();
    }
    files
}

fn setup() -> (S3Server, tempfile::TempDir) {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    (server, tempfile::tempdir().unwrap())
}

fn mkdir(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::create_dir_all(&p).unwrap();
    p
}

#[test]
fn s3_mount_serves_the_bucket_read_only() {
    let (server, dir) = setup();
    let local = mkdir(&dir, "local");
    populate(&server, &local);
    let mnt = mkdir(&dir, "mnt");
    let mount = S3Service::mount(&server, &format!("s3://{BUCKET}"), &mnt, &[]);
    // The whole tree, copied and compared.
    let copy = dir.path().join("copy");
    run(Command::new("cp").arg("-r").arg(&mnt).arg(&copy));
    run(Command::new("diff").arg("-r").arg(&local).arg(&copy));
    run(Command::new("diff").arg("-r").arg(&local).arg(&mnt));
    let mut names: Vec<String> = std::fs::read_dir(mnt.join("a"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["b", "one.bin"]);
    assert_eq!(
        std::fs::metadata(mnt.join("a/one.bin")).unwrap().len(),
        3 * 1024 * 1024 + 17
    );
    assert!(std::fs::metadata(mnt.join("a/b")).unwrap().is_dir());
    assert_eq!(
        std::fs::metadata(mnt.join("nope")).unwrap_err().kind(),
        std::io::ErrorKind::NotFound
    );
    // Writes of every kind: EROFS.
    let erofs = |r: std::io::Result<()>| {
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EROFS));
    };
    erofs(std::fs::write(mnt.join("new"), b"x"));
    erofs(std::fs::write(mnt.join("top.txt"), b"x"));
    erofs(std::fs::create_dir(mnt.join("d")));
    erofs(std::fs::remove_file(mnt.join("top.txt")));
    erofs(std::fs::rename(mnt.join("top.txt"), mnt.join("t2")));
    // A 4 MiB file written by fio with checksums, read back at random
    // through the mount and verified block by block.
    let fio_local = local.join("fio.dat");
    let job = |rw: &str, file: &Path| {
        let mut c = tool("fio", "fio");
        c.args([
            "--name=v",
            "--bs=4k",
            "--size=4M",
            "--ioengine=psync",
            "--verify=crc32c",
            "--verify_state_save=0",
            "--randrepeat=1",
            &format!("--rw={rw}"),
        ])
        .arg(format!("--filename={}", file.display()))
        .current_dir(dir.path());
        c
    };
    run(job("write", &fio_local).arg("--do_verify=0"));
    server.put(BUCKET, "fio.dat", &std::fs::read(&fio_local).unwrap());
    std::thread::sleep(Duration::from_secs_f64(TTL_SECS + 0.3)); // the listing's TTL
    run(job("randread", &mnt.join("fio.dat"))
        .arg("--verify_only")
        .arg("--readonly"));
    let log = mount.stop();
    assert!(gets_in(&log) > 0);
}

#[test]
fn s3_sequential_read_ahead_fetches_spans_of_records_per_get() {
    const OBJECT_BYTES: usize = 48 << 20;
    let (server, dir) = setup();
    let data = pattern(OBJECT_BYTES, 7);
    server.put(BUCKET, "big", &data);
    let mnt = mkdir(&dir, "mnt");
    let mount = S3Service::mount(&server, &format!("s3://{BUCKET}"), &mnt, &[]);
    assert!(std::fs::read(mnt.join("big")).unwrap() == data);
    let log = mount.stop();
    // 48 records of 1 MiB: one GET each before read-ahead went in spans,
    // 17-18 with a ramping window and 4 MiB spans; now the window (64 MiB)
    // opens at the first read, claimed before that read looks its record
    // up, and is streamed by one GET: 1 on a quiet machine. The bound
    // leaves room for a loaded one (a span given up and asked again, a
    // read-ahead job dropped from a full queue) and fails the ramp.
    let gets = gets_in(&log);
    assert!(
        gets <= 4,
        "{gets} GETs for a 48 MiB sequential read:\n{log}"
    );
}

#[test]
fn s3_many_names_pass_through_a_small_node_table() {
    const NAMES: usize = 150;
    let (server, dir) = setup();
    for i in 0..NAMES {
        server.put(BUCKET, &format!("n/{i}"), i.to_string().as_bytes());
    }
    let mnt = mkdir(&dir, "mnt");
    let mount = S3Service::mount(
        &server,
        &format!("s3://{BUCKET}"),
        &mnt,
        &["--max-nodes", "24"],
    );
    // Six times as many names as the table holds: idle nodes are given
    // back to make room (the kernel asked to drop their entries), so each
    // name gets in after at most a short wait with ENFILE.
    for i in 0..NAMES {
        let path = mnt.join(format!("n/{i}"));
        let give_up = Instant::now() + Duration::from_secs(10);
        let text = loop {
            match std::fs::read_to_string(&path) {
                Err(e) if e.raw_os_error() == Some(libc::ENFILE) && Instant::now() < give_up => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                other => break other.unwrap_or_else(|e| panic!("{}: {e}", path.display())),
            }
        };
        assert_eq!(text, i.to_string());
    }
    mount.stop();
}

/// Blocks of 64 KiB that each say which version they belong to.
fn versioned(len: usize, version: u8) -> Vec<u8> {
    let mut data = pattern(len, u64::from(version) + 100);
    for chunk in data.chunks_mut(64 << 10) {
        chunk[0] = version;
    }
    data
}

fn check_blocks(got: &[u8], old: &[u8], new: &[u8], what: &str) -> (usize, usize) {
    assert_eq!(got.len(), new.len(), "{what}: size");
    let (mut olds, mut news) = (0, 0);
    for (i, block) in got.chunks(64 << 10).enumerate() {
        let range = i * (64 << 10)..i * (64 << 10) + block.len();
        if block == &new[range.clone()] {
            news += 1;
        } else if block == &old[range] {
            olds += 1;
        } else {
            panic!("{what}: block {i} is neither the old nor the new version");
        }
    }
    (olds, news)
}

/// Replaces `obj` (now `current`, held open as `file`) by a shorter
/// version: the open file reads exactly it, never the old length (the
/// kernel must take the new size from getattr).
fn open_file_sees_a_shorter_version(server: &S3Server, file: &std::fs::File, current: &[u8]) {
    let shorter = versioned(current.len() / 2 + 12_345, 4);
    server.put(BUCKET, "obj", &shorter);
    let deadline = Instant::now() + Duration::from_secs_f64(3.0 * TTL_SECS + 2.0);
    loop {
        std::thread::sleep(Duration::from_secs_f64(TTL_SECS + 0.2));
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut &*file, &mut got).unwrap();
        std::io::Seek::rewind(&mut &*file).unwrap();
        if got.len() == shorter.len() {
            assert!(
                got == shorter,
                "open file: old bytes in the shorter version"
            );
            return;
        }
        // Until the kernel asks again it may read the old version whole,
        // never anything else.
        assert!(
            got == current,
            "open file: {} bytes, neither version",
            got.len()
        );
        assert!(Instant::now() < deadline, "open file kept the old version");
    }
}

#[test]
fn s3_two_mounts_serve_only_new_bytes_after_an_overwrite() {
    let (server, dir) = setup();
    let len = 4 << 20;
    let old = versioned(len, 1);
    server.put(BUCKET, "obj", &old);
    let (mnt1, mnt2) = (mkdir(&dir, "m1"), mkdir(&dir, "m2"));
    let uri = format!("s3://{BUCKET}");
    // Small records so that a read spans several: a mix would show.
    let m1 = S3Service::mount(&server, &uri, &mnt1, &["--recordsize", "64K"]);
    let m2 = S3Service::mount(&server, &uri, &mnt2, &["--recordsize", "64K"]);
    assert_eq!(std::fs::read(mnt1.join("obj")).unwrap(), old);
    assert_eq!(std::fs::read(mnt2.join("obj")).unwrap(), old);
    let new = versioned(len, 2);
    server.put(BUCKET, "obj", &new);
    // Within the TTL either version may be served, block by block whole.
    for mnt in [&mnt1, &mnt2] {
        check_blocks(
            &std::fs::read(mnt.join("obj")).unwrap(),
            &old,
            &new,
            "within the TTL",
        );
    }
    std::thread::sleep(Duration::from_secs_f64(TTL_SECS + 0.5));
    for mnt in [&mnt1, &mnt2] {
        let got = std::fs::read(mnt.join("obj")).unwrap();
        let (olds, _) = check_blocks(&got, &old, &new, "after the TTL");
        assert_eq!(olds, 0, "{mnt:?} served old bytes after the TTL");
    }
    // An open file that keeps being read sees the change too.
    let file = std::fs::File::open(mnt1.join("obj")).unwrap();
    let newer = versioned(len, 3);
    server.put(BUCKET, "obj", &newer);
    std::thread::sleep(Duration::from_secs_f64(TTL_SECS + 0.5));
    let mut got = vec![0u8; len];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut got, 0).unwrap();
    // The kernel may need its attribute timeout once more to drop pages.
    let deadline = Instant::now() + Duration::from_secs_f64(3.0 * TTL_SECS + 2.0);
    loop {
        let (olds, _) = check_blocks(&got, &new, &newer, "open file");
        if olds == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "open file kept old bytes");
        std::thread::sleep(Duration::from_millis(200));
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut got, 0).unwrap();
    }
    open_file_sees_a_shorter_version(&server, &file, &newer);
    drop(file);
    // A deleted object disappears after the TTL.
    server.delete(BUCKET, "obj");
    std::thread::sleep(Duration::from_secs_f64(TTL_SECS + 0.5));
    for mnt in [&mnt1, &mnt2] {
        let e = std::fs::read(mnt.join("obj")).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{mnt:?}: {e}");
    }
    m1.stop();
    m2.stop();
}

#[test]
fn s3_mount_is_warm_after_a_restart() {
    let (server, dir) = setup();
    let local = mkdir(&dir, "local");
    let files = populate(&server, &local);
    let mnt = mkdir(&dir, "mnt");
    let device = dir.path().join("l2.img");
    // The L2ARC's own warmth: no prewarm of the ARC at the restart (it
    // would serve the small reads below from DRAM; the prewarm has a test
    // of its own below).
    let args = [
        "--cache",
        device.to_str().unwrap(),
        "--cache-size",
        "64MiB",
        "--metadata-ttl",
        "60",
        "--l2arc-prewarm",
        "false",
    ];
    let uri = format!("s3://{BUCKET}");
    let mount = S3Service::mount(&server, &uri, &mnt, &args);
    run(Command::new("diff").arg("-r").arg(&local).arg(&mnt));
    // The feeder copies the records to flash within a feed interval.
    std::thread::sleep(Duration::from_secs(3));
    let log = mount.stop();
    let cold_gets = gets_in(&log);
    assert!(cold_gets >= files.len() as u64 - 1, "{log}");
    assert!(l2arc_testkit::kstat(&log, "l2_write_bytes") > 0, "{log}");

    let mount = S3Service::mount(&server, &uri, &mnt, &args);
    // Small direct reads of 1 MiB records first: each takes 4 KiB and the
    // record's sector table from flash, not the whole record.
    let (_, big) = &files[2];
    for block in [5u64, 300, 301, 511, 700] {
        let out = Command::new("dd")
            .arg(format!("if={}", mnt.join("a/one.bin").display()))
            .args(["bs=4096", "count=1", "iflag=direct", "status=none"])
            .arg(format!("skip={block}"))
            .output()
            .expect("run dd");
        assert!(out.status.success(), "dd: {out:?}");
        let at = block as usize * 4096;
        assert!(out.stdout == big[at..at + 4096], "block {block} differs");
    }
    run(Command::new("diff").arg("-r").arg(&local).arg(&mnt));
    let log = mount.stop();
    assert_eq!(gets_in(&log), 0, "a restarted mount went to S3:\n{log}");
    assert!(l2arc_testkit::kstat(&log, "l2_hits") > 0, "{log}");
    assert!(l2arc_testkit::kstat(&log, "l2_sector_hits") >= 4, "{log}");
}

/// An object overwritten while the mount was stopped (same size, a new
/// ETag) is not prewarmed at the restart, and its new bytes are read; the
/// object left alone is prewarmed, with no GET.
#[test]
fn s3_an_object_overwritten_while_stopped_is_not_prewarmed() {
    let (server, dir) = setup();
    let mnt = mkdir(&dir, "mnt");
    let old = pattern(2 << 20, 7);
    let new = pattern(2 << 20, 8);
    server.put(BUCKET, "kept", &pattern(2 << 20, 6));
    server.put(BUCKET, "changed", &old);
    let device = dir.path().join("l2.img");
    let args = [
        "--cache",
        device.to_str().unwrap(),
        "--cache-size",
        "64MiB",
        "--l2arc-write-max",
        "64MiB",
    ];
    let uri = format!("s3://{BUCKET}");
    let mount = S3Service::mount(&server, &uri, &mnt, &args);
    assert!(std::fs::read(mnt.join("changed")).unwrap() == old);
    assert!(std::fs::read(mnt.join("kept")).unwrap() == pattern(2 << 20, 6));
    std::thread::sleep(Duration::from_secs(3));
    let log = mount.stop();
    assert!(
        log.contains("l2arc: stopping: saved the ARC's shape ("),
        "{log}"
    );
    server.put(BUCKET, "changed", &new);

    let mount = S3Service::mount(&server, &uri, &mnt, &args);
    let deadline = Instant::now() + Duration::from_secs(60);
    let done = loop {
        let log = mount.log.lock().unwrap().clone();
        if let Some(line) = log.lines().find(|l| l.starts_with("l2arc: prewarm: done:")) {
            break line.to_string();
        }
        assert!(Instant::now() < deadline, "no prewarm done line: {log}");
        std::thread::sleep(Duration::from_millis(50));
    };
    // 2 MiB objects of 1 MiB records: 2 stale, 2 prewarmed.
    assert!(
        done.starts_with("l2arc: prewarm: done: 2 records"),
        "{done}"
    );
    assert!(done.contains(" 2 stale,"), "{done}");
    assert!(std::fs::read(mnt.join("changed")).unwrap() == new);
    assert!(std::fs::read(mnt.join("kept")).unwrap() == pattern(2 << 20, 6));
    let log = mount.stop();
    let gets = gets_in(&log);
    assert!(
        (1..=2).contains(&gets),
        "{gets} GETs: the changed object's only: {log}"
    );
}

#[test]
fn s3_mount_refuses_a_missing_bucket_and_wrong_credentials_in_one_line() {
    let (server, dir) = setup();
    let mnt = mkdir(&dir, "mnt");
    let l2arc = |uri: &str, secret: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_l2arc"));
        c.args(["mount", uri, mnt.to_str().unwrap()])
            .args(["--s3-endpoint", &server.endpoint()])
            .env("HOME", "/nonexistent-l2arc-test-home")
            .env("AWS_ACCESS_KEY_ID", l2arc_testkit::s3::ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", secret)
            .env("AWS_REGION", "us-east-1");
        c.output().unwrap()
    };
    let out = l2arc("s3://no-such-bucket", l2arc_testkit::s3::SECRET_KEY);
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "NoSuchBucket");
    let out = l2arc(&format!("s3://{BUCKET}"), "not-the-secret-123");
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "SignatureDoesNotMatch");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("not-the-secret-123"));
    assert!(!is_mounted(&mnt));
}

#[test]
fn s3_nbd_export_of_an_image_object_reads_like_the_object() {
    let (server, dir) = setup();
    let image = dir.path().join("disk.img");
    let data = pattern(8 << 20, 9);
    std::fs::write(&image, &data).unwrap();
    server.put(BUCKET, "images/disk.img", &data);
    let socket = dir.path().join("nbd.sock");
    let nbd = S3Service::serve_nbd(
        &server,
        &server.endpoint(),
        &format!("s3://{BUCKET}/images/disk.img"),
        &socket,
        &[
            "--read-only",
            // One GET per record, counted below: no read-ahead spans.
            "--zfs-prefetch-disable",
            "true",
        ],
    );
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    run(tool("qemu-img", "qemu-utils")
        .args(["compare", "-f", "raw", "-F", "raw", &uri])
        .arg(&image));
    // Twice: the second pass is served by the cache (no new GETs).
    run(tool("qemu-img", "qemu-utils")
        .args(["compare", "-f", "raw", "-F", "raw", &uri])
        .arg(&image));
    let log = nbd.stop();
    assert_eq!(gets_in_nbd(&log), 8, "one GET per 1 MiB record:\n{log}");
}

fn gets_in_nbd(log: &str) -> u64 {
    l2arc_testkit::kstat(log, "primary_reads")
}

/// Runs `f` on a thread of its own and waits for it at most `within`, so
/// that a read the old retry sequences hold for minutes fails the test at
/// the bound.
fn within<T: Send + 'static>(
    within: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> (T, Duration) {
    let started = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    let result = rx
        .recv_timeout(within)
        .unwrap_or_else(|_| panic!("no answer within {within:?}"));
    (result, started.elapsed())
}

/// One `pread(2)` of 128 KiB: the bytes or the errno.
fn pread_errno(file: &Arc<std::fs::File>, offset: u64) -> Result<usize, i32> {
    let mut buf = vec![0u8; 128 << 10];
    std::os::unix::fs::FileExt::read_at(&**file, &mut buf, offset)
        .map_err(|e| e.raw_os_error().unwrap_or(0))
}

#[test]
fn s3_mount_read_against_a_hung_server_fails_with_eio_within_one_retry_sequence() {
    let (server, dir) = setup();
    let data = pattern(16 << 20, 51);
    server.put(BUCKET, "obj", &data);
    let proxy = l2arc_testkit::s3::FaultProxy::start(server.addr());
    let mnt = mkdir(&dir, "mnt");
    // The issue's settings: three tries of 2 s, so about 6 s for the one
    // sequence a read may make (the read deadline, 30 s, is not reached).
    let mount = S3Service::mount_at(
        &server,
        &proxy.endpoint(),
        &format!("s3://{BUCKET}"),
        &mnt,
        &[
            "--s3-timeout",
            "2",
            "--s3-retries",
            "2",
            "--metadata-ttl",
            "60",
        ],
    );
    let file = Arc::new(std::fs::File::open(mnt.join("obj")).unwrap());
    server.pause();
    let gets = proxy.counts().gets;
    let (result, took) = {
        let file = Arc::clone(&file);
        within(Duration::from_secs(6 + 3), move || pread_errno(&file, 0))
    };
    assert_eq!(result, Err(libc::EIO), "after {took:?}");
    let tries = proxy.counts().gets - gets;
    assert!(
        (1..=3).contains(&tries),
        "{tries} GETs for one read (one sequence is 3 tries)"
    );
    // Another read at once: the server is known not to answer; EIO
    // without a request.
    let gets = proxy.counts().gets;
    let (result, took) = {
        let file = Arc::clone(&file);
        within(Duration::from_secs(3), move || pread_errno(&file, 8 << 20))
    };
    assert_eq!(result, Err(libc::EIO), "after {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(
        proxy.counts().gets,
        gets,
        "a request while the server is down"
    );
    // Back: reads work again once a probe finds the server.
    server.resume();
    let deadline = Instant::now() + Duration::from_secs(20);
    while pread_errno(&file, 0).is_err() {
        assert!(
            Instant::now() < deadline,
            "still failing after the server came back"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(file);
    assert!(std::fs::read(mnt.join("obj")).unwrap() == data);
    mount.stop();
}

#[test]
fn s3_nbd_read_against_a_hung_server_is_an_nbd_eio_by_the_read_deadline() {
    let (server, dir) = setup();
    let data = pattern(8 << 20, 52);
    server.put(BUCKET, "disk.img", &data);
    let socket = dir.path().join("nbd.sock");
    let nbd = S3Service::serve_nbd(
        &server,
        &server.endpoint(),
        &format!("s3://{BUCKET}/disk.img"),
        &socket,
        &[
            "--read-only",
            // A request timeout beyond the deadline: the deadline ends it.
            "--s3-timeout",
            "20",
            "--s3-read-deadline",
            "3",
        ],
    );
    server.pause();
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    let (out, took) = within(Duration::from_secs(3 + 5), move || {
        tool("qemu-io", "qemu-utils")
            .args(["-r", "-f", "raw", &uri, "-c", "read 0 64k"])
            .output()
            .unwrap()
    });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("Input/output error"),
        "after {took:?}: {text}"
    );
    server.resume();
    nbd.stop();
}

/// Spawns `cmd` (stderr piped) as a service and waits for its `ready`
/// line; its log if it never came (the process ended or 30 s went by).
/// Starts `service` (30 s for its ready line) and gathers its log; `Err`
/// says how it ended and what it printed.
fn spawn_until(service: Service) -> Result<S3Service, String> {
    let mut running = service.ready_within(Duration::from_secs(30)).try_start()?;
    let log = running.gather_stderr();
    Ok(S3Service { running, log })
}

/// A HOME whose ~/.aws names the server in profile "other" (endpoint_url,
/// credentials) and a dead endpoint in the default profile.
fn aws_home(server: &S3Server, dir: &tempfile::TempDir) -> PathBuf {
    let home = mkdir(dir, "home");
    std::fs::create_dir_all(home.join(".aws")).unwrap();
    let config = format!(
        "[default]\nregion = us-east-1\nendpoint_url = http://127.0.0.1:1\n\n\
         [profile other]\nregion = us-east-1\nendpoint_url = {}\n",
        server.endpoint()
    );
    std::fs::write(home.join(".aws/config"), config).unwrap();
    let credentials = format!(
        "[other]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
        l2arc_testkit::s3::ACCESS_KEY,
        l2arc_testkit::s3::SECRET_KEY
    );
    std::fs::write(home.join(".aws/credentials"), credentials).unwrap();
    home
}

#[test]
fn s3_endpoint_url_comes_from_the_aws_config_in_aws_precedence() {
    let (server, dir) = setup();
    server.put(BUCKET, "f", b"from the config's endpoint\n");
    let home = aws_home(&server, &dir);
    let mnt = mkdir(&dir, "mnt");
    let l2arc = |env: &[(&str, &str)], flags: &[&str]| {
        let bin = Path::new(env!("CARGO_BIN_EXE_l2arc"));
        let mut service = Service::mount(bin, format!("s3://{BUCKET}"), &mnt)
            .args(flags)
            .env("HOME", &home);
        for name in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_REGION",
            "AWS_ENDPOINT_URL",
            "AWS_ENDPOINT_URL_S3",
            "AWS_CONFIG_FILE",
            "AWS_SHARED_CREDENTIALS_FILE",
        ] {
            service = service.env_remove(name);
        }
        for (k, v) in env {
            service = service.env(k, v);
        }
        service
    };
    // The profile's endpoint_url, no flag, no AWS_ENDPOINT_URL: mounted.
    let service = spawn_until(l2arc(&[("AWS_PROFILE", "other")], &[]))
        .unwrap_or_else(|log| panic!("not mounted through the profile's endpoint_url: {log}"));
    assert_eq!(
        std::fs::read(mnt.join("f")).unwrap(),
        b"from the config's endpoint\n"
    );
    service.stop();
    // AWS_ENDPOINT_URL wins over the file (here: a port nothing listens on).
    let env = [
        ("AWS_PROFILE", "other"),
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:1"),
    ];
    let out = l2arc(&env, &[]).into_command().output().unwrap();
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "http://127.0.0.1:1");
    // The flag wins over both.
    let service = spawn_until(l2arc(&env, &["--s3-endpoint", &server.endpoint()]))
        .unwrap_or_else(|log| panic!("not mounted through the flag's endpoint: {log}"));
    service.stop();
}

#[test]
fn s3_start_up_errors_name_their_cause_in_one_line() {
    let (server, dir) = setup();
    let mnt = mkdir(&dir, "mnt");
    let home = mkdir(&dir, "home"); // no ~/.aws at all
    let l2arc = |uri: &str, endpoint: &str, creds: Option<(&str, &str)>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_l2arc"));
        c.args(["mount", uri, mnt.to_str().unwrap()])
            .args(["--s3-endpoint", endpoint])
            .env("HOME", &home)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY");
        if let Some((key, secret)) = creds {
            c.env("AWS_ACCESS_KEY_ID", key)
                .env("AWS_SECRET_ACCESS_KEY", secret);
        }
        let out = c.output().unwrap();
        let text = String::from_utf8_lossy(&out.stderr).to_string();
        (out, text)
    };
    let bucket = format!("s3://{BUCKET}");
    let ok = Some((l2arc_testkit::s3::ACCESS_KEY, l2arc_testkit::s3::SECRET_KEY));
    let endpoint = server.endpoint();
    let (out, text) = l2arc("s3://no-such-bucket", &endpoint, ok);
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "NoSuchBucket");
    assert!(text.contains("no such bucket"), "{text}");
    let (out, text) = l2arc(&bucket, &endpoint, Some(("nobody", "whatever-secret")));
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "access key");
    assert!(
        text.contains("not known") && !text.contains("bucket?"),
        "{text}"
    );
    let (out, text) = l2arc(
        &bucket,
        &endpoint,
        Some((l2arc_testkit::s3::ACCESS_KEY, "not-the-secret-123")),
    );
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "SignatureDoesNotMatch");
    assert!(
        text.contains("secret") && !text.contains("not-the-secret-123"),
        "{text}"
    );
    let not_s3 = l2arc_testkit::s3::NotS3Server::start();
    let (out, text) = l2arc(&bucket, &not_s3.endpoint(), ok);
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "not an S3 server");
    assert!(text.contains("404") && !text.contains("bucket?"), "{text}");
    let refused = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let (out, text) = l2arc(&bucket, &refused, ok);
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "Connection refused (os error 111)");
    assert!(text.contains(&refused), "{text}");
    let (out, text) = l2arc(&bucket, &endpoint, None);
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "AWS_ACCESS_KEY_ID");
    for name in ["AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "~/.aws/credentials"] {
        assert!(text.contains(name), "{name} not named: {text}");
    }
    assert!(!is_mounted(&mnt));
}

#[test]
fn s3_mount_stale_if_error_serves_cached_files_while_the_server_is_down() {
    let (server, dir) = setup();
    let data = pattern(3 << 20, 53);
    server.put(BUCKET, "obj", &data);
    let mnt = mkdir(&dir, "mnt");
    let mount = S3Service::mount(
        &server,
        &format!("s3://{BUCKET}"),
        &mnt,
        &[
            "--stale-if-error",
            "--s3-timeout",
            "1",
            "--s3-retries",
            "1",
            "--s3-read-deadline",
            "2",
        ],
    );
    assert!(std::fs::read(mnt.join("obj")).unwrap() == data);
    server.pause();
    std::thread::sleep(Duration::from_secs_f64(TTL_SECS + 0.5));
    // Past the TTL, the server down: the cached bytes, again and again.
    for round in 0..3 {
        let path = mnt.join("obj");
        let (got, took) = within(Duration::from_secs(2 + 5), move || std::fs::read(path));
        let got = got.unwrap_or_else(|e| panic!("round {round}, after {took:?}: {e}"));
        assert!(got == data, "round {round}: not the cached bytes");
        std::thread::sleep(Duration::from_secs_f64(TTL_SECS));
    }
    server.resume();
    let log = mount.stop();
    let line = log
        .lines()
        .find(|l| l.starts_with("l2arc: s3 requests: "))
        .unwrap_or_else(|| panic!("no s3 requests line in:\n{log}"));
    let stale: u64 = line
        .split(", ")
        .find_map(|part| part.strip_suffix(" served stale (stale-if-error)"))
        .unwrap_or_else(|| panic!("no stale count in {line}"))
        .parse()
        .unwrap();
    assert!(stale >= 1, "{line}");
}

#[test]
fn s3_nbd_sequential_read_gets_read_ahead_spans() {
    const OBJECT_BYTES: usize = 64 << 20;
    let (server, dir) = setup();
    let data = pattern(OBJECT_BYTES, 54);
    server.put(BUCKET, "vm.raw", &data);
    let proxy = l2arc_testkit::s3::FaultProxy::start(server.addr());
    let socket = dir.path().join("nbd.sock");
    let nbd = S3Service::serve_nbd(
        &server,
        &proxy.endpoint(),
        &format!("s3://{BUCKET}/vm.raw"),
        &socket,
        &["--read-only"],
    );
    let gets = proxy.counts().gets;
    let copy = dir.path().join("copy.raw");
    run(tool("nbdcopy", "libnbd-bin")
        .arg(format!("nbd+unix:///?socket={}", socket.display()))
        .arg(&copy));
    let gets = proxy.counts().gets - gets;
    assert!(
        std::fs::read(&copy).unwrap() == data,
        "nbdcopy read other bytes"
    );
    let log = nbd.stop();
    // 64 records of 1 MiB: 62 GETs before the engine watched streams (the
    // records before a miss were all being read by the client's other
    // requests, so the ARC-history read-ahead saw no stream); now the
    // first record and one span, as the mount: 2 (in each of 12 runs beside
    // two busy loops). The bound leaves room for a loaded machine.
    assert!(
        gets <= 8,
        "{gets} GETs for a 64 MiB sequential read:\n{log}"
    );
}
