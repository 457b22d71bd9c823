"""The seed's trade-off on the Pi: 4 heads against 8 at equal d_model. The same width split into
more, narrower heads costs the same projection work but more per-head calls and more score
matrices; what it buys is accuracy (the Lab's recall toys: toy-recall, 4 heads; toy-recall-8h,
8 heads, both d_model 64) or nothing (a synthetic encoder shape).

`heads_table()`: one row per (shape, heads): modelled latency on a Pi 4 and a Pi 5 at 4 threads
for each engine asked, and the toy's exact accuracy on its fixed held-out set (NaN for a shape).
"""
from __future__ import annotations

import pandas as pd

from attnviz.latency.costmodel import predict
from attnviz.latency.engines import engine_profile
from attnviz.latency.results import parse_synthetic
from attnviz.toys.tasks import evaluate, load_toy

TOYS = ("toy-recall", "toy-recall-8h")
SHAPE = "synthetic:layers=6,d=384,heads={h},ff=1536,vocab=30522,positions=1024"
PI_THREADS = 4


def heads_table(toys=TOYS, heads=(4, 8), n: int = 256, engines=(("torch", "fp32"), ("ncnn", "fp32")),
                accuracy: bool = True) -> pd.DataFrame:
    rows = []
    shapes = [(key, load_toy(key)) for key in toys]
    shapes += [(SHAPE.format(h=h).removeprefix("synthetic:"), None) for h in heads]
    for name, toy in shapes:
        cfg = toy.cfg if toy is not None else parse_synthetic("synthetic:" + name)
        tokens = toy.task.seq_len if toy is not None else n
        row = dict(shape=name, n_heads=cfg.n_heads, d_model=cfg.d_model, d_head=cfg.d_head, tokens=tokens,
                   exact_accuracy=evaluate(toy).exact if toy is not None and accuracy else float("nan"))
        for device in ("pi4", "pi5"):
            for engine, dtype in engines:
                prof = engine_profile(device, engine, dtype)
                row[f"{device} {engine} {dtype} ms"] = predict(cfg, tokens, prof, "eager", threads=PI_THREADS).total_ms
        rows.append(row)
    return pd.DataFrame(rows)
