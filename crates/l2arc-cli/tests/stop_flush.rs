//! A clean stop keeps what only DRAM held: on SIGTERM, once the front end
//! has drained (the NBD export) or unmounted (the directory and S3
//! mounts), the service writes the ARC's records that are not on flash to
//! its cache device and says so in one stop line; started again on the
//! same device, it reads the whole data set without one read of primary
//! storage. Measured before the flush existed: `serve-nbd` of a 64 MiB
//! image with a 32 MiB ARC read the records that were only in DRAM at the
//! stop from primary again after the restart.
//!
//! Every tool is required (nbdcopy, fusermount3, versitygw): a missing one
//! fails the test with a pointer to `scripts/setup.sh`, never a skip.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use l2arc_testkit::nbd::pattern;
use l2arc_testkit::s3::S3Server;
use l2arc_testkit::service::{Running, Service};

const DATA_BYTES: usize = 64 << 20;

fn l2arc() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_l2arc"))
}

/// A kstat from `name value` lines (`ctl stats`, or the closing
/// statistics a service prints).
/// Waits until the cache device has rebuilt its index and takes reads
/// (a read before that would go to primary storage).
fn wait_online(control: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let devices = ctl(control, &["devices"]);
        if devices.starts_with("0 online") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the device did not come online: {devices}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The stop flush's line among a stopped service's lines, if it printed
/// one: (records written, records left).
fn stop_flush(lines: &[String]) -> Option<(String, u64, u64)> {
    let line = lines
        .iter()
        .find(|l| l.starts_with("l2arc: stopping: wrote "))?;
    let number_after = |word: &str| -> u64 {
        let at = line
            .find(word)
            .unwrap_or_else(|| panic!("no `{word}` in {line}"));
        line[at + word.len()..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap_or_else(|e| panic!("{line}: {e}"))
    };
    let written = number_after("stopping: wrote ");
    let left = number_after("ms; ");
    Some((line.clone(), written, left))
}

/// SIGTERM: the stop flush's line (if any) and every line after the
/// ready line, for the message of a failure.
fn stop(service: &mut Running) -> (Option<(String, u64, u64)>, String) {
    let (status, rest) = service.stop();
    assert!(status.success(), "exit {status}:\n{}", rest.join("\n"));
    (stop_flush(&rest), rest.join("\n"))
}

/// The first run's stop line says it wrote records and left none (checked
/// after the restart's reads, so that a build without the flush fails on
/// what matters: the restart reading primary storage).
fn assert_wrote_all(first_stop: Option<(String, u64, u64)>, log: &str) {
    let (line, written, left) =
        first_stop.unwrap_or_else(|| panic!("no stop flush line at the first stop:\n{log}"));
    assert!(written > 0, "{line}");
    assert_eq!(left, 0, "{line}");
    assert!(line.ends_with(" left (budget 5 s)"), "{line}");
    assert!(line.contains(" records (0.0 MiB) left"), "{line}");
}

/// `serve-nbd` of a 64 MiB image with a 32 MiB ARC and a 128 MiB cache
/// file, read whole, stopped, started again and read whole: no read of
/// the image the second time, every byte right.
#[test]
fn serve_nbd_keeps_what_only_the_arc_held_across_a_clean_stop() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    let data = pattern(DATA_BYTES, 33);
    std::fs::write(&image, &data).unwrap();
    let socket = dir.path().join("nbd.sock");
    let control = dir.path().join("ctl.sock");
    let device = dir.path().join("l2.img");
    let copy = dir.path().join("copy.img");
    let start = || {
        Service::serve_nbd(l2arc(), &image)
            .listen_unix(&socket)
            .args(["--arc-max", "32MiB", "--cache"])
            .arg(&device)
            .args(["--cache-size", "128MiB", "--control"])
            .arg(&control)
            .start()
    };
    let nbdcopy = |uri: &str| {
        l2arc_testkit::run(
            l2arc_testkit::tool("nbdcopy", "libnbd-bin")
                .arg(uri)
                .arg(&copy),
        );
        assert!(
            std::fs::read(&copy).unwrap() == data,
            "the copy differs from the image"
        );
    };

    let mut first = start();
    nbdcopy(&first.uri());
    let cold = ctl(&control, &["stats"]);
    assert!(l2arc_testkit::kstat(&cold, "primary_reads") > 0, "{cold}");
    let (first_stop, first_log) = stop(&mut first);

    let mut second = start();
    wait_online(&control);
    nbdcopy(&second.uri());
    let warm = ctl(&control, &["stats"]);
    let (_, second_log) = stop(&mut second);
    assert_eq!(
        l2arc_testkit::kstat(&warm, "primary_reads"),
        0,
        "the restart read the image again:\n{warm}\nfirst stop:\n{first_log}\nsecond stop:\n{second_log}"
    );
    assert_wrote_all(first_stop, &first_log);
    assert!(l2arc_testkit::kstat(&warm, "l2_hits") > 0, "{warm}");
}

/// The directory mount: a 64 MiB file read through a 32 MiB ARC, the
/// mount stopped and mounted again, the file read again from flash alone.
#[test]
fn a_directory_mount_keeps_what_only_the_arc_held_across_a_clean_stop() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let data = pattern(DATA_BYTES, 34);
    std::fs::write(src.join("big.bin"), &data).unwrap();
    let control = dir.path().join("ctl.sock");
    let device = dir.path().join("l2.img");
    l2arc_testkit::tool("fusermount3", "fuse3");
    let start = || {
        Service::mount(l2arc(), &src, &mnt)
            .args(["--arc-max", "32MiB", "--cache"])
            .arg(&device)
            .args(["--cache-size", "128MiB", "--control"])
            .arg(&control)
            .start()
    };
    let read_all = || {
        assert!(
            std::fs::read(mnt.join("big.bin")).unwrap() == data,
            "the file read through the mount differs"
        );
    };

    let mut first = start();
    read_all();
    assert!(l2arc_testkit::kstat(&ctl(&control, &["stats"]), "primary_reads") > 0);
    let (first_stop, first_log) = stop(&mut first);

    let mut second = start();
    wait_online(&control);
    read_all();
    let warm = ctl(&control, &["stats"]);
    let (_, second_log) = stop(&mut second);
    assert_eq!(
        l2arc_testkit::kstat(&warm, "primary_reads"),
        0,
        "the remount read the file again:\n{warm}\nfirst stop:\n{first_log}\nsecond stop:\n{second_log}"
    );
    assert_wrote_all(first_stop, &first_log);
}

