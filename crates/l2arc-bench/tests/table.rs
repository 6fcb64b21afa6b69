//! The benchmarks table in docs/benchmarks.md is the one the committed
//! reports (docs/benchmarks/reports/<scenario>.json) make: regenerated
//! here and compared, so that no figure in it is typed by hand or left
//! behind when a report changes (`cargo run --release -p l2arc-bench --
//! table` rewrites it).

use std::path::Path;

#[test]
fn benchmarks_table_matches_the_committed_reports() {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
    let reports = l2arc_bench::table::read_reports(&docs.join("benchmarks/reports"))
        .expect("the committed reports");
    assert!(!reports.is_empty(), "no reports in docs/benchmarks/reports");
    let table = l2arc_bench::table::render(&reports).expect("a table from the reports");
    let markdown = std::fs::read_to_string(docs.join("benchmarks.md")).unwrap();
    let written = l2arc_bench::table::extract(&markdown).expect("a generated table");
    assert!(
        written == table,
        "docs/benchmarks.md's table is not the one the reports make; \
         run `cargo run --release -p l2arc-bench -- table`.\n\
         --- in docs/benchmarks.md\n{written}\n--- from the reports\n{table}"
    );
}

/// Every run in a report is stamped: its commit, date, load average and
/// arguments, and its scenario is the report's.
#[test]
fn every_committed_run_is_stamped() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/benchmarks/reports");
    for report in l2arc_bench::table::read_reports(&dir).unwrap() {
        assert!(!report.runs.is_empty(), "{}: no runs", report.scenario);
        for run in &report.runs {
            let stamp = &run["stamp"];
            assert_eq!(stamp["scenario"], report.scenario.as_str(), "{stamp}");
            let commit = stamp["commit"].as_str().unwrap();
            assert!(
                commit.len() == 40 && commit.chars().all(|c| c.is_ascii_hexdigit()),
                "{stamp}"
            );
            assert_eq!(stamp["dirty"], false, "a run of uncommitted code: {stamp}");
            for key in ["date", "load_before", "load_after"] {
                assert!(!stamp[key].as_str().unwrap().is_empty(), "{stamp}");
            }
            assert!(stamp["args"].is_array(), "{stamp}");
        }
    }
}
