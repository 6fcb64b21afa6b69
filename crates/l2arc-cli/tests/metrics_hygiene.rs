//! `/metrics` of a real `serve-nbd` and `mount`, as Prometheus' tools and
//! naming guide want it: `promtool check metrics` with no word of
//! complaint, a HELP sentence for every family, flags as gauges, byte
//! counters in `_bytes_total`, `l2arc_build_info`, the standard
//! `process_*` families, NBD's connections, requests and latency, FUSE's
//! operations, and no counter that falls between two scrapes. The Grafana
//! dashboard (packaging/grafana/l2arc.json) asks only for names served.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use l2arc_testkit::nbd::NbdClient;
use l2arc_testkit::service::{Running, Service};

const IMAGE_BYTES: usize = 16 << 20;
const RECORD_BYTES: u64 = 64 << 10;

fn l2arc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_l2arc"))
}

struct Served {
    dir: tempfile::TempDir,
    socket: PathBuf,
    control: PathBuf,
    http: SocketAddr,
    _service: Running,
}

impl Served {
    fn start() -> Served {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::write(&image, l2arc_testkit::nbd::pattern(IMAGE_BYTES, 5)).unwrap();
        let socket = dir.path().join("nbd.sock");
        let control = dir.path().join("ctl.sock");
        let service = Service::serve_nbd(Path::new(env!("CARGO_BIN_EXE_l2arc")), &image)
            .listen_unix(&socket)
            .args(["--arc-max", "8MiB", "--http", "127.0.0.1:0"])
            .arg("--control")
            .arg(&control)
            .arg("--cache")
            .arg(dir.path().join("l2.img"))
            .args(["--cache-size", "64MiB"])
            .start();
        Served {
            http: service.http().expect("no `l2arc: http on` line"),
            dir,
            socket,
            control,
            _service: service,
        }
    }

    fn read_records(&self, records: u64) {
        let mut client = NbdClient::open(&self.socket).unwrap();
        for r in 0..records {
            client.read(r * RECORD_BYTES, 4096).unwrap();
        }
        client.disconnect().unwrap();
    }

    fn ctl(&self, args: &[&str]) -> String {
        let out = l2arc_testkit::run(l2arc().arg("ctl").arg("-S").arg(&self.control).args(args));
        String::from_utf8(out.stdout).unwrap()
    }
}

/// `/metrics`, which must answer 200.
fn scrape(addr: SocketAddr) -> String {
    let (status, body) = l2arc_testkit::http_get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    body
}

/// Family name -> (TYPE, HELP).
fn families(page: &str) -> HashMap<String, (String, String)> {
    let mut out: HashMap<String, (String, String)> = HashMap::new();
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.entry(name.into()).or_default().1 = help.into();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            out.entry(name.into()).or_default().0 = kind.into();
        }
    }
    out
}

