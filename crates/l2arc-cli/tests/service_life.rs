//! A service's life against the real binary: systemd's readiness and
//! watchdog over a real `NOTIFY_SOCKET`, SIGHUP reloading the config
//! file, SIGTERM draining the NBD export for a pipelined client, error
//! summaries in the log, and messages that name something that exists.

use std::collections::HashMap;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use l2arc_nbd::protocol::{NBD_CMD_READ, NBD_ESHUTDOWN};
use l2arc_testkit::nbd::{NbdClient, pattern};
use l2arc_testkit::service::{Running, Service};

const IMAGE_BYTES: usize = 32 << 20;

fn l2arc() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_l2arc"))
}

/// A datagram socket standing in for systemd's notify socket.
struct NotifySocket {
    path: PathBuf,
    socket: UnixDatagram,
}

impl NotifySocket {
    fn bind(dir: &Path) -> NotifySocket {
        let path = dir.join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        NotifySocket { path, socket }
    }

    /// Messages received until `done` holds of all of them, or `within`.
    fn until(&self, within: Duration, done: impl Fn(&[String]) -> bool) -> Vec<String> {
        let deadline = Instant::now() + within;
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !done(&got) && Instant::now() < deadline {
            if let Ok(n) = self.socket.recv(&mut buf) {
                got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
        got
    }
}

fn count(messages: &[String], line: &str) -> usize {
    messages
        .iter()
        .flat_map(|m| m.lines())
        .filter(|l| *l == line)
        .count()
}

fn has_prefix(messages: &[String], prefix: &str) -> bool {
    messages
        .iter()
        .flat_map(|m| m.lines())
        .any(|l| l.starts_with(prefix))
}

fn image(dir: &Path) -> PathBuf {
    let image = dir.join("disk.img");
    std::fs::write(&image, pattern(IMAGE_BYTES, 7)).unwrap();
    image
}

/// READY=1 with STATUS=, WATCHDOG=1 at least twice, then STOPPING=1 on SIGTERM.
fn check_notify(mut service: Running, notify: &NotifySocket, status_names: &str) {
    let got = notify.until(Duration::from_secs(30), |m| {
        count(m, "READY=1") >= 1 && count(m, "WATCHDOG=1") >= 2
    });
    assert_eq!(count(&got, "READY=1"), 1, "{got:?}");
    assert!(has_prefix(&got, "STATUS=serving "), "{got:?}");
    assert!(
        got.iter().any(|m| m.contains(status_names)),
        "STATUS names what is served: {got:?}"
    );
    assert!(count(&got, "WATCHDOG=1") >= 2, "{got:?}");
    let (status, _) = service.stop();
    assert!(status.success(), "{status}");
    let after = notify.until(Duration::from_secs(5), |m| count(m, "STOPPING=1") >= 1);
    assert_eq!(count(&after, "STOPPING=1"), 1, "{after:?}");
}

#[test]
fn serve_nbd_tells_systemd_ready_status_watchdog_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let notify = NotifySocket::bind(dir.path());
    let image = image(dir.path());
    let service = Service::serve_nbd(l2arc(), &image)
        .listen_unix(&dir.path().join("nbd.sock"))
        .args(["--arc-max", "16MiB"])
        .env("NOTIFY_SOCKET", &notify.path)
        .env("WATCHDOG_USEC", "400000")
        .env_remove("WATCHDOG_PID")
        .start();
    check_notify(service, &notify, &image.display().to_string());
}

#[test]
fn mount_tells_systemd_ready_status_watchdog_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::write(src.join("a"), b"hello").unwrap();
    let notify = NotifySocket::bind(dir.path());
    let service = Service::mount(l2arc(), &src, &mnt)
        .args(["--arc-max", "16MiB"])
        .env("NOTIFY_SOCKET", &notify.path)
        .env("WATCHDOG_USEC", "400000")
        .env_remove("WATCHDOG_PID")
        .start();
    assert_eq!(std::fs::read(mnt.join("a")).unwrap(), b"hello");
    check_notify(service, &notify, &mnt.display().to_string());
    // Unmounted cleanly: the mount point is an empty directory again.
    assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0);
}

