"""Images page latency: one 224-px DINOv2 trace plus all 72 per-head CLS->patch overlays; and a
head-editor Apply on the Images page until the new picture is painted, in a real browser.

Target: <= 1.5 s warm. Target: Apply -> painted <= 1 s plus the masked run. Prints the median over several warm runs and its parts (trace,
maps, overlays). Timings on shared cores are noisy, so each run alternates with transformers'
Dinov2Model (eager, output_attentions) on the same weights and pixels, and the ratio
ours / transformers is printed too: a busy machine slows both alike. It runs at torch's default
thread count and at 1 thread: on cores other processes keep busy, two threads that spin-wait on
each other were seen 5-8x slower than one (both ours and transformers').

The browser part (skip it with --skip-browser): Debian's Chromium (Playwright) against `streamlit
run`, the Images page with the cat at 224 px, the default view (CLS -> patches, one layer). Per
toggle: click a head in the editor's grid (that reruns the grid alone), then Apply; timed by the
page from the Apply click until the head count and the photo caption show the new mask and a new
overlay image has loaded (two animation frames later). Next to it, the masked run alone (the
library's trace with that mask, what the page must compute) and the difference: what the page
adds to the run.

    python bench/image_latency.py [--runs 7] [--toggles 6] [--skip-browser]
"""
from __future__ import annotations

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
from attnviz.analysis import vision  # noqa: E402
from attnviz.figures import image_figures  # noqa: E402
from attnviz.uploads.images import load_sample  # noqa: E402

TARGET_S = 1.5
APPLY_TARGET_S = 1.0   # on top of the masked run


def one_run(model, photo, size: int) -> dict[str, float]:
    t0 = time.perf_counter()
    trace = model.trace(photo, image_size=size)
    t1 = time.perf_counter()
    maps = vision.cls_maps(trace)                                     # (12, 6, 16, 16)
    t2 = time.perf_counter()
    grid = image_figures.head_overlays(photo, maps, trace.layers)            # 72 labelled tiles
    t3 = time.perf_counter()
    assert grid.size[0] > 0
    return {"trace": t1 - t0, "maps": t2 - t1, "overlays": t3 - t2, "total": t3 - t0}


def reference_model():
    """transformers' Dinov2Model with the bundled weights (the ONNX initializers)."""
    from transformers import Dinov2Config, Dinov2Model

    from attnviz.weights.catalogue import bundled_path
    from attnviz.weights.onnx import read_onnx_dinov2
    cfg, backbone, _ = read_onnx_dinov2(bundled_path("dinov2"))
    reference = Dinov2Model(Dinov2Config(**cfg, attn_implementation="eager")).eval()
    reference.load_state_dict(backbone, strict=False)    # mask_token is not in the ONNX graph
    return reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--threads", default="0,1",
                        help="comma-separated torch thread counts to run (0 = torch's default)")
    parser.add_argument("--toggles", type=int, default=6, help="browser: head toggles + Apply timed")
    parser.add_argument("--skip-browser", action="store_true")
    parser.add_argument("--only-browser", action="store_true")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    model = attnviz.load_model("dinov2")
    if not args.only_browser:
        photo = image_figures.display_image(load_sample("cat"))                 # what the page overlays on
        reference = reference_model()
        default_threads = torch.get_num_threads()
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads or default_threads)
            measure(args, model, photo, reference)
        torch.set_num_threads(default_threads)
    if not args.skip_browser:
        browser_apply(args, model)
    print(f"load average now {os.getloadavg()[0]:.1f}")


# Polled every animation frame after the Apply click: the new head count and the photo caption's
# "k heads off" are on screen, nothing is stale, and the overlay is a new image that has loaded.
PAINTED = """([count, total, off]) => {
  const text = [...document.querySelectorAll('[data-testid="stCaptionContainer"]')].map(e => e.textContent);
  const imgs = [...document.querySelectorAll('[data-testid="stImage"] img')];
  return text.some(t => t.includes(count + ' of ' + total + ' heads on'))
      && text.some(t => t.includes(off + ' heads off'))
      && imgs.length > 0 && imgs.every(i => i.complete && i.naturalWidth > 0)
      && imgs.some(i => !window.__oldImages.has(i.src))      // the overlay (the colour bar stays)
      && !document.querySelector('[data-stale="true"]');
}"""
SINCE_APPLY = """() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(
    () => r(performance.now() - window.__applyClicked))))"""
ON_APPLY = """() => document.addEventListener('click', e => {
  if (e.target.closest('button') && e.target.closest('button').innerText.trim() === 'Apply') {
    window.__applyClicked = performance.now();
    window.__oldImages = new Set([...document.querySelectorAll('[data-testid="stImage"] img')].map(i => i.src));
  }
}, {capture: true})"""
IDLE = """() => !document.querySelector('[data-testid="stStatusWidget"]')
    && !document.querySelector('[data-stale="true"]')"""


