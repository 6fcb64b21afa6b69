"""Checks the live page of a running l2arc service in headless Chromium.

Driven by tests/browser.rs (which starts serve-nbd with fio reading through
it); run by hand as: live_page.py URL SCREENSHOT.png [HOLD_SECS]
(HOLD_SECS, default 6: how long the page runs after the checks before the
screenshot is taken).

Uses the system's Chromium (Debian `chromium`) through Playwright; no
browser is downloaded. Exits nonzero with one line saying what failed:
a console error or page error, a chart that gained no points within 5 s,
a heat map that stayed empty (the four tiers' and one per cache device
the service lists), a shared-tier heat map that is missing, not drawn or
not empty (this service has no shared tier: its band must stay empty, its
table say so), a breakdown by dataset or by file whose series do
not name the dataset and the image being read; then, the service keeping
a history (--history), the "1 h" window drawn from /api/history with
points in every chart, events in every heat map and the same breakdowns,
and a status line and tiles that follow the window shown (live, 1 h,
24 h, live again). A second screenshot, of the 1 h window, goes beside
the first with "-1h" before its extension.
"""

import json
import shutil
import sys
import time

from playwright.sync_api import sync_playwright

GAIN_WITHIN_SECS = 5.0
LINE_CHARTS = [
    "iops", "bandwidth", "misses", "l2hits", "primary", "below", "hits", "arcsize",
    "l2size", "feed", "eligibility", "errors", "devices", "shared",
]
TIER_HEAT_MAPS = ["heat-frontend", "heat-arc_hit", "heat-l2_hit", "heat-primary"]
# Drawn, and empty: the service under test has no shared tier.
EMPTY_HEAT_MAPS = ["heat-shared_hit"]
BREAKDOWN_CHARTS = ["iops", "misses", "l2hits", "primary", "below"]


def chromium_path():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("live_page.py: chromium is not installed: run scripts/setup.sh")


def attr(page, element_id, name):
    if page.query_selector("#" + element_id) is None:
        return 0
    return int(page.get_attribute("#" + element_id, "data-" + name) or "0")


def empty_band(page, element_id):
    """(present, columns drawn, events) of a heat map."""
    present = page.query_selector("#" + element_id) is not None
    return [present, attr(page, element_id, "columns"), attr(page, element_id, "events")]


def series(page, element_id):
    return json.loads(page.get_attribute("#" + element_id, "data-series") or "[]")


def wait_until(page, ok):
    deadline = time.monotonic() + GAIN_WITHIN_SECS
    while time.monotonic() < deadline and not ok():
        page.wait_for_timeout(100)


def breakdowns(page):
    """Each breakdown chart's series, by dataset then by file, as names."""
    got = {}
    for by in ("dataset", "file"):
        for c in BREAKDOWN_CHARTS:
            page.select_option(f'select.bd[data-for="{c}"]', by)
        # Redrawn at once; wait for a redraw with points anyway.
        wait_until(page, lambda: all(attr(page, c, "points") > 0 for c in BREAKDOWN_CHARTS))
        got[by] = {c: series(page, c) for c in BREAKDOWN_CHARTS}
    return got


def check_breakdowns(got, where, failures):
    for c in BREAKDOWN_CHARTS:
        if "nbd" not in got["dataset"][c]:
            failures.append(f"{where}: {c} by dataset has series {got['dataset'][c]}, not nbd")
    # The image is read and misses: it leads reads, misses and bytes below.
    for c in ["iops", "misses", "below"]:
        if "(the image)" not in got["file"][c] or "other" not in got["file"][c]:
            failures.append(f"{where}: {c} by file has series {got['file'][c]}")