fn ctl(socket: &Path, args: &[&str]) -> String {
    let out = Command::new(l2arc())
        .arg("ctl")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn hup(service: &Running) {
    let rc = Command::new("kill")
        .args(["-HUP", &service.pid().to_string()])
        .status()
        .unwrap();
    assert!(rc.success());
}

#[test]
fn sighup_applies_what_changes_live_names_what_does_not_and_survives_a_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("l2arc.toml");
    let control = dir.path().join("ctl.sock");
    std::fs::write(
        &config,
        "arc_max = \"16MiB\"\nsecondarycache = \"all\"\nl2arc_write_max = 0\n",
    )
    .unwrap();
    let mut service = Service::serve_nbd(l2arc(), image(dir.path()))
        .listen_unix(&dir.path().join("nbd.sock"))
        .arg("--config")
        .arg(&config)
        .arg("--control")
        .arg(&control)
        .start();
    assert!(ctl(&control, &["datasets"]).contains("secondarycache=all"));
    std::fs::write(
        &config,
        "arc_max = \"16MiB\"\nsecondarycache = \"none\"\nl2arc_write_max = \"1MiB\"\nrecordsize = \"16K\"\n",
    )
    .unwrap();
    hup(&service);
    let reloaded = service
        .next_line("l2arc: reloaded", Duration::from_secs(30))
        .expect("a line saying what the reload changed");
    assert!(
        reloaded.contains("secondarycache all -> none"),
        "{reloaded}"
    );
    assert!(
        reloaded.contains("l2arc_write_max 0 -> 1048576"),
        "{reloaded}"
    );
    let kept = service
        .next_line(
            "l2arc: warning: reload: not applied",
            Duration::from_secs(30),
        )
        .expect("a line naming what was not applied");
    assert!(kept.contains("recordsize"), "{kept}");
    let datasets = ctl(&control, &["datasets"]);
    assert!(
        datasets.contains("secondarycache=none") && datasets.contains("recordsize=65536"),
        "{datasets}"
    );
    assert_eq!(
        ctl(&control, &["get", "l2arc_write_max"]),
        "l2arc_write_max 1048576\n"
    );
    // `ctl history` lists the reload, as zpool history lists changes.
    let history = ctl(&control, &["history"]);
    assert!(
        history.contains("reloaded") && history.contains("secondarycache all -> none"),
        "{history}"
    );
    // An invalid file changes nothing and says why in one line.
    std::fs::write(&config, "secondarycache = \"all\"\nl2arc_feed_secs = -1\n").unwrap();
    hup(&service);
    let error = service
        .next_line("l2arc: error: reload:", Duration::from_secs(30))
        .expect("an error line");
    assert!(
        error.contains("l2arc_feed_secs") && error.contains("nothing changed"),
        "{error}"
    );
    assert!(ctl(&control, &["datasets"]).contains("secondarycache=none"));
    assert!(ctl(&control, &["get"]).contains("l2arc_feed_secs 1\n"));
    // Still serving, with its socket; a clean stop follows.
    assert!(control.exists());
    let stop = service.stop_line();
    assert!(stop.starts_with("l2arc: stopped:"), "{stop}");
    assert!(!control.exists(), "the control socket is removed at stop");
}

/// Sends `n` reads of 4 KiB from `first`, cookies from `first`.
fn send_reads(client: &mut NbdClient, first: u64, n: u64) {
    for i in first..first + n {
        let offset = (i * 997 * 4096) % (IMAGE_BYTES as u64 - 4096);
        let offset = offset - offset % 4096;
        client.send(NBD_CMD_READ, 0, i, offset, 4096, &[]).unwrap();
    }
}

