//! Live analytics of a real `serve-nbd`: `l2arc stat` against counter
//! deltas, `/metrics` through `promtool check metrics` and against
//! `l2arc ctl stats`, and the HTTP endpoint's bounds. Reads are driven by
//! qemu-io over NBD. Every tool is required: a missing one fails the test
//! with a pointer to `scripts/setup.sh`, never a skip.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use l2arc_testkit::service::{Running, Service};
use std::time::{Duration, Instant};

const IMAGE_BYTES: usize = 32 << 20;
/// serve-nbd's default recordsize.
const RECORD_BYTES: usize = 64 << 10;

fn tool(name: &str) -> Command {
    l2arc_testkit::tool(name, "qemu-utils and prometheus, which has promtool")
}

fn run(cmd: &mut Command) -> Output {
    l2arc_testkit::run(cmd)
}

fn l2arc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_l2arc"))
}

struct Served {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    control: PathBuf,
    http: SocketAddr,
    _service: Running,
}

impl Served {
    fn start() -> Served {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        let bytes: Vec<u8> = (0..IMAGE_BYTES).map(|i| (i * 7 + i / 4096) as u8).collect();
        std::fs::write(&image, bytes).unwrap();
        let socket = dir.path().join("nbd.sock");
        let control = dir.path().join("ctl.sock");
        let service = Service::serve_nbd(Path::new(env!("CARGO_BIN_EXE_l2arc")), &image)
            .listen_unix(&socket)
            .args(["--arc-max", "16MiB", "--http", "127.0.0.1:0"])
            // The tests count a primary read (a miss) per record read.
            .args(["--zfs-prefetch-disable", "true"])
            .arg("--control")
            .arg(&control)
            .arg("--cache")
            .arg(dir.path().join("l2.img"))
            .args(["--cache-size", "64MiB"])
            .start();
        Served {
            _dir: dir,
            socket,
            control,
            http: service
                .http()
                .expect("no `l2arc: http on` line before the ready line"),
            _service: service,
        }
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    fn ctl_stats(&self) -> HashMap<String, u64> {
        let out = run(l2arc()
            .args(["ctl", "--socket"])
            .arg(&self.control)
            .arg("stats"));
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let (n, v) = l.split_once(' ').unwrap();
                (n.to_string(), v.parse().unwrap())
            })
            .collect()
    }

    /// One read of 4 KiB at the start of each of the first `records` records, `passes` times.
    fn read_records(&self, records: usize, passes: usize) {
        let mut cmd = tool("qemu-io");
        cmd.args(["-r", "-f", "raw", &self.uri()]);
        for _ in 0..passes {
            for r in 0..records {
                cmd.args(["-c", &format!("read {} 4k", r * RECORD_BYTES)]);
            }
        }
        run(&mut cmd);
    }
}

fn http_get(addr: SocketAddr, raw: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(raw);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    (status, body)
}

fn sum(stats: &HashMap<String, u64>, names: &[&str]) -> u64 {
    names
        .iter()
        .map(|n| stats.get(*n).copied().unwrap_or(0))
        .sum()
}

