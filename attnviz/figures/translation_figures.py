"""Figures of a translation: every cross-attention head at once, alignment lines between source
and target words, and one decoding step's cross-attention row. Pure: arrays in, figures out.
One head's target x source heatmap and the next-token bars are `figures.attention`'s
`head_heatmap` and `bar_topk`."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.base.names import head_name
from attnviz.figures.attention_figures import token_label
from attnviz.figures.latency_figures import LOG_AXIS, device_style

ALIGN_THRESHOLD = 0.1   # alignment lines below this weight are not drawn (uncluttered)


def _array(values) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=np.float32)


def cross_grid_figure(cross, source_tokens: list[str], target_tokens: list[str],
                      off=None) -> go.Figure:
    """cross [L, H, n_tgt, n_src]: one small target x source map per layer and head, plus the
    head average at the end of each row. `off` [L, H] bool marks switched-off heads in the title."""
    att = _array(cross)
    L, H, T, S = att.shape
    titles = []
    for layer in range(L):
        for head in range(H):
            masked = off is not None and bool(off[layer][head])
            titles.append(head_name(layer, head) + (" (off)" if masked else ""))
        titles.append(f"L{layer} average")
    figure = make_subplots(rows=L, cols=H + 1, subplot_titles=titles, horizontal_spacing=0.01,
                           vertical_spacing=0.08)
    src = [token_label(t) for t in source_tokens]
    tgt = [token_label(t) for t in target_tokens]
    for layer in range(L):
        for col in range(H + 1):
            z = att[layer, col] if col < H else att[layer].mean(0)
            figure.add_trace(go.Heatmap(
                z=z, x=np.arange(S), y=np.arange(T), zmin=0, zmax=1, colorscale="Viridis",
                showscale=False, customdata=np.stack(np.broadcast_arrays(
                    np.array(tgt, dtype=object)[:, None], np.array(src, dtype=object)[None, :]), -1),
                hovertemplate=f"{titles[layer * (H + 1) + col]}<br>target %{{customdata[0]}}"
                              "<br>source %{customdata[1]}<br>weight %{z:.3f}<extra></extra>"),
                row=layer + 1, col=col + 1)
    figure.update_xaxes(showticklabels=False)
    figure.update_yaxes(showticklabels=False, autorange="reversed")
    figure.update_annotations(font_size=10)
    figure.update_layout(height=int(np.clip(170 * L + 60, 260, 1200)), margin=dict(l=10, r=10, t=40, b=10))
    return figure


def alignment_figure(matrix, source_words: list[str], target_words: list[str],
                     threshold: float = ALIGN_THRESHOLD, title: str = "") -> go.Figure:
    """Source words along the top, target words along the bottom, a line for every weight at or
    above `threshold` (thicker and darker when stronger; the strongest link of each target word
    in red). Where the word order changes ("red sofa" -> "sofá vermelho") the lines cross."""
    m = _array(matrix)
    Tw, Sw = m.shape
    if (Tw, Sw) != (len(target_words), len(source_words)):
        raise ValueError(f"matrix {m.shape} does not match {len(target_words)} target x "
                         f"{len(source_words)} source words")
    width = max(Tw, Sw) - 1 or 1
    xs = np.linspace(0, width, Sw) if Sw > 1 else np.array([width / 2])
    xt = np.linspace(0, width, Tw) if Tw > 1 else np.array([width / 2])
    figure = go.Figure()
    best = m.argmax(1)
    for t in range(Tw):
        for s in np.nonzero(m[t] >= threshold)[0]:
            w = float(m[t, s])
            strongest = s == best[t]
            figure.add_trace(go.Scatter(
                x=[xt[t], xs[s]], y=[0, 1], mode="lines", showlegend=False,
                line=dict(width=1 + 6 * w, color="#d62728" if strongest else "#1f77b4"),
                opacity=0.25 + 0.75 * w,
                hovertemplate=f"{token_label(target_words[t])} → {token_label(source_words[s])}: "
                              f"{w:.2f}<extra></extra>"))
    for x, y, words, pos in ((xs, 1, source_words, "top center"), (xt, 0, target_words, "bottom center")):
        figure.add_trace(go.Scatter(x=x, y=np.full(len(words), y), mode="markers+text",
                                    text=[token_label(w) for w in words], textposition=pos,
                                    marker=dict(size=6, color="#555"), showlegend=False,
                                    hoverinfo="text"))
    figure.update_xaxes(visible=False, range=[-0.8, width + 0.8])
    figure.update_yaxes(visible=False, range=[-0.4, 1.4])
    figure.update_layout(title=title, height=320, margin=dict(l=10, r=10, t=50 if title else 20, b=10),
                         plot_bgcolor="white")
    return figure


def source_row_figure(row, source_tokens: list[str], title: str = "") -> go.Figure:
    """One decoding step's cross-attention over the source tokens [n_src], as bars."""
    values = _array(row)
    if values.shape != (len(source_tokens),):
        raise ValueError(f"{len(source_tokens)} source tokens but the row has shape {values.shape}")
    labels = [token_label(t) for t in source_tokens]
    figure = go.Figure(go.Bar(x=np.arange(len(values)), y=values, customdata=labels,
                              text=[f"{v:.2f}" for v in values], textposition="auto",
                              hovertemplate="%{customdata}: %{y:.3f}<extra></extra>"))
    figure.update_xaxes(tickmode="array", tickvals=np.arange(len(values)), ticktext=labels, tickangle=-45)
    figure.update_yaxes(title="cross-attention weight", range=[0, 1.05])
    figure.update_layout(title=title, height=320, margin=dict(l=10, r=10, t=50 if title else 20, b=10))
    return figure


