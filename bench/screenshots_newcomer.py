"""Screenshots of the newcomer's headline answers, one Apply and the int8 table, in a real browser.

    PYTHONPATH=$PWD .venv/bin/python bench/screenshots_newcomer.py after [ROOT]

ROOT (default: this checkout) is the checkout the server runs, so an exported older commit gives the
"before" pictures with the same script. Writes bench/screenshots/46-<n>-<label>.png; each shot is
taken on its own, so one that fails (printed) leaves the others.
"""
from __future__ import annotations

import re
import sys
import traceback
from pathlib import Path

from playwright.sync_api import sync_playwright

from tests.browser import ARGS, CHROMIUM, ROOT, open_page, streamlit_server, wait_idle

OUT = ROOT / "bench" / "screenshots"


def shot(page, locator, name: str):
    locator.first.scroll_into_view_if_needed()
    locator.first.screenshot(path=str(OUT / name))
    print("wrote", OUT / name, flush=True)


def below(page, locator, name: str, height: int = 900):
    """A region of the page from the top of `locator` down: the sections have no box of their own."""
    locator.first.scroll_into_view_if_needed()
    box = locator.first.bounding_box()
    page.screenshot(path=str(OUT / name), clip=dict(x=0, y=box["y"] - 10, width=1400, height=height))
    print("wrote", OUT / name, flush=True)


def heads(page, server, label):
    open_page(page, server, "Heads?model=minilm")
    page.locator('[data-testid="stMetricValue"]').first.wait_for()
    wait_idle(page)
    page.get_by_role("button", name="h3", exact=True).first.click()   # a head click: waits for Apply
    wait_idle(page)
    shot(page, page.locator('[data-testid="stHorizontalBlock"]').filter(has_text="Presets"), f"46-2-{label}.png")
    page.get_by_text("Pruning curve", exact=True).click()
    wait_idle(page)
    page.get_by_role("button", name="Compute pruning curve").click()
    wait_idle(page, 600_000)
    page.locator(".js-plotly-plot").filter(has_text="heads removed").first.wait_for(timeout=600_000)
    below(page, page.get_by_role("button", name="Compute pruning curve"), f"46-1-heads-{label}.png", 1400)


def latency(page, server, label):
    open_page(page, server, "Latency")
    page.get_by_role("button", name=re.compile("4 vs 8 heads")).click()
    wait_idle(page, 300_000)
    below(page, page.get_by_role("button", name=re.compile("4 vs 8 heads")), f"46-1-latency-{label}.png", 400)
    page.get_by_role("button", name=re.compile("^Measure int8")).click()
    wait_idle(page, 900_000)
    below(page, page.get_by_role("button", name=re.compile("^Measure int8")), f"46-3-{label}.png", 700)


def main(label: str, root: Path = ROOT):
    OUT.mkdir(parents=True, exist_ok=True)
    with streamlit_server(root=root, log_path=OUT.parent / f"screenshots-{label}.log", PYTHONPATH=str(root)) as url, \
            sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for take in (heads, latency):
            context = browser.new_context(viewport={"width": 1400, "height": 2400})
            page = context.new_page()
            page.set_default_timeout(300_000)
            try:
                take(page, url, label)
            except Exception:   # one failed shot leaves the others
                traceback.print_exc()
                page.screenshot(path=str(OUT / f"46-failed-{take.__name__}-{label}.png"))
            context.close()
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT)