const BUCKET: &str = "bkt";

/// `mount s3://BUCKET` against versitygw, its feeder kept quiet (an hour
/// between feeds, no early wake, no write-back), so that whatever reaches
/// flash is the stop flush's: after a restart, the object is read with no
/// GET at all.
#[test]
fn an_s3_mount_keeps_what_only_the_arc_held_across_a_clean_stop() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(16 << 20, 35);
    server.put(BUCKET, "object.bin", &data);
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let control = dir.path().join("ctl.sock");
    let device: PathBuf = dir.path().join("l2.img");
    // (The file, as `--l2arc-writeback-max` takes no 0.)
    let config = dir.path().join("l2arc.toml");
    std::fs::write(&config, "l2arc_writeback_max = 0\n").unwrap();
    let start = || {
        let mut service = Service::mount(l2arc(), format!("s3://{BUCKET}"), &mnt)
            .args(["--s3-endpoint", &server.endpoint()])
            .args(["--arc-max", "64MiB", "--cache"])
            .arg(&device)
            .args(["--cache-size", "64MiB", "--control"])
            .arg(&control)
            .args([
                "--l2arc-feed-secs",
                "3600",
                "--l2arc-feed-min-ms",
                "3600000",
            ])
            .args(["--l2arc-feed-again", "false", "--config"])
            .arg(&config)
            .env_remove("AWS_PROFILE")
            .env("HOME", "/nonexistent-l2arc-test-home");
        for (k, v) in server.aws_env() {
            service = service.env(k, v);
        }
        service.start()
    };
    let read_all = || {
        assert!(
            std::fs::read(mnt.join("object.bin")).unwrap() == data,
            "the object read through the mount differs"
        );
    };

    let mut first = start();
    // A device's feeder makes its first pass 10 ms after the device is
    // added, then sleeps for the hour: let that pass go by before reading.
    std::thread::sleep(Duration::from_millis(300));
    read_all();
    let cold = ctl(&control, &["stats"]);
    assert!(l2arc_testkit::kstat(&cold, "primary_reads") > 0, "{cold}");
    assert_eq!(
        l2arc_testkit::kstat(&cold, "l2_bufs"),
        0,
        "the quiet feeder wrote:\n{cold}"
    );
    let (first_stop, first_log) = stop(&mut first);

    let mut second = start();
    wait_online(&control);
    read_all();
    let warm = ctl(&control, &["stats"]);
    let (_, second_log) = stop(&mut second);
    assert_eq!(
        l2arc_testkit::kstat(&warm, "primary_reads"),
        0,
        "the remount read the bucket again:\n{warm}\nfirst stop:\n{first_log}\nsecond stop:\n{second_log}"
    );
    let gets = second_log
        .lines()
        .find(|l| l.starts_with("l2arc: s3 requests: "))
        .unwrap_or_else(|| panic!("no s3 requests line:\n{second_log}"));
    assert!(gets.starts_with("l2arc: s3 requests: 0 "), "{gets}");
    assert_wrote_all(first_stop, &first_log);
}

/// `l2arc ctl --socket SOCKET ARGS...` (the testkit's, with this binary).
fn ctl(socket: &std::path::Path, args: &[&str]) -> String {
    l2arc_testkit::ctl(l2arc(), socket, args)
}
