"""Checks a benchmark report in headless Chromium: the shared chart code
draws every chart of a page opened from disk.

Driven by tests/report_browser.rs; run by hand as:
report_page.py REPORT.html SCREENSHOT.png

Uses the system's Chromium (Debian `chromium`) through Playwright; no
browser is downloaded. Prints one JSON object (per canvas: its kind, how
many pixels it painted, what the chart code says it drew) and exits
nonzero with one line saying what failed: a console or page error, a
request (a report must fetch nothing), a canvas left blank.
"""

import json
import pathlib
import shutil
import sys

from playwright.sync_api import sync_playwright

# Painted pixels a drawn chart has at least: axes labels and a legend alone
# paint more than this, so a canvas under it was not drawn.
MIN_PAINTED = 2000

CANVASES = """() => Array.from(document.querySelectorAll("canvas[data-chart]")).map(c => {
  const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
  let painted = 0;
  for (let i = 3; i < d.length; i += 4) if (d[i] !== 0) painted++;
  return { kind: c.dataset.chart, width: c.width, height: c.height, painted,
           points: c.dataset.points, bars: c.dataset.bars, columns: c.dataset.columns,
           events: c.dataset.events };
})"""


def chromium_path():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("report_page.py: chromium is not installed: run scripts/setup.sh")


def main():
    report, screenshot = pathlib.Path(sys.argv[1]).resolve(), sys.argv[2]
    errors, requests = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium_path(), headless=True, args=["--no-sandbox"]
        )
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.on(
            "console",
            lambda m: errors.append("console " + m.type + ": " + m.text)
            if m.type in ("error", "warning")
            else None,
        )
        page.on("pageerror", lambda e: errors.append("page error: " + str(e)))
        page.on(
            "request",
            lambda r: requests.append(r.url) if r.url != report.as_uri() else None,
        )
        page.goto(report.as_uri())
        page.wait_for_load_state("load")
        canvases = page.evaluate(CANVASES)
        page.screenshot(path=screenshot, full_page=True)
        browser.close()
    print(json.dumps({"canvases": canvases, "errors": errors, "requests": requests}))
    if errors:
        sys.exit("report_page.py: " + "; ".join(errors))
    if requests:
        sys.exit("report_page.py: the report fetched " + ", ".join(requests))
    if not canvases:
        sys.exit("report_page.py: the report has no chart")
    blank = [c["kind"] for c in canvases if c["painted"] < MIN_PAINTED]
    if blank:
        sys.exit(f"report_page.py: charts left blank: {blank}")


if __name__ == "__main__":
    main()
