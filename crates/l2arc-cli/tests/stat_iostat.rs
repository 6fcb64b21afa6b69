//! `l2arc stat` (arcstat's options and columns), `l2arc iostat` (zpool
//! iostat's layout) and `l2arc ctl` (socket anywhere, what it did, the
//! history) against a real `serve-nbd` with a control socket; reads are
//! sent by the test's own NBD client. A reader closing the pipe early ends
//! `stat` and `iostat` quietly with exit 0.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use l2arc_testkit::nbd::NbdClient;
use l2arc_testkit::service::{Running, Service};

const IMAGE_BYTES: usize = 16 << 20;
const RECORD_BYTES: u64 = 64 << 10;

fn l2arc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_l2arc"))
}

fn run(cmd: &mut Command) -> Output {
    l2arc_testkit::run(cmd)
}

fn stdout(cmd: &mut Command) -> String {
    String::from_utf8(run(cmd).stdout).unwrap()
}

struct Served {
    dir: tempfile::TempDir,
    socket: PathBuf,
    control: PathBuf,
    service: Running,
}

impl Served {
    /// serve-nbd with a control socket, and a 64 MiB cache device unless `no_cache`.
    fn start(no_cache: bool) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::write(&image, l2arc_testkit::nbd::pattern(IMAGE_BYTES, 3)).unwrap();
        let socket = dir.path().join("nbd.sock");
        let control = dir.path().join("ctl.sock");
        let mut service = Service::serve_nbd(Path::new(env!("CARGO_BIN_EXE_l2arc")), &image)
            .listen_unix(&socket)
            .args(["--arc-max", "8MiB", "--zfs-prefetch-disable", "true"])
            .arg("--control")
            .arg(&control);
        if !no_cache {
            service = service
                .arg("--cache")
                .arg(dir.path().join("l2.img"))
                .args(["--cache-size", "64MiB"]);
        }
        Served {
            service: service.start(),
            dir,
            socket,
            control,
        }
    }

    /// One 4 KiB read at the start of each of the first `records` records.
    fn read_records(&self, records: u64) {
        let mut client = NbdClient::open(&self.socket).unwrap();
        for r in 0..records {
            client.read(r * RECORD_BYTES, 4096).unwrap();
        }
        client.disconnect().unwrap();
    }
}