#[test]
#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn stat_columns_are_the_counter_deltas() {
    let served = Served::start();
    let before = served.ctl_stats();
    let mut stat = l2arc()
        .args(["stat", "-S"])
        .arg(&served.control)
        .args([
            "--json",
            "-f",
            "time,read,hits,miss,hit%,miss%,l2read,arcsz,dkread",
            "1",
            "4",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(stat.stdout.take().unwrap()).lines();
    // The first line closes the first interval: reads from now on fall inside.
    let first = lines.next().expect("stat printed nothing").unwrap();
    let started = Instant::now();
    served.read_records(64, 2);
    assert!(
        stat.try_wait().unwrap().is_none() && started.elapsed() < Duration::from_secs(2),
        "the reads did not finish inside stat's window ({:?}): the machine is too loaded for this test",
        started.elapsed()
    );
    let mut rows = vec![first];
    rows.extend(lines.map(Result::unwrap));
    assert!(stat.wait().unwrap().success());
    let after = served.ctl_stats();
    assert_eq!(rows.len(), 4, "{rows:?}");

    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| serde_json::from_str(r).unwrap())
        .collect();
    let total = |field: &str| -> f64 {
        rows.iter()
            .map(|r| r[field].as_f64().unwrap() * r["interval_secs"].as_f64().unwrap())
            .sum()
    };
    let delta = |names: &[&str]| sum(&after, names) - sum(&before, names);
    // Rates times the measured interval add up to the counters' deltas.
    assert_eq!(
        total("read").round() as u64,
        delta(&["hits", "misses", "iohits"])
    );
    assert_eq!(total("hits").round() as u64, delta(&["hits"]));
    assert_eq!(total("miss").round() as u64, delta(&["misses"]));
    assert_eq!(
        total("l2read").round() as u64,
        delta(&["l2_hits", "l2_misses"])
    );
    assert_eq!(total("dkread").round() as u64, delta(&["primary_reads"]));
    // 64 records read twice: at least 64 misses and 64 hits.
    assert!(delta(&["misses"]) >= 64, "{before:?} {after:?}");
    assert!(delta(&["hits"]) >= 64, "{before:?} {after:?}");
    for r in &rows {
        let read = r["read"].as_f64().unwrap();
        let hits = r["hits"].as_f64().unwrap();
        let hit_pct = r["hit%"].as_f64().unwrap();
        let miss_pct = r["miss%"].as_f64().unwrap();
        if read > 0.0 {
            assert!((hit_pct - 100.0 * hits / read).abs() < 1e-9, "{r}");
            assert!(hit_pct + miss_pct <= 100.0 + 1e-9, "{r}");
        } else {
            assert_eq!((hit_pct, miss_pct), (0.0, 0.0), "{r}");
        }
        assert_eq!(r["arcsz"].as_f64().unwrap().fract(), 0.0, "sizes are bytes");
        let time = r["time"].as_str().unwrap();
        assert_eq!(time.len(), 8, "HH:MM:SS: {time}");
    }

    // The table: arcstat's header, repeated, and one line per interval.
    let table = run(l2arc()
        .args(["stat", "-S"])
        .arg(&served.control)
        .args(["0.2", "2"]));
    let text = String::from_utf8(table.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "time", "read", "miss", "miss%", "dmis", "dm%", "pmis", "pm%", "arcsz", "c", "l2read",
            "l2hit%", "l2size"
        ]
    );
    assert_eq!(lines[1].split_whitespace().count(), header.len(), "{text}");
    // CSV: the header once, then raw numbers.
    let csv = run(l2arc().args(["stat", "-S"]).arg(&served.control).args([
        "--csv",
        "-f",
        "read,c,l2size",
        "0.2",
        "1",
    ]));
    let text = String::from_utf8(csv.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "read,c,l2size");
    let c: u64 = lines[1].split(',').nth(1).unwrap().parse().unwrap();
    assert_eq!(c, 16 << 20, "c is arc_max here: {text}");
}

#[test]
fn stat_bad_input_is_one_clear_line() {
    let served = Served::start();
    let out = l2arc()
        .args(["stat", "-S"])
        .arg(&served.control)
        .args(["-f", "read,bogus", "1", "1"])
        .output()
        .unwrap();
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "unknown field `bogus`");
    let dir = tempfile::tempdir().unwrap();
    let out = l2arc()
        .args(["stat", "-S"])
        .arg(dir.path().join("nothing.sock"))
        .output()
        .unwrap();
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "is the service running with --control?");
}

