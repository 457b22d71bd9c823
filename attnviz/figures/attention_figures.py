"""Pure figure builders shared by every page: arrays in, plotly figures (or images) out.

Two rules measured in a real browser shape this file: the all-heads overview is ONE colour-mapped image
(`overview_figure`), and token axes use integer positions with `ticktext`, because repeated
tokens used as categories merge into one row. Heatmap `z` is always the caller's matrix, untouched.
Static renderers (overlays, PNG/SVG export) live in `render.py` and are re-exported here.
"""

from __future__ import annotations

import base64
import re

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from attnviz.analysis.stats import ROLES
from attnviz.figures import layout
from attnviz.figures.render import apply_colormap, image_png, overview_geometry, overview_image, tick_positions, visible_token

MAX_TICK_LABELS = 60          # beyond this, show every k-th token label (hover still names all)
HOVER_TOKEN_MAX_CELLS = 70_000  # token names in hover up to ~264 x 264 (DINOv2's 257 tokens);
                                # above that the per-cell strings would make the JSON megabytes
LINE_THRESHOLD = 0.05         # lines view: weights below this are not drawn (fast, uncluttered)
MAX_LINES = 3000              # lines view: keep at most this many of the strongest lines
OVERVIEW_MAX_HEIGHT = 1400    # px: the tallest overview figure (a 30-layer model reaches it)
ROLE_COLOURS = dict(zip(ROLES, px.colors.qualitative.Set2))
HEAD_COLOURS = px.colors.qualitative.Plotly + px.colors.qualitative.Dark24

# Plotly reads a few HTML tags and entities inside any text (<b>, <s>, <br>, &amp; ...): a BOS
# token "<s>" would vanish into a strikethrough. Only such tokens are escaped; "<|im_start|>"
# and "[CLS]" are shown as they are.
_PLOTLY_MARKUP = re.compile(r"<\s*/?\s*(br|sup|sub|s|u|b|i|a|span|em)(\s[^<>]*)?/?\s*>"
                            r"|&(#\d+|#x[\da-fA-F]+|[a-z]+);", re.IGNORECASE)


def token_label(token: str) -> str:
    """The label plotly shows for a token: visible (never blank) and free of plotly markup."""
    label = visible_token(token)
    if _PLOTLY_MARKUP.search(label):
        label = label.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return label


def _numpy(values) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    return np.asarray(values)


def _token_axis(tokens: list[str], max_ticks: int) -> dict:
    positions = tick_positions(len(tokens), max_ticks)
    # "allow": else plotly measures every label's box to hide overflow (~0.4 s a new text, 2 axes)
    return dict(tickmode="array", tickvals=positions,
                ticktext=[token_label(tokens[i]) for i in positions], showgrid=False,
                zeroline=False, ticklabeloverflow="allow")


# --- Overview ----------------------------------------------------------------------------------
def overview_cells(n_layers: int, gap: int = 2, max_cell: int = 64, min_cell: int = 32) -> int:
    """Pooled entries per axis worth capturing for a head's overview cell: the figure is at most
    OVERVIEW_MAX_HEIGHT px tall (30 layers: ~42 px a cell); finer pooling is averaged away by the
    browser at a cost in PNG bytes. Never below `min_cell`, the smallest cell drawn unenlarged."""
    fits = (OVERVIEW_MAX_HEIGHT - 60) // max(1, n_layers) - gap     # 60 px: the figure's margins
    return max(min_cell, min(max_cell, fits))


