//! Each seed-experiment scenario runs end to end through the `l2arc-bench`
//! binary at a tiny size and writes its JSON and HTML report with sane values.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Runs `l2arc-bench --scenario NAME` at tiny sizes; returns the JSON report.
fn run(scenario: &str, extra: &[&str], dir: &Path) -> Value {
    let reports = dir.join("reports");
    let data = dir.join("data");
    let mut args: Vec<String> = [
        "--scenario",
        scenario,
        "--json",
        "--cache-size",
        "32MiB",
        "--arc-max",
        "4MiB",
        "--max-file-size",
        "2MiB",
        "--multiples",
        "0.5",
        "--seed",
        "3",
    ]
    .map(String::from)
    .to_vec();
    args.push("--data".into());
    args.push(data.display().to_string());
    args.push("--report-dir".into());
    args.push(reports.display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = Command::new(env!("CARGO_BIN_EXE_l2arc-bench"))
        .args(&args)
        .output()
        .expect("run l2arc-bench");
    assert!(
        out.status.success(),
        "l2arc-bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let file = std::fs::read_to_string(reports.join(format!("{scenario}.json"))).unwrap();
    let saved: Value = serde_json::from_str(&file).unwrap();
    assert_eq!(saved["scenario"], stdout["scenario"]);
    let html = std::fs::read_to_string(reports.join(format!("{scenario}.html"))).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.contains("<canvas data-chart="));
    // The shared chart code once, nothing fetched.
    assert_eq!(html.matches("const L2Charts").count(), 1, "chart code once");
    assert!(!html.contains("src="), "nothing fetched");
    assert!(!html.contains("NaN"), "no NaN in charts");
    saved
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn throughput_l2arc_beats_no_l2arc_when_the_dataset_fits() {
    let dir = tempfile::tempdir().unwrap();
    let r = run(
        "throughput",
        &["--measure-secs", "2", "--warm-secs", "4"],
        dir.path(),
    );
    let ratio = f(&r["dataset_lz4_ratio"]);
    assert!((1.8..=2.2).contains(&ratio), "LZ4 ratio {ratio}");
    let cells = r["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 3, "no_l2arc, l2arc, l2arc_lz4 at 0.5x");
    let mib = |s: &str| f(&cells.iter().find(|c| c["setting"] == s).unwrap()["mib_per_sec"]);
    for c in cells {
        assert!(f(&c["iops"]) > 0.0 && f(&c["mib_per_sec"]) > 0.0);
        assert!(!c["samples"].as_array().unwrap().is_empty());
    }
    assert!(
        mib("l2arc") > 2.0 * mib("no_l2arc"),
        "l2arc {} vs no_l2arc {} MiB/s",
        mib("l2arc"),
        mib("no_l2arc")
    );
    let ratios = &r["ratios"][0];
    assert!(f(&ratios["l2arc_over_no_l2arc"]) > 2.0);
    assert!(f(&ratios["l2arc_lz4_over_l2arc"]) > 0.0);
    let floor = &r["floor"];
    assert!(f(&floor["hdd_service_ms_128k"]) > 8.0 && f(&floor["ratio"]) > 1.0);
    assert!(f(&r["bytes_verified"]) > 0.0);
}

#[test]
fn latency_warm_beats_cold() {
    let dir = tempfile::tempdir().unwrap();
    let r = run(
        "latency",
        &["--measure-secs", "2", "--warm-secs", "15"],
        dir.path(),
    );
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs[0]["target"], "no_cache");
    let ours = runs.iter().find(|x| x["warm"].is_object()).unwrap();
    let (cold, warm) = (&ours["cold"], &ours["warm"]);
    assert!(
        f(&warm["iops"]) > f(&cold["iops"]),
        "warm {warm} cold {cold}"
    );
    assert!(f(&warm["latency_us_p50"]) < f(&cold["latency_us_p50"]));
    for key in [
        "latency_us_p50",
        "latency_us_p90",
        "latency_us_p99",
        "latency_us_p999",
    ] {
        assert!(f(&warm[key]) > 0.0, "{key}");
    }
    assert!(f(&warm["l2arc_hit_ratio"]) > 0.5, "{warm}");
    assert!(f(&ours["iops_factor"]) > 1.0);
    assert_eq!(f(&r["seed_iops_factor"]), 8.3);
    let samples = ours["samples"].as_array().unwrap();
    assert_eq!(
        samples[0]["latency_buckets"].as_array().unwrap().len(),
        r["heatmap_bucket_lower_us"].as_array().unwrap().len()
    );
}

#[test]
fn warmup_draws_the_fill_curve() {
    let dir = tempfile::tempdir().unwrap();
    let r = run("warmup", &["--measure-secs", "4"], dir.path());
    let runs = r["runs"].as_array().unwrap();
    let ours = runs.iter().find(|x| x["target"] != "no_cache").unwrap();
    let samples = ours["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 4, "one sample per second");
    let fill = |s: &Value| f(&s["counters"]["flash_bytes"]);
    assert!(fill(&samples[3]) > 0.0, "the L2ARC filled");
    assert!(fill(&samples[3]) >= fill(&samples[0]));
    assert!(f(&ours["final_iops"]) > f(&r["no_cache_iops"]));
    assert!(f(&r["no_cache_iops"]) > 0.0);
}

/// `--scenario s3` at a tiny size: both systems measured, and l2arc's
/// restart read whole from its L2ARC (only listings reach the bucket).
#[test]
fn s3_scenario_measures_l2arc_and_rclone() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_l2arc-bench"))
        .args(["--scenario", "s3", "--dataset-size", "8MiB", "--files", "2"])
        .args([
            "--arc-max",
            "16MiB",
            "--cache-size",
            "64MiB",
            "--recordsize",
            "1M",
        ])
        .args(["--measure-secs", "1", "--data"])
        .arg(dir.path())
        .output()
        .expect("run l2arc-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let row = |prefix: &str| -> Vec<String> {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} row in {stdout}"));
        line.split_whitespace().map(String::from).collect()
    };
    let l2arc = row("l2arc (");
    let rclone = row("rclone mount");
    for r in [&l2arc, &rclone] {
        let cold: f64 = r[r.len() - 6].parse().unwrap();
        assert!(cold > 0.0, "{r:?}");
    }
    // The restart's counters (the second "at unmount" line): nothing from
    // S3, every one of the 8 records from the L2ARC.
    let restart = stderr
        .lines()
        .filter(|l| l.starts_with("s3: l2arc at unmount:"))
        .nth(1)
        .unwrap_or_else(|| panic!("no restart counters in {stderr}"));
    let counter = |name: &str| -> u64 {
        restart
            .split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {restart}"))
    };
    assert_eq!(
        counter("primary_reads"),
        0,
        "the restart went to S3: {restart}"
    );
    assert!(
        counter("l2_hits") >= 8,
        "the restart did not read from the L2ARC: {restart}"
    );
}