#[test]
fn metrics_pass_promtool_silently_and_name_their_units() {
    let served = Served::start();
    served.read_records(64);
    let page = scrape(served.http);
    l2arc_testkit::promtool_check(&page);
    let families = families(&page);
    for (name, (kind, help)) in &families {
        assert!(!kind.is_empty(), "{name} has no TYPE");
        assert!(
            help.ends_with('.') && help.len() > 20,
            "{name}: HELP `{help}`"
        );
        assert!(
            !help.contains("An arcstats counter"),
            "{name}: generic HELP"
        );
        let unit_named = ["bytes", "seconds", "count", "0 or 1", "value 1", "labels"]
            .iter()
            .any(|u| help.contains(u));
        assert!(unit_named, "{name}: HELP names no unit: {help}");
        if kind == "counter" {
            assert!(name.ends_with("_total"), "counter {name}");
        }
        if name.starts_with("l2arc_arcstats_evict_l2_") {
            assert!(name.ends_with("_bytes_total"), "byte counter {name}");
        }
    }
    assert_eq!(families["l2arc_arcstats_l2_ioengine_uring"].0, "gauge");
    assert_eq!(
        families["l2arc_arcstats_evict_l2_eligible_bytes_total"].0,
        "counter"
    );
    let m = l2arc_testkit::prometheus_samples(&page);
    let version = env!("CARGO_PKG_VERSION");
    let build = m
        .iter()
        .find(|(k, _)| {
            k.starts_with(&format!(
                "l2arc_build_info{{version=\"{version}\",commit=\""
            ))
        })
        .unwrap_or_else(|| panic!("no l2arc_build_info:\n{page}"));
    assert_eq!(*build.1, 1.0);
    assert!(m["process_resident_memory_bytes"] > 1e6, "{page}");
    assert!(m["process_open_fds"] >= 3.0 && m["process_max_fds"] >= m["process_open_fds"]);
    assert!(m.contains_key("process_cpu_seconds_total"));
    let now_secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = m["process_start_time_seconds"];
    assert!(
        started <= now_secs + 1.0 && started > now_secs - 600.0,
        "{started}"
    );
    // NBD: the one client, its 64 reads, timed.
    assert!(m["l2arc_nbd_connections_accepted_total"] >= 1.0, "{page}");
    assert!(m.contains_key("l2arc_nbd_connections"));
    assert!(
        m["l2arc_nbd_requests_by_type_total{type=\"read\"}"] >= 64.0,
        "{page}"
    );
    assert!(
        m["l2arc_nbd_request_latency_seconds_count{type=\"read\"}"] >= 64.0,
        "{page}"
    );
    assert_eq!(m["l2arc_nbd_request_errors_total"], 0.0);
}

/// Every `_total` series holds or grows from one scrape to the next, while
/// a cache device is added, read from and removed.
#[test]
fn counters_never_fall_between_scrapes() {
    let served = Served::start();
    let extra = served.dir.path().join("extra.img");
    let mut last: HashMap<String, f64> = HashMap::new();
    let check = |last: &mut HashMap<String, f64>, page: &str| {
        for (series, value) in l2arc_testkit::prometheus_samples(page) {
            let name = series.split('{').next().unwrap();
            if !(name.ends_with("_total") || name.ends_with("_count") || name.ends_with("_bucket"))
            {
                continue;
            }
            if let Some(before) = last.get(&series) {
                assert!(value >= *before, "{series} fell from {before} to {value}");
            }
            last.insert(series, value);
        }
    };
    for round in 0..3 {
        served.read_records(128);
        check(&mut last, &scrape(served.http));
        served.ctl(&["add-cache", extra.to_str().unwrap(), "32MiB"]);
        served.read_records(256);
        check(&mut last, &scrape(served.http));
        let devices = served.ctl(&["devices"]);
        let slot = devices
            .lines()
            .find(|l| l.ends_with("extra.img"))
            .unwrap_or_else(|| panic!("round {round}: {devices}"))
            .split_whitespace()
            .next()
            .unwrap()
            .to_string();
        served.ctl(&["remove-cache", &slot]);
        check(&mut last, &scrape(served.http));
        // The next attachment of the device counts from zero under the
        // same labels: a reset Prometheus reads as one. Every other series
        // (the cache's totals included) must not fall.
        last.retain(|series, _| !series.contains("extra.img"));
    }
}

/// Metric names a PromQL expression reads (not functions, keywords,
/// labels, strings or ranges).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut text = String::new();
    let mut depth_braces = 0;
    let mut in_string = false;
    let mut in_range = false;
    for c in expr.chars() {
        match c {
            '"' => in_string = !in_string,
            _ if in_string => {}
            '{' => depth_braces += 1,
            '}' => depth_braces -= 1,
            '[' => in_range = true,
            ']' => in_range = false,
            _ if depth_braces > 0 || in_range => {}
            _ => text.push(c),
        }
    }
    // Grouping clauses name labels.
    for clause in [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ] {
        while let Some(at) = find_word(&text, clause) {
            let rest = &text[at + clause.len()..];
            let open = rest.find('(').unwrap();
            let close = rest.find(')').unwrap();
            text = format!("{}{}", &text[..at], &rest[close + 1..]);
            assert!(open < close);
        }
    }
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_alphabetic() || bytes[i] == b'_' {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b':')
            {
                i += 1;
            }
            let word = &text[start..i];
            let is_call = text[i..].trim_start().starts_with('(');
            let keyword = ["and", "or", "unless", "bool", "offset"].contains(&word);
            if !is_call && !keyword {
                names.insert(word.to_string());
            }
        } else {
            i += 1;
        }
    }
    names
}

