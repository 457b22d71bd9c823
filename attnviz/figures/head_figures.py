"""Figure builders of the Heads page: pruning curves, per-token loss, latency, attention change.
Pure functions from arrays and tables to plotly figures; no Streamlit."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from attnviz.base.names import head_name
from attnviz.figures.attention_figures import head_heatmap, token_label
from attnviz.figures.latency_figures import LOG_AXIS
from attnviz.figures.layout import legend_below

ORDER_COLOURS = {"importance": "#1f77b4", "random": "#ff7f0e"}
# The live view's charts are redrawn on every head toggle, and a browser spends most of a redraw
# placing tick labels (measured: 64 labels per axis ~ 300 ms of paint per chart, 16 ~ 80 ms).
# Hover still names every token.
LIVE_MAX_TICKS = 16
# plotly.js measures every tick label again to hide those that overflow the figure ("hide past div",
# its default on these axes): about a third of a redraw inside the Heads page (bench/toggle_latency.py).
# The live charts grow their margins to fit their labels (automargin; drawn without Streamlit's
# theme, nothing else would), so nothing is left to hide.
LIVE_AXES = dict(ticklabeloverflow="allow", automargin=True)
METRIC_LABELS = {"perplexity": "perplexity", "top1": "top-1 agreement with the full model",
                 "kl": "KL(full ‖ pruned), nats/token", "cosine": "embedding cosine to the full model",
                 "loss": "loss, nats/token"}


def curve_figure(summary: pd.DataFrame, metric: str, log_y: bool = False) -> go.Figure:
    """Metric against the share of heads removed, one line per order; random runs show mean ±
    one standard deviation over seeds as a band."""
    figure = go.Figure()
    for order, part in summary.groupby("order", sort=False):
        part = part.sort_values("fraction")
        x = 100 * part["fraction"].to_numpy()
        mean, std = part[f"{metric}_mean"].to_numpy(), part[f"{metric}_std"].to_numpy()
        colour = ORDER_COLOURS.get(order, "#555")
        runs = int(part["runs"].max())
        if runs > 1:
            figure.add_trace(go.Scatter(x=np.concatenate([x, x[::-1]]),
                                        y=np.concatenate([mean + std, (mean - std)[::-1]]),
                                        fill="toself", fillcolor=colour, opacity=0.2, line=dict(width=0),
                                        hoverinfo="skip", showlegend=False))
        name = "by importance (re-estimated each step)" if order == "importance" else \
            f"random order (mean ± sd of {runs} seeds)"
        figure.add_trace(go.Scatter(x=x, y=mean, mode="lines+markers", name=name,
                                    line=dict(color=colour),
                                    hovertemplate=f"%{{x:.0f}}% removed<br>{metric} %{{y:.4g}}<extra></extra>"))
    figure.update_xaxes(title="heads removed (%)")
    if log_y:
        figure.update_yaxes(title=METRIC_LABELS.get(metric, metric) + " (log scale)", **LOG_AXIS)
    else:
        figure.update_yaxes(title=METRIC_LABELS.get(metric, metric))
    # the legend under the plot: a page's title goes above it, and a legend there sat under the title
    figure.update_layout(height=420, margin=dict(l=10, r=10, t=30, b=10),
                         legend=legend_below(-0.22))
    return figure


def token_loss_figure(tokens: list[str], loss_full, loss_masked, max_ticks: int = LIVE_MAX_TICKS) -> go.Figure:
    """Loss of each token given the ones before it (nats), full model against masked model; at
    most `max_ticks` token labels on the axis (every token in the hover)."""
    loss_full, loss_masked = np.asarray(loss_full, dtype=float), np.asarray(loss_masked, dtype=float)
    targets = tokens[1:]
    if len(targets) != len(loss_full) or len(loss_full) != len(loss_masked):
        raise ValueError("one loss per predicted token (tokens 1..n-1) is expected for both models")
    x = np.arange(1, len(tokens))
    labels = [token_label(t) for t in targets]
    figure = go.Figure()
    for name, y, colour in (("full model", loss_full, "#888"), ("masked", loss_masked, "#d62728")):
        figure.add_trace(go.Bar(x=x, y=y, name=name, marker_color=colour, customdata=labels,
                                hovertemplate="%{customdata}: %{y:.2f} nats<extra>" + name + "</extra>"))
    step = max(1, -(-len(x) // max_ticks))
    figure.update_xaxes(tickmode="array", tickvals=x[::step], ticktext=labels[::step], tickangle=-60, **LIVE_AXES)
    figure.update_yaxes(title="loss (nats)", **LIVE_AXES)
    figure.update_layout(barmode="group", height=320, margin=dict(l=10, r=10, t=30, b=10),
                         legend=legend_below(-0.3))
    return figure


def topk_pair(full: tuple[list[str], object], masked: tuple[list[str], object],
              titles=("next token — full model", "next token — masked")) -> go.Figure:
    """The full and the masked model's next-token candidates side by side in ONE figure, both
    panels on ONE probability axis range (0 to the larger top probability of the two), so equal
    bars mean equal probabilities. Each panel's candidates are its own top-k, most likely on top."""
    panels = []
    for names, probs in (full, masked):
        probs = np.asarray(probs.detach().cpu().numpy() if hasattr(probs, "detach") else probs, dtype=float)
        if probs.shape != (len(names),):
            raise ValueError(f"{len(names)} tokens but probs has shape {probs.shape}")
        panels.append(([token_label(t) for t in names], probs))
    top = max([1e-9] + [float(p.max(initial=0)) for _, p in panels])
    x_range = [0, min(1.0, top * 1.1)]
    data, layout = [], dict(height=int(np.clip(28 * max(len(n) for n, _ in panels) + 110, 220, 700)),
                            margin=dict(l=10, r=10, t=40, b=10), showlegend=False, annotations=[])
    for k, ((labels, probs), title, colour) in enumerate(zip(panels, titles, ("#888", "#d62728"))):
        ax = "" if k == 0 else "2"
        data.append(go.Bar(x=probs, y=np.arange(len(labels)), orientation="h", xaxis=f"x{ax}", yaxis=f"y{ax}",
                           marker_color=colour, text=[f"{p:.1%}" for p in probs], textposition="auto",
                           customdata=labels, hovertemplate="%{customdata}: %{x:.4f}<extra></extra>"))
        domain = [0.0, 0.44] if k == 0 else [0.56, 1.0]
        layout[f"xaxis{ax}"] = dict(domain=domain, range=x_range, tickformat=".0%", title="probability",
                                    anchor=f"y{ax}", **LIVE_AXES)
        layout[f"yaxis{ax}"] = dict(tickmode="array", tickvals=list(range(len(labels))), ticktext=labels,
                                    autorange="reversed", anchor=f"x{ax}", **LIVE_AXES)
        layout["annotations"].append(dict(text=title, x=sum(domain) / 2, y=1.0, xref="paper", yref="paper",
                                          xanchor="center", yanchor="bottom", showarrow=False,
                                          font=dict(size=14)))
    return go.Figure(data=data, layout=layout)


