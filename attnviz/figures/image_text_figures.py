"""Figures of one image against several captions: the captions' scores and what each caption's
pooled token reads, layer by layer."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attnviz.figures.attention_figures import token_label


def caption_scores_figure(table: pd.DataFrame) -> go.Figure:
    """Horizontal bars of each caption's probability (the table of `analysis.image_text.caption_table`)."""
    kind = table.columns[2]
    figure = go.Figure(go.Bar(x=table[kind], y=np.arange(len(table)), orientation="h",
                              text=[f"{p:.3f}" for p in table[kind]], textposition="auto",
                              customdata=table["score"], hovertemplate="%{y}<br>P %{x:.4f}<br>score "
                              "%{customdata:.3f}<extra></extra>"))
    figure.update_yaxes(tickvals=np.arange(len(table)), ticktext=list(table["caption"]), autorange="reversed")
    figure.update_xaxes(title=kind, range=[0, 1])
    figure.update_layout(height=90 + 36 * len(table), margin=dict(l=10, r=10, t=20, b=10))
    return figure


def pooled_reads_figure(tokens: list[str], reads, pooled: int, title: str = "") -> go.Figure:
    """Rows = layers, columns = the caption's tokens: the weight its pooled token (`pooled`)
    puts on each token, mean over heads ([L, n])."""
    z = np.asarray(reads, dtype=np.float32)
    labels = [token_label(t) + (" ◀" if i == pooled else "") for i, t in enumerate(tokens)]
    figure = go.Figure(go.Heatmap(z=z, x=np.arange(len(tokens)), y=np.arange(z.shape[0]), colorscale="Viridis",
                                  zmin=0, colorbar=dict(title="weight"),
                                  hovertemplate="layer %{y}<br>token %{x}<br>weight %{z:.4f}<extra></extra>"))
    figure.update_xaxes(tickvals=np.arange(len(tokens)), ticktext=labels, tickangle=-45)
    figure.update_yaxes(title="layer", autorange="reversed", tickvals=np.arange(z.shape[0]))
    figure.update_layout(title=title, height=150 + 22 * z.shape[0], margin=dict(l=10, r=10, t=40 if title else 10, b=10))
    return figure
