"""A long prompt on every Readouts view (SmolLM2): peak resident memory above the idle process.

Target: every view answers an N-token prompt (default 8,192, SmolLM2's positions) with its message
and a peak under 2 GB above idle. Each view runs in a process of its own (`--view`), its resident
memory sampled every 5 ms while the call runs; the idle level is measured after the model is loaded
and has run once. Also `--pages`: the same through the Readouts page (AppTest), all four views.

    python bench/long_prompt_memory.py [--tokens 8192]
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import psutil  # noqa: E402

VIEWS = ("lens", "attribution", "generation", "pair", "pages")
TARGET_GB = 2.0


class Peak:
    """The most resident memory seen while the block runs (sampled every 5 ms)."""

    def __enter__(self):
        self.proc, self.peak, self.done = psutil.Process(), 0, threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self):
        while not self.done.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def long_text(model, tokens: int) -> str:
    text = "When Mary and John went to the store, " * (tokens // 9 + 50)
    return model.tokenizer.decode(model.tokenizer(text)["input_ids"][:tokens])


def one_view(view: str, tokens: int) -> dict:
    from attnviz.analysis import generation, prompt_pair, readouts
    from attnviz.weights import catalogue
    model = catalogue.load_model("smollm2")
    readouts.logit_lens(model, "A short warm-up.")
    text = long_text(model, tokens)
    calls = {"lens": lambda: readouts.logit_lens(model, text),
             "attribution": lambda: readouts.attribution(model, text, 5),
             "generation": lambda: generation.generate(model, text, 8),
             "pair": lambda: prompt_pair.compare_prompts(model, "A short prompt.", text)}
    if view == "pages":  # the page loads its own copy of the model: opened once before idle is measured
        from streamlit.testing.v1 import AppTest
        at = AppTest.from_file(os.path.join(ROOT, "pages", "8_Readouts.py"), default_timeout=600).run()

        def pages(at=at):
            at.text_area(key="readouts.text").input(text)
            at.button(key="readouts.run").click().run()
            said = [at.error[0].value if at.error else "no message"]
            for name in ("Attribution", "Generation", "Two prompts"):
                at = at.radio(key="readouts.view").set_value(name).run()
                if name == "Generation":
                    at = at.button(key="readouts.gen_go").click().run()
                if name == "Two prompts":
                    at.text_area(key="readouts.pair_b").input(text)
                    at = at.button(key="readouts.pair_go").click().run()
                said.append(at.error[0].value if at.error else "no message")
            raise ValueError(" | ".join(said))
        calls["pages"] = pages
    idle = psutil.Process().memory_info().rss
    start = time.perf_counter()
    with Peak() as peak:
        try:
            calls[view]()
            said = "ran to the end"
        except (ValueError, RuntimeError) as err:
            said = f"{type(err).__name__}: {err}"
    return dict(view=view, tokens=tokens, idle_gb=idle / 2**30, above_idle_gb=(peak.peak - idle) / 2**30,
                seconds=time.perf_counter() - start, said=said[:300])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--view", choices=VIEWS)
    args = ap.parse_args()
    if args.view:
        print(json.dumps(one_view(args.view, args.tokens)))
        return 0
    worst = 0.0
    for view in VIEWS:
        out = subprocess.run([sys.executable, __file__, "--view", view, "--tokens", str(args.tokens)],
                             capture_output=True, text=True, cwd=ROOT)
        row = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else dict(
            view=view, above_idle_gb=float("nan"), seconds=float("nan"), said=f"exit {out.returncode}")
        worst = max(worst, row["above_idle_gb"])
        print(f"{view:12s} +{row['above_idle_gb']:.2f} GB above idle, {row['seconds']:.1f} s: {row['said']}")
    print(f"worst: +{worst:.2f} GB above idle (target under {TARGET_GB:g} GB)")
    return 0 if worst < TARGET_GB else 1


if __name__ == "__main__":
    raise SystemExit(main())
