"""Figures of the Readouts page: the logit lens, logit attribution, per-head maps, generation rows.

Arrays in, plotly figures out. Token axes use integer positions with `ticktext` (repeated tokens
stay distinct); a layer x head map puts layer 0 at the top, as the head editor does.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.base import names
from attnviz.figures.attention_figures import MAX_TICK_LABELS, token_label
from attnviz.figures.render import tick_positions

LENS_TEXT_MAX_CELLS = 2500  # beyond this many cells the top-token text is left to the hover (unreadable anyway)


def token_axis(tokens: list[str], max_ticks: int = MAX_TICK_LABELS) -> dict:
    """Integer positions labelled with (every k-th) token."""
    positions = tick_positions(len(tokens), max_ticks)
    return dict(tickmode="array", tickvals=positions, ticktext=[token_label(tokens[i]) for i in positions])


def _numpy(values) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().cpu().float().numpy()
    return np.asarray(values)


LENS_FONT = 12   # the cells' top tokens: 9 px was too small to read at the page's width


def lens_figure(final_probs, top_labels: list[list[str]], top_probs, tokens: list[str], rows: list[str],
                final_labels: list[str], title: str = "") -> go.Figure:
    """Layers x positions: colour = the probability each layer gives the model's final prediction
    at that position, text = that layer's top token. Invisible markers carry [row, position] for
    clicks (Streamlit reports scatter points, not heatmap cells)."""
    z = _numpy(final_probs)
    n_rows, n = z.shape
    if (n_rows, n) != (len(rows), len(tokens)):
        raise ValueError(f"probabilities {z.shape} do not match {len(rows)} rows x {len(tokens)} tokens")
    top = np.array([[token_label(t) for t in row] for row in top_labels], dtype=object)      # (rows, n)
    final = np.array([token_label(t) for t in final_labels], dtype=object)[None, :].repeat(n_rows, 0)
    tp = _numpy(top_probs)
    custom = np.stack([top, tp.round(4).astype(object), final], -1)                           # (rows, n, 3)
    heatmap = go.Heatmap(z=z, x=np.arange(n), y=np.arange(n_rows), zmin=0, zmax=1, colorscale="Blues",
                         customdata=custom, colorbar=dict(title="p(final)"),
                         hovertemplate=("%{y}: position %{x}<br>top: %{customdata[0]} (%{customdata[1]})"
                                        "<br>final prediction %{customdata[2]}: %{z:.4f}<extra></extra>"))
    if n_rows * n <= LENS_TEXT_MAX_CELLS:
        heatmap.text = top
        heatmap.texttemplate = "%{text}"
        heatmap.textfont = dict(size=LENS_FONT)
    figure = go.Figure(heatmap)
    gx, gy = np.meshgrid(np.arange(n), np.arange(n_rows))
    figure.add_trace(go.Scatter(x=gx.ravel(), y=gy.ravel(), mode="markers", hoverinfo="skip", showlegend=False,
                                customdata=np.stack([gy.ravel(), gx.ravel()], -1),
                                marker=dict(symbol="square", size=14, color="rgba(0,0,0,0)")))
    figure.update_xaxes(title="position (token)", tickangle=-60, **token_axis(tokens))
    figure.update_yaxes(title="residual after", tickmode="array", tickvals=list(range(n_rows)), ticktext=rows,
                        autorange="reversed")
    figure.update_layout(title=title, clickmode="event+select", height=int(np.clip(26 * n_rows + 180, 360, 1400)),
                         margin=dict(l=10, r=10, t=50 if title else 20, b=10))
    return figure


def head_map(values, title: str = "", colorbar: str = "", diverging: bool = False,
             mlps=None) -> go.Figure:
    """A layer x head map of one number per head (hover names the head); with `mlps` [L], a
    one-column map of the MLPs beside it on the same colour scale."""
    z = _numpy(values)
    L, H = z.shape
    hover = np.array([[names.head_name(i, h) for h in range(H)] for i in range(L)], dtype=object)
    both = z if mlps is None else np.concatenate([z.ravel(), _numpy(mlps).ravel()])
    bound = float(np.nanmax(np.abs(both))) if both.size else 1.0
    scale = dict(colorscale="RdBu", zmid=0, zmin=-bound, zmax=bound) if diverging else dict(colorscale="Viridis")
    cells = go.Heatmap(z=z, x=np.arange(H), y=np.arange(L), customdata=hover, colorbar=dict(title=colorbar),
                       hovertemplate="%{customdata}: %{z:.4f}<extra></extra>", **scale)
    if mlps is None:
        figure = go.Figure(cells)
    else:
        figure = make_subplots(rows=1, cols=2, column_widths=[0.85, 0.15], shared_yaxes=True,
                               horizontal_spacing=0.03, subplot_titles=("heads", "MLP"))
        figure.add_trace(cells, 1, 1)
        m = _numpy(mlps)[:, None]
        figure.add_trace(go.Heatmap(z=m, x=[0], y=np.arange(L), showscale=False,
                                    customdata=np.array([[f"L{i} MLP"] for i in range(L)], dtype=object),
                                    hovertemplate="%{customdata}: %{z:.4f}<extra></extra>", **scale), 1, 2)
        figure.update_xaxes(showticklabels=False, row=1, col=2)
    figure.update_xaxes(title="head", tickmode="array", tickvals=list(range(H)), row=1, col=1) if mlps is not None \
        else figure.update_xaxes(title="head", tickmode="array", tickvals=list(range(H)))
    figure.update_yaxes(title="layer", autorange="reversed")
    figure.update_layout(title=title, height=int(np.clip(18 * L + 160, 320, 900)),
                         margin=dict(l=10, r=10, t=60 if title else 30, b=10))
    return figure


def rows_figure(rows, tokens: list[str], title: str = "") -> go.Figure:
    """One query's attention rows of every head of a layer: [H, S] heads x keys."""
    z = _numpy(rows)
    H, S = z.shape
    if S != len(tokens):
        raise ValueError(f"{S} keys but {len(tokens)} token labels")
    labels = np.array([token_label(t) for t in tokens], dtype=object)[None, :].repeat(H, 0)
    figure = go.Figure(go.Heatmap(z=z, x=np.arange(S), y=np.arange(H), zmin=0, colorscale="Viridis",
                                  customdata=labels, colorbar=dict(title="weight"),
                                  hovertemplate="head %{y} → %{customdata} (%{x}): %{z:.4f}<extra></extra>"))
    figure.update_xaxes(title="key", tickangle=-60, **token_axis(tokens))
    figure.update_yaxes(title="head", tickmode="array", tickvals=list(range(H)), autorange="reversed")
    figure.update_layout(title=title, height=int(np.clip(22 * H + 200, 280, 700)),
                         margin=dict(l=10, r=10, t=50 if title else 20, b=10))
    return figure
