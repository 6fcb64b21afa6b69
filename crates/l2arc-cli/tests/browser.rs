//! The live page in a real browser: headless Chromium (Debian `chromium`)
//! driven by Playwright for Python (`tests/browser/live_page.py`), against
//! a `serve-nbd` with two cache devices and fio reading through it. The
//! page must load with no console error, every chart must gain points
//! within 5 s (the breakdown, eligibility and errors charts among them),
//! the heat maps of the front end, the ARC, the L2ARC, the disk and of
//! each cache device must fill, the shared tier's must be drawn and stay
//! empty (this export has no shared tier; its band filling is
//! tests/shared_cache.rs's), the breakdowns by dataset and by file must
//! name the dataset and the image being read, live and over the "1 h"
//! window, the status line and tiles must follow the window shown, and the
//! drill-down must list the image being read.
//!
//! Every tool is required: chromium, fio and the Python environment that
//! `scripts/setup.sh` makes in `.tools/venv` (Playwright, using the system
//! Chromium: no browser is downloaded). A missing one fails the test with
//! a pointer to the script, never a skip. `L2ARC_SCREENSHOT=PATH` keeps the
//! screenshot, and the one of the 1 h window beside it with `-1h`
//! (docs/img/analytics.png and analytics-1h.png were taken so).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use l2arc_testkit::service::Service;

/// Larger than the ARC and the L2ARC together, so that every tier serves reads.
const IMAGE_BYTES: usize = 192 << 20;

fn on_path(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| panic!("`{name}` is not installed: run scripts/setup.sh"))
}

struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn live_page_charts_fill_in_headless_chromium_under_fio() {
    let fio = on_path("fio");

    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let bytes: Vec<u8> = (0..IMAGE_BYTES / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect();
    std::fs::write(&image, bytes).unwrap();
    let socket = dir.path().join("nbd.sock");
    let mut served = Service::serve_nbd(Path::new(env!("CARGO_BIN_EXE_l2arc")), &image)
        .listen_unix(&socket)
        .args(["--arc-max", "16MiB", "--http", "127.0.0.1:0"])
        .arg("--cache")
        .arg(dir.path().join("l2a.img"))
        .arg("--cache")
        .arg(dir.path().join("l2b.img"))
        .args(["--cache-size", "32MiB"])
        .arg("--history")
        .arg(dir.path().join("history.bin"))
        .start();
    let url = served
        .line_before_ready("l2arc: http on ")
        .expect("no `l2arc: http on` line")
        .trim_start_matches("l2arc: http on ")
        .to_string();

    // Random 4 KiB reads, 80% of them to the first quarter of the image:
    // ARC hits, L2ARC hits and disk reads all at once.
    let _fio = Killed(
        Command::new(fio)
            .current_dir(dir.path())
            .args([
                "--name=live",
                "--ioengine=nbd",
                "--rw=randread",
                "--bs=4k",
                "--iodepth=4",
                "--random_distribution=zoned:80/25:20/75",
                "--time_based",
                "--runtime=60",
            ])
            .arg(format!("--size={IMAGE_BYTES}"))
            .arg(format!("--uri=nbd+unix:///?socket={}", socket.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_secs(1));

    let (stdout, screenshot) = l2arc_testkit::browse(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/live_page.py"),
        &url,
        &dir.path().join("live.png"),
    );
    let result: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(result["errors"].as_array().unwrap().is_empty(), "{result}");
    assert!(
        result["datasets"].as_str().unwrap().contains("nbd"),
        "{result}"
    );
    // The drill-down lists the object being read: the exported image.
    assert!(
        result["objects"].as_str().unwrap().contains("(the image)"),
        "{result}"
    );
    // Both cache devices have their heat map, filled.
    assert_eq!(
        result["device_slots"],
        serde_json::json!([0, 1]),
        "{result}"
    );
    for slot in 0..2 {
        let events = &result["heat_events"][format!("heat-dev-{slot}")];
        assert!(events.as_u64().unwrap() > 0, "{result}");
    }
    // No shared tier: its band is there, drawn, and empty, live and 1 h.
    for which in ["empty_heat", "history_empty_heat"] {
        let band = &result[which]["heat-shared_hit"];
        assert_eq!(band[0], true, "{result}");
        assert!(band[1].as_u64().unwrap() > 0, "{result}");
        assert_eq!(band[2], 0, "{result}");
    }
    let size = std::fs::metadata(&screenshot).unwrap().len();
    assert!(size > 10_000, "screenshot of {size} bytes");
    assert!(served.child.try_wait().unwrap().is_none(), "serve-nbd died");
}
