"""Head toggle -> painted result on the Heads page: SmolLM2, a 64-token text. Target: <= 1 s in a
real browser.

Prints three figures, each the median (and min-max) of several toggles:
1. library: the masked run the page recomputes (starting at the first layer whose mask differs
   from the cached full run or the previous masked run) plus the comparison; next to it the same
   run from layer 0, as before that reuse.
2. AppTest: the page script's rerun after one head is switched and Apply pressed (no browser).
3. browser: Debian's Chromium (Playwright) against `streamlit run`: click a head (that reruns the
   grid alone), then Apply, with the results in view, until the new result is painted (the head
   count and the KL metric changed, every chart of the chosen view computed again, no stale
   element left, two animation frames), timed by the page from the Apply click: what the user
   waits on. This is the target figure; the whole step timed by this script (head click, grid
   rerun, Apply, paint, Playwright's own overhead) is printed next to it.

    python bench/toggle_latency.py [--toggles 8] [--skip-browser] [--view "next token" ...]

The page redraws one chart after each Apply (the user picks which: next token, per-token loss,
attention change) or all three; each choice is timed in turn.

Timings on a shared machine vary run to run; the load average is printed with them.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import attnviz  # noqa: E402
from attnviz.analysis import effects  # noqa: E402

TARGET_S = 1.0
LIVE_CHARTS = ("next token", "per-token loss", "attention change", "all three")  # the page's chart choices
CHARTS = {view: 3 if view == "all three" else 1 for view in LIVE_CHARTS}         # plotly charts each draws
MODEL = "smollm2"
N_TOKENS = 64
TEXT = ("The quick brown fox jumps over the lazy dog while the cat sits on the mat and watches "
        "the old man who lives next door paint his fence a bright shade of blue, humming a tune that "
        "the birds in the garden, wondering whether the rain will come before the evening ends and "
        "everyone goes home after a long day of work in the fields beyond the river.")


def toggles(L, H, n, seed=0):
    """n distinct heads, spread over the layers (a user's clicks land anywhere)."""
    order = torch.randperm(L * H, generator=torch.Generator().manual_seed(seed))[:n]
    return [divmod(int(k), H) for k in order]


def summary(times):
    return f"median {statistics.median(times) * 1e3:7.1f} ms (min {min(times) * 1e3:.0f}, max {max(times) * 1e3:.0f}, n={len(times)})"


def library_path(model, ids, heads):
    L, H = model.cfg.n_layers, model.cfg.n_heads
    layer = L - 1
    full = effects.outputs(model, ids, None, layer)
    ones = torch.ones(L, H)
    for _ in range(2):  # warm-up: first calls of a shape pay one-off kernel set-up
        effects.outputs(model, ids, ones, layer)
    results = {}
    for reuse in (True, False):
        mask, previous, times = torch.ones(L, H), None, []
        for i, h in heads:
            mask[i, h] = 0
            t0 = time.perf_counter()
            masked = effects.outputs(model, ids, mask.clone(), layer,
                                     base=[full, previous] if reuse else None)
            effects.output_change(full, masked)
            times.append(time.perf_counter() - t0)
            previous = masked
        results[reuse] = times
    return results


def page_text(model):
    ids = model.encode_text(TEXT)[0][:N_TOKENS]
    text = model.tokenizer.decode(ids, skip_special_tokens=True)
    return text, len(model.encode_text(text)[0])


def apptest_rerun(text, heads, view, L, H):
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(str(ROOT / "pages" / "2_Heads.py"), default_timeout=300)
    at.query_params["model"] = MODEL
    at.run()
    at.text_area(key="heads.text:lm").input(text).run()  # fills the full-model cache
    at.button_group(key="heads.chart").set_value(view).run()
    times = []
    for i, h in heads:
        at.button_group(key=f"heads.row:{MODEL}:{L}x{H}:{i}").unselect(h)
        at.button(key="heads.apply").click()
        t0 = time.perf_counter()
        at.run()
        times.append(time.perf_counter() - t0)
        if at.exception:
            raise RuntimeError(at.exception[0].value)
    return times


def head_box(page, i, h):
    """Head h's button in layer i's row of the mask."""
    row = page.get_by_role("toolbar", name=f"heads on in layer {i}", exact=True)
    return row.get_by_role("button", name=f"h{h}", exact=True)


# Polled in the page every animation frame after the Apply click: the new head count and a new
# KL value are on screen, no element is stale any more, and each of the `charts` plotly charts
# has been computed again since the click (its calcdata is a new object). Then two more frames,
# so that the last paint has happened, and the page's own clock gives the time since the click.
PAINTED = """([count, total, old, charts]) => {
  const caption = [...document.querySelectorAll('[data-testid="stCaptionContainer"]')]
      .some(e => e.textContent.includes(count + ' of ' + total + ' heads on'));
  const kl = document.querySelectorAll('[data-testid="stMetricValue"]')[1];
  const plots = [...document.querySelectorAll('.js-plotly-plot')];
  const redrawn = plots.length === charts && plots.every(g => g.calcdata && !window.__oldCalc.has(g.calcdata));
  return caption && kl && kl.textContent !== old && redrawn && !document.querySelector('[data-stale="true"]');
}"""
SINCE_APPLY = """() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(
    () => r(performance.now() - window.__applyClicked))))"""
# Apply just below the page's header and the results under it in view, as a user watching them has
# it (Playwright would otherwise scroll Apply to the bottom edge to click it, results out of view).
SHOW_RESULTS = """e => { e.scrollIntoView({block: 'start'});
  document.querySelector('[data-testid="stMain"]').scrollBy(0, -120); }"""
VIEWPORT = {"width": 1920, "height": 1080}  # a common desktop screen
IDLE = """() => !document.querySelector('[data-testid="stStatusWidget"]')
    && !document.querySelector('[data-stale="true"]')"""
ON_APPLY = """() => document.addEventListener('click', e => {
  if (e.target.closest('button') && e.target.closest('button').innerText.trim() === 'Apply') {
    window.__applyClicked = performance.now();
    window.__oldCalc = new WeakSet([...document.querySelectorAll('.js-plotly-plot')]
        .map(g => g.calcdata).filter(Boolean));
  }
}, {capture: true})"""


def browser_toggles(text, heads, L, H, view):
    """(click on Apply -> painted, as the page measures it; the whole step with the harness's two
    clicks, as this script measures it), seconds per toggle."""
    from playwright.sync_api import sync_playwright

    from tests.browser import ARGS, ARTIFACTS, CHROMIUM, streamlit_server, wait_idle
    ARTIFACTS.mkdir(exist_ok=True)
    with streamlit_server(timeout=180) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.set_default_timeout(300_000)
        page.goto(f"{url}/Heads?model={MODEL}")
        page.locator('[data-testid="stMetricValue"]').first.wait_for()
        wait_idle(page)
        box = page.locator('textarea[aria-label="Text"]')
        box.fill(text)
        box.press("Control+Enter")
        wait_idle(page)
        page.locator('[data-testid="stMetricValue"]').nth(1).wait_for()
        if view != LIVE_CHARTS[0]:
            chooser = page.get_by_role("radiogroup", name="chart", exact=True)
            chooser.get_by_role("radio", name=view, exact=True).click()
            wait_idle(page)
        page.evaluate(ON_APPLY)
        metrics = page.locator('[data-testid="stMetricValue"]')
        in_page, whole, on = [], [], L * H
        for k, (i, h) in enumerate(heads):  # the first toggle is not counted: one-off set-up
            old = metrics.nth(1).inner_text()
            on -= 1
            t0 = time.perf_counter()
            head_box(page, i, h).click()
            # the click reruns the grid alone; the user reads it, then presses Apply
            page.get_by_text(f"The grid above has {on} heads on").wait_for()
            page.wait_for_function(IDLE, polling="raf")
            apply = page.get_by_role("button", name="Apply", exact=True)
            apply.evaluate(SHOW_RESULTS)
            apply.click()
            page.wait_for_function(PAINTED, arg=[on, L * H, old, CHARTS[view]], polling="raf")
            ms = page.evaluate(SINCE_APPLY)
            if k:
                in_page.append(ms / 1e3)
                whole.append(time.perf_counter() - t0)
        page.screenshot(path=str(ARTIFACTS / "toggle_latency.png"))
        browser.close()
    return in_page, whole


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--toggles", type=int, default=8)
    ap.add_argument("--skip-browser", action="store_true")
    ap.add_argument("--view", action="append", choices=LIVE_CHARTS,
                    help="the page's chart choice to time (repeatable; default: each in turn)")
    args = ap.parse_args()
    model = attnviz.load_model(MODEL)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    text, n = page_text(model)
    heads = toggles(L, H, args.toggles + 1)
    print(f"{MODEL}, {n} tokens, {args.toggles} toggles; torch threads {torch.get_num_threads()}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    lib = library_path(model, model.encode_text(text)[0].tolist(), heads[1:])
    print(f"library, masked run + comparison, from the first changed layer: {summary(lib[True])}")
    print(f"library, masked run + comparison, from layer 0 (no reuse):     {summary(lib[False])}")
    for view in args.view or LIVE_CHARTS:
        print(f"-- chart: {view}")
        rerun = apptest_rerun(text, heads[1:], view, L, H)
        print(f"AppTest rerun after a toggle + Apply (whole script, no paint):  {summary(rerun)}")
        if not args.skip_browser:
            painted, whole = browser_toggles(text, heads, L, H, view)
            median = statistics.median(painted)
            print(f"browser, Apply click -> new result painted (page clock):      {summary(painted)} "
                  f"-> {median / TARGET_S:.2f} x the {TARGET_S:g} s target "
                  f"({'met' if median <= TARGET_S else 'NOT met'})")
            print(f"browser, head click -> grid -> Apply -> paint (harness clock): {summary(whole)}")
    print(f"load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
