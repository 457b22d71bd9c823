"""Pure plotly builders for the lab page: arrays in, figures out (no Streamlit).

Attention patterns go through `viz.head_heatmap`; this file adds what only the lab needs:
signed matrices (weights, Q/K/V, scores), positional tables, curves against distance, training
loss, pruning curves and per-head grids. Token axes use integer positions with token tick
labels, as everywhere in attnviz, so repeated tokens stay distinct.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.layout import legend_below
from attnviz.figures.render import tick_positions
from attnviz.figures.attention_figures import HEAD_COLOURS, head_heatmap, token_label
from attnviz.figures.latency_figures import LOG_AXIS

MAX_TICKS = 40


def _np(values) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().float().cpu().numpy()
    return np.asarray(values, dtype=np.float32)


def _axis(labels: list[str] | None, n: int, title: str) -> dict:
    if labels is None:
        return dict(title=title, showgrid=False, zeroline=False)
    ticks = tick_positions(n, MAX_TICKS)
    return dict(title=title, tickmode="array", tickvals=ticks,
                ticktext=[token_label(labels[i]) for i in ticks], showgrid=False, zeroline=False)


def matrix_figure(matrix, title: str = "", row_labels: list[str] | None = None,
                  col_labels: list[str] | None = None, row_title: str = "", col_title: str = "",
                  diverging: bool = True, height: int | None = None) -> go.Figure:
    """Heatmap of any 2-D matrix: signed values on a red-blue scale centred on 0, or (diverging
    False) a 0/1 matrix such as a mask in greys. -inf cells (masked scores) are shown blank and
    named in the hover."""
    z = _np(matrix)
    if z.ndim != 2:
        raise ValueError(f"matrix must be 2-D, got shape {z.shape}")
    shown = np.where(np.isfinite(z), z, np.nan)
    finite = shown[np.isfinite(shown)]
    # colours saturate at the 99th percentile: a few outliers (learned position tables have them)
    # would otherwise wash every other cell out to white; hover still gives the exact value
    bound = float(np.percentile(np.abs(finite), 99)) if finite.size else 0.0
    bound = bound or 1.0
    scale = dict(colorscale="RdBu_r", zmid=0, zmin=-bound, zmax=bound) if diverging \
        else dict(colorscale="Greys", zmin=0, zmax=1)
    if diverging and finite.size and finite.max() <= 0 < bound:
        # one-signed (ALiBi's biases are all <= 0): the scale runs over [min, 0], the blue half
        scale = dict(colorscale="Blues_r", zmin=-bound, zmax=0)
    text = np.where(np.isneginf(z), "−∞ (masked)", "").astype(object)
    figure = go.Figure(go.Heatmap(
        z=shown, x=np.arange(z.shape[1]), y=np.arange(z.shape[0]), customdata=text, **scale,
        hovertemplate=f"{row_title or 'row'} %{{y}}, {col_title or 'column'} %{{x}}<br>"
                      "%{z:.4f} %{customdata}<extra></extra>"))
    figure.update_xaxes(**_axis(col_labels, z.shape[1], col_title), tickangle=-60 if col_labels else 0)
    figure.update_yaxes(**_axis(row_labels, z.shape[0], row_title), autorange="reversed")
    auto = int(np.clip(12 * z.shape[0] + 140, 260, 700 if row_labels is not None else 420))
    figure.update_layout(title=title, height=height or auto, margin=dict(l=10, r=10, t=40 if title else 10, b=10))
    return figure


def step_figure(step, tokens: list[str], causal: bool = False) -> go.Figure:
    """One `head_recompute.Step`: softmax patterns as attention heatmaps, everything else signed."""
    labels = {"tokens": tokens}
    title = f"{step.name}   {list(step.shape)}"
    if step.rows == step.cols == "tokens" and step.name.startswith("A ="):
        return head_heatmap(step.value, tokens, tokens, title=title, causal=causal)
    return matrix_figure(step.value, title, labels.get(step.rows), labels.get(step.cols),
                         row_title=step.rows, col_title=step.cols,
                         diverging=not step.name.startswith("mask ("))  # the 0/1 mask itself


def table_figure(table, title: str, y_title: str = "position", x_title: str = "dimension",
                 max_rows: int = 256) -> go.Figure:
    """A positional table [positions, dims] (first `max_rows` positions)."""
    return matrix_figure(_np(table)[:max_rows], title, row_title=y_title, col_title=x_title, height=420)


def similarity_figure(sim, title: str) -> go.Figure:
    return matrix_figure(sim, title, row_title="position i", col_title="position j", height=420)


def distance_curves_figure(curves: dict[str, object], y_title: str = "similarity",
                           title: str = "") -> go.Figure:
    """One line per name: value against distance |i - j| = 0, 1, 2, ..."""
    figure = go.Figure()
    for i, (name, values) in enumerate(curves.items()):
        y = _np(values)
        figure.add_trace(go.Scatter(x=np.arange(len(y)), y=y, mode="lines", name=name,
                                    line=dict(color=HEAD_COLOURS[i % len(HEAD_COLOURS)])))
    figure.update_xaxes(title="distance |i − j| (positions)")
    figure.update_yaxes(title=y_title)
    figure.update_layout(title=title, height=380, margin=dict(l=10, r=10, t=40 if title else 10, b=10))
    return figure


def loss_figure(losses, history: list[tuple[int, float]] | None = None) -> go.Figure:
    """Training loss per step on the left axis (cross-entropy, log scale) and, if measured,
    held-out exact accuracy on the right axis (linear, 0-100 %). Each axis is set on its own:
    `update_yaxes` would give the accuracy axis the loss's title and log scale too."""
    y = _np(losses)
    figure = go.Figure(go.Scatter(x=np.arange(1, len(y) + 1), y=y, mode="lines", name="loss",
                                  hovertemplate="step %{x}: loss %{y:.4g}<extra></extra>"))
    figure.update_layout(yaxis=dict(title="cross-entropy loss (nats, log scale)", **LOG_AXIS))
    if history:
        steps, acc = zip(*history)
        figure.add_trace(go.Scatter(x=steps, y=acc, mode="lines+markers", name="exact accuracy",
                                    yaxis="y2", hovertemplate="step %{x}: exact accuracy %{y:.1%}<extra></extra>"))
        figure.update_layout(yaxis2=dict(title="exact accuracy (held out)", type="linear", overlaying="y",
                                         side="right", range=[0, 1.02], tickformat=".0%", showgrid=False))
    figure.update_xaxes(title="step")
    figure.update_layout(height=320, margin=dict(l=10, r=60 if history else 10, t=10, b=10),
                         legend=legend_below(-0.2))
    return figure


