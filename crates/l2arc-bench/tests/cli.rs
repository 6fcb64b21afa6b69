//! The `l2arc-bench` binary as a user runs it: bad settings are one-line
//! errors, and the quick scenarios run end to end and report both sides.

use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_l2arc-bench"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run the l2arc-bench binary")
}

/// Runs a scenario that must succeed and returns its JSON report.
fn bench_json(args: &[&str]) -> serde_json::Value {
    let out = bench(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

#[test]
fn bench_rejects_bad_settings() {
    for (args, needle) in [
        (vec!["--recordsize", "3000"], "recordsize"),
        (vec!["--recordsize", "2M"], "recordsize"),
        (vec!["--threads", "0"], "--threads"),
        (
            vec!["--data", "/nonexistent/l2arc/data"],
            "/nonexistent/l2arc/data",
        ),
        (vec!["--hot-read-fraction", "1.5"], "--hot-read-fraction"),
        (vec!["--queue-only"], "--queue-only"),
        (vec!["--arc-max", "100"], "arc_max"),
        (
            vec![
                "--spindles",
                "0",
                "--seconds",
                "1",
                "--dataset-size",
                "1MiB",
            ],
            "spindles",
        ),
    ] {
        let out = bench(&args);
        l2arc_testkit::assert_one_line_error(&out, "l2arc-bench", needle);
    }
}

#[test]
fn bench_demo_runs_and_checks_every_byte() {
    let data = tempfile::tempdir().unwrap();
    let report = bench_json(&[
        "--data",
        data.path().to_str().unwrap(),
        "--seconds",
        "1.5",
        "--dataset-size",
        "8MiB",
        "--files",
        "4",
        "--arc-max",
        "2MiB",
        "--threads",
        "4",
        "--seek-ms-min",
        "1",
        "--seek-ms-max",
        "2",
        "--json",
    ]);
    let phases = report["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2);
    assert_eq!(phases[0]["setting"], "no_cache");
    assert_eq!(phases[0]["arc_hit_ratio"], 0.0);
    assert_eq!(phases[1]["setting"], "arc_l2arc");
    // The feeder copied records to the cache file during the run.
    assert!(
        phases[1]["l2_size_bytes"].as_u64().unwrap() > 0,
        "{}",
        phases[1]
    );
    for phase in phases {
        assert!(phase["ops"].as_u64().unwrap() > 100, "{phase}");
    }
    let hit_ratio = phases[1]["arc_hit_ratio"].as_f64().unwrap();
    assert!(
        hit_ratio > 0.3,
        "ARC hit ratio {hit_ratio} with 80% of reads to a hot set that fits"
    );
    assert!(report["bytes_verified"].as_u64().unwrap() > 0);
    let arcstats = report["arcstats"].as_array().unwrap();
    let size = arcstats.iter().find(|kv| kv[0] == "size").unwrap()[1]
        .as_u64()
        .unwrap();
    assert!(size <= 2 << 20, "ARC size {size} above arc_max");
    // The dataset stays for reuse.
    assert!(data.path().join("l2arc-dataset.json").is_file());
}

#[test]
fn bench_arc_hit_reports_both_sides() {
    let report = bench_json(&["--scenario", "arc-hit", "--seconds", "0.3", "--json"]);
    // Stamped like every report, the rows under "rows".
    assert_eq!(report["stamp"]["scenario"], "arc-hit");
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for row in rows {
        assert!(row["arc_hits_per_sec"].as_f64().unwrap() > 1000.0, "{row}");
        assert!(
            row["mutex_hashmap_per_sec"].as_f64().unwrap() > 1000.0,
            "{row}"
        );
        // Analytics off and on were both measured.
        assert!(
            row["analytics_off_per_sec"].as_f64().unwrap() > 1000.0,
            "{row}"
        );
        assert!(
            row["analytics_on_per_sec"].as_f64().unwrap() > 1000.0,
            "{row}"
        );
        assert!(row["analytics_cost"].as_f64().unwrap().is_finite(), "{row}");
    }
}

#[test]
fn bench_l2_index_fits_the_dram_budget() {
    let report = bench_json(&["--scenario", "l2-index", "--records", "1M", "--json"]);
    assert_eq!(report["openzfs_l2only_header_bytes"], 96.0);
    let rows = report["rows"].as_array().unwrap();
    let builds: Vec<&str> = rows.iter().map(|r| r["build"].as_str().unwrap()).collect();
    assert_eq!(builds, ["pre_sized", "grown_from_empty"]);
    for row in rows {
        assert_eq!(row["records"], 1_000_000);
        let bytes = row["index_bytes_per_record"].as_f64().unwrap();
        // A slot is 15 bytes (17 in the small shards of 1 M records) at 77
        // to 96% load, all overheads in.
        assert!((15.0..=23.0).contains(&bytes), "{row}");
        // Records lost to a fingerprint collision: ~2 expected of 1 M.
        assert!(row["records_lost"].as_u64().unwrap() < 40, "{row}");
        assert!(row["gets_hit_per_sec"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["gets_miss_per_sec"].as_f64().unwrap() > 0.0, "{row}");
        let rss = row["rss_delta_bytes_per_record"].as_f64().unwrap();
        assert!(rss > 10.0 && rss < 2.0 * bytes + 8.0, "{row}");
        assert_eq!(row["openzfs_bytes_per_record"], 96.0);
        let ratio = row["openzfs_over_ours"].as_f64().unwrap();
        assert!((ratio - 96.0 / bytes).abs() < 1e-9, "{row}");
    }
}

#[test]
fn bench_l2_rebuild_restores_every_record() {
    let report = bench_json(&["--scenario", "l2-rebuild", "--records", "20k", "--json"]);
    let rows = report["rows"].as_array().unwrap();
    // 4 KiB and 8 KiB records, each into a pre-sized and a growing index.
    assert_eq!(rows.len(), 4);
    for row in rows {
        assert_eq!(row["records_written"], 20_000, "{row}");
        assert_eq!(row["records_restored"], 20_000, "{row}");
        // Batches of up to 16 MiB: at least 20,000 / 4,096 of them.
        assert!(row["log_blocks"].as_u64().unwrap() >= 5, "{row}");
        let secs = row["rebuild_secs"].as_f64().unwrap();
        assert!(secs > 0.0 && secs < 30.0, "{row}");
        let rate = row["records_per_sec"].as_f64().unwrap();
        assert!((rate * secs - 20_000.0).abs() < 1.0, "{row}");
        assert!(row["direct_io"].is_boolean(), "{row}");
    }
    let sizes: Vec<u64> = rows
        .iter()
        .map(|r| r["record_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [4096, 4096, 8192, 8192]);
}

#[test]
fn bench_l2_hit_queue_only_pairs_the_read_queue_with_fio() {
    // On the disk: the scenario refuses a cache file on tmpfs.
    let data = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let report = bench_json(&[
        "--scenario",
        "l2-hit",
        "--queue-only",
        "--rounds",
        "3",
        "--seconds",
        "0.5",
        "--cache-size",
        "64MiB",
        "--data",
        data.path().to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(report["queue_only"], true);
    assert_eq!(report["rounds"], 3);
    // Nothing but the read queue against fio io_uring was measured.
    assert_eq!(report["io_uring_over_psync"].as_array().unwrap().len(), 0);
    let rows = report["rows"].as_array().unwrap();
    let sizes: Vec<u64> = rows
        .iter()
        .map(|r| r["record_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [4096, 8192]);
    for row in rows {
        assert_eq!(row["queue_depth"], 32, "{row}");
        assert!(
            row["fio_job"].as_str().unwrap().contains("io_uring"),
            "{row}"
        );
        assert!(
            row["pread"].is_null() && row["ours_over_pread"].is_null(),
            "{row}"
        );
        let ours = &row["ours"];
        assert!(ours["l2_hit_ratio"].as_f64().unwrap() >= 0.95, "{row}");
        assert!(ours["iops"].as_f64().unwrap() > 0.0, "{row}");
        assert!(ours["cpu_us_per_read"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["fio"]["iops"].as_f64().unwrap() > 0.0, "{row}");
        // Each round's figures: its ratio is ours over fio's IOPS.
        let figures = row["round_figures"].as_array().unwrap();
        assert_eq!(figures.len(), 3, "{row}");
        let mut ratios = Vec::new();
        for figure in figures {
            let get = |name: &str| figure[name].as_f64().unwrap();
            assert!(get("ours_cpu_us_per_read") > 0.0, "{row}");
            assert!(get("fio_cpu_us_per_read") > 0.0, "{row}");
            ratios.push(get("ours_iops") / get("fio_iops"));
        }
        assert!(ratios.iter().all(|r| *r > 0.0), "{row}");
        let (min, max) = (
            row["ratio_min"].as_f64().unwrap(),
            row["ratio_max"].as_f64().unwrap(),
        );
        // Within a rounding of the JSON round trip.
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(
            ratios.iter().all(|r| *r > min - 1e-9 && *r < max + 1e-9),
            "{row}"
        );
        let ratio = row["ratio"].as_f64().unwrap();
        assert!(
            ratios.iter().any(|r| close(*r, ratio)),
            "the median of three is one of them: {row}"
        );
    }
}