def summary(times) -> str:
    return (f"median {statistics.median(times) * 1e3:6.0f} ms (min {min(times) * 1e3:.0f}, "
            f"max {max(times) * 1e3:.0f}, n={len(times)})")


def browser_apply(args, model) -> None:
    """Apply -> painted on the Images page, and the masked run it waits for."""
    from playwright.sync_api import sync_playwright

    from tests.browser import ARGS, ARTIFACTS, CHROMIUM, streamlit_server, wait_idle
    L, H = model.cfg.n_layers, model.cfg.n_heads
    order = torch.randperm(L * H, generator=torch.Generator().manual_seed(0))[:args.toggles + 1]
    heads = [divmod(int(k), H) for k in order]
    ARTIFACTS.mkdir(exist_ok=True)
    painted, masks = [], []
    with streamlit_server(timeout=180) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1920, "height": 1080})
        page.set_default_timeout(300_000)
        page.goto(f"{url}/Images")
        page.locator('[data-testid="stImage"] img').first.wait_for()
        wait_idle(page)
        page.evaluate(ON_APPLY)
        keep = torch.ones(L, H)
        for k, (i, h) in enumerate(heads):     # the first toggle is not counted: one-off set-up
            keep[i, h] = 0
            on = int(keep.sum())
            row = page.get_by_role("toolbar", name=f"heads on in layer {i}", exact=True)
            row.get_by_role("button", name=f"h{h}", exact=True).click()
            page.get_by_text(f"The grid above has {on} heads on").wait_for()
            page.wait_for_function(IDLE, polling="raf")
            page.get_by_role("button", name="Apply", exact=True).click()
            page.wait_for_function(PAINTED, arg=[on, L * H, L * H - on], polling="raf")
            ms = page.evaluate(SINCE_APPLY)
            if k:
                painted.append(ms / 1e3)
                masks.append(keep.clone())
        page.screenshot(path=str(ARTIFACTS / "image_apply_latency.png"))
        browser.close()
    photo = load_sample("cat")
    model.trace(photo, head_mask=masks[0], image_size=224, states=True)   # warm-up
    runs = []
    for mask in masks:                   # what the page computes after each Apply
        t0 = time.perf_counter()
        model.trace(photo, head_mask=mask, image_size=224, states=True)
        runs.append(time.perf_counter() - t0)
    extra = [p - r for p, r in zip(painted, runs)]
    median = statistics.median(extra)
    print(f"Images page, DINOv2 224 px, {len(painted)} toggles, threads {torch.get_num_threads()}:")
    print(f"  browser, Apply click -> new overlay painted (page clock): {summary(painted)}")
    print(f"  the masked run alone (trace with that mask):            {summary(runs)}")
    print(f"  painted minus the masked run:                           {summary(extra)} -> "
          f"{'met' if median <= APPLY_TARGET_S else 'NOT met'} (target <= {APPLY_TARGET_S:g} s plus the run)")


def measure(args, model, photo, reference) -> None:
    pixels = model.pixels(photo, args.size)[None]                      # (1, 3, size, size)

    def reference_run() -> float:
        t = time.perf_counter()
        with torch.inference_mode():
            reference(pixel_values=pixels, output_attentions=True)
        return time.perf_counter() - t

    def backbone_run() -> float:                                      # like for like
        t = time.perf_counter()
        model.trace(pixels[0], saliency=False)
        return time.perf_counter() - t

    one_run(model, photo, args.size)                                  # warm-up
    reference_run()
    runs, ours, theirs = [], [], []
    for _ in range(args.runs):                                        # alternate: same load
        runs.append(one_run(model, photo, args.size))
        ours.append(backbone_run())
        theirs.append(reference_run())

    median = {part: statistics.median(r[part] for r in runs) for part in runs[0]}
    n_heads = model.cfg.n_layers * model.cfg.n_heads
    print(f"DINOv2 ViT-S/14, {args.size} px ({vision.token_count(args.size, 14)} tokens), "
          f"{torch.get_num_threads()} threads, median of {args.runs} warm runs:")
    print(f"  trace with attention + saliency  {median['trace'] * 1e3:7.0f} ms")
    print(f"  CLS->patch maps [L, H, gh, gw]    {median['maps'] * 1e3:7.1f} ms")
    print(f"  {n_heads} head overlays (one image)    {median['overlays'] * 1e3:7.0f} ms")
    print(f"  total                             {median['total'] * 1e3:7.0f} ms "
          f"(target {TARGET_S * 1e3:.0f} ms: {'met' if median['total'] <= TARGET_S else 'MISSED'})")
    ratio = statistics.median(o / t for o, t in zip(ours, theirs))
    print(f"  backbone only, attention weights kept: ours {statistics.median(ours) * 1e3:.0f} ms, "
          f"transformers eager {statistics.median(theirs) * 1e3:.0f} ms, ratio {ratio:.2f}")


if __name__ == "__main__":
    main()
