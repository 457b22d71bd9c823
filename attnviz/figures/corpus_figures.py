"""Figures of corpus runs: the pruning curve with its intervals, head importance over a corpus, and
a bar per metric (a scored mask, 4 vs 8 heads) with its interval. Tables in, plotly figures out."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go


def _error(frame: pd.DataFrame) -> dict:
    return dict(type="data", symmetric=False, array=(frame["ci_high"] - frame["value"]).to_numpy(float),
                arrayminus=(frame["value"] - frame["ci_low"]).to_numpy(float))


def curve_figure(summary: pd.DataFrame, metric: str, mark: float | None = None) -> go.Figure:
    """`metric` against the fraction of heads removed, one line per order (importance, random k),
    each point with its 95 % interval over the corpus; `mark` draws the fraction of the claim."""
    chosen = summary[summary["metric"] == metric]
    fig = go.Figure()
    for order, part in chosen.groupby("order", sort=False):
        part = part.sort_values("fraction")
        importance = order == "importance"
        fig.add_trace(go.Scatter(x=part["fraction"].to_numpy(float), y=part["value"].to_numpy(float),
                                 mode="lines+markers", name=str(order), error_y=_error(part),
                                 line=dict(width=3 if importance else 1, dash=None if importance else "dot")))
    if mark is not None:
        fig.add_vline(x=float(mark), line=dict(color="grey", dash="dash"),
                      annotation_text=f"{mark:.0%} of heads removed", annotation_position="top")
    fig.update_layout(xaxis_title="fraction of heads removed", yaxis_title=metric, xaxis_tickformat=".0%",
                      title=f"{metric} over the corpus (95 % intervals)", height=420, legend_title="order")
    return fig


def importance_figure(scores, title: str = "head importance over the corpus") -> go.Figure:
    """A layers x heads heatmap of corpus importance (normalised per layer)."""
    z = np.asarray(scores, dtype=float)
    L, H = z.shape
    fig = go.Figure(go.Heatmap(z=z, x=list(range(H)), y=list(range(L)), colorscale="Viridis",
                               colorbar=dict(title="importance"),
                               hovertemplate="layer %{y}, head %{x}: %{z:.3f}<extra></extra>"))
    fig.update_layout(xaxis_title="head", yaxis_title="layer", yaxis_autorange="reversed", title=title,
                      height=max(260, 24 * L + 120))
    return fig


def metrics_figure(summary: pd.DataFrame, title: str) -> go.Figure:
    """One bar per metric with its 95 % interval (a scored mask, the halved model)."""
    part = summary.reset_index(drop=True)
    fig = go.Figure(go.Bar(x=part["metric"].astype(str).tolist(), y=part["value"].to_numpy(float),
                           error_y=_error(part), text=[f"{v:.3f}" for v in part["value"]], textposition="auto"))
    fig.update_layout(title=title, yaxis_title="value (against the full model)", height=360)
    return fig