/// `--scenario s3-defaults` at a tiny size: both systems at their default
/// settings (no `--arc-max`, rclone without budgets), warm reads measured
/// without a restart, the two headline figures of issue 33.
#[test]
fn s3_defaults_runs_both_systems_at_their_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_l2arc-bench"))
        .args(["--scenario", "s3-defaults", "--dataset-size", "8MiB"])
        .args(["--files", "2", "--measure-secs", "1", "--json", "--data"])
        .arg(dir.path())
        .output()
        .expect("run l2arc-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(report["mode"], "defaults");
    let results = report["results"].as_array().expect("results");
    assert_eq!(results.len(), 2, "{report}");
    let system = |i: usize| results[i]["system"].as_str().unwrap().to_string();
    assert!(system(0).contains("arc_max default"), "{}", system(0));
    assert!(system(1).contains("defaults otherwise"), "{}", system(1));
    for r in results {
        assert!(f(&r["warm_iops"]) > 0.0, "{r}");
        assert!(f(&r["warm_p99_us"]) > 0.0, "{r}");
        assert!(r["restart_secs"].is_null(), "no restart measured: {r}");
    }
    let keys: Vec<&str> = report["headline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["defaults_warm_iops", "defaults_warm_p99_us"]);
}

/// `--scenario restart` at a tiny size: warm, then the four restarts,
/// each with its per-second IOPS, counters polled from the ready line and
/// its figures; fio's sequential read of the cache file after the first
/// clean stop.
#[test]
fn restart_scenario_measures_four_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_l2arc-bench"))
        .args(["--scenario", "restart", "--dataset-size", "32MiB"])
        .args(["--arc-max", "4MiB", "--cache-size", "64MiB"])
        .args(["--warm-secs", "10", "--measure-secs", "12", "--json"])
        .arg("--data")
        .arg(dir.path())
        .current_dir(dir.path())
        .output()
        .expect("run l2arc-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert!(f(&report["warm_iops"]) > 0.0, "{report}");
    let restarts = report["restarts"].as_array().expect("restarts");
    let kinds: Vec<&str> = restarts
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "clean_prewarm",
            "kill_prewarm",
            "clean_no_prewarm",
            "clean_prewarm_alone"
        ]
    );
    // (d)'s reads waited for its prewarm: it ran, and read from flash.
    let alone = &restarts[3]["prewarm"];
    assert!(alone["records"].as_u64().unwrap() > 0, "{alone}");
    assert!(alone["reads"].as_u64().unwrap() > 0, "{alone}");
    for r in restarts {
        assert!(
            r["iops_per_second"].as_array().unwrap().len() >= 10,
            "a window of 12 s logs at least 10 whole seconds: {r}"
        );
        let samples = r["samples"].as_array().unwrap();
        assert!(samples.len() >= 10, "counters polled each second: {r}");
        assert!(f(&r["hit_ratio_first_10s"]) <= 1.0, "{r}");
        assert!(r["primary_reads_in_window"].is_u64(), "{r}");
    }
    // After SIGKILL the server printed nothing at the stop.
    assert_eq!(restarts[1]["stop_lines"], serde_json::json!([]));
    assert!(f(&report["seq_read"]["mib_per_sec"]) > 0.0, "{report}");
    let series = dir.path().join(report["series_path"].as_str().unwrap());
    assert!(series.is_file(), "the full series under target/bench-data");
    let keys: Vec<&str> = report["headline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["key"].as_str().unwrap())
        .collect();
    assert!(keys.starts_with(&[
        "clean_secs_to_90pct",
        "kill_secs_to_90pct",
        "clean_primary_reads"
    ]));
}