fn find_word(text: &str, word: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    text.match_indices(word).map(|(at, _)| at).find(|&at| {
        let before = at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
        let end = at + word.len();
        let after =
            end >= bytes.len() || !(bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_');
        before && after && text[end..].trim_start().starts_with('(')
    })
}

/// The family of a served sample's name (`x_bucket` of a histogram is `x`'s).
fn served_names(page: &str) -> BTreeSet<String> {
    l2arc_testkit::prometheus_samples(page)
        .keys()
        .map(|s| s.split('{').next().unwrap().to_string())
        .collect()
}

#[test]
fn promql_names_are_parsed() {
    let names = metric_names(
        "histogram_quantile(0.99, sum by (le, tier) (rate(a_bucket{tier=\"x\"}[$__rate_interval]))) / b + rate(c_total[5m])",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["a_bucket", "b", "c_total"]
    );
}

/// Every query of every panel of the dashboard names metrics that a live
/// serve-nbd or mount serves, and the dashboard has the seeds' views.
#[test]
fn grafana_dashboard_asks_only_for_served_metrics() {
    let served = Served::start();
    served.read_records(16);
    let mut available = served_names(&scrape(served.http));
    available.extend(served_names(&scrape_a_mount()));

    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/grafana/l2arc.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    let mut queries = 0;
    let mut titles = Vec::new();
    for panel in panels {
        titles.push(panel["title"].as_str().unwrap().to_string());
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{expr}");
            for name in names {
                assert!(
                    available.contains(&name),
                    "panel `{}` asks for {name}, which /metrics does not serve ({expr})",
                    panel["title"]
                );
            }
            queries += 1;
        }
    }
    assert!(queries >= 30, "{queries} queries");
    let heatmaps: Vec<&str> = panels
        .iter()
        .filter(|p| p["type"] == "heatmap")
        .flat_map(|p| p["targets"].as_array().unwrap())
        .map(|t| t["expr"].as_str().unwrap())
        .collect();
    for tier in ["arc_hit", "l2_hit", "shared_hit", "primary"] {
        assert!(
            heatmaps
                .iter()
                .any(|e| e.contains(&format!("tier=\"{tier}\""))),
            "no latency heat map of {tier}"
        );
    }
    for title in [
        "Hits and misses by tier",
        "L2ARC size",
        "L2ARC feed",
        "Errors",
        "NBD requests",
    ] {
        assert!(
            titles.iter().any(|t| t.starts_with(title)),
            "no `{title}` panel: {titles:?}"
        );
    }
}

/// /metrics of a live mount, after a file was read through it.
fn scrape_a_mount() -> String {
    let dir = tempfile::tempdir().unwrap();
    let (src, mnt) = (dir.path().join("src"), dir.path().join("mnt"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::write(src.join("f"), vec![7u8; 1 << 20]).unwrap();
    let mut service = Service::mount(Path::new(env!("CARGO_BIN_EXE_l2arc")), &src, &mnt)
        .args(["--arc-max", "16MiB", "--http", "127.0.0.1:0"])
        .start();
    assert_eq!(std::fs::read(mnt.join("f")).unwrap().len(), 1 << 20);
    let page = scrape(service.http().expect("no `l2arc: http on` line"));
    assert!(
        l2arc_testkit::prometheus_samples(&page)["l2arc_fuse_requests_total{op=\"read\"}"] >= 1.0,
        "{page}"
    );
    l2arc_testkit::promtool_check(&page);
    assert!(service.stop().0.success());
    page
}