def overview_figure(attn, max_cell: int = 64, gap: int = 2, per_head: bool = True,
                    cmap: str = "viridis", off=None, selected: tuple[int, int] | None = None,
                    hover_text=None, height: int | None = None) -> go.Figure:
    """Every layer x head as one image (fast to paint), ticks at cell centres, hover naming the
    layer and head. ``off`` fades switched-off heads, ``selected`` = (layer, head) is outlined,
    ``hover_text`` ([L][H] strings, e.g. roles) adds a hover line. Selecting a cell in Streamlit
    (on_select) yields points whose customdata is [layer, head]."""
    n_layers, n_heads, n = attn.shape[0], attn.shape[1], attn.shape[-1]
    rgb = overview_image(attn, max_cell=max_cell, gap=gap, per_head=per_head, cmap=cmap, off=off)
    pooled, upscale = overview_geometry(n, max_cell)
    cell, pitch = pooled * upscale, pooled * upscale + gap
    # Image pixel k is centred on coordinate k, so a cell starting at pixel s is centred at
    # s + (cell - 1) / 2.
    x_centres = np.arange(n_heads) * pitch + (cell - 1) / 2
    y_centres = np.arange(n_layers) * pitch + (cell - 1) / 2
    source = "data:image/png;base64," + base64.b64encode(image_png(rgb)).decode("ascii")
    figure = go.Figure(go.Image(source=source, hoverinfo="skip"))
    layer_grid, head_grid = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    extra = (np.asarray(hover_text, dtype=object) if hover_text is not None
             else np.full((n_layers, n_heads), "", dtype=object))
    if extra.shape != (n_layers, n_heads):
        raise ValueError(f"hover_text must be [{n_layers}][{n_heads}], got {extra.shape}")
    # A heatmap over the image carries the hover and click targets, and the colour bar: its cells
    # are all gaps (NaN, so nothing is painted over the image; hoverongaps keeps their hover).
    figure.add_trace(go.Heatmap(
        x=x_centres, y=y_centres, z=np.full((n_layers, n_heads), np.nan, dtype=np.float32),
        customdata=np.stack([layer_grid, head_grid, extra], axis=-1), hoverongaps=True,
        colorscale=cmap, zmin=0, zmax=1, showscale=True,
        colorbar=dict(title=dict(text="share of the head's<br>largest weight" if per_head
                                 else "share of the largest<br>weight of all heads", side="right"),
                      thickness=12),
        hovertemplate="layer %{customdata[0]}, head %{customdata[1]}<br>%{customdata[2]}"
                      "<extra></extra>"))
    if selected is not None:
        layer, head = selected
        x0, y0 = head * pitch - 1.5, layer * pitch - 1.5
        figure.add_shape(type="rect", x0=x0, y0=y0, x1=x0 + cell + 2, y1=y0 + cell + 2,
                         line=dict(color="red", width=2))
    head_step = max(1, n_heads // 16)
    figure.update_xaxes(title="head", tickmode="array", tickvals=x_centres[::head_step],
                        ticktext=[str(h) for h in range(0, n_heads, head_step)],
                        showgrid=False, zeroline=False, side="top")
    figure.update_yaxes(title="layer", tickmode="array", tickvals=y_centres,
                        ticktext=[str(layer) for layer in range(n_layers)], showgrid=False,
                        zeroline=False, autorange="reversed", scaleanchor="x")
    aspect = rgb.shape[0] / rgb.shape[1]
    total = height or int(np.clip(aspect * 600 + 80, 260, OVERVIEW_MAX_HEIGHT))
    # The image keeps its aspect (scaleanchor): a figure as wide as the page would leave an empty
    # band beside a tall grid (30 layers x 9 heads), so the figure is as wide as the image drawn at
    # this height, plus the margins and the colour bar.
    margin = dict(l=50, r=10, t=50, b=10)
    plot_height = total - margin["t"] - margin["b"]
    width = int(plot_height / aspect) + margin["l"] + margin["r"] + 110
    figure.update_layout(height=total, width=max(width, 320), margin=margin, dragmode=False)
    return figure


# --- One head --------------------------------------------------------------------------------
def head_heatmap(matrix, q_tokens: list[str], k_tokens: list[str] | None = None, title: str = "",
                 causal: bool = False, zmax: float | None = None, colorscale: str = "Viridis",
                 max_ticks: int = MAX_TICK_LABELS, height: int | None = None) -> go.Figure:
    """Interactive heatmap of one [n_q, n_k] matrix (queries = rows, query 0 at the top).

    ``z`` is exactly ``matrix``; x and y are integer positions labelled with tokens, so repeated
    tokens stay distinct. Hover names query token, key token and weight. ``causal`` greys the
    future (j > i) with a second trace (one polygon), leaving trace 0 untouched."""
    z = _numpy(matrix)
    k_tokens = q_tokens if k_tokens is None else k_tokens
    if z.ndim != 2 or z.shape != (len(q_tokens), len(k_tokens)):
        raise ValueError(f"matrix shape {z.shape} does not match {len(q_tokens)} query tokens x "
                         f"{len(k_tokens)} key tokens")
    n_q, n_k = z.shape
    heatmap = go.Heatmap(z=z, x=np.arange(n_k), y=np.arange(n_q), colorscale=colorscale, zmin=0,
                         zmax=zmax, colorbar=dict(title="weight"))
    if n_q * n_k <= HOVER_TOKEN_MAX_CELLS:
        q_labels = np.array([token_label(t) for t in q_tokens], dtype=object)[:, None]
        k_labels = np.array([token_label(t) for t in k_tokens], dtype=object)[None, :]
        heatmap.customdata = np.stack(np.broadcast_arrays(q_labels, k_labels), axis=-1)
        heatmap.hovertemplate = ("query %{y} %{customdata[0]}<br>key %{x} %{customdata[1]}"
                                 "<br>weight %{z:.4f}<extra></extra>")
    else:
        heatmap.hovertemplate = "query %{y} → key %{x}<br>weight %{z:.4f}<extra></extra>"
    figure = go.Figure(heatmap)
    rows = min(n_q, n_k - 1)        # rows 0..rows-1 have future keys (j > i)
    if causal and rows > 0:
        # The future as one grey staircase polygon over the cells j > i (2n points), not a second
        # n x n heatmap: half the figure's bytes and one n x n layer less for the browser to paint.
        xs = [0.5, n_k - 0.5, n_k - 0.5]
        ys = [-0.5, -0.5, rows - 0.5]
        for i in range(rows - 1, -1, -1):
            xs += [i + 0.5, i + 0.5]
            ys += [i + 0.5, i - 0.5]
        figure.add_trace(go.Scatter(x=xs, y=ys, fill="toself", fillcolor="#d9d9d9", mode="lines",
                                    line=dict(width=0), hoverinfo="skip", showlegend=False))
    figure.update_xaxes(title="key", tickangle=-60, **_token_axis(k_tokens, max_ticks))
    figure.update_yaxes(title="query", autorange="reversed", **_token_axis(q_tokens, max_ticks))
    figure.update_layout(title=title, height=height or int(np.clip(14 * n_q + 160, 320, 900)),
                         margin=dict(l=10, r=10, t=50 if title else 20, b=10))
    return figure


def lines_title(layer: int, heads: list[int]) -> str:
    """Title of the lines view: "Layer 3, head 7" or "Layer 3, heads 7, 2" (order as given)."""
    if len(heads) == 1:
        return f"Layer {layer}, head {heads[0]}"
    return f"Layer {layer}, heads " + ", ".join(str(h) for h in heads)


def lines_figure(attn_layer, tokens: list[str], heads: list[int], query: int | None = None,
                 threshold: float = LINE_THRESHOLD, max_lines: int = MAX_LINES,
                 title: str = "", window: tuple[int, int] | None = None) -> go.Figure:
    """BertViz-style head view: queries on the left, keys on the right, a line per weight above
    ``threshold`` with opacity and width growing with it, one colour per head. ``query`` limits
    the lines to one query token; ``title`` (e.g. `lines_title`) names what is drawn.
    ``window`` (lo, hi): only tokens lo..hi-1 on both sides (a long text's hundreds of labels
    would overlap). Hovering a token names its three strongest links in the drawn heads."""
    attn_layer = _numpy(attn_layer)
    n = len(tokens)
    if attn_layer.ndim != 3 or attn_layer.shape[1:] != (n, n):
        raise ValueError(f"attn_layer must be [heads, {n}, {n}] for {n} tokens, "
                         f"got {attn_layer.shape}")
    n_heads = attn_layer.shape[0]
    if any(not 0 <= h < n_heads for h in heads):
        raise ValueError(f"heads must be in 0..{n_heads - 1}, got {list(heads)}")
    if query is not None and not 0 <= query < n:
        raise ValueError(f"query must be in 0..{n - 1}, got {query}")
    lo, hi = (0, n) if window is None else (max(0, int(window[0])), min(n, int(window[1])))
    if lo >= hi:
        raise ValueError(f"window must hold at least one of the {n} tokens, got {window}")
    chosen_heads = attn_layer[np.asarray(heads, dtype=int)]               # (len(heads), n, n)
    drawn = chosen_heads >= threshold
    if query is not None:
        drawn &= np.arange(n)[None, :, None] == query
    inside = (np.arange(n) >= lo) & (np.arange(n) < hi)
    drawn &= inside[None, :, None] & inside[None, None, :]
    slot_idx, q_idx, k_idx = np.nonzero(drawn)
    weights = chosen_heads[slot_idx, q_idx, k_idx]
    if len(weights) > max_lines:
        strongest = np.argsort(weights)[-max_lines:]
        slot_idx, q_idx, k_idx, weights = (a[strongest] for a in (slot_idx, q_idx, k_idx, weights))
    # One trace per (head, strength level) instead of one per line keeps the figure light.
    levels = np.clip(np.ceil(weights * 4), 1, 4) / 4
    figure = go.Figure()
    for slot, head in enumerate(heads):
        colour = HEAD_COLOURS[head % len(HEAD_COLOURS)]
        for level in (0.25, 0.5, 0.75, 1.0):
            chosen = (slot_idx == slot) & (levels == level)
            if not chosen.any():
                continue
            xs = np.tile([0.0, 1.0, np.nan], chosen.sum())
            ys = np.stack([q_idx[chosen], k_idx[chosen], np.full(chosen.sum(), np.nan)], 1).ravel()
            figure.add_trace(go.Scatter(
                x=xs, y=ys, mode="lines", line=dict(color=colour, width=0.5 + 3 * level),
                opacity=0.15 + 0.85 * level, name=f"head {head}", legendgroup=str(head),
                showlegend=False, hoverinfo="skip"))
        figure.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"head {head}",
                                    legendgroup=str(head), line=dict(color=colour, width=3)))
    labels = [token_label(t) for t in tokens[lo:hi]]
    strongest = chosen_heads[:, lo:hi, lo:hi].max(0)                       # (w, w) over the drawn heads
    for x, side, position, links in ((0.0, "query", "middle left", strongest),
                                     (1.0, "key", "middle right", strongest.T)):
        hover = ["<br>".join(f"{'→' if side == 'query' else '←'} {labels[j]} ({lo + j}) {row[j]:.2f}"
                             for j in np.argsort(row)[::-1][:3] if row[j] > 0) for row in links]
        figure.add_trace(go.Scatter(
            x=np.full(hi - lo, x), y=np.arange(lo, hi), mode="markers+text", text=labels,
            textposition=position, marker=dict(size=4, color="#888"), showlegend=False,
            customdata=hover, hovertemplate=f"{side} %{{y}} %{{text}}<br>%{{customdata}}<extra></extra>"))
    for x, side in ((0.0, "queries"), (1.0, "keys")):
        figure.add_annotation(x=x, y=1.0, xref="x", yref="paper", yanchor="bottom", text=f"<b>{side}</b>",
                              showarrow=False)
    figure.update_xaxes(visible=False, range=[-0.8, 1.8])
    figure.update_yaxes(visible=False, range=[hi - 0.5, lo - 0.5])
    figure.update_layout(title=title, height=int(np.clip(20 * (hi - lo) + 100, 250, 2000)),
                         margin=dict(l=10, r=10, t=50 if title else 30, b=10),
                         plot_bgcolor="white")
    return figure