/// Runs `l2arc ARGS | head -2` in bash: the two lines and l2arc's exit
/// status and standard error.
fn through_head(args: &[&str]) -> (String, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let err = dir.path().join("stderr");
    let out = run(Command::new("bash")
        .arg("-c")
        .arg(r#"l2arc="$1"; err="$2"; shift 2; "$l2arc" "$@" 2>"$err" | head -2; echo "rc=${PIPESTATUS[0]}""#)
        .arg("bash")
        .arg(env!("CARGO_BIN_EXE_l2arc"))
        .arg(&err)
        .args(args));
    let text = String::from_utf8(out.stdout).unwrap();
    let (lines, rc) = text.rsplit_once("rc=").unwrap();
    (
        lines.to_string(),
        rc.trim().to_string(),
        std::fs::read_to_string(&err).unwrap(),
    )
}

/// Defect 4: `l2arc stat SOCK 1 5 | head -2` ended with "Broken pipe (os
/// error 32)" and exit 1. Every printing loop ends quietly with 0.
#[test]
fn stat_and_iostat_end_quietly_when_the_reader_goes() {
    let served = Served::start(false);
    let socket = served.control.to_str().unwrap();
    for args in [
        &["stat", "--socket", socket, "0.1", "50"][..],
        &["stat", "--socket", socket, "--json", "0.1", "50"][..],
        &["iostat", "--socket", socket, "-v", "0.1", "50"][..],
    ] {
        let (lines, rc, stderr) = through_head(args);
        assert_eq!(lines.lines().count(), 2, "{args:?}: {lines}");
        assert_eq!(
            (rc.as_str(), stderr.as_str()),
            ("0", ""),
            "{args:?} after its reader left"
        );
    }
}

#[test]
fn stat_takes_zarcstats_options() {
    let served = Served::start(false);
    served.read_records(32);
    let control = &served.control;
    // -S, and L2ARC_SOCKET when it is not given.
    let by_flag = stdout(l2arc().arg("stat").arg("-S").arg(control));
    let by_env = stdout(l2arc().arg("stat").env("L2ARC_SOCKET", control));
    assert_eq!(by_flag.lines().next(), by_env.lines().next());
    assert_eq!(by_flag.lines().count(), 2, "{by_flag}");
    let none = l2arc()
        .arg("stat")
        .env_remove("L2ARC_SOCKET")
        .output()
        .unwrap();
    l2arc_testkit::assert_one_line_error(&none, "l2arc", "L2ARC_SOCKET");

    // -s SEP and -p: raw numbers joined by SEP, header unpadded.
    let text = stdout(l2arc().arg("stat").arg("-S").arg(control).args([
        "-p",
        "-s",
        ";",
        "-f",
        "time,read,c,l2size",
        "0.2",
        "1",
    ]));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "time;read;c;l2size", "{text}");
    let values: Vec<&str> = lines[1].split(';').collect();
    assert_eq!(values.len(), 4, "{text}");
    assert_eq!(values[2], (8u64 << 20).to_string(), "c raw: {text}");
    assert!(values[3].parse::<u64>().is_ok(), "{text}");

    // -o FILE: nothing on standard output, the lines in the file.
    let file = served.dir.path().join("stat.out");
    let out = run(l2arc()
        .arg("stat")
        .arg("-S")
        .arg(control)
        .arg("-o")
        .arg(&file)
        .args(["0.2", "2"]));
    assert!(out.stdout.is_empty());
    let written = std::fs::read_to_string(&file).unwrap();
    assert_eq!(written.lines().count(), 3, "{written}");
    assert!(written.starts_with("    time"), "{written}");
}

