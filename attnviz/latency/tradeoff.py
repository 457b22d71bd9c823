"""The seed's trade-off on the Pi: 4 heads against 8 at equal d_model. The same width split into
more, narrower heads costs the same projection work but more per-head calls and more score
matrices; what it buys is accuracy (the Lab's recall toys: toy-recall, 4 heads; toy-recall-8h,
8 heads, both d_model 64) or nothing (a synthetic encoder shape).

`heads_table()`: one row per (shape, heads): modelled latency on a Pi 4 and a Pi 5 at 4 threads
for each engine asked, and the toy's exact accuracy on its fixed held-out set (NaN for a shape).

`kept_heads_latency(cfg, keep)`: the same pricing for a real model with some heads removed (the
corpus runs' "4 vs 8 heads"): the full model and the model that keeps `keep`, on both Pis.
"""
from __future__ import annotations

import pandas as pd

from attnviz.core.config import Config
from attnviz.core.seq2seq import Seq2SeqConfig
from attnviz.latency import translation_latency
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


def kept_heads_config(cfg, keep):
    """`cfg` with each layer's query and K/V head counts after keeping `keep` ([L][H] bools), as
    `Model.prune` builds it (a K/V head stays while any query head of its group does)."""
    if len(keep) != cfg.n_layers or any(len(row) != cfg.n_heads for row in keep):
        raise ValueError(f"kept heads must be {cfg.n_layers} layers x {cfg.n_heads} heads")
    heads = [[h for h, on in enumerate(row) if on] for row in keep]
    return cfg.replace(head_dims=tuple(len(h) for h in heads),
                       kv_dims=tuple(len({h // cfg.group for h in on}) for on in heads))


def kept_heads_latency(cfg, keep, tokens: int = 128, engines=(("torch", "fp32"),)) -> pd.DataFrame:
    """One row per (device, engine): modelled ms of the full model and of the one keeping `keep`
    on `tokens` tokens at the Pi's 4 threads, and the speed-up. A translator's `keep` is its decoder
    layers' cross-attention heads (what its head mask switches); it is priced encoding `tokens`
    source tokens and decoding as many (torch fp32, the one engine its cost model has)."""
    if type(cfg) is Seq2SeqConfig:
        return _translator_latency(cfg, keep, int(tokens))
    if type(cfg) is not Config:
        raise ValueError("the Pi cost model prices encoders, decoder-only models and translators here; "
                         "speech models are priced per audio length on the Latency page")
    small = kept_heads_config(cfg, keep)
    rows = []
    for device in ("pi4", "pi5"):
        for engine, dtype in engines:
            prof = engine_profile(device, engine, dtype)
            full = predict(cfg, int(tokens), prof, "eager", threads=PI_THREADS).total_ms
            kept = predict(small, int(tokens), prof, "eager", threads=PI_THREADS).total_ms
            rows.append(dict(device=device, engine=f"{engine} {dtype}", tokens=int(tokens),
                             heads=sum(map(sum, keep)), full_ms=full, kept_ms=kept, speedup=full / kept))
    return pd.DataFrame(rows)


def _translator_latency(cfg: Seq2SeqConfig, keep, tokens: int) -> pd.DataFrame:
    if len(keep) != cfg.n_dec_layers or any(len(row) != cfg.n_heads for row in keep):
        raise ValueError(f"kept heads must be {cfg.n_dec_layers} decoder layers x {cfg.n_heads} cross-attention heads")
    kept_heads = tuple(int(sum(row)) for row in keep)
    rows = []
    for device in ("pi4", "pi5"):
        full, kept = (translation_latency.predict(cfg, tokens, device, threads=PI_THREADS, cross_heads=heads)
                      for heads in (None, kept_heads))
        full_ms, kept_ms = (p["encode_ms"] + tokens * p["decode_ms_per_token"] for p in (full, kept))
        rows.append(dict(device=device, engine="torch fp32", tokens=tokens, heads=sum(kept_heads),
                         full_ms=full_ms, kept_ms=kept_ms, speedup=full_ms / kept_ms))
    return pd.DataFrame(rows)
