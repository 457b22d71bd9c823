"""New text -> chosen view painted on the Attention page, in a real browser (Debian's Chromium
driven by Playwright against `streamlit run`), next to the model's own trace time for the same
text, measured in this process between the page's rounds (so both see the same machine load).

For SmolLM2 at ~15 and ~370 tokens (the issue's two sizes): each round types a text the server
has not seen (its first word changes), presses Run, and stops the clock when the chosen view's
figure carries that word and Streamlit's status widget is gone. Target: page <= trace + 1 s.
Prints medians, the spread, the target verdict and the machine's load average; asserts nothing.

    python bench/page_latency.py [--rounds 5] [--view Detail] [--tokens 15 370] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

from attnviz.base import texts  # noqa: E402
from attnviz.weights.catalogue import load_model  # noqa: E402
from tests.browser import ARGS, ARTIFACTS, CHROMIUM, streamlit_server, wait_idle  # noqa: E402

MODEL = "smollm2"
# First words that mark a round: those that are one token of the model and absent from the
# evaluation text are used (see marker_words), so the word is a tick label of the new figure only.
CANDIDATES = ["Dog", "Cat", "Bird", "Fish", "Bee", "Ant", "Rain", "Snow", "Wind", "Moon", "Star",
              "Sun", "Tree", "Rock", "King", "Queen", "Red", "Blue", "Green", "Gold", "Iron", "Salt",
              "Milk", "Bread", "Ice", "Fire", "Sand", "Lake", "Hill", "Road", "Boat", "Ship"]


def marker_words(model) -> list[str]:
    body = texts.eval_text()
    return [w for w in CANDIDATES if w not in body
            and model.inputs(f"{w} is here")["tokens"][0] == w]


def text_of(model, word: str, n_tokens: int) -> tuple[str, int]:
    """`word` then the bundled evaluation text, cut so the whole is about n_tokens tokens; and its
    exact token count."""
    tail = model.tokenizer(texts.eval_text())["input_ids"]
    for k in range(max(1, n_tokens - 1), 0, -1):
        text = f"{word} " + model.tokenizer.decode(tail[:k], skip_special_tokens=True)
        n = len(model.encode_text(text)[0])
        if n <= n_tokens:
            return text, n
    return word, len(model.encode_text(word)[0])


def trace_seconds(model, text: str, repeats: int = 3) -> float:
    """The model's own trace of the text (every layer's attention), median of a few runs, with
    the server's number of torch threads (`--threads`)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.trace(text)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def pick_model(page, key: str):
    box = page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').first
    box.click()
    page.get_by_role("option", name=re.compile(rf"^{re.escape(key)}\b")).click()
    wait_idle(page)


def pick_view(page, view: str):
    page.get_by_role("radiogroup", name="View").get_by_text(view, exact=True).click()
    wait_idle(page)


def painted(page, word: str, timeout_ms: int = 600_000):
    """The chosen view's figure shows this text's first word, and the rerun is over."""
    page.wait_for_function(
        "w => [...document.querySelectorAll('.js-plotly-plot text')].some(e => e.textContent.trim() === w)",
        arg=word, polling=50, timeout=timeout_ms)
    page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached", timeout=timeout_ms)


def one_round(page, text: str, word: str) -> float:
    box = page.locator('textarea[aria-label="Text"]')
    box.fill(text)
    start = time.perf_counter()
    page.get_by_role("button", name="Run").click()
    painted(page, word)
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--view", default="Detail",
                    help='the view chosen before the texts are typed ("": leave the first one)')
    ap.add_argument("--tokens", type=int, nargs="+", default=[15, 370])
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of the server and of this process's trace (0: torch's default). "
                         "On a loaded 2-core machine two threads stall each other at every op "
                         "(SmolLM2, 15 tokens: 3.4 s a trace with 2 threads, 0.1 s with 1)")
    args = ap.parse_args()
    os.environ["ATTNVIZ_TORCH_THREADS"] = str(args.threads)     # the server reads it at start
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    ARTIFACTS.mkdir(exist_ok=True)
    model = load_model(MODEL)
    markers = marker_words(model)
    if args.rounds * len(args.tokens) + 1 > len(markers):
        sys.exit(f"at most {(len(markers) - 1) // len(args.tokens)} rounds")
    words = iter(markers)
    load_before = os.getloadavg()
    with streamlit_server() as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_context(viewport={"width": 1400, "height": 1600}).new_page()
        page.set_default_timeout(600_000)
        page.goto(f"{url}/Attention")
        page.wait_for_selector('[data-testid="stSidebar"]')
        wait_idle(page)
        pick_model(page, MODEL)
        if args.view:                                  # "": the page's first view (pages with tabs)
            pick_view(page, args.view)
        warm, _ = text_of(model, next(words), 15)      # the server loads the model, fills its caches
        one_round(page, warm, warm.split()[0])
        for n_tokens in args.tokens:
            pages, traces, counts = [], [], []
            for _ in range(args.rounds):
                word = next(words)
                text, n = text_of(model, word, n_tokens)
                counts.append(n)
                pages.append(one_round(page, text, word))
                traces.append(trace_seconds(model, text))
            page.screenshot(path=str(ARTIFACTS / f"page-latency-{n_tokens}.png"))
            pm, tm = statistics.median(pages), statistics.median(traces)
            print(f"{MODEL} {min(counts)}-{max(counts)} tokens, view {args.view}, torch threads "
                  f"{args.threads or 'default'}: new text -> painted "
                  f"median {pm:.2f} s (min {min(pages):.2f}, max {max(pages):.2f}); model trace median "
                  f"{tm:.2f} s; page - trace {pm - tm:+.2f} s, target <= +1 s -> "
                  f"{'OK' if pm <= tm + 1 else 'OVER'} (n = {len(pages)})", flush=True)
        browser.close()
    load_after = os.getloadavg()
    print(f"load average (1, 5, 15 min) before {load_before[0]:.1f} {load_before[1]:.1f} "
          f"{load_before[2]:.1f}, after {load_after[0]:.1f} {load_after[1]:.1f} {load_after[2]:.1f} "
          f"on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