#[test]
fn sigterm_answers_every_request_in_flight_before_the_export_closes() {
    let dir = tempfile::tempdir().unwrap();
    let image = image(dir.path());
    let socket = dir.path().join("nbd.sock");
    // A slow primary (one emulated disk) keeps the reads in flight.
    let mut service = Service::serve_nbd(l2arc(), &image)
        .listen_unix(&socket)
        .args(["--arc-max", "16MiB", "--emulate-hdd-spindles", "1"])
        .args([
            "--emulate-hdd-seek-ms-min",
            "20",
            "--emulate-hdd-seek-ms-max",
            "30",
        ])
        .start();
    let mut client = NbdClient::open(&socket).unwrap();
    client.set_timeout(Some(Duration::from_secs(60))).unwrap();
    let data = pattern(IMAGE_BYTES, 7);
    let mut replies: HashMap<u64, u32> = HashMap::new();
    send_reads(&mut client, 0, 64);
    // The first answer: the server holds the other reads (the disk is slow).
    take_reply(&mut client, &data, &mut replies);
    let term = Command::new("kill")
        .args(["-TERM", &service.pid().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    // Requests sent while it stops: served, or refused with ESHUTDOWN.
    send_reads(&mut client, 64, 16);
    while replies.len() < 80 {
        take_reply(&mut client, &data, &mut replies);
    }
    let answered = replies.values().filter(|e| **e == 0).count() as u64;
    client.disconnect().unwrap();
    let (status, rest) = service.stop();
    assert!(status.success(), "{status}: {rest:?}");
    let drained = rest
        .iter()
        .find(|l| l.starts_with("l2arc: stopping: drained "))
        .unwrap_or_else(|| panic!("a line stating the drain: {rest:?}"));
    let in_flight: u64 = drained
        .trim_start_matches("l2arc: stopping: drained ")
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{drained}"));
    eprintln!("{drained}");
    assert!(in_flight > 0, "reads were in flight at the stop: {drained}");
    // At least: the first reply may still count as in flight at the stop
    // (its job is dropped just after the reply is sent).
    assert!(
        answered >= in_flight,
        "each in flight answered with data: {replies:?}"
    );
    assert!(
        drained.contains("0 connections closed after the 10 s --stop-timeout"),
        "{drained}"
    );
}

/// fio (the nbd engine, 16 reads in flight on a slow disk) stopped by
/// SIGTERM mid-run: before the drain it failed with `err=-1 ...
/// func=get_events` (replies lost with the connection); now its only
/// errors are the ESHUTDOWN answers to reads it sent after the stop.
#[test]
fn sigterm_during_a_fio_run_loses_no_reply() {
    let dir = tempfile::tempdir().unwrap();
    let image = image(dir.path());
    let socket = dir.path().join("nbd.sock");
    let control = dir.path().join("ctl.sock");
    let mut service = Service::serve_nbd(l2arc(), &image)
        .listen_unix(&socket)
        .args(["--arc-max", "16MiB", "--emulate-hdd-spindles", "1"])
        .arg("--control")
        .arg(&control)
        .start();
    let fio = l2arc_testkit::tool("fio", "fio")
        .current_dir(dir.path())
        .args([
            "--name=drain",
            "--ioengine=nbd",
            &format!("--uri=nbd+unix:///?socket={}", socket.display()),
            "--rw=randread",
            "--bs=4k",
            "--iodepth=16",
            "--time_based",
            "--runtime=120",
            &format!("--size={IMAGE_BYTES}"),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start fio");
    // Stop once fio is reading (the server has answered some of its reads).
    let reading_by = Instant::now() + Duration::from_secs(60);
    while reads_so_far(&control) < 64 {
        assert!(Instant::now() < reading_by, "fio never read");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, rest) = service.stop();
    let out = fio.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(status.success(), "{status}: {rest:?}");
    assert!(
        rest.iter()
            .any(|l| l.starts_with("l2arc: stopping: drained ")),
        "{rest:?}"
    );
    assert!(!said.contains("get_events"), "a reply was lost: {said}");
    for line in said.lines().filter(|l| l.contains("err=")) {
        assert!(line.contains("err=108"), "not ESHUTDOWN: {line}");
    }
}

/// The cache's `reads` counter, through `ctl stats`.
fn reads_so_far(control: &Path) -> u64 {
    ctl(control, &["stats"])
        .lines()
        .find_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("reads")).then(|| words.next_back())?
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Takes one reply: its data must be the image's, or it is ESHUTDOWN.
fn take_reply(client: &mut NbdClient, data: &[u8], replies: &mut HashMap<u64, u32>) {
    let reply = client
        .reply()
        .unwrap_or_else(|e| panic!("reply {} of 80 lost: {e:?}", replies.len() + 1));
    if reply.error == 0 {
        let mut buf = vec![0u8; 4096];
        client.read_data(&mut buf).unwrap();
        let offset = ((reply.cookie * 997 * 4096) % (IMAGE_BYTES as u64 - 4096)) as usize;
        let offset = offset - offset % 4096;
        assert!(
            buf == data[offset..offset + 4096],
            "cookie {}",
            reply.cookie
        );
    } else {
        assert_eq!(reply.error, NBD_ESHUTDOWN, "cookie {}", reply.cookie);
    }
    assert!(replies.insert(reply.cookie, reply.error).is_none());
}

#[test]
fn a_silent_client_does_not_hold_the_stop_past_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nbd.sock");
    let mut service = Service::serve_nbd(l2arc(), image(dir.path()))
        .listen_unix(&socket)
        .args(["--arc-max", "16MiB", "--stop-timeout", "1"])
        .start();
    let mut client = NbdClient::open(&socket).unwrap();
    assert_eq!(
        client.read(0, 4096).unwrap(),
        pattern(IMAGE_BYTES, 7)[..4096]
    );
    // Silent from here on, nothing in flight.
    let (status, rest) = service.stop();
    assert!(status.success(), "{status}: {rest:?}");
    let drained = rest
        .iter()
        .find(|l| l.starts_with("l2arc: stopping: drained "))
        .unwrap_or_else(|| panic!("a line stating the drain: {rest:?}"));
    assert!(
        drained.contains("1 connections closed after the 1 s --stop-timeout"),
        "{drained}"
    );
    assert!(client.closed_within(Duration::from_secs(10)));
}

#[test]
fn a_corrupted_cache_device_is_one_summary_line_with_the_count() {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("ctl.sock");
    let cache = dir.path().join("cache.img");
    let socket = dir.path().join("nbd.sock");
    let service = Service::serve_nbd(l2arc(), image(dir.path()))
        .listen_unix(&socket)
        .args(["--arc-max", "8MiB", "--cache-size", "64MiB"])
        .args(["--l2arc-noprefetch", "false", "--compression", "off"])
        .arg("--cache")
        .arg(&cache)
        .arg("--control")
        .arg(&control)
        .start();
    let mut client = NbdClient::open(&socket).unwrap();
    // Read the image until flash holds most of it.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        for offset in (0..IMAGE_BYTES as u64).step_by(64 << 10) {
            client.read(offset, 64 << 10).unwrap();
        }
        let stats = ctl(&control, &["stats"]);
        let l2_size: u64 = stats
            .lines()
            .find_map(|l| l.strip_prefix("l2_size "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if l2_size >= (IMAGE_BYTES as u64) / 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the feeder never filled flash: {stats}"
        );
    }
    // Garbage over the data area (the first MiB holds the headers).
    let garbage = vec![0x5au8; 1 << 20];
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&cache)
        .unwrap();
    let len = file.metadata().unwrap().len();
    for offset in (1u64 << 20..len).step_by(1 << 20) {
        std::os::unix::fs::FileExt::write_all_at(&file, &garbage, offset).unwrap();
    }
    file.sync_all().unwrap();
    for offset in (0..IMAGE_BYTES as u64).step_by(64 << 10) {
        // The primary answers what flash cannot: the bytes stay right.
        let got = client.read(offset, 64 << 10).unwrap();
        let want = &pattern(IMAGE_BYTES, 7)[offset as usize..offset as usize + (64 << 10)];
        assert!(got == want, "offset {offset}");
    }
    let line = service
        .next_line("l2arc: error: cache device 0: ", Duration::from_secs(30))
        .expect("a summary of the checksum errors");
    assert!(line.contains(" checksum errors in the last 10 s"), "{line}");
    let count: u64 = line
        .trim_start_matches("l2arc: error: cache device 0: ")
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(count > 0, "{line}");
}

#[test]
fn a_foreign_cache_device_is_refused_naming_the_flag_that_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let image = image(dir.path());
    let cache = dir.path().join("cache.img");
    std::fs::write(&cache, vec![0x42u8; 16 << 20]).unwrap();
    let out = Command::new(l2arc())
        .arg("serve-nbd")
        .arg(&image)
        .arg("--listen")
        .arg(format!("unix:{}", dir.path().join("nbd.sock").display()))
        .arg("--cache")
        .arg(&cache)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let refusal = stderr.lines().last().unwrap_or_default();
    assert!(
        refusal.contains("holds data that is not an l2arc cache")
            && refusal.contains("--force-init-foreign"),
        "{stderr}"
    );
    let mut service = Service::serve_nbd(l2arc(), &image)
        .listen_unix(&dir.path().join("nbd.sock"))
        .arg("--cache")
        .arg(&cache)
        .arg("--force-init-foreign")
        .start();
    service.stop_line();
}

