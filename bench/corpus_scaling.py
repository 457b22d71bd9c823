"""Texts per second of SmolLM2 head importance over a corpus (the bundled Alice sentences, topped up to
200 with the bundled GLib/GTK English messages: no bundled English corpus alone holds 200), in-process
and on a local Dask cluster of 1 and of 2 worker processes (one torch thread each), with the ratio.

Each configuration runs the same texts; the cluster timings include starting the cluster and each
worker loading the model (what a user waits for), and are also given from the first result on
(the steady rate). In-process runs at torch's default thread count, each worker at one thread
(ATTNVIZ_WORKER_THREADS). On a shared machine the numbers move with the other programs' load: the load
average is printed before and after.
Usage: python bench/corpus_scaling.py [--texts 200] [--model smollm2] [--corpora alice-sentences gtk-en]
       [--configs in-process local:1 local:2]
"""
import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from attnviz.analysis import corpus_runs  # noqa: E402
from attnviz.analysis.corpus import Corpus, CorpusLimits, open_corpus  # noqa: E402


def timed(model, corpus, scheduler):
    marks = []
    start = time.perf_counter()
    corpus_runs.run(model, corpus, "importance", scheduler=scheduler,
                    progress=lambda done, total, partial: marks.append(time.perf_counter()))
    end = time.perf_counter()
    n = len(corpus.items)
    steady = (n - 1) / (end - marks[0]) if n > 1 and end > marks[0] else float("nan")
    return n / (end - start), steady


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--texts", type=int, default=200)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--corpora", nargs="+", default=["alice-sentences", "gtk-en"])
    p.add_argument("--configs", nargs="+", default=["in-process", "local:1", "local:2"])
    args = p.parse_args()
    parts = [open_corpus(key, limits=CorpusLimits(max_rows=args.texts)) for key in args.corpora]
    texts = [t for part in parts for t in part.items][:args.texts]
    corpus = Corpus(key="+".join(args.corpora), kind="text", items=texts)
    print(f"{args.model}, {len(corpus.items)} texts ({corpus.key}), load average {os.getloadavg()[0]:.1f}, in-process torch "
          f"threads {torch.get_num_threads()}, {os.cpu_count()} cores")
    rates = {}
    for config in args.configs:
        rates[config] = timed(args.model, corpus, config)
        print(f"{config:>10}: {rates[config][0]:.2f} texts/s overall, {rates[config][1]:.2f} texts/s "
              "from the first result on", flush=True)
    base = rates.get("in-process") or next(iter(rates.values()))
    for config, (overall, steady) in rates.items():
        print(f"{config:>10} / in-process: {overall / base[0]:.2f} overall, {steady / base[1]:.2f} steady")
    if "local:1" in rates and "local:2" in rates:
        print(f"2 workers / 1 worker: {rates['local:2'][0] / rates['local:1'][0]:.2f} overall, "
              f"{rates['local:2'][1] / rates['local:1'][1]:.2f} steady")
    print(f"load average after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
