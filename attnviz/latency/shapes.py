"""Shapes the cost model prices beyond a plain transformer `Config`: a network known only by its
published FLOP and parameter counts (a CNN of the ncnn benchmark, anything else), and a bottleneck
transformer (MobileBERT: blocks that run at a narrow width between linear maps from and to a wider
inter-block width, with several feed-forward networks stacked in each block).

Written as text like the CSV's synthetic shapes:
  synthetic:gflops=8.2,mparams=25.6[,calls=200]          (explicit count: 8.2 GFLOP, 25.6 M weights)
  synthetic:layers=24,d=512,bottleneck=128,heads=4,ff=512,ffns=4[,vocab=..,positions=..]
Anything else is `results.parse_synthetic`'s plain shape. Each shape answers `op_counts(n, variant)`,
which `costmodel.op_counts` calls, so `predict` prices all of them the same way.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from attnviz.core.attention import parse_variant
from attnviz.core.config import Config
from attnviz.latency.costmodel import F32, Op, gemm_op, layer_ops, op_counts
from attnviz.latency.results import parse_synthetic

MAX_GFLOPS, MAX_MPARAMS, MAX_CALLS = 1e6, 1e6, 1e6  # a PFLOP per pass, a trillion weights: beyond any model


@dataclass(frozen=True)
class FlopShape:
    """A network known by its FLOP count per pass (2 x multiply-adds, as published) and weights.
    Priced as one matrix product of that work (so the engine's work factor applies), reading its
    weights once, with `calls` kernel launches paying the per-call overhead."""
    gflops: float
    mparams: float
    calls: int = 100

    def op_counts(self, n: int, variant=None) -> list[tuple[Op, int]]:
        rows = 256  # a convolution's im2col rows: well above half_rows on every profile
        return [(Op("network (explicit FLOP count)", "other", "gemm", self.gflops * 1e9, 0.0, rows=rows,
                    calls=self.calls, weights=self.mparams * 1e6), 1)]


@dataclass(frozen=True)
class Bottleneck:
    """MobileBERT-like: `inner` is the block's shape at its narrow width (d_model = the bottleneck);
    `outer` the inter-block width; `ffns` feed-forward networks stacked in each block."""
    inner: Config
    outer: int
    ffns: int = 1

    def op_counts(self, n: int, variant=None) -> list[tuple[Op, int]]:
        cfg, v, d, b = self.inner, parse_variant(variant), self.outer, self.inner.d_model
        out = [(Op("embeddings", "other", "vector", 2 * n * d, 5 * F32 * n * d, calls=4), 1),
               (gemm_op("embedding projection", "other", n, 3 * b, d), 1)]
        block = [gemm_op("input bottleneck", "projections", n, d, b), gemm_op("attention bottleneck", "projections",
                                                                             n, d, b)]
        block += layer_ops(cfg, n, v, cfg.n_heads, cfg.n_kv_heads)
        mlp = [op for op in block if op.group == "mlp"]
        block += mlp * (self.ffns - 1)
        block.append(gemm_op("output bottleneck", "projections", n, b, d))
        out += [(op, cfg.n_layers) for op in block]
        if cfg.vocab_size and cfg.task == "lm":
            out.append((gemm_op("LM head", "other", n, d, cfg.vocab_size), 1))
        return out


def _numbers(spec: str, keys: tuple[str, ...]) -> dict[str, float]:
    body = spec.strip().removeprefix("synthetic:")
    try:
        pairs = dict(part.split("=", 1) for part in body.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"shape {spec[:80]!r}: write key=value pairs, e.g. synthetic:gflops=8.2,mparams=25.6") from None
    pairs = {k.strip().lower(): v.strip() for k, v in pairs.items()}
    unknown = set(pairs) - set(keys)
    if unknown:
        raise ValueError(f"shape {spec[:80]!r}: unknown keys {sorted(unknown)}; this shape takes {', '.join(keys)}")
    out = {}
    for k, v in pairs.items():
        if not re.fullmatch(r"[0-9]*\.?[0-9]+(e[+-]?[0-9]+)?", v.lower()) or not math.isfinite(float(v)):
            raise ValueError(f"shape {spec[:80]!r}: {k} must be a positive number; got {v[:20]!r}")
        out[k] = float(v)
    return out


def parse_shape(spec: str):
    """A Config, FlopShape or Bottleneck from text (see the module docstring); ValueError says what is wrong."""
    if not isinstance(spec, str):
        raise ValueError("write a shape as text, e.g. synthetic:layers=6,d=384,heads=8")
    keys = {part.split("=", 1)[0].strip().lower() for part in spec.strip().removeprefix("synthetic:").split(",")}
    if "gflops" in keys:
        num = _numbers(spec, ("gflops", "mparams", "calls"))
        if not 0 < num["gflops"] <= MAX_GFLOPS or not 0 <= num.get("mparams", 0) <= MAX_MPARAMS:
            raise ValueError(f"shape {spec[:80]!r}: gflops must lie in (0, {MAX_GFLOPS:g}] and mparams in "
                             f"[0, {MAX_MPARAMS:g}]")
        calls = int(num.get("calls", 100))
        if not 1 <= calls <= MAX_CALLS:
            raise ValueError(f"shape {spec[:80]!r}: calls must lie in [1, {MAX_CALLS:g}]")
        return FlopShape(num["gflops"], num.get("mparams", 0.0), calls)
    if "bottleneck" in keys:
        parts = [p for p in spec.strip().removeprefix("synthetic:").split(",") if p.strip()]
        extra = {p.split("=", 1)[0].strip().lower(): p.split("=", 1)[1].strip() for p in parts if "=" in p}
        if not re.fullmatch(r"[0-9]+", extra["bottleneck"]) or not re.fullmatch(r"[0-9]+", extra.get("ffns", "1")):
            raise ValueError(f"shape {spec[:80]!r}: bottleneck and ffns must be whole numbers")
        b, ffns = int(extra["bottleneck"]), int(extra.get("ffns", "1"))
        if not 1 <= ffns <= 16:
            raise ValueError(f"shape {spec[:80]!r}: ffns must lie in [1, 16]")
        rest = {k: v for k, v in extra.items() if k not in ("bottleneck", "ffns")}
        if "d" not in rest:
            raise ValueError(f"shape {spec[:80]!r}: give d (the inter-block width) with bottleneck")
        outer, rest["d"] = rest["d"], str(b)
        inner = parse_synthetic("synthetic:" + ",".join(f"{k}={v}" for k, v in rest.items()))
        return Bottleneck(inner, int(parse_synthetic(f"synthetic:layers=1,d={outer},heads=1").d_model), ffns)
    return parse_synthetic(spec)


def shape_flops(shape, n: int, variant=None) -> float:
    """FLOPs of one pass of any shape on n tokens."""
    return sum(count * op.flops for op, count in op_counts(shape, n, variant))