#[test]
fn http_takes_a_host_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut service = Service::serve_nbd(l2arc(), image(dir.path()))
        .listen_unix(&dir.path().join("nbd.sock"))
        .args(["--arc-max", "16MiB", "--http", "localhost:0"])
        .start();
    let addr = service.http().expect("an http line");
    assert!(addr.ip().is_loopback(), "{addr}");
    service.stop_line();
}

#[test]
fn listen_and_read_only_are_keys_of_the_file_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let image = image(dir.path());
    let socket = dir.path().join("from-file.sock");
    let config = dir.path().join("l2arc.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"unix:{}\"\nread_only = true\narc_max = \"16MiB\"\n",
            socket.display()
        ),
    )
    .unwrap();
    let mut service = Service::serve_nbd(l2arc(), &image)
        .arg("--config")
        .arg(&config)
        .start();
    assert!(
        service
            .ready_line
            .ends_with(&format!("on unix:{}", socket.display())),
        "{}",
        service.ready_line
    );
    let mut client = NbdClient::open(&socket).unwrap();
    let refused = client
        .command(l2arc_nbd::protocol::NBD_CMD_WRITE, 0, 0, 4096, &[0u8; 4096])
        .unwrap_err();
    assert_eq!(
        refused.errno(),
        Some(l2arc_nbd::protocol::NBD_EPERM),
        "read_only from the file"
    );
    client.disconnect().unwrap();
    service.stop_line();
    // A flag wins over the file.
    let other = dir.path().join("flag.sock");
    let mut service = Service::serve_nbd(l2arc(), &image)
        .listen_unix(&other)
        .arg("--config")
        .arg(&config)
        .start();
    service.stop_line();
}