#[test]
fn stat_takes_zarcstats_field_sets() {
    let served = Served::start(false);
    let control = &served.control;
    // -x and -z: zarcstat's extended and zfetch lines.
    let header = |flag: &str| -> Vec<String> {
        let text = stdout(l2arc().arg("stat").arg("-S").arg(control).arg(flag));
        text.lines()
            .next()
            .unwrap()
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    let x = header("-x");
    for column in [
        "mfu", "mru", "mfug", "mrug", "el2skip", "el2cach", "el2el", "el2inel",
    ] {
        assert!(x.iter().any(|c| c == column), "-x lacks {column}: {x:?}");
    }
    let z = header("-z");
    assert_eq!(z[..3], ["time", "zhits", "zissued"], "{z:?}");
    let both = l2arc()
        .arg("stat")
        .arg("-S")
        .arg(control)
        .args(["-x", "-z"])
        .output()
        .unwrap();
    assert!(!both.status.success());

    // -v: every field, the new ones among them.
    let fields = stdout(l2arc().args(["stat", "-v"]));
    for f in [
        "el2skip", "el2cach", "el2el", "el2mfu", "el2mru", "el2inel", "zhits", "zissued",
    ] {
        assert!(fields.contains(&format!("{f:>11} : ")), "-v lacks {f}");
    }

    // --csv: the header once, raw numbers.
    let csv = stdout(l2arc().arg("stat").arg("-S").arg(control).args([
        "--csv",
        "-f",
        "read,c,el2el",
        "0.2",
        "1",
    ]));
    assert_eq!(csv.lines().next(), Some("read,c,el2el"), "{csv}");
}

/// The el2* and z* columns are the deltas of the counters zarcstat reads.
#[test]
fn el2_and_zfetch_columns_are_counter_deltas() {
    let served = Served::start(false);
    let stat = l2arc()
        .arg("stat")
        .arg("-S")
        .arg(&served.control)
        .args([
            "--json",
            "-f",
            "el2cach,el2el,el2inel,el2skip,zhits,zissued",
            "1",
            "2",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let ctl_stats = || {
        stdout(
            l2arc()
                .arg("ctl")
                .arg("-S")
                .arg(&served.control)
                .arg("stats"),
        )
    };
    let before = ctl_stats();
    // Enough records to evict from an 8 MiB ARC: the feeder sees evictions.
    served.read_records(200);
    let out = stat.wait_with_output().unwrap();
    assert!(out.status.success());
    let after = ctl_stats();
    let kstat = |text: &str, name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .map_or(0.0, |v| v.trim().parse().unwrap())
    };
    let rows: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2);
    // The stat window holds the reads (both started before them), so the
    // totals are at most the deltas seen by ctl around the whole run.
    for (column, counter) in [
        ("el2cach", "evict_l2_cached"),
        ("el2el", "evict_l2_eligible"),
        ("el2inel", "evict_l2_ineligible"),
        ("zhits", "zfetch_hits"),
    ] {
        let total: f64 = rows
            .iter()
            .map(|r| r[column].as_f64().unwrap() * r["interval_secs"].as_f64().unwrap())
            .sum();
        let delta = kstat(&after, counter) - kstat(&before, counter);
        assert!(total.round() <= delta, "{column}: {total} > {delta}");
    }
    assert!(
        [
            "evict_l2_cached",
            "evict_l2_eligible",
            "evict_l2_ineligible"
        ]
        .iter()
        .map(|c| kstat(&after, c))
        .sum::<f64>()
            > 0.0,
        "200 records through an 8 MiB ARC evicted nothing:\n{after}"
    );
}

#[test]
fn stat_refuses_l2_columns_without_a_cache_device() {
    let served = Served::start(true);
    let out = l2arc()
        .arg("stat")
        .arg("-S")
        .arg(&served.control)
        .args(["-f", "time,l2hits,l2size", "1", "1"])
        .output()
        .unwrap();
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "No L2ARC Here");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("l2hits,l2size"), "{err}");
    // The default line leaves them out; el2* (evictions) are no L2 columns.
    let text = stdout(l2arc().arg("stat").arg("-S").arg(&served.control));
    assert!(!text.lines().next().unwrap().contains("l2"), "{text}");
    run(l2arc()
        .arg("stat")
        .arg("-S")
        .arg(&served.control)
        .args(["-f", "el2el", "0.1", "1"]));
}

#[test]
fn iostat_shows_primary_and_each_cache_device() {
    let served = Served::start(false);
    served.read_records(64);
    let control = served.control.to_str().unwrap();
    let text = stdout(l2arc().args(["iostat", "-S", control, "-v", "-l", "-p"]));
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].contains("capacity") && lines[0].contains("operations"),
        "{text}"
    );
    assert!(
        lines[0].contains("bandwidth") && lines[0].contains("read latency"),
        "{text}"
    );
    let header: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "device", "alloc", "free", "read", "write", "read", "write", "wait", "p50", "p99"
        ]
    );
    assert!(lines[2].starts_with("----"), "{text}");
    let words = |prefix: &str| -> Vec<String> {
        let line = lines
            .iter()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} line:\n{text}"));
        line.split_whitespace().map(String::from).collect()
    };
    let primary = words("primary");
    assert_eq!(primary.len(), 10, "{text}");
    assert!(
        primary[3].parse::<u64>().unwrap() > 0,
        "primary reads/s: {text}"
    );
    assert!(
        primary[5].parse::<u64>().unwrap() > 0,
        "primary read bytes/s: {text}"
    );
    assert!(
        primary[7].parse::<u64>().unwrap() > 0,
        "primary read wait (ns): {text}"
    );
    let device = words("0 ");
    let devices = stdout(l2arc().args(["ctl", "devices", "-S", control]));
    let size: u64 = devices
        .split_whitespace()
        .find_map(|w| w.strip_prefix("size_bytes="))
        .unwrap()
        .parse()
        .unwrap();
    let alloc: u64 = device[2].parse().unwrap();
    let free: u64 = device[3].parse().unwrap();
    assert_eq!(alloc + free, size, "alloc + free is the device: {text}");
    assert!(device[1].ends_with("l2.img"), "{text}");
    assert_eq!(device[8..], ["-", "-", "-"], "{text}");
    assert_eq!(words("cache").len(), 10, "{text}");

    // An interval and a count: that many reports, each with its header.
    let text = stdout(l2arc().args(["iostat", "-S", control, "0.2", "2"]));
    assert_eq!(text.matches("capacity").count(), 2, "{text}");
    assert!(
        !text.lines().any(|l| l.starts_with("  0 ")),
        "no device lines without -v: {text}"
    );
}