def translation_cost_figure(df) -> go.Figure:
    """Rows of `attnviz.latency.translation_latency.sweep` (model, backend, source_tokens, encode_ms,
    decode_ms_per_token): encoding (once per sentence) and one decoding step against source length."""
    figure = make_subplots(rows=1, cols=2, subplot_titles=("encoding (once per sentence)",
                                                           "decoding (per target token)"))
    for (model, backend), rows in df.groupby(["model", "backend"], sort=True):
        rows = rows.sort_values("source_tokens")
        name = f"{model} · {backend}" + (" (measured)" if backend == "cpu" else " (modelled)")
        for col, column in ((1, "encode_ms"), (2, "decode_ms_per_token")):
            figure.add_trace(go.Scatter(
                x=rows["source_tokens"], y=rows[column], mode="lines+markers", name=name, legendgroup=name,
                showlegend=col == 1, **device_style(backend, backend == "cpu"),
                hovertemplate=f"{name}<br>%{{x}} source tokens: %{{y:.2f}} ms<extra></extra>"), row=1, col=col)
    figure.update_xaxes(title="source tokens", **LOG_AXIS)
    figure.update_yaxes(title="ms", rangemode="tozero")
    figure.update_layout(height=380, margin=dict(l=10, r=10, t=40, b=10))
    return figure


def word_row_figure(words: list[str], weights, title: str = "", highlight: int | None = None) -> go.Figure:
    """Vertical bars: one query's attention weight on each source word (in sentence order), the
    word ``highlight`` (its strongest) drawn in a darker colour."""
    weights = np.asarray(weights, dtype=float)
    if weights.shape != (len(words),):
        raise ValueError(f"{len(words)} words but {weights.shape} weights")
    positions = np.arange(len(words))
    colours = ["#1f4e9c" if i == highlight else "#8fb3e0" for i in positions]
    figure = go.Figure(go.Bar(x=positions, y=weights, marker_color=colours, text=[f"{w:.2f}" for w in weights],
                              textposition="outside", customdata=[token_label(w) for w in words],
                              hovertemplate="%{customdata}: %{y:.4f}<extra></extra>"))
    figure.update_xaxes(tickmode="array", tickvals=positions, ticktext=[token_label(w) for w in words])
    figure.update_yaxes(title="attention weight", range=[0, 1.08])
    figure.update_layout(title=title, height=320, margin=dict(l=10, r=10, t=50 if title else 20, b=10))
    return figure


def position_bias_figure(bias, tokens: list[str], title: str = "") -> go.Figure:
    """bias [n, n]: what one head adds to its scores for each query (row) and key (column) from
    their distance alone (relative positions), before the softmax; diverging colours around 0."""
    z = _array(bias)
    labels = [token_label(t) for t in tokens]
    top = float(np.abs(z).max()) or 1.0
    fig = go.Figure(go.Heatmap(z=z, x=np.arange(len(tokens)), y=np.arange(len(tokens)), colorscale="RdBu",
                               zmid=0, zmin=-top, zmax=top, colorbar=dict(title="bias")))
    ticks = dict(tickmode="array", tickvals=list(range(len(tokens))), ticktext=labels)
    fig.update_layout(title=title, xaxis=dict(title="key", **ticks), yaxis=dict(title="query", autorange="reversed",
                                                                                **ticks), height=420)
    return fig