NO_DIFFERENCE = "no difference: every weight is unchanged (Δ = 0 exactly)"
_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def plain_number(value: float) -> str:
    """A scale's number written out, two significant digits: 0.5, -0.0012, 3.1×10⁻⁷; never an SI
    prefix (plotly's default writes 1e-6 as "1µ", which reads as one)."""
    if value == 0:
        return "0"
    if abs(value) >= 1e-4:
        return np.format_float_positional(value, precision=2, fractional=False, trim="-")
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}×10{str(int(exponent)).translate(_SUPERSCRIPT)}"


def difference_heatmap(before, after, tokens: list[str], title: str = "", causal: bool = False,
                       max_ticks: int = LIVE_MAX_TICKS) -> go.Figure:
    """after - before of one head's [n, n] attention, on a diverging scale centred at zero whose
    ticks say the largest change in plain numbers; at most `max_ticks` token labels per axis (every
    token in the hover). No change at all (no head off, or none that reaches this head) is said in
    the figure, with no colour bar: a scale of ±0 would be noise."""
    diff = np.asarray(after, dtype=np.float32) - np.asarray(before, dtype=np.float32)
    top = float(np.nanmax(np.abs(diff))) if diff.size else 0.0
    if causal:  # the future is blank (NaN) in the one trace: no second, overlay trace to draw
        n_q, n_k = diff.shape
        diff = np.where(np.arange(n_k)[None, :] > np.arange(n_q)[:, None], np.float32("nan"), diff)
    scale = top or 1.0  # all zero: any symmetric range draws every cell in the scale's white middle
    figure = head_heatmap(diff, tokens, title=title, causal=False, zmax=scale, max_ticks=max_ticks)
    ticks = [-top, -top / 2, 0.0, top / 2, top]
    figure.data[0].update(zmin=-scale, zmax=scale, zmid=0, colorscale="RdBu_r", showscale=top > 0,
                          hovertemplate=figure.data[0].hovertemplate.replace("weight %{z:.4f}", "Δ weight %{z:.3g}"),
                          colorbar=dict(title="Δ weight", tickmode="array", tickvals=ticks,
                                        ticktext=[plain_number(t) for t in ticks]))
    if top == 0:
        figure.add_annotation(text=NO_DIFFERENCE, xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
                              bgcolor="rgba(255,255,255,0.85)", font=dict(size=14))
    figure.update_xaxes(**LIVE_AXES)
    figure.update_yaxes(**LIVE_AXES)
    return figure