# --- Tables of heads -------------------------------------------------------------------------
def role_map_figure(stats: pd.DataFrame, height: int | None = None) -> go.Figure:
    """Layer x head map of `analysis.head_stats` roles in categorical colours, stats on hover."""
    n_layers, n_heads = int(stats["layer"].max()) + 1, int(stats["head"].max()) + 1
    ordered = stats.sort_values(["layer", "head"])
    codes = ordered["role"].map({r: i for i, r in enumerate(ROLES)}).to_numpy()
    z = codes.reshape(n_layers, n_heads).astype(np.float32)
    colourscale = []
    for i, role in enumerate(ROLES):   # a stepped scale: category i fills [i, i+1) / len(ROLES)
        colour = ROLE_COLOURS[role]
        colourscale += [[i / len(ROLES), colour], [(i + 1) / len(ROLES), colour]]
    details = ordered[["role", "norm_entropy", "mean_distance", "max_weight"]].to_numpy(object)
    figure = go.Figure(go.Heatmap(
        z=z, x=np.arange(n_heads), y=np.arange(n_layers), zmin=-0.5, zmax=len(ROLES) - 0.5,
        colorscale=colourscale, customdata=details.reshape(n_layers, n_heads, -1),
        colorbar=dict(tickvals=list(range(len(ROLES))), ticktext=list(ROLES), title="role"),
        hovertemplate="layer %{y}, head %{x}: %{customdata[0]}<br>norm. entropy "
                      "%{customdata[1]:.2f}<br>mean distance %{customdata[2]:.2f}<br>max weight "
                      "%{customdata[3]:.2f}<extra></extra>", xgap=1, ygap=1))
    figure.update_xaxes(title="head", dtick=1, showgrid=False)
    figure.update_yaxes(title="layer", dtick=1, autorange="reversed", showgrid=False)
    figure.update_layout(height=height or int(np.clip(22 * n_layers + 120, 260, 900)),
                         margin=dict(l=10, r=10, t=20, b=10))
    return figure


