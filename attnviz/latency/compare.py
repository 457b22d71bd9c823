"""Analyses of latency results (the CSV schema of `results`): the quadratic fit and its crossover,
the cost model's twin of measured rows, its error against them, where the time goes, a profile
recalibrated from a device's CSV, and the speed-ups the results show. Tables in, tables out: the
figures that draw them are in `attnviz.figures.latency_figures`."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pandas as pd

from attnviz.latency import costmodel
from attnviz.latency.calibrate import host_profile, recalibrate
from attnviz.latency.costmodel import GROUPS
from attnviz.latency.engines import engine_profile
from attnviz.latency.results import row_config


# ---------------------------------------------------------------- fit and crossover
def fit_quadratic(ns, ms) -> tuple[float, float, float]:
    """Least-squares a + b n + c n^2 with a, b, c >= 0 (a cost cannot shrink as n grows), weighted
    by 1/ms so that short sequences count as much as long ones."""
    ns, ms = np.asarray(ns, float), np.asarray(ms, float)
    if len(ns) < 3 or len(np.unique(ns)) < 3:
        raise ValueError("the fit needs at least three different sequence lengths")
    A = np.stack([np.ones_like(ns), ns, ns ** 2], axis=1) / ms[:, None]
    best = None
    for keep in ([0, 1, 2], [1, 2], [0, 2], [0, 1], [2], [1], [0]):  # all non-negative subsets: tiny NNLS
        coef = np.zeros(3)
        coef[keep] = np.linalg.lstsq(A[:, keep], np.ones(len(ns)), rcond=None)[0]
        if (coef >= 0).all():
            err = float(((A @ coef - 1) ** 2).sum())
            best = (err, coef) if best is None or err < best[0] else best
    return tuple(float(x) for x in best[1])


def crossover_n(a: float, b: float, c: float) -> float | None:
    """The n beyond which the quadratic term c n^2 outweighs a + b n (None when c is 0)."""
    if c <= 0:
        return None
    return (b + math.sqrt(b * b + 4 * a * c)) / (2 * c)


# ---------------------------------------------------------------- the cost model against measurements
def modelled_like(df: pd.DataFrame, profile: costmodel.DeviceProfile, backend: str | None = None,
                  check: Callable[[], None] | None = None) -> pd.DataFrame:
    """The profile's prediction for every measured row: same model, shape, variant, heads, threads, n.
    Each distinct point is modelled once, however many rows repeat it (a long CSV repeats a few).
    `check` (e.g. `Deadline.check`) runs before each point and raises to stop."""
    measured = df[df["measured"]]
    for col, default in (("engine", "torch"), ("dtype", "fp32")):
        if col not in measured.columns:
            measured = measured.assign(**{col: default})
    keys = ["shape", "n_heads", "seq_len", "variant", "threads", "engine", "dtype"]
    points = measured[keys].drop_duplicates().reset_index(drop=True)
    published = costmodel.PROFILES.get(profile.name) is profile  # a published Pi profile: each row's engine on it
    preds = []
    for shape, k, n, variant, t, engine, dtype in points.itertuples(index=False, name=None):
        if check is not None:
            check()
        cfg = row_config({"shape": shape, "n_heads": k})
        prof = engine_profile(profile, str(engine), str(dtype)) if published else profile
        pred = costmodel.predict(cfg, int(n), prof, variant, threads=int(t))
        preds.append(dict(median_ms=pred.total_ms, peak_mem_mb=costmodel.activation_mb(cfg, int(n), variant),
                          **{f"{g}_ms": ms for g, ms in pred.by_group.items()}))
    values = ["median_ms", "peak_mem_mb"] + [f"{g}_ms" for g in GROUPS]
    points = points.join(pd.DataFrame(preds, columns=values))
    out = measured.drop(columns=[c for c in values if c in measured.columns]).merge(points, on=keys, how="left")
    out["backend"] = backend or profile.name
    out["measured"] = False
    out["p10_ms"] = out["p90_ms"] = out["median_ms"]
    out["tokens_per_s"] = out["seq_len"] / out["median_ms"] * 1e3
    return out.reindex(columns=df.columns)


def split_table(cfg, ns, profile: costmodel.DeviceProfile, variant=None) -> pd.DataFrame:
    """The cost model's time per group for each n: what `split_figure` draws."""
    return pd.DataFrame([{"seq_len": n, **{f"{g}_ms": ms for g, ms in costmodel.predict(cfg, int(n), profile, variant)
                                           .by_group.items()}} for n in ns])


