"""Redraw docs/img/report-rank-map.png: the rank map of `shardlab report` on the main job's plan, one rank clicked.

    python benchmarks/report_screenshot.py [--rank 13]

Needs Debian's chromium and Playwright for Python (the `test` extra). Rerun it whenever the main job's plan changes
(a test compares the page's numbers with `shardlab plan`; this image is what docs/report.md and the README show).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img" / "report-rank-map.png"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, default=13)
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as d:
        page_path = Path(d) / "plan.html"
        subprocess.run([sys.executable, "-m", "shardlab", "report", str(page_path)], check=True, capture_output=True)
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=a.chromium, args=ARGS)
            page = b.new_page(viewport={"width": 1344, "height": 900})
            page.goto(page_path.as_uri())
            section = page.locator("section#rank-map")
            section.scroll_into_view_if_needed()
            page.locator(f'[data-rank="{a.rank}"]').click()
            page.mouse.move(1, 1)                     # off the map: the panel keeps the clicked rank
            section.screenshot(path=str(OUT))
            b.close()
    print(f"redrew {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