def stat_map_figure(stats: pd.DataFrame, column: str, colorscale: str = "Viridis") -> go.Figure:
    """Layer x head heatmap of one numeric column of `analysis.head_stats`."""
    if column not in stats.columns:
        raise ValueError(f"no column {column!r}; choose one of {list(stats.columns)}")
    table = stats.pivot(index="layer", columns="head", values=column).astype(float)
    figure = go.Figure(go.Heatmap(z=table.to_numpy(), x=table.columns.to_numpy(),
                                  y=table.index.to_numpy(), colorscale=colorscale,
                                  colorbar=dict(title=column), xgap=1, ygap=1,
                                  hovertemplate=f"layer %{{y}}, head %{{x}}<br>{column} %{{z:.3f}}"
                                                "<extra></extra>"))
    figure.update_xaxes(title="head", dtick=1, showgrid=False)
    figure.update_yaxes(title="layer", dtick=1, autorange="reversed", showgrid=False)
    figure.update_layout(height=int(np.clip(22 * len(table) + 120, 260, 900)),
                         margin=dict(l=10, r=10, t=20, b=10))
    return figure


def distance_figure(distances, unit: str = "tokens") -> go.Figure:
    """Mean attention distance per head against layer ([L, H]), as in the ViT paper's plot."""
    distances = _numpy(distances)
    n_layers, n_heads = distances.shape
    figure = go.Figure()
    for head in range(n_heads):
        figure.add_trace(go.Scatter(
            x=np.arange(n_layers), y=distances[:, head], mode="markers", name=f"head {head}",
            marker=dict(color=HEAD_COLOURS[head % len(HEAD_COLOURS)], size=8),
            hovertemplate=f"layer %{{x}}, head {head}<br>%{{y:.2f}} {unit}<extra></extra>"))
    figure.update_xaxes(title="layer", dtick=1)
    figure.update_yaxes(title=f"mean attention distance ({unit})", rangemode="tozero")
    figure.update_layout(height=380, margin=dict(l=10, r=10, t=20, b=10))
    return figure