#[test]
fn ctl_takes_the_socket_anywhere_and_says_what_it_did() {
    let mut served = Served::start(true);
    let log = served.service.gather_stderr();
    let control = served.control.to_str().unwrap();
    let device = served.dir.path().join("added.img");
    let said = stdout(l2arc().args([
        "ctl",
        "add-cache",
        device.to_str().unwrap(),
        "32MiB",
        "-S",
        control,
    ]));
    assert_eq!(
        said.trim(),
        format!(
            "added cache device {} as slot 0 (initialised)",
            device.display()
        ),
        "{said}"
    );
    let said = stdout(l2arc().args(["ctl", "-S", control, "set", "nbd", "primarycache=none"]));
    assert_eq!(said, "set nbd primarycache=none\n");
    let said = stdout(
        l2arc()
            .args(["ctl", "remove-cache", "0"])
            .env("L2ARC_SOCKET", control),
    );
    assert_eq!(said, "removed cache device 0\n");
    let history = stdout(l2arc().args(["ctl", "history", "--socket", control]));
    let lines: Vec<&str> = history.lines().collect();
    assert_eq!(lines[0], "History for 'l2arc':", "{history}");
    let events: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split_once(' ').unwrap().1)
        .collect();
    assert_eq!(
        events,
        [
            format!(
                "added cache device {} as slot 0 (initialised)",
                device.display()
            )
            .as_str(),
            "set nbd primarycache=none",
            "removed cache device 0"
        ],
        "{history}"
    );
    // zpool history's time stamp: YYYY-MM-DD.HH:MM:SS.
    let stamp = lines[1].split_once(' ').unwrap().0;
    assert_eq!(stamp.len(), 19, "{stamp}");
    assert_eq!(&stamp[10..11], ".", "{stamp}");
    // Each change logged once.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = log.lock().unwrap().clone();
        if text.matches("ctl: removed cache device 0").count() == 1 {
            assert_eq!(
                text.matches("ctl: set nbd primarycache=none").count(),
                1,
                "{text}"
            );
            assert_eq!(text.matches("ctl: added cache device").count(), 1, "{text}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not logged:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A socket the user may not open says so, not "is the service running?".
#[test]
fn ctl_names_a_permission_error() {
    let served = Served::start(true);
    std::fs::set_permissions(
        &served.control,
        std::os::unix::fs::PermissionsExt::from_mode(0o000),
    )
    .unwrap();
    // SAFETY: getuid has no preconditions.
    let mut ctl = if unsafe { libc::getuid() } == 0 {
        // root passes permission checks: ask without its capabilities
        // (util-linux's setpriv).
        let mut c = l2arc_testkit::tool("setpriv", "util-linux");
        c.args(["--inh-caps=-all", "--bounding-set=-all", "--"])
            .arg(env!("CARGO_BIN_EXE_l2arc"));
        c
    } else {
        l2arc()
    };
    ctl.arg("ctl").arg("-S").arg(&served.control).arg("stats");
    let out = ctl.output().unwrap();
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "permission denied");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("is the service running"), "{err}");
}
