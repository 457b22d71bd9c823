"""First open and one typical Apply / Run click of each of the eight pages on ONE fresh server, in a
real browser (Debian's Chromium driven by Playwright against `streamlit run app.py`, as the browser
tests do). Per page, in a new browser context:
  * first_s  - from `goto` until the title is painted and Streamlit's status widget is gone (the
               server is fresh: the first page pays for imports, each page for its model's load),
  * action_s - one typical click (Run, Apply, Translate, Next) until its rerun has finished,
with the load average (1 min) when the row was taken. Prints a table, writes bench/page_times.csv.
Asserts nothing: times on a shared machine are upper bounds; read them with the load beside them.

    python bench/page_times.py [--pages Attention Heads ...] [--csv PATH] [--root DIR]
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from playwright.sync_api import sync_playwright  # noqa: E402

from tests.browser import ARGS, CHROMIUM, streamlit_server, wait_idle  # noqa: E402

STATUS = '[data-testid="stStatusWidget"]'
TIMEOUT_MS = 600_000


def main_box(page):
    return page.locator('[data-testid="stMain"] textarea').first


def grid_click(name: str):
    """Setup: switch head h0 of the first layer off in the page's head editor (a pending edit)."""
    def setup(page):
        page.locator(f'[class*="st-key-{name}-head-grid"]').get_by_role("button", name="h0").first.click()
        wait_idle(page, TIMEOUT_MS)
    return setup


def apply_button(page):
    return page.get_by_role("button", name="Apply", exact=True).first


def latency_setup(page):
    page.locator('input[aria-label="Sequence lengths"]').fill("16,32,64")
    page.get_by_text("One block to the crossover").click()


def speech_setup(page):
    page.get_by_role("radiogroup").filter(has_text="Word timestamps").get_by_text(
        "Switch heads off", exact=True).click()
    wait_idle(page, TIMEOUT_MS)
    page.locator('[class*="st-key-speech-head-grid"]').get_by_text("layer 0", exact=True).click()
    wait_idle(page, TIMEOUT_MS)


def typed(text: str):
    def setup(page):
        main_box(page).fill(text)
    return setup


# page: (path, title, what the click is, setup before it (not timed), the control clicked)
PAGES = {
    "Attention": ("Attention", "Attention", "Run a new text", typed("The quick brown fox jumps over the lazy dog."),
                  lambda p: p.get_by_role("button", name="Run", exact=True).first),
    "Heads": ("Heads", "Heads", "Apply one head off", grid_click("heads"), apply_button),
    "Images": ("Images", "Images", "Apply one head off", grid_click("images"), apply_button),
    "Latency": ("Latency", "Latency", "Run a 3-length sweep", latency_setup,
                lambda p: p.get_by_role("button", name="Run", exact=True).first),
    "Lab": ("Lab", "Lab", "Next step", None, lambda p: p.get_by_role("button", name="Next ▶").first),
    "Translate": ("Translate", "Translate", "Translate a new sentence", typed("The dog sleeps on the sofa."),
                  lambda p: p.get_by_role("button", name="Translate", exact=True).first),
    "Speech": ("Speech", "Speech", "Apply layer 0 off (transcribe)", speech_setup, apply_button),
    "Readouts": ("Readouts", "Readouts", "Run a new prompt", typed("The capital of France is"),
                 lambda p: p.get_by_role("button", name="Run", exact=True).first),
}


def until_idle(page, start: float) -> tuple[float, bool]:
    """Seconds from `start` until the rerun a click started has finished: the status widget seen and
    gone again (polled every 50 ms), or never seen within 3 s (a rerun too fast to show it: then
    3 s is only an upper bound); and whether it was seen."""
    seen = False
    while True:
        present = page.locator(STATUS).count() > 0
        now = time.perf_counter()
        if present:
            seen = True
        elif seen or now - start > 3.0:
            return now - start, seen
        if now - start > TIMEOUT_MS / 1000:
            raise TimeoutError("the rerun did not finish")
        page.wait_for_timeout(50)


def one_page(browser, url: str, name: str) -> dict:
    path, title, what, setup, control = PAGES[name]
    page = browser.new_context(viewport={"width": 1400, "height": 1600}).new_page()
    page.set_default_timeout(TIMEOUT_MS)
    row = dict(page=name, first_s=float("nan"), action=what, action_s=float("nan"), note="")
    try:
        start = time.perf_counter()
        page.goto(f"{url}/{path}")
        page.wait_for_selector(f'h1:has-text("{title}")')
        row["first_s"] = until_idle(page, start)[0]
        if setup:
            setup(page)
        button = control(page)
        button.wait_for()
        start = time.perf_counter()
        button.click()
        row["action_s"], seen = until_idle(page, start)
        if not seen:
            row["note"] = "no running status seen: the click's rerun took at most this"
        if page.locator('[data-testid="stException"]').count():
            row["note"] = (row["note"] + "; " if row["note"] else "") + "exception on the page"
    except Exception as err:  # a bench reports what failed and goes on to the next page
        row["note"] = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
    row["load1"] = os.getloadavg()[0]
    page.context.close()
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", nargs="+", default=list(PAGES), choices=list(PAGES))
    ap.add_argument("--csv", type=Path, default=ROOT / "bench" / "page_times.csv")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout to serve (with this venv)")
    args = ap.parse_args()
    root = args.root.resolve()
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        with streamlit_server(180, root, ROOT / "test-artifacts" / "page-times-server.log",
                              PYTHONPATH=str(root)) as url:
            for name in args.pages:
                rows.append(one_page(browser, url, name))
                r = rows[-1]
                print(f"{r['page']:10s} first {r['first_s']:6.1f} s   {r['action']:32s} {r['action_s']:6.1f} s   "
                      f"load {r['load1']:4.1f}  {r['note']}", flush=True)
        browser.close()
    fields = ["page", "first_s", "action", "action_s", "load1", "note"]
    with open(args.csv, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=fields)
        out.writeheader()
        for r in rows:
            out.writerow({k: round(r[k], 2) if isinstance(r[k], float) else r[k] for k in fields})
    print("\n| page | first render (s) | click | click (s) | load (1 min) |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['page']} | {r['first_s']:.1f} | {r['action']} | {r['action_s']:.1f} | {r['load1']:.1f} |"
              + (f" {r['note']}" if r["note"] else ""))
    print(f"\n{os.cpu_count()} cores; root {root}; written to {args.csv}")


if __name__ == "__main__":
    main()