#[test]
fn a_typo_in_the_file_names_the_closest_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("l2arc.toml");
    std::fs::write(&config, "arc_maxx = \"1GiB\"\n").unwrap();
    let out = Command::new(l2arc())
        .arg("serve-nbd")
        .arg(image(dir.path()))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    l2arc_testkit::assert_one_line_error(
        &out,
        "l2arc",
        "unknown key arc_maxx; did you mean arc_max?",
    );
}

#[test]
fn trace_of_a_missing_file_says_the_os_error_once() {
    let out = Command::new(l2arc())
        .args(["trace", "/nonexistent/trace.csv", "--sizes", "10"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("/nonexistent/trace.csv"), "{stderr}");
}

/// Every key the configuration page's table names is a key of the file.
#[test]
fn every_tunable_the_docs_list_is_a_key_of_the_file() {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md"),
    )
    .unwrap();
    let table = doc
        .split("## Tunables")
        .nth(1)
        .expect("a Tunables section")
        .split("\n## ")
        .next()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut names = Vec::new();
    for row in table.lines().filter(|l| l.starts_with("| `")) {
        let first = row.split('|').nth(1).unwrap();
        names.extend(first.split('`').skip(1).step_by(2).map(str::to_string));
    }
    assert!(names.len() > 20, "{names:?}");
    for name in &names {
        let config = dir.path().join("probe.toml");
        std::fs::write(&config, format!("{name} = 0\n")).unwrap();
        let out = Command::new(l2arc())
            .arg("serve-nbd")
            .arg("/nonexistent/image")
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("unknown key") && !stderr.contains("unknown field"),
            "docs/configuration.md lists `{name}`, which the file refuses: {stderr}"
        );
    }
}
