"""Figures and small analyses for the Latency page: pure functions from result tables (the CSV
schema of `attnviz.bench`) to plotly figures. No Streamlit, no timing.

A series is one (model, variant, heads, threads, backend); legends name only what varies.
Measured series are solid with p10-p90 error bars; modelled ones are dashed. Names from a CSV
(models, variants) are escaped: plotly draws <a href>, <b> and friends in legends and labels.
"""
from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attnviz.latency import costmodel as cm
from attnviz.latency.costmodel import GROUPS
from attnviz.latency.results import row_config

SERIES = ["model", "variant", "n_heads", "threads", "backend"]
GROUP_COLOURS = {"attention": "#d62728", "projections": "#1f77b4", "mlp": "#2ca02c", "other": "#7f7f7f"}


def _text(value) -> str:
    """User text (a CSV's model names) for a plotly label: shown as typed, never as a link or markup."""
    return html.escape(str(value), quote=False)


def _series(df: pd.DataFrame):
    """(label, rows sorted by n) per series; the label holds only the keys that vary."""
    varying = [k for k in SERIES if k in df.columns and df[k].nunique() > 1] or ["model"]
    for key, rows in df.groupby(varying, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        parts = [f"{v} heads" if k == "n_heads" else f"{v} thr" if k == "threads" else
                 str(v).removeprefix("synthetic:") for k, v in zip(varying, key)]
        yield _text(" · ".join(parts)), rows.sort_values("seq_len")


def _line(rows, y, label, measured: bool, error=False, mode="lines+markers") -> go.Scatter:
    extra = {}
    if error and measured and {"p10_ms", "p90_ms"} <= set(rows.columns):
        extra["error_y"] = dict(type="data", symmetric=False, array=rows["p90_ms"] - rows["median_ms"],
                                arrayminus=rows["median_ms"] - rows["p10_ms"], thickness=1)
    return go.Scatter(x=rows["seq_len"], y=rows[y], name=label, mode=mode,
                      line=dict(dash="solid" if measured else "dash"), **extra)


def _layout(fig: go.Figure, title: str, y: str, log: bool = False) -> go.Figure:
    fig.update_layout(title=title, xaxis_title="sequence length n (tokens)", yaxis_title=y,
                      legend=dict(orientation="h", yanchor="top", y=-0.18), margin=dict(t=50, b=10),
                      hovermode="x unified")
    if log:
        fig.update_xaxes(type="log")
        fig.update_yaxes(type="log")
    return fig


def latency_figure(df: pd.DataFrame, log: bool = False) -> go.Figure:
    """Median latency versus n, every series; p10-p90 bars on measured points."""
    fig = go.Figure([_line(rows, "median_ms", label, bool(rows["measured"].iloc[0]), error=True)
                     for label, rows in _series(df)])
    return _layout(fig, "Latency of one forward pass" + (" (log-log: slope 1 linear, 2 quadratic)" if log else ""),
                   "milliseconds", log)


def memory_figure(df: pd.DataFrame, log: bool = False) -> go.Figure:
    rows_with = df.dropna(subset=["peak_mem_mb"])
    fig = go.Figure([_line(rows, "peak_mem_mb", label, bool(rows["measured"].iloc[0]))
                     for label, rows in _series(rows_with)])
    return _layout(fig, "Peak memory of the activations (weights excluded)", "MB", log)


def throughput_figure(df: pd.DataFrame) -> go.Figure:
    fig = go.Figure([_line(rows, "tokens_per_s", label, bool(rows["measured"].iloc[0]))
                     for label, rows in _series(df)])
    return _layout(fig, "Tokens per second (n / latency)", "tokens / s")


def split_figure(split: pd.DataFrame, title: str = "Where the time goes (cost model)") -> go.Figure:
    """Stacked time per group versus n; `split` has seq_len and one `{group}_ms` column per group."""
    split = split.sort_values("seq_len")
    total = split[[f"{g}_ms" for g in GROUPS]].sum(axis=1)
    fig = go.Figure()
    for g in GROUPS:
        share = 100 * split[f"{g}_ms"] / total
        fig.add_bar(x=split["seq_len"].astype(str), y=split[f"{g}_ms"], name=g, marker_color=GROUP_COLOURS[g],
                    customdata=share, hovertemplate=f"{g}: %{{y:.1f}} ms (%{{customdata:.0f}}%)<extra></extra>")
    fig.update_layout(barmode="stack", title=title, xaxis_title="sequence length n (tokens)",
                      yaxis_title="milliseconds", margin=dict(t=50, b=10), xaxis_type="category")
    return fig


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


def fit_figure(ns, ms, label: str = "measured", attention_n: float | None = None) -> go.Figure:
    """Points, the fitted a + b n + c n^2, its crossover, and (optional) the cost model's n where
    attention takes half the time."""
    a, b, c = fit_quadratic(ns, ms)
    grid = np.linspace(min(ns), max(ns), 200)
    fig = go.Figure([go.Scatter(x=list(ns), y=list(ms), mode="markers", name=_text(label)),
                     go.Scatter(x=grid, y=a + b * grid + c * grid ** 2, mode="lines",
                                name=f"{a:.3g} + {b:.3g}·n + {c:.3g}·n²")])
    n_star = crossover_n(a, b, c)
    for x, text, dash in ((n_star, "c·n² > a + b·n", "dot"), (attention_n, "attention ≥ half (model)", "dash")):
        if x is not None:
            fig.add_vline(x=x, line_dash=dash, annotation_text=f"{text}: n≈{x:,.0f}")
    return _layout(fig, "Quadratic fit of latency", "milliseconds")


# ---------------------------------------------------------------- comparisons and model error
def modelled_like(df: pd.DataFrame, profile: cm.DeviceProfile, backend: str | None = None) -> pd.DataFrame:
    """The profile's prediction for every measured row: same model, shape, variant, heads, threads, n.
    Each distinct point is modelled once, however many rows repeat it (a long CSV repeats a few)."""
    measured = df[df["measured"]]
    keys = ["shape", "n_heads", "seq_len", "variant", "threads"]
    points = measured[keys].drop_duplicates().reset_index(drop=True)
    preds = []
    for shape, k, n, variant, t in points.itertuples(index=False, name=None):
        cfg = row_config({"shape": shape, "n_heads": k})
        pred = cm.predict(cfg, int(n), profile, variant, threads=int(t))
        preds.append(dict(median_ms=pred.total_ms, peak_mem_mb=cm.activation_mb(cfg, int(n), variant),
                          **{f"{g}_ms": ms for g, ms in pred.by_group.items()}))
    values = ["median_ms", "peak_mem_mb"] + [f"{g}_ms" for g in GROUPS]
    points = points.join(pd.DataFrame(preds, columns=values))
    out = measured.drop(columns=[c for c in values if c in measured.columns]).merge(points, on=keys, how="left")
    out["backend"] = backend or profile.name
    out["measured"] = False
    out["p10_ms"] = out["p90_ms"] = out["median_ms"]
    out["tokens_per_s"] = out["seq_len"] / out["median_ms"] * 1e3
    return out.reindex(columns=df.columns)


def split_table(cfg, ns, profile: cm.DeviceProfile, variant=None) -> pd.DataFrame:
    """The cost model's time per group for each n: what `split_figure` draws."""
    return pd.DataFrame([{"seq_len": n, **{f"{g}_ms": ms for g, ms in cm.predict(cfg, int(n), profile, variant)
                                           .by_group.items()}} for n in ns])


def recalibrate_from(df: pd.DataFrame, profile: cm.DeviceProfile) -> cm.DeviceProfile:
    """The profile fitted to a CSV's measured rows (see `costmodel.recalibrate`)."""
    configs, points = {}, []
    rows = df[df["measured"]][["shape", "n_heads", "seq_len", "variant", "threads", "median_ms"]]
    for shape, k, n, variant, threads, ms in rows.itertuples(index=False, name=None):
        if (shape, k) not in configs:  # a long CSV repeats a few shapes
            configs[(shape, k)] = row_config({"shape": shape, "n_heads": k})
        points.append((configs[(shape, k)], n, variant, threads, ms))
    return cm.recalibrate(profile, points)


def model_error(df: pd.DataFrame, profile: cm.DeviceProfile) -> pd.DataFrame:
    """Measured rows against the profile's prediction: one row per point with the error in %."""
    measured = df[df["measured"]].reset_index(drop=True)
    modelled = modelled_like(measured, profile)
    out = measured[["model", "variant", "n_heads", "threads", "seq_len"]].copy()
    out["measured_ms"], out["modelled_ms"] = measured["median_ms"], modelled["median_ms"]
    out["error_pct"] = 100 * (out["modelled_ms"] / out["measured_ms"] - 1)
    return out


def compare(df: pd.DataFrame) -> pd.DataFrame:
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


def comparison_figure(cmp: pd.DataFrame) -> go.Figure:
    labels = [_text(f"{r.comparison} · {str(r.model).removeprefix('synthetic:')} · {r.variant} · {r.backend}")
              for r in cmp.itertuples()]
    fig = go.Figure(go.Bar(x=cmp["speedup"], y=labels, orientation="h",
                           text=[f"{s:.2f}×" for s in cmp["speedup"]], textposition="auto"))
    fig.add_vline(x=1.0, line_dash="dot")
    fig.update_layout(title="Speed-ups (above 1: the change is faster)", xaxis_title="speed-up ×",
                      height=max(250, 28 * len(cmp) + 120), margin=dict(t=50, b=10))
    return fig


def overlay_figure(measured: pd.DataFrame, modelled: pd.DataFrame, title: str) -> go.Figure:
    """Measured points (with p10-p90) against the model's curves for the same series."""
    fig = go.Figure()
    for label, rows in _series(measured):
        fig.add_trace(_line(rows, "median_ms", f"{label} measured", True, error=True, mode="markers"))
    for label, rows in _series(modelled):
        fig.add_trace(_line(rows, "median_ms", f"{label} modelled", False))
    return _layout(fig, title, "milliseconds", log=True)


def error_figure(err: pd.DataFrame, target_pct: float = 15.0) -> go.Figure:
    """Model error (%) versus n per model and variant, with the ± target band."""
    fig = go.Figure()
    for (model, variant), rows in err.groupby(["model", "variant"]):
        rows = rows.sort_values("seq_len")
        fig.add_scatter(x=rows["seq_len"], y=rows["error_pct"], mode="lines+markers",
                        name=_text(f"{model} · {variant}"))
    fig.add_hrect(y0=-target_pct, y1=target_pct, fillcolor="green", opacity=0.1, line_width=0)
    fig.update_xaxes(type="log")
    return _layout(fig, f"Cost model error against measurement (band: ±{target_pct:g}%)", "error %")
