"""Checks the live page of a running l2arc service in headless Chromium.

Driven by tests/browser.rs (which starts serve-nbd with fio reading through
it); run by hand as: live_page.py URL SCREENSHOT.png [HOLD_SECS]
(HOLD_SECS, default 6: how long the page runs after the checks before the
screenshot is taken).

Uses the system's Chromium (Debian `chromium`) through Playwright; no
browser is downloaded. Exits nonzero with one line saying what failed:
a console error or page error, a chart that gained no points within 5 s,
a heat map that stayed empty; then, the service keeping a history
(--history), the "1 h" window drawn from /api/history with points in every
chart and events in every heat map, and the drill-down over 1 min listing
the image.
"""

import json
import shutil
import sys
import time

from playwright.sync_api import sync_playwright

GAIN_WITHIN_SECS = 5.0
LINE_CHARTS = ["iops", "bandwidth", "hits", "arcsize", "l2size", "feed", "devices"]
HEAT_MAPS = ["heat-frontend", "heat-arc_hit", "heat-l2_hit", "heat-primary"]


def chromium_path():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("live_page.py: chromium is not installed: run scripts/setup.sh")


def attr(page, element_id, name):
    return int(page.get_attribute("#" + element_id, "data-" + name) or "0")


def main():
    url, screenshot = sys.argv[1], sys.argv[2]
    hold_secs = float(sys.argv[3]) if len(sys.argv) > 3 else 6.0
    errors = []
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
        start = {c: attr(page, c, "points") for c in LINE_CHARTS}
        deadline = time.monotonic() + GAIN_WITHIN_SECS
        while time.monotonic() < deadline:
            if all(attr(page, c, "points") > start[c] for c in LINE_CHARTS) and all(
                attr(page, h, "events") > 0 for h in HEAT_MAPS
            ):
                break
            page.wait_for_timeout(100)
        gained = {c: attr(page, c, "points") - start[c] for c in LINE_CHARTS}
        heat = {h: attr(page, h, "events") for h in HEAT_MAPS}
        # A few more seconds so that the screenshot shows a curve.
        page.wait_for_timeout(hold_secs * 1000)
        status = page.inner_text("#status")
        datasets = page.inner_text("#datasets")
        page.click('#objwindows button[data-objwindow="60"]')
        objects = page.inner_text("#objects")
        page.screenshot(path=screenshot, full_page=True)
        # The last hour, from the history file.
        page.click('#windows button[data-window="3600"]')
        deadline = time.monotonic() + GAIN_WITHIN_SECS
        while time.monotonic() < deadline:
            if all(attr(page, c, "points") > 0 for c in LINE_CHARTS) and all(
                attr(page, h, "events") > 0 for h in HEAT_MAPS
            ) and page.inner_text("#status").startswith("history"):
                break
            page.wait_for_timeout(100)
        history_points = {c: attr(page, c, "points") for c in LINE_CHARTS}
        history_heat = {h: attr(page, h, "events") for h in HEAT_MAPS}
        history_status = page.inner_text("#status")
        browser.close()
    result = {
        "gained": gained,
        "heat_events": heat,
        "status": status,
        "datasets": datasets,
        "objects": objects,
        "history_points": history_points,
        "history_heat_events": history_heat,
        "history_status": history_status,
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
    if not status.startswith("live"):
        sys.exit("live_page.py: status line says " + status)
    if not history_status.startswith("history"):
        sys.exit("live_page.py: after choosing 1 h the status line says " + history_status)
    flat = [c for c, n in history_points.items() if n <= 0]
    if flat:
        sys.exit(f"live_page.py: the 1 h window drew no points in {flat}")
    cold = [h for h, n in history_heat.items() if n <= 0]
    if cold:
        sys.exit(f"live_page.py: the 1 h window drew empty heat maps: {cold}")


if __name__ == "__main__":
    main()
