"""Pruning curves (physical pruning itself is `attnviz.core.surgery`, behind `Model.prune`).

Here: pruning curves (metrics as heads are removed by importance or at random) and head
masks encoded for links. The measured speed-up of a pruned model is `attnviz.latency.speedup`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd
import torch

from attnviz.analysis import head_ablation
from attnviz.analysis.importance import Stop, evaluate, head_importance, primary_metric, reference


# ---------------------------------------------------------------- pruning curves
def _fraction_steps(max_fraction: float, step: float) -> list[float]:
    if not 0 < step <= 1 or not 0 <= max_fraction <= 1:
        raise ValueError("step must lie in (0, 1] and max_fraction in [0, 1]")
    n = int(round(max_fraction / step + 1e-9))
    return [round(i * step, 6) for i in range(n + 1)]


@dataclass
class Curve:
    """Metrics against the share of heads removed. `table` has one row per (order, seed, fraction):
    order is "importance" (re-estimated after every step) or "random"."""
    table: pd.DataFrame
    metric: str                       # the primary metric (perplexity | cosine)
    done: int
    total: int
    masks: dict = field(default_factory=dict)   # (order, seed, fraction) -> BoolTensor keep [L, H]
    stopped: str | None = None                  # why an incomplete run ended: "stopped" | "time limit"
    max_seconds: float | None = None            # the time budget the run had
    ablation: str = "zero"                      # how a head off is removed: zero | mean (analysis.ablation)

    @property
    def complete(self) -> bool:
        return self.done >= self.total

    def summary(self) -> pd.DataFrame:
        """Mean and standard deviation over seeds per order and fraction (std 0 for one run)."""
        if self.table.empty:
            return self.table
        cols = [c for c in self.table.columns if c not in ("order", "seed", "fraction", "removed")]
        g = self.table.groupby(["order", "fraction"], sort=True)
        out = g[cols].mean().add_suffix("_mean").join(g[cols].std(ddof=0).fillna(0).add_suffix("_std"))
        return out.join(g.size().rename("runs")).reset_index()


def pruning_curve(model, data, *, step: float = 0.1, max_fraction: float = 0.9,
                  method: str = "gradient", seeds=(0, 1, 2), batch: int = 2, normalised: bool = True,
                  progress=None, should_stop=None, max_seconds: float | None = None,
                  ablation: str = "zero", means=None) -> Curve:
    """Remove heads in steps of `step` (share of the model's heads), in order of importance
    (re-estimated under the current mask after every step) and in random orders (one per seed).
    Masked outputs equal pruned outputs, so the curve runs on masks of the one model.
    `normalised`: rank by the per-layer normalised score (Michel et al.) or by the raw one.
    Stops (complete=False) at `should_stop()` or after `max_seconds`, which can never exceed
    LIMITS.max_importance_seconds (see `importance.time_budget`). `ablation`: heads removed by
    zero or mean ablation (`means` computed once when not given); a mean-ablated curve is no
    longer what physical pruning gives."""
    stop = Stop(should_stop, max_seconds)
    means = head_ablation.resolve_means(model, ablation, means)
    fractions = _fraction_steps(max_fraction, step)
    ref = reference(model, data, batch)
    alive = model.kept.clone()
    n_alive = int(alive.sum())
    curve = Curve(pd.DataFrame(), primary_metric(model), 0, len(fractions) * (1 + len(seeds)),
                  max_seconds=stop.deadline.seconds, ablation=ablation)
    rows = []

    def record(order, seed, fraction, keep):
        metrics = evaluate(model, data, keep.float(), ref, batch, ablation, means)
        rows.append(dict(order=order, seed=seed, fraction=fraction, removed=int((alive & ~keep).sum()),
                         **metrics))
        curve.table = pd.DataFrame(rows)
        curve.masks[(order, seed, fraction)] = keep.clone()
        curve.done += 1
        if progress is not None:
            progress(curve.done, curve.total, curve)

    keep = alive.clone()
    positions = torch.nonzero(alive.flatten()).flatten()
    orders = [positions[torch.randperm(n_alive, generator=torch.Generator().manual_seed(int(seed)))]
              for seed in seeds]
    # Step by step, the random orders first (one cheap pass each), then the importance order: a run
    # stopped by its budget still has both curves up to the same share of heads removed.
    for fraction in fractions:
        target = min(n_alive - 1, round(fraction * n_alive))  # one head always stays
        for seed, order in zip(seeds, orders):
            if stop():
                curve.stopped = stop.reason
                return curve
            random_keep = alive.flatten().clone()
            random_keep[order[:target]] = False
            record("random", int(seed), fraction, random_keep.view_as(alive))
        if stop():
            curve.stopped = stop.reason
            return curve
        extra = target - int((alive & ~keep).sum())
        if extra > 0:
            imp = head_importance(model, data, method, keep.float(), ref, should_stop=stop,
                                  ablation=ablation, means=means)
            if stop():  # stopped inside: a partial ranking would put a wrong point on the curve
                curve.stopped = stop.reason
                return curve
            scores = torch.where(keep, imp.ranking(normalised).nan_to_num(0.0), torch.tensor(float("inf")))
            drop = torch.argsort(scores.flatten(), stable=True)[:extra]
            keep = keep.flatten().clone()
            keep[drop] = False
            keep = keep.view_as(alive)
        record("importance", -1, fraction, keep)
    return curve


# ---------------------------------------------------------------- masks in links
def encode_mask(keep) -> str:
    """BoolTensor [L, H] -> "LxH-hex" (bit i of the number = head i in row-major order, 1 = on):
    short enough for a link (SmolLM2's 270 heads take 68 hex digits)."""
    keep = torch.as_tensor(keep).bool()
    bits = keep.flatten().tolist()
    value = sum(1 << i for i, on in enumerate(bits) if on)
    return f"{keep.shape[0]}x{keep.shape[1]}-{value:x}"


def decode_mask(text: str, n_layers: int, n_heads: int) -> torch.Tensor:
    """Inverse of `encode_mask`, checked against the model's shape; ValueError says what is wrong."""
    found = re.fullmatch(r"(\d{1,4})x(\d{1,4})-([0-9a-f]{1,2500})", str(text).strip().lower())
    if not found:
        raise ValueError("the head mask in the link is malformed (expected e.g. 6x12-fff…); "
                         "all heads are on")
    L, H, value = int(found[1]), int(found[2]), int(found[3], 16)
    if (L, H) != (n_layers, n_heads):
        raise ValueError(f"the head mask in the link is for {L} layers x {H} heads, but this model has "
                         f"{n_layers} x {n_heads}; all heads are on")
    if value >> (L * H):
        raise ValueError("the head mask in the link has more bits than the model has heads; all heads are on")
    bits = [(value >> i) & 1 for i in range(L * H)]
    return torch.tensor(bits, dtype=torch.bool).view(L, H)
