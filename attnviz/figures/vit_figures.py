"""Plotly builders for the Lab's toy ViT (`attnviz.toys.toy_vit`): held-out accuracy and attention
FLOPs of each configuration, and what one patch attends to over the image, layer by layer.
Arrays in, figures out (no Streamlit)."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.figures.layout import legend_below


def accuracy_figure(labels: list[str], correct: list[int], totals: list[int], chance: float) -> go.Figure:
    """Held-out accuracy per configuration (%), each bar labelled with its exact count, and chance."""
    if not (len(labels) == len(correct) == len(totals)) or not labels:
        raise ValueError("one label, count and total per configuration, at least one")
    acc = [100 * c / t for c, t in zip(correct, totals)]
    figure = go.Figure(go.Bar(x=labels, y=acc, text=[f"{a:.2f} % ({c}/{t})" for a, c, t in zip(acc, correct, totals)],
                              textposition="auto", hovertemplate="%{x}: %{text}<extra></extra>"))
    figure.add_hline(y=100 * chance, line_dash="dash", annotation_text=f"chance {100 * chance:.1f} %",
                     annotation_position="top left")
    figure.update_yaxes(title="held-out accuracy (%)", range=[0, 105])
    figure.update_layout(title="Held-out accuracy", height=360, margin=dict(l=10, r=10, t=40, b=10))
    return figure


def flops_figure(labels: list[str], counted: list[int], computed: list[int]) -> go.Figure:
    """Attention FLOPs per image: as counted for real axial attention, and as computed here (the
    masked n x n scores, full attention's count)."""
    if not (len(labels) == len(counted) == len(computed)) or not labels:
        raise ValueError("one label and two counts per configuration, at least one")
    figure = go.Figure([
        go.Bar(name="counted (real axial attention)", x=labels, y=counted, text=[f"{v:,}" for v in counted],
               textposition="auto"),
        go.Bar(name="computed here (masked n × n)", x=labels, y=computed, text=[f"{v:,}" for v in computed],
               textposition="auto")])
    figure.update_yaxes(title="attention FLOPs per image", rangemode="tozero")
    figure.update_layout(title="Attention FLOPs (scores and weighted sum, all layers)", barmode="group",
                         height=360, margin=dict(l=10, r=10, t=40, b=10), legend=legend_below(-0.15))
    return figure


def patch_attention_figure(image: np.ndarray, maps: dict[str, list[np.ndarray]], patch: tuple[int, int],
                           layer_names: dict[str, list[str]] | None = None) -> go.Figure:
    """The image, then per configuration (one row each) what patch (row, column) attends to in
    each layer: a grid x grid map of the heads' mean weights, the chosen patch outlined."""
    if not maps:
        raise ValueError("give at least one configuration's maps")
    image = np.asarray(image, dtype=np.float32)
    n_layers = max(len(m) for m in maps.values())
    grid = next(iter(maps.values()))[0].shape[0]
    scale = image.shape[0] / grid
    names = layer_names or {}
    titles = []
    for i, (name, layers) in enumerate(maps.items()):
        titles.append("image" if i == 0 else "")
        for j in range(n_layers):
            label = names.get(name, [])[j] if j < len(names.get(name, [])) else f"layer {j}"
            titles.append(f"{name}: {label}" if j < len(layers) else "")
    figure = make_subplots(rows=len(maps), cols=1 + n_layers, subplot_titles=titles,
                           horizontal_spacing=0.03, vertical_spacing=0.12)
    r, c = patch
    for i, layers in enumerate(maps.values(), start=1):
        if i == 1:
            figure.add_trace(go.Heatmap(z=image, colorscale="Greys_r", showscale=False,
                                        hovertemplate="y %{y}, x %{x}: %{z:.2f}<extra></extra>"), 1, 1)
            figure.add_shape(type="rect", x0=c * scale - 0.5, x1=(c + 1) * scale - 0.5, y0=r * scale - 0.5,
                             y1=(r + 1) * scale - 0.5, line=dict(color="red", width=2), row=1, col=1)
        for j, m in enumerate(layers, start=2):
            figure.add_trace(go.Heatmap(z=np.asarray(m), colorscale="Viridis", zmin=0, showscale=False,
                                        hovertemplate="patch row %{y}, column %{x}: %{z:.3f}<extra></extra>"),
                             i, j)
            figure.add_shape(type="rect", x0=c - 0.5, x1=c + 0.5, y0=r - 0.5, y1=r + 0.5,
                             line=dict(color="red", width=2), row=i, col=j)
    figure.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    figure.update_yaxes(showticklabels=False, showgrid=False, zeroline=False, autorange="reversed",
                        constrain="domain")
    for i in range(1, len(maps) + 1):
        for j in range(1, n_layers + 2):
            axis = (i - 1) * (n_layers + 1) + j
            figure.update_yaxes(scaleanchor=f"x{'' if axis == 1 else axis}", row=i, col=j)  # square cells
    figure.update_layout(height=240 * len(maps) + 60, margin=dict(l=10, r=10, t=40, b=10),
                         title=f"What patch (row {r}, column {c}) attends to: the heads' mean, per layer")
    return figure
