"""Reproduce the shipped toy checkpoints in attnviz/data/toys/ and state their accuracy.

    .venv/bin/python scripts/train_toys.py            # all of them (a few minutes on 2 cores)
    .venv/bin/python scripts/train_toys.py toy-copy   # one

Training is seeded and single-threaded (see toy_training.train), so a rerun on the same torch
version gives the same weights. The accuracy written into each JSON (and checked by
tests/test_toys.py) is measured AFTER the float16 round trip, on the fixed held-out set of
toys.EVAL_SIZE prompts.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnviz.toys import tasks  # noqa: E402
from attnviz.toys.training import TrainSettings, estimate_seconds, train  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "attnviz" / "data" / "toys"

# key -> (settings, description). Each fits the lab's 60 s budget by the cost model.
SHIPPED = {
    "toy-copy": (TrainSettings(task=tasks.Task("copy"), steps=400),
                 "copies 8 digits; learned positions"),
    "toy-reverse": (TrainSettings(task=tasks.Task("reverse"), steps=600),
                    "reverses 8 digits; learned positions"),
    "toy-sort": (TrainSettings(task=tasks.Task("sort"), steps=1500),
                 "sorts 8 digits; learned positions"),
    "toy-recall": (TrainSettings(task=tasks.Task("recall"), steps=1200),
                   "8 key-value pairs, then all 8 keys: write each value; learned positions, 4 heads"),
    "toy-recall-8h": (TrainSettings(task=tasks.Task("recall"), n_heads=8, steps=1200),
                      "the same recall task with the same width split into 8 heads"),
}
COMPARE = ("toy-recall", "toy-recall-8h")  # the lab's 4 vs 8 heads comparison


def build(key: str) -> dict:
    settings, description = SHIPPED[key]
    result = train(settings, key=key, stop_at_budget=False)
    settings_dict = asdict(settings)
    settings_dict.pop("task")
    meta = dict(description=description, settings=settings_dict, compare=key in COMPARE,
                train_seconds=round(result.seconds, 1), final_loss=result.losses[-1],
                estimated_seconds=round(estimate_seconds(settings), 1),
                eval=dict(n=tasks.EVAL_SIZE, seed=tasks.EVAL_SEED), accuracy={})
    meta = tasks.save_toy(result.model, key, OUT, meta)
    tasks.TOYS[key] = meta
    tasks._load_toy_state.cache_clear()
    score = tasks.evaluate(tasks.load_toy(key))  # measured after the float16 round trip
    meta["accuracy"] = dict(exact=score.exact, token=score.token)
    (OUT / f"{key}.json").write_text(json.dumps(meta, indent=1))
    return meta


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("keys", nargs="*", default=list(SHIPPED), help=f"some of {', '.join(SHIPPED)}")
    args = parser.parse_args(argv)
    unknown = [k for k in args.keys if k not in SHIPPED]
    if unknown:
        parser.error(f"unknown toy {unknown}; choose from {', '.join(SHIPPED)}")
    print(f"{'toy':16} {'params':>8} {'steps':>6} {'seconds':>8} {'exact':>8} {'token':>8}")
    for key in args.keys:
        meta = build(key)
        print(f"{key:16} {meta['params']:8,} {meta['settings']['steps']:6} {meta['train_seconds']:8.1f} "
              f"{meta['accuracy']['exact']:8.2%} {meta['accuracy']['token']:8.2%}", flush=True)


if __name__ == "__main__":
    main()