def token_flow_figure(flow, tokens: list[str], title: str = "",
                      max_ticks: int = MAX_TICK_LABELS) -> go.Figure:
    """Layer x token heatmap ([L, n]), e.g. `analysis.token_flow`; z is ``flow`` unchanged."""
    z = _numpy(flow)
    if z.ndim != 2 or z.shape[1] != len(tokens):
        raise ValueError(f"flow must be [layers, {len(tokens)}], got {z.shape}")
    labels = np.array([token_label(t) for t in tokens], dtype=object)
    figure = go.Figure(go.Heatmap(
        z=z, x=np.arange(z.shape[1]), y=np.arange(z.shape[0]), colorscale="Viridis", zmin=0,
        customdata=np.broadcast_to(labels[None, :], z.shape),
        hovertemplate="layer %{y}<br>token %{x} %{customdata}<br>weight %{z:.4f}<extra></extra>"))
    figure.update_xaxes(title="token", tickangle=-60, **_token_axis(list(tokens), max_ticks))
    figure.update_yaxes(title="layer", dtick=1, autorange="reversed", showgrid=False)
    figure.update_layout(title=title, height=int(np.clip(22 * z.shape[0] + 160, 260, 900)),
                         margin=dict(l=10, r=10, t=50 if title else 20, b=10))
    return figure


def bar_topk(tokens: list[str], probs, title: str = "") -> go.Figure:
    """Horizontal bars of next-token candidates, most likely at the top (order as given)."""
    probs = _numpy(probs).astype(float)
    if probs.shape != (len(tokens),):
        raise ValueError(f"{len(tokens)} tokens but probs has shape {probs.shape}")
    positions = np.arange(len(tokens))
    figure = go.Figure(go.Bar(
        x=probs, y=positions, orientation="h", text=[f"{p:.1%}" for p in probs],
        textposition="auto", customdata=[token_label(t) for t in tokens],
        hovertemplate="%{customdata}: %{x:.4f}<extra></extra>"))
    figure.update_yaxes(tickmode="array", tickvals=positions,
                        ticktext=[token_label(t) for t in tokens], autorange="reversed")
    top = max(1e-9, float(probs.max(initial=0)))
    figure.update_xaxes(title="probability", range=[0, top * 1.1])
    figure.update_layout(title=title, height=int(np.clip(28 * len(tokens) + 100, 200, 700)),
                         margin=dict(l=10, r=10, t=50 if title else 20, b=10))
    return figure


