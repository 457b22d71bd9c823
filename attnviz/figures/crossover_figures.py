"""The attention = rest crossover of one block (rows of `latency.crossover`, CSV test "block"):
attention alone and the rest of the block against n, measured (solid) and modelled (dashed), with
both crossovers marked. Pure: tables in, a plotly figure out."""
from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attnviz.figures.layout import legend_below

COLOURS = {"attention": "#d62728", "rest of the block": "#1f77b4"}


def parts(rows: pd.DataFrame) -> dict[str, pd.Series]:
    """Attention and the rest of the block (ms), by n, of one kind of rows (measured or modelled)."""
    rows = rows.groupby("seq_len")[["median_ms", "attention_ms"]].median()
    return {"attention": rows["attention_ms"], "rest of the block": rows["median_ms"] - rows["attention_ms"]}


def crossover_figure(rows: pd.DataFrame, measured_n: float | None, modelled_n: float | None,
                     model: str, positions: int | None = None) -> go.Figure:
    """One model's block rows (one variant and thread count). `positions`: the model's own limit
    when it is below the lengths shown (MiniLM's 512), said in the title."""
    fig = go.Figure()
    for measured, dash in ((True, "solid"), (False, "dash")):
        part = rows[rows["measured"] == measured]
        if part.empty:
            continue
        for name, ms in parts(part).items():
            fig.add_scatter(x=ms.index, y=ms.values, mode="lines+markers", line=dict(color=COLOURS[name], dash=dash),
                            name=f"{name} · {'measured here' if measured else 'cost model'}")
    ys = [y for t in fig.data for y in t.y if np.isfinite(y) and y > 0] or [1.0]
    for x, text, dash in ((measured_n, "measured", "solid"), (modelled_n, "modelled", "dash")):
        if x:  # a trace, not a shape: on a log axis a shape's label would need log coordinates
            fig.add_scatter(x=[x, x], y=[min(ys), max(ys)], mode="lines", line=dict(color="#444", dash=dash, width=1),
                            name=f"crossover {text}: n≈{x:,.0f}", hoverinfo="name")
    ns = sorted(rows["seq_len"].unique())
    note = (f"; {html.escape(model)} itself reads at most {positions:,} positions: a block reads none"
            if positions and positions < max(ns) else "")
    fig.update_layout(
        title=f"Attention = rest in ONE block of {html.escape(model)}<br><sup>every block has the same shape, so "
              f"one block's timing gives the model's per-block crossover{note}; the whole model crosses later "
              "(embeddings and the LM head are rest)</sup>",
        xaxis_title="sequence length n (tokens)", yaxis_title="milliseconds per block",
        legend=legend_below(), margin=dict(t=80, b=10), hovermode="x unified")
    fig.update_xaxes(type="log", minorloglabels="complete", tickvals=ns, ticktext=[str(int(n)) for n in ns],
                     range=[np.log10(min(ns) * 0.9), np.log10(max(ns) * 1.1)])
    fig.update_yaxes(type="log", minorloglabels="complete")  # never "5" for both 0.5 and 500
    return fig
