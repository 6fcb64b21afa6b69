//! Cache devices as an operator handles them, against the real binary: the
//! same device is refused a second slot (at start and through `ctl
//! add-cache`), a device error at start is one line naming the device
//! once, and adding and removing a device each leave one line in the log.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use l2arc_testkit::service::{Running, Service};

fn l2arc() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_l2arc"))
}

/// A scratch directory with a 4 MiB image to serve.
struct Scratch {
    dir: tempfile::TempDir,
    image: PathBuf,
    socket: PathBuf,
}

impl Scratch {
    fn new() -> Scratch {
        Scratch::with_image(vec![7u8; 4 << 20])
    }

    fn with_image(content: Vec<u8>) -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::write(&image, content).unwrap();
        let socket = dir.path().join("nbd.sock");
        Scratch { dir, image, socket }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `serve-nbd` of the image on a Unix socket, run from the scratch
    /// directory (so relative paths are relative to it).
    fn serve_nbd(&self, extra: &[&str]) -> Service {
        let mut service = Service::serve_nbd(l2arc(), &self.image)
            .listen_unix(&self.socket)
            .args(["--arc-max", "16MiB"])
            .args(extra)
            .ready_within(Duration::from_secs(60));
        service.command_mut().current_dir(self.dir.path());
        service
    }
}

/// Runs a service that must fail to start: its output once it exits
/// (killed, and the test failed, if it is still running after 60 s).
fn run_to_exit(service: Service) -> Output {
    let mut command = service.into_command();
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{command:?} did not exit within 60 s; it said:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn ctl(socket: &Path, args: &[&str]) -> Output {
    Command::new(l2arc())
        .arg("ctl")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A slot's line of `ctl devices`, if there is one.
fn device_line(socket: &Path, slot: u8) -> Option<String> {
    let out = ctl(socket, &["devices"]);
    assert!(out.status.success(), "{out:?}");
    stdout(&out)
        .lines()
        .find(|l| l.starts_with(&format!("{slot} ")))
        .map(str::to_string)
}

/// The service did not start: it exited nonzero, and its last line is
/// the one-line refusal (after the lines of the devices it attached).
fn assert_refused_at_start(out: &Output, refusal: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "it started: {stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("l2arc: ") && last.contains(refusal),
        "last line {last:?} is not the refusal {refusal:?}: {stderr}"
    );
    assert_eq!(
        stderr.matches("already attached").count(),
        1,
        "one refusal: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains(" serving "), "it started: {stderr}");
}

#[test]
fn the_same_cache_device_twice_at_start_is_refused() {
    let scratch = Scratch::new();
    let out = run_to_exit(scratch.serve_nbd(&[
        "--cache",
        "d.img",
        "--cache",
        "./d.img",
        "--cache-size",
        "64MiB",
    ]));
    assert_refused_at_start(
        &out,
        "cache device ./d.img is already attached as cache device 0 (d.img)",
    );
    // A symlink is the same device too.
    std::os::unix::fs::symlink(scratch.path("d.img"), scratch.path("link.img")).unwrap();
    let out = run_to_exit(scratch.serve_nbd(&[
        "--cache",
        "d.img",
        "--cache",
        "link.img",
        "--cache-size",
        "64MiB",
    ]));
    assert_refused_at_start(
        &out,
        "cache device link.img is already attached as cache device 0 (d.img)",
    );
}

#[test]
fn a_device_error_at_start_names_the_device_once() {
    let scratch = Scratch::new();
    let cases = [
        ("missing/d.img", "64MiB"),
        // Too small to be a cache device.
        ("small.img", "2MiB"),
    ];
    for (device, size) in cases {
        let out = run_to_exit(scratch.serve_nbd(&["--cache", device, "--cache-size", size]));
        let prefix = format!("cache device {device}");
        l2arc_testkit::assert_one_line_error(&out, "l2arc", &prefix);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr.matches(&prefix).count(),
            1,
            "the device is named once: {stderr}"
        );
    }
}

/// The next log line (after the ready line) that contains `text`.
fn log_line(service: &Running, text: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match service.stderr.recv_timeout(left) {
            Ok(line) if line.contains(text) => return line,
            Ok(_) => {}
            Err(e) => panic!("no log line with {text:?} within 60 s ({e})"),
        }
    }
}