def head_rank_figure(ranking: pd.DataFrame, top: int = 20, title: str = "") -> go.Figure:
    """Horizontal bars of the ``top`` rows of `analysis.head_ranking.rank_heads` in its order: the
    query's weight on the key beside the other words' mean (a column head has both long)."""
    shown = ranking.head(top)
    names = [f"L{layer} H{head}" for layer, head in zip(shown["layer"], shown["head"])]
    positions = np.arange(len(shown))
    custom = shown[["layer", "head"]].to_numpy()
    figure = go.Figure()
    for column, label, colour in (("weight", "the query", "#1f77b4"), ("others", "the other words (mean)", "#bbbbbb")):
        values = shown[column].to_numpy(dtype=float)
        figure.add_trace(go.Bar(
            x=np.nan_to_num(values), y=positions, orientation="h", name=label, marker_color=colour,
            customdata=custom, text=["" if np.isnan(v) else f"{v:.2f}" for v in values],
            textposition="auto",
            hovertemplate=f"layer %{{customdata[0]}}, head %{{customdata[1]}}<br>{label}: %{{x:.4f}}"
                          "<extra></extra>"))
    figure.update_yaxes(tickmode="array", tickvals=positions, ticktext=names, autorange="reversed")
    figure.update_xaxes(title="attention weight on the key", range=[0, 1.05])
    figure.update_layout(title=title, barmode="group", height=int(np.clip(34 * len(shown) + 120, 220, 800)),
                         legend=layout.legend_below(-0.08), margin=dict(l=10, r=10, t=50 if title else 20, b=60))
    return figure


# --- Home page thumbnails ----------------------------------------------------------------------
# Schematic pictures of each page's main figure, drawn from numpy at run time (a few kB and
# microseconds each): the home page loads no model and ships no image files that would drift.
PAGE_THUMB = (36, 54)   # rows, columns of a thumbnail before enlarging


def page_thumbnail(page: str) -> np.ndarray:
    """A schematic (rows, cols, 3) uint8 picture of the page's main figure, viridis-coloured."""
    h, w = PAGE_THUMB
    r, c = np.mgrid[0:h, 0:w].astype(float)
    y, x = r / (h - 1), c / (w - 1)
    if page == "Attention":      # a causal head: the diagonal and the first token, future grey
        z = np.exp(-((x - y) * 12) ** 2) + 0.6 * (x < 0.08)
        z = np.where(x > y, np.nan, z)
    elif page == "Heads":        # a layer × head grid, some heads switched off
        z = ((r // 6 * 7 + c // 6 * 3) % 11) / 10.0
        z = np.where(((r // 6) + 2 * (c // 6)) % 5 == 0, np.nan, z)
    elif page == "Images":       # patches, one region looked at
        z = np.exp(-(((x - 0.6) * 3) ** 2 + ((y - 0.45) * 3) ** 2)) * (0.6 + 0.4 * ((r // 6 + c // 6) % 2))
    elif page == "Latency":      # time against length: quadratic, a bound below
        z = (np.abs((1 - y) - x ** 2) < 0.05) + 0.5 * (np.abs((1 - y) - 0.5 * x) < 0.04)
    elif page == "Lab":          # Q·Kᵀ → softmax → weights, three small matrices
        block = (c % 18 < 14) & (r > 10) & (r < 26)
        z = np.where(block, np.sin(r * 0.9 + c * 0.7) * 0.5 + 0.5 * (c // 18) / 2, np.nan)
    elif page == "Translate":    # source × target alignment, mostly monotone
        z = np.exp(-((x - (0.2 + 0.7 * y ** 1.3)) * 10) ** 2)
    elif page == "Speech":       # audio frames under text tokens
        z = np.where(y > 0.5, 0.5 + 0.5 * np.sin(c * 1.3) * np.exp(-((y - 0.75) * 6) ** 2),
                     np.exp(-((x - y * 1.8) * 8) ** 2))
    else:                        # Readouts: a layer ladder, belief growing with depth
        z = np.where(c % 9 < 7, (1 - y) * (x > 0.3 * y), np.nan)
    rgb = apply_colormap(np.clip(z, 0, 1))                                     # (h, w, 3)
    rgb[np.isnan(z)] = (217, 217, 217)
    return np.kron(rgb, np.ones((3, 3, 1), dtype=np.uint8))                    # (3h, 3w, 3)