def main():
    url, screenshot = sys.argv[1], sys.argv[2]
    hold_secs = float(sys.argv[3]) if len(sys.argv) > 3 else 6.0
    errors, failures = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium_path(), headless=True, args=["--no-sandbox"]
        )
        page = browser.new_page(viewport={"width": 1500, "height": 1400})
        page.on(
            "console",
            lambda m: errors.append("console " + m.type + ": " + m.text)
            if m.type in ("error", "warning")
            else None,
        )
        page.on("pageerror", lambda e: errors.append("page error: " + str(e)))
        page.on(
            "requestfailed",
            lambda r: errors.append("request failed: " + r.url),
        )
        page.goto(url)
        page.wait_for_selector("#iops")
        slots = page.evaluate(
            "fetch('/api/stats').then(r => r.json()).then(j => j.devices.map(d => d.slot))"
        )
        heat_maps = TIER_HEAT_MAPS + [f"heat-dev-{s}" for s in slots]
        start = {c: attr(page, c, "points") for c in LINE_CHARTS}
        wait_until(
            page,
            lambda: all(attr(page, c, "points") > start[c] for c in LINE_CHARTS)
            and all(attr(page, h, "events") > 0 for h in heat_maps),
        )
        gained = {c: attr(page, c, "points") - start[c] for c in LINE_CHARTS}
        heat = {h: attr(page, h, "events") for h in heat_maps}
        empty_bands = {h: empty_band(page, h) for h in EMPTY_HEAT_MAPS}
        shared_table = page.inner_text("#sharedtable")
        # A few more seconds so that the screenshot shows a curve.
        page.wait_for_timeout(hold_secs * 1000)
        status = page.inner_text("#status")
        datasets = page.inner_text("#datasets")
        page.click('#objwindows button[data-objwindow="60"]')
        objects = page.inner_text("#objects")
        live_breakdowns = breakdowns(page)
        check_breakdowns(live_breakdowns, "live", failures)
        # The screenshot shows reads by file and L2ARC hits by dataset.
        page.select_option('select.bd[data-for="l2hits"]', "dataset")
        page.select_option('select.bd[data-for="primary"]', "total")
        page.select_option('select.bd[data-for="misses"]', "total")
        page.select_option('select.bd[data-for="below"]', "total")
        page.wait_for_timeout(1500)
        page.screenshot(path=screenshot, full_page=True)
        for c in BREAKDOWN_CHARTS:
            page.select_option(f'select.bd[data-for="{c}"]', "total")
        # The last hour, from the history file.
        page.click('#windows button[data-window="3600"]')
        wait_until(
            page,
            lambda: all(attr(page, c, "points") > 0 for c in LINE_CHARTS)
            and all(attr(page, h, "events") > 0 for h in heat_maps)
            and page.inner_text("#status").startswith("history, last 1 h")
            and "sample" in page.inner_text("#status"),
        )
        history_points = {c: attr(page, c, "points") for c in LINE_CHARTS}
        history_heat = {h: attr(page, h, "events") for h in heat_maps}
        history_empty_bands = {h: empty_band(page, h) for h in EMPTY_HEAT_MAPS}
        history_status = page.inner_text("#status")
        history_tiles = page.inner_text("#tiles")
        history_breakdowns = breakdowns(page)
        check_breakdowns(history_breakdowns, "1 h", failures)
        page.select_option('select.bd[data-for="primary"]', "total")
        page.select_option('select.bd[data-for="misses"]', "total")
        page.wait_for_timeout(500)
        page.screenshot(path=screenshot.replace(".png", "-1h.png"), full_page=True)
        # The status line follows the window: 24 h, then live again.
        page.click('#windows button[data-window="86400"]')
        wait_until(
            page,
            lambda: page.inner_text("#status").startswith("history, last 24 h")
            and "sample" in page.inner_text("#status"),
        )
        day_status = page.inner_text("#status")
        page.click('#windows button[data-window="0"]')
        wait_until(page, lambda: page.inner_text("#status").startswith("live"))
        back_status = page.inner_text("#status")
        back_tiles = page.inner_text("#tiles")
        browser.close()
    result = {
        "gained": gained,
        "heat_events": heat,
        "empty_heat": empty_bands,
        "history_empty_heat": history_empty_bands,
        "shared_table": shared_table,
        "status": status,
        "datasets": datasets,
        "objects": objects,
        "live_breakdowns": live_breakdowns,
        "history_points": history_points,
        "history_heat_events": history_heat,
        "history_status": history_status,
        "history_tiles": history_tiles,
        "history_breakdowns": history_breakdowns,
        "day_status": day_status,
        "back_status": back_status,
        "device_slots": slots,
        "errors": errors,
    }
    print(json.dumps(result))
    if errors:
        sys.exit("live_page.py: " + "; ".join(errors))
    stale = [c for c, n in gained.items() if n <= 0]
    if stale:
        sys.exit(f"live_page.py: charts gained no points within {GAIN_WITHIN_SECS} s: {stale}")
    empty = [h for h, n in heat.items() if n <= 0]
    if empty:
        sys.exit(f"live_page.py: heat maps stayed empty within {GAIN_WITHIN_SECS} s: {empty}")
    for where, bands in (("live", empty_bands), ("1 h", history_empty_bands)):
        for h, (present, columns, events) in bands.items():
            if not present or columns <= 0 or events != 0:
                sys.exit(
                    f"live_page.py: {where}: {h} should be drawn and empty (no shared tier):"
                    f" present {present}, {columns} columns, {events} events"
                )
    if "no shared tier" not in shared_table:
        sys.exit("live_page.py: the shared tier's table says " + shared_table)
    if not status.startswith("live"):
        sys.exit("live_page.py: status line says " + status)
    if not history_status.startswith("history, last 1 h") or "sample" not in history_status:
        sys.exit("live_page.py: after choosing 1 h the status line says " + history_status)
    if "1 h avg" not in history_tiles:
        sys.exit("live_page.py: the tiles of the 1 h window are not its own: " + history_tiles)
    if not day_status.startswith("history, last 24 h") or "sample" not in day_status:
        sys.exit("live_page.py: after choosing 24 h the status line says " + day_status)
    if not back_status.startswith("live") or "avg" in back_tiles:
        sys.exit(f"live_page.py: back to live, the status says {back_status!r}, tiles {back_tiles!r}")
    flat = [c for c, n in history_points.items() if n <= 0]
    if flat:
        sys.exit(f"live_page.py: the 1 h window drew no points in {flat}")
    cold = [h for h, n in history_heat.items() if n <= 0]
    if cold:
        sys.exit(f"live_page.py: the 1 h window drew empty heat maps: {cold}")
    if failures:
        sys.exit("live_page.py: " + "; ".join(failures))


if __name__ == "__main__":
    main()
