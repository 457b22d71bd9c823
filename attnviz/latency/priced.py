"""Sweep rows for shapes the cost model prices but no model can be built for (`latency.shapes`): a
network known by its FLOP and weight counts (`synthetic:gflops=..,mparams=..,calls=..`) and a
bottleneck transformer (`synthetic:layers=24,d=512,bottleneck=128,heads=4,ff=512,ffns=4`, MobileBERT).

They have no weights to run, so they are priced on the modelled backends only (pi4, pi5 at each
engine x dtype the plan chooses, cpu-model from this host's profile), never measured: the CSV rows
`python -m attnviz.bench --model synthetic:...bottleneck=... --backend pi4` writes, with the same
columns as every other modelled row. Their peak memory is not modelled (left empty).
"""
from __future__ import annotations

from datetime import datetime, timezone

import pandas as pd

from attnviz.core.attention import parse_variant
from attnviz.core.config import Config
from attnviz.latency import costmodel
from attnviz.latency.measure import machine_metadata
from attnviz.latency.results import COLUMNS, SCHEMA
from attnviz.latency.shapes import parse_shape
from attnviz.latency.sweep import PI_BACKENDS, SweepPlan, modelled_profiles

MODELLED = ("cpu-model", *PI_BACKENDS)


def is_priced_only(spec: str) -> bool:
    """True for a synthetic spec that `shapes.parse_shape` reads as something other than a Config."""
    if not isinstance(spec, str) or not spec.strip().startswith("synthetic:"):
        return False
    keys = {p.split("=", 1)[0].strip().lower() for p in spec.strip().removeprefix("synthetic:").split(",")}
    return bool(keys & {"gflops", "bottleneck"})


def priced_rows(plan: SweepPlan, spec: str, *, own_process: bool = False) -> pd.DataFrame:
    """One modelled row per backend x engine x dtype x threads x variant x length of the plan."""
    shape = parse_shape(spec)
    if isinstance(shape, Config):
        raise ValueError(f"{spec[:80]!r} is a plain transformer shape: sweep it as a model")
    measured = [b for b in plan.backends if b not in MODELLED]
    if measured:
        raise ValueError(f"{spec[:80]!r} is priced by the cost model only (it has no weights to run): choose "
                         f"--backend {', '.join(MODELLED)}, not {', '.join(measured)}")
    if plan.heads is not None:
        raise ValueError(f"{spec[:80]!r}: --heads prunes built models; a priced shape keeps its heads")
    inner = getattr(shape, "inner", None)
    meta = dict(machine_metadata(), timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    base = dict(schema=SCHEMA, model=spec.strip(), shape=spec.strip(), measured=False, repeats=plan.repeats,
                warmup=plan.warmup, clock=plan.clock, n_heads=inner.n_heads if inner is not None else 0, **meta)
    profiles = [(backend, *p) for t in plan.threads for backend in plan.backends  # (backend, engine, dtype,
                for p in modelled_profiles(plan, backend, t, own_process=own_process)]      # threads, profile)
    rows = []
    for backend, engine, dtype, threads, prof in profiles:
        for name in plan.variants:
            v = parse_variant(name)
            for n in plan.seq_lens:
                pred = costmodel.predict(shape, int(n), prof, v, threads=threads)
                rows.append(dict(base, backend=backend, engine=engine, dtype=dtype, threads=threads, variant=v.name,
                                 seq_len=int(n), median_ms=pred.total_ms, p10_ms=pred.total_ms, p90_ms=pred.total_ms,
                                 **{f"{g}_ms": ms for g, ms in pred.by_group.items()}))
    df = pd.DataFrame(rows).reindex(columns=COLUMNS)
    df["tokens_per_s"] = df["seq_len"] / (df["median_ms"] / 1e3)
    return df