#[test]
fn ctl_add_cache_of_an_attached_device_is_refused_and_changes_are_logged() {
    let scratch = Scratch::new();
    let control = scratch.path("ctl.sock");
    let running = scratch
        .serve_nbd(&[
            "--cache",
            "d.img",
            "--cache-size",
            "64MiB",
            "--control",
            control.to_str().unwrap(),
        ])
        .start();
    // The device attached at start is in the log, with its slot and size.
    let added = running
        .before_ready
        .iter()
        .find(|l| l.contains("cache device 0 (d.img"))
        .unwrap_or_else(|| panic!("no line for device 0: {:?}", running.before_ready));
    assert!(
        added.contains("attached") && added.contains("initialised"),
        "{added}"
    );

    std::os::unix::fs::symlink(scratch.path("d.img"), scratch.path("link.img")).unwrap();
    let dotted = scratch.path("sub/../d.img");
    std::fs::create_dir(scratch.path("sub")).unwrap();
    for path in [scratch.path("link.img"), dotted] {
        let out = ctl(&control, &["add-cache", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{path:?} was attached again: {out:?}"
        );
        assert!(
            stderr.contains("is already attached as cache device 0 (d.img"),
            "{stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert_eq!(
            stderr.matches("cache device").count(),
            2,
            "named twice: {stderr}"
        );
    }
    assert!(device_line(&control, 1).is_none(), "a second slot appeared");

    // Another device: added, then removed, one line each.
    let other = scratch.path("e.img");
    let out = ctl(&control, &["add-cache", other.to_str().unwrap(), "64MiB"]);
    assert!(out.status.success(), "{out:?}");
    let line = log_line(&running, "cache device 1 (");
    assert!(
        line.starts_with("l2arc: ") && line.contains("e.img") && line.contains("attached"),
        "{line}"
    );
    assert!(device_line(&control, 1).is_some());
    let out = ctl(&control, &["remove-cache", "1"]);
    assert!(out.status.success(), "{out:?}");
    let line = log_line(&running, "cache device 1 (");
    assert!(line.contains("removed"), "{line}");
    assert!(device_line(&control, 1).is_none());
}

/// A field `name=value` of a `ctl devices` line.
fn field(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {line}"))
        .parse()
        .unwrap()
}

/// An image six times over through a 128 MiB device, as in issue 32 (its
/// hand laps it again and again, a sweep of overwritten entries every
/// 8 MiB of it): `ctl devices` never shows `l2_asize` over the
/// device's data area, sampled all along (the service, a debug build,
/// also asserts it after every batch).
#[test]
fn allocated_size_stays_within_the_device_under_a_stream() {
    const COPIES: usize = 6;
    let scratch = Scratch::with_image(l2arc_testkit::nbd::pattern(160 << 20, 5));
    let control = scratch.path("ctl.sock");
    let running = scratch
        .serve_nbd(&[
            "--cache",
            "d.img",
            "--cache-size",
            "128MiB",
            "--control",
            control.to_str().unwrap(),
        ])
        .start();
    let uri = running.uri();
    let copies = std::sync::atomic::AtomicUsize::new(0);
    let (mut samples, mut most) = (0, 0);
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..COPIES {
                l2arc_testkit::run(
                    l2arc_testkit::tool("nbdcopy", "libnbd-bin")
                        .arg(&uri)
                        .arg("null:"),
                );
                copies.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        let mut sample = || {
            let line = device_line(&control, 0).expect("device 0 is attached");
            let (asize, size) = (field(&line, "l2_asize"), field(&line, "size_bytes"));
            assert!(asize <= size, "l2_asize over the data area: {line}");
            (samples, most) = (samples + 1, most.max(asize));
        };
        while copies.load(std::sync::atomic::Ordering::SeqCst) < COPIES {
            sample();
            std::thread::sleep(Duration::from_millis(10));
        }
        sample();
    });
    let stats = stdout(&ctl(&control, &["stats"]));
    let written: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("l2_write_bytes"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let size = field(&device_line(&control, 0).unwrap(), "size_bytes");
    assert!(
        written > 2 * size,
        "the hand did not lap the device: {written} written"
    );
    assert!(
        samples >= 10 && most > size / 2,
        "{samples} samples, at most {most}"
    );
}
