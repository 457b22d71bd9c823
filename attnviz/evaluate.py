"""`python -m attnviz.evaluate`: corpus runs from the command line, and `attnviz.evaluate.run`, the
library call behind them (`analysis.corpus_runs.run`; "heads_4_vs_8" also gets the modelled
Raspberry Pi latency of the smaller model, from the one pricing function,
`latency.tradeoff.kept_heads_latency`).

Bad input prints one line saying what to fix and exits with status 2; a run the cluster ended early
(its workers or its scheduler lost) prints what it finished, then why, and exits with status 3.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import pandas as pd

from attnviz.analysis import corpus_runs
from attnviz.analysis.corpus import CorpusLimits, bundled_corpora, open_corpus
from attnviz.analysis.corpus_engine import SCHEDULER_ENV, WORKER_THREADS_ENV, resolve_scheduler, worker_model
from attnviz.analysis.corpus_metrics import REFERENCES
from attnviz.analysis.corpus_runs import RUN_KINDS, RunResult
from attnviz.analysis.pruning import decode_mask
from attnviz.base.exports import csv_text
from attnviz.latency import corpus_cost
from attnviz.latency.tradeoff import kept_heads_latency

DEFAULT_TOKENS = 128     # priced length when the run measured none (no tokenizer)


def run(model_key: str, corpus, kind: str = "importance", **kw) -> RunResult:
    """`corpus_runs.run`, with "heads_4_vs_8"'s Pi latency joined: `extra["latency"]` (one row per
    Pi) and, per Pi, `<device> full ms` / `<device> kept ms` columns beside the summary."""
    result = corpus_runs.run(model_key, corpus, kind, **kw)
    if kind == "heads_4_vs_8" and "keep" in result.extra:
        add_latency(result)
    return result


def add_latency(result: RunResult) -> RunResult:
    """Price the kept heads of a 4-vs-8 run on a Pi 4 and a Pi 5 and join that to its summary."""
    tokens = result.extra.get("tokens") or DEFAULT_TOKENS
    try:
        priced = kept_heads_latency(result.extra["cfg"], result.extra["keep"], tokens)
    except ValueError as e:
        result.extra["latency_note"] = str(e)
        return result
    result.extra["latency"] = priced
    for row in priced.itertuples():
        result.summary[f"{row.device} full ms"] = row.full_ms
        result.summary[f"{row.device} kept ms"] = row.kept_ms
    return result


def parser() -> argparse.ArgumentParser:
    kinds = "; ".join(f"{k}: {v}" for k, v in RUN_KINDS.items())
    p = argparse.ArgumentParser(
        prog="python -m attnviz.evaluate",
        description="Run a model over a corpus on the corpus engine (in-process, a local Dask cluster or a "
                    "remote one) and print progress per item and the summary with 95 %% intervals. "
                    f"Run kinds: {kinds}.")
    p.add_argument("corpus", nargs="?", help="a bundled corpus key (--list shows them), a file: .txt (a line "
                                             "an item), .csv / .jsonl (pick the column with --column), or "
                                             "a folder of audio clips or images")
    p.add_argument("--model", default="minilm", help="bundled model key or a local model folder (default minilm)")
    p.add_argument("--kind", default="importance", choices=list(RUN_KINDS), help="what to run (default importance)")
    p.add_argument("--column", help="the text column of a .csv / .jsonl corpus")
    p.add_argument("--label-column", help="a numeric column of labels (e.g. a similarity score): Spearman "
                                          "correlation with the model's figures")
    p.add_argument("--metric", help="the metric the pruning curve follows (default: the model kind's primary "
                                    "metric, higher is better)")
    p.add_argument("--reference", default="full", choices=list(REFERENCES),
                   help="translators: score the pruned translation against the full model's (full, the default), "
                        "against the package's own native engine's (native), or both columns side by side (both)")
    p.add_argument("--mask", help="head mask for --kind mask, as the head editor writes it (e.g. 6x12-fff...)")
    p.add_argument("--scheduler", default=None,
                   help=f"'local' (a Dask cluster on this machine's cores), 'local:N' (N workers) or a Dask "
                        f"scheduler address tcp://host:8786; default: ${SCHEDULER_ENV} if set, else in-process. "
                        f"Local workers use ${WORKER_THREADS_ENV} torch threads (default 1)")
    p.add_argument("--resume", type=Path, help="results file (JSON lines) written as items finish; rerun with "
                                               "the same options and file to skip what is done")
    p.add_argument("--out", type=Path, help="write the per-item table to this CSV (the summary goes to "
                                            "OUT with .summary.csv)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random orders and probes (each item's "
                                                       "seed derives from it and the item's index)")
    p.add_argument("--random-orders", type=int, default=corpus_runs.RANDOM_ORDERS,
                   help=f"random orders beside the importance order (default {corpus_runs.RANDOM_ORDERS})")
    limits = CorpusLimits()
    p.add_argument("--max-rows", type=int, default=limits.max_rows, help="items read at most")
    p.add_argument("--max-bytes", type=int, default=limits.max_bytes, help="bytes of a corpus file read at most")
    p.add_argument("--max-chars-per-row", type=int, default=limits.max_chars_per_row,
                   help="characters an item keeps at most")
    p.add_argument("--max-tokens-per-row", type=int, default=limits.max_tokens_per_row,
                   help="tokens an item keeps at most")
    p.add_argument("--budget", type=float, help="seconds the run may take: a batch that would end past it at the "
                                                "rate measured so far is not started (default: no budget)")
    p.add_argument("--list", action="store_true", help="list the bundled corpora and exit")
    return p


def load(args):
    limits = CorpusLimits(max_rows=args.max_rows, max_bytes=args.max_bytes,
                          max_chars_per_row=args.max_chars_per_row, max_tokens_per_row=args.max_tokens_per_row)
    return open_corpus(args.corpus, column=args.column, label_column=args.label_column, limits=limits)


def quiet_cluster_logs(scheduler: str | None):
    """Dask's own log lines (a worker lost, a fetch abandoned and rescheduled) are for its operators:
    the CLI says in one line of its own what happened to the run. Distributed sets its loggers' levels
    when it is imported, so it is imported first (only for a run on a cluster)."""
    if not (scheduler or os.environ.get(SCHEDULER_ENV, "").strip()):
        return
    import distributed  # noqa: F401  (sets its logging up; the in-process CLI never loads it)
    names = [n for n in list(logging.root.manager.loggerDict) if n.split(".")[0] in ("distributed", "tornado")]
    for name in names + ["distributed", "tornado", "tornado.application", "asyncio"]:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def estimate(args, corpus) -> tuple:
    """Print the run's estimate before it starts (a text corpus run in this process, whose model this
    process loads anyway); (config, mean tokens) for the running estimate, (None, 0) otherwise."""
    if resolve_scheduler(args.scheduler) is not None or corpus.kind != "text":
        return None, 0.0
    if args.kind == "mask" and not args.mask:
        return None, 0.0   # the run itself says what is missing, and no estimate precedes it
    model = worker_model(args.model)
    if args.kind == "mask":   # a mask of another shape: its error, not an estimate first
        decode_mask(args.mask, int(model.mask_layers), int(model.cfg.n_heads))
    tokens = corpus_runs.item_tokens(model, corpus.items)
    if not tokens:
        return None, 0.0
    plan = corpus_runs.plan_for(model, corpus, args.kind, random_orders=args.random_orders, tokens=tokens)
    mean = sum(tokens) / len(tokens)
    line = corpus_cost.describe(model.cfg, plan, mean, corpus_cost.prior_rate())
    sys.stderr.write(f"estimate: {line} ({corpus_cost.ASSUMED_SHARE:.0%} of this machine's matmul peak, "
                     "until the first batch measures the rate)" +
                     (f"; budget {args.budget:g} s" if args.budget else "") + "\n")
    return model.cfg, mean


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    quiet_cluster_logs(args.scheduler)
    if args.list:
        for key, text in bundled_corpora().items():
            sys.stdout.write(f"{key}\t{text}\n")
        return 0
    if not args.corpus:
        sys.stderr.write("error: name a corpus (a bundled key, a file or a folder); --list shows the bundled ones\n")
        return 2
    try:
        corpus = load(args)
        for note in corpus.notes:
            sys.stderr.write(f"note: {note}\n")

        cfg, tokens = estimate(args, corpus)

        def progress(done, total, partial):
            est = partial.extra.get("estimate") if partial is not None else None
            line = f" · {corpus_cost.describe(cfg, est, tokens)}" if est and cfg is not None else ""
            sys.stderr.write(f"item {done}/{total}{line}\n")
            sys.stderr.flush()

        result = run(args.model, corpus, args.kind, mask=args.mask, metric=args.metric,
                     scheduler=args.scheduler, seed=args.seed, progress=progress, resume=args.resume,
                     random_orders=args.random_orders, reference=args.reference, budget=args.budget)
    except (ValueError, OSError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("stopped; rerun with --resume FILE to keep finished items next time\n")
        return 130
    if result.extra.get("resume_note"):
        sys.stderr.write(f"note: {result.extra['resume_note']}\n")
    with pd.option_context("display.width", 160, "display.max_rows", 60):
        sys.stdout.write(result.summary.to_string(index=False) + "\n")
    if "latency" in result.extra:
        sys.stdout.write(result.extra["latency"].to_string(index=False) + "\n")
    if args.out is not None:
        args.out.write_text(csv_text(result.table), encoding="utf-8", newline="")
        args.out.with_suffix(".summary.csv").write_text(csv_text(result.summary), encoding="utf-8", newline="")
    if not result.complete:
        why = result.extra.get("stopped_note")
        sys.stderr.write(f"incomplete: {result.done}/{result.total} items" + (f": {why}" if why else "") + "\n")
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
