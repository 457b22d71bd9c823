"""Texts per second of SmolLM2 head importance over a corpus (the bundled Alice sentences, topped up to
200 with the bundled GLib/GTK English messages: no bundled English corpus alone holds 200), in-process
and on a local Dask cluster of 1 and of 2 worker processes (one torch thread each), with the ratio.

Each configuration is warmed before it is timed, and what warming took is reported apart: starting
the cluster and loading the model in every worker (or in this process), then a small run of the same
kind on texts of the corpus (the kernels' first shapes, the allocator). The timed run then measures
the steady rate the configuration gives, the same texts in the same batches for every configuration.
In-process runs at torch's default thread count, each worker at one thread (ATTNVIZ_WORKER_THREADS).
On a shared machine the numbers move with the other programs' load: the load average is printed
beside each figure.
Usage: python bench/corpus_scaling.py [--texts 200] [--model smollm2] [--corpora alice-sentences gtk-en]
       [--configs in-process local:1 local:2] [--warm 4]
"""
import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from attnviz.analysis import corpus_engine, corpus_runs  # noqa: E402
from attnviz.analysis.corpus import Corpus, CorpusLimits, open_corpus  # noqa: E402


def load_all(engine, model):
    """Every worker (or this process) loads the model once: what a first run would pay."""
    if engine.client is None:
        corpus_engine.worker_model(model)
    else:
        engine.client.run(lambda: corpus_engine.worker_model(model) and None)


def timed(model, corpus, warm, scheduler):
    """(start and load seconds, first-shapes seconds, texts/s of the warmed run)."""
    start = time.perf_counter()
    with corpus_engine.session(None if scheduler == "in-process" else scheduler) as engine:
        load_all(engine, model)
        loaded = time.perf_counter()
        corpus_runs.run(model, warm, "importance", engine=engine)
        warmed = time.perf_counter()
        corpus_runs.run(model, corpus, "importance", engine=engine)
        end = time.perf_counter()
    return loaded - start, warmed - loaded, len(corpus.items) / (end - warmed)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--texts", type=int, default=200)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--corpora", nargs="+", default=["alice-sentences", "gtk-en"])
    p.add_argument("--configs", nargs="+", default=["in-process", "local:1", "local:2"])
    p.add_argument("--warm", type=int, default=4, help="texts of the warm-up run (first shapes)")
    args = p.parse_args()
    parts = [open_corpus(key, limits=CorpusLimits(max_rows=args.texts)) for key in args.corpora]
    texts = [t for part in parts for t in part.items][:args.texts]
    corpus = Corpus(key="+".join(args.corpora), kind="text", items=texts)
    warm = Corpus(key="warm", kind="text", items=texts[-args.warm:])
    print(f"{args.model}, {len(corpus.items)} texts ({corpus.key}), in-process torch threads "
          f"{torch.get_num_threads()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    rates = {}
    for config in args.configs:
        loaded, first, rates[config] = timed(args.model, corpus, warm, config)
        print(f"{config:>10}: {rates[config]:.2f} texts/s warmed (start and model load {loaded:.1f} s, first "
              f"shapes {first:.1f} s, not timed); load average {os.getloadavg()[0]:.1f}", flush=True)
    base = rates.get("in-process") or next(iter(rates.values()))
    for config, rate in rates.items():
        print(f"{config:>10} / in-process: {rate / base:.2f}")
    if "local:1" in rates and "local:2" in rates:
        print(f"2 workers / 1 worker: {rates['local:2'] / rates['local:1']:.2f}")


if __name__ == "__main__":
    main()
