"""Measured speed-up of a physically pruned model (`Model.prune`) against the model, with its
Amdahl bound and FLOP counts, and the Raspberry Pi latency the cost model gives both."""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import pandas as pd
import torch

from attnviz.base.timing import Timing, measure
from attnviz.latency import costmodel


def forward_flops(cfg, n: int) -> dict[str, float]:
    """Multiply-adds x 2 of one forward pass over n tokens, split into attention and the rest.
    Uses the per-layer head counts of a pruned config."""
    d, dh = cfg.d_model, cfg.d_head
    attn = rest = 0.0
    for i in range(cfg.n_layers):
        h, hkv = cfg.heads_in(i), cfg.kv_heads_in(i)
        attn += 2 * n * d * (h + 2 * hkv) * dh      # fused QKV projection
        attn += 2 * 2 * n * n * h * dh              # scores and weighted sum of values
        attn += 2 * n * h * dh * d                  # output projection
        rest += 2 * n * d * cfg.d_ff * (3 if cfg.gated_mlp else 2)
    if cfg.task == "lm":
        rest += 2 * n * d * cfg.vocab_size
    return dict(attention=attn, other=rest, total=attn + rest)


MIN_REPEATS = 3      # a median and a spread need a few runs
WARMUP_RUNS = 2      # untimed runs of each model per length: one-off kernel and allocator set-up


def time_forward(model, ids) -> float:
    """Seconds of one forward pass (the one timer; one call at a time, so that rounds alternate)."""
    with torch.inference_mode():
        return measure(lambda: model.net(input_ids=ids), 1, 0).times[0]


@dataclass
class Speedup:
    params_full: int
    params_pruned: int
    heads_kept: int
    heads_total: int
    table: pd.DataFrame      # one row per sequence length
    complete: bool = True
    cfg_full: object = None
    cfg_pruned: object = None

    def modelled(self, devices=("pi4", "pi5")) -> pd.DataFrame:
        """Raspberry Pi latency of both models from `attnviz.latency.costmodel`: one row per device
        and sequence length."""
        rows = []
        for dev in devices:
            profile = costmodel.PROFILES[dev]
            for n in self.table["tokens"]:
                full = costmodel.predict(self.cfg_full, int(n), profile).total_ms
                pruned = costmodel.predict(self.cfg_pruned, int(n), profile).total_ms
                rows.append(dict(device=dev, tokens=int(n), full_ms=full, pruned_ms=pruned,
                                 speedup=full / pruned))
        return pd.DataFrame(rows)


def measure_speedup(model, keep, lengths=(32, 128, 512), repeats: int = 5, seed: int = 0,
                    progress=None, should_stop=None, warmup: int = WARMUP_RUNS) -> Speedup:
    """Latency of `model.prune(keep)` against the model: per length, `warmup` untimed runs of each,
    then `repeats` rounds that alternate the models (full, pruned, no-attention twin; the order
    reversed every other round, so a load change hits all alike). Reported: medians, the
    interquartile range (`*_q1`, `*_q3`), and the speed-up as the median of the per-round ratios
    full / pruned with their IQR (runs of one round share the machine's load).

    The bound: only attention shrinks when heads go, so with attention taking a share a of the
    time and a fraction k of heads kept, the speed-up cannot exceed 1 / (1 - a (1 - k)) (Amdahl).
    `a` is measured against the same model with every head pruned; the FLOP-based bound from
    `forward_flops` is given next to it. `progress(rounds done, rounds in all, tokens)` after each round."""
    if int(repeats) < MIN_REPEATS:
        raise ValueError(f"{int(repeats)} run(s) per length give no median worth the name: use at least "
                         f"{MIN_REPEATS} (a single run on a busy machine can be off by several times)")
    if model.cfg.is_vision or not model.cfg.vocab_size:
        raise ValueError("speed-up measurement takes text models")
    repeats, warmup = int(repeats), max(1, int(warmup))
    with warnings.catch_warnings():  # zero-width projections of an all-pruned model are intended
        warnings.simplefilter("ignore", UserWarning)
        small = model.prune(keep)    # checks keep's shape; heads pruned before stay gone
        keep = small.kept            # [L, H] in the original numbering: what the pruned model kept
        if not keep.any():
            raise ValueError("the mask removes every head; keep at least one to build a pruned model")
        none = model.prune(torch.zeros_like(keep))
    k = int(keep.sum()) / int(model.kept.sum())
    gen = torch.Generator().manual_seed(seed)
    rows = []
    vocab = model.cfg.vocab_size
    lengths = [int(n) for n in lengths if 1 <= int(n) <= model.max_tokens]
    models = (model, small, none)
    for j, n in enumerate(lengths):
        if should_stop is not None and should_stop():
            break
        ids = torch.randint(0, vocab, (1, n), generator=gen)
        for _ in range(warmup):
            for m in models:
                time_forward(m, ids)
        times = ([], [], [])
        for r in range(repeats):
            if should_stop is not None and should_stop():  # between rounds: a closed tab frees the slot
                break
            order = (0, 1, 2) if r % 2 == 0 else (2, 1, 0)
            for i in order:
                times[i].append(time_forward(models[i], ids))
            if progress is not None:   # per round: one long length is minutes on a small machine
                progress(j * repeats + r + 1, len(lengths) * repeats, n)
        if len(times[0]) < repeats:  # stopped mid-length: its few rounds are not a measurement
            break
        (f1, t_full, f3), (p1, t_small, p3), (_, t_none, _) = (Timing.of(t).quartiles for t in times)
        s1, speedup, s3 = Timing.of([a / b for a, b in zip(times[0], times[1])]).quartiles
        share = min(1.0, max(0.0, 1 - t_none / t_full))
        f_full, f_small = forward_flops(model.cfg, n), forward_flops(small.cfg, n)
        flop_share = f_full["attention"] / f_full["total"]
        rows.append(dict(tokens=n, runs=repeats, full_ms=1e3 * t_full, full_ms_q1=1e3 * f1, full_ms_q3=1e3 * f3,
                         pruned_ms=1e3 * t_small, pruned_ms_q1=1e3 * p1, pruned_ms_q3=1e3 * p3,
                         speedup=speedup, speedup_q1=s1, speedup_q3=s3,
                         no_attention_ms=1e3 * t_none, attention_share=share, bound=1 / (1 - share * (1 - k)),
                         attention_share_flops=flop_share, flops_speedup=f_full["total"] / f_small["total"]))
    return Speedup(model.num_params(), small.num_params(), int(keep.sum()), int(model.kept.sum()),
                   pd.DataFrame(rows), complete=len(rows) == len(lengths), cfg_full=model.cfg,
                   cfg_pruned=small.cfg)


def noisy_lengths(table: pd.DataFrame, spread: float = 1.25, time_spread: float = 0.5) -> list[int]:
    """Sequence lengths whose speed-up is not settled: the IQR of the per-round ratios spans more
    than a factor `spread`, the median lies above its Amdahl bound (beyond 5 %), or either model's
    time has an IQR above `time_spread` times its median (a 4,227 ms median with a 312 ms first
    quartile is not a measurement, even when the ratios of its rounds agree)."""
    if table.empty:
        return []
    wide = table["speedup_q3"] > spread * table["speedup_q1"]
    above = table["speedup"] > 1.05 * table["bound"]
    for col in ("full_ms", "pruned_ms"):
        if {col, f"{col}_q1", f"{col}_q3"} <= set(table.columns):
            wide |= table[f"{col}_q3"] - table[f"{col}_q1"] > time_spread * table[col]
    return [int(n) for n in table.loc[wide | above, "tokens"]]
