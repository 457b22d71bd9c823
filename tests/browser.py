"""A real Streamlit server and Debian's Chromium driven by Playwright (Debian's package: Playwright never downloads a browser)."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run", "--disable-sync", "--disable-quic"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def streamlit_server(timeout: float = 90.0, root: Path = ROOT, log_path: Path | None = None, **env_extra):
    """`streamlit run app.py` in `root` (another checkout runs with this venv when PYTHONPATH=root
    is passed), logging to `log_path` (default test-artifacts/server-PORT.log); yields its URL."""
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1", **env_extra)
    log = open(log_path or ARTIFACTS / f"server-{port}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
                             "--server.port", str(port), "--server.address", "127.0.0.1",
                             "--browser.gatherUsageStats", "false"], cwd=root, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # poll the health endpoint, not a fixed sleep
            if proc.poll() is not None:
                raise RuntimeError(f"streamlit exited early; see {log.name}")
            with contextlib.suppress(OSError):
                import urllib.request
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).status == 200:
                    break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"streamlit did not answer within {timeout:.0f} s; see {log.name}")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
        log.close()


# Counts the page's script runs: Streamlit marks its app root with the script's state
# (`data-test-script-state`, "running" while the script runs), the attribute its own end-to-end
# tests wait on. The running-man widget shows only for runs long enough to notice, so waiting to
# see it cost 1.5 s after every fast rerun.
_RUN_COUNTER = """() => {
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app) return null;
  if (window.__attnvizApp === app) return window.__attnvizRuns;
  window.__attnvizApp = app;
  window.__attnvizRuns = 0;
  let last = app.getAttribute('data-test-script-state');
  new MutationObserver(() => {
    const now = app.getAttribute('data-test-script-state');
    if (now !== last && now === 'running') window.__attnvizRuns += 1;
    last = now;
  }).observe(app, {attributes: true, attributeFilter: ['data-test-script-state']});
  return null;
}"""
IDLE = '[data-testid="stApp"][data-test-script-state="notRunning"]'
RERUN_GRACE_MS = 1500      # how long an action may take to start its rerun


def wait_idle(page, timeout_ms: int = 120_000):
    """Wait until Streamlit has finished the rerun the last action started (or, when none starts
    within RERUN_GRACE_MS, until it is idle)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    runs = page.evaluate(_RUN_COUNTER)
    state = page.locator('[data-testid="stApp"]').get_attribute("data-test-script-state")
    if runs is None or state != "notRunning":   # counting starts now, or a run is on: wait as before
        with contextlib.suppress(PlaywrightTimeout):
            page.wait_for_selector('[data-testid="stStatusWidget"]', state="attached",
                                   timeout=RERUN_GRACE_MS if state == "notRunning" else 1)
        page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached", timeout=timeout_ms)
        page.wait_for_selector(IDLE, timeout=timeout_ms)
        return
    try:
        page.wait_for_function(f"window.__attnvizRuns > {runs}", timeout=RERUN_GRACE_MS)
    except PlaywrightTimeout:
        return      # no rerun came: it is idle already
    page.wait_for_selector(IDLE, timeout=timeout_ms)


def browser_fixtures(viewport: dict, timeout_ms: int, server_env=None):
    """A module's `server`, `browser` and `page` fixtures: one Streamlit server and one Chromium for
    the module, a fresh browser context of `viewport` for each test. Bind them in the module:
    `server, browser, page = browser_fixtures(...)`. `server_env(tmp_path_factory) -> dict`: the
    server's environment (models laid out for it first)."""
    import pytest
    from playwright.sync_api import sync_playwright

    @pytest.fixture(scope="module")
    def server(tmp_path_factory):
        ARTIFACTS.mkdir(exist_ok=True)
        with streamlit_server(**(server_env(tmp_path_factory) if server_env else {})) as url:
            yield url

    @pytest.fixture(scope="module")
    def browser():
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            yield b
            b.close()

    @pytest.fixture
    def page(browser):
        context = browser.new_context(viewport=viewport)
        pg = context.new_page()
        pg.set_default_timeout(timeout_ms)
        yield pg
        context.close()

    return server, browser, page


