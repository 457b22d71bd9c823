"""Achieved GFLOP/s of corpus runs against this machine's fp32 matmul peak, measured in the same
process at the same thread count; the default SmolLM2 pruning curve's estimate against its time; two
local Dask workers against one on the same batched job.

1. Peak: `latency.corpus_cost.matmul_peak` (best of a few 1024 x 1024 fp32 products).
2. SmolLM2 pruning curve on 24 short held-out sentences (GLib / GTK messages: not the Alice text
   the importance and the defaults are read from), and MiniLM importance on the same sentences: the
   model loaded and every batch shape warmed first, then each phase timed on its own. FLOPs are the
   cost model's per token times the run's plan (`corpus_plan`): one forward per distinct mask (the
   full output one more), a gradient pass as 3 forwards (an encoder's 8 probes 2 more each). Shared
   layers before a mask's first change are not subtracted: they count as the forward they replace.
3. The Heads page's default SmolLM2 pruning curve (its default corpus, item count and budget): the
   estimate before it starts (at the prior rate), the estimate after the first batch, the time taken.
4. The same batched SmolLM2 pruning curve on `local:1` and `local:2` (one torch thread a worker),
   each cluster started and its workers' models loaded and warmed before timing: texts/s and ratio
   (target >= 1.7), and whether the figures equal the in-process run's at one thread.
Usage: python bench/corpus_speed.py [--threads 2] [--sentences 24] [--skip-default] [--skip-dask]
The load average is printed beside each figure: on a shared machine they move with other programs.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from attnviz.analysis import corpus_engine, corpus_plan, corpus_runs, corpus_tasks  # noqa: E402
from attnviz.analysis.corpus import Corpus, default_corpus, open_corpus  # noqa: E402
from attnviz.latency import corpus_cost  # noqa: E402

SENTENCES = 24
FITS_SHARE, DEFAULT_BUDGET, CHOICES = 0.8, 300, (5, 10, 20, 50, 100, 200, 500, 1000, 2000)   # as the Corpus tool


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def held_out(n: int) -> Corpus:
    texts = [t for t in open_corpus("gtk-en").items if 4 <= len(t.split()) <= 16][:n]
    return Corpus(key="gtk-en-short", kind="text", items=texts)


def timed_phase(key: str, texts: list[str], phase: str, params: dict) -> tuple[float, float, float]:
    """(seconds, forward-tokens, mean tokens) of one phase over the texts, in batches as a run makes them."""
    model = corpus_engine.worker_model(key)
    tokens = corpus_tasks.item_tokens(model, texts)
    chunks = corpus_plan.batches(list(enumerate(texts)), tokens, corpus_plan.texts_per_task(params))
    run = dict(params, phase=phase)
    corpus_tasks.batch_task(key, run, chunks[0][0], chunks[0][1])          # first shapes, untimed
    start = time.perf_counter()
    for first, chunk in chunks:
        corpus_tasks.batch_task(key, run, first, chunk)
    seconds = time.perf_counter() - start
    kind, steps = ("importance", 0) if phase == "importance" else ("mask", len(params["changed"]))
    plan = corpus_plan.plan(kind, model.kind, tokens, len(texts), masks=steps, cells=0, probes=8)
    return seconds, plan.phases[phase if phase == "importance" else "scored"], float(np.mean(tokens))


def gflops_line(name, cfg, seconds, units, mean, peak):
    rate = sum(units) * corpus_cost.flops_per_token(cfg, mean) / seconds / 1e9
    print(f"{name}: {rate:.1f} GFLOP/s = {rate / peak:.2f} of the peak ({seconds:.1f} s, {load()})", flush=True)


def speed(peak: float, texts: list[str]):
    smol = corpus_engine.worker_model("smollm2")
    curve = corpus_runs.run("smollm2", Corpus(key="warm", kind="text", items=texts[:4]), "pruning_curve")
    codes = sorted({s["code"] for s in curve.extra["steps"]})
    L, H = smol.cfg.n_layers, smol.cfg.n_heads
    changed = [c for c in codes if corpus_runs.kept_heads(c, L, H) < L * H]
    for phase, params in (("importance", dict(seed=0)), ("scored", dict(codes=codes, changed=changed))):
        s, units, mean = timed_phase("smollm2", texts, phase, params)
        gflops_line(f"SmolLM2 pruning curve, {phase} ({len(changed)} distinct masks)" if phase == "scored"
                    else "SmolLM2 pruning curve, importance", smol.cfg, s, units, mean, peak)
    mini = corpus_engine.worker_model("minilm")
    s, units, mean = timed_phase("minilm", texts, "importance", dict(seed=0))
    gflops_line("MiniLM importance", mini.cfg, s, units, mean, peak)


def default_curve():
    model = corpus_engine.worker_model("smollm2")
    chosen = open_corpus(default_corpus("lm"))
    tokens = corpus_tasks.item_tokens(model, chosen.items)
    sizes = [n for n in CHOICES if n < len(chosen)] + [len(chosen)]

    def first(n):
        return Corpus(key=chosen.key, kind="text", items=chosen.items[:n])
    prior = corpus_cost.prior_rate()
    i = corpus_cost.fitting(model.cfg, sizes, lambda n: corpus_runs.plan_for(model, first(n), "pruning_curve",
                                                                           tokens=tokens[:n]),
                            lambda n: float(np.mean(tokens[:n])), DEFAULT_BUDGET, prior, FITS_SHARE)
    n = sizes[i]
    plan = corpus_runs.plan_for(model, first(n), "pruning_curve", tokens=tokens[:n])
    before = corpus_cost.price(model.cfg, plan, float(np.mean(tokens[:n])), prior)["seconds"]
    seen = []
    start = time.perf_counter()
    result = corpus_runs.run("smollm2", first(n), "pruning_curve", budget=DEFAULT_BUDGET,
                             progress=lambda d, t, p: seen.append(dict(p.extra["estimate"])))
    took = time.perf_counter() - start
    after_first = seen[0]["seconds_total"] if seen else float("nan")
    print(f"default SmolLM2 pruning curve ({chosen.key}, {n} texts, budget {DEFAULT_BUDGET} s): "
          f"{'complete' if result.complete else 'INCOMPLETE'} in {took:.0f} s; estimate before {before:.0f} s "
          f"({took / before:.2f}x), after the first batch {after_first:.0f} s ({took / after_first:.2f}x); {load()}",
          flush=True)


def warm_engine(scheduler, texts):
    """An open engine whose every worker has loaded SmolLM2 and run a small batched job, and the time that took."""
    start = time.perf_counter()
    ctx = corpus_engine.session(scheduler)
    engine = ctx.__enter__()
    if engine.client is not None:
        engine.client.run(lambda: corpus_engine.worker_model("smollm2") and None)
    loaded = time.perf_counter() - start
    corpus_runs.run("smollm2", Corpus(key="warm", kind="text", items=texts[:4]), "pruning_curve", engine=engine)
    return ctx, engine, loaded, time.perf_counter() - start - loaded


def dask(texts):
    job = Corpus(key="gtk-en-short", kind="text", items=texts)
    torch.set_num_threads(1)                        # in-process at a worker's thread count: the same sums
    reference = corpus_runs.run("smollm2", job, "pruning_curve")
    rates = {}
    for scheduler in ("local:1", "local:2"):
        ctx, engine, loaded, warm = warm_engine(scheduler, texts)
        try:
            start = time.perf_counter()
            got = corpus_runs.run("smollm2", job, "pruning_curve", engine=engine)
            rates[scheduler] = len(texts) / (time.perf_counter() - start)
        finally:
            ctx.__exit__(None, None, None)
        same = got.table.equals(reference.table) and got.summary.equals(reference.summary)
        print(f"{scheduler}: {rates[scheduler]:.2f} texts/s (cluster start + model load {loaded:.1f} s, "
              f"first shapes {warm:.1f} s, not timed); figures {'equal' if same else 'DIFFERENT from'} "
              f"the in-process run's; {load()}", flush=True)
        if not same:
            diff = (got.table.select_dtypes("number") - reference.table.select_dtypes("number")).abs().max().max()
            print(f"  largest difference {diff:.3g}")
    print(f"2 workers / 1 worker: {rates['local:2'] / rates['local:1']:.2f} (target >= 1.7)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--sentences", type=int, default=SENTENCES, help="fewer for a quick check of the script")
    p.add_argument("--skip-default", action="store_true")
    p.add_argument("--skip-dask", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    texts = held_out(args.sentences).items
    peak = corpus_cost.matmul_peak()
    print(f"{os.cpu_count()} cores, {torch.get_num_threads()} torch threads, fp32 matmul peak {peak:.1f} GFLOP/s; "
          f"{len(texts)} held-out sentences; {load()}", flush=True)
    speed(peak, texts)
    if not args.skip_default:
        default_curve()
    if not args.skip_dask:
        dask(texts)
    print(f"done; {load()}")


if __name__ == "__main__":
    main()
