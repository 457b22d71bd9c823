"""Figures of the Lab's training-time experiments: loss and held-out accuracy against the
baseline's, the share of heads that carries 90 % of the gradient, and the heads' diagonal mass
(collapse). Pure functions from numbers to plotly figures."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.figures.latency_figures import LOG_AXIS
from attnviz.figures.layout import legend_below

SMOOTH = 10   # steps in the loss's moving average: per-step losses of fresh batches are noisy


def smoothed(values, window: int = SMOOTH) -> np.ndarray:
    """Trailing moving average (the first points average what they have)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return v
    c = np.cumsum(np.insert(v, 0, 0.0))
    i = np.arange(1, v.size + 1)
    lo = np.maximum(0, i - window)
    return (c[i] - c[lo]) / (i - lo)


def curves_figure(runs: dict[str, tuple[list[float], list[tuple[int, float]]]], finals: dict | None = None,
                  final_n: int = 2000) -> go.Figure:
    """{label: (losses per step, [(step, exact accuracy)])}: the training loss (moving average,
    log scale) on the left, held-out exact accuracy on the right, one colour per run. `finals`
    {label: (step, exact accuracy)}: each run's final score on `final_n` prompts, drawn as a diamond
    at its last step, so the chart shows the figure the verdict sentence quotes (the curve is
    scored on 500 prompts while training and can end a few points away from it)."""
    if not runs:
        raise ValueError("no runs to draw")
    figure = make_subplots(rows=1, cols=2, subplot_titles=(f"task loss ({SMOOTH}-step average)",
                                                           "exact accuracy: 500 held-out prompts while "
                                                           f"training{f', ◆ final on {final_n:,}' if finals else ''}"))
    for i, (label, (losses, history)) in enumerate(runs.items()):
        colour = f"hsl({(i * 137) % 360}, 65%, 45%)"
        figure.add_trace(go.Scatter(x=np.arange(1, len(losses) + 1), y=smoothed(losses), mode="lines",
                                    name=label, legendgroup=label, line=dict(color=colour),
                                    hovertemplate=f"{label}<br>step %{{x}}: loss %{{y:.4g}}<extra></extra>"),
                         row=1, col=1)
        if history:
            steps, acc = zip(*history)
            figure.add_trace(go.Scatter(x=steps, y=acc, mode="lines+markers", name=label, legendgroup=label,
                                        showlegend=False, line=dict(color=colour),
                                        hovertemplate=f"{label}<br>step %{{x}}: %{{y:.1%}}<extra></extra>"),
                             row=1, col=2)
        if finals and label in finals:
            step, exact = finals[label]
            figure.add_trace(go.Scatter(x=[step], y=[exact], mode="markers", name=f"{label}: final",
                                        legendgroup=label, showlegend=False,
                                        marker=dict(symbol="diamond", size=11, color=colour),
                                        hovertemplate=f"{label}<br>final, {final_n:,} prompts: %{{y:.1%}}<extra></extra>"),
                             row=1, col=2)
    figure.update_yaxes(**LOG_AXIS, title="cross-entropy (nats, log scale)", row=1, col=1)
    figure.update_yaxes(range=[0, 1.02], tickformat=".0%", row=1, col=2)
    figure.update_xaxes(title="step")
    figure.update_layout(height=360, margin=dict(l=10, r=10, t=40, b=10), legend=legend_below(-0.25))
    return figure


def shares_figure(labels: list[str], shares, claim: float = 0.3, carried: float = 0.9) -> go.Figure:
    """Bars: the share of each model's heads needed to carry `carried` of |dloss/dmask|, with the
    claim's share as a dashed line."""
    v = np.asarray(shares, dtype=np.float64)
    if len(labels) != v.size or v.size == 0:
        raise ValueError("one share per label, at least one")
    figure = go.Figure(go.Bar(x=labels, y=v, text=[f"{s:.1%}" for s in v], textposition="auto",
                              hovertemplate="%{x}: %{y:.1%} of heads<extra></extra>"))
    figure.add_hline(y=claim, line_dash="dash", annotation_text=f"the claim: {claim:.0%}",
                     annotation_position="top left")
    figure.update_yaxes(title=f"share of heads carrying {carried:.0%} of the gradient", range=[0, 1.02],
                        tickformat=".0%")
    figure.update_layout(height=340, margin=dict(l=10, r=10, t=30, b=10))
    return figure


def collapse_figure(diagonals: dict[str, object], threshold: float = 0.9) -> go.Figure:
    """Histogram of every head's diagonal mass (mean weight on its own position), one colour per
    model, the collapse threshold as a dashed line."""
    if not diagonals:
        raise ValueError("no heads to draw")
    figure = go.Figure()
    for label, values in diagonals.items():
        v = np.asarray(values.detach() if hasattr(values, "detach") else values, dtype=np.float64).ravel()
        figure.add_trace(go.Histogram(x=v, name=f"{label} ({v.size} heads)", xbins=dict(start=0, end=1.0001, size=0.05),
                                      opacity=0.7, hovertemplate="%{x}: %{y} heads<extra></extra>"))
    figure.add_vline(x=threshold, line_dash="dash", annotation_text=f"collapsed above {threshold:.0%}")
    figure.update_xaxes(title="diagonal mass (weight on the query's own position)", range=[0, 1.02],
                        tickformat=".0%")
    figure.update_yaxes(title="heads")
    figure.update_layout(barmode="overlay", height=340, margin=dict(l=10, r=10, t=30, b=10))
    return figure
