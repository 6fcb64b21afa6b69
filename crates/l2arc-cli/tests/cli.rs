//! The `l2arc` binary as a user runs it: real arguments, real files, exit
//! codes and the exact shape of error messages.

use std::path::Path;
use std::process::{Command, Output};

fn l2arc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_l2arc"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run the l2arc binary")
}

#[test]
fn missing_trace_is_a_one_line_error() {
    let out = l2arc(&[
        "trace",
        "/nonexistent/trace.lis",
        "--format",
        "lis",
        "--sizes",
        "100",
    ]);
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "/nonexistent/trace.lis");
}

#[test]
fn malformed_trace_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.lis");
    std::fs::write(&path, "1 2 0 0\n3 4 0 1\nfive 1 0 2\n").unwrap();
    let out = l2arc(&[
        "trace",
        path.to_str().unwrap(),
        "--format",
        "lis",
        "--sizes",
        "10",
    ]);
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "line 3");
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "bad.lis");
}

#[test]
fn unknown_format_and_policy_and_size_are_errors() {
    let trace = l2arc_testkit::reference_trace("OLTP.lis.zst");
    let trace = trace.to_str().unwrap();
    // clap reports usage errors on several lines; check exit code and wording.
    let out = l2arc(&["trace", trace, "--format", "blktrace", "--sizes", "10"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("blktrace"));
    let out = l2arc(&[
        "trace", trace, "--format", "lis", "--policy", "fifo", "--sizes", "10",
    ]);
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "fifo");
    let out = l2arc(&["trace", trace, "--format", "lis", "--sizes", "10,lots"]);
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "lots");
}

#[test]
fn trace_json_reproduces_the_arc_paper() {
    let trace = l2arc_testkit::reference_trace("OLTP.lis.zst");
    let out = l2arc(&[
        "trace",
        trace.to_str().unwrap(),
        "--format",
        "lis",
        "--policy",
        "arc,lru",
        "--sizes",
        "1000",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for (row, policy, expected_percent) in [(&rows[0], "arc", 38.93), (&rows[1], "lru", 32.83)] {
        assert_eq!(row["policy"], policy);
        assert_eq!(row["size"], 1000);
        assert_eq!(row["requests"], 914_145);
        let ratio = row["hit_ratio"].as_f64().unwrap();
        assert!(
            (ratio * 100.0 - expected_percent).abs() < 0.05,
            "{policy}: {ratio}"
        );
        let hits = row["hits"].as_u64().unwrap() as f64;
        assert!((hits / 914_145.0 - ratio).abs() < 1e-9);
    }
}

#[test]
fn trace_table_has_a_row_per_size() {
    let trace = l2arc_testkit::reference_trace("OLTP.lis.zst");
    let out = l2arc(&[
        "trace",
        trace.to_str().unwrap(),
        "--sizes",
        "1000,2000",
        "--policy",
        "arc",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("38.9"), "{table}");
    assert!(table.contains("46.0") || table.contains("46.1"), "{table}");
}

#[test]
fn bench_runs_the_l2arc_bench_binary() {
    // `l2arc bench` execs l2arc-bench from the same directory; its own
    // one-line errors (prefixed `l2arc-bench:`) come back unchanged.
    let bench = Path::new(env!("CARGO_BIN_EXE_l2arc")).with_file_name("l2arc-bench");
    assert!(
        bench.is_file(),
        "{} is missing: build the workspace (cargo test --workspace builds it)",
        bench.display()
    );
    let out = l2arc(&["bench", "--recordsize", "3000"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.starts_with("l2arc-bench: ") && stderr.contains("recordsize"),
        "{stderr}"
    );
    let help = l2arc(&["bench", "--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.status.success() && text.contains("--scenario"),
        "{text}"
    );
}
