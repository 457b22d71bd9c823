"""Where attention takes as long as the rest: one block, measured and modelled.

Every block of these models has the same shape, so the n at which attention (QK^T, softmax, ·V)
takes as long as the rest of a block (norms, Q/K/V and output projections, RoPE, the MLP, the
residual adds) is a property of one block. Timing ONE block (`Transformer.run_blocks(x, 0, 1)`,
the one block runner) on hidden states of length n reaches that n even where the whole model
cannot: a block reads no positions (learned positions are added in the embeddings, so MiniLM's
512-position limit does not bind a block; a RoPE model's angles for n are computed by
`iter_blocks` itself, beyond its cached table if need be), and one block costs 1/L of a pass.
The whole model's crossover is later: embeddings and the LM head are per-token "rest".

Rows (CSV `test` = "block"): measured ones (backend cpu) hold the block's time in median_ms and
attention alone (the same q, k, v shapes through `core.attention.attend`, interleaved with the
block run by run) in attention_ms; modelled ones (backend cpu-model) the cost model's block time
and its groups, on `steady_profile` (this host's, the median of three calibrations).
`crossover_table` finds both crossovers from the rows, the same way.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import fields, replace
from typing import Callable

import numpy as np
import pandas as pd
import torch

from attnviz.base.timing import Timing, measure
from attnviz.core.attention import attend, parse_variant
from attnviz.latency import costmodel
from attnviz.latency.calibrate import calibrate_host
from attnviz.latency.results import MAX_SEQ_LEN

FACTORS = (0.25, 0.5, 0.7, 1.0, 1.5)  # x the modelled crossover: lengths that straddle it
LONG_REPEATS = 2                      # timed runs per length at and beyond the modelled crossover
FIT_BAND = (0.2, 5.0)                 # attention / rest ratios the log-log fit uses
ROUNDS = 3                            # calibrations whose median figures model the crossover


_steady: dict[tuple, costmodel.DeviceProfile] = {}  # (threads, clock, own_process) -> profile, once per process


def steady_profile(threads: int, clock: str = "wall", own_process: bool = False,
                   check: Callable[[], None] | None = None) -> costmodel.DeviceProfile:
    """This host's profile for the crossover: each figure the median of ROUNDS full calibrations
    (once per process). The crossover moves with the ratio of the fused kernel's speed to the linear
    layers'; one calibration's microbenchmarks on a busy host put it anywhere in +-15% (measured
    here: 1,520 to 1,888 tokens for MiniLM), the median of three within a few %. `check` runs
    before each calibration (a deadline stops it there, and nothing is kept)."""
    key = (int(threads), clock, bool(own_process))
    if key in _steady:
        return _steady[key]
    runs = []
    for _ in range(ROUNDS):
        if check is not None:
            check()
        runs.append(calibrate_host(threads=threads, quick=False, clock=clock, own_process=own_process))
    numbers = {f.name: statistics.median(getattr(p, f.name) for p in runs) for f in fields(runs[0])
               if f.type in ("float", "int") and f.name not in ("cores", "threads")}
    if len(_steady) >= 8:
        _steady.pop(next(iter(_steady)))
    _steady[key] = replace(runs[0], **numbers, source=f"{runs[0].source}; median of {ROUNDS} calibrations")
    return _steady[key]


def block_split(cfg, n: int, profile: costmodel.DeviceProfile, variant=None) -> dict[str, float]:
    """The cost model's ms per group (costmodel.GROUPS) of ONE block of cfg on n tokens."""
    v = parse_variant(variant)
    out = {g: 0.0 for g in costmodel.GROUPS}
    for op in costmodel.layer_ops(cfg, n, v, cfg.heads_in(0), cfg.kv_heads_in(0)):
        out[op.group] += costmodel.op_seconds(op, profile) * 1e3
    return out