/// `--scenario fleet` at a tiny size, two nodes: l2arc's second node reads
/// the data from the shared tier (no data GET: the fleet's GETs are node
/// 1's), rclone's reads the bucket again; the three goals' figures.
#[test]
fn fleet_scenario_reads_the_bucket_once_for_the_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_l2arc-bench"))
        .args(["--scenario", "fleet", "--dataset-size", "8MiB"])
        .args(["--files", "2", "--nodes", "2", "--arc-max", "16MiB"])
        .args(["--measure-secs", "1", "--json", "--data"])
        .arg(dir.path())
        .output()
        .expect("run l2arc-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let results = report["results"].as_array().expect("results");
    assert_eq!(results.len(), 2, "{report}");
    let (ours, rclone) = (&results[0], &results[1]);
    assert!(ours["system"].as_str().unwrap().starts_with("l2arc"));
    assert!(rclone["system"].as_str().unwrap().starts_with("rclone"));
    for r in results {
        let cold = r["cold"].as_array().unwrap();
        assert_eq!(cold.len(), 2, "{r}");
        assert!(cold.iter().all(|c| f(&c["mib_per_sec"]) > 0.0), "{r}");
        assert!(cold[0]["data_gets"].as_u64().unwrap() > 0, "{r}");
        assert!(f(&r["random_iops"]) > 0.0, "{r}");
    }
    let node2 = &ours["cold"][1];
    assert_eq!(node2["data_gets"], 0, "node 2 read the data bucket: {ours}");
    assert!(node2["shared_hits"].as_u64().unwrap() > 0, "{ours}");
    assert!(
        rclone["cold"][1]["data_gets"].as_u64().unwrap() > 0,
        "rclone's node 2 has no cache of node 1's: {rclone}"
    );
    // What the fresh node fetched from the data bucket in its window:
    // for l2arc, its listing and no record.
    assert!(
        ours["random_data_bytes"].as_u64().unwrap() < 64 << 10,
        "{ours}"
    );
    assert!(
        rclone["random_data_bytes"].as_u64().unwrap() > 0,
        "{rclone}"
    );
    assert_eq!(
        f(&report["data_link_mib_per_sec"]),
        0.0,
        "no cap by default"
    );
    let keys: Vec<&str> = report["headline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["key"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        [
            "fleet_gets_over_node1",
            "others_over_node1_cold",
            "fresh_node_random_iops"
        ]
    );
    // A link cap that is not a rate is refused before anything starts.
    let out = Command::new(env!("CARGO_BIN_EXE_l2arc-bench"))
        .args(["--scenario", "fleet", "--data-link-mib-per-sec", "NaN"])
        .arg("--data")
        .arg(dir.path())
        .output()
        .expect("run l2arc-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("--data-link-mib-per-sec"), "{stderr}");
}
