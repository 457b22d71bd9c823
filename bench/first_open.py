"""First open of every page on a fresh server, in a real browser (Debian's Chromium driven by
Playwright against `streamlit run`): for each page a new server process (nothing imported, no
model loaded; converted weights already cached, as after `make run` once), then
  * title   - seconds until the page's title is painted,
  * first   - seconds until the first view is painted and Streamlit's status widget is gone,
and a screenshot a moment after the title (what a newcomer sees while the page loads) and one when
it is done, under test-artifacts/first-open/. Prints a table and the machine's load; asserts nothing.

    python bench/first_open.py [--pages Home Attention ...] [--root DIR] [--shots DIR]

`--root` runs another checkout (e.g. an older commit in a `git worktree`) with this venv.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from playwright.sync_api import sync_playwright  # noqa: E402

from tests.browser import ARGS, CHROMIUM, streamlit_server  # noqa: E402

PAGES = {"Home": ("", "attnviz"), "Attention": ("Attention", "Attention"), "Heads": ("Heads", "Heads"),
         "Images": ("Images", "Images"), "Latency": ("Latency", "Latency"), "Lab": ("Lab", "Lab"),
         "Translate": ("Translate", "Translate"), "Speech": ("Speech", "Speech"),
         "Readouts": ("Readouts", "Readouts")}


def first_open(browser, url: str, path: str, title: str, shots: Path, name: str) -> tuple[float, float]:
    page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    page.set_default_timeout(600_000)
    start = time.perf_counter()
    page.goto(f"{url}/{path}")
    page.wait_for_selector(f'h1:has-text("{title}")')
    t_title = time.perf_counter() - start
    page.wait_for_timeout(1500)                       # what the newcomer sees while it loads
    page.screenshot(path=str(shots / f"{name}-loading.png"))
    with contextlib.suppress(Exception):              # a very fast page never shows the widget
        page.wait_for_selector('[data-testid="stStatusWidget"]', state="attached", timeout=1000)
    page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached")
    t_first = time.perf_counter() - start
    page.screenshot(path=str(shots / f"{name}-done.png"))
    page.context.close()
    return t_title, t_first


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", nargs="+", default=list(PAGES), choices=list(PAGES))
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--shots", type=Path, default=ROOT / "test-artifacts" / "first-open")
    args = ap.parse_args()
    args.shots.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for name in args.pages:
            path, title = PAGES[name]
            root = args.root.resolve()
            with streamlit_server(180, root, args.shots / f"{name}.log", PYTHONPATH=str(root)) as url:
                rows.append((name, *first_open(browser, url, path, title, args.shots, name)))
            print(f"{rows[-1][0]:10s} title {rows[-1][1]:6.1f} s   first view {rows[-1][2]:6.1f} s", flush=True)
        browser.close()
    after = os.getloadavg()
    print(f"load average (1 min) before {load[0]:.1f}, after {after[0]:.1f} on {os.cpu_count()} cores; "
          f"root {args.root}")


if __name__ == "__main__":
    main()