def block_crossover(cfg, profile: costmodel.DeviceProfile, variant=None, n_max: int = MAX_SEQ_LEN) -> int | None:
    """The smallest n at which attention takes at least as long as the rest of one block (cost
    model), to ~1.5%; None below n_max (linear-cost variants never get there)."""
    def ahead(n):
        s = block_split(cfg, n, profile, variant)
        return s["attention"] >= sum(s.values()) - s["attention"]
    lo, hi = 1, 2
    while not ahead(hi):
        if hi >= n_max:
            return None
        lo, hi = hi, min(2 * hi, n_max)
    while hi - lo > max(1, lo // 64):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ahead(mid) else (mid, hi)
    return hi


def lengths(n_cross: int) -> list[int]:
    """Lengths that straddle a crossover: FACTORS x n_cross, rounded to 16 tokens."""
    return sorted({min(MAX_SEQ_LEN, max(16, 16 * round(f * n_cross / 16))) for f in FACTORS})


def repeats_at(n: int, n_cross: int, repeats: int) -> int:
    """Fewer timed runs at long n (a SmolLM2 block at 1.5x its crossover takes seconds)."""
    return repeats if n < n_cross else max(1, min(repeats, LONG_REPEATS))


def measure_block(model, n: int, variant=None, *, repeats: int = 3, warmup: int = 1, clock: str = "wall",
                  check: Callable[[], None] | None = None) -> tuple[Timing, Timing]:
    """(one block, its attention alone) on n tokens: the first block of `model` on random hidden
    states (1, n, d_model), and `attend` on q (1, h, n, d_head), k and v (1, h_kv, n, d_head);
    one run of each in turn, so a busy host's drift falls on both alike."""
    v = parse_variant(variant)
    net, cfg = model.net, model.cfg
    g = torch.Generator().manual_seed(n)
    x = torch.randn(1, n, cfg.d_model, generator=g)
    h, kv = cfg.heads_in(0), cfg.kv_heads_in(0)
    q = torch.randn(1, h, n, cfg.d_head, generator=g)
    k, vv = (torch.randn(1, kv, n, cfg.d_head, generator=g) for _ in range(2))
    runs = (lambda: net.run_blocks(x, 0, 1, variants=v), lambda: attend(q, k, vv, causal=cfg.causal, variant=v))
    times = ([], [])
    with torch.inference_mode():
        for fn in runs if warmup else ():  # one untimed run each: allocator and caches settle
            measure(fn, 1, 0, clock=clock, check=check)
        for _ in range(int(repeats)):
            for fn, out in zip(runs, times):
                out.append(measure(fn, 1, 0, clock=clock, check=check).times[0])
    return Timing.of(times[0]), Timing.of(times[1])


def modelled_rows(base: dict, cfg, profile: costmodel.DeviceProfile, variant, ns) -> list[dict]:
    """cpu-model rows of one block at each n (`base`: the sweep's common fields)."""
    rows = []
    for n in ns:
        split = block_split(cfg, n, profile, variant)
        total = sum(split.values())
        rows.append(dict(base, backend="cpu-model", measured=False, test="block", seq_len=int(n), median_ms=total,
                         p10_ms=total, p90_ms=total, **{f"{g}_ms": ms for g, ms in split.items()}))
    return rows


def measured_row(base: dict, n: int, block: Timing, att: Timing) -> dict:
    return dict(base, backend="cpu", measured=True, test="block", seq_len=int(n), median_ms=block.median_ms,
                p10_ms=block.p10_ms, p90_ms=block.p90_ms, attention_ms=att.median_ms)


def estimate_seconds(cfg, profile: costmodel.DeviceProfile, variant, repeats: int, warmup: int) -> float:
    """Seconds the measured block rows take (block and attention at each length)."""
    n_cross = block_crossover(cfg, profile, variant)
    if n_cross is None:
        return 0.0
    total = 0.0
    for n in lengths(n_cross):
        s = block_split(cfg, n, profile, variant)
        total += (min(warmup, 1) + repeats_at(n, n_cross, repeats)) * (sum(s.values()) + s["attention"]) / 1e3
    return total


# ---------------------------------------------------------------- the crossover from rows
def crossing(ns, ratios) -> float | None:
    """n where attention / rest = 1: a least-squares line through log(ratio) against log(n) over
    the points with a ratio in FIT_BAND (near the crossing, where it is close to a power law);
    None when every point lies on one side beyond the band or the ratio does not grow."""
    ns, ratios = np.asarray(ns, float), np.asarray(ratios, float)
    ok = np.isfinite(ratios) & (ratios > 0)
    ns, ratios = ns[ok], ratios[ok]
    near = (ratios >= FIT_BAND[0]) & (ratios <= FIT_BAND[1])
    if near.sum() < 2 or not ((ratios >= 1).any() and (ratios <= 1).any()):
        return None
    slope, icept = np.polyfit(np.log(ns[near]), np.log(ratios[near]), 1)
    return float(math.exp(-icept / slope)) if slope > 0 else None


def crossover_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (model, variant, threads): the measured and the modelled one-block crossover, and the
    model's error in %; NaN where the rows do not straddle it."""
    if "test" not in df.columns:
        return pd.DataFrame(columns=["model", "variant", "threads", "measured_n", "modelled_n", "error_pct"])
    rows = df[df["test"] == "block"]
    out = []
    for (model, variant, threads), g in rows.groupby(["model", "variant", "threads"], sort=True):
        found = {}
        for measured, part in g.groupby("measured"):
            part = part.groupby("seq_len")[["median_ms", "attention_ms"]].median().reset_index()
            att = part["attention_ms"].astype(float)
            found[bool(measured)] = crossing(part["seq_len"], att / (part["median_ms"] - att))
        m, p = found.get(True), found.get(False)
        out.append(dict(model=model, variant=variant, threads=int(threads), measured_n=m, modelled_n=p,
                        error_pct=100 * (p / m - 1) if m and p else float("nan")))
    return pd.DataFrame(out, columns=["model", "variant", "threads", "measured_n", "modelled_n", "error_pct"])
