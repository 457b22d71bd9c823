"""Corpus runs priced in FLOPs and seconds: a run's plan (`analysis.corpus_plan`, forward-tokens)
times the cost model's FLOPs per token (`costmodel.op_counts`), at a rate measured on this machine.

Before a run has measured its own rate its masked forwards are priced at `ASSUMED_SHARE` of this
machine's fp32 matrix-product peak (`matmul_peak`, measured once per process and thread count) and
its gradient passes at their `corpus_plan.PACE`; once its first batch has finished, at the rate that
batch (and every later one) achieved. The same FLOP count is what `bench/corpus_speed.py` divides by
the time taken (GFLOP/s against that peak).
"""
from __future__ import annotations

import functools

import torch

from attnviz.base.timing import measure
from attnviz.latency.costmodel import op_counts

# of the matmul peak a corpus run's masked forwards reach before it measured its own rate: batched runs
# on a quiet 2-core machine reached 0.72-0.81 of it (gradient passes 0.46-0.63: `corpus_plan.PACE`);
# 0.25 priced them 3x long
ASSUMED_SHARE = 0.75
PEAK_SIZE = 1024         # square fp32 products: large enough to reach the kernels' plateau
PEAK_REPEATS = 5


def flops_per_token(cfg, tokens: float) -> float:
    """FLOPs of one forward pass per token, at a mean length of `tokens` (the cost model's count:
    every linear layer, attention's products at that length, the LM head)."""
    n = max(1, int(round(tokens)))
    return sum(count * op.flops for op, count in op_counts(cfg, n)) / n


def matmul_peak(size: int = PEAK_SIZE) -> float:
    """This machine's fp32 matrix product rate in GFLOP/s at torch's current thread count (the
    best of a few timed products after a warm-up: the peak, not a typical figure), measured once
    per process and thread count."""
    return _peak(torch.get_num_threads(), size)


@functools.lru_cache(maxsize=8)
def _peak(threads: int, size: int) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    with torch.inference_mode():
        timing = measure(lambda: torch.mm(a, b), PEAK_REPEATS, 2)
    return 2 * size ** 3 / min(timing.times) / 1e9


def price(cfg, plan, tokens: float, gflops: float) -> dict:
    """FLOPs and seconds of a plan with its masked forwards at `gflops` (GFLOP/s), each phase at its
    pace: dict(flops, seconds)."""
    per = flops_per_token(cfg, tokens)
    flops, work = plan.total() * per, plan.work() * per
    return dict(flops=flops, seconds=work / (gflops * 1e9) if gflops > 0 else float("inf"))


def prior_rate() -> float:
    """GFLOP/s a run's masked forwards are priced at before it measured its own: a share of the matmul peak."""
    return ASSUMED_SHARE * matmul_peak()


def measured_gflops(cfg, estimate: dict, tokens: float) -> float | None:
    """The GFLOP/s a masked forward of a running corpus run achieved so far (its `extra["estimate"]`;
    a gradient phase's rate at its pace), the rate `price` takes; None before a batch ended."""
    rate = estimate.get("forward_rate")
    return None if not rate else rate * flops_per_token(cfg, tokens) / 1e9


def describe(cfg, plan_or_estimate, tokens: float, gflops: float | None = None) -> str:
    """One line: what the run costs and how long it takes (before: at `gflops`; running: at its measured rate)."""
    if isinstance(plan_or_estimate, dict):
        est = plan_or_estimate
        per = flops_per_token(cfg, tokens)
        flops = est["units_total"] * per
        if est.get("rate"):
            rate = est["rate"] * per / 1e9
            return (f"{_flops(flops)}: {_s(est['seconds'])} so far, about {_s(est['seconds_left'])} left "
                    f"(about {_s(est['seconds_total'])} in all at the {rate:.1f} GFLOP/s measured here)")
        return f"{_flops(flops)}: measuring the rate in the first batch"
    got = price(cfg, plan_or_estimate, tokens, gflops)
    return f"{_flops(got['flops'])}: about {_s(got['seconds'])} at {gflops:.1f} GFLOP/s"


def fitting(cfg, sizes: list[int], plan_of, tokens_of, budget: float, gflops: float, share: float) -> int:
    """The position in `sizes` (item counts, ascending) of the most items whose plan (`plan_of(n)`,
    at a mean of `tokens_of(n)` tokens) is priced within `share` of `budget` at `gflops` (0 if none is)."""
    best = 0
    for i, n in enumerate(sizes):
        if price(cfg, plan_of(n), tokens_of(n), gflops)["seconds"] <= share * budget:
            best = i
    return best


def _s(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def _flops(flops: float) -> str:
    return f"{flops / 1e12:.2f} TFLOP" if flops >= 1e11 else f"{flops / 1e9:.1f} GFLOP"
