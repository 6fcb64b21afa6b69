//! A benchmark report in a real browser: the charts of a report are drawn
//! by the live page's chart code, in the reader's browser, so only a
//! browser can tell that they are drawn at all. Headless Chromium (Debian
//! `chromium`) driven by Playwright for Python (`tests/browser/report_page.py`)
//! opens a report with one chart of each kind from disk: no console error,
//! nothing fetched, every canvas painted, and each chart drew what its data
//! holds.
//!
//! Every tool is required: chromium and the Python environment that
//! `scripts/setup.sh` makes in `.tools/venv` (Playwright, using the system
//! Chromium). A missing one fails the test with a pointer to the script,
//! never a skip. `L2ARC_SCREENSHOT=PATH` keeps the screenshot.

use std::path::Path;

#[test]
fn every_chart_of_a_report_is_drawn_in_headless_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("charts.html");
    std::fs::write(&report, l2arc_bench::sample_report_html()).unwrap();
    let (stdout, screenshot) = l2arc_testkit::browse(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/report_page.py"),
        &report.display().to_string(),
        &dir.path().join("report.png"),
    );
    let result: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let canvases = result["canvases"].as_array().unwrap();
    let kinds: Vec<&str> = canvases
        .iter()
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["bars", "line", "heat"], "{result}");
    // The sample's data: 8 bars of 9 (one value missing), 40 x values of
    // which the IOPS line misses one, 40 heat columns.
    assert_eq!(canvases[0]["bars"], "8", "{result}");
    assert_eq!(canvases[1]["points"], "40", "{result}");
    assert_eq!(canvases[2]["columns"], "40", "{result}");
    assert!(canvases[2]["events"].as_str().unwrap() != "0", "{result}");
    let size = std::fs::metadata(&screenshot).unwrap().len();
    assert!(size > 10_000, "screenshot of {size} bytes");
}