def open_page(page, server, path=""):
    """Open a page and wait for its first run to end (the app root reads "initial" until then)."""
    page.goto(f"{server}/{path}")
    page.wait_for_selector('[data-testid="stSidebar"]')
    page.evaluate(_RUN_COUNTER)
    page.wait_for_selector(IDLE, timeout=120_000)


def assert_no_errors(page):
    assert page.locator('[data-testid="stException"]').count() == 0
    assert page.locator('[data-testid="stAlertContentError"]').count() == 0

# ---------------------------------------------------------------- many sessions at once
WORDS = ["dog", "cow", "horse", "parrot", "tiger", "whale", "spider", "camel", "otter", "eagle", "lion",
         "mouse", "snake", "rabbit", "sheep", "monkey", "frog", "duck", "bear", "wolf", "fox", "goat",
         "shark", "turtle"]


def session_mask(k: int, layers: int = 6, heads: int = 12):
    """Session k switches off heads 0..k (row-major): every session has a different mask."""
    import torch
    keep = torch.ones(layers * heads, dtype=torch.bool)
    keep[: k + 1] = False
    return keep.view(layers, heads)


def session_word(k: int, round_: int) -> str:
    """A word no default text on the page contains, so its arrival marks this rerun."""
    return WORDS[(k * 3 + round_) % len(WORDS)]  # distinct for 8 sessions x 3 rounds


def session_text(k: int, round_: int) -> str:
    return f"Session {k}: the {session_word(k, round_)} sleeps on the mat."


async def _one_session(browser, url: str, k: int, rounds: int, shots: Path | None):
    import re

    from attnviz.analysis.pruning import encode_mask
    context = await browser.new_context(viewport={"width": 1300, "height": 1800})
    page = await context.new_page()
    page.set_default_timeout(240_000)
    mask = session_mask(k)
    await page.goto(f"{url}/Heads?model=minilm&heads={encode_mask(mask)}")
    # typing before the first run has finished would be overwritten by that run's widget state
    await page.locator('[data-testid="stMetricValue"]').first.wait_for()
    await page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached")
    seen, times = [], []
    for r in range(rounds):
        text = session_text(k, r)
        box = page.locator('textarea[aria-label="Text"]')
        await box.fill(text)
        start = time.perf_counter()
        await box.press("Control+Enter")
        # the rerun is done when the server has drawn this text's own word as a heatmap label
        await page.wait_for_function(
            "w => [...document.querySelectorAll('.js-plotly-plot text')].some(e => e.textContent === w)",
            arg=session_word(k, r), polling=100)
        await page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached")
        times.append(time.perf_counter() - start)
        caption = await page.get_by_text(re.compile(r"\d+ of \d+ heads on")).first.inner_text()
        cosine = await page.locator('[data-testid="stMetricValue"]').first.inner_text()
        box_value = await box.input_value()
        seen.append(dict(session=k, round=r, text=text, box=box_value, caption=caption,
                         cosine=float(cosine), url=page.url))
    if shots is not None:
        await page.screenshot(path=str(shots / f"session-{k}.png"))
    await context.close()
    return seen, times


def run_sessions(url: str, n: int = 8, rounds: int = 3, shots: Path | None = None):
    """Drive n browser sessions at once on the heads page, each with its own text and mask.
    Returns (observations, rerun seconds)."""
    import asyncio

    from playwright.async_api import async_playwright

    async def main():
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                results = await asyncio.gather(*[_one_session(browser, url, k, rounds, shots)
                                                 for k in range(n)])
            finally:
                await browser.close()
        return [o for seen, _ in results for o in seen], [t for _, ts in results for t in ts]

    return asyncio.run(main())


def expected_cosine(model, text: str, keep) -> float:
    """What the heads page must show for this text and mask, computed here from the library."""
    from attnviz.analysis import effects
    sentences = ["A kitten is resting on a rug.", "The dog sleeps on the sofa.", "A man is playing a guitar.",
                 "Stock markets fell sharply today.", "The cat is lying on a carpet."]
    ids = model.encode_text(text)[0][:256].tolist()
    last = model.cfg.n_layers - 1
    full = effects.outputs(model, ids, None, last, sentences)
    masked = effects.outputs(model, ids, keep.float(), last, sentences)
    return effects.output_change(full, masked, sentences)["cosine"]
