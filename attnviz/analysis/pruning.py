"""Physical pruning: a NEW, smaller model without the removed heads; the original is untouched.

Pruning a head removes its rows from the fused QKV projection and its columns from the output
projection. With grouped K/V heads a K/V head stays while any kept query head reads it.

Also here: pruning curves (metrics as heads are removed by importance or at random), measured
speed-up of a pruned model with its Amdahl bound, and head masks encoded for links.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace

import pandas as pd
import torch

from attnviz.core.transformer import Transformer


def check_keep(keep, n_layers: int, n_heads: int) -> torch.Tensor:
    keep = torch.as_tensor(keep)
    if tuple(keep.shape) != (n_layers, n_heads):
        raise ValueError(f"keep must have shape [{n_layers}, {n_heads}] (layers x heads); got {list(keep.shape)}")
    if keep.dtype != torch.bool:
        if not torch.all((keep == 0) | (keep == 1)):
            raise ValueError("keep must be boolean (True keeps a head)")
        keep = keep.bool()
    return keep


def prune_model(model, keep):
    """`model.prune(keep)`: keep is BoolTensor[n_layers, n_heads] in the ORIGINAL head numbering."""
    from attnviz.core.model import Model
    cfg, net = model.cfg, model.net
    keep = check_keep(keep, cfg.n_layers, cfg.n_heads) & model.kept  # already-pruned heads stay gone
    heads, kv_heads = [], []
    for i in range(cfg.n_layers):
        kept = [h for h in range(cfg.n_heads) if keep[i, h]]
        heads.append(kept)
        kv_heads.append(sorted({h // cfg.group for h in kept}))
    new_cfg = cfg.replace(head_dims=tuple(len(h) for h in heads), kv_dims=tuple(len(k) for k in kv_heads))
    state = {k: v for k, v in net.state_dict().items()}
    for i, block in enumerate(net.blocks):
        old = block.attn
        dh, old_heads = cfg.d_head, old.heads.tolist()
        old_kv = sorted({h // cfg.group for h in old_heads})
        rows = lambda idx, base: [base + j * dh + r for j in idx for r in range(dh)]  # noqa: E731
        q_idx = [old_heads.index(h) for h in heads[i]]
        kv_idx = [old_kv.index(k) for k in kv_heads[i]]
        hq, hkv = old.n_heads, old.n_kv
        sel = rows(q_idx, 0) + rows(kv_idx, hq * dh) + rows(kv_idx, (hq + hkv) * dh)
        sel = torch.tensor(sel, dtype=torch.long)
        p = f"blocks.{i}.attn."
        state[p + "qkv.weight"] = state[p + "qkv.weight"][sel]
        if p + "qkv.bias" in state:
            state[p + "qkv.bias"] = state[p + "qkv.bias"][sel]
        state[p + "out.weight"] = state[p + "out.weight"][:, torch.tensor(rows(q_idx, 0), dtype=torch.long)]
    # clone: the new model owns its tensors, so nothing done to it can reach the original
    small = Transformer.from_state(new_cfg, {k: v.clone() for k, v in state.items()}, heads, kv_heads)
    info = replace(model.info, key=f"{model.info.key} (pruned {int((~keep).sum())}/{keep.numel()})")
    return Model(small, info, model.tokenizer, image_mean=model.image_mean, image_std=model.image_std,
                 image_size=model.image_size, decoder=model.decoder, kept=keep)


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
                  progress=None, should_stop=None, max_seconds: float | None = None) -> Curve:
    """Remove heads in steps of `step` (share of the model's heads), in order of importance
    (re-estimated under the current mask after every step) and in random orders (one per seed).
    Masked outputs equal pruned outputs, so the curve runs on masks of the one model.
    `normalised`: rank by the per-layer normalised score (Michel et al.) or by the raw one.
    Stops (complete=False) at `should_stop()` or after `max_seconds`, which can never exceed
    LIMITS.max_importance_seconds (see `importance.time_budget`)."""
    from attnviz.analysis.importance import Stop, evaluate, head_importance, primary_metric, reference
    stop = Stop(should_stop, max_seconds)
    fractions = _fraction_steps(max_fraction, step)
    ref = reference(model, data, batch)
    alive = model.kept.clone()
    n_alive = int(alive.sum())
    curve = Curve(pd.DataFrame(), primary_metric(model), 0, len(fractions) * (1 + len(seeds)),
                  max_seconds=stop.deadline.seconds)
    rows = []

    def record(order, seed, fraction, keep):
        metrics = evaluate(model, data, keep.float(), ref, batch)
        rows.append(dict(order=order, seed=seed, fraction=fraction, removed=int((alive & ~keep).sum()),
                         **metrics))
        curve.table = pd.DataFrame(rows)
        curve.masks[(order, seed, fraction)] = keep.clone()
        curve.done += 1
        if progress is not None:
            progress(curve.done, curve.total, curve)

    keep = alive.clone()
    for fraction in fractions:  # importance order, re-estimated after each step
        if stop():
            curve.stopped = stop.reason
            return curve
        target = min(n_alive - 1, round(fraction * n_alive))  # one head always stays
        extra = target - int((alive & ~keep).sum())
        if extra > 0:
            imp = head_importance(model, data, method, keep.float(), ref, should_stop=stop)
            if stop():  # stopped inside: a partial ranking would put a wrong point on the curve
                curve.stopped = stop.reason
                return curve
            scores = torch.where(keep, imp.ranking(normalised).nan_to_num(0.0), torch.tensor(float("inf")))
            drop = torch.argsort(scores.flatten(), stable=True)[:extra]
            keep = keep.flatten().clone()
            keep[drop] = False
            keep = keep.view_as(alive)
        record("importance", -1, fraction, keep)
    positions = torch.nonzero(alive.flatten()).flatten()
    for seed in seeds:
        order = positions[torch.randperm(n_alive, generator=torch.Generator().manual_seed(int(seed)))]
        for fraction in fractions:
            if stop():
                curve.stopped = stop.reason
                return curve
            target = min(n_alive - 1, round(fraction * n_alive))
            keep = alive.flatten().clone()
            keep[order[:target]] = False
            record("random", int(seed), fraction, keep.view_as(alive))
    return curve


# ---------------------------------------------------------------- speed-up
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


def _time_forward(model, ids, repeats: int) -> list[float]:
    import time
    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.net(input_ids=ids)
            times.append(time.perf_counter() - t0)
    return times


def _quartiles(values) -> tuple[float, float, float]:
    q = torch.tensor(values, dtype=torch.float64).quantile(torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
    return float(q[0]), float(q[1]), float(q[2])


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

    def modelled(self, devices=("pi4", "pi5")) -> pd.DataFrame | None:
        """Raspberry Pi latency of both models from `attnviz.costmodel` (None where that module is
        absent): one row per device and sequence length."""
        try:
            from attnviz.latency import costmodel
        except ImportError:
            return None
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
    `forward_flops` is given next to it."""
    keep = check_keep(keep, model.cfg.n_layers, model.cfg.n_heads) & model.kept
    if not keep.any():
        raise ValueError("the mask removes every head; keep at least one to build a pruned model")
    if int(repeats) < MIN_REPEATS:
        raise ValueError(f"{int(repeats)} run(s) per length give no median worth the name: use at least "
                         f"{MIN_REPEATS} (a single run on a busy machine can be off by several times)")
    if model.cfg.is_vision or not model.cfg.vocab_size:
        raise ValueError("speed-up measurement takes text models")
    repeats, warmup = int(repeats), max(1, int(warmup))
    small = model.prune(keep)
    with warnings.catch_warnings():  # zero-width projections of the all-pruned twin are intended
        warnings.simplefilter("ignore", UserWarning)
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
                _time_forward(m, ids, 1)
        times = ([], [], [])
        for r in range(repeats):
            order = (0, 1, 2) if r % 2 == 0 else (2, 1, 0)
            for i in order:
                times[i].extend(_time_forward(models[i], ids, 1))
        (f1, t_full, f3), (p1, t_small, p3), (_, t_none, _) = (_quartiles(t) for t in times)
        s1, speedup, s3 = _quartiles([a / b for a, b in zip(times[0], times[1])])
        share = min(1.0, max(0.0, 1 - t_none / t_full))
        f_full, f_small = forward_flops(model.cfg, n), forward_flops(small.cfg, n)
        flop_share = f_full["attention"] / f_full["total"]
        rows.append(dict(tokens=n, runs=repeats, full_ms=1e3 * t_full, full_ms_q1=1e3 * f1, full_ms_q3=1e3 * f3,
                         pruned_ms=1e3 * t_small, pruned_ms_q1=1e3 * p1, pruned_ms_q3=1e3 * p3,
                         speedup=speedup, speedup_q1=s1, speedup_q3=s3,
                         no_attention_ms=1e3 * t_none, attention_share=share, bound=1 / (1 - share * (1 - k)),
                         attention_share_flops=flop_share, flops_speedup=f_full["total"] / f_small["total"]))
        if progress is not None:
            progress(j + 1, len(lengths), None)
    return Speedup(model.num_params(), small.num_params(), int(keep.sum()), int(model.kept.sum()),
                   pd.DataFrame(rows), complete=len(rows) == len(lengths), cfg_full=model.cfg,
                   cfg_pruned=small.cfg)


def noisy_lengths(table: pd.DataFrame, spread: float = 1.25) -> list[int]:
    """Sequence lengths whose speed-up is not settled: the IQR of the per-round ratios spans more
    than a factor `spread`, or the median lies above its Amdahl bound (beyond 5 %)."""
    if table.empty:
        return []
    wide = table["speedup_q3"] > spread * table["speedup_q1"]
    above = table["speedup"] > 1.05 * table["bound"]
    return [int(n) for n in table.loc[wide | above, "tokens"]]


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
    import re
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