def recalibrate_from(df: pd.DataFrame, profile: costmodel.DeviceProfile,
                     check: Callable[[], None] | None = None) -> costmodel.DeviceProfile:
    """The profile fitted to a CSV's measured rows (see `calibrate.recalibrate`); `check` runs
    between points and raises to stop."""
    configs, points = {}, []
    rows = df[df["measured"]][["shape", "n_heads", "seq_len", "variant", "threads", "median_ms"]]
    for shape, k, n, variant, threads, ms in rows.itertuples(index=False, name=None):
        if (shape, k) not in configs:  # a long CSV repeats a few shapes
            if check is not None:
                check()
            configs[(shape, k)] = row_config({"shape": shape, "n_heads": k})
        points.append((configs[(shape, k)], n, variant, threads, ms))
    return recalibrate(profile, points, check)


def model_error(df: pd.DataFrame, profile: costmodel.DeviceProfile, modelled: pd.DataFrame | None = None) -> pd.DataFrame:
    """Measured rows against the profile's prediction: one row per point with the error in %.
    `modelled`: `modelled_like(measured rows, profile)` when the caller has it already (a file's
    points are then modelled once, not once for the overlay and again here)."""
    measured = df[df["measured"]].reset_index(drop=True)
    modelled = modelled_like(measured, profile) if modelled is None else modelled.reset_index(drop=True)
    if len(modelled) != len(measured):
        raise ValueError("modelled must hold one row per measured row (modelled_like of the measured rows)")
    out = measured[["model", "variant", "n_heads", "threads", "seq_len"]].copy()
    out["measured_ms"], out["modelled_ms"] = measured["median_ms"], modelled["median_ms"]
    out["error_pct"] = 100 * (out["modelled_ms"] / out["measured_ms"] - 1)
    return out


def host_model_error(df: pd.DataFrame) -> pd.DataFrame:
    """Measured fp32 rows against this host's profile, calibrated at each row's thread count and
    clock (the host's profile is fp32's: int8 / bf16 rows are measured, not modelled, here)."""
    measured = df[df["measured"] & (df["dtype"].fillna("fp32") == "fp32" if "dtype" in df.columns else df["measured"])]
    return pd.concat([model_error(g, host_profile(int(t), str(c)))
                      for (t, c), g in measured.groupby(["threads", "clock"])], ignore_index=True)


def seed_claims(df: pd.DataFrame) -> pd.DataFrame:
    """The seeds' claims, on these results: n halved, fewer heads, each variant against fused."""
    out = []
    for (backend, model, threads), g in df.groupby(["backend", "model", "threads"]):
        base = dict(backend=backend, model=model, threads=threads)
        for (variant, heads), s in g.groupby(["variant", "n_heads"]):
            t = s.groupby("seq_len")["median_ms"].median()
            n = max((n for n in t.index if n % 2 == 0 and n // 2 in t.index), default=None)
            if n:
                out.append(dict(base, comparison=f"n {n} → {n // 2}", variant=variant, n_heads=heads,
                                seq_len=n, speedup=t[n] / t[n // 2]))
        top = g["seq_len"].max()
        at = g[g["seq_len"] == top].groupby(["variant", "n_heads"])["median_ms"].median()
        for variant in at.index.get_level_values(0).unique():
            hs = at[variant]
            for k in hs.index[hs.index < hs.index.max()]:
                out.append(dict(base, comparison=f"{hs.index.max()} → {k} heads", variant=variant, n_heads=k,
                                seq_len=top, speedup=hs[hs.index.max()] / hs[k]))
        if "fused" in at.index.get_level_values(0):
            for (variant, heads), ms in at.drop("fused", level=0).items():
                if heads in at["fused"].index:
                    out.append(dict(base, comparison=f"fused → {variant}", variant=variant, n_heads=heads,
                                    seq_len=top, speedup=at["fused"][heads] / ms))
    return pd.DataFrame(out, columns=["comparison", "backend", "model", "variant", "n_heads", "threads",
                                      "seq_len", "speedup"])


def attention_only(cfg, ns, profile: costmodel.DeviceProfile, variant="eager", measure_fn=None, model: str = "model"):
    """One layer's attention (QK^T, softmax, weights x V) against n: modelled on `profile` and, with
    `measure_fn(cfg, n, variant) -> Timing` (latency.measure.measure_attention), measured here; rows in
    the results schema (backend "attention only", threads of the profile) for `figures.latency.growth_figure`."""
    rows = []
    for n in ns:
        ms = costmodel.predict(cfg, int(n), profile, variant).by_group["attention"] / cfg.n_layers
        rows.append(dict(model=model, backend="attention only", variant=str(variant), n_heads=cfg.n_heads,
                         threads=profile.threads, seq_len=int(n), measured=False, median_ms=ms))
        if measure_fn is not None:
            t = measure_fn(cfg, int(n), variant)
            rows.append(dict(rows[-1], measured=True, median_ms=t.median_ms, p10_ms=t.p10_ms, p90_ms=t.p90_ms))
    return pd.DataFrame(rows)