/// `name value` pairs of a Prometheus text page, keyed by the name with its labels.
#[test]
fn metrics_pass_promtool_and_agree_with_ctl_stats() {
    let served = Served::start();
    served.read_records(32, 3);
    let (status, page) = http_get(served.http, b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(status, 200);
    l2arc_testkit::promtool_check(&page);

    // Histograms by tier: every ARC hit path and fill was timed.
    let m = l2arc_testkit::prometheus_samples(&page);
    let primary = m["l2arc_read_latency_seconds_count{tier=\"primary\"}"];
    assert!(primary >= 32.0, "{page}");
    assert!(m["l2arc_read_latency_seconds_count{tier=\"frontend\"}"] >= 96.0);
    assert_eq!(
        m["l2arc_dataset_info{dataset=\"nbd\",primarycache=\"all\",secondarycache=\"all\",compression=\"lz4\"}"],
        1.0
    );
    assert!(
        m.keys()
            .any(|k| k.starts_with("l2arc_device_l2_asize_bytes{slot=\"0\",device="))
    );

    // Every arcstat matches `ctl stats` taken at the same moment (the
    // feeder may move L2 counters: retry until two ctl answers agree).
    let mut agreed = false;
    for _ in 0..50 {
        let a = served.ctl_stats();
        let (_, page) = http_get(served.http, b"GET /metrics HTTP/1.1\r\n\r\n");
        let b = served.ctl_stats();
        if a != b {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        let m = l2arc_testkit::prometheus_samples(&page);
        for (name, value) in &a {
            let found = ["_total", "_bytes_total", "_bytes", ""]
                .iter()
                .find_map(|suffix| m.get(&format!("l2arc_arcstats_{name}{suffix}")))
                .or_else(|| {
                    // Times exported in seconds, under their unit's name.
                    let exported = match name.as_str() {
                        "l2_rebuild_time_us" => "l2arc_arcstats_l2_rebuild_time_seconds_total",
                        "arc_prewarm_ms" => "l2arc_arcstats_arc_prewarm_seconds_total",
                        "l2_stop_flush_ms" => "l2arc_arcstats_l2_stop_flush_seconds_total",
                        "arc_checkpoint_age_secs" => "l2arc_arcstats_arc_checkpoint_age_seconds",
                        _ => return None,
                    };
                    m.get(exported)
                })
                .unwrap_or_else(|| panic!("{name} missing from /metrics"));
            let want = if name.ends_with("_us") {
                *value as f64 / 1e6
            } else if name.ends_with("_ms") {
                *value as f64 / 1e3
            } else {
                *value as f64
            };
            assert_eq!(*found, want, "{name}");
        }
        agreed = true;
        break;
    }
    assert!(agreed, "the counters never held still for 0.1 s");
}

#[test]
fn http_endpoint_refuses_abuse_and_keeps_serving() {
    let served = Served::start();
    let (status, _) = http_get(served.http, &vec![b'A'; 1 << 20]);
    assert_eq!(status, 431);
    let (status, _) = http_get(served.http, b"BREW /pot HTCPCP/1.0\r\n\r\n");
    assert_eq!(status, 400);
    let (status, _) = http_get(served.http, b"DELETE /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status, 405);
    let (status, body) = http_get(served.http, b"GET / HTTP/1.1\r\n\r\n");
    assert_eq!(status, 200);
    assert!(body.contains("<canvas") && !body.contains("http://") && !body.contains("https://"));
    served.read_records(16, 1);
    let (status, body) = http_get(served.http, b"GET /api/stats HTTP/1.1\r\n\r\n");
    assert_eq!(status, 200);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(json["kstats"]["c_max"].as_u64().unwrap() == 16 << 20);
    // The drill-down: the image (opened by the empty name) and its misses.
    let top = &json["top_objects"][0];
    assert_eq!(top["dataset"], "nbd", "{json}");
    assert_eq!(top["name"], "", "{json}");
    assert!(top["misses"].as_u64().unwrap() >= 16, "{json}");
    assert!(top["reads"].as_u64().unwrap() >= top["misses"].as_u64().unwrap());
    // One object: every primary read and L2ARC hit was for it.
    assert_eq!(
        top["primary_reads"], json["kstats"]["primary_reads"],
        "{json}"
    );
    assert_eq!(top["l2_hits"], json["kstats"]["l2_hits"], "{json}");
    assert!(
        top["bytes_below"].as_u64().unwrap()
            >= json["kstats"]["primary_read_bytes"].as_u64().unwrap(),
        "{json}"
    );
    // The export still serves reads.
    served.read_records(4, 1);

    // A remote address without --allow-remote: one clear line, no service.
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("x.img");
    std::fs::write(&image, vec![0u8; 1 << 20]).unwrap();
    let out = l2arc()
        .arg("serve-nbd")
        .arg(&image)
        .arg("--listen")
        .arg(format!("unix:{}", dir.path().join("s").display()))
        .args(["--http", "0.0.0.0:0"])
        .output()
        .unwrap();
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "--allow-remote");
}

#[test]
fn secondarycache_switch_takes_l2_hits_to_zero_and_back() {
    let served = Served::start();
    let pass = || {
        let before = served.ctl_stats();
        run(tool("nbdcopy").arg(served.uri()).arg("null:"));
        let after = served.ctl_stats();
        let d = |n: &str| after.get(n).copied().unwrap_or(0) - before.get(n).copied().unwrap_or(0);
        (d("l2_hits"), d("l2_misses"), d("primary_reads"))
    };
    // The image is twice the ARC: the feeder copies what the ARC evicts.
    let mut warm = false;
    for _ in 0..8 {
        if pass().0 > 0 {
            warm = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(1500));
    }
    assert!(warm, "no L2ARC hits after 8 passes");

    let set = |value: &str| {
        run(l2arc()
            .args(["ctl", "--socket"])
            .arg(&served.control)
            .args(["set", "nbd", &format!("secondarycache={value}")]));
    };
    set("none");
    let listed = run(l2arc()
        .args(["ctl", "--socket"])
        .arg(&served.control)
        .arg("datasets"));
    assert!(
        String::from_utf8_lossy(&listed.stdout)
            .contains("nbd recordsize=65536 primarycache=all secondarycache=none"),
        "{listed:?}"
    );
    let (l2_hits, l2_misses, primary) = pass();
    assert_eq!(
        (l2_hits, l2_misses),
        (0, 0),
        "secondarycache=none still reads the L2ARC"
    );
    assert!(primary > 0);
    set("all");
    let mut back = false;
    for _ in 0..4 {
        if pass().0 > 0 {
            back = true;
            break;
        }
    }
    assert!(back, "L2ARC hits did not come back with secondarycache=all");

    // Bad input: one clear error, and the service keeps its setting.
    let out = l2arc()
        .args(["ctl", "--socket"])
        .arg(&served.control)
        .args(["set", "nbd", "secondarycache=some"])
        .output()
        .unwrap();
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "expected all or none");
    let out = l2arc()
        .args(["ctl", "--socket"])
        .arg(&served.control)
        .args(["set", "nosuch", "primarycache=none"])
        .output()
        .unwrap();
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "no dataset named \"nosuch\"");
}
