"""Checks the shared tier's band on the live page of a running l2arc service.

Driven by tests/shared_cache.rs (a serve-nbd whose reads were all served by
the shared tier, with --history); run by hand as:
shared_band.py URL SCREENSHOT.png

Loads the page in the system's Chromium (through Playwright; no browser is
downloaded), checks the live view (the shared tier's heat map, its series
in the hits chart, its table), then the "1 h" window drawn from the
history, where the reads are: the heat map "shared tier hits" must hold
events and the L2ARC's none (the reads came from the cache bucket, not
flash). Prints its findings as one JSON object; exits nonzero with one
line on a console or page error, or on a check that failed.
"""

import json
import shutil
import sys
import time

from playwright.sync_api import sync_playwright

WITHIN_SECS = 10.0


def chromium_path():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("shared_band.py: chromium is not installed: run scripts/setup.sh")


def attr(page, element_id, name):
    if page.query_selector("#" + element_id) is None:
        return -1
    return int(page.get_attribute("#" + element_id, "data-" + name) or "0")


def wait_until(page, ok):
    deadline = time.monotonic() + WITHIN_SECS
    while time.monotonic() < deadline and not ok():
        page.wait_for_timeout(100)


def main():
    url, screenshot = sys.argv[1], sys.argv[2]
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
        page.on("requestfailed", lambda r: errors.append("request failed: " + r.url))
        page.goto(url)
        page.wait_for_selector("#heat-shared_hit")
        # Live: two polls draw a column in every heat map.
        wait_until(page, lambda: attr(page, "heat-shared_hit", "columns") > 0)
        live_columns = attr(page, "heat-shared_hit", "columns")
        hits_series = json.loads(page.get_attribute("#hits", "data-series") or "[]")
        shared_table = page.inner_text("#sharedtable")
        tiles = page.inner_text("#tiles")
        # The 1 h window, from the history: the reads are there.
        page.click('#windows button[data-window="3600"]')
        wait_until(
            page,
            lambda: page.inner_text("#status").startswith("history, last 1 h")
            and attr(page, "heat-shared_hit", "events") > 0,
        )
        shared_events = attr(page, "heat-shared_hit", "events")
        l2_events = attr(page, "heat-l2_hit", "events")
        history_status = page.inner_text("#status")
        history_tiles = page.inner_text("#tiles")
        page.screenshot(path=screenshot, full_page=True)
        browser.close()
    result = {
        "live_columns": live_columns,
        "hits_series": hits_series,
        "shared_table": shared_table,
        "tiles": tiles,
        "shared_events": shared_events,
        "l2_events": l2_events,
        "history_status": history_status,
        "history_tiles": history_tiles,
        "errors": errors,
    }
    print(json.dumps(result))
    if errors:
        sys.exit("shared_band.py: " + "; ".join(errors))
    if live_columns <= 0:
        failures.append("the live shared-tier heat map drew no column")
    if "shared hits" not in hits_series or "shared misses" not in hits_series:
        failures.append(f"the hits chart has series {hits_series}")
    if "since start" not in shared_table or "no shared tier" in shared_table:
        failures.append("the shared tier's table says " + shared_table)
    if "shared hit%" not in tiles or "shared hit%, 1 h avg" not in history_tiles:
        failures.append(f"no shared hit% tile: {tiles!r}, {history_tiles!r}")
    if shared_events <= 0:
        failures.append(f"the 1 h window's shared-tier heat map is empty ({history_status})")
    if l2_events != 0:
        failures.append(f"the L2ARC's heat map has {l2_events} events: the shared tier's hits leaked there")
    if failures:
        sys.exit("shared_band.py: " + "; ".join(failures))


if __name__ == "__main__":
    main()