def latency_figure(table: pd.DataFrame, modelled: pd.DataFrame | None = None) -> go.Figure:
    """Measured latency of the full and the pruned model against sequence length (log-log): the
    median, with error bars from the first to the third quartile of the runs where the table has
    them; plus the modelled Raspberry Pi latencies when given."""
    figure = go.Figure()
    for column, name in (("full_ms", "full model"), ("pruned_ms", "pruned")):
        error = None
        if f"{column}_q1" in table and f"{column}_q3" in table:
            error = dict(type="data", symmetric=False,
                         array=(table[f"{column}_q3"] - table[column]).clip(lower=0).to_numpy(),
                         arrayminus=(table[column] - table[f"{column}_q1"]).clip(lower=0).to_numpy())
        figure.add_trace(go.Scatter(x=table["tokens"], y=table[column], mode="lines+markers", error_y=error,
                                    name=f"{name} (this CPU, median and IQR of the runs)"))
    if modelled is not None:
        for device, part in modelled.groupby("device"):
            for column, name in (("full_ms", "full"), ("pruned_ms", "pruned")):
                figure.add_trace(go.Scatter(x=part["tokens"], y=part[column], mode="lines+markers",
                                            name=f"{name} ({device}, modelled)", line=dict(dash="dot")))
    figure.update_xaxes(title="sequence length (tokens, log scale)", **LOG_AXIS)
    figure.update_yaxes(title="latency (ms, log scale)", **LOG_AXIS)
    figure.update_layout(height=380, margin=dict(l=10, r=10, t=30, b=10))
    return figure


def mark_off_heads(figure: go.Figure, keep) -> go.Figure:
    """Cross out the heads that are off (`keep` [L, H] bool, False = off) on a layer x head map,
    so a score is never read as a switched-off head's."""
    off = torch.nonzero(~torch.as_tensor(keep, dtype=torch.bool)).tolist()     # [(layer, head)]
    if off:
        figure.add_trace(go.Scatter(
            x=[h for _, h in off], y=[layer for layer, _ in off], mode="markers", name="off",
            marker=dict(symbol="x-thin", size=12, line=dict(width=2, color="white")),
            text=[head_name(layer, h) for layer, h in off], hovertemplate="%{text} is off<extra></extra>",
            showlegend=True))
        figure.update_layout(legend=legend_below())
    return figure