def pruning_figure(rows: list[dict], title: str = "") -> go.Figure:
    """Exact accuracy against heads switched off (rows from `toys.pruning_curve`)."""
    x = [r["pruned"] for r in rows]
    y = [r["exact"] for r in rows]
    names = [r["head"] or "none" for r in rows]
    figure = go.Figure(go.Scatter(x=x, y=y, mode="lines+markers", customdata=names,
                                  hovertemplate="%{x} heads off (last: %{customdata})<br>"
                                                "exact accuracy %{y:.1%}<extra></extra>"))
    figure.update_xaxes(title="heads switched off (least important first)", dtick=max(1, len(x) // 16))
    figure.update_yaxes(title="exact accuracy", range=[0, 1.02], tickformat=".0%")
    figure.update_layout(title=title, height=340, margin=dict(l=10, r=10, t=40 if title else 10, b=10))
    return figure


def head_grid_figure(values, title: str = "", zmin: float = 0.0, zmax: float = 1.0,
                     fmt: str = ".2f", colorscale: str = "Viridis") -> go.Figure:
    """A [layers, heads] grid of numbers, each cell annotated."""
    z = _np(values)
    figure = go.Figure(go.Heatmap(z=z, x=np.arange(z.shape[1]), y=np.arange(z.shape[0]), zmin=zmin,
                                  zmax=zmax, colorscale=colorscale, texttemplate=f"%{{z:{fmt}}}",
                                  xgap=2, ygap=2,
                                  hovertemplate=f"layer %{{y}}, head %{{x}}: %{{z:{fmt}}}<extra></extra>"))
    figure.update_xaxes(title="head", dtick=1, showgrid=False)
    figure.update_yaxes(title="layer", dtick=1, autorange="reversed", showgrid=False)
    figure.update_layout(title=title, height=int(np.clip(50 * z.shape[0] + 140, 200, 600)),
                         margin=dict(l=10, r=10, t=40 if title else 10, b=10))
    return figure


def bars_figure(labels: list[str], values, title: str = "", x_title: str = "",
                fmt: str = ".3g") -> go.Figure:
    """Horizontal bars, first label at the top."""
    v = _np(values)
    figure = go.Figure(go.Bar(x=v, y=np.arange(len(labels)), orientation="h",
                              text=[format(float(a), fmt) for a in v], textposition="auto",
                              hovertemplate="%{x}<extra></extra>"))
    figure.update_yaxes(tickmode="array", tickvals=np.arange(len(labels)), ticktext=labels,
                        autorange="reversed")
    figure.update_xaxes(title=x_title, rangemode="tozero")
    figure.update_layout(title=title, height=int(np.clip(40 * len(labels) + 100, 180, 500)),
                         margin=dict(l=10, r=10, t=40 if title else 10, b=10))
    return figure
