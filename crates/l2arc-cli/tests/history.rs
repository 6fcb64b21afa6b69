//! The analytics of a real `l2arc mount`: `--http` on the mount (metrics
//! through promtool, the drill-down naming the files read through the
//! mount by their paths) and `--history` (samples every second, with the
//! datasets' counters and the busiest objects of each second for the
//! breakdowns, the eligibility and error counters; kept across a restart
//! of the mount, refused over a file that is not a history or is one of
//! an older version). Needs FUSE (root) and promtool; a missing tool fails the test.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use l2arc_testkit::http_get;
use l2arc_testkit::service::{Running, Service};

fn l2arc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_l2arc"))
}

/// A mount with `--http` and `--history`, unmounted on drop.
struct Mounted {
    http: SocketAddr,
    service: Running,
}

impl Mounted {
    fn start(src: &Path, mnt: &Path, history: &Path) -> Mounted {
        let service = Service::mount(Path::new(env!("CARGO_BIN_EXE_l2arc")), src, mnt)
            .args(["--arc-max", "16MiB", "--http", "127.0.0.1:0"])
            .arg("--history")
            .arg(history)
            .start();
        Mounted {
            http: service
                .http()
                .expect("no `l2arc: http on` line before the ready line"),
            service,
        }
    }

    /// SIGTERM: the mount unmounts itself.
    fn stop(mut self) {
        let _ = self.service.stop();
    }
}

fn json(addr: SocketAddr, path: &str) -> serde_json::Value {
    let (status, body) = http_get(addr, path);
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// Samples in the last `window` seconds, as (time_ms, boot_ms, reads).
fn samples(addr: SocketAddr, window: u64) -> Vec<(u64, u64, u64)> {
    let h = json(addr, &format!("/api/history?window={window}"));
    let reads_at = h["fields"]
        .as_array()
        .unwrap()
        .iter()
        .position(|f| f == "reads")
        .unwrap();
    h["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s[0].as_u64().unwrap(),
                s[1].as_u64().unwrap(),
                s[2][reads_at].as_u64().unwrap(),
            )
        })
        .collect()
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < Duration::from_secs(15), "{what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_mount_serves_metrics_names_files_and_keeps_its_history_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (src, mnt) = (dir.path().join("src"), dir.path().join("mnt"));
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::write(src.join("sub/deeper/hot.bin"), vec![7u8; 1 << 20]).unwrap();
    let history = dir.path().join("history.bin");

    let m = Mounted::start(&src, &mnt, &history);
    let stats = json(m.http, "/api/stats");
    assert_eq!(stats["history_enabled"], true);
    for _ in 0..3 {
        let data = std::fs::read(mnt.join("sub/deeper/hot.bin")).unwrap();
        assert_eq!(data.len(), 1 << 20);
        // O_DIRECT-free re-reads may be served by the page cache: drop it.
        let _ = std::fs::write("/proc/sys/vm/drop_caches", "1");
    }
    // The drill-down names the file by its path below the source.
    let stats = json(m.http, "/api/stats");
    let names: Vec<String> = stats["top_objects"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["name"].as_str().map(str::to_string))
        .collect();
    assert!(
        names.iter().any(|n| n == "sub/deeper/hot.bin"),
        "top objects: {names:?}"
    );
    // /metrics of the mount passes promtool.
    let (status, metrics) = http_get(m.http, "/metrics");
    assert_eq!(status, 200);
    l2arc_testkit::promtool_check(&metrics);
    // A sample a second, with the reads counted.
    wait_for("no history samples with the reads", || {
        samples(m.http, 60).iter().any(|s| s.2 > 0)
    });
    let first_run = samples(m.http, 60);
    check_breakdown_slots(m.http);
    let boot = first_run[0].1;
    assert!(first_run.iter().all(|s| s.1 == boot));
    assert!(first_run.windows(2).all(|w| w[0].0 < w[1].0));
    m.stop();

    // After a restart the earlier samples are still there, beside new ones
    // of another run.
    let m = Mounted::start(&src, &mnt, &history);
    wait_for("no samples of the second run", || {
        samples(m.http, 120).iter().any(|s| s.1 != boot)
    });
    let both = samples(m.http, 120);
    for s in &first_run {
        assert!(both.contains(s), "sample {s:?} of the first run lost");
    }
    // Bad queries get a clear 400; the endpoint keeps serving.
    assert_eq!(http_get(m.http, "/api/history?window=0").0, 400);
    assert_eq!(http_get(m.http, "/api/history?window=x").0, 400);
    assert_eq!(http_get(m.http, "/api/history?bogus=1").0, 400);
    assert_eq!(http_get(m.http, "/api/stats").0, 200);
    drop(m);

    // A file that is not a history is refused and left as it was.
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, b"keep me").unwrap();
    let out = l2arc()
        .arg("mount")
        .arg(&src)
        .arg(&mnt)
        .arg("--history")
        .arg(&notes)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not an l2arc history"), "{stderr}");
    assert_eq!(std::fs::read(&notes).unwrap(), b"keep me");

    check_older_version_refused(&src, &mnt, dir.path());
}

/// The slots carry the breakdowns: the dataset's cumulative counts, and the
/// file read, by its path, among the busiest objects of a second; and the
/// eligibility and error counters.
fn check_breakdown_slots(http: SocketAddr) {
    let h = json(http, "/api/history?window=60");
    assert_eq!(
        h["breakdown_fields"],
        serde_json::json!(["reads", "misses", "l2_hits", "primary_reads", "bytes_below"])
    );
    let fields: Vec<&str> = h["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    for f in [
        "evict_l2_eligible",
        "evict_l2_ineligible",
        "l2_cksum_bad",
        "l2_io_error",
        "primary_errors",
    ] {
        assert!(fields.contains(&f), "{f} not kept: {fields:?}");
    }
    let last = h["samples"].as_array().unwrap().last().unwrap().clone();
    let datasets = last[4].as_array().unwrap();
    assert_eq!(datasets.len(), 1, "{datasets:?}");
    assert_eq!(datasets[0][0], "mount");
    let counts = &datasets[0][1];
    assert!(
        counts[1].as_u64().unwrap() > 0,
        "no misses counted: {counts}"
    );
    assert!(
        counts[4].as_u64().unwrap() >= 1 << 20,
        "bytes below: {counts}"
    );
    let busiest: Vec<serde_json::Value> = h["samples"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s[5].as_array().unwrap().clone())
        .collect();
    let hot = busiest
        .iter()
        .find(|o| o[2] == "sub/deeper/hot.bin")
        .unwrap_or_else(|| panic!("the file read is in no slot's objects: {busiest:?}"));
    assert_eq!(hot[0], "mount");
    // Over the seconds, its misses add up to the file's records at least once.
    let misses: u64 = busiest
        .iter()
        .filter(|o| o[2] == "sub/deeper/hot.bin")
        .map(|o| o[3][1].as_u64().unwrap())
        .sum();
    assert!(misses >= 1, "{busiest:?}");
}

/// A history of the previous version is refused with its version, in one
/// line, and kept.
fn check_older_version_refused(src: &Path, mnt: &Path, dir: &Path) {
    let old = dir.join("old-history.bin");
    let mut v1 = b"l2arc-history\n\0\x01".to_vec();
    v1.resize(4096, 0);
    std::fs::write(&old, &v1).unwrap();
    let out = l2arc()
        .arg("mount")
        .arg(src)
        .arg(mnt)
        .arg("--history")
        .arg(&old)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("is an l2arc history of version 1 (this l2arc writes version 3)"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert_eq!(std::fs::read(&old).unwrap(), v1);
}
