"""How far to trust a modelled Pi row: each published Raspberry Pi run's error (predicted ÷ published
− 1) against the ±25% band the tests hold, one row per device · engine · dtype, fitted runs filled
and checks hollow. Pure: the table of `latency.published.table()` in, a plotly figure out."""
from __future__ import annotations

import html

import pandas as pd
import plotly.graph_objects as go

from attnviz.figures.layout import legend_below

BAND = 25.0
ENGINE_COLOURS = {"torch": "#1f77b4", "ncnn": "#2ca02c", "ggml": "#ff7f0e"}


def calibration_figure(runs: pd.DataFrame) -> go.Figure:
    """runs: columns device, engine, dtype, role, metric, published, predicted, error_pct, source."""
    if runs.empty:
        raise ValueError("no published runs to draw")
    runs = runs.assign(group=runs["device"] + " · " + runs["engine"] + " · " + runs["dtype"])
    order = sorted(runs["group"].unique())
    fig = go.Figure()
    fig.add_vrect(x0=-BAND, x1=BAND, fillcolor="#2ca02c", opacity=0.08, line_width=0)
    for x in (-BAND, 0.0, BAND):
        fig.add_vline(x=x, line_dash="dot" if x else "solid", line_color="#888", line_width=1)
    for engine, part in runs.groupby("engine"):
        for fitted, group in part.groupby(part["role"].str.startswith("fit")):
            hover = [f"{html.escape(r.source[:90])}<br>{r.metric}: published {r.published:.4g}, "
                     f"predicted {r.predicted:.4g}" for r in group.itertuples()]
            colour = ENGINE_COLOURS.get(engine, "#7f7f7f")
            fig.add_trace(go.Scatter(
                x=group["error_pct"], y=group["group"], mode="markers",
                name=f"{engine} ({'fit' if fitted else 'check'})", text=hover,
                marker=dict(size=10, color=colour, symbol="circle" if fitted else "circle-open",
                            line=dict(width=2, color=colour)),
                hovertemplate="%{text}<br>error %{x:+.1f}%<extra></extra>"))
    worst = runs["error_pct"].abs().max()
    fig.update_layout(
        title=f"{len(runs)} published Pi runs: the model's error on each (the tests hold ±{BAND:.0f}%; largest "
              f"{worst:.1f}%)", height=max(320, 34 * len(order) + 140),
        xaxis=dict(title="predicted ÷ published − 1 (%)", range=[-BAND * 1.6, BAND * 1.6], zeroline=False),
        yaxis=dict(title="", categoryorder="array", categoryarray=order[::-1]),
        legend=legend_below(-0.2), margin=dict(l=10, r=10, t=50, b=10))
    return fig
